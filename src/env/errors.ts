/**
 * Errors of environments reached over HTTP (env/http-env.ts). Callers branch on `code`, never on the
 * message; the message names the server URL, the call and what went wrong, because it ends up in a
 * FAILED rollout's error string far from the server that caused it.
 */
import { RolloutEngineError } from '../errors.ts';

/**
 * Stable codes:
 * - ERR_ENV_HTTP: the server answered a status that is not retried (4xx: unknown id, bad request…),
 *   or retries ran out on 5xx; `status` holds it and the message holds the server's own message.
 *   Also prewarm's "this server does not serve that environment" (status 404, as its calls would get);
 * - ERR_ENV_UNREACHABLE: transport errors (refused, reset, DNS) persisted through every retry;
 * - ERR_ENV_TIMEOUT: a request exceeded the per-request timeout on every attempt; or an environment
 *   call of any kind (in-process or HTTP: the factory call, reset, getTaskPrompt, step, close) did not settle
 *   within `tasks[].env.timeoutMs` (env/bounded.ts);
 * - ERR_ENV_CANCELLED: an environment call was still pending when in-flight work was cancelled for a
 *   weight update (pause escalated to cancel, or a shutdown): the rollout is ABORTED, not FAILED;
 * - ERR_HOOK_TIMEOUT: an episode hook (`tasks[].hooks`) did not settle within `tasks[].env.timeoutMs`;
 *   logged and ignored like a hook that throws;
 * - ERR_ENV_BAD_REPLY: the body is not JSON, or not the shape the protocol promises (the message names
 *   the field and the value);
 * - ERR_ENV_STEP_UNCERTAIN: a `step` failed after the request may have reached the environment (5xx,
 *   timeout, connection lost mid-request). The action may have been applied, so it is not retried
 *   unless the server deduplicates steps (`dedupeSteps`);
 * - ERR_ENV_TOO_LARGE: a reply exceeded `maxResponseBytes`;
 * - ERR_ENV_CLOSED: the environment client was closed (shutdown) while the call was pending.
 */
export type EnvErrorCode =
  | 'ERR_ENV_HTTP'
  | 'ERR_ENV_UNREACHABLE'
  | 'ERR_ENV_TIMEOUT'
  | 'ERR_ENV_CANCELLED'
  | 'ERR_HOOK_TIMEOUT'
  | 'ERR_ENV_BAD_REPLY'
  | 'ERR_ENV_STEP_UNCERTAIN'
  | 'ERR_ENV_TOO_LARGE'
  | 'ERR_ENV_CLOSED';

export class EnvError extends RolloutEngineError {
  declare readonly code: EnvErrorCode;
  /** The HTTP status when the server answered one (ERR_ENV_HTTP always; STEP_UNCERTAIN after a 5xx), else null. */
  readonly status: number | null;
  constructor(code: EnvErrorCode, message: string, options: { status?: number | null; cause?: unknown } = {}) {
    super(code, message, { cause: options.cause });
    this.name = 'EnvError';
    this.status = options.status ?? null;
  }
}

/**
 * Errors of environments reached over HTTP (env/http-env.ts). Callers branch on `code`, never on the
 * message; the message names the server URL, the call and what went wrong, because it ends up in a
 * FAILED rollout's error string far from the server that caused it.
 */
import { RolloutEngineError } from '../errors.ts';

/**
 * The codes an environment call fails with (meanings: src/error-codes.ts). ERR_ENV_HTTP is also
 * prewarm's "this server does not serve that environment" (status 404, as its calls would get);
 * ERR_ENV_TIMEOUT bounds in-process calls too (env/bounded.ts); ERR_ENV_CANCELLED leaves the rollout
 * ABORTED, not FAILED. ERR_ENV_INFRA is a failure the server itself says is not the episode's (a sandbox
 * that died, a judge that failed, a sample it masks): the rollout is never trained, and runs again.
 * ERR_ENV_BAD_ACTION is the policy's: its reply cannot be made into the action the server takes.
 * ERR_ENV_REFUSED (a request the server will never take) and ERR_ENV_EPISODE (an episode the server
 * ran and reports failed) are the environment's.
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
  | 'ERR_ENV_CLOSED'
  | 'ERR_ENV_INFRA'
  | 'ERR_ENV_BAD_ACTION'
  | 'ERR_ENV_REFUSED'
  | 'ERR_ENV_EPISODE';

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

import { RolloutEngineError } from '../protocol/errors.ts';

/**
 * Stable codes:
 * - ERR_LLM_HTTP: the server answered with a status we do not retry (4xx), or retries ran out on 429/5xx;
 * - ERR_LLM_UNREACHABLE: transport errors (refused, reset, DNS) persisted through every retry;
 * - ERR_LLM_TIMEOUT: the request exceeded `llm.timeoutMs`;
 * - ERR_LLM_BAD_REPLY: the body is not JSON or not a usable chat completion;
 * - ERR_LLM_ABORTED: the caller cancelled the request (pause / shutdown).
 */
export type LlmErrorCode =
  | 'ERR_LLM_HTTP'
  | 'ERR_LLM_UNREACHABLE'
  | 'ERR_LLM_TIMEOUT'
  | 'ERR_LLM_BAD_REPLY'
  | 'ERR_LLM_ABORTED';

export class LlmError extends RolloutEngineError {
  declare readonly code: LlmErrorCode;
  readonly status: number | null;
  constructor(code: LlmErrorCode, message: string, options: { status?: number; cause?: unknown } = {}) {
    super(code, message, { cause: options.cause });
    this.name = 'LlmError';
    this.status = options.status ?? null;
  }
}

/**
 * Prefix of a rollout's `error` when it came back ABORTED because its inference call met an outage
 * (rollout/agent-loop.ts): the producer tells these from pause aborts by it (coordinator/outage.ts).
 */
export const OUTAGE_CODE = 'ERR_LLM_OUTAGE';

/**
 * A failure that says the server may be down rather than that this call is bad: unreachable
 * (refused, reset, DNS), timed out, or a 5xx — each after the client's own retries. A 4xx, a 429
 * (the server is up and shedding load) or a malformed reply are not: those still fail the rollout.
 * Whether it *is* an outage is decided on the main thread, by asking the servers (coordinator/outage.ts).
 */
export function isOutageError(err: unknown): boolean {
  if (!(err instanceof LlmError)) return false;
  if (err.code === 'ERR_LLM_UNREACHABLE' || err.code === 'ERR_LLM_TIMEOUT') return true;
  return err.code === 'ERR_LLM_HTTP' && err.status !== null && err.status >= 500;
}

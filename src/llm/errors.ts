import { RolloutEngineError } from '../errors.ts';

/** The codes an inference call fails with (meanings: src/error-codes.ts). */
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
 * (worker/agent-loop.ts): the producer tells these from pause aborts by it (coordinator/outage.ts).
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

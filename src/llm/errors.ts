import { RolloutEngineError } from '../protocol/errors.ts';

/**
 * Stable codes:
 * - ERR_LLM_HTTP: the server answered with a status we do not retry (4xx), or retries ran out on 429/5xx;
 * - ERR_LLM_UNREACHABLE: transport errors (refused, reset, DNS) persisted through every retry;
 * - ERR_LLM_TIMEOUT: the request exceeded `llm.timeoutMs`;
 * - ERR_LLM_BAD_REPLY: the body is not JSON or not a usable chat completion;
 * - ERR_LLM_ABORTED: the caller cancelled the request (pause / shutdown).
 */
export type LlmErrorCode = 'ERR_LLM_HTTP' | 'ERR_LLM_UNREACHABLE' | 'ERR_LLM_TIMEOUT' | 'ERR_LLM_BAD_REPLY' | 'ERR_LLM_ABORTED';

export class LlmError extends RolloutEngineError {
  declare readonly code: LlmErrorCode;
  readonly status: number | null;
  constructor(code: LlmErrorCode, message: string, options: { status?: number; cause?: unknown } = {}) {
    super(code, message, { cause: options.cause });
    this.name = 'LlmError';
    this.status = options.status ?? null;
  }
}

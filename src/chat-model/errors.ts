import { RolloutEngineError } from '../errors.ts';

/**
 * Codes of a chat model (meanings: src/error-codes.ts). Its users word them for their callers: the
 * gateway answers its own ERR_GATEWAY_MODEL / ERR_GATEWAY_TEMPLATE (gateway/errors.ts), a token-in
 * rollout fails with these as they are.
 */
export type ChatModelErrorCode = 'ERR_CHAT_MODEL' | 'ERR_CHAT_TEMPLATE';

export class ChatModelError extends RolloutEngineError {
  declare readonly code: ChatModelErrorCode;
  constructor(code: ChatModelErrorCode, message: string, options: { cause?: unknown } = {}) {
    super(code, message, options);
    this.name = 'ChatModelError';
  }
}

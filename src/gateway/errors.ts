import type { ChatModelError } from '../chat-model/errors.ts';
import { RolloutEngineError } from '../errors.ts';

/**
 * Codes of the token-trace gateway (meanings: src/error-codes.ts), each with its HTTP status below.
 * HTTP answers carry the code in `error.code` (OpenAI error shape), library calls throw a GatewayError
 * with it. ERR_BACKEND_HTTP passes a backend's 4xx on as is (502 otherwise); ERR_GATEWAY_TOO_MANY_SIDE_CALLS
 * is a 400, not a 429: waiting does not help, so an OpenAI client must not retry it.
 */
export type GatewayErrorCode =
  | 'ERR_GATEWAY_BAD_REQUEST'
  | 'ERR_GATEWAY_TEMPLATE'
  | 'ERR_GATEWAY_PREFIX_MISMATCH'
  | 'ERR_GATEWAY_TOO_MANY_SIDE_CALLS'
  | 'ERR_GATEWAY_CONTEXT_LENGTH'
  | 'ERR_GATEWAY_UNKNOWN_SESSION'
  | 'ERR_GATEWAY_NOT_FOUND'
  | 'ERR_GATEWAY_METHOD'
  | 'ERR_GATEWAY_SESSION_BUSY'
  | 'ERR_GATEWAY_BODY_TOO_LARGE'
  | 'ERR_GATEWAY_TOO_MANY_SESSIONS'
  | 'ERR_GATEWAY_STITCH'
  | 'ERR_GATEWAY_CLOSING'
  | 'ERR_GATEWAY_INTERNAL'
  | 'ERR_GATEWAY_MODEL'
  | 'ERR_BACKEND_HTTP'
  | 'ERR_BACKEND_UNREACHABLE'
  | 'ERR_BACKEND_BAD_REPLY'
  | 'ERR_BACKEND_TIMEOUT'
  | 'ERR_BACKEND_ABORTED';

const STATUS: Record<GatewayErrorCode, number> = {
  ERR_GATEWAY_BAD_REQUEST: 400,
  ERR_GATEWAY_TEMPLATE: 400,
  ERR_GATEWAY_PREFIX_MISMATCH: 400,
  ERR_GATEWAY_TOO_MANY_SIDE_CALLS: 400,
  ERR_GATEWAY_CONTEXT_LENGTH: 400,
  ERR_GATEWAY_UNKNOWN_SESSION: 404,
  ERR_GATEWAY_NOT_FOUND: 404,
  ERR_GATEWAY_METHOD: 405,
  ERR_GATEWAY_SESSION_BUSY: 409,
  ERR_GATEWAY_BODY_TOO_LARGE: 413,
  ERR_GATEWAY_TOO_MANY_SESSIONS: 429,
  ERR_GATEWAY_STITCH: 500,
  ERR_GATEWAY_MODEL: 500,
  ERR_GATEWAY_INTERNAL: 500,
  ERR_GATEWAY_CLOSING: 503,
  ERR_BACKEND_HTTP: 502,
  ERR_BACKEND_UNREACHABLE: 502,
  ERR_BACKEND_BAD_REPLY: 502,
  ERR_BACKEND_TIMEOUT: 504,
  ERR_BACKEND_ABORTED: 499,
};

export class GatewayError extends RolloutEngineError {
  declare readonly code: GatewayErrorCode;
  /** HTTP status the gateway answers with. */
  readonly status: number;
  /** The request field at fault (OpenAI `param`), when there is one. */
  readonly param: string | null;
  /** Machine-readable specifics (prefix mismatch position and spans, context numbers, …). */
  readonly details: Record<string, unknown> | null;
  constructor(
    code: GatewayErrorCode,
    message: string,
    options: { status?: number; param?: string | null; details?: Record<string, unknown> | null; cause?: unknown } = {},
  ) {
    super(code, message, { cause: options.cause });
    this.name = 'GatewayError';
    this.status = options.status ?? STATUS[code];
    this.param = options.param ?? null;
    this.details = options.details ?? null;
  }
}

/**
 * A chat model's error (chat-model/) as the gateway answers it: under the gateway's own codes, a
 * template that cannot render the request's messages a 400 on `messages`, files that cannot be loaded
 * a 500.
 */
export function fromChatModelError(err: ChatModelError): GatewayError {
  return err.code === 'ERR_CHAT_TEMPLATE'
    ? new GatewayError('ERR_GATEWAY_TEMPLATE', err.message, { param: 'messages', cause: err.cause })
    : new GatewayError('ERR_GATEWAY_MODEL', err.message, { cause: err.cause });
}

/** OpenAI's error envelope, plus the stable code and the details. */
export function errorBody(err: GatewayError): { error: Record<string, unknown> } {
  const type = err.status >= 500 ? 'server_error' : 'invalid_request_error';
  const error: Record<string, unknown> = { message: err.message, type, param: err.param, code: err.code };
  if (err.details !== null) error.details = err.details;
  return { error };
}

import { RolloutEngineError } from '../errors.ts';

/**
 * Stable codes of the token-trace gateway. HTTP answers carry the code in `error.code` (OpenAI error
 * shape), library calls throw a GatewayError with it, so callers branch on codes, not messages.
 *
 * Client mistakes (4xx):
 * - ERR_GATEWAY_BAD_REQUEST (400): a field has the wrong type or value (`param` names it);
 * - ERR_GATEWAY_TEMPLATE (400): the model's chat template cannot render these messages;
 * - ERR_GATEWAY_PREFIX_MISMATCH (400, only with `sideCalls: 'refuse'`): the conversation no longer
 *   starts with what the session already sent (an earlier message was edited or dropped, or a side
 *   call); `details` has the first differing position and both token spans;
 * - ERR_GATEWAY_TOO_MANY_SIDE_CALLS (400): the session already keeps `maxSideCalls` side calls (not
 *   429: waiting does not help, so an OpenAI client must not retry it);
 * - ERR_GATEWAY_CONTEXT_LENGTH (400): the prompt fills the context window; both numbers in `details`;
 * - ERR_GATEWAY_UNKNOWN_SESSION (404): no live session with that id (never seen, stitched, deleted or expired);
 * - ERR_GATEWAY_NOT_FOUND (404) / ERR_GATEWAY_METHOD (405): no such route / method;
 * - ERR_GATEWAY_SESSION_BUSY (409): the session already has a call in flight (turns are sequential);
 * - ERR_GATEWAY_BODY_TOO_LARGE (413);
 * - ERR_GATEWAY_TOO_MANY_SESSIONS (429): `maxSessions` live sessions already hold traces.
 * Server side:
 * - ERR_GATEWAY_STITCH (500): the traces broke an invariant while stitching (a bug, never the client's);
 * - ERR_GATEWAY_INTERNAL (500): an unexpected failure inside the gateway;
 * - ERR_GATEWAY_MODEL (500): the tokenizer / chat template files cannot be loaded;
 * - ERR_GATEWAY_CLOSING (503): the gateway is shutting down;
 * - ERR_BACKEND_HTTP (the backend's 4xx is passed on as is, anything else as 502);
 * - ERR_BACKEND_UNREACHABLE (502), ERR_BACKEND_BAD_REPLY (502), ERR_BACKEND_TIMEOUT (504);
 * - ERR_BACKEND_ABORTED: the caller cancelled the backend call (client gone, close()).
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

/** OpenAI's error envelope, plus the stable code and the details. */
export function errorBody(err: GatewayError): { error: Record<string, unknown> } {
  const type = err.status >= 500 ? 'server_error' : 'invalid_request_error';
  const error: Record<string, unknown> = { message: err.message, type, param: err.param, code: err.code };
  if (err.details !== null) error.details = err.details;
  return { error };
}

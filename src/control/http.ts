/**
 * Small HTTP plumbing for the control API: body reading with a limit, content negotiation between
 * JSON and msgpack, bearer-token checks in constant time, and errors with stable codes.
 */
import { timingSafeEqual, createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { decodeFromPeer, encodeForPeer, toJson } from '../protocol/codec.ts';
import { preview, RolloutEngineError } from '../protocol/errors.ts';
import { readRequestBody, type BodyErrors } from '../http-server.ts';

export class HttpError extends RolloutEngineError {
  readonly status: number;
  constructor(status: number, code: string, message: string) {
    super(code, message);
    this.status = status;
  }
}

const MSGPACK = 'application/msgpack';

/**
 * The body types the API reads. Anything else is refused (415) rather than parsed as JSON: a browser
 * sends `text/plain`, form types or no type at all cross-site without a CORS preflight, so taking
 * those would let any web page a user opens drive the API.
 */
const BODY_TYPES: ReadonlyMap<string, 'json' | 'msgpack'> = new Map([
  ['application/json', 'json'],
  [MSGPACK, 'msgpack'],
  ['application/x-msgpack', 'msgpack'],
]);

const bodyErrors: BodyErrors = {
  tooLarge: (message) => new HttpError(413, 'ERR_BODY_TOO_LARGE', message),
  aborted: (message) => new HttpError(400, 'ERR_BAD_BODY', message),
};

/** The body as a value; an empty body is `{}` and needs no type, any other needs JSON's or msgpack's. */
export async function readBody(req: IncomingMessage, limit: number): Promise<unknown> {
  const declared = req.headers['content-type'];
  const type = declared === undefined ? undefined : BODY_TYPES.get(declared.split(';')[0].trim().toLowerCase());
  if (declared !== undefined && type === undefined) {
    req.resume(); // read and drop it, so the answer can still be written on this connection
    throw new HttpError(
      415,
      'ERR_UNSUPPORTED_MEDIA_TYPE',
      `content-type ${preview(declared)} is not accepted: send application/json or application/msgpack`,
    );
  }
  const bytes = await readRequestBody(req, limit, bodyErrors);
  if (bytes.byteLength === 0) return {};
  if (type === undefined)
    throw new HttpError(
      415,
      'ERR_UNSUPPORTED_MEDIA_TYPE',
      'a body needs a content-type: application/json or application/msgpack',
    );
  if (type === 'msgpack') {
    try {
      return decodeFromPeer(bytes);
    } catch (err) {
      throw new HttpError(400, 'ERR_BAD_BODY', (err as Error).message);
    }
  }
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch (err) {
    throw new HttpError(400, 'ERR_BAD_BODY', `body is not valid JSON: ${(err as Error).message}`);
  }
}

export function send(req: IncomingMessage, res: ServerResponse, status: number, value: unknown): void {
  if (/\bapplication\/(x-)?msgpack\b/i.test(req.headers.accept ?? '')) {
    const body = encodeForPeer(value);
    res.writeHead(status, { 'content-type': MSGPACK, 'content-length': body.byteLength }).end(body);
    return;
  }
  const body = toJson(value);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body);
}

export function sendError(req: IncomingMessage, res: ServerResponse, err: unknown): void {
  const status = err instanceof HttpError ? err.status : statusFor((err as { code?: string }).code);
  const code = (err as { code?: unknown }).code;
  send(req, res, status, {
    error: { code: typeof code === 'string' ? code : 'ERR_INTERNAL', message: (err as Error).message ?? String(err) },
  });
}

function statusFor(code: string | undefined): number {
  if (code === 'ERR_INVALID_ARGUMENT') return 400;
  if (code === 'ERR_ENGINE_STATE' || code === 'ERR_TRAIN_STEP') return 409;
  if (code === 'ERR_CHECKPOINT' || code === 'ERR_CHECKPOINT_MISMATCH') return 400;
  return 500;
}

/** Compares digests, so neither the token's length nor its content leaks through timing. */
export function tokenMatches(header: string | undefined, token: string): boolean {
  const given = /^Bearer (.+)$/i.exec(header ?? '')?.[1] ?? '';
  const a = createHash('sha256').update(given).digest();
  const b = createHash('sha256').update(token).digest();
  return timingSafeEqual(a, b);
}

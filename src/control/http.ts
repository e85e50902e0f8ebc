/**
 * Small HTTP plumbing for the control API: body reading with a limit, content negotiation between
 * JSON and msgpack, bearer-token checks in constant time, and errors with stable codes.
 */
import { timingSafeEqual, createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { decodeFromPeer, encodeForPeer, toJson } from '../protocol/codec.ts';
import { RolloutEngineError } from '../protocol/errors.ts';
import { readRequestBody, type BodyErrors } from '../http-server.ts';

export class HttpError extends RolloutEngineError {
  readonly status: number;
  constructor(status: number, code: string, message: string) {
    super(code, message);
    this.status = status;
  }
}

const MSGPACK = 'application/msgpack';

const bodyErrors: BodyErrors = {
  tooLarge: (message) => new HttpError(413, 'ERR_BODY_TOO_LARGE', message),
  aborted: (message) => new HttpError(400, 'ERR_BAD_BODY', message),
};

export async function readBody(req: IncomingMessage, limit: number): Promise<unknown> {
  const bytes = await readRequestBody(req, limit, bodyErrors);
  if (bytes.byteLength === 0) return {};
  const type = (req.headers['content-type'] ?? 'application/json').split(';')[0].trim();
  if (type === MSGPACK) {
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
  if ((req.headers.accept ?? '').includes(MSGPACK)) {
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
  send(req, res, status, { error: { code: typeof code === 'string' ? code : 'ERR_INTERNAL', message: (err as Error).message ?? String(err) } });
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

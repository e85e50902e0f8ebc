/**
 * How the mock writes and reads HTTP: JSON replies in OpenAI's error shape, request bodies under the
 * size limit, and the count of requests it refused (stats().rejected).
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { readRequestBody, type BodyErrors } from '../http-server.ts';
import type { DialectError } from './dialects.ts';

/** A body over `maxBodyBytes`: the route table answers it 413 and closes the connection. */
export class BodyTooLarge extends Error {}

const bodyErrors: BodyErrors = {
  tooLarge: (message) => new BodyTooLarge(message),
  aborted: (message) => new Error(message),
};

export async function readBody(req: IncomingMessage, limit: number): Promise<string> {
  return (await readRequestBody(req, limit, bodyErrors)).toString('utf8');
}

export function sendJson(res: ServerResponse, status: number, body: unknown, headers?: Record<string, string>): void {
  sendText(res, status, JSON.stringify(body), headers);
}

/** Writes nothing once the reply has started or the client is gone (an abort can race a timer's answer). */
export function sendText(res: ServerResponse, status: number, text: string, headers?: Record<string, string>): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

export function errorBody(message: string, type: string, param: string | null = null) {
  return { error: { message, type, param, code: null } };
}

/** Every 4xx the mock answers goes through here, so stats().rejected counts each exactly once. */
export class Rejections {
  #count = 0;

  get count(): number {
    return this.#count;
  }

  /** The default dialect's refusal: OpenAI's `invalid_request_error` naming the field. */
  reject(
    res: ServerResponse,
    status: number,
    message: string,
    param: string | null = null,
    headers?: Record<string, string>,
  ): void {
    this.#count += 1;
    sendJson(res, status, errorBody(message, 'invalid_request_error', param), headers);
  }

  /** A dialect's refusal, already in that server's shape (dialects.ts). */
  dialect(res: ServerResponse, error: DialectError): void {
    this.#count += 1;
    sendText(res, error.status, error.body);
  }
}

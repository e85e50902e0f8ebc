/** node:http plumbing for the gateway: bounded body reading and JSON answers in OpenAI's error shape. */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { readRequestBody, type BodyErrors } from '../http-server.ts';
import { GatewayError, errorBody } from './errors.ts';

const bodyErrors: BodyErrors = {
  tooLarge: (message) => new GatewayError('ERR_GATEWAY_BODY_TOO_LARGE', `${message} (maxBodyBytes)`),
  aborted: (message) => new GatewayError('ERR_BACKEND_ABORTED', message),
};

export async function readBody(req: IncomingMessage, limit: number): Promise<string> {
  return (await readRequestBody(req, limit, bodyErrors)).toString('utf8');
}

export function sendText(
  res: ServerResponse,
  status: number,
  text: string,
  headers: Record<string, string> = {},
): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

export function sendJson(res: ServerResponse, status: number, body: unknown, headers?: Record<string, string>): void {
  sendText(res, status, JSON.stringify(body), headers);
}

export function sendError(res: ServerResponse, err: GatewayError, headers?: Record<string, string>): void {
  sendJson(res, err.status, errorBody(err), headers);
}

export function hostForUrl(host: string): string {
  if (host === '0.0.0.0') return '127.0.0.1';
  if (host === '::') return '[::1]';
  return host.includes(':') ? `[${host}]` : host;
}

/** node:http plumbing for the gateway: bounded body reading and JSON answers in OpenAI's error shape. */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { GatewayError, errorBody } from './errors.ts';

export function readBody(req: IncomingMessage, limit: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers['content-length']);
    if (declared > limit) {
      req.resume();
      reject(new GatewayError('ERR_GATEWAY_BODY_TOO_LARGE', `request body is ${declared} bytes; the limit is ${limit} (maxBodyBytes)`));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        req.removeAllListeners('data');
        req.resume();
        reject(new GatewayError('ERR_GATEWAY_BODY_TOO_LARGE', `request body exceeds the limit of ${limit} bytes (maxBodyBytes)`));
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => resolve(Buffer.concat(chunks, size).toString('utf8')));
    req.on('error', reject);
    // A connection cut mid-upload must not leave the handler pending forever.
    req.on('close', () => {
      if (!req.complete) reject(new GatewayError('ERR_BACKEND_ABORTED', 'request aborted by the client while uploading'));
    });
  });
}

export function sendText(res: ServerResponse, status: number, text: string, headers: Record<string, string> = {}): void {
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

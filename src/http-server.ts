/**
 * What every node:http server the engine ships (control API, gateway, environment server, mock
 * inference server) does alike: listen, and read a request body with a size limit. Each names its own
 * errors.
 *
 * The body limit is checked on the declared Content-Length first, then on the bytes as they arrive, so
 * a client that lies about (or omits) its length still cannot make the server buffer more than `limit`.
 */
import type { IncomingMessage, Server } from 'node:http';
import { ListenError } from './errors.ts';

/**
 * `server.listen` as a promise. A failure to bind (a port in use, a host that does not resolve) rejects
 * with a ListenError naming `what` (e.g. "control API"), the address and the errno, the same for every server.
 */
export function listen(server: Server, host: string, port: number, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const onError = (error: Error): void => reject(new ListenError(what, host, port, error));
    server.once('error', onError);
    server.listen(port, host, () => {
      server.off('error', onError);
      resolve();
    });
  });
}

export interface BodyErrors {
  /** The body is over the limit; `message` names its size or the limit. */
  tooLarge(message: string): Error;
  /** The connection closed before the body ended. */
  aborted(message: string): Error;
}

export function readRequestBody(req: IncomingMessage, limit: number, errors: BodyErrors): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers['content-length']);
    if (Number.isFinite(declared) && declared > limit) {
      req.resume(); // read and drop it, so the answer can still be written on this connection
      reject(errors.tooLarge(`request body is ${declared} bytes, over the limit of ${limit} bytes`));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > limit) {
        req.off('data', onData);
        req.resume();
        reject(errors.tooLarge(`request body is over the limit of ${limit} bytes`));
        return;
      }
      chunks.push(chunk);
    };
    req.on('data', onData);
    req.on('end', () => resolve(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, size)));
    req.on('error', reject);
    // A connection cut mid-upload (the client gone, or the server closing) must not leave the handler pending.
    req.on('close', () => {
      if (!req.complete) reject(errors.aborted('request aborted by the client while uploading'));
    });
  });
}

/**
 * Loopback HTTP servers for tests: every one listens on 127.0.0.1 on a port the OS picks, and is
 * closed with its connections cut, so a held request never keeps a test file alive.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

/** Listens on 127.0.0.1, port 0; resolves to the server's base URL `http://127.0.0.1:<port>`. */
export async function listenLoopback(server: Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

/** Closes `server`, cutting kept-alive and held connections instead of waiting for their clients. */
export function closeServer(server: Server): Promise<void> {
  return new Promise<void>((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}

/** Answers one request whose body has been read whole. */
export type ScriptedHandler = (req: IncomingMessage, res: ServerResponse, body: string) => void;

export interface ScriptedServer {
  url: string;
  server: Server;
  /** Every request, in arrival order, recorded before its handler runs. */
  requests: { method: string; path: string; body: string }[];
  close(): Promise<void>;
}

/** A loopback server that reads each request's body, records the request, then answers with `handler`. */
export async function scriptedServer(handler: ScriptedHandler): Promise<ScriptedServer> {
  const requests: ScriptedServer['requests'] = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      requests.push({ method: req.method ?? '', path: req.url ?? '', body });
      handler(req, res, body);
    });
  });
  const url = await listenLoopback(server);
  return { url, server, requests, close: () => closeServer(server) };
}

/** The JSON of a one-choice chat completion, as the smallest OpenAI-compatible server would send it. */
export function chatCompletion(content: string, finishReason = 'stop'): string {
  return JSON.stringify({ choices: [{ message: { role: 'assistant', content }, finish_reason: finishReason }] });
}

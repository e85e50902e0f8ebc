/**
 * A small HTTP proxy in front of the mock inference server, in a process of its own, that holds chat
 * requests once a conversation has reached a given turn. The memory figure (./memory.ts) uses it to
 * keep thousands of rollouts in flight *mid-episode* — holding the turns they already played, with
 * their inference call pending — instead of at their first call, where a slow mock would hold them.
 *
 * A request is held when its `messages` contain at least `--hold-from-assistant` assistant messages
 * (0 = every request: rollouts held at their first turn). With the engine's default trimming
 * (messageCut 3: the system message and the last five messages) at most two assistant messages are
 * ever sent, so 2 (held at turn 3) is the latest turn this can pick out.
 *
 *   GET  /_proxy/stats    → { held, forwarding, forwarded, holding }
 *   POST /_proxy/release  → stop holding; every held request is forwarded now
 * Anything else is forwarded to the upstream as it is (admin routes included).
 *
 * Run as a process: `node --import tsx test/bench/stall-proxy.ts --upstream <url> --hold-from-assistant <n>`;
 * it prints `listening on http://…`. `startStallProxy` does that and returns a handle.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { Pool } from 'undici';
import { stopChild } from '../../src/loadtest/mock-process.ts';

export interface StallProxyStats {
  /** Requests held right now. */
  held: number;
  /** Requests sent upstream and not yet answered. */
  forwarding: number;
  /** Requests answered by the upstream since start. */
  forwarded: number;
  holding: boolean;
}

export interface StallProxy {
  readonly url: string;
  stats(): Promise<StallProxyStats>;
  release(): Promise<void>;
  close(): Promise<void>;
}

const SELF = fileURLToPath(import.meta.url);

/** Start the proxy in a child process (this Node binary, tsx loader); resolves once it listens. */
export async function startStallProxy(upstream: string, holdFromAssistant: number): Promise<StallProxy> {
  const execArgv = process.execArgv.filter((a) => !/^--(test|inspect|watch)/.test(a));
  if (!execArgv.some((a) => a.includes('tsx'))) execArgv.push('--import', 'tsx');
  const child = spawn(
    process.execPath,
    [...execArgv, SELF, '--upstream', upstream, '--hold-from-assistant', String(holdFromAssistant)],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  let stderr = '';
  child.stderr!.on('data', (c: Buffer) => (stderr = (stderr + c.toString()).slice(-4_000)));
  const listening = new Promise<string>((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`stall proxy did not start within 30 s\n${stderr}`)), 30_000);
    child.stdout!.on('data', (c: Buffer) => {
      out += c.toString();
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`stall proxy exited (code ${code})\n${stderr}`));
    });
  });
  let url: string;
  try {
    url = await listening;
  } catch (err) {
    await stop(child, killOnExit); // a proxy that did not start must not outlive the bench
    throw err;
  }
  const admin = async (method: string, path: string): Promise<unknown> => {
    const res = await fetch(`${url}${path}`, { method });
    if (!res.ok) throw new Error(`stall proxy ${method} ${path}: HTTP ${res.status}`);
    return res.json();
  };
  return {
    url,
    stats: () => admin('GET', '/_proxy/stats') as Promise<StallProxyStats>,
    release: async () => void (await admin('POST', '/_proxy/release')),
    close: () => stop(child, killOnExit),
  };
}

function stop(child: ChildProcess, killOnExit: () => void): Promise<void> {
  process.off('exit', killOnExit);
  return stopChild(child);
}

// --- the proxy process ------------------------------------------------------------------------

function readBody(req: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.once('end', () => resolve(Buffer.concat(chunks)));
    req.once('error', reject);
  });
}

function assistantMessages(body: Buffer): number {
  try {
    const parsed = JSON.parse(body.toString('utf8')) as { messages?: { role?: string }[] };
    return Array.isArray(parsed.messages) ? parsed.messages.filter((m) => m?.role === 'assistant').length : 0;
  } catch {
    return 0;
  }
}

async function serve(upstream: string, holdFromAssistant: number): Promise<void> {
  const pool = new Pool(new URL(upstream).origin, {
    connections: 512,
    headersTimeout: 0,
    bodyTimeout: 0,
    keepAliveTimeout: 60_000,
  });
  const state = { holding: true, forwarding: 0, forwarded: 0 };
  const held = new Set<{ req: IncomingMessage; res: ServerResponse; body: Buffer }>();

  const forward = async (req: IncomingMessage, res: ServerResponse, body: Buffer) => {
    state.forwarding++;
    try {
      const headers: Record<string, string> = {};
      if (req.headers['content-type']) headers['content-type'] = String(req.headers['content-type']);
      const reply = await pool.request({
        method: req.method as 'POST',
        path: req.url ?? '/',
        headers,
        body: body.length > 0 ? body : undefined,
      });
      const bytes = Buffer.from(await reply.body.arrayBuffer());
      const type = reply.headers['content-type'];
      if (!res.destroyed)
        res
          .writeHead(reply.statusCode, {
            'content-type': typeof type === 'string' ? type : 'application/json',
            'content-length': bytes.length,
          })
          .end(bytes);
    } catch (err) {
      if (!res.destroyed) res.writeHead(502, { 'content-type': 'text/plain' }).end(`stall proxy: ${String(err)}`);
    } finally {
      state.forwarding--;
      state.forwarded++;
    }
  };

  const server = createServer({ keepAliveTimeout: 120_000, requestTimeout: 0, headersTimeout: 60_000 }, (req, res) => {
    void (async () => {
      const body = await readBody(req);
      if (req.url === '/_proxy/stats') {
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ held: held.size, ...state }));
        return;
      }
      if (req.url === '/_proxy/release' && req.method === 'POST') {
        state.holding = false;
        const all = [...held];
        held.clear();
        for (const h of all) void forward(h.req, h.res, h.body);
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ released: all.length }));
        return;
      }
      if (
        state.holding &&
        req.method === 'POST' &&
        req.url?.includes('/chat/completions') &&
        assistantMessages(body) >= holdFromAssistant
      ) {
        const entry = { req, res, body };
        held.add(entry);
        res.once('close', () => held.delete(entry)); // the client gave up: nothing to forward
        return;
      }
      await forward(req, res, body);
    })().catch((err: unknown) => {
      if (!res.destroyed) res.writeHead(500).end(String(err));
    });
  });
  server.maxHeadersCount = 64;
  await new Promise<void>((resolve) => server.listen({ port: 0, host: '127.0.0.1', backlog: 65_535 }, resolve));
  const { port } = server.address() as AddressInfo;
  process.stdout.write(`stall proxy listening on http://127.0.0.1:${port}\n`);
  const shutdown = () => {
    server.closeAllConnections();
    server.close();
    void pool.destroy().finally(() => process.exit(0));
  };
  process.once('SIGTERM', shutdown);
  process.once('SIGINT', shutdown);
}

if (process.argv[1] && pathToFileURL(process.argv[1]).href === import.meta.url) {
  const { values } = parseArgs({
    options: { upstream: { type: 'string' }, 'hold-from-assistant': { type: 'string' } },
  });
  if (!values.upstream) throw new Error('stall-proxy: --upstream is required');
  await serve(values.upstream, Number(values['hold-from-assistant'] ?? 0));
}

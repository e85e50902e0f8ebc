/**
 * What one call "with 50 ms of latency" costs on this machine with nothing else in the way: a plain
 * node:http server answering after a timer, an undici client, one call in flight, one process. The
 * latency-bound target (issue 7, target 3) counts every millisecond over the latency against the
 * engine; this shows how many the machine takes before any engine or mock code runs (timer lateness,
 * and the wake-ups of an idle CPU between send, timer and read). Part of `npm run bench`, or alone:
 *
 *   node --import tsx test/bench/call-floor.ts [latencyMs=50] [calls=40]
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pathToFileURL } from 'node:url';
import { Pool } from 'undici';

export interface CallFloor {
  latencyMs: number;
  calls: number;
  /** Milliseconds after the send, p50: the server saw the request, its timer fired, the client had the answer. */
  serverSawMs: number;
  timerFiredMs: number;
  answeredMs: number;
  /** latencyMs ÷ answeredMs: the share of the in-flight ÷ latency bound a client can reach here at best. */
  boundPct: number;
}

export async function callFloor(latencyMs = 50, calls = 40): Promise<CallFloor> {
  const saw: number[] = [];
  const fired: number[] = [];
  const answered: number[] = [];
  let sentAt = 0;
  const server = createServer((req, res) => {
    saw.push(performance.now() - sentAt);
    req.resume();
    req.on('end', () =>
      setTimeout(() => {
        fired.push(performance.now() - sentAt);
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
      }, latencyMs),
    );
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const pool = new Pool(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, { connections: 1 });
  try {
    for (let i = 0; i < calls; i++) {
      sentAt = performance.now();
      const response = await pool.request({
        method: 'POST',
        path: '/',
        headers: { 'content-type': 'application/json' },
        body: '{}',
      });
      await response.body.text();
      answered.push(performance.now() - sentAt);
    }
  } finally {
    await pool.close();
    await new Promise((resolve) => server.close(resolve));
  }
  const answeredMs = median(answered);
  return {
    latencyMs,
    calls,
    serverSawMs: median(saw),
    timerFiredMs: median(fired),
    answeredMs,
    boundPct: (100 * latencyMs) / answeredMs,
  };
}

export function describeCallFloor(f: CallFloor): string {
  return `floor: one call at a time to a plain node:http server answering after a ${f.latencyMs} ms timer (no engine, no mock): ${f.answeredMs.toFixed(2)} ms per call, at most ${f.boundPct.toFixed(1)} % of the bound (server saw it at ${f.serverSawMs.toFixed(2)} ms, timer fired at ${f.timerFiredMs.toFixed(2)} ms; p50 of ${f.calls})`;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[sorted.length >> 1];
}

if (process.argv[1] && pathToFileURL(process.argv[1]).href === import.meta.url) {
  console.log(describeCallFloor(await callFloor(Number(process.argv[2] ?? 50), Number(process.argv[3] ?? 40))));
}

/**
 * A fleet of inference servers (docs/FLEET.md), with real HTTP mock servers on 127.0.0.1:
 *
 * - a server that dies mid-generation loses nothing: its calls fail over to the others, the sessions
 *   it held move there and go on from their last whole turn, every group lands once, no sample is
 *   lost or drawn twice;
 * - a server that joins through the control API (`POST /endpoints`) takes calls within a second, and
 *   one that leaves takes none after its calls in flight.
 *
 * Waits are on the servers' own counters (waitForStats / waitForRequests), bounded by `within`.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, request as httpRequest, type ClientRequest, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { createEngine, Status, type Batch, type ControlServer } from '../src/index.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/server.ts';
import { assertSettled } from './support/accounting.ts';
import { listenLoopback } from './support/http.ts';
import { within } from './support/waits.ts';

/** A GPU-like replica slow enough that a kill lands mid-generation: ≈ 40 tokens of ≈ 7 ms steps per call. */
const REPLICA = { capacity: { slots: 16, responseTokens: 40, lengthSigma: 0.3, speedup: 1 } } as const;

/**
 * One server of the fleet: a GPU-like mock behind a proxy that reads the session from the request
 * path (`llm.sessionPath`) and records which sessions it served, and which are being generated now.
 * `kill()` is a crash as the engine sees it: every connection cut, the port closed, the mock gone.
 */
interface FleetServer {
  url: string;
  mock: MockLlm;
  /** Every session that sent a chat call here, with the time of its first and last call. */
  sessions: Map<string, { first: number; last: number }>;
  /** Sessions with a chat call in progress here now. */
  inFlight: Set<string>;
  kill(): Promise<void>;
}

async function fleetServer(): Promise<FleetServer> {
  const mock = await startMockLlm(REPLICA);
  const target = new URL(mock.url);
  const sessions = new Map<string, { first: number; last: number }>();
  const inFlight = new Set<string>();
  const upstream = new Set<ClientRequest>();
  const server: Server = createServer((req, res) => {
    const m = /^\/v1\/sessions\/([^/]+)\/chat\/completions$/.exec(req.url ?? '');
    const session = m === null ? null : decodeURIComponent(m[1]);
    if (session !== null) {
      const now = performance.now();
      const seen = sessions.get(session);
      sessions.set(session, { first: seen?.first ?? now, last: now });
      inFlight.add(session);
      res.once('close', () => inFlight.delete(session));
    }
    const out = httpRequest(
      {
        host: target.hostname,
        port: target.port,
        method: req.method,
        path: session === null ? req.url : '/v1/chat/completions',
        headers: req.headers,
      },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    upstream.add(out);
    out.once('close', () => upstream.delete(out));
    out.on('error', () => res.destroy());
    req.pipe(out);
  });
  const url = await listenLoopback(server);
  return {
    url,
    mock,
    sessions,
    inFlight,
    async kill() {
      server.close();
      server.closeAllConnections();
      for (const out of upstream) out.destroy();
      await mock.close();
    },
  };
}

function writeDataset(dir: string, lines: number): string {
  const file = join(dir, 'guess.jsonl');
  writeFileSync(
    file,
    `${Array.from({ length: lines }, (_, i) => JSON.stringify({ min: 1, max: 20 + i })).join('\n')}\n`,
  );
  return file;
}

describe('a fleet of inference servers', () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'rollout-fleet-'));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('loses nothing when a server dies mid-generation: its sessions move to the others and go on', async () => {
    const fleet = await Promise.all([fleetServer(), fleetServer(), fleetServer()]);
    const [victim, ...survivors] = fleet;
    const engine = createEngine({
      logLevel: 'silent',
      llm: { url: fleet.map((s) => s.url), sessionPath: '/sessions/{session}' },
      batchSize: 6,
      workers: { threads: 1, groupsPerWorker: 6 },
      producer: { strategy: 'sync' },
      tasks: [
        {
          name: 'guess',
          env: { module: 'builtin:guess-number', params: { maxTurns: 4 } },
          dataset: writeDataset(dir, 64),
          groupSize: 4,
          maxSteps: 4,
          maxTokens: 256,
        },
      ],
    });
    try {
      await engine.start();
      const first = engine.getBatch();
      // Mid-generation: the victim is decoding for several sessions when it dies.
      await within(
        30_000,
        'calls generating on the victim',
        victim.mock.waitForStats((s) => (s.gpu?.running ?? 0) >= 2),
      );
      const cutOff = new Set(victim.inFlight);
      const diedAt = performance.now();
      await victim.kill();
      const batches: Batch[] = [await first, await engine.getBatch()];
      const stats = await engine.stats();

      // Every group accounted for: scheduled = taken, nothing failed, dropped or still out.
      assertSettled(stats, 'after two batches');
      assert.equal(stats.groups.taken, 12);
      assert.deepEqual(stats.groups.dropped, { ...stats.groups.dropped, FAILED: 0, FILTERED: 0, EXPIRED: 0 });
      assert.equal(stats.outage.outages, 0, 'the other servers answered: no outage');
      // No sample lost or drawn twice: the draws are exactly 0..11, each group and rollout once.
      const groups = batches.flatMap((b) => b.groups);
      assert.deepEqual(
        groups.map((g) => g.sample.drawIndex).sort((a, b) => a - b),
        Array.from({ length: 12 }, (_, i) => i),
      );
      const rollouts = groups.flatMap((g) => g.rollouts);
      assert.equal(new Set(groups.map((g) => g.id)).size, 12);
      assert.equal(new Set(rollouts.map((r) => r.id)).size, 48);
      for (const r of rollouts) assert.equal(r.status, Status.COMPLETED, `${r.id}: ${r.error}`);

      // The sessions cut off mid-generation went on on the survivors, in the same episode (attempt 0):
      // their whole turns kept, the interrupted one generated again there.
      assert.ok(cutOff.size >= 2, `sessions generating on the victim when it died: ${cutOff.size}`);
      for (const session of cutOff) {
        const movedTo = survivors.filter((s) => (s.sessions.get(session)?.last ?? 0) > diedAt);
        assert.equal(movedTo.length, 1, `session ${session} went on on one survivor`);
        const rollout = rollouts.find((r) => r.id === session);
        assert.ok(rollout !== undefined, `session ${session} is a rollout of the batches`);
        assert.equal(rollout.attempt, 0, 'continued, not restarted');
        assert.ok(rollout.turns.length >= 1 && rollout.turns.length <= 4);
        for (const turn of rollout.turns) assert.ok(turn.responseIds !== null && turn.responseIds.length > 0);
      }
      // Nothing went to the dead server after its death but the retries of the calls it cut off.
      const lateOnVictim = [...victim.sessions].filter(([, t]) => t.last > diedAt);
      assert.deepEqual(lateOnVictim, []);
    } finally {
      await engine.close();
      await Promise.all(survivors.map((s) => s.kill()));
    }
  });

  it('sends calls to a server that joins through POST /endpoints within seconds, and none to one that left', async () => {
    const a = await startMockLlm({ latencyMs: 40 });
    const b = await startMockLlm({ latencyMs: 40 });
    const engine = createEngine({
      logLevel: 'silent',
      llm: { url: a.url },
      batchSize: 16,
      workers: { threads: 1, groupsPerWorker: 2 },
      producer: { strategy: 'sync' },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 4, maxSteps: 4, maxTokens: 32 }],
    });
    let control: ControlServer | null = null;
    const call = async (method: 'GET' | 'POST', body?: unknown) => {
      const res = await request(`${control!.url}/endpoints`, {
        method,
        headers: { 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      return { status: res.statusCode, body: (await res.body.json()) as any };
    };
    try {
      await engine.start();
      control = await engine.listen();
      assert.deepEqual((await call('GET')).body, { endpoints: [a.url] });
      // A batch in production (groups go out two at a time): b joins while sessions keep starting.
      const batch = engine.getBatch();
      await within(10_000, 'the first calls on a', a.waitForRequests(8));
      const joined = performance.now();
      const answer = await call('POST', { add: [b.url] });
      assert.deepEqual(answer, { status: 200, body: { endpoints: [a.url, b.url] } });
      // Within the batch in production (seconds), not at a later refresh; generous for a busy machine.
      await within(5_000, 'a call on the joined server', b.waitForRequests(1));
      const tookMs = performance.now() - joined;
      assert.ok(tookMs < 5_000, `first call on the joined server after ${tookMs.toFixed(0)} ms`);
      await batch;

      // a leaves: once its calls in flight are done, every call goes to b.
      assert.deepEqual((await call('POST', { remove: a.url })).body, { endpoints: [b.url] });
      await within(
        10_000,
        'calls in flight on a to finish',
        a.waitForStats((s) => s.inFlight === 0),
      );
      const onA = a.stats().requests;
      const onB = b.stats().requests;
      await engine.getBatch();
      assert.equal(a.stats().requests, onA, 'no call to a server that left');
      assert.ok(b.stats().requests > onB);

      // Refused: a server that does not answer (502), an unknown endpoint and the last one (400).
      const down = await call('POST', { add: ['http://127.0.0.1:9'] });
      assert.equal(down.status, 502);
      assert.equal(down.body.error.code, 'ERR_LLM_UNREACHABLE');
      assert.equal((await call('POST', { remove: ['http://127.0.0.1:9'] })).status, 400);
      assert.equal((await call('POST', { remove: [b.url] })).status, 400);
      assert.equal((await call('POST', {})).status, 400);
      assert.equal((await call('POST', { add: 'not a url' })).status, 400);
      assert.deepEqual((await call('GET')).body, { endpoints: [b.url] });
      assertSettled(await engine.stats(), 'after both batches');
    } finally {
      await engine.close();
      await Promise.all([a.close(), b.close()]);
    }
  });
});

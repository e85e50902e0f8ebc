/**
 * Issue 31, item 5: a fleet of GPU-like servers. The prefix-cache hit rate of session-affine routing
 * (`llm.routing: session`, the default) beside round-robin (`round-robin`: each call to the next
 * server, as a router with no session key does), against the hit rate the cache size allows: the same
 * workload on one replica holding the fleet's whole cache and slots, where no call can land away from
 * its conversation's prefix. One run, the three sides one after the other, each against fresh mocks.
 *
 * The hit rate is the mocks' own (GET /admin/gpu): prompt tokens found in the prefix cache at
 * admission over all prompt tokens admitted. It is a ratio of tokens, not a time: the machine's speed
 * moves it only through which calls overlap, so the figures hold on a shared 2-core box.
 *
 * Then the fleet's two events, each against fresh mock processes: a server killed (SIGKILL) while it
 * decodes for several sessions, and what the engine lost (fleetFailover); a server joining a running
 * engine, and how soon it takes a call (fleetJoin).
 *
 *   node --import tsx test/bench/fleet.ts                 # 4 servers, ≈ 2 min
 *   node --import tsx test/bench/fleet.ts --quick         # a smoke run, ≈ 40 s
 *   node --import tsx test/bench/fleet.ts --servers 8 --cache-tokens 60000
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { createEngine, Status, type Batch } from '../../src/index.ts';
import { startMockProcess, type MockProcess } from '../../src/loadtest/mock-process.ts';
import { readAll } from '../../src/loadtest/training.ts';
import type { GpuMetrics } from '../../src/mock-llm/gpu.ts';
import { row, type TargetRow } from './targets.ts';
import { writeDataset } from './training-loop.ts';

export interface FleetBenchOptions {
  servers: number;
  /** Sequence slots per server. */
  slots: number;
  /** Prefix cache per server, tokens (the reference replica holds servers × this). */
  cacheTokens: number;
  responseTokens: number;
  lengthSigma: number;
  maxTokens: number;
  turns: number;
  groupSize: number;
  /** Groups per batch. */
  groups: number;
  batches: number;
  speedup: number;
}

export function fleetBenchDefaults(quick: boolean): FleetBenchOptions {
  return {
    servers: 4,
    slots: 64,
    // The GPU mock's default (an H100's KV left after the weights): no eviction at this load.
    cacheTokens: 400_000,
    responseTokens: 96,
    lengthSigma: 0.8,
    maxTokens: 1024,
    turns: 6,
    groupSize: 8,
    groups: quick ? 8 : 32,
    batches: quick ? 2 : 3,
    speedup: 10,
  };
}

export const FLEET_SIDES = ['session', 'round-robin', 'one replica'] as const;
export type FleetSide = (typeof FLEET_SIDES)[number];

export interface FleetSideResult {
  side: FleetSide;
  servers: number;
  /** Prompt tokens admitted, and those the prefix cache held, over every server. */
  promptTokens: number;
  cachedTokens: number;
  hitFraction: number;
  /** Generated tokens per server, to show how evenly the routing spread the work. */
  generatedPerServer: number[];
  rollouts: number;
  seconds: number;
}

export interface FleetBenchResult {
  options: FleetBenchOptions;
  sides: FleetSideResult[];
}

async function startServers(o: FleetBenchOptions, side: FleetSide): Promise<MockProcess[]> {
  const one = side === 'one replica';
  const n = one ? 1 : o.servers;
  const slots = one ? o.slots * o.servers : o.slots;
  const cache = one ? o.cacheTokens * o.servers : o.cacheTokens;
  const out: MockProcess[] = [];
  try {
    for (let i = 0; i < n; i++)
      out.push(
        await startMockProcess([
          '--capacity',
          String(slots),
          '--capacity-prefix-cache',
          String(cache),
          '--capacity-response-tokens',
          String(o.responseTokens),
          '--capacity-length-sigma',
          String(o.lengthSigma),
          '--capacity-speedup',
          String(o.speedup),
          '--seed',
          '0',
        ]),
      );
  } catch (error) {
    await Promise.all(out.map((m) => m.close()));
    throw error;
  }
  return out;
}

const sum = (xs: readonly number[]): number => xs.reduce((a, b) => a + b, 0);

async function fleetSide(o: FleetBenchOptions, dataset: string, side: FleetSide): Promise<FleetSideResult> {
  const mocks = await startServers(o, side);
  const urls = mocks.map((m) => m.url);
  const rollouts = o.groups * o.groupSize;
  const engine = createEngine({
    logLevel: 'warn',
    llm: {
      url: urls,
      routing: side === 'round-robin' ? 'round-robin' : 'session',
      connections: 2 * rollouts + 16,
    },
    batchSize: o.groups,
    workers: { threads: 1, groupsPerWorker: o.groups },
    producer: { strategy: 'sync' },
    tasks: [
      {
        name: 'guess',
        env: { module: 'builtin:guess-number', params: { maxTurns: o.turns } },
        dataset,
        groupSize: o.groupSize,
        maxSteps: o.turns,
        maxTokens: o.maxTokens,
      },
    ],
  });
  try {
    await engine.start();
    const before = await readAll(urls);
    const t0 = performance.now();
    for (let b = 0; b < o.batches; b++) await engine.getBatch();
    const seconds = (performance.now() - t0) / 1000;
    const after = await readAll(urls);
    const delta = (f: (m: GpuMetrics) => number) => after.map((m, i) => f(m) - f(before[i]));
    const promptTokens = sum(delta((m) => m.promptTokens));
    const cachedTokens = sum(delta((m) => m.cachedTokens));
    return {
      side,
      servers: mocks.length,
      promptTokens,
      cachedTokens,
      hitFraction: promptTokens > 0 ? cachedTokens / promptTokens : 0,
      generatedPerServer: delta((m) => m.generatedTokens),
      rollouts: rollouts * o.batches,
      seconds,
    };
  } finally {
    await engine.close();
    await Promise.all(mocks.map((m) => m.close()));
  }
}

export async function fleetBench(
  o: FleetBenchOptions,
  only: readonly FleetSide[] = FLEET_SIDES,
): Promise<FleetBenchResult> {
  const dir = mkdtempSync(join(tmpdir(), 'rollout-fleet-bench-'));
  const sides: FleetSideResult[] = [];
  try {
    const dataset = writeDataset(dir, 4096);
    for (const side of FLEET_SIDES) if (only.includes(side)) sides.push(await fleetSide(o, dataset, side));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return { options: o, sides };
}

/**
 * A server killed (SIGKILL: a crash, not a shutdown) while it decodes for several sessions, one of
 * three GPU-like replicas slow enough that the kill lands mid-generation; two sync batches. What the
 * engine lost: groups not taken, rollouts not COMPLETED, draws missing or taken twice, groups dropped
 * (test/fleet.test.ts holds the same run to zero with more checks).
 */
export interface FleetFailover {
  servers: number;
  /** Sessions generating on the victim when it died. */
  cutOff: number;
  groupsExpected: number;
  groupsTaken: number;
  rolloutsNotCompleted: number;
  drawsMissingOrTwice: number;
  droppedGroups: number;
  outages: number;
  /** The sum of the four losses above: the target is 0. */
  lost: number;
  seconds: number;
}

export async function fleetFailover(): Promise<FleetFailover> {
  const dir = mkdtempSync(join(tmpdir(), 'rollout-fleet-failover-'));
  // ≈ 40 tokens of ≈ 7 ms steps a call at speed 1: a call lasts ≈ 0.3 s, long enough to die in.
  const mocks: MockProcess[] = [];
  const batches = 2;
  const batchSize = 6;
  try {
    for (let i = 0; i < 3; i++)
      mocks.push(
        await startMockProcess([
          '--capacity',
          '16',
          '--capacity-response-tokens',
          '40',
          '--capacity-length-sigma',
          '0.3',
          '--capacity-speedup',
          '1',
          '--seed',
          String(i),
        ]),
      );
    const [victim] = mocks;
    const engine = createEngine({
      logLevel: 'silent',
      llm: { url: mocks.map((m) => m.url) },
      batchSize,
      workers: { threads: 1, groupsPerWorker: batchSize },
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
      const t0 = performance.now();
      const first = engine.getBatch();
      let cutOff = 0;
      for (let waited = 0; waited < 30_000 && cutOff < 2; waited += 10) {
        await new Promise((r) => setTimeout(r, 10));
        cutOff = (await readAll([victim.url]))[0].running;
      }
      process.kill(victim.pid, 'SIGKILL');
      const taken: Batch[] = [await first];
      for (let b = 1; b < batches; b++) taken.push(await engine.getBatch());
      const seconds = (performance.now() - t0) / 1000;
      const stats = await engine.stats();
      const groups = taken.flatMap((b) => b.groups);
      const draws = new Set(groups.map((g) => g.sample.drawIndex));
      const expected = batches * batchSize;
      let missing = 0;
      for (let i = 0; i < expected; i++) if (!draws.has(i)) missing++;
      const result = {
        servers: mocks.length,
        cutOff,
        groupsExpected: expected,
        groupsTaken: stats.groups.taken,
        rolloutsNotCompleted: groups.flatMap((g) => g.rollouts).filter((r) => r.status !== Status.COMPLETED).length,
        drawsMissingOrTwice: missing + (groups.length - draws.size),
        droppedGroups: stats.groups.dropped.FAILED + stats.groups.dropped.FILTERED + stats.groups.dropped.EXPIRED,
        outages: stats.outage.outages,
        seconds,
      };
      return {
        ...result,
        lost:
          Math.max(0, result.groupsExpected - result.groupsTaken) +
          result.rolloutsNotCompleted +
          result.drawsMissingOrTwice +
          result.droppedGroups,
      };
    } finally {
      await engine.close();
    }
  } finally {
    await Promise.all(mocks.map((m) => m.close()));
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * A server joining a running engine (`engine.updateEndpoints`, as `POST /endpoints` does) while
 * sessions keep starting: the time from the call until the joined server has a call admitted (its
 * GPU counters, polled every 10 ms), over `rounds` joins, each with fresh servers.
 */
export interface FleetJoin {
  rounds: number;
  firstCallMs: number[];
  /** The slowest join: the target is ≤ 1 000 ms. */
  maxMs: number;
}

export async function fleetJoin(rounds: number): Promise<FleetJoin> {
  const firstCallMs: number[] = [];
  for (let round = 0; round < rounds; round++) {
    const [a, b] = await Promise.all(
      // GPU-like, so the joined one's counters say when it admitted a call: ≈ 0.2 s a call.
      [0, 1].map(() =>
        startMockProcess(['--capacity', '64', '--capacity-response-tokens', '32', '--seed', String(round)]),
      ),
    );
    const engine = createEngine({
      logLevel: 'silent',
      llm: { url: a.url },
      batchSize: 16,
      workers: { threads: 1, groupsPerWorker: 2 },
      producer: { strategy: 'sync' },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 4, maxSteps: 4, maxTokens: 32 }],
    });
    try {
      await engine.start();
      const batch = engine.getBatch();
      await new Promise((r) => setTimeout(r, 300)); // sessions on a, more starting
      const t0 = performance.now();
      await engine.updateEndpoints({ add: [b.url] });
      let took = Number.POSITIVE_INFINITY;
      while (performance.now() - t0 < 10_000) {
        const [m] = await readAll([b.url]);
        if (m.running + m.queued > 0 || m.promptTokens > 0) {
          took = performance.now() - t0;
          break;
        }
        await new Promise((r) => setTimeout(r, 10));
      }
      firstCallMs.push(took);
      await batch;
    } finally {
      await engine.close();
      await Promise.all([a.close(), b.close()]);
    }
  }
  return { rounds, firstCallMs, maxMs: Math.max(...firstCallMs) };
}

/** The dead server's and the joined server's rows (issue 31.5). */
export function fleetEventTargets(failover: FleetFailover | null, join: FleetJoin | null): TargetRow[] {
  return [
    row({
      target: `31.5 · a server of ${failover?.servers ?? 3} killed mid-generation`,
      figure: 'groups, rollouts or draws lost',
      value: failover?.lost ?? null,
      limit: 0,
      kind: 'max',
      unit: '',
      digits: 0,
      detail: failover
        ? `${failover.cutOff} sessions generating on it when it died; ${failover.groupsTaken} of ${failover.groupsExpected} groups taken, ${failover.rolloutsNotCompleted} rollouts not COMPLETED, ${failover.drawsMissingOrTwice} draws missing or twice, ${failover.droppedGroups} dropped, ${failover.outages} outages`
        : 'not measured',
    }),
    row({
      target: '31.5 · a server joins a running engine',
      figure: 'first call on it after the join, slowest',
      value: join?.maxMs ?? null,
      limit: 1000,
      kind: 'max',
      unit: ' ms',
      digits: 0,
      detail: join
        ? `${join.firstCallMs.map((ms) => ms.toFixed(0)).join(', ')} ms over ${join.rounds} joins (GPU counters polled every 10 ms); the probe of the new server (/v1/models) is part of it`
        : 'not measured',
    }),
  ];
}

/** Session routing's hit rate over the one replica's (the rate the cache size allows): the target is ≥ 0.9. */
export function fleetTargets(r: FleetBenchResult): TargetRow[] {
  const hit = (side: FleetSide) => r.sides.find((s) => s.side === side)?.hitFraction ?? null;
  const session = hit('session');
  const rr = hit('round-robin');
  const ceiling = hit('one replica');
  const share = session !== null && ceiling !== null && ceiling > 0 ? session / ceiling : null;
  const pct = (x: number | null) => (x === null ? 'n/a' : `${(100 * x).toFixed(1)} %`);
  return [
    row({
      target: `31.5 · prefix-cache hit, ${r.options.servers} servers`,
      figure: 'session routing ÷ one replica',
      value: share,
      limit: 0.9,
      kind: 'min',
      unit: '×',
      digits: 3,
      detail: `session ${pct(session)}, round-robin ${pct(rr)}, one replica with the fleet's cache ${pct(ceiling)}`,
    }),
  ];
}

export function printFleetBench(r: FleetBenchResult): void {
  const o = r.options;
  console.log(
    `\nfleet of GPU-like mocks: ${o.servers} × ${o.slots}-slot replica, prefix cache ${o.cacheTokens} tokens each; guess-number ≤ ${o.turns} turns, ${o.groups} groups × ${o.groupSize} per batch, ${o.batches} batches (sync); responses log-normal (median ${o.responseTokens}, σ ${o.lengthSigma}, max ${o.maxTokens}); GPU time at ${o.speedup}× speed`,
  );
  const ceiling = r.sides.find((s) => s.side === 'one replica')?.hitFraction ?? null;
  const h = ['side', 'servers', 'prompt tok', 'cached tok', 'hit %', '÷ one replica', 'gen tok max/min server', 's'];
  const w = [13, 9, 12, 12, 9, 15, 24, 8];
  const line = (cells: string[]) => cells.map((x, i) => (i === 0 ? x.padEnd(w[i]) : x.padStart(w[i]))).join('');
  console.log(line(h));
  for (const s of r.sides) {
    const spread =
      s.generatedPerServer.length > 1
        ? (Math.max(...s.generatedPerServer) / Math.max(1, Math.min(...s.generatedPerServer))).toFixed(2)
        : '—';
    console.log(
      line([
        s.side,
        String(s.servers),
        String(s.promptTokens),
        String(s.cachedTokens),
        (100 * s.hitFraction).toFixed(1),
        ceiling !== null && ceiling > 0 ? (s.hitFraction / ceiling).toFixed(3) : 'n/a',
        spread,
        s.seconds.toFixed(1),
      ]),
    );
  }
  for (const t of fleetTargets(r))
    console.log(
      `${t.pass === null ? 'n/a ' : t.pass ? 'PASS' : 'FAIL'}  ${t.target}: ${t.figure} ${t.measured} (target ${t.limit}); ${t.detail}`,
    );
}

export function printFleetEvents(failover: FleetFailover | null, join: FleetJoin | null): void {
  for (const t of fleetEventTargets(failover, join))
    console.log(
      `${t.pass === null ? 'n/a ' : t.pass ? 'PASS' : 'FAIL'}  ${t.target}: ${t.figure} ${t.measured} (target ${t.limit}); ${t.detail}`,
    );
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean' },
      servers: { type: 'string' },
      slots: { type: 'string' },
      'cache-tokens': { type: 'string' },
      turns: { type: 'string' },
      groups: { type: 'string' },
      batches: { type: 'string' },
      speedup: { type: 'string' },
    },
  });
  const o = fleetBenchDefaults(values.quick ?? false);
  const num = (v: string | undefined, fallback: number) => (v === undefined ? fallback : Number(v));
  o.servers = num(values.servers, o.servers);
  o.slots = num(values.slots, o.slots);
  o.cacheTokens = num(values['cache-tokens'], o.cacheTokens);
  o.turns = num(values.turns, o.turns);
  o.groups = num(values.groups, o.groups);
  o.batches = num(values.batches, o.batches);
  o.speedup = num(values.speedup, o.speedup);
  printFleetBench(await fleetBench(o));
  const failover = await fleetFailover();
  const join = await fleetJoin(values.quick ? 1 : 3);
  printFleetEvents(failover, join);
}

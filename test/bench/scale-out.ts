/**
 * Scale-out: steps/s with 1, 2 and 3 worker-node processes (`rollout node --threads 1`, each its own
 * OS process on this machine) against local threads, on an environment that burns CPU per step, and
 * what JetStream costs per group: the coordinator's main-thread CPU (producer, buffer, codec, and with
 * nodes the NATS client; local worker threads, the nodes and the mock are not counted) and the bytes
 * of each group's work and result messages.
 *
 *   node --import tsx test/bench/scale-out.ts [--seconds 6] [--env-cpu-us 2000] [--quick]
 *
 * Needs nats-server (apt-get install nats-server); without it the section says so and is skipped.
 * Bytes are counted by a plain subscriber to the run's subjects: the messages' data and headers,
 * not the NATS protocol framing, acks or heartbeats. On 2 cores the nodes share the cores with the
 * coordinator, the mock and NATS: the figures say what one group costs, not how far 100 machines go
 * (docs/SCALE-OUT.md works that out from them).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { cpus } from 'node:os';
import { parseArgs } from 'node:util';
import { connect } from '@nats-io/transport-node';
import { createEngine } from '../../src/index.ts';
import { startMockProcess, statCpuMs, type MockProcess } from '../../src/loadtest/mock-process.ts';
import { CLI_MAIN } from '../support/cli.ts';
import { hasNatsServer, startNatsServer, type NatsServer } from '../support/nats-server.ts';
import { threadCpuMs } from './machine.ts';

export interface ScaleOutSide {
  side: string;
  nodes: number;
  threads: number;
  stepsPerSecond: number;
  groupsPerSecond: number;
  /** The coordinator's main thread's CPU per group taken (producer, buffer, codec, NATS client); worker threads not counted. */
  coordinatorCpuUsPerGroup: number | null;
  /** Work + result message bytes per group (nodes only). */
  wireBytesPerGroup: number | null;
  /** The environment's CPU per step on this side (µs). */
  cpuCostUs: number;
  /** Inference calls (turns) per group taken. */
  turnsPerGroup: number;
  /** The coordinator's main thread's share of one core over the window. */
  coordinatorBusy: number | null;
  /** nats-server's CPU per group (all its threads; nodes only). */
  natsCpuUsPerGroup: number | null;
}

/**
 * What one coordinator sustains with worker nodes. Its main thread is one core; over the node sides
 * its CPU per second is fitted as `fixed + perGroup × groups/s` (least squares: heartbeats, watches
 * and timers cost the same at any rate), so it saturates at groups/s = (1 core − fixed) ÷ perGroup,
 * and turns/s is that × turns per group. nats-server's CPU is fitted the same way (per core of it),
 * and the bytes per group say what the link carries at that rate.
 */
export interface ScaleOutCapacity {
  /** The node sides the fit is over. */
  sides: number;
  turnsPerGroup: number;
  coordinator: CpuFit;
  coordinatorCpuUsPerTurn: number;
  /** (1 core − fixed) ÷ per group, × turns per group. */
  turnsPerSecond: number;
  groupsPerSecond: number;
  nats: CpuFit | null;
  /** Groups/s one core of nats-server carries, by its fit. */
  natsGroupsPerSecondPerCore: number | null;
  wireBytesPerGroup: number | null;
  /** MB/s through the server at the coordinator's ceiling. */
  wireMBPerSecondAtCeiling: number | null;
  /** The highest rate measured, and the coordinator's busy share there. */
  measuredAt: { side: string; groupsPerSecond: number; coordinatorBusy: number | null };
}

/** CPU ms per second = fixedMsPerSecond + perGroupUs ÷ 1000 × groups/s. */
export interface CpuFit {
  perGroupUs: number;
  fixedMsPerSecond: number;
}

export interface ScaleOut {
  skipped: string | null;
  cpuCostUs: number;
  groupsPerThread: number;
  seconds: number;
  sides: ScaleOutSide[];
  capacity: ScaleOutCapacity | null;
}

interface Options {
  seconds: number;
  cpuCostUs: number;
  groupsPerThread: number;
  /**
   * Also 2 node processes with a free environment (0 µs a step): the highest rate this machine gives
   * the coordinator, the fit's far point.
   */
  freeEnvSide?: boolean;
}

export async function scaleOut(o: Options): Promise<ScaleOut> {
  const base: ScaleOut = {
    skipped: null,
    cpuCostUs: o.cpuCostUs,
    groupsPerThread: o.groupsPerThread,
    seconds: o.seconds,
    sides: [],
    capacity: null,
  };
  if (!hasNatsServer()) return { ...base, skipped: 'nats-server is not installed (apt-get install nats-server)' };
  const mock = await startMockProcess(['--latency-ms', '0']);
  const nats = await startNatsServer();
  try {
    for (const threads of [1, 2])
      base.sides.push(
        await measure(`local, ${threads} thread${threads > 1 ? 's' : ''}`, { mock, nats: null, nodes: 0, threads }, o),
      );
    for (const nodes of [1, 2, 3])
      base.sides.push(
        await measure(`${nodes} node process${nodes > 1 ? 'es' : ''} × 1 thread`, { mock, nats, nodes, threads: 1 }, o),
      );
    if (o.freeEnvSide)
      base.sides.push(
        await measure('2 node processes, free env', { mock, nats, nodes: 2, threads: 1 }, { ...o, cpuCostUs: 0 }),
      );
    base.capacity = capacityOf(base.sides);
  } finally {
    await nats.stop();
    await mock.close();
  }
  return base;
}

async function measure(
  side: string,
  at: { mock: MockProcess; nats: NatsServer | null; nodes: number; threads: number },
  o: Options,
): Promise<ScaleOutSide> {
  const run = `bench${at.nodes}`;
  const workers =
    at.nats === null
      ? { threads: at.threads, groupsPerWorker: o.groupsPerThread }
      : { threads: 1, groupsPerWorker: o.groupsPerThread, nats: { url: at.nats.url, run } };
  const engine = createEngine({
    llm: { url: at.mock.url },
    batchSize: 8,
    recordSteps: false,
    logLevel: 'warn',
    tasks: [
      {
        name: 'g',
        env: { module: 'builtin:guess-number', params: { cpuCostUs: o.cpuCostUs } },
        groupSize: 4,
        maxTokens: 64,
      },
    ],
    // Capacity stays full between batches: over-sampling, and no staleness limit (no weight updates here).
    producer: { strategy: 'async', overSampleThreshold: 1, maxStaleness: 1_000_000 },
    workers,
  });
  const children: ChildProcess[] = [];
  let bytes = 0;
  const sniffer = at.nats === null ? null : await connect({ servers: at.nats.url });
  if (sniffer !== null) {
    sniffer.subscribe(`rollout.${run}.*`, {
      callback: (_err, msg) => {
        bytes += msg.data.byteLength;
        for (const key of msg.headers?.keys() ?? []) bytes += key.length + (msg.headers?.get(key).length ?? 0) + 4;
      },
    });
  }
  try {
    await engine.start();
    for (let i = 0; i < at.nodes; i++) {
      children.push(
        spawn(
          process.execPath,
          [
            '--import',
            'tsx',
            CLI_MAIN,
            'node',
            '--nats',
            at.nats!.url,
            '--run',
            run,
            '--threads',
            '1',
            '--id',
            `bench-${i}`,
          ],
          { env: { ...process.env, LOG_LEVEL: 'warn' }, stdio: 'ignore' },
        ),
      );
    }
    let step = 1;
    // Warm-up: every node has taken groups, JIT and connections are warm.
    const warmUntil = performance.now() + 2_000;
    while (performance.now() < warmUntil) await engine.getBatch(step++);
    // The main thread's tid is the pid on Linux; local rows' worker threads are not the coordinator's cost.
    const mainCpuMs = () => threadCpuMs()?.get(process.pid) ?? null;
    const natsPid = at.nats?.pid() ?? null;
    const natsCpuMs = () => (natsPid === null ? null : statCpuMs(`/proc/${natsPid}/stat`));
    const nats0 = natsCpuMs();
    const cpu0 = mainCpuMs();
    const bytes0 = bytes;
    let turns = 0;
    let groups = 0;
    const start = performance.now();
    while (performance.now() - start < o.seconds * 1000) {
      const batch = await engine.getBatch(step++);
      turns += batch.stats?.turns ?? 0;
      groups += batch.groups.length;
    }
    const seconds = (performance.now() - start) / 1000;
    const cpu1 = mainCpuMs();
    const nats1 = natsCpuMs();
    return {
      cpuCostUs: o.cpuCostUs,
      turnsPerGroup: turns / Math.max(1, groups),
      coordinatorBusy: cpu0 === null || cpu1 === null ? null : (cpu1 - cpu0) / 1000 / seconds,
      natsCpuUsPerGroup: nats0 === null || nats1 === null ? null : ((nats1 - nats0) * 1000) / Math.max(1, groups),
      side,
      nodes: at.nodes,
      threads: at.nats === null ? at.threads : at.nodes,
      stepsPerSecond: turns / seconds,
      groupsPerSecond: groups / seconds,
      coordinatorCpuUsPerGroup: cpu0 === null || cpu1 === null ? null : ((cpu1 - cpu0) * 1000) / Math.max(1, groups),
      wireBytesPerGroup: sniffer === null ? null : (bytes - bytes0) / Math.max(1, groups),
    };
  } finally {
    await engine.close();
    await Promise.all(
      children.map((c) =>
        c.exitCode !== null ? null : new Promise((resolve) => (c.once('exit', resolve), c.kill('SIGTERM'))),
      ),
    );
    await sniffer?.close();
  }
}

function fit(points: readonly { x: number; y: number }[]): CpuFit | null {
  if (points.length === 0) return null;
  const n = points.length;
  const mx = points.reduce((a, p) => a + p.x, 0) / n;
  const my = points.reduce((a, p) => a + p.y, 0) / n;
  const sxx = points.reduce((a, p) => a + (p.x - mx) ** 2, 0);
  const slope = sxx > 0 ? points.reduce((a, p) => a + (p.x - mx) * (p.y - my), 0) / sxx : 0;
  // One rate only, or noise that tilts the line the wrong way: all of it per group, nothing fixed.
  if (n < 2 || slope <= 0) {
    const top = points.reduce((a, p) => (p.x > a.x ? p : a));
    return { perGroupUs: (1000 * top.y) / top.x, fixedMsPerSecond: 0 };
  }
  return { perGroupUs: 1000 * slope, fixedMsPerSecond: Math.max(0, my - slope * mx) };
}

export function capacityOf(sides: readonly ScaleOutSide[]): ScaleOutCapacity | null {
  const nodes = sides.filter((s) => s.nodes > 0 && s.coordinatorCpuUsPerGroup !== null && s.groupsPerSecond > 0);
  if (nodes.length === 0) return null;
  // ms of CPU per second of the run, against groups per second.
  const msPerSecond = (usPerGroup: number, s: ScaleOutSide) => (usPerGroup * s.groupsPerSecond) / 1000;
  const coordinator = fit(
    nodes.map((s) => ({ x: s.groupsPerSecond, y: msPerSecond(s.coordinatorCpuUsPerGroup!, s) })),
  )!;
  const withNats = nodes.filter((s) => s.natsCpuUsPerGroup !== null);
  const nats = fit(withNats.map((s) => ({ x: s.groupsPerSecond, y: msPerSecond(s.natsCpuUsPerGroup!, s) })));
  const top = nodes.reduce((a, b) => (b.groupsPerSecond > a.groupsPerSecond ? b : a));
  const turnsPerGroup = nodes.reduce((a, s) => a + s.turnsPerGroup, 0) / nodes.length;
  const groupsPerSecond = ((1000 - coordinator.fixedMsPerSecond) * 1000) / coordinator.perGroupUs;
  const bytes = top.wireBytesPerGroup;
  return {
    sides: nodes.length,
    turnsPerGroup,
    coordinator,
    coordinatorCpuUsPerTurn: coordinator.perGroupUs / turnsPerGroup,
    turnsPerSecond: groupsPerSecond * turnsPerGroup,
    groupsPerSecond,
    nats,
    natsGroupsPerSecondPerCore: nats === null ? null : ((1000 - nats.fixedMsPerSecond) * 1000) / nats.perGroupUs,
    wireBytesPerGroup: bytes,
    wireMBPerSecondAtCeiling: bytes === null ? null : (bytes * groupsPerSecond) / 1e6,
    measuredAt: { side: top.side, groupsPerSecond: top.groupsPerSecond, coordinatorBusy: top.coordinatorBusy },
  };
}

export function describeCapacity(c: ScaleOutCapacity): string {
  const nats =
    c.nats === null || c.natsGroupsPerSecondPerCore === null
      ? ''
      : `; nats-server ${c.nats.perGroupUs.toFixed(0)} µs a group + ${c.nats.fixedMsPerSecond.toFixed(0)} ms/s, ${c.natsGroupsPerSecondPerCore.toFixed(0)} groups/s a core of it`;
  const wire =
    c.wireBytesPerGroup === null || c.wireMBPerSecondAtCeiling === null
      ? ''
      : `; ${(c.wireBytesPerGroup / 1000).toFixed(1)} kB a group on NATS, ${c.wireMBPerSecondAtCeiling.toFixed(0)} MB/s at the ceiling`;
  return (
    `one coordinator with worker nodes: main thread ${c.coordinator.perGroupUs.toFixed(0)} µs a group + ${c.coordinator.fixedMsPerSecond.toFixed(0)} ms/s (fit over ${c.sides} node sides) → ` +
    `≈ ${c.groupsPerSecond.toFixed(0)} groups/s × ${c.turnsPerGroup.toFixed(1)} turns ≈ ${c.turnsPerSecond.toFixed(0)} turns/s (${c.coordinatorCpuUsPerTurn.toFixed(1)} µs a turn)` +
    `; measured up to ${c.measuredAt.groupsPerSecond.toFixed(0)} groups/s ("${c.measuredAt.side}", main thread ${c.measuredAt.coordinatorBusy === null ? 'n/a' : `${(100 * c.measuredAt.coordinatorBusy).toFixed(0)} %`} busy)${nats}${wire}`
  );
}

export function printScaleOut(r: ScaleOut): void {
  console.log(
    `\nscale-out: worker nodes over NATS JetStream (guess-number burning ${r.cpuCostUs} µs of CPU per step, ${r.groupsPerThread} groups of 4 per thread, ${cpus().length} cores)`,
  );
  if (r.skipped !== null) {
    console.log(`  skipped: ${r.skipped}`);
    return;
  }
  const local = r.sides.find((s) => s.nodes === 0 && s.threads === 1);
  console.log(
    '  side                              steps/s   groups/s   × 1 local thread   coordinator CPU µs/group   busy   turns/group   nats-server µs/group   bytes/group on NATS',
  );
  for (const s of r.sides) {
    const ratio = local ? (s.stepsPerSecond / local.stepsPerSecond).toFixed(2) : 'n/a';
    console.log(
      `  ${s.side.padEnd(32)} ${s.stepsPerSecond.toFixed(0).padStart(8)} ${s.groupsPerSecond.toFixed(1).padStart(10)} ${ratio.padStart(18)} ${(s.coordinatorCpuUsPerGroup?.toFixed(0) ?? 'n/a').padStart(26)} ${(s.coordinatorBusy === null ? 'n/a' : `${(100 * s.coordinatorBusy).toFixed(0)} %`).padStart(6)} ${s.turnsPerGroup.toFixed(1).padStart(13)} ${(s.natsCpuUsPerGroup === null ? '—' : s.natsCpuUsPerGroup.toFixed(0)).padStart(22)} ${s.wireBytesPerGroup === null ? '—'.padStart(21) : s.wireBytesPerGroup.toFixed(0).padStart(21)}`,
    );
  }
  if (r.capacity !== null) console.log(`  ${describeCapacity(r.capacity)}`);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: { seconds: { type: 'string' }, 'env-cpu-us': { type: 'string' }, quick: { type: 'boolean' } },
  });
  const result = await scaleOut({
    seconds: Number(values.seconds ?? (values.quick ? 2 : 6)),
    cpuCostUs: Number(values['env-cpu-us'] ?? 2000),
    groupsPerThread: 8,
    freeEnvSide: true,
  });
  printScaleOut(result);
  console.log(JSON.stringify(result));
}

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
import { startMockProcess, type MockProcess } from '../../src/loadtest/mock-process.ts';
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
}

export interface ScaleOut {
  skipped: string | null;
  cpuCostUs: number;
  groupsPerThread: number;
  seconds: number;
  sides: ScaleOutSide[];
}

interface Options {
  seconds: number;
  cpuCostUs: number;
  groupsPerThread: number;
}

export async function scaleOut(o: Options): Promise<ScaleOut> {
  const base: ScaleOut = {
    skipped: null,
    cpuCostUs: o.cpuCostUs,
    groupsPerThread: o.groupsPerThread,
    seconds: o.seconds,
    sides: [],
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
    return {
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
    '  side                              steps/s   groups/s   × 1 local thread   coordinator CPU µs/group   bytes/group on NATS',
  );
  for (const s of r.sides) {
    const ratio = local ? (s.stepsPerSecond / local.stepsPerSecond).toFixed(2) : 'n/a';
    console.log(
      `  ${s.side.padEnd(32)} ${s.stepsPerSecond.toFixed(0).padStart(8)} ${s.groupsPerSecond.toFixed(1).padStart(10)} ${ratio.padStart(18)} ${(s.coordinatorCpuUsPerGroup?.toFixed(0) ?? 'n/a').padStart(26)} ${s.wireBytesPerGroup === null ? '—'.padStart(21) : s.wireBytesPerGroup.toFixed(0).padStart(21)}`,
    );
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values } = parseArgs({
    options: { seconds: { type: 'string' }, 'env-cpu-us': { type: 'string' }, quick: { type: 'boolean' } },
  });
  const result = await scaleOut({
    seconds: Number(values.seconds ?? (values.quick ? 2 : 6)),
    cpuCostUs: Number(values['env-cpu-us'] ?? 2000),
    groupsPerThread: 8,
  });
  printScaleOut(result);
  console.log(JSON.stringify(result));
}

/**
 * `npm run bench` — the engine beside a bare undici request loop, against the same mock inference
 * server (in its own process), at the same concurrency, in one run.
 *
 * Figures: engine steps/s and CPU per step (all threads of this process: coordinator + workers), the
 * bare loop's requests/s and CPU per request, and their ratios. CPU is process.cpuUsage() (user +
 * system, every thread); the mock server's CPU is not counted on either side (it is printed per call
 * beside each side: its work per call is the same, so its rise shows what sharing the cores costs).
 *
 *   npm run bench                      # default: 3 repeats × 5 s per side, 10k rollouts for memory
 *   npm run bench -- --quick           # smoke: 1 repeat × 1.5 s, 2k rollouts for memory (< 1 min)
 *   npm run bench -- --concurrency 256 --seconds 8 --repeats 5
 *   npm run bench -- --memory-rollouts 20000 --memory-think-tokens 1024 --env-cpu-us 1000
 *
 * Then pause figures: with `--pause-rollouts` (512) rollouts in flight against a slow server, the time
 * until every worker has stopped issuing inference calls (the engine's own share) and until every
 * group is back on the main thread, p50 / p99, in abort mode (replies whole, then streamed and held)
 * and drain mode; and as the floor under the whole-reply abort, a bare undici client reading the same
 * number of aborted replies (no engine).
 *
 * Also the Python baseline (test/bench/python_baseline.py, via python-baseline.ts): an asyncio loop
 * built like the reference Interactor, environment through an executor and called directly, against
 * the same mock process at the same concurrency; skipped with a line saying why without aiohttp.
 *
 * Then the rest of issue 7's targets (./targets.ts): latency-bound efficiency at 64 and 512 in flight
 * with 50 ms per call (and the Python loop at 512 / 50 ms; ./call-floor.ts: what one such call costs here
 * with no engine and no mock), two workers against one on an environment
 * that burns CPU per step, and memory per in-flight rollout against its raw payload (./memory.ts,
 * rollouts held mid-episode by ./stall-proxy.ts), and beside it what long episodes' prompt ids cost
 * with the whole conversation sent (./long-episodes.ts). The last table lists every target with its figure
 * and PASS / FAIL; the JSON result (bench-results/) holds all of it.
 *
 * Last, issue 21's simulated training loop on GPU-like mocks (./training-loop.ts, runnable on its
 * own): sync, async at staleness 1, async with partial rollouts and the Python sync trainer, in
 * training steps per hour, the servers' busy fraction and slot fill, and what each weight sync costs;
 * beside it issue 31.4's trajectory-aware scheduling against FIFO (./priority.ts, runnable on its own).
 *
 * Then the CPU per tool call (./tool-calls.ts): builtin:tool-lookup beside builtin:arithmetic on one mock.
 *
 * Issue 31: the fleet (./fleet.ts: session-affine routing's prefix-cache hit rate against what the
 * cache allows, a server killed mid-generation, a server joining), the agentic long-tail workloads
 * (./long-tail.ts, each speed-up with its ceiling; one workload with --quick), and the capacity model
 * of one coordinator with worker nodes (./scale-out.ts). Beside the throughput sides, the engine's
 * own inference client in a plain loop on the same requests: the floor under the CPU-per-step ratio.
 * The last table lists every target of issues 7, 21 and 31 with PASS / FAIL and the ceiling beside
 * each speed-up.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Pool } from 'undici';
import { createEngine } from '../../src/index.ts';
import { startMockProcess, type MockProcess } from '../../src/loadtest/mock-process.ts';
import { percentile } from '../../src/loadtest/stats.ts';
import { callFloor, describeCallFloor } from './call-floor.ts';
import {
  bareLoop,
  clientLoop,
  engineThroughput,
  firstTurnBody,
  type Sample,
  type ThroughputSample,
} from './engine-throughput.ts';
import { describeShare, startCpuMeter, type CpuShare } from './machine.ts';
import { runPythonBaseline } from './python-baseline.ts';
import { longEpisodes } from './long-episodes.ts';
import { describeCapacity, printScaleOut, scaleOut } from './scale-out.ts';
import {
  fleetBench,
  fleetBenchDefaults,
  fleetEventTargets,
  fleetFailover,
  fleetJoin,
  fleetTargets,
  printFleetBench,
  printFleetEvents,
} from './fleet.ts';
import { longTailBench, longTailTargets, printLongTailSummary } from './long-tail.ts';
import { LONG_TAIL_WORKLOADS } from './workloads/long-tail.ts';
import { printTrainingBench, trainingBenchDefaults, trainingBenches, trainingTargets } from './training-loop.ts';
import { printPriorityBench, priorityBench, priorityBenchDefaults, priorityTargets } from './priority.ts';
import { describeToolCallCost, toolCallCost } from './tool-calls.ts';
import {
  figureRow,
  LATENCY_GROUP_SLACK,
  latencyBound,
  longTailRows,
  memoryRuns,
  printTargets,
  row,
  workerScaling,
  type TargetRow,
} from './targets.ts';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean' },
    concurrency: { type: 'string' },
    seconds: { type: 'string' },
    repeats: { type: 'string' },
    threads: { type: 'string' },
    'latency-ms': { type: 'string' },
    out: { type: 'string' },
    'pause-rollouts': { type: 'string' },
    'memory-rollouts': { type: 'string' },
    'memory-think-tokens': { type: 'string' },
    'env-cpu-us': { type: 'string' },
  },
});
const quick = values.quick ?? false;
const threads = Number(values.threads ?? availableParallelism());
const groupSize = 4;
/** Rollouts in flight on the engine side = requests in flight on the bare side. */
const concurrency = Number(values.concurrency ?? 64);
const seconds = Number(values.seconds ?? (quick ? 1.5 : 5));
const repeats = Number(values.repeats ?? (quick ? 1 : 3));
const latencyMs = Number(values['latency-ms'] ?? 0);
const maxTokens = 64;
const pauseRollouts = Number(values['pause-rollouts'] ?? 512);
/** Target 5: rollouts held in flight (issue 7 says 10k; --quick uses fewer to stay short). */
const memoryRollouts = Number(values['memory-rollouts'] ?? (quick ? 2_000 : 10_000));
/** Filler tokens per mock answer in the memory runs: sets how much payload a rollout holds per turn. */
const memoryThinkTokens = Number(values['memory-think-tokens'] ?? 256);
/** Target 6: CPU the environment burns per step (guess-number's `cpuCostUs`). */
const envCpuUs = Number(values['env-cpu-us'] ?? 500);

/** Chat bodies the engine sent, kept from its first run: the bare loop sends the same ones. */
const RECORDED_BODIES = 4_000;

function bareRun(
  url: string,
  bodies: readonly string[],
  mock: MockProcess,
): Promise<Sample & { mockCpuMs: number | null }> {
  return bareLoop({ url, concurrency, seconds, bodies, mock });
}

function engineRun(
  url: string,
  workers: number,
  mock: MockProcess,
  recordBodies = 0,
  stream = false,
): Promise<ThroughputSample> {
  return engineThroughput({
    url,
    concurrency,
    threads: workers,
    seconds,
    groupSize,
    maxTokens,
    mock,
    recordBodies,
    stream,
  });
}

interface PythonRuns {
  executor: (Sample & { episodes: number; meanReward: number | null })[];
  direct: (Sample & { episodes: number; meanReward: number | null })[];
  /** Why the baseline could not run (aiohttp missing, …); null while it runs. */
  skipped: string | null;
  versions: { interpreter: string; python: string; aiohttp: string } | null;
}

/** One repeat of the Python baseline, both modes, against `url`; the first failure skips it from then on. */
async function pythonRound(url: string, runs: PythonRuns): Promise<void> {
  for (const mode of ['executor', 'direct'] as const) {
    if (runs.skipped !== null) return;
    const outcome = await runPythonBaseline({ url, concurrency, seconds, mode, maxTokens });
    if (!outcome.ok) {
      runs.skipped = outcome.reason;
      return;
    }
    const r = outcome.result;
    runs.versions ??= { interpreter: outcome.interpreter, python: r.python, aiohttp: r.aiohttp };
    runs[mode].push({
      operations: r.steps,
      seconds: r.seconds,
      cpuMs: r.cpuSeconds * 1000,
      episodes: r.episodes,
      meanReward: r.meanReward,
    });
  }
}

function stats(xs: number[]): { median: number; min: number; max: number } {
  const s = [...xs].sort((a, b) => a - b);
  return { median: s[Math.floor(s.length / 2)], min: s[0], max: s[s.length - 1] };
}

function pauseLabel(f: PauseFigures): string {
  return f.stream ? `${f.mode}, streamed` : f.mode;
}

interface PauseFigures {
  mode: 'abort' | 'drain';
  /** Replies streamed (llm.stream): an aborting pause holds each call with the tokens it has. */
  stream: boolean;
  pauses: number;
  rolloutsInFlight: { min: number; median: number };
  workersStoppedMs: { p50: number; p99: number };
  workersAckedMs: { p50: number; p99: number };
  allBackMs: { p50: number; p99: number };
  /** Every pause's time until all groups were back, in order (the first pause runs code no pause has warmed). */
  allBackSamplesMs: number[];
}

/**
 * Pauses with `pauseRollouts` rollouts in flight against a slow server (generations take ~1 s), in
 * one mode: the engine's own share (request → the last inference call any worker sent, from the
 * control block's last-send clock), the time until every worker's event loop acknowledged it, and the
 * time until every group is back on the main thread.
 */
async function pauseBench(
  url: string,
  mode: 'abort' | 'drain',
  stream: boolean,
  pauseRollouts: number,
  pauses: number,
): Promise<PauseFigures> {
  const groups = Math.ceil(pauseRollouts / groupSize);
  const engine = createEngine({
    logLevel: 'warn',
    llm: { url, connections: Math.ceil(pauseRollouts / threads) + 8, abortPath: '/admin/abort', stream },
    batchSize: groups,
    workers: { threads, groupsPerWorker: Math.ceil(groups / threads) },
    tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize, maxSteps: 8, maxTokens: 400 }],
    producer: { strategy: 'async', partialRollout: true, maxStaleness: 1_000_000 },
    pause: { mode, timeoutMs: 30_000 },
  });
  await engine.start();
  const stopped: number[] = [];
  const acked: number[] = [];
  const back: number[] = [];
  const inFlight: number[] = [];
  try {
    for (let i = 0; i < pauses; i++) {
      // Let production fill up again; count rollouts in flight from the workers themselves.
      let rollouts = 0;
      for (let waited = 0; waited < 5_000; waited += 50) {
        await new Promise((r) => setTimeout(r, 50));
        rollouts = (await engine.stats()).workers.reduce((n, w) => n + w.inFlightRollouts, 0);
        if (rollouts >= pauseRollouts * 0.95 && waited >= 300) break;
      }
      inFlight.push(rollouts);
      const report = await engine.pauseForWeightUpdate();
      if (report.workersStoppedMs !== null) stopped.push(report.workersStoppedMs);
      if (report.workersAckedMs !== null) acked.push(report.workersAckedMs);
      back.push(report.allBackMs);
      await engine.resume({ modelStep: 0 }); // the mock keeps its weights: no new version to report
    }
  } finally {
    await engine.close();
  }
  return {
    mode,
    stream,
    pauses,
    rolloutsInFlight: { min: Math.min(...inFlight), median: stats(inFlight).median },
    workersStoppedMs: { p50: percentile(stopped, 50), p99: percentile(stopped, 99) },
    workersAckedMs: { p50: percentile(acked, 50), p99: percentile(acked, 99) },
    allBackMs: { p50: percentile(back, 50), p99: percentile(back, 99) },
    allBackSamplesMs: back,
  };
}

/**
 * The floor under "every partial rollout back": `calls` bare undici requests in flight on one pool
 * (same slow mock, same body shape as a guess-number turn), then the server-side abort; the time from
 * the abort request until the last aborted reply has been read. No engine, no parsing, one thread.
 */
async function bareAbortFloor(url: string, calls: number, rounds: number): Promise<{ p50: number; p99: number }> {
  const pool = new Pool(url, { connections: calls + 8, headersTimeout: 60_000, bodyTimeout: 60_000 });
  const admin = new Pool(url, { connections: 1 });
  const body = firstTurnBody(400);
  const times: number[] = [];
  try {
    for (let round = 0; round < rounds; round++) {
      let lastReadAt = 0;
      const pending = Array.from({ length: calls }, async () => {
        const res = await pool.request({
          method: 'POST',
          path: '/v1/chat/completions',
          headers: { 'content-type': 'application/json' },
          body,
        });
        await res.body.text();
        lastReadAt = performance.now();
      });
      await new Promise((r) => setTimeout(r, 600)); // generations are mid-way (≈ 60 of 100+ tokens)
      const t0 = performance.now();
      const abort = await admin.request({
        method: 'POST',
        path: '/admin/abort',
        headers: { 'content-type': 'application/json' },
        body: '{"abort_all":true}',
      });
      await abort.body.dump();
      await Promise.all(pending);
      times.push(lastReadAt - t0);
    }
  } finally {
    await Promise.all([pool.close(), admin.close()]);
  }
  return { p50: percentile(times, 50), p99: percentile(times, 99) };
}

async function main(): Promise<void> {
  // Other processes on these cores (tests, servers) lower every figure: each part says how busy they were.
  const cpuShare: Record<string, CpuShare | null> = {};
  let meter = startCpuMeter();
  const mock = await startMockProcess(['--latency-ms', String(latencyMs)]);
  const bare: (Sample & { mockCpuMs: number | null })[] = [];
  // The engine's own inference client in a plain loop on the same bodies: what the client alone costs.
  const client: (Sample & { mockCpuMs: number | null })[] = [];
  const engine: ThroughputSample[] = [];
  // On a machine whose cores the mock shares, one worker can cost less per step than `threads`.
  const engineOne: ThroughputSample[] = [];
  // Streamed replies at 1 worker: what reading server-sent events costs next to one body per reply.
  const engineStreamed: ThroughputSample[] = [];
  const python: PythonRuns = { executor: [], direct: [], skipped: null, versions: null };
  let bodies: string[] = [];
  try {
    for (let i = 0; i < repeats; i++) {
      engine.push(await engineRun(mock.url, threads, mock, bodies.length === 0 ? RECORDED_BODIES : 0));
      if (bodies.length === 0) bodies = engine[0].bodies;
      if (threads > 1) engineOne.push(await engineRun(mock.url, 1, mock));
      engineStreamed.push(await engineRun(mock.url, 1, mock, 0, true));
      bare.push(await bareRun(mock.url, bodies, mock));
      client.push(await clientLoop({ url: mock.url, concurrency, seconds, bodies, mock }));
      await pythonRound(mock.url, python);
    }
  } finally {
    await mock.close();
  }
  cpuShare.throughput = meter();
  meter = startCpuMeter();
  // A slow server for the pause figures: ~100 tokens/s per request, so generations are mid-way when paused.
  // Streamed replies send their new tokens every 20 ms (2 per event at this rate).
  const slow = await startMockProcess([
    '--latency-ms',
    '20',
    '--tokens-per-second',
    '100',
    '--think-tokens',
    '100',
    '--stream-interval-ms',
    '20',
  ]);
  const pauseFigures: PauseFigures[] = [];
  let abortFloor = { p50: NaN, p99: NaN };
  try {
    for (const [mode, stream] of [
      ['abort', false],
      ['abort', true],
      ['drain', false],
    ] as const) {
      pauseFigures.push(await pauseBench(slow.url, mode, stream, pauseRollouts, quick ? 3 : mode === 'abort' ? 20 : 8));
    }
    abortFloor = await bareAbortFloor(slow.url, pauseRollouts, quick ? 3 : 10);
  } finally {
    await slow.close();
  }
  cpuShare.pause = meter();
  meter = startCpuMeter();
  // Target 3 (and target 2's second ratio): 50 ms per call, 64 and 512 in flight; the Python loop at 512.
  const latency = await latencyBound({
    concurrencies: [64, 512],
    pythonConcurrency: 512,
    pythonModes: quick ? ['executor'] : ['executor', 'direct'],
    threads,
    seconds,
    repeats,
    groupSize,
    maxTokens,
    bodies,
  });
  cpuShare.latencyBound = meter();
  // What a call over the same latency costs with no engine and no mock: the ceiling under target 3.
  const floor = await callFloor(latency.latencyMs, quick ? 20 : 40);
  meter = startCpuMeter();
  // Target 6: an environment that costs CPU per step, one worker against two, same rollouts in flight.
  const scaling = await workerScaling({ cpuCostUs: envCpuUs, concurrency: 64, seconds, repeats, groupSize, maxTokens });
  cpuShare.workerScaling = meter();
  meter = startCpuMeter();
  // Issue 19: worker-node processes over NATS JetStream against local threads, on the same CPU-costly environment.
  // With a free-environment side: the capacity model's fit reaches the highest rate this machine gives.
  const scale = await scaleOut({ seconds, cpuCostUs: 4 * envCpuUs, groupsPerThread: 8, freeEnvSide: true });
  cpuShare.scaleOut = meter();
  meter = startCpuMeter();
  // Target 5: rollouts held in flight at turn 1 and at turn 3.
  const memory = await memoryRuns({ rollouts: memoryRollouts, thinkTokens: memoryThinkTokens, threads, groupSize });
  cpuShare.memory = meter();
  // Beside target 5: what long episodes' prompt ids cost with the whole conversation sent.
  const long = await longEpisodes({ groups: 8, maxTurns: 16, thinkTokens: 200 });
  meter = startCpuMeter();
  // Issue 21: the simulated training loop on GPU-like mocks, every strategy side by side.
  const training = await trainingBenches(trainingBenchDefaults(quick));
  cpuShare.trainingLoop = meter();
  // Issue 31.4: trajectory-aware scheduling against FIFO on a mock with priority scheduling.
  const priority = await priorityBench(priorityBenchDefaults(quick));
  // Issue 20: the CPU per tool call, tool-lookup beside arithmetic on one mock.
  const tools = await toolCallCost({ seconds, repeats });
  cpuShare.toolCalls = meter();
  meter = startCpuMeter();
  // Issue 31.5: a fleet of GPU-like servers — prefix-cache hit rate by routing, a server's death, a join.
  const fleet = await fleetBench(fleetBenchDefaults(quick));
  const failover = await fleetFailover();
  const joined = await fleetJoin(quick ? 1 : 3);
  cpuShare.fleet = meter();
  meter = startCpuMeter();
  // Issue 31.2: the agentic long-tail workloads through the training loop (one of them with --quick).
  const longTail = [];
  for (const w of quick ? LONG_TAIL_WORKLOADS.slice(0, 1) : LONG_TAIL_WORKLOADS)
    longTail.push(await longTailBench(w, quick));
  cpuShare.longTail = meter();
  const rate = (s: Sample) => s.operations / s.seconds;
  const cpuPer = (s: Sample) => (s.cpuMs * 1000) / s.operations; // µs per operation
  const bareRate = stats(bare.map(rate));
  const engineRate = stats(engine.map(rate));
  const bareCpu = stats(bare.map(cpuPer));
  const clientRate = stats(client.map(rate));
  const clientCpu = stats(client.map(cpuPer));
  const engineCpu = stats(engine.map(cpuPer));
  const engineOneRate = engineOne.length > 0 ? stats(engineOne.map(rate)) : null;
  const engineOneCpu = engineOne.length > 0 ? stats(engineOne.map(cpuPer)) : null;
  const streamedRate = stats(engineStreamed.map(rate));
  const streamedCpu = stats(engineStreamed.map(cpuPer));
  /** Median µs per step of each kind of thread: where the engine's CPU goes. */
  const split = (samples: ThroughputSample[]) => {
    const withSplit = samples.filter((s) => s.cpuSplit !== null);
    if (withSplit.length === 0) return null;
    const per = (f: (c: NonNullable<ThroughputSample['cpuSplit']>) => number) =>
      stats(withSplit.map((s) => (f(s.cpuSplit!) * 1000) / s.operations)).median;
    return { mainUs: per((c) => c.mainMs), workersUs: per((c) => c.workersMs), helpersUs: per((c) => c.helpersMs) };
  };
  const bodyStats = {
    count: bodies.length,
    meanBytes: bodies.reduce((n, b) => n + Buffer.byteLength(b), 0) / Math.max(1, bodies.length),
    meanMessages:
      bodies.reduce((n, b) => n + (JSON.parse(b) as { messages: unknown[] }).messages.length, 0) /
      Math.max(1, bodies.length),
  };
  const pythonFigures = (samples: PythonRuns['executor']) =>
    samples.length === 0
      ? null
      : { stepsPerSecond: stats(samples.map(rate)), cpuUsPerStep: stats(samples.map(cpuPer)), samples };
  const pyExecutor = pythonFigures(python.executor);
  const pyDirect = pythonFigures(python.direct);
  const result = {
    machine: {
      cpus: cpus().length,
      model: cpus()[0]?.model,
      node: process.version,
      platform: process.platform,
      cpuShare,
    },
    settings: {
      concurrency,
      seconds,
      repeats,
      threads,
      groupSize,
      latencyMs,
      maxTokens,
      pauseRollouts,
      memoryRollouts,
      memoryThinkTokens,
      envCpuUs,
    },
    bare: { requestsPerSecond: bareRate, cpuUsPerRequest: bareCpu, bodies: bodyStats, samples: bare },
    client: { callsPerSecond: clientRate, cpuUsPerCall: clientCpu, samples: client },
    engine: {
      threads,
      stepsPerSecond: engineRate,
      cpuUsPerStep: engineCpu,
      cpuSplitUsPerStep: split(engine),
      samples: engine.map(({ bodies: _, ...s }) => s),
    },
    engineOneWorkerStreamed: {
      threads: 1,
      stepsPerSecond: streamedRate,
      cpuUsPerStep: streamedCpu,
      cpuSplitUsPerStep: split(engineStreamed),
      samples: engineStreamed.map(({ bodies: _, ...s }) => s),
    },
    engineOneWorker:
      engineOneRate && engineOneCpu
        ? {
            threads: 1,
            stepsPerSecond: engineOneRate,
            cpuUsPerStep: engineOneCpu,
            cpuSplitUsPerStep: split(engineOne),
            samples: engineOne.map(({ bodies: _, ...s }) => s),
          }
        : null,
    python: { skipped: python.skipped, ...python.versions, executor: pyExecutor, direct: pyDirect },
    pause: pauseFigures,
    pauseBareAbortFloorMs: abortFloor,
    ratios: {
      engineCpuPerStepOverBareCpuPerRequest: engineCpu.median / bareCpu.median,
      engineOneWorkerCpuPerStepOverBareCpuPerRequest: engineOneCpu ? engineOneCpu.median / bareCpu.median : null,
      clientCpuPerCallOverBareCpuPerRequest: clientCpu.median / bareCpu.median,
      engineStepsPerSecondOverBareRequestsPerSecond: engineRate.median / bareRate.median,
      engineStepsPerSecondOverPythonExecutorStepsPerSecond: pyExecutor
        ? engineRate.median / pyExecutor.stepsPerSecond.median
        : null,
      engineStepsPerSecondOverPythonDirectStepsPerSecond: pyDirect
        ? engineRate.median / pyDirect.stepsPerSecond.median
        : null,
    },
    latencyBound: latency,
    latencyCallFloor: floor,
    workerScaling: scaling,
    scaleOut: scale,
    memory,
    longEpisodes: long,
    trainingLoop: training,
    priority,
    toolCalls: tools,
    fleet: { ...fleet, failover, join: joined },
    longTail,
    targets: [] as TargetRow[],
  };
  const fmt = (n: number, d = 0) => n.toFixed(d).padStart(10);
  const spread = (s: { min: number; max: number }, d = 0) => `${s.min.toFixed(d)}–${s.max.toFixed(d)}`;
  console.log(`\nrollout-engine bench — ${result.machine.cpus} × ${result.machine.model}, Node ${process.version}`);
  console.log(
    `concurrency ${concurrency} (engine: ${threads} workers × ${concurrency / groupSize} groups × ${groupSize}), ${seconds} s × ${repeats} repeats, mock latency ${latencyMs} ms, mock server in its own process\n`,
  );
  console.log(`${'side'.padEnd(28)}${'ops/s'.padStart(10)}${'CPU µs/op'.padStart(10)}   spread (ops/s; CPU µs/op)`);
  console.log(
    `${'bare undici loop (requests)'.padEnd(28)}${fmt(bareRate.median)}${fmt(bareCpu.median)}   ${spread(bareRate)}; ${spread(bareCpu)}`,
  );
  console.log(
    `${"engine's client, plain loop".padEnd(28)}${fmt(clientRate.median)}${fmt(clientCpu.median)}   ${spread(clientRate)}; ${spread(clientCpu)}   (src/llm/client.ts on the same requests: no agent loop, environment, thread hop or coordinator)`,
  );
  const workersLabel = (n: number) => `${n} worker${n > 1 ? 's' : ''}`;
  console.log(
    `${`engine, ${workersLabel(threads)} (steps)`.padEnd(28)}${fmt(engineRate.median)}${fmt(engineCpu.median)}   ${spread(engineRate)}; ${spread(engineCpu)}`,
  );
  if (engineOneRate && engineOneCpu)
    console.log(
      `${'engine, 1 worker (steps)'.padEnd(28)}${fmt(engineOneRate.median)}${fmt(engineOneCpu.median)}   ${spread(engineOneRate)}; ${spread(engineOneCpu)}`,
    );
  console.log(
    `${'engine, 1 worker, streamed'.padEnd(28)}${fmt(streamedRate.median)}${fmt(streamedCpu.median)}   ${spread(streamedRate)}; ${spread(streamedCpu)}   (llm.stream; the mock sends each reply as 4 events here)`,
  );
  if (python.skipped !== null) console.log(`python baseline skipped: ${python.skipped}`);
  for (const [label, f] of [
    ['python asyncio (executor)', pyExecutor],
    ['python asyncio (direct)', pyDirect],
  ] as const) {
    if (f)
      console.log(
        `${label.padEnd(28)}${fmt(f.stepsPerSecond.median)}${fmt(f.cpuUsPerStep.median)}   ${spread(f.stepsPerSecond)}; ${spread(f.cpuUsPerStep)}`,
      );
  }
  console.log(
    `the bare loop sends the ${bodyStats.count} chat bodies the engine sent, in turn (every turn of its episodes: ${bodyStats.meanMessages.toFixed(1)} messages, ${bodyStats.meanBytes.toFixed(0)} bytes on average)`,
  );
  for (const [label, sp] of [
    [workersLabel(threads), result.engine.cpuSplitUsPerStep],
    ['1 worker', result.engineOneWorker?.cpuSplitUsPerStep ?? null],
  ] as const) {
    if (sp)
      console.log(
        `engine CPU per step by thread, ${label}: main ${sp.mainUs.toFixed(0)} µs + workers ${sp.workersUs.toFixed(0)} µs + V8/libuv helper threads (GC, compiler) ${sp.helpersUs.toFixed(0)} µs`,
      );
  }
  const mockPerCall = (samples: { operations: number; mockCpuMs: number | null }[]) =>
    samples.length > 0 && samples.every((s) => s.mockCpuMs !== null)
      ? `${stats(samples.map((s) => (s.mockCpuMs! * 1000) / s.operations)).median.toFixed(0)} µs`
      : 'n/a';
  // The mock does the same work per call whoever calls: what its CPU per call does shows what sharing the cores costs every thread.
  console.log(
    `the mock's CPU per call (the same work each time): beside the bare loop ${mockPerCall(bare)}, the engine at 1 worker ${mockPerCall(threads > 1 ? engineOne : engine)}${threads > 1 ? `, at ${threads} workers ${mockPerCall(engine)}` : ''}`,
  );
  console.log(describeShare(cpuShare.throughput, cpus().length));
  console.log(
    `\nratio engine/bare: CPU per step ${result.ratios.engineCpuPerStepOverBareCpuPerRequest.toFixed(2)}×${result.ratios.engineOneWorkerCpuPerStepOverBareCpuPerRequest === null ? '' : ` (1 worker: ${result.ratios.engineOneWorkerCpuPerStepOverBareCpuPerRequest.toFixed(2)}×)`}, throughput ${result.ratios.engineStepsPerSecondOverBareRequestsPerSecond.toFixed(2)}×`,
  );
  if (pyExecutor) {
    const direct = result.ratios.engineStepsPerSecondOverPythonDirectStepsPerSecond;
    console.log(
      `ratio engine steps/s ÷ python executor steps/s: ${result.ratios.engineStepsPerSecondOverPythonExecutorStepsPerSecond!.toFixed(2)}×` +
        ` (÷ python direct: ${direct === null ? 'n/a' : `${direct.toFixed(2)}×`}; ${python.versions!.interpreter}, Python ${python.versions!.python}, aiohttp ${python.versions!.aiohttp})`,
    );
  }
  console.log(
    `\npause for a weight update, ${pauseRollouts} rollouts in flight (slow server: 100 tokens/s per request)`,
  );
  console.log(
    `${'mode'.padEnd(14)}${'pauses'.padStart(8)}${'in flight'.padStart(11)}${'stopped issuing p50/p99 ms'.padStart(30)}${'acked p50/p99 ms'.padStart(22)}${'all back p50/p99 ms'.padStart(24)}`,
  );
  const pair = (x: { p50: number; p99: number }, digits: number) =>
    `${x.p50.toFixed(digits)} / ${x.p99.toFixed(digits)}`;
  for (const f of pauseFigures) {
    console.log(
      `${pauseLabel(f).padEnd(14)}${String(f.pauses).padStart(8)}${String(f.rolloutsInFlight.median).padStart(11)}${pair(f.workersStoppedMs, 3).padStart(30)}${pair(f.workersAckedMs, 2).padStart(22)}${pair(f.allBackMs, 1).padStart(24)}`,
    );
  }
  console.log(
    'stopped issuing: request → the last call any worker sent (0 = none after it); acked: every worker loop ran its pause watcher',
  );
  console.log(
    'abort, streamed: llm.stream — each call in flight comes back with the tokens it holds, without waiting for the aborted replies',
  );
  console.log(
    `floor: a bare undici client with ${pauseRollouts} calls in flight reads the ${pauseRollouts} aborted replies ${abortFloor.p50.toFixed(1)} / ${abortFloor.p99.toFixed(1)} ms (p50 / p99) after the abort request — no engine`,
  );

  console.log(describeShare(cpuShare.pause, cpus().length));
  const lat = (c: number) => latency.points.find((p) => p.concurrency === c)!;
  console.log(
    `\nlatency-bound efficiency: mock ${latency.latencyMs} ms fixed per call, 0 ms per token; ${threads} workers; ${seconds} s × ${repeats} repeats`,
  );
  console.log(
    `${'in flight'.padEnd(10)}${'bound/s'.padStart(9)}${'steps/s'.padStart(9)}${'% bound'.padStart(9)}${'spread %'.padStart(13)}${'group occ.'.padStart(12)}${'call ms'.padStart(9)}${'loop ms'.padStart(9)}${'bare loop %'.padStart(13)}   cores engine + mock`,
  );
  for (const p of latency.points) {
    console.log(
      `${String(p.concurrency).padEnd(10)}${fmt(p.boundStepsPerSecond).slice(1)}${fmt(p.stepsPerSecond.median).slice(1)}${p.efficiencyPct.median.toFixed(1).padStart(9)}${spread(p.efficiencyPct, 1).padStart(13)}` +
        `${`${p.groupOccupancyPct.toFixed(1)} %`.padStart(12)}${p.meanInferenceMs.toFixed(1).padStart(9)}${p.workerLoopDelayMeanMs.toFixed(1).padStart(9)}${p.bare.efficiencyPct.median.toFixed(1).padStart(13)}   ${p.engineCores.toFixed(2)} + ${p.mockCores === null ? 'n/a' : p.mockCores.toFixed(2)}`,
    );
  }
  console.log(
    `  (in flight: episodes playing — workers.rolloutsPerWorker = in flight ÷ workers, each worker holding ${1 + LATENCY_GROUP_SLACK}× as many groups' rollouts, so a rollout that`,
  );
  console.log(
    '   ended before its siblings hands its slot on; group occ.: Σ turns ÷ Σ (group size × longest rollout), what calls in flight would sag to without episode slots;',
  );
  console.log(
    "   call ms: engine-side time per call; loop ms: workers' mean event-loop delay beyond its 10 ms sampling;",
  );
  console.log(
    '   bare loop %: the bare undici loop, same mock and calls in flight, as % of the same bound — what mock and transport allow)',
  );
  console.log(describeCallFloor(floor));
  if (latency.python.skipped !== null)
    console.log(`python baseline at ${latency.python.concurrency} in flight skipped: ${latency.python.skipped}`);
  for (const r of latency.python.runs) {
    console.log(
      `python asyncio (${r.mode}) at ${latency.python.concurrency} in flight: ${r.stepsPerSecond.median.toFixed(0)} steps/s (${spread(r.stepsPerSecond)}) → engine ÷ python ${(lat(latency.python.concurrency).stepsPerSecond.median / r.stepsPerSecond.median).toFixed(2)}×`,
    );
  }

  console.log(describeShare(cpuShare.latencyBound, cpus().length));
  console.log(
    `\nworker scaling: guess-number burning ${scaling.cpuCostUs} µs CPU per step, ${scaling.concurrency} in flight, 0 ms latency; ${seconds} s × ${repeats} repeats`,
  );
  for (const side of [scaling.one, scaling.two]) {
    console.log(
      `${workersLabel(side.threads).padEnd(10)}${fmt(side.stepsPerSecond.median)} steps/s (${spread(side.stepsPerSecond)})   cores busy: engine ${side.engineCores.toFixed(2)} + mock ${side.mockCores === null ? 'n/a' : side.mockCores.toFixed(2)} of ${cpus().length}`,
    );
  }
  console.log(
    `ratio 2 workers ÷ 1 worker: ${scaling.ratio.toFixed(2)}×` +
      (scaling.ceiling === null
        ? ''
        : `; ${scaling.cores} cores allow at most ${scaling.ceiling.toFixed(2)}× at the 1-worker cost per step (${scaling.one.machineCpuUsPerStep!.toFixed(0)} µs of engine + mock CPU; ${scaling.two.machineCpuUsPerStep!.toFixed(0)} µs at 2 workers)`),
  );
  if (scaling.one.workerCpuUsPerStep !== null && scaling.two.workerCpuUsPerStep !== null) {
    console.log(
      `worker-thread CPU per step: ${scaling.one.workerCpuUsPerStep.toFixed(0)} µs with 1 worker, ${scaling.two.workerCpuUsPerStep.toFixed(0)} µs with 2 (equal: each worker does the same work per step, nothing in the engine holds the other back)`,
    );
  }
  console.log(describeShare(cpuShare.workerScaling, cpus().length));

  const kb = (b: number) => `${(b / 1024).toFixed(1)} KiB`;
  console.log(
    `\nmemory per in-flight rollout: ${memory.rollouts} rollouts held in flight by the stall proxy (mock answers ${memory.thinkTokens} filler tokens + the guess)`,
  );
  console.log(
    `${'held at'.padEnd(9)}${'in flight'.padStart(10)}${'calls held'.padStart(11)}${'payload'.padStart(11)}${'heap'.padStart(11)}${'+ ArrayBuf'.padStart(11)}${'RSS'.padStart(11)}   ratio to payload: heap / heap + ArrayBuffers / RSS`,
  );
  for (const m of memory.phases) {
    console.log(
      `${`turn ${m.holdAtTurn}`.padEnd(9)}${String(m.rolloutsInFlight).padStart(10)}${String(m.callsHeld).padStart(11)}${kb(m.payloadHeld.totalBytes).padStart(11)}${kb(m.perRollout.heapBytes).padStart(11)}${kb(m.perRollout.heapPlusArrayBuffersBytes).padStart(11)}${kb(m.perRollout.rssBytes).padStart(11)}` +
        `   ${m.ratio.heap.toFixed(2)}× / ${m.ratio.heapPlusArrayBuffers.toFixed(2)}× / ${m.ratio.rss.toFixed(2)}×${m.notes.length ? `  (${m.notes.join('; ')})` : ''}`,
    );
  }
  const t3 = memory.phases.find((m) => m.holdAtTurn === 3)!;
  const t1 = memory.phases.find((m) => m.holdAtTurn === 1)!;
  const pb = t3.payloadHeld;
  console.log(
    `  payload at turn 3 (per rollout, ${pb.turns.toFixed(2)} turns): prompt ids ${kb(pb.promptIdsBytes)}, response ids ${kb(pb.responseIdsBytes)}, logprobs ${kb(pb.logprobsBytes)}, text ${kb(pb.textBytes)} (UTF-16)`,
  );
  if (memory.fixedBytesPerRollout !== null && memory.bytesPerPayloadByte !== null) {
    console.log(
      `  fit over the two (heap + ArrayBuffers): ≈ ${kb(memory.fixedBytesPerRollout)} per rollout in flight whatever it holds + ${memory.bytesPerPayloadByte.toFixed(2)} bytes per payload byte`,
    );
  }
  const mainShare = (m: (typeof memory.phases)[number]) => {
    const l = m.loaded[Math.floor(m.loaded.length / 2)];
    return (
      (l.mainHeapBytes + l.mainArrayBufferBytes - m.baseline.mainHeapBytes - m.baseline.mainArrayBufferBytes) /
      Math.max(1, m.rolloutsInFlight)
    );
  };
  console.log(
    `  main thread's share per rollout: ${kb(mainShare(t1))} at turn 1, ${kb(mainShare(t3))} at turn 3 (the rest is in the workers)`,
  );
  const ref = memory.bareRequest;
  console.log(
    `  reference — ${ref.requests} bare undici calls pending (one connection each, first-turn body): ${kb(ref.heapBytes + ref.arrayBufferBytes)} per call (heap ${kb(ref.heapBytes)} + ArrayBuffers ${kb(ref.arrayBufferBytes)})`,
  );

  console.log(
    `\nlong episodes, whole conversation sent (messageCut 0): ${long.groups} groups of guess-number, ${long.turnsPerRollout.toFixed(1)} turns per rollout, 200 filler tokens per answer\n` +
      `  prompt ids per rollout: ${kb(long.promptIdsSentBytes)} as the server sent them (Σ over turns), ${kb(long.promptIdsHeldBytes)} held (each prompt a view into the next: ${(long.promptIdsSentBytes / long.promptIdsHeldBytes).toFixed(1)}× less); a group result between threads ${kb(long.wireBytesPerGroup)}\n` +
      `  the batch to the trainer (control API, msgpack) per rollout: ${kb(long.batchBytesFull)} in full, ${kb(long.batchBytesCompact)} compact ({"compact": true}: turns name the later turn whose conversation they begin)`,
  );

  const ratioText = (r: number | null) => (r === null ? 'not run' : `${r.toFixed(2)}×`);
  console.log(describeShare(cpuShare.memory, cpus().length));
  const splitNote = (sp: { mainUs: number; workersUs: number; helpersUs: number } | null) =>
    sp
      ? ` (main ${sp.mainUs.toFixed(0)} + workers ${sp.workersUs.toFixed(0)} + helpers ${sp.helpersUs.toFixed(0)})`
      : '';
  // What bounds the CPU ratio from below: the engine's own client, alone, against the bare loop.
  const clientNote = `; the engine's client alone ${clientCpu.median.toFixed(0)} µs (${(clientCpu.median / bareCpu.median).toFixed(2)}×: the floor any engine step pays here)`;
  const settingsNote = (c: number, l: number) =>
    concurrency === c && latencyMs === l ? '' : ` (issue 7 states it at ${c} in flight, ${l} ms)`;
  const abort = pauseFigures.find((f) => f.mode === 'abort' && !f.stream)!;
  const held = pauseFigures.find((f) => f.mode === 'abort' && f.stream)!;
  const pyLat = latency.python.runs.find((r) => r.mode === 'executor');
  result.targets = [
    row({
      target: `1 · ${concurrency} in flight, ${latencyMs} ms, ${workersLabel(threads)}`,
      figure: 'engine CPU per step ÷ bare loop CPU per request',
      value: result.ratios.engineCpuPerStepOverBareCpuPerRequest,
      limit: 1.3,
      kind: 'max',
      unit: '×',
      detail: `${engineCpu.median.toFixed(0)} vs ${bareCpu.median.toFixed(0)} µs${splitNote(result.engine.cpuSplitUsPerStep)}${clientNote}${settingsNote(64, 0)}`,
    }),
    ...(engineOneCpu
      ? [
          row({
            target: `1 · ${concurrency} in flight, ${latencyMs} ms, 1 worker`,
            figure: 'engine CPU per step ÷ bare loop CPU per request',
            value: result.ratios.engineOneWorkerCpuPerStepOverBareCpuPerRequest,
            limit: 1.3,
            kind: 'max',
            unit: '×',
            detail: `${engineOneCpu.median.toFixed(0)} vs ${bareCpu.median.toFixed(0)} µs${splitNote(result.engineOneWorker?.cpuSplitUsPerStep ?? null)}${clientNote}${settingsNote(64, 0)}`,
          }),
        ]
      : []),
    row({
      target: `2 · ${concurrency} in flight, ${latencyMs} ms`,
      figure: 'engine ÷ Python loop (executor) steps/s',
      value: result.ratios.engineStepsPerSecondOverPythonExecutorStepsPerSecond,
      limit: 7,
      kind: 'min',
      unit: '×',
      detail: pyExecutor
        ? `${engineRate.median.toFixed(0)} vs ${pyExecutor.stepsPerSecond.median.toFixed(0)}/s${engineOneRate ? ` (1 worker: ${(engineOneRate.median / pyExecutor.stepsPerSecond.median).toFixed(2)}×)` : ''}; ÷ direct ${ratioText(result.ratios.engineStepsPerSecondOverPythonDirectStepsPerSecond)}; bare loop ÷ Python ${(bareRate.median / pyExecutor.stepsPerSecond.median).toFixed(2)}× (the mock's ceiling here)${settingsNote(64, 0)}`
        : `python skipped: ${python.skipped}`,
    }),
    row({
      target: `2 · ${latency.python.concurrency} in flight, ${latency.latencyMs} ms`,
      figure: 'engine ÷ Python loop (executor) steps/s',
      value: latency.engineOverPythonExecutor,
      limit: 4,
      kind: 'min',
      unit: '×',
      detail: pyLat
        ? `${lat(latency.python.concurrency).stepsPerSecond.median.toFixed(0)} vs ${pyLat.stepsPerSecond.median.toFixed(0)}/s; ÷ direct ${ratioText(latency.engineOverPythonDirect)}; at most ${(lat(latency.python.concurrency).boundStepsPerSecond / pyLat.stepsPerSecond.median).toFixed(2)}× (in flight ÷ latency ÷ Python)`
        : `python skipped: ${latency.python.skipped}`,
    }),
    ...latency.points.map((p) =>
      row({
        target: `3 · ${p.concurrency} in flight, ${latency.latencyMs} ms`,
        figure: 'steps/s ÷ (in flight ÷ latency)',
        value: p.efficiencyPct.median,
        limit: p.concurrency <= 64 ? 97 : 90,
        kind: 'min',
        unit: ' %',
        digits: 1,
        detail: `${p.stepsPerSecond.median.toFixed(0)} of ${p.boundStepsPerSecond.toFixed(0)}/s; group occupancy ${p.groupOccupancyPct.toFixed(1)} %, ${p.meanInferenceMs.toFixed(1)} ms per call; bare loop ${p.bare.efficiencyPct.median.toFixed(1)} %; one call alone, no engine or mock: ${floor.boundPct.toFixed(1)} %`,
      }),
    ),
    row({
      target: `4 · ${pauseRollouts} in flight, abort`,
      figure: 'pause: every worker stopped issuing, p99',
      value: abort.workersStoppedMs.p99,
      limit: 2,
      kind: 'max',
      unit: ' ms',
      detail: `p50 ${abort.workersStoppedMs.p50.toFixed(3)} ms over ${abort.pauses} pauses (last-send clock); every worker acked p99 ${abort.workersAckedMs.p99.toFixed(1)} ms`,
    }),
    row({
      target: `4 · ${pauseRollouts} in flight, abort`,
      figure: 'pause: every partial rollout back, p99',
      value: abort.allBackMs.p99,
      limit: 10,
      kind: 'max',
      unit: ' ms',
      detail: `p50 ${abort.allBackMs.p50.toFixed(1)} ms over ${abort.pauses} pauses, server-side abort; a bare client reading the same aborted replies: ${abortFloor.p50.toFixed(1)} / ${abortFloor.p99.toFixed(1)} ms`,
    }),
    row({
      target: `4 · ${pauseRollouts} in flight, abort, streamed`,
      figure: 'pause: every partial rollout back, p99',
      value: held.allBackMs.p99,
      limit: 10,
      kind: 'max',
      unit: ' ms',
      detail: `p50 ${held.allBackMs.p50.toFixed(1)} ms over ${held.pauses} pauses; llm.stream: calls held with their tokens, server-side abort too; stopped issuing p99 ${held.workersStoppedMs.p99.toFixed(3)} ms`,
    }),
    ...[t3, t1].map((m) =>
      row({
        target: `5 · ${m.rolloutsInFlight} in flight, turn ${m.holdAtTurn}`,
        figure: 'memory per rollout ÷ raw payload held',
        value: m.ratio.heapPlusArrayBuffers,
        limit: 1.2,
        kind: 'max',
        unit: '×',
        detail: `${kb(m.perRollout.heapPlusArrayBuffersBytes)} vs ${kb(m.payloadHeld.totalBytes)}; V8 heap alone ${m.ratio.heap.toFixed(2)}×; without the pending HTTP call's own ${kb(ref.heapBytes + ref.arrayBufferBytes)} ${((m.perRollout.heapPlusArrayBuffersBytes - ref.heapBytes - ref.arrayBufferBytes) / m.payloadHeld.totalBytes).toFixed(2)}×${memory.rollouts < 10_000 ? ' (issue 7: 10k)' : ''}`,
      }),
    ),
    row({
      target: `6 · ${scaling.cpuCostUs} µs/step, ${scaling.concurrency} in flight`,
      figure: '2 workers ÷ 1 worker steps/s',
      value: scaling.ratio,
      limit: 1.7,
      kind: 'min',
      unit: '×',
      detail: `${scaling.two.stepsPerSecond.median.toFixed(0)} vs ${scaling.one.stepsPerSecond.median.toFixed(0)}/s; 2 workers: engine ${scaling.two.engineCores.toFixed(2)} + mock ${scaling.two.mockCores?.toFixed(2) ?? 'n/a'} cores of ${cpus().length}${scaling.ceiling === null ? '' : `; at most ${scaling.ceiling.toFixed(2)}× on ${scaling.cores} cores at the 1-worker cost per step`}`,
    }),
  ];
  for (const run of training) printTrainingBench(run);
  console.log(describeShare(cpuShare.trainingLoop, cpus().length));
  result.targets.push(...training.flatMap((run, i) => trainingTargets(run, i > 0)));
  printPriorityBench(priority);
  result.targets.push(...priorityTargets(priority));
  console.log(`\n${describeToolCallCost(tools)}`);
  console.log(describeShare(cpuShare.toolCalls, cpus().length));
  printFleetBench(fleet);
  printFleetEvents(failover, joined);
  console.log(describeShare(cpuShare.fleet, cpus().length));
  result.targets.push(...fleetTargets(fleet), ...fleetEventTargets(failover, joined));
  console.log('\nagentic long-tail workloads (issue 31.2):');
  for (const r of longTail) printTrainingBench(r);
  for (const r of longTail) printLongTailSummary(r);
  console.log(describeShare(cpuShare.longTail, cpus().length));
  result.targets.push(...longTail.flatMap((r) => [...longTailRows(r), ...longTailTargets(r)]));
  printScaleOut(scale);
  const capacity = scale.capacity;
  result.targets.push(
    figureRow({
      target: '31.6 · one coordinator, worker nodes over NATS',
      figure: 'turns/s it sustains (model)',
      value: capacity?.turnsPerSecond ?? null,
      unit: '/s',
      detail:
        capacity === null
          ? `not measured${scale.skipped === null ? '' : `: ${scale.skipped}`}`
          : `${describeCapacity(capacity)}; for groups of ${capacity.turnsPerGroup.toFixed(0)} turns (the CPU per group grows with the turns and messages it carries)`,
    }),
  );
  printTargets(result.targets);
  // Memory is not a matter of CPU time; every other part is.
  const shared = Object.entries(cpuShare).filter(
    ([part, c]) => part !== 'memory' && c !== null && c.othersCores > 0.15 * cpus().length,
  );
  if (shared.length > 0) {
    console.log(
      `other processes shared the CPUs during: ${shared.map(([part, c]) => `${part} (${c!.othersCores.toFixed(2)} cores)`).join(', ')} — rates there are low and ratios skewed either way; rerun on a quiet machine`,
    );
  }

  const outDir = values.out ?? 'bench-results';
  mkdirSync(outDir, { recursive: true });
  const file = join(outDir, `bench-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  console.log(`result written to ${file}`);
}

await main();

/**
 * `npm run bench` — the engine beside a bare undici request loop, against the same mock inference
 * server (in its own process), at the same concurrency, in one run.
 *
 * Figures: engine steps/s and CPU per step (all threads of this process: coordinator + workers), the
 * bare loop's requests/s and CPU per request, and their ratios. CPU is process.cpuUsage() (user +
 * system, every thread); the mock server's CPU is not counted on either side.
 *
 *   npm run bench                      # default: 3 repeats × 5 s per side
 *   npm run bench -- --quick           # smoke: 1 repeat × 1.5 s
 *   npm run bench -- --concurrency 256 --seconds 8 --repeats 5
 *
 * Then pause figures: with `--pause-rollouts` (512) rollouts in flight against a slow server, the time
 * until every worker has stopped issuing inference calls (the engine's own share) and until every
 * group is back on the main thread, p50 / p99, in abort and drain modes.
 *
 * Also the Python baseline (test/bench/python_baseline.py, via python-baseline.ts): an asyncio loop
 * built like the reference Interactor, environment through an executor and called directly, against
 * the same mock process at the same concurrency; skipped with a line saying why without aiohttp.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Pool } from 'undici';
import { createEngine } from '../../src/index.ts';
import { startMockProcess } from '../../src/loadtest/mock-process.ts';
import { percentile } from '../../src/loadtest/stats.ts';
import { runPythonBaseline } from './python-baseline.ts';

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

interface Sample {
  operations: number;
  seconds: number;
  cpuMs: number;
}

/** What one engine step sends: a guess-number turn, built like the agent loop builds it. */
function chatBody(): string {
  return JSON.stringify({
    model: 'mock-policy',
    messages: [
      { role: 'system', content: 'You are playing a number guessing game. Reply with a single integer.' },
      { role: 'user', content: "I'm thinking of an integer between 1 and 100. What is your guess?" },
    ],
    max_tokens: maxTokens,
    temperature: 1,
    logprobs: true,
    return_token_ids: true,
  });
}

async function bareLoop(url: string): Promise<Sample> {
  const origin = new URL(url).origin;
  const pool = new Pool(origin, { connections: concurrency, headersTimeout: 60_000, bodyTimeout: 60_000 });
  const body = chatBody();
  let operations = 0;
  let stop = false;
  const worker = async () => {
    while (!stop) {
      const res = await pool.request({ method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body });
      const reply = JSON.parse(await res.body.text()) as { choices: { message: { content: string } }[] };
      if (typeof reply.choices[0].message.content !== 'string') throw new Error('bad reply');
      operations++;
    }
  };
  // warm-up: open the connections
  stop = false;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const timer = setTimeout(() => (stop = true), seconds * 1000);
  await Promise.all(Array.from({ length: concurrency }, worker));
  clearTimeout(timer);
  const elapsed = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  await pool.close();
  return { operations, seconds: elapsed, cpuMs: (cpu.user + cpu.system) / 1000 };
}

async function engineRun(url: string): Promise<Sample> {
  const groupsInFlight = Math.max(1, Math.round(concurrency / groupSize));
  const engine = createEngine({
    logLevel: 'warn',
    llm: { url, connections: Math.ceil(concurrency / threads) + 8 },
    batchSize: groupsInFlight,
    // Exactly `concurrency` rollouts run at once (the pool's capacity); async production with
    // over-sampling keeps that capacity full between batches, as a steady loop does.
    workers: { threads, groupsPerWorker: Math.ceil(groupsInFlight / threads) },
    producer: { strategy: 'async', maxStaleness: 1_000_000, overSampleThreshold: 1 },
    tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize, maxSteps: 8, maxTokens }],
  });
  await engine.start();
  await engine.getBatch(); // warm-up: workers loaded, connections open
  const before = await engine.stats();
  const steps0 = before.workers.reduce((n, w) => n + w.steps, 0);
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  let turns = 0;
  while (performance.now() - t0 < seconds * 1000) {
    const batch = await engine.getBatch();
    turns += batch.stats?.turns ?? 0;
  }
  const elapsed = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const after = await engine.stats();
  const steps = after.workers.reduce((n, w) => n + w.steps, 0) - steps0;
  await engine.close();
  // Inference calls (turns) are the unit the bare loop also counts; env steps can be one fewer per
  // episode (a `length` finish ends it without a step). Count turns from the workers' step counter
  // when it is larger (it includes groups still in the buffer).
  const operations = Math.max(turns, steps);
  return { operations, seconds: elapsed, cpuMs: (cpu.user + cpu.system) / 1000 };
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
    runs[mode].push({ operations: r.steps, seconds: r.seconds, cpuMs: r.cpuSeconds * 1000, episodes: r.episodes, meanReward: r.meanReward });
  }
}

function stats(xs: number[]): { median: number; min: number; max: number } {
  const s = [...xs].sort((a, b) => a - b);
  return { median: s[Math.floor(s.length / 2)], min: s[0], max: s[s.length - 1] };
}

interface PauseFigures {
  mode: 'abort' | 'drain';
  pauses: number;
  rolloutsInFlight: { min: number; median: number };
  workersStoppedMs: { p50: number; p99: number };
  allBackMs: { p50: number; p99: number };
}

/**
 * Pauses with `pauseRollouts` rollouts in flight against a slow server (generations take ~1 s), in
 * one mode: the engine's own share (request → every worker acknowledged, i.e. stopped issuing) and
 * the time until every group is back on the main thread.
 */
async function pauseBench(url: string, mode: 'abort' | 'drain', pauseRollouts: number, pauses: number): Promise<PauseFigures> {
  const groups = Math.ceil(pauseRollouts / groupSize);
  const engine = createEngine({
    logLevel: 'warn',
    llm: { url, connections: Math.ceil(pauseRollouts / threads) + 8, abortPath: '/admin/abort' },
    batchSize: groups,
    workers: { threads, groupsPerWorker: Math.ceil(groups / threads) },
    tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize, maxSteps: 8, maxTokens: 400 }],
    producer: { strategy: 'async', partialRollout: true, maxStaleness: 1_000_000 },
    pause: { mode, timeoutMs: 30_000 },
  });
  await engine.start();
  const stopped: number[] = [];
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
      back.push(report.allBackMs);
      await engine.resume({ modelStep: 0 }); // the mock keeps its weights: no new version to report
    }
  } finally {
    await engine.close();
  }
  return {
    mode,
    pauses,
    rolloutsInFlight: { min: Math.min(...inFlight), median: stats(inFlight).median },
    workersStoppedMs: { p50: percentile(stopped, 50), p99: percentile(stopped, 99) },
    allBackMs: { p50: percentile(back, 50), p99: percentile(back, 99) },
  };
}

async function main(): Promise<void> {
  const mock = await startMockProcess(['--latency-ms', String(latencyMs)]);
  const bare: Sample[] = [];
  const engine: Sample[] = [];
  const python: PythonRuns = { executor: [], direct: [], skipped: null, versions: null };
  try {
    for (let i = 0; i < repeats; i++) {
      bare.push(await bareLoop(mock.url));
      engine.push(await engineRun(mock.url));
      await pythonRound(mock.url, python);
    }
  } finally {
    await mock.close();
  }
  // A slow server for the pause figures: ~100 tokens/s per request, so generations are mid-way when paused.
  const slow = await startMockProcess(['--latency-ms', '20', '--tokens-per-second', '100', '--think-tokens', '100']);
  const pauseFigures: PauseFigures[] = [];
  try {
    for (const mode of ['abort', 'drain'] as const) pauseFigures.push(await pauseBench(slow.url, mode, pauseRollouts, quick ? 3 : mode === 'abort' ? 20 : 8));
  } finally {
    await slow.close();
  }
  const rate = (s: Sample) => s.operations / s.seconds;
  const cpuPer = (s: Sample) => (s.cpuMs * 1000) / s.operations; // µs per operation
  const bareRate = stats(bare.map(rate));
  const engineRate = stats(engine.map(rate));
  const bareCpu = stats(bare.map(cpuPer));
  const engineCpu = stats(engine.map(cpuPer));
  const pythonFigures = (samples: PythonRuns['executor']) =>
    samples.length === 0 ? null : { stepsPerSecond: stats(samples.map(rate)), cpuUsPerStep: stats(samples.map(cpuPer)), samples };
  const pyExecutor = pythonFigures(python.executor);
  const pyDirect = pythonFigures(python.direct);
  const result = {
    machine: { cpus: cpus().length, model: cpus()[0]?.model, node: process.version, platform: process.platform },
    settings: { concurrency, seconds, repeats, threads, groupSize, latencyMs, maxTokens },
    bare: { requestsPerSecond: bareRate, cpuUsPerRequest: bareCpu, samples: bare },
    engine: { stepsPerSecond: engineRate, cpuUsPerStep: engineCpu, samples: engine },
    python: { skipped: python.skipped, ...python.versions, executor: pyExecutor, direct: pyDirect },
    pause: pauseFigures,
    ratios: {
      engineCpuPerStepOverBareCpuPerRequest: engineCpu.median / bareCpu.median,
      engineStepsPerSecondOverBareRequestsPerSecond: engineRate.median / bareRate.median,
      engineStepsPerSecondOverPythonExecutorStepsPerSecond: pyExecutor ? engineRate.median / pyExecutor.stepsPerSecond.median : null,
      engineStepsPerSecondOverPythonDirectStepsPerSecond: pyDirect ? engineRate.median / pyDirect.stepsPerSecond.median : null,
    },
  };
  const fmt = (n: number, d = 0) => n.toFixed(d).padStart(10);
  const spread = (s: { min: number; max: number }, d = 0) => `${s.min.toFixed(d)}–${s.max.toFixed(d)}`;
  console.log(`\nrollout-engine bench — ${result.machine.cpus} × ${result.machine.model}, Node ${process.version}`);
  console.log(`concurrency ${concurrency} (engine: ${threads} workers × ${concurrency / groupSize} groups × ${groupSize}), ${seconds} s × ${repeats} repeats, mock latency ${latencyMs} ms, mock server in its own process\n`);
  console.log(`${'side'.padEnd(28)}${'ops/s'.padStart(10)}${'CPU µs/op'.padStart(10)}   spread (ops/s; CPU µs/op)`);
  console.log(`${'bare undici loop (requests)'.padEnd(28)}${fmt(bareRate.median)}${fmt(bareCpu.median)}   ${spread(bareRate)}; ${spread(bareCpu)}`);
  console.log(`${'engine (agent steps)'.padEnd(28)}${fmt(engineRate.median)}${fmt(engineCpu.median)}   ${spread(engineRate)}; ${spread(engineCpu)}`);
  if (python.skipped !== null) console.log(`python baseline skipped: ${python.skipped}`);
  for (const [label, f] of [['python asyncio (executor)', pyExecutor], ['python asyncio (direct)', pyDirect]] as const) {
    if (f) console.log(`${label.padEnd(28)}${fmt(f.stepsPerSecond.median)}${fmt(f.cpuUsPerStep.median)}   ${spread(f.stepsPerSecond)}; ${spread(f.cpuUsPerStep)}`);
  }
  console.log(`\nratio engine/bare: CPU per step ${result.ratios.engineCpuPerStepOverBareCpuPerRequest.toFixed(2)}×, throughput ${result.ratios.engineStepsPerSecondOverBareRequestsPerSecond.toFixed(2)}×`);
  if (pyExecutor) {
    const direct = result.ratios.engineStepsPerSecondOverPythonDirectStepsPerSecond;
    console.log(
      `ratio engine steps/s ÷ python executor steps/s: ${result.ratios.engineStepsPerSecondOverPythonExecutorStepsPerSecond!.toFixed(2)}×` +
        ` (÷ python direct: ${direct === null ? 'n/a' : `${direct.toFixed(2)}×`}; ${python.versions!.interpreter}, Python ${python.versions!.python}, aiohttp ${python.versions!.aiohttp})`,
    );
  }
  console.log(`\npause for a weight update, ${pauseRollouts} rollouts in flight (slow server: 100 tokens/s per request)`);
  console.log(`${'mode'.padEnd(8)}${'pauses'.padStart(8)}${'in flight'.padStart(11)}${'workers stopped p50/p99 ms'.padStart(30)}${'all back p50/p99 ms'.padStart(24)}`);
  for (const f of pauseFigures) {
    console.log(
      `${f.mode.padEnd(8)}${String(f.pauses).padStart(8)}${String(f.rolloutsInFlight.median).padStart(11)}${`${f.workersStoppedMs.p50.toFixed(2)} / ${f.workersStoppedMs.p99.toFixed(2)}`.padStart(30)}${`${f.allBackMs.p50.toFixed(1)} / ${f.allBackMs.p99.toFixed(1)}`.padStart(24)}`,
    );
  }
  const outDir = values.out ?? 'bench-results';
  mkdirSync(outDir, { recursive: true });
  const file = join(outDir, `bench-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  console.log(`result written to ${file}`);
}

await main();

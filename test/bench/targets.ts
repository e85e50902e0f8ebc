/**
 * The figures of issue 7 that the side-by-side throughput and pause runs of ./run.ts do not give, and
 * the final table of every target with its figure and a pass/fail mark.
 *
 *   latencyBound   target 3 (and 2's second ratio): mock at 50 ms fixed latency, 0 ms per token;
 *                  engine steps/s at 64 and 512 episodes playing (episode slots, see LATENCY_GROUP_SLACK)
 *                  ÷ (in flight ÷ 0.050 s); the Python loop
 *                  at 512 in flight against the same mock; as a control, the bare undici loop at the
 *                  same calls in flight (what the mock and the transport allow without the engine).
 *   workerScaling  target 6: builtin:guess-number burning `cpuCostUs` per step, zero latency, the same
 *                  rollouts in flight with workers.threads = 1 and 2.
 *   memory         target 5: ./memory.ts, rollouts held at turn 1 and at turn 3, and as a reference
 *                  the same number of bare undici calls pending (the transport's own share).
 */
import { availableParallelism } from 'node:os';
import { startMockProcess, type MockProcess } from '../../src/loadtest/mock-process.ts';
import { bareLoop, engineThroughput, type Sample, type ThroughputSample } from './engine-throughput.ts';
import { bareRequestMemory, memoryBench, type BareRequestMemory, type MemoryFigures } from './memory.ts';
import { runPythonBaseline, type PythonBaselineMode } from './python-baseline.ts';
import type { TrainingBenchResult } from './training-loop.ts';

export interface Spread {
  median: number;
  min: number;
  max: number;
}

export function spreadOf(xs: number[]): Spread {
  const s = [...xs].sort((a, b) => a - b);
  return { median: s[Math.floor(s.length / 2)], min: s[0], max: s[s.length - 1] };
}

const rate = (s: { operations: number; seconds: number }) => s.operations / s.seconds;

// --- target 3 (+ 2b) ---------------------------------------------------------------------------

export const LATENCY_MS = 50;
/**
 * Latency-bound runs use episode slots (workers.rolloutsPerWorker = in flight ÷ workers) with half as
 * many groups again per worker: "in flight" is then episodes playing, as a team bound by inference
 * latency would configure it. Without slots, rollouts that ended wait for their group's longest one
 * (group occupancy) and calls in flight sag to ≈ 87 % of the bound.
 */
export const LATENCY_GROUP_SLACK = 0.5;

export interface LatencyPoint {
  concurrency: number;
  /** in flight ÷ latency: the most calls per second that many rollouts can make. */
  boundStepsPerSecond: number;
  stepsPerSecond: Spread;
  /** steps/s ÷ bound, %. */
  efficiencyPct: Spread;
  /** Medians over repeats of the diagnostic figures (see ThroughputSample.detail). */
  groupOccupancyPct: number;
  meanInferenceMs: number;
  workerLoopDelayMeanMs: number;
  engineCores: number;
  mockCores: number | null;
  samples: ThroughputSample[];
  /**
   * Control: the bare undici loop (same mock, same number of calls in flight, every one busy all the
   * time) as % of the same bound — what the mock and the transport allow without the engine.
   */
  bare: { efficiencyPct: Spread; samples: Sample[] };
}

export interface PythonAtLatency {
  mode: PythonBaselineMode;
  stepsPerSecond: Spread;
  samples: { steps: number; seconds: number; cpuSeconds: number }[];
}

export interface LatencyBound {
  latencyMs: number;
  threads: number;
  points: LatencyPoint[];
  python: { concurrency: number; skipped: string | null; runs: PythonAtLatency[] };
  /** Engine steps/s at the Python point's concurrency ÷ Python executor steps/s (medians). */
  engineOverPythonExecutor: number | null;
  engineOverPythonDirect: number | null;
}

export interface LatencyOptions {
  concurrencies: number[];
  pythonConcurrency: number;
  pythonModes: PythonBaselineMode[];
  threads: number;
  seconds: number;
  repeats: number;
  groupSize: number;
  maxTokens: number;
  /** Chat bodies the engine sent (the throughput runs recorded them): what the bare loop sends. */
  bodies: readonly string[];
}

export async function latencyBound(o: LatencyOptions): Promise<LatencyBound> {
  const mock = await startMockProcess(['--latency-ms', String(LATENCY_MS)]);
  const engine = new Map<number, ThroughputSample[]>(o.concurrencies.map((c) => [c, []]));
  const bare = new Map<number, Sample[]>(o.concurrencies.map((c) => [c, []]));
  const python = new Map<PythonBaselineMode, PythonAtLatency['samples']>(o.pythonModes.map((m) => [m, []]));
  let skipped: string | null = null;
  try {
    for (let i = 0; i < o.repeats; i++) {
      for (const c of o.concurrencies) {
        engine.get(c)!.push(
          await engineThroughput({
            url: mock.url,
            concurrency: c,
            threads: o.threads,
            seconds: o.seconds,
            groupSize: o.groupSize,
            maxTokens: o.maxTokens,
            detail: true,
            mock,
            groupSlack: LATENCY_GROUP_SLACK,
          }),
        );
        bare.get(c)!.push(await bareLoop({ url: mock.url, concurrency: c, seconds: o.seconds, bodies: o.bodies }));
      }
      for (const mode of o.pythonModes) {
        if (skipped !== null) break;
        const outcome = await runPythonBaseline({
          url: mock.url,
          concurrency: o.pythonConcurrency,
          seconds: o.seconds,
          mode,
          maxTokens: o.maxTokens,
        });
        if (!outcome.ok) skipped = outcome.reason;
        else
          python.get(mode)!.push({
            steps: outcome.result.steps,
            seconds: outcome.result.seconds,
            cpuSeconds: outcome.result.cpuSeconds,
          });
      }
    }
  } finally {
    await mock.close();
  }
  const points = o.concurrencies.map((concurrency): LatencyPoint => {
    const samples = engine.get(concurrency)!;
    const bound = concurrency / (LATENCY_MS / 1000);
    const med = (f: (s: ThroughputSample) => number) => spreadOf(samples.map(f)).median;
    return {
      concurrency,
      boundStepsPerSecond: bound,
      stepsPerSecond: spreadOf(samples.map(rate)),
      efficiencyPct: spreadOf(samples.map((s) => (100 * rate(s)) / bound)),
      groupOccupancyPct: med((s) => 100 * (s.detail?.groupOccupancy ?? NaN)),
      meanInferenceMs: med((s) => s.detail?.meanInferenceMs ?? NaN),
      workerLoopDelayMeanMs: med((s) => s.workerLoopDelayMeanMs),
      engineCores: med((s) => s.cpuMs / 1000 / s.seconds),
      mockCores: samples.every((s) => s.mockCpuMs !== null) ? med((s) => s.mockCpuMs! / 1000 / s.seconds) : null,
      samples,
      bare: {
        efficiencyPct: spreadOf(bare.get(concurrency)!.map((s) => (100 * rate(s)) / bound)),
        samples: bare.get(concurrency)!,
      },
    };
  });
  const runs = o.pythonModes
    .filter((m) => python.get(m)!.length > 0)
    .map(
      (mode): PythonAtLatency => ({
        mode,
        samples: python.get(mode)!,
        stepsPerSecond: spreadOf(python.get(mode)!.map((s) => s.steps / s.seconds)),
      }),
    );
  const enginePoint = points.find((p) => p.concurrency === o.pythonConcurrency);
  const over = (mode: PythonBaselineMode) => {
    const run = runs.find((r) => r.mode === mode);
    return enginePoint && run ? enginePoint.stepsPerSecond.median / run.stepsPerSecond.median : null;
  };
  return {
    latencyMs: LATENCY_MS,
    threads: o.threads,
    points,
    python: { concurrency: o.pythonConcurrency, skipped, runs },
    engineOverPythonExecutor: over('executor'),
    engineOverPythonDirect: over('direct'),
  };
}

// --- target 6 ----------------------------------------------------------------------------------

export interface ScalingSide {
  threads: number;
  stepsPerSecond: Spread;
  engineCores: number;
  mockCores: number | null;
  /** CPU of the worker threads per step (µs): the same at 1 and 2 workers = no contention inside the engine. */
  workerCpuUsPerStep: number | null;
  /** Everything on the machine per step (engine and mock, µs): what the cores must pay for each step. */
  machineCpuUsPerStep: number | null;
  samples: ThroughputSample[];
}

export interface WorkerScaling {
  cpuCostUs: number;
  concurrency: number;
  one: ScalingSide;
  two: ScalingSide;
  /** two ÷ one, medians. */
  ratio: number;
  /**
   * What this machine allows two workers if a step cost what it costs with one (engine and mock CPU):
   * its cores ÷ that, ÷ the one-worker rate, at most 2. Below it, the rest is what running two workers
   * beside the main thread and the mock adds per step (`two.machineCpuUsPerStep`).
   */
  ceiling: number | null;
  cores: number;
}

export async function workerScaling(o: {
  cpuCostUs: number;
  concurrency: number;
  seconds: number;
  repeats: number;
  groupSize: number;
  maxTokens: number;
}): Promise<WorkerScaling> {
  const mock: MockProcess = await startMockProcess(['--latency-ms', '0']);
  const by = new Map<number, ThroughputSample[]>([
    [1, []],
    [2, []],
  ]);
  try {
    for (let i = 0; i < o.repeats; i++) {
      for (const threads of [1, 2]) {
        by.get(threads)!.push(
          await engineThroughput({
            url: mock.url,
            concurrency: o.concurrency,
            threads,
            seconds: o.seconds,
            groupSize: o.groupSize,
            maxTokens: o.maxTokens,
            envParams: { cpuCostUs: o.cpuCostUs },
            mock,
          }),
        );
      }
    }
  } finally {
    await mock.close();
  }
  const side = (threads: number): ScalingSide => {
    const samples = by.get(threads)!;
    return {
      threads,
      stepsPerSecond: spreadOf(samples.map(rate)),
      engineCores: spreadOf(samples.map((s) => s.cpuMs / 1000 / s.seconds)).median,
      mockCores: samples.every((s) => s.mockCpuMs !== null)
        ? spreadOf(samples.map((s) => s.mockCpuMs! / 1000 / s.seconds)).median
        : null,
      workerCpuUsPerStep: samples.every((s) => s.cpuSplit !== null)
        ? spreadOf(samples.map((s) => (s.cpuSplit!.workersMs * 1000) / s.operations)).median
        : null,
      machineCpuUsPerStep: samples.every((s) => s.mockCpuMs !== null)
        ? spreadOf(samples.map((s) => ((s.cpuMs + s.mockCpuMs!) * 1000) / s.operations)).median
        : null,
      samples,
    };
  };
  const one = side(1);
  const two = side(2);
  const cores = availableParallelism();
  const ceiling =
    one.machineCpuUsPerStep === null
      ? null
      : Math.min(2, (cores * 1e6) / one.machineCpuUsPerStep / one.stepsPerSecond.median);
  return {
    cpuCostUs: o.cpuCostUs,
    concurrency: o.concurrency,
    one,
    two,
    ratio: two.stepsPerSecond.median / one.stepsPerSecond.median,
    ceiling,
    cores,
  };
}

// --- target 5 ----------------------------------------------------------------------------------

export interface MemoryResult {
  rollouts: number;
  thinkTokens: number;
  /** Held at turn 1 (prompt only) and at turn 3 (two turns played). */
  phases: MemoryFigures[];
  /**
   * From the two phases, memory ≈ fixed + slope × payload (heap + ArrayBuffers): the cost of a rollout
   * in flight whatever it holds, and the cost per byte of payload it holds.
   */
  fixedBytesPerRollout: number | null;
  bytesPerPayloadByte: number | null;
  /** The same number of chat calls pending from a bare undici Pool: the transport's own share. */
  bareRequest: BareRequestMemory;
}

export async function memoryRuns(o: {
  rollouts: number;
  thinkTokens: number;
  threads: number;
  groupSize: number;
}): Promise<MemoryResult> {
  const phases: MemoryFigures[] = [];
  for (const holdAtTurn of [1, 3] as const)
    phases.push(
      await memoryBench({
        rollouts: o.rollouts,
        holdAtTurn,
        threads: o.threads,
        groupSize: o.groupSize,
        thinkTokens: o.thinkTokens,
      }),
    );
  const [a, b] = phases;
  const dx = b.payloadHeld.totalBytes - a.payloadHeld.totalBytes;
  const slope = dx > 0 ? (b.perRollout.heapPlusArrayBuffersBytes - a.perRollout.heapPlusArrayBuffersBytes) / dx : null;
  const bareRequest = await bareRequestMemory(o.rollouts);
  return {
    rollouts: o.rollouts,
    thinkTokens: o.thinkTokens,
    bareRequest,
    phases,
    bytesPerPayloadByte: slope,
    fixedBytesPerRollout:
      slope === null ? null : a.perRollout.heapPlusArrayBuffersBytes - slope * a.payloadHeld.totalBytes,
  };
}

// --- the final table ---------------------------------------------------------------------------

export interface TargetRow {
  /** The issue's target number and condition, e.g. "3 · 512 in flight, 50 ms" (issue 7) or "21 · …". */
  target: string;
  figure: string;
  /** The measured value compared with the limit; null when it could not be measured. */
  value: number | null;
  limit: string;
  pass: boolean | null;
  measured: string;
  /** What the figure includes, its spread, what limits it. */
  detail: string;
}

/** A row's measured column: the figure with its unit, or n/a when it could not be measured. */
function measuredText(value: number | null, digits: number, unit: string): string {
  return value === null ? 'n/a' : `${value.toFixed(digits)}${unit}`;
}

export function row(o: {
  target: string;
  figure: string;
  value: number | null;
  limit: number;
  kind: 'max' | 'min';
  unit: string;
  digits?: number;
  detail: string;
}): TargetRow {
  const ok = o.value !== null && Number.isFinite(o.value);
  return {
    target: o.target,
    figure: o.figure,
    value: ok ? o.value : null,
    limit: `${o.kind === 'max' ? '≤' : '≥'} ${o.limit}${o.unit}`,
    pass: ok ? (o.kind === 'max' ? o.value! <= o.limit : o.value! >= o.limit) : null,
    measured: measuredText(ok ? o.value : null, o.digits ?? 2, o.unit),
    detail: o.detail,
  };
}

/** A figure the issue asks for without a bound (the capacity model): printed in the table, no PASS / FAIL. */
export function figureRow(o: {
  target: string;
  figure: string;
  value: number | null;
  unit: string;
  digits?: number;
  detail: string;
}): TargetRow {
  const ok = o.value !== null && Number.isFinite(o.value);
  return {
    target: o.target,
    figure: o.figure,
    value: ok ? o.value : null,
    limit: '(a figure)',
    pass: null,
    measured: measuredText(ok ? o.value : null, o.digits ?? 0, o.unit),
    detail: o.detail,
  };
}

/**
 * The long-tail workloads' speed-ups over sync (issue 31.2), each with its ceiling and the share of
 * it reached, against issue 21's ≥ 2.5×: a thin reading of what long-tail.ts's `longTailBench`
 * returns (the training loop's result); the strict side's issue 31.3 rows are long-tail.ts's `longTailTargets`.
 */
export function longTailRows(r: TrainingBenchResult): TargetRow[] {
  const sync = r.sides.find((s) => s.side === 'sync')?.figures ?? null;
  const name = r.options.workload?.name ?? 'long-tail';
  const ceiling = r.ceiling;
  return (['async+in-place', 'async+keep'] as const).map((side) => {
    const f = r.sides.find((s) => s.side === side)?.figures ?? null;
    const x = f !== null && sync !== null && sync.stepsPerHour > 0 ? f.stepsPerHour / sync.stepsPerHour : null;
    const bound =
      ceiling === null || ceiling.value <= 0
        ? 'ceiling not measured'
        : `ceiling ${ceiling.value.toFixed(2)}×${x === null ? '' : ` (${((100 * x) / ceiling.value).toFixed(0)} % of it)`}`;
    return row({
      target: `31.2 · ${name}, ${side === 'async+keep' ? 'async, stale rollouts kept' : 'async strict (in place, stale reset)'}`,
      figure: 'training steps/hour ÷ sync',
      value: x,
      limit: 2.5,
      kind: 'min',
      unit: '×',
      detail:
        f === null || sync === null
          ? 'not measured'
          : `${bound}; ${f.stepsPerHour.toFixed(0)} vs ${sync.stepsPerHour.toFixed(0)} steps/h (GPU time); slots ${(100 * f.production.slotFill).toFixed(1)} % filled; ${f.wastedTokensPerStep.toFixed(0)} tokens thrown away a step`,
    });
  });
}

export function printTargets(rows: TargetRow[]): void {
  const width = (f: (r: TargetRow) => string, title: string) => Math.max(title.length, ...rows.map((r) => f(r).length));
  const w = [
    width((r) => r.target, 'target'),
    width((r) => r.figure, 'figure'),
    width((r) => r.limit, 'target'),
    width((r) => r.measured, 'measured'),
  ];
  console.log('\ntargets of issues 7, 21 and 31 (this run)');
  console.log(
    `${'#'.padEnd(w[0])}  ${'figure'.padEnd(w[1])}  ${'target'.padEnd(w[2])}  ${'measured'.padStart(w[3])}  ok    detail`,
  );
  for (const r of rows) {
    const mark = r.pass === null ? (r.value === null ? 'n/a ' : '—   ') : r.pass ? 'PASS' : 'FAIL';
    console.log(
      `${r.target.padEnd(w[0])}  ${r.figure.padEnd(w[1])}  ${r.limit.padEnd(w[2])}  ${r.measured.padStart(w[3])}  ${mark}  ${r.detail}`,
    );
  }
}

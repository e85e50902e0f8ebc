/**
 * The load-test report: figures computed from one run's raw observations. This object is what
 * report.json holds and what the table and the HTML page are drawn from — nothing else feeds them.
 */
import type { FailureKind } from '../domain/failure.ts';
import { cpus, totalmem } from 'node:os';
import type { GroupCounts } from '../coordinator/producer.ts';
import type { LoadtestOptions } from './options.ts';
import type { Sample } from './recorder.ts';
import type { EngineRun } from './runner.ts';
import { gpuWindow, type GpuWindow } from '../mock-llm/gpu.ts';
import { distribution, median, percentile, StalenessTally, type Distribution, type StalenessFigures } from './stats.ts';

export interface Throughput {
  /** Agent steps (one inference call + one environment step) the workers ran, aborted work included. */
  stepsPerSecond: number;
  /** Turns of the rollouts the trainer took. */
  takenTurnsPerSecond: number;
  rolloutsPerSecond: number;
  groupsPerSecond: number;
  /** Response tokens of the rollouts the trainer took. */
  tokensPerSecond: number;
  batchesPerSecond: number;
}

/**
 * One point a second: each rate is what happened over the sliding window (`slidingWindowS`) that ends
 * at `t`, so batches taken in bursts read as the rate they sustain, not as spikes and zeros.
 */
export interface SeriesPoint {
  /** End of the window, seconds into the measured window. */
  t: number;
  stepsPerSecond: number;
  rolloutsPerSecond: number;
  groupsPerSecond: number;
  tokensPerSecond: number;
  /** Rollouts the workers held, mean of the samples in the window (the report's one "in flight" figure). */
  inFlightRollouts: number;
  /** The GPU-like mock over the window: share of time busy, share of slots filled; null without it. */
  gpuBusyFraction: number | null;
  gpuSlotFill: number | null;
}

export interface Spread {
  count: number;
  p50: number;
  p99: number;
  max: number;
}

export interface LoadtestReport {
  version: 1;
  startedAt: string;
  /** The options asked for, then what the engine resolved over them. */
  settings: Omit<LoadtestOptions, 'outDir'> & EngineRun['engineSettings'] & { rolloutsInFlight: number };
  machine: { cpus: number; cpuModel: string; totalMemoryBytes: number; node: string; platform: string };
  window: {
    seconds: number;
    batches: number;
    agentSteps: number;
    turns: number;
    rollouts: number;
    groups: number;
    tokens: number;
  };
  throughput: Throughput;
  /** Rollouts the workers held: at most `settings.rolloutsInFlight` (the capacity asked for), mean over the window's samples. */
  inFlight: { capacity: number; mean: number; peak: number };
  /** Width of the sliding window of `timeSeries`, seconds. */
  slidingWindowS: number;
  timeSeries: SeriesPoint[];
  /** The GPU-like mock over the measured window (model time); null with the fixed-latency mock. */
  gpu: GpuWindow | null;
  /**
   * Milliseconds, over the rollouts of taken groups (and their turns) that started inside the window;
   * a rollout interrupted by a pause counts every attempt (times add up across attempts).
   */
  latency: {
    /** Taken rollouts left out because they started before the window (during start-up). */
    startedBeforeWindow: number;
    rollout: { queueMs: Distribution; inferenceMs: Distribution; envMs: Distribution; totalMs: Distribution };
    turn: { inferenceMs: Distribution; envMs: Distribution; totalMs: Distribution };
  };
  pauses: {
    count: number;
    byReason: Record<string, number>;
    /** Request → the last inference call any worker sent (the control block's last-send clock). */
    workersStoppedMs: Spread;
    /** Request → every worker's event loop ran its pause watcher. */
    workersAckedMs: Spread;
    allBackMs: Spread;
    resumeMs: Spread;
    events: {
      t: number;
      reason: string;
      inFlightBefore: number;
      groupsBack: number;
      workersStoppedMs: number | null;
      allBackMs: number;
      resumeMs: number;
      modelStep: number;
      serverAbort: boolean;
      cancelled: boolean;
      stillInFlight: number;
    }[];
  };
  memory: {
    /** Divided by rollouts in flight, over samples taken while production was full (see `full`). */
    perRolloutHeapBytes: number;
    perRolloutRssBytes: number;
    /** Whether the samples used reached 90 % of `settings.rolloutsInFlight`; false = the fullest samples were used instead. */
    full: boolean;
    samplesUsed: number;
    inFlightRollouts: number;
    baseline: { heapBytes: number; rssBytes: number; inFlightRollouts: number };
    peak: { heapBytes: number; rssBytes: number; inFlightRollouts: number };
  };
  cpu: {
    /** This process (coordinator + worker threads), user + system, over the window. */
    engineMs: number;
    userMs: number;
    systemMs: number;
    perStepUs: number;
    perTakenTurnUs: number;
    coresBusy: number;
    /** The mock server's own process, for telling an engine limit from a server limit; null where unreadable. */
    mockMs: number | null;
    mockCoresBusy: number | null;
  };
  outcomes: {
    meanReward: number;
    rolloutsByTask: Record<string, number>;
    groups: GroupCounts;
    /** Episodes that failed, by kind (src/domain/failure.ts); infrastructure ones ran again in their slot. */
    failures: Record<FailureKind, number>;
    /** How stale the rollouts taken in the window were: what kept stale rollouts cost the trainer. */
    staleness: StalenessFigures;
  };
  notes: string[];
}

const FULL_FRACTION = 0.9;

export function buildReport(options: LoadtestOptions, run: EngineRun, startedAt: Date): LoadtestReport {
  const { recorder, seconds } = run;
  const rolloutsInFlight = run.engineSettings.batchSize * options.groupSize;
  const taken = recorder.batches.filter((b) => b.t >= 0 && b.t <= seconds);
  const totals = { batches: taken.length, turns: 0, rollouts: 0, groups: 0, tokens: 0 };
  let rewardSum = 0;
  const staleness = new StalenessTally();
  for (const b of taken) {
    staleness.add(b.staleness, b.rollouts);
    totals.turns += b.turns;
    totals.rollouts += b.rollouts;
    totals.groups += b.groups;
    totals.tokens += b.tokens;
    rewardSum += b.meanReward * b.rollouts;
  }
  const windowSamples = recorder.samples.filter((s) => s.t >= 0);
  const agentSteps = stepDeltas([run.baseline, ...windowSamples]).reduce((n, d) => n + d.steps, 0);
  const rate = (n: number) => (seconds > 0 ? n / seconds : 0);
  const cpuMs = run.cpu.userMs + run.cpu.systemMs;
  const notes = [...run.notes];
  const memory = memoryFigures(run.baseline, windowSamples, rolloutsInFlight, notes);
  const { outDir: _where, ...settings } = options; // the report describes the run, not where it was written
  return {
    version: 1,
    startedAt: startedAt.toISOString(),
    settings: { ...settings, rolloutsInFlight, ...run.engineSettings },
    machine: {
      cpus: cpus().length,
      cpuModel: cpus()[0]?.model ?? 'unknown',
      totalMemoryBytes: totalmem(),
      node: process.version,
      platform: process.platform,
    },
    window: { seconds, agentSteps, ...totals },
    throughput: {
      stepsPerSecond: rate(agentSteps),
      takenTurnsPerSecond: rate(totals.turns),
      rolloutsPerSecond: rate(totals.rollouts),
      groupsPerSecond: rate(totals.groups),
      tokensPerSecond: rate(totals.tokens),
      batchesPerSecond: rate(totals.batches),
    },
    inFlight: {
      capacity: rolloutsInFlight,
      mean:
        windowSamples.length === 0
          ? 0
          : windowSamples.reduce((n, x) => n + x.inFlightRollouts, 0) / windowSamples.length,
      peak: Math.max(0, ...windowSamples.map((x) => x.inFlightRollouts)),
    },
    slidingWindowS: slidingWindow(seconds),
    timeSeries: timeSeries(run, windowSamples),
    gpu: gpuOverWindow(run.baseline, windowSamples),
    latency: {
      startedBeforeWindow: recorder.startedBeforeWindow,
      rollout: {
        queueMs: distribution(recorder.rollout.queueMs),
        inferenceMs: distribution(recorder.rollout.inferenceMs),
        envMs: distribution(recorder.rollout.envMs),
        totalMs: distribution(recorder.rollout.totalMs),
      },
      turn: {
        inferenceMs: distribution(recorder.turn.inferenceMs),
        envMs: distribution(recorder.turn.envMs),
        totalMs: distribution(recorder.turn.totalMs),
      },
    },
    pauses: pauseFigures(run),
    memory,
    cpu: {
      engineMs: cpuMs,
      userMs: run.cpu.userMs,
      systemMs: run.cpu.systemMs,
      perStepUs: agentSteps > 0 ? (cpuMs * 1000) / agentSteps : 0,
      perTakenTurnUs: totals.turns > 0 ? (cpuMs * 1000) / totals.turns : 0,
      coresBusy: seconds > 0 ? cpuMs / (seconds * 1000) : 0,
      mockMs: run.mockCpuMs,
      mockCoresBusy: run.mockCpuMs === null || seconds <= 0 ? null : run.mockCpuMs / (seconds * 1000),
    },
    outcomes: {
      meanReward: totals.rollouts > 0 ? rewardSum / totals.rollouts : 0,
      rolloutsByTask: { ...recorder.rolloutsByTask },
      groups: run.stats.groups,
      failures: run.stats.failures,
      staleness: staleness.figures(),
    },
    notes,
  };
}

/** Agent steps run between consecutive samples, credited to the later one; a replaced worker's reset counter counts 0. */
function stepDeltas(samples: readonly Sample[]): { t: number; steps: number }[] {
  const out: { t: number; steps: number }[] = [];
  for (let i = 1; i < samples.length; i++)
    out.push({ t: samples[i].t, steps: Math.max(0, samples[i].agentSteps - samples[i - 1].agentSteps) });
  return out;
}

/** Rates over time are averaged over this many seconds (fewer for a short run): enough to span a batch or two. */
const SLIDING_WINDOW_S = 5;

function slidingWindow(seconds: number): number {
  return Math.max(1, Math.min(SLIDING_WINDOW_S, Math.floor(seconds / 3)));
}

function gpuOverWindow(baseline: Sample, samples: readonly Sample[]): GpuWindow | null {
  const last = samples.at(-1)?.gpu;
  return baseline.gpu && last ? gpuWindow(baseline.gpu, last) : null;
}

function timeSeries(run: EngineRun, windowSamples: readonly Sample[]): SeriesPoint[] {
  const { seconds, recorder } = run;
  const width = slidingWindow(seconds);
  const steps = stepDeltas([run.baseline, ...windowSamples]);
  const batches = recorder.batches.filter((b) => b.t >= 0 && b.t <= seconds);
  const withGpu = [run.baseline, ...windowSamples].filter((x) => x.gpu !== null);
  const points: SeriesPoint[] = [];
  // A point every second from the first whole window, and one at the very end.
  const ends: number[] = [];
  for (let t = width; t < seconds; t++) ends.push(t);
  ends.push(seconds);
  for (const end of ends) {
    const start = Math.max(0, end - width);
    const span = Math.max(end - start, 1e-9);
    const inside = <T extends { t: number }>(xs: readonly T[]) => xs.filter((x) => x.t > start && x.t <= end);
    const b = inside(batches);
    const sampled = inside(windowSamples);
    // The GPU readings bracketing the window (its integrals make any two readings a window).
    const from = [...withGpu].reverse().find((x) => x.t <= start) ?? withGpu[0];
    const to = [...withGpu].reverse().find((x) => x.t <= end);
    const gpu = from?.gpu && to?.gpu && to.t > from.t ? gpuWindow(from.gpu, to.gpu) : null;
    points.push({
      t: end,
      stepsPerSecond: inside(steps).reduce((n, d) => n + d.steps, 0) / span,
      rolloutsPerSecond: b.reduce((n, x) => n + x.rollouts, 0) / span,
      groupsPerSecond: b.reduce((n, x) => n + x.groups, 0) / span,
      tokensPerSecond: b.reduce((n, x) => n + x.tokens, 0) / span,
      inFlightRollouts: sampled.length === 0 ? 0 : sampled.reduce((n, x) => n + x.inFlightRollouts, 0) / sampled.length,
      gpuBusyFraction: gpu?.busyFraction ?? null,
      gpuSlotFill: gpu?.slotFill ?? null,
    });
  }
  return points;
}

function spread(values: readonly number[]): Spread {
  if (values.length === 0) return { count: 0, p50: 0, p99: 0, max: 0 };
  return { count: values.length, p50: percentile(values, 50), p99: percentile(values, 99), max: Math.max(...values) };
}

function pauseFigures(run: EngineRun): LoadtestReport['pauses'] {
  const pauses = run.recorder.pauses;
  const byReason: Record<string, number> = {};
  for (const p of pauses) byReason[p.reason] = (byReason[p.reason] ?? 0) + 1;
  return {
    count: pauses.length,
    byReason,
    workersStoppedMs: spread(pauses.flatMap((p) => (p.workersStoppedMs === null ? [] : [p.workersStoppedMs]))),
    workersAckedMs: spread(pauses.flatMap((p) => (p.workersAckedMs === null ? [] : [p.workersAckedMs]))),
    allBackMs: spread(pauses.map((p) => p.allBackMs)),
    resumeMs: spread(pauses.map((p) => p.resumeMs)),
    events: pauses.map((p) => ({
      t: p.t,
      reason: p.reason,
      inFlightBefore: p.inFlightBefore,
      groupsBack: p.groupsBack,
      workersStoppedMs: p.workersStoppedMs,
      allBackMs: p.allBackMs,
      resumeMs: p.resumeMs,
      modelStep: p.modelStep,
      serverAbort: p.serverAbort,
      cancelled: p.cancelled,
      stillInFlight: p.stillInFlight,
    })),
  };
}

function memoryFigures(
  baseline: Sample,
  samples: readonly Sample[],
  target: number,
  notes: string[],
): LoadtestReport['memory'] {
  const peakInFlight = Math.max(0, ...samples.map((s) => s.inFlightRollouts));
  let used = samples.filter((s) => s.inFlightRollouts >= FULL_FRACTION * target && s.inFlightRollouts > 0);
  const full = used.length > 0;
  if (!full) {
    used = samples.filter((s) => s.inFlightRollouts > 0 && s.inFlightRollouts >= FULL_FRACTION * peakInFlight);
    notes.push(
      used.length === 0
        ? 'memory per rollout: no sample saw a rollout in flight'
        : `memory per rollout: production never reached ${Math.round(FULL_FRACTION * 100)} % of ${target} rollouts in flight (peak ${peakInFlight}); the fullest samples were used`,
    );
  }
  const perHeap = used.map((s) => (s.heapBytes - baseline.heapBytes) / s.inFlightRollouts);
  const perRss = used.map((s) => (s.rssBytes - baseline.rssBytes) / s.inFlightRollouts);
  return {
    perRolloutHeapBytes: used.length === 0 ? 0 : median(perHeap),
    perRolloutRssBytes: used.length === 0 ? 0 : median(perRss),
    full,
    samplesUsed: used.length,
    inFlightRollouts: used.length === 0 ? 0 : median(used.map((s) => s.inFlightRollouts)),
    baseline: {
      heapBytes: baseline.heapBytes,
      rssBytes: baseline.rssBytes,
      inFlightRollouts: baseline.inFlightRollouts,
    },
    peak: {
      heapBytes: Math.max(0, ...samples.map((s) => s.heapBytes)),
      rssBytes: Math.max(0, ...samples.map((s) => s.rssBytes)),
      inFlightRollouts: peakInFlight,
    },
  };
}

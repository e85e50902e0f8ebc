/**
 * Small statistics for the load-test report: nearest-rank percentiles, summaries, fixed-width
 * histograms, the staleness of the batches taken. Shared with the benchmark (test/bench/run.ts) and
 * the training loop (./training.ts) so they quote them the same way.
 */
import type { BatchStats } from '../coordinator/batch-stats.ts';
import type { RolloutGroup } from '../domain/rollout.ts';

/** Nearest-rank percentile of unsorted values (p in 0..100); NaN for no values. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return NaN;
  return percentileOfSorted(
    [...values].sort((a, b) => a - b),
    p,
  );
}

/** Nearest-rank percentile of values already sorted ascending. */
function percentileOfSorted(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const rank = Math.ceil((p / 100) * sorted.length) - 1;
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank))];
}

export function median(values: readonly number[]): number {
  return percentile(values, 50);
}

export interface Histogram {
  /** Lower edge of the first bin and width of every bin, in the values' unit. */
  start: number;
  binWidth: number;
  /** counts[i] holds values in [start + i·binWidth, start + (i+1)·binWidth); the last bin also holds everything above. */
  counts: number[];
  /** Values above the last bin's upper edge, counted in the last bin (the long tail is cut at p99.5 to keep the shape visible). */
  overflow: number;
}

export interface Distribution {
  count: number;
  mean: number;
  min: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
  histogram: Histogram;
}

const HISTOGRAM_BINS = 30;

/** Summary figures and a histogram; every figure is null-free (0 with count 0) so JSON readers need no guards. */
export function distribution(values: readonly number[]): Distribution {
  if (values.length === 0) {
    return {
      count: 0,
      mean: 0,
      min: 0,
      p50: 0,
      p90: 0,
      p99: 0,
      max: 0,
      histogram: { start: 0, binWidth: 0, counts: [], overflow: 0 },
    };
  }
  const sorted = [...values].sort((a, b) => a - b);
  let sum = 0;
  for (const v of sorted) sum += v;
  return {
    count: sorted.length,
    mean: sum / sorted.length,
    min: sorted[0],
    p50: percentileOfSorted(sorted, 50),
    p90: percentileOfSorted(sorted, 90),
    p99: percentileOfSorted(sorted, 99),
    max: sorted[sorted.length - 1],
    histogram: histogram(sorted),
  };
}

function histogram(sorted: readonly number[]): Histogram {
  const start = Math.max(0, Math.floor(sorted[0]));
  // A few extreme values would squash the body into one bin: the range ends at p99.5 and the rest overflows.
  const top = percentileOfSorted(sorted, 99.5);
  const binWidth = niceWidth((top - start) / HISTOGRAM_BINS);
  const bins = Math.max(1, Math.min(HISTOGRAM_BINS, Math.ceil((top - start) / binWidth) + 1));
  const counts = new Array<number>(bins).fill(0);
  let overflow = 0;
  for (const v of sorted) {
    const i = Math.floor((v - start) / binWidth);
    if (i >= bins) overflow++;
    counts[Math.min(bins - 1, Math.max(0, i))]++;
  }
  return { start, binWidth, counts, overflow };
}

/** Round a bin width up to 1, 2 or 5 × a power of ten, so bin edges read well on an axis. */
function niceWidth(raw: number): number {
  if (!(raw > 0)) return 1;
  const exponent = Math.floor(Math.log10(raw));
  const base = 10 ** exponent;
  for (const step of [1, 2, 5, 10]) if (raw <= step * base) return step * base;
  return 10 * base;
}

/** How stale the rollouts of several batches were, together. */
export interface StalenessFigures {
  mean: number;
  max: number;
  /** Share of the rollouts at or past the stale threshold. */
  pastThresholdFraction: number;
}

/** Adds up the batch stats' staleness of each batch taken (mean weighted by its rollouts). */
export class StalenessTally {
  #rollouts = 0;
  #sum = 0;
  #max = 0;
  #past = 0;

  add(staleness: BatchStats['staleness'], rollouts: number): void {
    this.#rollouts += rollouts;
    this.#sum += staleness.mean * rollouts;
    this.#max = Math.max(this.#max, staleness.max);
    this.#past += staleness.pastThreshold;
  }

  figures(): StalenessFigures {
    const n = this.#rollouts;
    return { mean: n > 0 ? this.#sum / n : 0, max: this.#max, pastThresholdFraction: n > 0 ? this.#past / n : 0 };
  }
}

/**
 * Where a taken rollout's age went, mean model seconds: its own episode (first start → its end), the wait
 * for the rest of its group (a group is stored and taken whole), and the buffer (the group's end →
 * the take). A rollout is taken about age ÷ step time train steps stale, plus up to
 * `syncWeightsInterval` more (the rounding, and the weights it started with being already that old),
 * so the parts say what a scheduler can shorten (the buffer) and what it cannot (the episode, and
 * the group but for siblings reset past the bound and generated again). Only rollouts that ran once
 * count: a member generated again keeps its first start (`timings.startedAt`), while its staleness
 * counts from the attempt it was taken with.
 */
export interface AgeFigures {
  rollouts: number;
  /**
   * Taken rollouts left out: generated again from the prompt after a reset or an infrastructure
   * failure (`attempt` > 0). One that went on from its last finished step keeps its attempt and its
   * first start, and counts.
   */
  generatedAgain: number;
  /** Taken rollouts left out: no start or end on the clock (never ran in a worker). */
  untimed: number;
  episodeSeconds: number;
  groupSeconds: number;
  bufferSeconds: number;
}

export class AgeTally {
  /** Model ms per real ms (the mocks' `speedup`): rollout timings are real, the figures model time. */
  readonly #speedup: number;
  #rollouts = 0;
  #generatedAgain = 0;
  #untimed = 0;
  #episode = 0;
  #group = 0;
  #buffer = 0;

  constructor(speedup = 1) {
    this.#speedup = speedup;
  }

  /** A batch's groups, taken at `takenAt` (wall clock, ms: the clock rollout timings use). */
  add(groups: readonly RolloutGroup[], takenAt: number): void {
    for (const g of groups) {
      let end = 0;
      for (const r of g.rollouts) end = Math.max(end, r.timings.finishedAt);
      for (const r of g.rollouts) {
        const t = r.timings;
        if (r.attempt > 0) {
          this.#generatedAgain++;
          continue;
        }
        if (t.startedAt <= 0 || t.finishedAt < t.startedAt) {
          this.#untimed++;
          continue;
        }
        this.#rollouts++;
        this.#episode += t.finishedAt - t.startedAt;
        this.#group += end - t.finishedAt;
        this.#buffer += Math.max(0, takenAt - end);
      }
    }
  }

  figures(): AgeFigures {
    const n = this.#rollouts;
    const seconds = (ms: number) => (n > 0 ? (ms * this.#speedup) / 1000 / n : 0);
    return {
      rollouts: n,
      generatedAgain: this.#generatedAgain,
      untimed: this.#untimed,
      episodeSeconds: seconds(this.#episode),
      groupSeconds: seconds(this.#group),
      bufferSeconds: seconds(this.#buffer),
    };
  }
}

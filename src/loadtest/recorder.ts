/**
 * Raw observations of one load-test run, gathered while it runs and turned into figures afterwards
 * (./report.ts). Times are seconds since the measured window started.
 *
 * What the engine exposes is all it uses: taken batches (per-rollout `timings`, per-turn `timings`),
 * `engine.stats()` (worker counters and heaps) and the pause reports.
 */
import type { PauseReport } from '../coordinator/producer.ts';
import type { Batch, BatchStats } from '../domain/batch.ts';
import type { GpuMetrics } from '../mock-llm/gpu.ts';

export interface BatchRecord {
  t: number;
  trainStep: number;
  groups: number;
  rollouts: number;
  turns: number;
  tokens: number;
  meanReward: number;
  /** The batch stats' staleness of its rollouts. */
  staleness: BatchStats['staleness'];
}

/** One look at the engine: counters summed over workers, memory of this process. */
export interface Sample {
  t: number;
  workers: number;
  inFlightRollouts: number;
  /** Agent steps the workers have run since they started (cumulative, summed). */
  agentSteps: number;
  rssBytes: number;
  /** This thread's V8 heap plus every worker's: the engine's JavaScript memory. */
  heapBytes: number;
  /** The GPU-like mock's cumulative metrics at this moment; null with the fixed-latency mock. */
  gpu: GpuMetrics | null;
}

export type PauseReason = 'scheduled' | 'expired-batch';

export interface PauseRecord extends PauseReport {
  t: number;
  reason: PauseReason;
  /** Rollouts in flight on the workers just before the pause (last sample). */
  inFlightBefore: number;
  /** Weight version the engine resumed with. */
  modelStep: number;
  /** From the pause's end until resume() returned (loading the "weights" into the mock included). */
  resumeMs: number;
}

export class Recorder {
  readonly batches: BatchRecord[] = [];
  readonly samples: Sample[] = [];
  readonly pauses: PauseRecord[] = [];
  /** Per rollout of taken groups, ms. */
  readonly rollout = {
    queueMs: [] as number[],
    inferenceMs: [] as number[],
    envMs: [] as number[],
    totalMs: [] as number[],
  };
  /** Per turn of taken rollouts, ms. */
  readonly turn = { inferenceMs: [] as number[], envMs: [] as number[], totalMs: [] as number[] };
  readonly rolloutsByTask: Record<string, number> = {};
  /** Taken rollouts left out of the latencies: they started before the window (start-up queueing would skew them). */
  startedBeforeWindow = 0;
  #origin = performance.now();
  /** The window's start on the wall clock, which is what rollout timings (`startedAt`) use. */
  #originWall = Date.now();

  /** Start the measured window now: earlier records keep negative times and are left out of rates. */
  startWindow(): void {
    this.#origin = performance.now();
    this.#originWall = Date.now();
  }

  now(): number {
    return (performance.now() - this.#origin) / 1000;
  }

  addBatch(batch: Extract<Batch, { status: 'NORMAL' }>): void {
    const s = batch.stats;
    this.batches.push({
      t: this.now(),
      trainStep: batch.trainStep,
      groups: s.groups,
      rollouts: s.rollouts,
      turns: s.turns,
      tokens: s.responseTokens,
      meanReward: s.meanReward,
      staleness: s.staleness,
    });
    for (const group of batch.groups) {
      for (const r of group.rollouts) {
        this.rolloutsByTask[r.taskName] = (this.rolloutsByTask[r.taskName] ?? 0) + 1;
        if (r.timings.startedAt < this.#originWall) {
          this.startedBeforeWindow++;
          continue;
        }
        this.rollout.queueMs.push(r.timings.queueMs);
        this.rollout.inferenceMs.push(r.timings.inferenceMs);
        this.rollout.envMs.push(r.timings.envMs);
        this.rollout.totalMs.push(r.timings.totalMs);
        for (const turn of r.turns) {
          this.turn.inferenceMs.push(turn.timings.inferenceMs);
          this.turn.envMs.push(turn.timings.envMs);
          this.turn.totalMs.push(turn.timings.totalMs);
        }
      }
    }
  }

  addSample(sample: Omit<Sample, 't'>): Sample {
    const full = { t: this.now(), ...sample };
    this.samples.push(full);
    return full;
  }

  addPause(report: PauseReport, details: Omit<PauseRecord, keyof PauseReport | 't'>, t: number): void {
    this.pauses.push({ ...report, ...details, t });
  }

  lastSample(): Sample | undefined {
    return this.samples.at(-1);
  }
}

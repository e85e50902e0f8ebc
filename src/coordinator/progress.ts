/**
 * Produce progress, shared by the producer and the consumer (`getBatch`).
 *
 * Counts are absolute and cumulative per task: `targetGroups` = groups that should exist up to the
 * producer's future step, `consumedGroups` = groups the trainer took, and available = consumed +
 * COMPLETED in the buffer. Because both sides count from the start of the run, a consumer taking
 * groups never looks like a gap the producer must fill again.
 *
 * The object is updated in place (restore included): the strategies hold a reference to it.
 * Statistics (rewards, samples, tokens, time) cover the window since the last batch was taken.
 */
import { allocateBatch } from './allocate.ts';
import { noFailures, type FailureKind } from '../domain/failure.ts';

export interface ProgressState {
  nextTrainStep: number;
  producerFutureStep: number;
  targetUptoFutureStep: number;
  consumedGroups: Record<string, number>;
  targetGroups: Record<string, number>;
  rewardSum: Record<string, number>;
  rewardCount: Record<string, number>;
  producedSamples: Record<string, number>;
  producedTokens: Record<string, number>;
  produceMs: number;
}

export interface WindowStats {
  meanReward: Record<string, number | null>;
  producedSamples: Record<string, number>;
  producedTokens: Record<string, number>;
  /** Episodes that failed since the last batch, by kind; infrastructure ones include those run again in their slot. */
  failures: Record<FailureKind, number>;
  produceMs: number;
}

export class ProduceProgress implements ProgressState {
  /** The train step new samples are measured against (set by getBatch(i) to i, then i + 1). */
  nextTrainStep = 1;
  /** The step the producer is producing for; runs ahead of the consumer up to the staleness bound. */
  producerFutureStep = 1;
  /** targetGroups covers every step up to this one. */
  targetUptoFutureStep = 0;
  readonly consumedGroups: Record<string, number> = {};
  readonly targetGroups: Record<string, number> = {};
  readonly rewardSum: Record<string, number> = {};
  readonly rewardCount: Record<string, number> = {};
  /** Rollouts (not groups) that landed since the last batch, every status: a retried group's each time. */
  readonly producedSamples: Record<string, number> = {};
  readonly producedTokens: Record<string, number> = {};
  produceMs = 0;
  /** Not in checkpoints: a window's statistics, like the rest of the window, start again after a restart. */
  #failures = noFailures();
  readonly #tasks: readonly { name: string; weight: number }[];
  /** Each task's share of every batch: fixed for the run, so a split that cannot fill a batch throws here, at construction. */
  readonly #shares: ReadonlyMap<string, number>;

  constructor(tasks: readonly { name: string; weight: number }[], batchSize: number) {
    this.#tasks = tasks;
    this.#shares = allocateBatch(batchSize, tasks);
    for (const { name } of tasks) {
      this.consumedGroups[name] = 0;
      this.targetGroups[name] = 0;
      this.rewardSum[name] = 0;
      this.rewardCount[name] = 0;
      this.producedSamples[name] = 0;
      this.producedTokens[name] = 0;
    }
  }

  /** This step's share of the batch per task (largest remainder by weight). */
  shares(): ReadonlyMap<string, number> {
    return this.#shares;
  }

  /** Extend the cumulative targets to cover every step up to `step` (the producer future step). */
  ensureTargetUpto(step: number): void {
    if (step <= this.targetUptoFutureStep) return;
    const shares = this.shares();
    const steps = step - this.targetUptoFutureStep;
    for (const [name, share] of shares) this.targetGroups[name] += share * steps;
    this.targetUptoFutureStep = step;
  }

  beginConsume(trainStep: number): void {
    this.nextTrainStep = trainStep;
    if (this.producerFutureStep < trainStep) this.producerFutureStep = trainStep;
  }

  markConsumed(counts: ReadonlyMap<string, number>): void {
    for (const [name, n] of counts) this.consumedGroups[name] += n;
  }

  finishConsume(trainStep: number): void {
    this.nextTrainStep = trainStep + 1;
  }

  /**
   * The targets of `metStep` are met: produce for the step after it. A no-op when the future step is no
   * longer `metStep`: the consumer pulled it forward (beginConsume) while that round ran, and the step it
   * pulled it to has not been produced for yet. Moving on from there would skip the consumer's step
   * (regression: with maxStaleness 0 the producer then parked on a step too stale to produce for,
   * the targets never covering the step getBatch waited on).
   */
  advanceFutureStep(metStep: number): void {
    if (this.producerFutureStep === metStep) this.producerFutureStep = metStep + 1;
  }

  addRewards(task: string, sum: number, count: number): void {
    this.rewardSum[task] += sum;
    this.rewardCount[task] += count;
  }

  addProduced(task: string, samples: number, tokens: number): void {
    this.producedSamples[task] += samples;
    this.producedTokens[task] += tokens;
  }

  addFailures(kind: FailureKind, episodes: number): void {
    this.#failures[kind] += episodes;
  }

  /** The window's statistics, reset for the next batch. */
  takeWindow(): WindowStats {
    const out: WindowStats = {
      meanReward: {},
      producedSamples: { ...this.producedSamples },
      producedTokens: { ...this.producedTokens },
      failures: this.#failures,
      produceMs: this.produceMs,
    };
    this.#failures = noFailures();
    for (const { name } of this.#tasks) {
      out.meanReward[name] = this.rewardCount[name] === 0 ? null : this.rewardSum[name] / this.rewardCount[name];
      this.rewardSum[name] = 0;
      this.rewardCount[name] = 0;
      this.producedSamples[name] = 0;
      this.producedTokens[name] = 0;
    }
    this.produceMs = 0;
    return out;
  }

  snapshot(): ProgressState {
    return structuredClone({
      nextTrainStep: this.nextTrainStep,
      producerFutureStep: this.producerFutureStep,
      targetUptoFutureStep: this.targetUptoFutureStep,
      consumedGroups: this.consumedGroups,
      targetGroups: this.targetGroups,
      rewardSum: this.rewardSum,
      rewardCount: this.rewardCount,
      producedSamples: this.producedSamples,
      producedTokens: this.producedTokens,
      produceMs: this.produceMs,
    });
  }

  /** Update every field in place from a snapshot; task maps keep their identity. */
  restore(state: ProgressState): void {
    this.nextTrainStep = state.nextTrainStep;
    this.producerFutureStep = state.producerFutureStep;
    this.targetUptoFutureStep = state.targetUptoFutureStep;
    this.produceMs = state.produceMs ?? 0;
    for (const { name } of this.#tasks) {
      this.consumedGroups[name] = state.consumedGroups[name] ?? 0;
      this.targetGroups[name] = state.targetGroups[name] ?? 0;
      this.rewardSum[name] = state.rewardSum?.[name] ?? 0;
      this.rewardCount[name] = state.rewardCount?.[name] ?? 0;
      this.producedSamples[name] = state.producedSamples?.[name] ?? 0;
      this.producedTokens[name] = state.producedTokens?.[name] ?? 0;
    }
  }
}

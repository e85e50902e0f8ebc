/**
 * Produce progress, shared by the producer and the consumer (`getBatch`).
 *
 * Counts are absolute and cumulative per task: `targetSamples` = groups that should exist up to the
 * producer's future step, `consumedSamples` = groups the trainer took, and available = consumed +
 * COMPLETED in the buffer. Because both sides count from the start of the run, a consumer taking
 * groups never looks like a gap the producer must fill again.
 *
 * The object is updated in place (restore included): the strategies hold a reference to it.
 * Statistics (rewards, samples, tokens, time) cover the window since the last batch was taken.
 */
import { allocateBatch } from './allocate.ts';

export interface ProgressState {
  nextConsumerStep: number;
  producerFutureStep: number;
  targetUptoFutureStep: number;
  consumedSamples: Record<string, number>;
  targetSamples: Record<string, number>;
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
  produceMs: number;
}

export class ProduceProgress implements ProgressState {
  /** The train step new samples are measured against (set by getBatch(i) to i, then i + 1). */
  nextConsumerStep = 1;
  /** The step the producer is producing for; runs ahead of the consumer up to the staleness bound. */
  producerFutureStep = 1;
  /** targetSamples covers every step up to this one. */
  targetUptoFutureStep = 0;
  readonly consumedSamples: Record<string, number> = {};
  readonly targetSamples: Record<string, number> = {};
  readonly rewardSum: Record<string, number> = {};
  readonly rewardCount: Record<string, number> = {};
  readonly producedSamples: Record<string, number> = {};
  readonly producedTokens: Record<string, number> = {};
  produceMs = 0;
  readonly #tasks: readonly { name: string; weight: number }[];
  readonly #batchSize: number;

  constructor(tasks: readonly { name: string; weight: number }[], batchSize: number) {
    this.#tasks = tasks;
    this.#batchSize = batchSize;
    for (const { name } of tasks) {
      this.consumedSamples[name] = 0;
      this.targetSamples[name] = 0;
      this.rewardSum[name] = 0;
      this.rewardCount[name] = 0;
      this.producedSamples[name] = 0;
      this.producedTokens[name] = 0;
    }
  }

  /** This step's share of the batch per task (largest remainder by weight). */
  shares(): Map<string, number> {
    return allocateBatch(this.#batchSize, this.#tasks);
  }

  /** Extend the cumulative targets to cover every step up to `futureStep`. */
  ensureTargetUpto(futureStep: number): void {
    if (futureStep <= this.targetUptoFutureStep) return;
    const shares = this.shares();
    const steps = futureStep - this.targetUptoFutureStep;
    for (const [name, share] of shares) this.targetSamples[name] += share * steps;
    this.targetUptoFutureStep = futureStep;
  }

  beginConsume(trainStep: number): void {
    this.nextConsumerStep = trainStep;
    if (this.producerFutureStep < trainStep) this.producerFutureStep = trainStep;
  }

  markConsumed(counts: ReadonlyMap<string, number>): void {
    for (const [name, n] of counts) this.consumedSamples[name] += n;
  }

  finishConsume(trainStep: number): void {
    this.nextConsumerStep = trainStep + 1;
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

  /** The window's statistics, reset for the next batch. */
  takeWindow(): WindowStats {
    const out: WindowStats = {
      meanReward: {},
      producedSamples: { ...this.producedSamples },
      producedTokens: { ...this.producedTokens },
      produceMs: this.produceMs,
    };
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
      nextConsumerStep: this.nextConsumerStep,
      producerFutureStep: this.producerFutureStep,
      targetUptoFutureStep: this.targetUptoFutureStep,
      consumedSamples: this.consumedSamples,
      targetSamples: this.targetSamples,
      rewardSum: this.rewardSum,
      rewardCount: this.rewardCount,
      producedSamples: this.producedSamples,
      producedTokens: this.producedTokens,
      produceMs: this.produceMs,
    });
  }

  /** Update every field in place from a snapshot; task maps keep their identity. */
  restore(state: ProgressState): void {
    this.nextConsumerStep = state.nextConsumerStep;
    this.producerFutureStep = state.producerFutureStep;
    this.targetUptoFutureStep = state.targetUptoFutureStep;
    this.produceMs = state.produceMs ?? 0;
    for (const { name } of this.#tasks) {
      this.consumedSamples[name] = state.consumedSamples[name] ?? 0;
      this.targetSamples[name] = state.targetSamples[name] ?? 0;
      this.rewardSum[name] = state.rewardSum?.[name] ?? 0;
      this.rewardCount[name] = state.rewardCount?.[name] ?? 0;
      this.producedSamples[name] = state.producedSamples?.[name] ?? 0;
      this.producedTokens[name] = state.producedTokens?.[name] ?? 0;
    }
  }
}

/**
 * Production strategies: how groups are scheduled for one task until its share of the work is done.
 * Both run against `ProduceContext` (implemented by the Producer), which owns every count.
 *
 * Sync: start the task's share of the batch, top up while `in flight + completed < share`, drawing
 * the retry pools (EXPIRED, then ABORTED) before fresh prompts: a sync run expires leftovers of older
 * weights, and they must be generated again rather than left in the buffer for good.
 * Async (the reference's AsyncProduceStrategy): produce toward the cumulative target of the
 * producer's future step, with over-sampling, drawing EXPIRED (tail batch) and ABORTED groups
 * before fresh prompts; stop on a weight update (UPDATE_WEIGHT_AND_ABORT) or when the model is too
 * stale for the step (EXPIRED_BATCH).
 */
import { seqStaleness } from '../buffer/staleness.ts';

export type ProduceStatus = 'NORMAL' | 'UPDATE_WEIGHT_AND_ABORT' | 'EXPIRED_BATCH';

/** `should_continue_fn`: keep producing while this is true. */
export type ShouldContinue = (available: number, target: number) => boolean;
export const defaultShouldContinue: ShouldContinue = (available, target) => available < target;

export interface ProduceContext {
  shouldAbort(): boolean;
  /** Draw one group (from the retry pools in `fromExpiredPool` order, else a fresh prompt) and run it. */
  spawn(task: string, fromExpiredPool: boolean): void;
  inFlight(task: string): number;
  /** COMPLETED groups of the task in the buffer. */
  completed(task: string): number;
  expired(task: string): number;
  /** consumed + COMPLETED in the buffer (absolute, cumulative). */
  available(task: string): number;
  target(task: string): number;
  /** Whether one more group fits the memory budget (buffer + in flight). */
  hasRoom(): boolean;
  /**
   * New dispatches are held: the inference servers are down (coordinator/outage.ts). A strategy waits
   * for a landing instead of dispatching; the end of the outage wakes it like one.
   */
  holding(): boolean;
  /** Rejects when too many groups failed since the last batch. */
  checkFailures(task: string): void;
  /** Resolves when any group lands. */
  landed(): Promise<void>;
  /** Weights the servers generate with: the engine's model step, or older when the servers report older. */
  readonly servingModelStep: number;
  readonly futureStep: number;
}

/** What the producer asks of a strategy: schedule one task's groups until its share of the work is done. */
export interface ProduceStrategy {
  produce(ctx: ProduceContext, task: string, share: number): Promise<ProduceStatus>;
}

export class SyncStrategy implements ProduceStrategy {
  readonly #shouldContinue: ShouldContinue;

  constructor(shouldContinue: ShouldContinue = defaultShouldContinue) {
    this.#shouldContinue = shouldContinue;
  }

  async produce(ctx: ProduceContext, task: string, share: number): Promise<ProduceStatus> {
    while (this.#shouldContinue(ctx.completed(task), share)) {
      ctx.checkFailures(task);
      if (ctx.shouldAbort()) return 'UPDATE_WEIGHT_AND_ABORT';
      while (ctx.inFlight(task) + ctx.completed(task) < share && ctx.hasRoom() && !ctx.holding()) ctx.spawn(task, true);
      if (ctx.inFlight(task) === 0 && !ctx.holding()) break;
      await ctx.landed();
    }
    return 'NORMAL';
  }
}

export interface AsyncStrategyOptions {
  overSampleThreshold: number;
  /**
   * Staleness from which weights are too old to produce with: the lower of the expiry threshold,
   * (maxStaleness + 1) × syncWeightsInterval, and the token-level one; Infinity = never.
   */
  produceThreshold: number;
  tailBatchTriggerSize: number;
  shouldContinue?: ShouldContinue;
}

export class AsyncStrategy implements ProduceStrategy {
  readonly #options: AsyncStrategyOptions;
  readonly #shouldContinue: ShouldContinue;

  constructor(options: AsyncStrategyOptions) {
    this.#options = options;
    this.#shouldContinue = options.shouldContinue ?? defaultShouldContinue;
  }

  /** Too stale to produce for `trainStep` with weights `modelStep`: the trainer must sync first. */
  isModelExpired(trainStep: number, modelStep: number): boolean {
    return seqStaleness(modelStep, trainStep) >= this.#options.produceThreshold;
  }

  /** Whether new work is drawn from the EXPIRED pool, and whether over-sampling is off (tail batch). */
  mode(expiredCount: number): { fromExpiredPool: boolean; tailBatch: boolean } {
    const trigger = this.#options.tailBatchTriggerSize;
    const tailBatch = trigger > 0 && expiredCount >= trigger;
    return { fromExpiredPool: trigger === 0 || tailBatch, tailBatch };
  }

  oversample(share: number, tailBatch: boolean): number {
    // Plain IEEE doubles, as the reference computes it: 0.14 × 50 is 7.000000000000001, so 8 groups.
    // Forgiving the rounding would make the two disagree on how many groups a round schedules.
    return tailBatch ? 0 : Math.ceil(this.#options.overSampleThreshold * share);
  }

  async produce(ctx: ProduceContext, task: string, share: number): Promise<ProduceStatus> {
    const target = ctx.target(task);
    if (target <= 0) return 'NORMAL';
    const { fromExpiredPool, tailBatch } = this.mode(ctx.expired(task));
    // The target is fixed for this round; over-sampling adds a fixed budget on top (none in tail-batch mode).
    const scheduled = target + this.oversample(share, tailBatch);
    for (;;) {
      if (ctx.shouldAbort()) return 'UPDATE_WEIGHT_AND_ABORT';
      if (this.isModelExpired(ctx.futureStep, ctx.servingModelStep)) return 'EXPIRED_BATCH';
      ctx.checkFailures(task);
      const available = ctx.available(task);
      if (!this.#shouldContinue(available, target)) return 'NORMAL';
      // Over the memory budget it stops scheduling: the loop below waits for groups to land and be taken.
      while (available + ctx.inFlight(task) < scheduled && !ctx.shouldAbort() && ctx.hasRoom() && !ctx.holding())
        ctx.spawn(task, fromExpiredPool);
      if (ctx.inFlight(task) === 0 && !ctx.holding()) return 'NORMAL';
      await ctx.landed();
    }
  }
}

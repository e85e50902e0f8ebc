/**
 * Production strategies: how groups are scheduled for one task until its share of the work is done,
 * and every other way sync and async production differ — the producer (./producer.ts) asks its
 * strategy and never branches on the strategy's name. Both run against `ProduceContext` (implemented
 * by the Producer), which owns every count.
 *
 * Sync: produces inside getBatch. Start the task's share of the batch, top up while `in flight +
 * completed < share`, drawing the ABORTED pool before fresh prompts. Staleness 0, measured against the
 * weights being served: a leftover of older weights expires and is dropped (counted EXPIRED), as
 * xtuner's sync tasks drop theirs (docs/ARCHITECTURE.md, "Staleness"); `tailBatchTriggerSize` is
 * async's. The EXPIRED pool is still drawn first, so that groups a checkpoint stored there before
 * sync dropped them are generated again rather than left in the buffer for good.
 * Async (the reference's AsyncProduceStrategy): produces in the background (onStart) toward the
 * cumulative target of the producer's future step, with over-sampling, drawing EXPIRED (tail batch)
 * and ABORTED groups before fresh prompts; stop on a weight update (UPDATE_WEIGHT_AND_ABORT) or when
 * the model is too stale for the step (EXPIRED_BATCH). Staleness measured at the trainer's step.
 *
 *                           Sync                          Async
 *   expiry measured at      serving model step + 1        the consumer's train step
 *   expiry threshold        1 (maxStaleness 0)            (maxStaleness + 1) × syncWeightsInterval;
 *                                                         never with staleRollouts keep
 *   model too stale         never                         at the produce threshold
 *   onStart                 nothing                       the background loop
 *   produceFor (getBatch)   every task's share, here      nothing: the loop produces
 *   between attempts        stalled if nothing was sent   wait for a landing
 *   fresh on landing        dispatched this epoch         never: measured on every landing
 *   expired groups          dropped                       retried when tailBatchTriggerSize ≥ 0
 */
import { seqStaleness, staleThreshold } from '../buffer/staleness.ts';
import { DeadlineAdmission, type AdmissionStats } from './admission.ts';
import type { ResolvedConfig } from '../config.ts';
import type { Logger } from '../log.ts';
import type { ProducerState } from './producer-state.ts';
import type { ProduceProgress } from './progress.ts';

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
  readonly producerFutureStep: number;
}

/** What a strategy's part of getBatch and its background production see of the producer besides ProduceContext. */
export interface ProducerHandle {
  readonly progress: ProduceProgress;
  readonly log: Logger;
  /** The lifecycle state now (./producer-state.ts). */
  state(): ProducerState;
  /** Groups dispatched so far, fresh and retried. */
  dispatched(): number;
  inFlightTotal(): number;
  /** Resolves on the background loop's next wake-up (it is the only waiter): the consumer moved, a resume, close, groups put back. */
  changed(): Promise<void>;
  /** Wake a getBatch waiting for landings, so it re-checks (e.g. learns that none are coming). */
  wakeConsumer(): void;
}

/** What the producer asks of a strategy: how to schedule, when to produce, how to measure staleness. */
export interface ProduceStrategy {
  /** Staleness from which a stored group expires (the ExpiryPolicy threshold). */
  readonly expiryThreshold: number;
  /** Whether an expired group is kept, its expired members reset, to be generated again (else dropped and counted). */
  readonly expiredRetryable: boolean;
  /**
   * The stale threshold a taken batch's rollouts are counted against at the train step
   * (BatchStats.staleness.pastThreshold); Infinity where staleness is not measured there.
   */
  readonly staleThreshold: number;
  /** The train step staleness is measured at when the consumer is at `trainStep` and the servers serve `servingModelStep`. */
  expiryStep(trainStep: number, servingModelStep: number): number;
  /** Whether a group landing now is stored without the expiry check (`dispatchEpoch`: the resume epoch of its dispatch). */
  freshOnLanding(dispatchEpoch: number, epoch: number): boolean;
  /** Too stale to produce for `trainStep` with weights `modelStep`: the trainer must sync first. */
  isModelExpired(trainStep: number, modelStep: number): boolean;
  /** Producer.start(): the background production, settled once the producer closes; null when there is none. */
  onStart(ctx: ProduceContext, producer: ProducerHandle): Promise<void> | null;
  /** getBatch's own production for the consumer's step, before each attempt to take the batch; null: none (not even a tick). */
  produceFor(
    ctx: ProduceContext,
    producer: ProducerHandle,
    shares: ReadonlyMap<string, number>,
  ): Promise<ProduceStatus> | null;
  /** The batch is not complete after an attempt: true when it never will be (nothing more is being produced). */
  stalled(ctx: ProduceContext, producer: ProducerHandle, dispatchedBefore: number): boolean;
  /** Between two attempts to take the batch; null: try again at once. */
  nextAttempt(ctx: ProduceContext): Promise<void> | null;
  /** Schedule one task's groups until its share of the work is done. */
  produce(ctx: ProduceContext, task: string, share: number): Promise<ProduceStatus>;
  /** A dispatched group landed `ms` after it was sent (the admission's lifetime figure). */
  observeLanding(ms: number): void;
  /** The trainer took the batch of `trainStep` now (on the clock the admission decides by). */
  observeTake(trainStep: number): void;
  /** The deadline admission's figures; null without it. */
  admissionStats(): AdmissionStats | null;
}

/** The strategy `producer.strategy` names, with its thresholds from the config. */
export function createStrategy(config: ResolvedConfig, shouldContinue?: ShouldContinue): ProduceStrategy {
  const p = config.producer;
  if (p.strategy === 'sync') return new SyncStrategy(shouldContinue);
  const threshold = staleThreshold(p.maxStaleness, p.syncWeightsInterval);
  return new AsyncStrategy({
    overSampleThreshold: p.overSampleThreshold,
    staleThreshold: threshold,
    // Kept stale rollouts never expire for their age: the threshold then bounds production alone.
    expiryThreshold: p.staleRollouts === 'keep' ? Infinity : threshold,
    // Producing for a step is pointless once its samples would expire on arrival — or have every token
    // masked by the token-level threshold: either bound makes the weights too stale for the step. With
    // stale rollouts kept it is the admission bound: production runs at most this far ahead.
    produceThreshold: Math.min(threshold, p.tokenStalenessThreshold ?? Infinity),
    tailBatchTriggerSize: p.tailBatchTriggerSize,
    shouldContinue,
    admission: p.admission === 'deadline' ? new DeadlineAdmission(p.admissionQuantile) : null,
  });
}

export class SyncStrategy implements ProduceStrategy {
  /** Sync means staleness 0: the threshold of maxStaleness 0 (and syncWeightsInterval 1). */
  readonly expiryThreshold = staleThreshold(0, 1);
  /**
   * A leftover of older weights is dropped, not generated again from its prompt: xtuner's sync tasks
   * have no tail-batch trigger and so never retry expired groups (ReplayBuffer.put and
   * refresh_staleness discard them), and a sync run here takes the same prompts per step as there.
   */
  readonly expiredRetryable = false;
  /** Measured against the served weights, not the train step: a trainer that pushes none is never stale. */
  readonly staleThreshold = Infinity;
  readonly #shouldContinue: ShouldContinue;

  constructor(shouldContinue: ShouldContinue = defaultShouldContinue) {
    this.#shouldContinue = shouldContinue;
  }

  /**
   * Measured against the step the served weights make batches for (serving model step + 1): a leftover
   * of older weights expires instead of being served off-policy, while a run whose trainer never pushes
   * weights is never stale.
   */
  expiryStep(_trainStep: number, servingModelStep: number): number {
    return servingModelStep + 1;
  }

  /**
   * A group dispatched since the latest resume was generated by the weights being served, and its
   * leftovers of older weights expired when the resume refreshed the buffer. Measuring it again would
   * expire the work of a server that reports an older version than its peers (several endpoints) on
   * every landing; such versions are reported, not regenerated.
   */
  freshOnLanding(dispatchEpoch: number, epoch: number): boolean {
    return dispatchEpoch === epoch;
  }

  /** Sync measures against the weights it produces with, which are never too stale for themselves. */
  isModelExpired(): boolean {
    return false;
  }

  onStart(): null {
    return null;
  }

  async produceFor(
    ctx: ProduceContext,
    producer: ProducerHandle,
    shares: ReadonlyMap<string, number>,
  ): Promise<ProduceStatus> {
    const start = performance.now();
    const results = await Promise.allSettled([...shares].map(([task, share]) => this.produce(ctx, task, share)));
    const failure = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failure !== undefined) throw failure.reason;
    producer.progress.produceMs += performance.now() - start;
    const statuses = results.map((r) => (r as PromiseFulfilledResult<ProduceStatus>).value);
    return statuses.includes('UPDATE_WEIGHT_AND_ABORT') ? 'UPDATE_WEIGHT_AND_ABORT' : 'NORMAL';
  }

  /** produceFor returned without the batch and sent nothing more: a memory budget, or a shouldContinue hook, stopped it. */
  stalled(_ctx: ProduceContext, producer: ProducerHandle, dispatchedBefore: number): boolean {
    return producer.dispatched() === dispatchedBefore;
  }

  /** The next produceFor tops up at once. */
  nextAttempt(): null {
    return null;
  }

  /** Sync admits every group the batch needs. */
  observeLanding(): void {}

  observeTake(): void {}

  admissionStats(): null {
    return null;
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
  /** staleThreshold(maxStaleness, syncWeightsInterval); default: `expiryThreshold`. */
  staleThreshold?: number;
  /** staleThreshold(maxStaleness, syncWeightsInterval), Infinity when stale rollouts are kept; default: `produceThreshold`. */
  expiryThreshold?: number;
  /**
   * Staleness from which weights are too old to produce with: the lower of the expiry threshold,
   * (maxStaleness + 1) × syncWeightsInterval, and the token-level one; Infinity = never.
   */
  produceThreshold: number;
  tailBatchTriggerSize: number;
  shouldContinue?: ShouldContinue;
  /**
   * `producer.admission: deadline`: groups beyond what the trainer's next batch needs are started
   * only when predicted to be taken before they pass the bound (./admission.ts); null: all at once.
   */
  admission?: DeadlineAdmission | null;
  /** The clock the admission reads, ms; default performance.now. */
  now?: () => number;
}

export class AsyncStrategy implements ProduceStrategy {
  readonly expiryThreshold: number;
  readonly staleThreshold: number;
  /** −1 drops expired groups; 0 retries them whenever any exist; N > 0 in tail-batch mode. */
  readonly expiredRetryable: boolean;
  readonly #options: AsyncStrategyOptions;
  readonly #shouldContinue: ShouldContinue;
  readonly #admission: DeadlineAdmission | null;
  readonly #now: () => number;
  /** Fresh dispatches the deadline admission held back (a round that stopped short counts once). */
  held = 0;

  constructor(options: AsyncStrategyOptions) {
    this.#options = options;
    this.#admission = options.admission ?? null;
    this.#now = options.now ?? (() => performance.now());
    this.expiryThreshold = options.expiryThreshold ?? options.produceThreshold;
    this.staleThreshold = options.staleThreshold ?? this.expiryThreshold;
    this.expiredRetryable = options.tailBatchTriggerSize >= 0;
    this.#shouldContinue = options.shouldContinue ?? defaultShouldContinue;
  }

  /** Measured against the trainer's step. */
  expiryStep(trainStep: number): number {
    return trainStep;
  }

  /** Every landing is measured: the consumer may have moved on while the group was out. */
  freshOnLanding(): boolean {
    return false;
  }

  onStart(ctx: ProduceContext, producer: ProducerHandle): Promise<void> {
    return this.#run(ctx, producer);
  }

  /** The background loop produces; getBatch only waits for it. */
  produceFor(): null {
    return null;
  }

  /** Nothing in flight and no room for more: the memory budget cannot hold the batch. */
  stalled(ctx: ProduceContext, producer: ProducerHandle): boolean {
    return producer.inFlightTotal() === 0 && !ctx.hasRoom();
  }

  nextAttempt(ctx: ProduceContext): Promise<void> {
    return ctx.landed();
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

  observeLanding(ms: number): void {
    this.#admission?.landed(ms);
  }

  observeTake(trainStep: number): void {
    this.#admission?.taken(trainStep, this.#now());
  }

  admissionStats(): AdmissionStats | null {
    const a = this.#admission;
    if (a === null) return null;
    return { quantile: a.quantile, held: this.held, predictedLifetimeMs: a.predictedLifetimeMs(), stepMs: a.stepMs };
  }

  /**
   * Whether one more group of `task` may start now. Without deadline admission, always. With it, a
   * group the trainer's next batch needs (the task's COMPLETED and in-flight groups short of its
   * share) always starts — so pacing never stalls a batch — and one beyond it only when predicted to
   * be taken before it passes the bound (./admission.ts).
   */
  admits(ctx: ProduceContext, task: string, share: number): boolean {
    if (this.#admission === null) return true;
    if (ctx.completed(task) + ctx.inFlight(task) < share) return true;
    return this.#admission.decide(this.#now(), ctx.servingModelStep, this.expiryThreshold).admit;
  }

  async produce(ctx: ProduceContext, task: string, share: number): Promise<ProduceStatus> {
    const target = ctx.target(task);
    if (target <= 0) return 'NORMAL';
    const { fromExpiredPool, tailBatch } = this.mode(ctx.expired(task));
    // The target is fixed for this round; over-sampling adds a fixed budget on top (none in tail-batch mode).
    const scheduled = target + this.oversample(share, tailBatch);
    for (;;) {
      if (ctx.shouldAbort()) return 'UPDATE_WEIGHT_AND_ABORT';
      if (this.isModelExpired(ctx.producerFutureStep, ctx.servingModelStep)) return 'EXPIRED_BATCH';
      ctx.checkFailures(task);
      const available = ctx.available(task);
      if (!this.#shouldContinue(available, target)) return 'NORMAL';
      // Over the memory budget it stops scheduling: the loop below waits for groups to land and be taken.
      while (available + ctx.inFlight(task) < scheduled && !ctx.shouldAbort() && ctx.hasRoom() && !ctx.holding()) {
        if (!this.admits(ctx, task, share)) {
          this.held++;
          break;
        }
        ctx.spawn(task, fromExpiredPool);
      }
      if (ctx.inFlight(task) === 0 && !ctx.holding()) return 'NORMAL';
      await ctx.landed();
    }
  }

  /**
   * Background production: one round per task toward the future step's targets, then the next step
   * while the weights are fresh enough for it; parks (producer.changed()) while paused, too stale, or
   * stopped by failures, until the consumer moves, a resume or close.
   */
  async #run(ctx: ProduceContext, producer: ProducerHandle): Promise<void> {
    const { progress } = producer;
    for (;;) {
      const state = producer.state();
      if (state === 'closing' || state === 'closed') return;
      if (state !== 'running') {
        await producer.changed();
        continue;
      }
      const future = progress.producerFutureStep;
      if (this.isModelExpired(future, ctx.servingModelStep)) {
        producer.wakeConsumer(); // a getBatch waiting for groups must learn that none are coming
        await producer.changed();
        continue;
      }
      progress.ensureTargetUpto(future);
      const start = performance.now();
      let statuses: ProduceStatus[];
      try {
        statuses = await Promise.all([...progress.shares()].map(([task, share]) => this.produce(ctx, task, share)));
      } catch (err) {
        // Too many failures: stop scheduling until a getBatch reports it and the counter is reset.
        producer.log.error({ err: (err as Error).message }, 'production stopped');
        producer.wakeConsumer();
        await producer.changed();
        continue;
      } finally {
        progress.produceMs += performance.now() - start;
      }
      if (statuses.includes('UPDATE_WEIGHT_AND_ABORT')) continue;
      if (statuses.includes('EXPIRED_BATCH')) continue; // re-checked at the top of the loop
      // The round measured `future` only. A getBatch that pulled the future step forward during it
      // (beginConsume) left a step whose targets are not set yet: start over from the top for that one.
      if (progress.producerFutureStep !== future) continue;
      // A round also ends short of its targets when nothing is in flight and nothing may be sent (the
      // memory budget is full): only a batch taken frees room, and it wakes changed(). Running ahead
      // from there would set the next step's targets without a group having landed, in a loop of
      // microtasks only — regression: with maxStaleness 100000 it ran 100000 empty steps ahead while
      // no timer, I/O or signal could run (SIGTERM unheard), and maxStaleness has no upper bound.
      // Each step ahead now needs its targets met, so each waits on groups that really land.
      if (!this.#targetsMet(ctx, progress)) await producer.changed();
      // This step's targets are met: run ahead one step while the weights are fresh enough for it.
      else if (!this.isModelExpired(future + 1, ctx.servingModelStep)) progress.advanceFutureStep(future);
      else await producer.changed();
    }
  }

  /**
   * Every task has what the future step's targets ask: its groups are there, or a shouldContinue hook
   * stopped it (the test `produce` stops on). A hook that asks for more than the target, or stops
   * short of it, runs ahead as before; only a task short of its target that its hook wants more for
   * — which a round returns with only when nothing could be sent — holds the loop.
   */
  #targetsMet(ctx: ProduceContext, progress: ProduceProgress): boolean {
    for (const [task] of progress.shares()) {
      const available = ctx.available(task);
      const target = ctx.target(task);
      if (available < target && this.#shouldContinue(available, target)) return false;
    }
    return true;
  }
}

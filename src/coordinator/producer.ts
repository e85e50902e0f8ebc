/**
 * The producer: schedules groups on the worker pool, lands finished groups in the replay buffer, and
 * serves batches, weight-update pauses and checkpoints. Everything here runs on the main thread;
 * the strategies (./strategies.ts) decide *what* to schedule, this class owns the bookkeeping.
 *
 * Invariants (checked by the property test):
 * - every group drawn from a sampler is, at any moment, in exactly one place: in flight (`#inFlight`),
 *   stored in the buffer, taken by the trainer, or dropped (FAILED / FILTERED / EXPIRED) and counted:
 *   `counts.scheduled = inFlight + stored + taken + dropped`;
 * - a group lands (`#land`) exactly once per dispatch: the pool's runGroup never rejects, and the
 *   `then` callback runs atomically on this thread, so no claim protocol is needed;
 * - groups never leave the buffer except through `take` (to the trainer) or `spawn` (back in flight).
 */
import type { ResolvedConfig } from '../config.ts';
import {
  emptyDropCounts,
  ReplayBuffer,
  type BufferSnapshot,
  type DropReason,
  type ExpiryPolicy,
} from '../buffer/replay-buffer.ts';
import type { Sampler } from '../buffer/sampler.ts';
import { rolloutStaleness, staleThreshold, tokenLossMask } from '../buffer/staleness.ts';
import { InferenceAborter, type AbortRoute, type AbortTarget } from '../llm/client.ts';
import { DIALECTS } from '../llm/servers.ts';
import { MAX_WEIGHT_VERSION_LENGTH } from '../llm/reply.ts';
import type { Logger } from '../log.ts';
import { preview, RolloutEngineError } from '../protocol/errors.ts';
import { wallClockUs } from '../protocol/control-block.ts';
import {
  approxGroupBytes,
  dispatchTokenCount,
  groupError,
  groupStatus,
  resetToPrompt,
  responseTokenCount,
  Status,
  type RolloutGroup,
} from '../protocol/rollout.ts';
import { Notifier, WakeUp } from './notifier.ts';
import { OutageMonitor, type OutageObserver, type OutageStats } from './outage.ts';
import type { PauseControl } from './pause-control.ts';
import { ProduceProgress, type ProgressState } from './progress.ts';
import {
  AsyncStrategy,
  SyncStrategy,
  type ProduceContext,
  type ProduceStatus,
  type ShouldContinue,
} from './strategies.ts';
import type { WorkerPool } from './worker-pool.ts';

/** Cumulative group counts since the run started. */
export interface GroupCounts {
  /** Fresh groups drawn from the samplers. */
  scheduled: number;
  /** Groups sent again from the ABORTED / EXPIRED pools. */
  retried: number;
  inFlight: number;
  /** Landings by the status the group came back with (a retried group lands more than once). */
  landed: Record<Status, number>;
  /** COMPLETED groups handed to the trainer. */
  taken: number;
  dropped: Record<DropReason, number>;
}

export interface BatchStats {
  groups: number;
  rollouts: number;
  meanReward: number;
  /** Agent turns (inference calls) in the batch's rollouts. */
  turns: number;
  responseTokens: number;
  /** Staleness of the batch's rollouts at this train step. */
  staleness: { min: number; max: number; mean: number };
  /** Tokens masked out of the loss by the token-level staleness threshold. */
  maskedTokens: number;
  /**
   * Since the previous batch: groups produced per task (every status, a retried group each time it
   * lands) and the response tokens generated for them (each token once, in the dispatch that made it).
   */
  producedSamples: Record<string, number>;
  producedTokens: Record<string, number>;
  /** Since the previous batch: mean reward of COMPLETED groups as generated (before filtering). */
  rawMeanReward: Record<string, number | null>;
  produceMs: number;
  byTask: Record<string, { groups: number; meanReward: number }>;
}

/**
 * NORMAL: `groups` holds the batch. UPDATE_WEIGHT_AND_ABORT: a weight update is in progress — resume,
 * then ask again. EXPIRED_BATCH: the weights are too stale to produce this step — sync the weights
 * (pause, load, resume), then ask again. Both of the latter come with no groups.
 */
export type Batch =
  | { trainStep: number; status: 'NORMAL'; groups: RolloutGroup[]; stats: BatchStats }
  | { trainStep: number; status: 'UPDATE_WEIGHT_AND_ABORT' | 'EXPIRED_BATCH'; groups: []; stats: null };

/** While groups are still out after a server-side abort, it is sent again this often (see pause()). */
const SERVER_ABORT_REPEAT_MS = 50;

export interface PauseReport {
  /**
   * From the request until every worker stopped issuing inference calls: the time of the last call any
   * worker sent after the request (0 when none was). Null when the workers did not acknowledge in time.
   */
  workersStoppedMs: number | null;
  /** From the request until every worker's event loop had run its pause watcher (a busy loop delays this). */
  workersAckedMs: number | null;
  /** From the request until every group in flight was back on the main thread. */
  allBackMs: number;
  groupsBack: number;
  serverAbort: boolean;
  /** In-flight calls were cancelled client-side (abort mode without a server abort, or the timeout). */
  cancelled: boolean;
  /** Groups still running when the pause gave up waiting (they land later; none is lost). */
  stillInFlight: number;
}

export interface ProducerHooks {
  /** `is_valid_sample_fn`: false turns a COMPLETED group FILTERED. */
  isValidGroup?: (group: RolloutGroup) => boolean;
  shouldContinue?: ShouldContinue;
}

/** Told about what happens to groups, for metrics; every call is synchronous and must be cheap. */
export interface ProducerObserver extends OutageObserver {
  /** A group came back from the workers; `sent` is the group as it was dispatched. */
  landed?(group: RolloutGroup, sent: RolloutGroup): void;
  taken?(groups: readonly RolloutGroup[], trainStep: number): void;
  dropped?(group: RolloutGroup, reason: DropReason): void;
  /** Response tokens thrown away: a member reset to its prompt, or a group dropped. */
  discarded?(tokens: number): void;
  paused?(report: PauseReport): void;
}

export interface ProducerSnapshot {
  modelStep: number;
  progress: ProgressState;
  buffer: BufferSnapshot;
  samplers: Record<string, number>;
  counts: GroupCounts;
  /** Groups in flight at snapshot time, as they were sent: restored as ABORTED, to run again. */
  inFlight: RolloutGroup[];
  /** The last batch handed out: asking for its train step again gets it again (delivery survives a crash). */
  lastBatch: Extract<Batch, { status: 'NORMAL' }> | null;
}

export function emptyStatusCounts(): Record<Status, number> {
  return { INIT: 0, COMPLETED: 0, ABORTED: 0, EXPIRED: 0, FAILED: 0, FILTERED: 0 };
}

export function emptyGroupCounts(): GroupCounts {
  return { scheduled: 0, retried: 0, inFlight: 0, landed: emptyStatusCounts(), taken: 0, dropped: emptyDropCounts() };
}

/** The built-in filter: a group whose rewards are all equal carries no GRPO signal. */
export function hasRewardSpread(group: RolloutGroup): boolean {
  const first = group.rollouts[0]?.reward;
  return group.rollouts.some((r) => r.reward !== first);
}

export class Producer implements ProduceContext {
  readonly progress: ProduceProgress;
  readonly buffer: ReplayBuffer;
  /** Every count but `inFlight`, which is derived (the `counts` getter). */
  readonly #counts: GroupCounts = emptyGroupCounts();
  readonly #config: ResolvedConfig;
  readonly #pool: WorkerPool;
  readonly #control: PauseControl;
  readonly #samplers: Map<string, Sampler>;
  readonly #log: Logger;
  /**
   * Every inference endpoint (the default policy's and the agents' own), deduplicated, with its
   * abort-all route: what a pause aborts. Endpoints without one are cancelled client-side.
   */
  readonly #abortTargets: AbortTarget[];
  readonly #endpointCount: number;
  readonly #observer: ProducerObserver;
  readonly #isValidGroup: ((group: RolloutGroup) => boolean) | null;
  readonly #sync: SyncStrategy;
  readonly #async: AsyncStrategy;
  readonly #threshold: number;
  readonly #produceThreshold: number;
  /** Group id → the group as it was sent; the result replaces it when it lands. */
  readonly #inFlight = new Map<string, RolloutGroup>();
  readonly #inFlightByTask = new Map<string, number>();
  /** Wakes whoever waits for a group to land (strategies, getBatch, pause). */
  readonly #landed = new Notifier();
  /** Wakes the background loop (its only waiter): consumer moved, resume, close, groups put back. */
  readonly #changed = new WakeUp();
  #modelStep: number;
  #paused = false;
  #closed = false;
  #loop: Promise<void> | null = null;
  #failedSinceBatch = 0;
  #lastBatch: Extract<Batch, { status: 'NORMAL' }> | null = null;
  /** Newest weight version seen on tokens generated since the last resume (null: none yet). */
  #reportedModelStep: number | null = null;
  /** Moving average of landed groups' approximate bytes (memory budget). */
  #meanGroupBytes = 4096;
  /** Counts resumes; a group dispatched before the latest one says nothing about the new weights. */
  #resumeEpoch = 0;
  #lastFailure: string | null = null;
  /** Created on the first server-side abort; keeps its connections for the next pauses. */
  #aborter: InferenceAborter | null = null;
  /** Whether the inference servers are down: holds dispatches, decides what outage-aborted groups land as. */
  readonly #outage: OutageMonitor;

  constructor(options: {
    config: ResolvedConfig;
    pool: WorkerPool;
    control: PauseControl;
    samplers: Map<string, Sampler>;
    log: Logger;
    endpoints: string[];
    /** Each endpoint's abort-all route as probed at start (llm/servers.ts); default: from `llm.abortPath`. */
    abortRoutes?: ReadonlyMap<string, AbortRoute | null>;
    hooks?: ProducerHooks;
    observer?: ProducerObserver;
  }) {
    const { config } = options;
    this.#config = config;
    this.#pool = options.pool;
    this.#control = options.control;
    this.#samplers = options.samplers;
    this.#log = options.log;
    const configured: AbortRoute | null =
      config.llm.abortPath === null
        ? null
        : { path: config.llm.abortPath ?? DIALECTS.generic.abort!.path, body: DIALECTS.generic.abort!.body };
    this.#abortTargets = options.endpoints.flatMap((url) => {
      const route = options.abortRoutes?.has(url) ? options.abortRoutes.get(url)! : configured;
      return route === null ? [] : [{ url, route }];
    });
    this.#endpointCount = options.endpoints.length;
    this.#outage = new OutageMonitor({
      endpoints: options.endpoints,
      budgetMs: config.llm.outageBudgetMs,
      apiKey: config.llm.apiKey,
      log: options.log,
      observer: options.observer,
      onChange: () => {
        this.#landed.notify();
        this.#changed.notify();
      },
    });
    this.#modelStep = config.modelStep;
    this.progress = new ProduceProgress(config.tasks, config.batchSize);
    this.buffer = new ReplayBuffer(config.tasks.map((t) => t.name));
    this.#observer = options.observer ?? {};
    this.buffer.onDrop = (group, reason) => {
      this.#counts.dropped[reason]++;
      this.#observer.dropped?.(group, reason);
    };
    this.buffer.onReset = (tokens) => this.#observer.discarded?.(tokens);
    for (const task of config.tasks) this.#inFlightByTask.set(task.name, 0);
    const p = config.producer;
    this.#isValidGroup = options.hooks?.isValidGroup ?? (p.filter === 'drop-equal-rewards' ? hasRewardSpread : null);
    // Sync means staleness 0: the threshold of maxStaleness 0, measured against the weights being
    // served (#expiry), so a leftover of older weights expires instead of being served off-policy.
    this.#threshold =
      p.strategy === 'async' ? staleThreshold(p.maxStaleness, p.syncWeightsInterval) : staleThreshold(0, 1);
    // Producing for a step is pointless once its samples would expire on arrival — or have every token
    // masked by the token-level threshold: either bound makes the weights too stale for the step. Sync
    // measures against the weights it produces with, which are never too stale for themselves.
    this.#produceThreshold =
      p.strategy === 'async' ? Math.min(this.#threshold, p.tokenStalenessThreshold ?? Infinity) : Infinity;
    this.#sync = new SyncStrategy(options.hooks?.shouldContinue);
    this.#async = new AsyncStrategy({
      overSampleThreshold: p.overSampleThreshold,
      produceThreshold: this.#produceThreshold,
      tailBatchTriggerSize: p.tailBatchTriggerSize,
      shouldContinue: options.hooks?.shouldContinue,
    });
  }

  get modelStep(): number {
    return this.#modelStep;
  }

  /**
   * The engine's model step, unless the servers report generating with older weights (a resume whose
   * weights did not load): then theirs. Staleness decisions use this, so stale servers stop production
   * with EXPIRED_BATCH instead of a loop of groups that expire on arrival.
   */
  get servingModelStep(): number {
    return this.#reportedModelStep === null ? this.#modelStep : Math.min(this.#modelStep, this.#reportedModelStep);
  }

  get futureStep(): number {
    return this.progress.producerFutureStep;
  }

  /** A copy of the counts, `inFlight` being the groups in flight right now. */
  get counts(): GroupCounts {
    return { ...structuredClone(this.#counts), inFlight: this.#inFlight.size };
  }

  get paused(): boolean {
    return this.#paused;
  }

  get inFlightTotal(): number {
    return this.#inFlight.size;
  }

  get outage(): OutageStats {
    return this.#outage.stats();
  }

  /** Start background production (async strategy); the sync strategy produces inside getBatch. */
  start(): void {
    if (this.#config.producer.strategy === 'async' && this.#loop === null) this.#loop = this.#runAsync();
  }

  // ── ProduceContext ────────────────────────────────────────────────────────────────────────────

  shouldAbort(): boolean {
    return this.#paused || this.#closed;
  }

  spawn(task: string, fromExpiredPool: boolean): void {
    let group = this.buffer.takeForRetry(
      task,
      fromExpiredPool ? [Status.EXPIRED, Status.ABORTED] : [Status.ABORTED],
      this.#config.producer.takeOrder,
    );
    if (group !== null) {
      this.#counts.retried++;
      // Time an interrupted rollout waited (paused, then queued for a retry) counts as paused time.
      const now = Date.now();
      for (const r of group.rollouts)
        if (r.status === Status.ABORTED && r.timings.finishedAt > 0) r.timings.pausedMs += now - r.timings.finishedAt;
    } else {
      group = this.#samplers.get(task)!.draw();
      this.#counts.scheduled++;
    }
    this.#dispatch(group);
  }

  inFlight(task: string): number {
    return this.#inFlightByTask.get(task)!;
  }

  completed(task: string): number {
    return this.buffer.count(task, Status.COMPLETED);
  }

  expired(task: string): number {
    return this.buffer.count(task, Status.EXPIRED);
  }

  available(task: string): number {
    return this.progress.consumedSamples[task] + this.completed(task);
  }

  target(task: string): number {
    return this.progress.targetSamples[task];
  }

  holding(): boolean {
    return this.#outage.holding;
  }

  hasRoom(): boolean {
    const budget = this.#config.producer.memoryBudgetBytes;
    if (budget === null) return true;
    // Groups in flight are counted at the average size of landed ones (their real size is not known yet).
    return this.buffer.bytes + (this.#inFlight.size + 1) * this.#meanGroupBytes <= budget;
  }

  checkFailures(task: string): void {
    const outage = this.#outage.spentError;
    if (outage !== null) throw outage;
    const max = this.#config.producer.maxFailedGroupsPerStep ?? 2 * this.#config.batchSize;
    if (this.#failedSinceBatch > max) {
      throw new RolloutEngineError(
        'ERR_TOO_MANY_FAILED_GROUPS',
        `task ${task}: ${this.#failedSinceBatch} groups failed since the last batch (producer.maxFailedGroupsPerStep = ${max}); last reason: ${this.#lastFailure}`,
      );
    }
  }

  landed(): Promise<void> {
    return this.#landed.wait();
  }

  /** A group landed, or `ms` passed. The timer is cleared either way: a pause wakes once per landing. */
  async #landedWithin(ms: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const elapsed = new Promise<void>((resolve) => (timer = setTimeout(resolve, Math.max(0, ms)).unref()));
    await Promise.race([this.#landed.wait(), elapsed]);
    clearTimeout(timer);
  }

  // ── dispatch and landing ──────────────────────────────────────────────────────────────────────

  #dispatch(group: RolloutGroup): void {
    this.#inFlight.set(group.id, group);
    this.#inFlightByTask.set(group.taskName, this.#inFlightByTask.get(group.taskName)! + 1);
    const epoch = this.#resumeEpoch;
    const dispatchedAt = this.#outage.now();
    void this.#pool.runGroup(group, this.#modelStep).then((result) => {
      // Still in flight until the servers have been asked whether they are down (coordinator/outage.ts).
      const settling = this.#outage.arrived(result, dispatchedAt);
      if (settling === null) this.#land(group, result, epoch);
      else void settling.then(() => this.#land(group, result, epoch));
    });
  }

  /** `epoch`: the resume count when the group was dispatched. */
  #land(sent: RolloutGroup, group: RolloutGroup, epoch: number): void {
    this.#inFlight.delete(sent.id);
    this.#inFlightByTask.set(sent.taskName, this.#inFlightByTask.get(sent.taskName)! - 1);
    group.status = groupStatus(group.rollouts);
    this.#counts.landed[group.status]++;
    if (this.#config.producer.memoryBudgetBytes !== null)
      this.#meanGroupBytes = 0.9 * this.#meanGroupBytes + 0.1 * approxGroupBytes(group);
    const task = group.taskName;
    // Only what this dispatch generated: a retried group's kept siblings and partial turns were counted when they landed.
    let tokens = 0;
    for (let i = 0; i < group.rollouts.length; i++) tokens += dispatchTokenCount(sent.rollouts[i], group.rollouts[i]);
    this.progress.addProduced(task, group.rollouts.length, tokens);
    if (group.status === Status.COMPLETED) {
      let sum = 0;
      for (const r of group.rollouts) sum += r.reward;
      this.progress.addRewards(task, sum, group.rollouts.length);
      if (this.#isValidGroup !== null && !this.#isValidGroup(group)) {
        for (const r of group.rollouts) r.status = Status.FILTERED;
        group.status = Status.FILTERED;
        group.error = 'filtered: the group validity filter rejected it';
      }
    } else if (group.status === Status.FAILED) {
      this.#failedSinceBatch++;
      this.#lastFailure = groupError(group) ?? 'unknown';
    }
    // A group dispatched before the latest resume says nothing about the new weights.
    if (epoch === this.#resumeEpoch) this.#noteReportedVersion(group, sent);
    this.#observer.landed?.(group, sent);
    // Sync: a group dispatched since the latest resume was generated by the weights being served, and
    // its leftovers of older weights expired when the resume refreshed the buffer. Measuring it again
    // would expire the work of a server that reports an older version than its peers (several
    // endpoints) on every landing; such versions are reported (#noteReportedVersion), not regenerated.
    const fresh = this.#config.producer.strategy === 'sync' && epoch === this.#resumeEpoch;
    this.buffer.put(group, fresh ? undefined : this.#expiry());
    this.#landed.notify();
  }

  #noteReportedVersion(group: RolloutGroup, sent: RolloutGroup): void {
    for (let i = 0; i < group.rollouts.length; i++) {
      const turns = group.rollouts[i].turns;
      const last = turns.at(-1);
      // Only a turn generated in this dispatch tells what the servers hold now.
      if (last === undefined || turns.length <= (sent.rollouts[i]?.turns.length ?? 0)) continue;
      if (this.#reportedModelStep === null || last.modelStep > this.#reportedModelStep) {
        if (last.modelStep < this.#modelStep && (this.#reportedModelStep ?? -1) < last.modelStep) {
          this.#log.warn(
            { served: last.modelStep, modelStep: this.#modelStep },
            'the inference servers report an older weight version than the engine resumed with: did the new weights load?',
          );
        }
        this.#reportedModelStep = last.modelStep;
      }
    }
  }

  /**
   * The expiry policy for `trainStep`. Async measures staleness against the trainer's step. Sync
   * measures it against the step the served weights make batches for (serving model step + 1): a
   * group from older weights expires, while a run whose trainer never pushes weights is never stale.
   */
  #expiry(trainStep = this.progress.nextConsumerStep): ExpiryPolicy {
    const p = this.#config.producer;
    const measuredAt = p.strategy === 'sync' ? this.servingModelStep + 1 : trainStep;
    return {
      trainStep: measuredAt,
      threshold: this.#threshold,
      tokenThreshold: p.tokenStalenessThreshold,
      retryable: p.tailBatchTriggerSize >= 0,
    };
  }

  // ── the consumer ──────────────────────────────────────────────────────────────────────────────

  async getBatch(trainStep: number): Promise<Batch> {
    // Asking again for the step just handed out (a trainer retrying after a lost reply, or restarted
    // after a crash) gets the same batch: a batch is delivered at least once and taken exactly once.
    if (this.#lastBatch !== null && this.#lastBatch.trainStep === trainStep) return this.#lastBatch;
    // Steps only go forward (a trainer may skip some). A step behind the consumer was handed out or
    // asked for already: another batch under its number would give the trainer two batches for one
    // step, and moving the consumer back would leave the async producer waiting for a step it has
    // passed (regression: it hung).
    const next = this.progress.nextConsumerStep;
    if (trainStep < next) {
      const last =
        this.#lastBatch === null
          ? ''
          : `; the last batch handed out, step ${this.#lastBatch.trainStep}, is delivered again when asked for`;
      throw new RolloutEngineError(
        'ERR_TRAIN_STEP',
        `train step ${trainStep} is behind the consumer, which is at step ${next}: steps only go forward${last}`,
      );
    }
    // Checked before the consumer moves: a step far ahead would otherwise become the consumer's step,
    // and every real step after it (and after a restart from the checkpoint) be behind.
    const { maxSkippedSteps } = this.#config.producer;
    if (trainStep - next > maxSkippedSteps) {
      throw new RolloutEngineError(
        'ERR_TRAIN_STEP',
        `train step ${trainStep} is too far ahead of the consumer, which is at step ${next}: at most producer.maxSkippedSteps (${maxSkippedSteps}) steps may be skipped, so the step must be at most ${next + maxSkippedSteps}`,
      );
    }
    const empty = (status: 'UPDATE_WEIGHT_AND_ABORT' | 'EXPIRED_BATCH'): Batch => ({
      trainStep,
      status,
      groups: [],
      stats: null,
    });
    if (this.#paused) return empty('UPDATE_WEIGHT_AND_ABORT');
    this.progress.beginConsume(trainStep);
    this.buffer.refresh(this.#expiry(trainStep));
    this.#changed.notify(); // the consumer moved: the background loop re-checks its targets
    const shares = this.progress.shares();
    const sync = this.#config.producer.strategy === 'sync';
    for (;;) {
      if (this.#closed)
        throw new RolloutEngineError('ERR_ENGINE_STATE', 'the engine closed while a batch was being produced');
      const dispatched = this.#counts.scheduled + this.#counts.retried;
      if (sync) {
        const start = performance.now();
        const statuses = await this.#produceSync(shares);
        this.progress.produceMs += performance.now() - start;
        if (statuses.includes('UPDATE_WEIGHT_AND_ABORT')) return empty('UPDATE_WEIGHT_AND_ABORT');
      }
      try {
        for (const [task] of shares) this.checkFailures(task);
      } catch (err) {
        // Reported once: the next getBatch starts a fresh failure budget (and outage budget) and production resumes.
        this.#failedSinceBatch = 0;
        this.#outage.renewBudget();
        this.#changed.notify();
        throw err;
      }
      const batch = this.#tryTake(trainStep, shares);
      if (batch !== null) return batch;
      if (this.#paused) return empty('UPDATE_WEIGHT_AND_ABORT');
      // Nothing generated with these weights can be used at this step: the trainer must sync first.
      if (this.#modelTooStale(trainStep)) return empty('EXPIRED_BATCH');
      const stalled = sync
        ? this.#counts.scheduled + this.#counts.retried === dispatched
        : this.#inFlight.size === 0 && !this.hasRoom();
      if (stalled) {
        const budget = this.#config.producer.memoryBudgetBytes;
        const why =
          budget !== null && !this.hasRoom()
            ? `producer.memoryBudgetBytes (${budget}) cannot hold one batch: the buffer holds ≈${Math.round(this.buffer.bytes)} bytes`
            : 'a shouldContinue hook that returns false too early?';
        throw new RolloutEngineError(
          'ERR_PRODUCTION_STALLED',
          `train step ${trainStep}: production stopped before the batch was complete (${why})`,
        );
      }
      if (!sync) await this.#landed.wait();
    }
  }

  #modelTooStale(trainStep: number): boolean {
    return this.#async.isModelExpired(trainStep, this.servingModelStep);
  }

  async #produceSync(shares: Map<string, number>): Promise<ProduceStatus[]> {
    const results = await Promise.allSettled([...shares].map(([task, share]) => this.#sync.produce(this, task, share)));
    const failure = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failure === undefined) return results.map((r) => (r as PromiseFulfilledResult<ProduceStatus>).value);
    // Let every group in flight land before giving up, so the counts still add up.
    while (this.#inFlight.size > 0) await this.#landed.wait();
    this.#failedSinceBatch = 0;
    throw failure.reason;
  }

  /** Take every task's share if the buffer holds it (after the token mask), else null. */
  #tryTake(trainStep: number, shares: Map<string, number>): Batch | null {
    for (const [task, share] of shares) if (this.completed(task) < share) return null;
    const order = this.#config.producer.takeOrder;
    const tokenThreshold = this.#config.producer.tokenStalenessThreshold;
    const maskedAt = this.#expiry(trainStep).trainStep;
    const chosen = new Map<string, RolloutGroup[]>();
    let maskedTokens = 0;
    // Every stored group went through the expiry lifecycle at `maskedAt` or a later step (getBatch and
    // resume refresh the buffer, landings are put with the same policy), so no member taken here has
    // every token masked: those expired in the buffer, where the counts and the tail-batch trigger see them.
    for (const [task, share] of shares) {
      const groups = this.buffer.take(task, share, order);
      if (tokenThreshold !== null)
        for (const group of groups) maskedTokens += applyTokenMask(group, maskedAt, tokenThreshold);
      chosen.set(task, groups);
    }
    const groups = [...chosen.values()].flat();
    this.progress.markConsumed(new Map([...chosen].map(([task, gs]) => [task, gs.length])));
    this.progress.finishConsume(trainStep);
    this.#counts.taken += groups.length;
    this.#failedSinceBatch = 0;
    this.#changed.notify();
    this.#observer.taken?.(groups, trainStep);
    this.#lastBatch = { trainStep, status: 'NORMAL', groups, stats: this.#batchStats(trainStep, chosen, maskedTokens) };
    return this.#lastBatch;
  }

  #batchStats(trainStep: number, chosen: Map<string, RolloutGroup[]>, maskedTokens: number): BatchStats {
    const window = this.progress.takeWindow();
    const byTask: BatchStats['byTask'] = {};
    let rollouts = 0;
    let rewardSum = 0;
    let turns = 0;
    let responseTokens = 0;
    let sMin = Infinity;
    let sMax = -Infinity;
    let sSum = 0;
    for (const [task, groups] of chosen) {
      let taskReward = 0;
      let taskRollouts = 0;
      for (const g of groups) {
        for (const r of g.rollouts) {
          taskReward += r.reward;
          taskRollouts++;
          turns += r.turns.length;
          responseTokens += responseTokenCount(r);
          const s = rolloutStaleness(r, trainStep);
          sMin = Math.min(sMin, s);
          sMax = Math.max(sMax, s);
          sSum += s;
        }
      }
      byTask[task] = { groups: groups.length, meanReward: taskRollouts === 0 ? 0 : taskReward / taskRollouts };
      rollouts += taskRollouts;
      rewardSum += taskReward;
    }
    return {
      groups: [...chosen.values()].reduce((n, gs) => n + gs.length, 0),
      rollouts,
      meanReward: rollouts === 0 ? 0 : rewardSum / rollouts,
      turns,
      responseTokens,
      staleness: rollouts === 0 ? { min: 0, max: 0, mean: 0 } : { min: sMin, max: sMax, mean: sSum / rollouts },
      maskedTokens,
      producedSamples: window.producedSamples,
      producedTokens: window.producedTokens,
      rawMeanReward: window.meanReward,
      produceMs: window.produceMs,
      byTask,
    };
  }

  // ── background production (async strategy) ──────────────────────────────────────────────────

  async #runAsync(): Promise<void> {
    while (!this.#closed) {
      if (this.#paused) {
        await this.#changed.wait();
        continue;
      }
      const future = this.progress.producerFutureStep;
      if (this.#async.isModelExpired(future, this.servingModelStep)) {
        this.#landed.notify(); // a getBatch waiting for groups must learn that none are coming
        await this.#changed.wait();
        continue;
      }
      this.progress.ensureTargetUpto(future);
      const start = performance.now();
      let statuses: ProduceStatus[];
      try {
        statuses = await Promise.all(
          [...this.progress.shares()].map(([task, share]) => this.#async.produce(this, task, share)),
        );
      } catch (err) {
        // Too many failures: stop scheduling until a getBatch reports it and the counter is reset.
        this.#log.error({ err: (err as Error).message }, 'production stopped');
        this.#landed.notify();
        await this.#changed.wait();
        continue;
      } finally {
        this.progress.produceMs += performance.now() - start;
      }
      if (statuses.includes('UPDATE_WEIGHT_AND_ABORT')) continue;
      if (statuses.includes('EXPIRED_BATCH')) continue; // re-checked at the top of the loop
      // The round measured `future` only. A getBatch that pulled the future step forward during it
      // (beginConsume) left a step whose targets are not set yet: start over from the top for that one.
      if (this.progress.producerFutureStep !== future) continue;
      // This step's targets are met: run ahead one step while the weights are fresh enough for it.
      if (!this.#async.isModelExpired(future + 1, this.servingModelStep)) this.progress.advanceFutureStep(future);
      else await this.#changed.wait();
    }
  }

  // ── weight updates ────────────────────────────────────────────────────────────────────────────

  /**
   * Stop production for a weight update and bring every group in flight back: workers stop issuing
   * inference calls at once (shared flag), in-flight calls are aborted (abort mode) or allowed to
   * finish (drain mode), and interrupted rollouts land as ABORTED with what they had.
   */
  async pause(): Promise<PauseReport> {
    const { mode, resignalIntervalMs, timeoutMs } = this.#config.pause;
    // A resume or close before this returns (a trainer whose /pause timed out, a shutdown) ends it:
    // from then on no abort or cancel may cut short the calls that run on the new weights.
    const epoch = this.#resumeEpoch;
    const pausing = () => this.#paused && !this.#closed && this.#resumeEpoch === epoch;
    const requestedUs = wallClockUs();
    const start = performance.now();
    this.#paused = true;
    this.#changed.notify();
    this.#landed.notify();
    this.#control.pause();
    const groupsBefore = this.#inFlight.size;
    // The server abort does not wait for the workers' acks: from the store above no worker can send a
    // call (the send path reads the flag in the same tick), so the acks only measure, they gate nothing.
    const serverAborting =
      mode === 'abort' && groupsBefore > 0 && this.#abortTargets.length > 0 ? this.#abortOnServers() : null;
    const workersAckedMs = await this.#control.waitForAcks(this.#pool.liveWorkers, Math.min(timeoutMs, 1_000), start);
    const workersStoppedMs = workersAckedMs === null ? null : this.#control.lastSendAfterMs(requestedUs);
    const serverAbort = serverAborting !== null && (await serverAborting);
    let cancelled = false;
    // Streamed calls held by the pause may have landed already, but their answers are still being read:
    // without a server-side abort to end them, they are cut client-side all the same.
    const heldStreams = this.#config.llm.stream && groupsBefore > 0;
    if (mode === 'abort' && (this.#inFlight.size > 0 || heldStreams) && !serverAbort && pausing()) {
      this.#control.cancel();
      cancelled = true;
    }
    let deadline = start + timeoutMs;
    let nextSignal = start + resignalIntervalMs;
    // A call sent just before the pause can reach its server after the abort did, and then generates
    // to the end. Abort again now that every worker is past its send path, and every
    // SERVER_ABORT_REPEAT_MS while groups are out: aborts are idempotent and cost one small request.
    let nextAbort = serverAbort ? performance.now() : Infinity;
    const repeatedAborts: Promise<boolean>[] = [];
    while (this.#inFlight.size > 0 && pausing()) {
      const wakeAt = Math.min(deadline, nextSignal, nextAbort);
      await this.#landedWithin(wakeAt - performance.now());
      const now = performance.now();
      if (this.#inFlight.size === 0 || !pausing()) break;
      if (now >= nextAbort && now < deadline) {
        repeatedAborts.push(this.#abortOnServers());
        nextAbort = now + SERVER_ABORT_REPEAT_MS;
      }
      if (now >= deadline) {
        if (cancelled) break; // cancelled and waited another interval: report what is left, it lands later
        this.#log.warn(
          { inFlight: this.#inFlight.size, timeoutMs },
          'pause timed out: cancelling in-flight inference client-side',
        );
        this.#control.cancel();
        cancelled = true;
        deadline = now + resignalIntervalMs;
      } else if (now >= nextSignal) {
        this.#control.resignal();
        nextSignal = now + resignalIntervalMs;
      }
    }
    const allBackMs = performance.now() - start;
    // An abort still on its way must not land after the resume and cut the next calls short.
    await Promise.all(repeatedAborts);
    await this.#pool.flush(); // step records of the interrupted episodes reach the disk before the weights change
    const report: PauseReport = {
      workersStoppedMs,
      workersAckedMs,
      allBackMs,
      groupsBack: groupsBefore - this.#inFlight.size,
      serverAbort,
      cancelled,
      stillInFlight: this.#inFlight.size,
    };
    this.#log.info(report, 'paused for a weight update');
    this.#observer.paused?.(report);
    return report;
  }

  /**
   * Ask every inference endpoint to abort what it is generating; true when all of them could (an
   * endpoint without an abort route cannot: its calls are then cancelled client-side).
   */
  async #abortOnServers(): Promise<boolean> {
    if (this.#closed) return false; // close() has closed the aborter's connections
    this.#aborter ??= new InferenceAborter({ apiKey: this.#config.llm.apiKey });
    const all = await this.#aborter.abortAll(this.#abortTargets);
    return all && this.#abortTargets.length === this.#endpointCount;
  }

  /**
   * New weights are loaded: tag new tokens with `modelStep` and produce again. `weightVersion` is the
   * servers' name for these weights (SGLang's `--weight-version`, a string): replies that carry another
   * one are reported as not serving them (rollout/pause-gate.ts).
   */
  resume(modelStep: number, weightVersion: string | null = null): void {
    if (!Number.isInteger(modelStep) || modelStep < this.#modelStep || modelStep > 0x7fffffff) {
      throw new RolloutEngineError(
        'ERR_INVALID_ARGUMENT',
        `modelStep must be an integer from the current model step ${this.#modelStep} to 2147483647 (got ${String(modelStep)})`,
      );
    }
    if (
      weightVersion !== null &&
      (typeof weightVersion !== 'string' || weightVersion === '' || weightVersion.length > MAX_WEIGHT_VERSION_LENGTH)
    ) {
      throw new RolloutEngineError(
        'ERR_INVALID_ARGUMENT',
        `weightVersion must be a non-empty string of at most ${MAX_WEIGHT_VERSION_LENGTH} characters (got ${preview(weightVersion)})`,
      );
    }
    this.#modelStep = modelStep;
    this.#reportedModelStep = null; // learnt again from the first tokens the new weights generate
    this.#resumeEpoch++;
    this.#paused = false;
    this.#control.resume(modelStep, weightVersion);
    this.buffer.refresh(this.#expiry());
    this.#changed.notify();
    this.#landed.notify();
  }

  // ── checkpoints ───────────────────────────────────────────────────────────────────────────────

  snapshot(): ProducerSnapshot {
    return {
      modelStep: this.#modelStep,
      progress: this.progress.snapshot(),
      buffer: this.buffer.snapshot(),
      samplers: Object.fromEntries([...this.#samplers].map(([name, s]) => [name, s.cursor])),
      counts: this.counts,
      inFlight: [...this.#inFlight.values()],
      lastBatch: this.#lastBatch,
    };
  }

  /** Before start(): state from a checkpoint, updated in place. In-flight groups come back ABORTED. */
  restore(snapshot: ProducerSnapshot): void {
    this.#lastBatch = snapshot.lastBatch ?? null;
    this.#modelStep = snapshot.modelStep;
    this.#control.resume(snapshot.modelStep);
    this.progress.restore(snapshot.progress);
    for (const [name, cursor] of Object.entries(snapshot.samplers)) {
      const sampler = this.#samplers.get(name);
      if (sampler) sampler.cursor = cursor;
    }
    Object.assign(this.#counts, structuredClone(snapshot.counts), { inFlight: 0 });
    const interrupted = snapshot.inFlight.map((group) => {
      for (const r of group.rollouts)
        if (r.status === Status.INIT || r.status === Status.EXPIRED) resetToPrompt(r, Status.ABORTED);
      group.status = groupStatus(group.rollouts);
      return group;
    });
    this.buffer.restore({ ...snapshot.buffer, groups: [...snapshot.buffer.groups, ...interrupted] });
  }

  /**
   * Stop scheduling, cancel what is in flight (calls aborted client-side, episodes stop at their next
   * step) and wait — bounded — for those groups to land as ABORTED, so closing the workers does not
   * fail them half-way.
   */
  async close(): Promise<void> {
    this.#closed = true;
    this.#changed.notify();
    this.#landed.notify();
    await this.#loop;
    await this.#aborter?.close();
    await this.#outage.close(); // groups waiting for its verdict land now
    if (this.#inFlight.size === 0) return;
    this.#control.cancel();
    const deadline = performance.now() + Math.min(this.#config.pause.timeoutMs, 10_000);
    while (this.#inFlight.size > 0 && performance.now() < deadline) {
      await this.#landedWithin(100);
    }
  }
}

/** Set each turn's loss mask; returns the number of tokens masked out. */
function applyTokenMask(group: RolloutGroup, trainStep: number, tokenThreshold: number): number {
  let masked = 0;
  for (const rollout of group.rollouts) {
    for (const turn of rollout.turns) {
      const mask = tokenLossMask(turn, trainStep, tokenThreshold);
      if (mask === null) continue;
      turn.lossMask = mask;
      for (let i = 0; i < mask.length; i++) masked += 1 - mask[i];
    }
  }
  return masked;
}

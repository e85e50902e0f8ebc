/**
 * The producer: schedules groups on the worker pool, lands finished groups in the replay buffer, and
 * serves batches, weight-update pauses and checkpoints. Everything here runs on the main thread;
 * the strategy (./strategies.ts) decides *what* to schedule and *when* (in the background, or inside
 * getBatch), the pause sequence (./pause-sequence.ts) brings groups back for a weight update, and
 * this class owns the bookkeeping and the lifecycle (./producer-state.ts):
 *
 *            start()              pause()               the last pause sequence returns
 *   idle ───────────────► running ──────────► pausing ──────────────────────────────► paused
 *                          │ ▲ ▲                │  ▲                                    │ │
 *                          │ │ └── resume() ────┘  └──────────── pause() again ─────────┘ │
 *                          │ └──────────────────────── resume() ──────────────────────────┘
 *                          └─► resume() without a pause: running → running
 *   every resume() adds one to the epoch
 *   close() from any state ──► closing (cancel what is in flight, wait for it, bounded) ──► closed
 *
 *   running      the strategy produces (async: its background loop; sync: inside getBatch);
 *                getBatch takes batches; groups land and are stored after the expiry check
 *   pausing      no dispatch (shouldAbort); getBatch answers UPDATE_WEIGHT_AND_ABORT; the pause
 *                sequence signals, aborts, and waits for the groups in flight (they keep landing)
 *   paused       as pausing, with the sequence returned; what it gave up on lands later
 *   closing      no dispatch, no new batch; in-flight groups cancelled and waited for (bounded)
 *   epoch        counts resumes: a group dispatched in an older epoch says nothing about the
 *                weights now served, and a pause sequence of an older epoch acts no more
 *
 * Invariants (checked by the property test):
 * - every group drawn from a sampler is, at any moment, in exactly one place: in flight (`#inFlight`),
 *   stored in the buffer, taken by the trainer, or dropped (FAILED / FILTERED / EXPIRED) and counted:
 *   `counts.scheduled = inFlight + stored + taken + dropped`;
 * - a group lands (`#land`) exactly once per dispatch: the pool's runGroup never rejects, and the
 *   `then` callback runs atomically on this thread, so no claim protocol is needed;
 * - groups never leave the buffer except through `take` (to the trainer) or `spawn` (back in flight).
 */
import { failureKindOfReason, noFailures, type FailureKind } from '../domain/failure.ts';
import type { ResolvedConfig } from '../config.ts';
import {
  emptyDropCounts,
  ReplayBuffer,
  type BufferSnapshot,
  type DropReason,
  type ExpiryPolicy,
} from '../buffer/replay-buffer.ts';
import type { Sampler } from '../buffer/sampler.ts';
import type { ServerRoute, ServerRouteTarget } from '../llm/client.ts';
import type { InPlaceRoutes } from '../llm/servers.ts';
import { DIALECTS } from '../llm/servers.ts';
import { announcedVersionProblem, MAX_WEIGHT_VERSION_LENGTH } from '../llm/reply.ts';
import type { Logger } from '../log.ts';
import { preview, RolloutEngineError } from '../errors.ts';
import {
  approxGroupBytes,
  dispatchTokenCount,
  restartedInDispatch,
  groupError,
  groupStatus,
  resetToPrompt,
  responseTokenCount,
  Status,
  type RolloutGroup,
} from '../domain/rollout.ts';
import type { Batch } from '../domain/batch.ts';
import { batchStats, groupLossMasks } from './batch-stats.ts';
import { Notifier, WakeUp } from './notifier.ts';
import { OutageMonitor, type OutageObserver, type OutageStats } from './outage.ts';
import { NO_EXPIRY } from '../protocol/control-block.ts';
import type { AdmissionStats } from './admission.ts';
import type { PauseControl } from './pause-control.ts';
import { PauseSequence, type InPlaceTarget, type PauseReport } from './pause-sequence.ts';
import { ProducerLifecycle, type ProducerState } from './producer-state.ts';
import { ProduceProgress, type ProgressState } from './progress.ts';
import {
  createStrategy,
  type ProduceContext,
  type ProduceStatus,
  type ProducerHandle,
  type ProduceStrategy,
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

export type { BatchStats } from './batch-stats.ts';
export type { PauseReport } from './pause-sequence.ts';

export type { Batch } from '../domain/batch.ts';

export interface ProducerHooks {
  /** `is_valid_sample_fn`: false turns a COMPLETED group FILTERED. */
  isValidGroup?: (group: RolloutGroup) => boolean;
  shouldContinue?: ShouldContinue;
}

/**
 * Why generated tokens were thrown away: `expired` — past the staleness bound, a member reset to its
 * prompt or, where expired groups are not retried, the whole group dropped (what pacing and the bound
 * decide); `restarted` — generated again in the worker: a member run again from its prompt
 * (interrupted without partialRollout, a replay that no longer matched) or a step played again whole
 * (cut short by an infrastructure failure or a pause, or a multi-agent step one call of which was
 * interrupted); `dropped` —
 * a whole group dropped for another reason (failed, filtered: the reason goes to `dropped`).
 */
export const DISCARD_CAUSES = ['expired', 'restarted', 'dropped'] as const;
export type DiscardCause = (typeof DISCARD_CAUSES)[number];

/** Told about what happens to groups, for metrics; every call is synchronous and must be cheap. */
export interface ProducerObserver extends OutageObserver {
  /** A group came back from the workers; `sent` is the group as it was dispatched. */
  landed?(group: RolloutGroup, sent: RolloutGroup): void;
  taken?(groups: readonly RolloutGroup[], trainStep: number): void;
  dropped?(group: RolloutGroup, reason: DropReason): void;
  /**
   * Response tokens thrown away, and why (DiscardCause), those a worker threw away within one run
   * included (`restartedTokens`: a run from the prompt, a step played again).
   */
  discarded?(tokens: number, cause: DiscardCause): void;
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
  readonly #failures = noFailures();
  readonly #counts: GroupCounts = emptyGroupCounts();
  readonly #config: ResolvedConfig;
  readonly #pool: WorkerPool;
  readonly #control: PauseControl;
  readonly #samplers: Map<string, Sampler>;
  readonly #log: Logger;
  readonly #observer: ProducerObserver;
  readonly #isValidGroup: ((group: RolloutGroup) => boolean) | null;
  /** Every difference between sync and async production lives there. */
  readonly #strategy: ProduceStrategy;
  /** The state and the resume epoch; every transition goes through it. */
  readonly #lifecycle = new ProducerLifecycle();
  readonly #pauses: PauseSequence;
  /** What the strategy sees of the producer beyond ProduceContext. */
  readonly #handle: ProducerHandle;
  /** Group id → the group as it was sent; the result replaces it when it lands. */
  readonly #inFlight = new Map<string, RolloutGroup>();
  readonly #inFlightByTask = new Map<string, number>();
  /** Wakes whoever waits for a group to land (strategies, getBatch, pause). */
  readonly #landed = new Notifier();
  /** Wakes the background loop (its only waiter): consumer moved, resume, close, groups put back. */
  readonly #changed = new WakeUp();
  #modelStep: number;
  /** The strategy's background production (onStart), awaited by close(); null when it has none. */
  #background: Promise<void> | null = null;
  /** close() in progress: a second call waits for the same one. */
  #closing: Promise<void> | null = null;
  #failedSinceBatch = 0;
  #lastBatch: Extract<Batch, { status: 'NORMAL' }> | null = null;
  /** Newest weight version seen on tokens generated since the last resume (null: none yet). */
  #reportedModelStep: number | null = null;
  /** Moving average of landed groups' approximate bytes (memory budget). */
  #meanGroupBytes = 4096;
  #lastFailure: string | null = null;
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
    abortRoutes?: ReadonlyMap<string, ServerRoute | null>;
    /** Each endpoint's in-place pause routes (its dialect's); default: the generic dialect's. */
    inPlaceRoutes?: ReadonlyMap<string, InPlaceRoutes | null>;
    hooks?: ProducerHooks;
    observer?: ProducerObserver;
  }) {
    const { config } = options;
    this.#config = config;
    this.#pool = options.pool;
    this.#control = options.control;
    this.#samplers = options.samplers;
    this.#log = options.log;
    this.#pauses = new PauseSequence({
      config,
      control: options.control,
      pool: options.pool,
      log: options.log,
      ...pauseTargets(config, options.endpoints, options.abortRoutes, options.inPlaceRoutes),
    });
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
      let tokens = 0;
      for (const r of group.rollouts) tokens += responseTokenCount(r);
      if (tokens > 0) this.#observer.discarded?.(tokens, reason === 'EXPIRED' ? 'expired' : 'dropped');
    };
    this.buffer.onReset = (tokens) => {
      if (tokens > 0) this.#observer.discarded?.(tokens, 'expired');
    };
    for (const task of config.tasks) this.#inFlightByTask.set(task.name, 0);
    const p = config.producer;
    this.#isValidGroup = options.hooks?.isValidGroup ?? (p.filter === 'drop-equal-rewards' ? hasRewardSpread : null);
    this.#strategy = createStrategy(config, options.hooks?.shouldContinue);
    this.#handle = {
      progress: this.progress,
      log: this.#log,
      state: () => this.#lifecycle.state,
      dispatched: () => this.#counts.scheduled + this.#counts.retried,
      inFlightTotal: () => this.#inFlight.size,
      changed: () => this.#changed.wait(),
      wakeConsumer: () => this.#landed.notify(),
    };
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

  get producerFutureStep(): number {
    return this.progress.producerFutureStep;
  }

  /** A copy of the counts, `inFlight` being the groups in flight right now. */
  get counts(): GroupCounts {
    return { ...structuredClone(this.#counts), inFlight: this.#inFlight.size };
  }

  /** The last NORMAL batch handed out; null before the first. */
  get lastBatch(): Extract<Batch, { status: 'NORMAL' }> | null {
    return this.#lastBatch;
  }

  /** pausing or paused (./producer-state.ts). */
  get paused(): boolean {
    return this.#lifecycle.paused;
  }

  get state(): ProducerState {
    return this.#lifecycle.state;
  }

  get inFlightTotal(): number {
    return this.#inFlight.size;
  }

  /**
   * The inference endpoints changed at run time (one joined or left the fleet): later pauses abort or
   * pause these, and an outage is when none of these answers.
   */
  setEndpoints(
    endpoints: string[],
    abortRoutes: ReadonlyMap<string, ServerRoute | null>,
    inPlaceRoutes: ReadonlyMap<string, InPlaceRoutes | null>,
  ): void {
    this.#pauses.setTargets(pauseTargets(this.#config, endpoints, abortRoutes, inPlaceRoutes));
    this.#outage.setEndpoints(endpoints);
  }

  get outage(): OutageStats {
    return this.#outage.stats();
  }

  /** The deadline admission's figures (`producer.admission: deadline`); null otherwise. */
  get admission(): AdmissionStats | null {
    return this.#strategy.admissionStats();
  }

  /** idle → running: the strategy's background production starts, if it has one (async). */
  start(): void {
    this.#lifecycle.start();
    this.#publishExpiry(); // a restored run's retried groups go out before any getBatch
    this.#background = this.#strategy.onStart(this, this.#handle);
  }

  // ── ProduceContext ────────────────────────────────────────────────────────────────────────────

  /** Nothing may be dispatched: pausing, paused, closing or closed. */
  shouldAbort(): boolean {
    return this.#lifecycle.state !== 'running';
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
    return this.progress.consumedGroups[task] + this.completed(task);
  }

  target(task: string): number {
    return this.progress.targetGroups[task];
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
    const epoch = this.#lifecycle.epoch;
    const dispatchedAt = this.#outage.now();
    const sentAt = performance.now();
    void this.#pool.runGroup(group, this.#modelStep).then((result) => {
      // A group a pause or close brings back landed early, not because it was done: its time would
      // make the admission's lifetime figure short (pause.mode abort lands every group at each sync).
      if (this.#lifecycle.state === 'running') this.#strategy.observeLanding(performance.now() - sentAt);
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
    let restarted = 0;
    for (let i = 0; i < group.rollouts.length; i++) {
      const before = sent.rollouts[i];
      tokens += dispatchTokenCount(before, group.rollouts[i]);
      // Thrown away in the worker to be generated again: runs from the prompt, steps played again.
      restarted += restartedInDispatch(before, group.rollouts[i]);
    }
    if (restarted > 0) this.#observer.discarded?.(restarted, 'restarted');
    this.progress.addProduced(task, group.rollouts.length, tokens);
    this.#countFailures(group, sent);
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
    if (epoch === this.#lifecycle.epoch) this.#noteReportedVersion(group, sent);
    this.#observer.landed?.(group, sent);
    const fresh = this.#strategy.freshOnLanding(epoch, this.#lifecycle.epoch);
    this.buffer.put(group, fresh ? undefined : this.#expiry());
    this.#landed.notify();
  }

  /**
   * Each FAILED episode by its kind, and each one the worker ran again in its slot after an
   * infrastructure failure (counted once: `maskedFailures` is cumulative across the group's landings).
   */
  #countFailures(group: RolloutGroup, sent: RolloutGroup): void {
    for (let i = 0; i < group.rollouts.length; i++) {
      const r = group.rollouts[i];
      const masked = (r.maskedFailures ?? 0) - (sent.rollouts[i]?.maskedFailures ?? 0);
      if (masked > 0) this.#addFailures('infrastructure', masked);
      if (r.status === Status.FAILED) this.#addFailures(r.failureKind ?? failureKindOfReason(r.error), 1);
    }
  }

  #addFailures(kind: FailureKind, episodes: number): void {
    this.progress.addFailures(kind, episodes);
    this.#failures[kind] += episodes;
  }

  /** Episodes that failed since the start, by kind (not in checkpoints: counted again from 0 after a restart). */
  get failures(): Record<FailureKind, number> {
    return { ...this.#failures };
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
   * Tell the workers which rollouts in flight have expired already, so they stop them at their next
   * turn instead of generating tokens that are reset on landing (protocol/control-block.ts,
   * OLDEST_USEFUL_STEP). Published whenever the expiry measure moves: the consumer, a resume.
   */
  #publishExpiry(): void {
    const e = this.#expiry();
    // Sync stores what it dispatched this epoch without the check, so it publishes no bound (the groups
    // of an earlier epoch still out after a pause timed out are checked when they land, as before).
    const measured = !this.#strategy.freshOnLanding(this.#lifecycle.epoch, this.#lifecycle.epoch);
    const oldest = e.trainStep - e.threshold; // expired ⇔ trainStep − min − 1 ≥ threshold ⇔ min < this
    this.#control.setOldestUsefulStep(
      measured && Number.isFinite(oldest) ? Math.max(NO_EXPIRY, Math.min(0x7fffffff, oldest)) : NO_EXPIRY,
    );
  }

  /** The expiry policy with the consumer at `trainStep`; where staleness is measured is the strategy's. */
  #expiry(trainStep = this.progress.nextTrainStep): ExpiryPolicy {
    const p = this.#config.producer;
    const measuredAt = this.#strategy.expiryStep(trainStep, this.servingModelStep);
    return {
      trainStep: measuredAt,
      threshold: this.#strategy.expiryThreshold,
      tokenThreshold: p.tokenStalenessThreshold,
      retryable: this.#strategy.expiredRetryable,
    };
  }

  // ── the consumer ──────────────────────────────────────────────────────────────────────────────

  async getBatch(trainStep: number): Promise<Batch> {
    // Not before start(): the async strategy's background loop would not be there to produce it.
    this.#lifecycle.expect('serve a batch', ['running', 'pausing', 'paused', 'closing', 'closed']);
    // Asking again for the step just handed out (a trainer retrying after a lost reply, or restarted
    // after a crash) gets the same batch: a batch is delivered at least once and taken exactly once.
    if (this.#lastBatch !== null && this.#lastBatch.trainStep === trainStep) return this.#lastBatch;
    // Steps only go forward (a trainer may skip some). A step behind the consumer was handed out or
    // asked for already: another batch under its number would give the trainer two batches for one
    // step, and moving the consumer back would leave the async producer waiting for a step it has
    // passed (regression: it hung).
    const next = this.progress.nextTrainStep;
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
    if (this.#lifecycle.paused) return empty('UPDATE_WEIGHT_AND_ABORT');
    this.progress.beginConsume(trainStep);
    this.buffer.refresh(this.#expiry(trainStep));
    this.#publishExpiry();
    this.#changed.notify(); // the consumer moved: the background loop re-checks its targets
    const shares = this.progress.shares();
    for (;;) {
      if (this.#lifecycle.closed)
        throw new RolloutEngineError('ERR_ENGINE_STATE', 'the engine closed while a batch was being produced');
      const dispatched = this.#handle.dispatched();
      const producing = this.#strategy.produceFor(this, this.#handle, shares);
      if (producing !== null) {
        let produced: ProduceStatus;
        try {
          produced = await producing;
        } catch (err) {
          // Let every group in flight land before giving up, so the counts still add up.
          while (this.#inFlight.size > 0) await this.#landed.wait();
          this.#failedSinceBatch = 0;
          throw err;
        }
        if (produced === 'UPDATE_WEIGHT_AND_ABORT') return empty('UPDATE_WEIGHT_AND_ABORT');
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
      if (this.#lifecycle.paused) return empty('UPDATE_WEIGHT_AND_ABORT');
      // Nothing generated with these weights can be used at this step: the trainer must sync first.
      if (this.#strategy.isModelExpired(trainStep, this.servingModelStep)) return empty('EXPIRED_BATCH');
      if (this.#strategy.stalled(this, this.#handle, dispatched)) {
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
      const waiting = this.#strategy.nextAttempt(this);
      if (waiting !== null) await waiting;
    }
  }

  /** Take every task's share if the buffer holds it (after the token mask), else null. */
  #tryTake(trainStep: number, shares: ReadonlyMap<string, number>): Batch | null {
    for (const [task, share] of shares) if (this.completed(task) < share) return null;
    const order = this.#config.producer.takeOrder;
    const tokenThreshold = this.#config.producer.tokenStalenessThreshold;
    const maskedAt = this.#expiry(trainStep).trainStep;
    const taken = new Map<string, RolloutGroup[]>();
    let maskedTokens = 0;
    // Every stored group went through the expiry lifecycle at `maskedAt` or a later step (getBatch and
    // resume refresh the buffer, landings are put with the same policy), so no member taken here has
    // every token masked: those expired in the buffer, where the counts and the tail-batch trigger see them.
    for (const [task, share] of shares) {
      const groups = this.buffer.take(task, share, order);
      if (tokenThreshold !== null) {
        for (const group of groups) {
          const { masks, masked } = groupLossMasks(group, maskedAt, tokenThreshold);
          for (const [r, rollout] of group.rollouts.entries()) {
            for (const [t, turn] of rollout.turns.entries()) if (masks[r][t] !== null) turn.lossMask = masks[r][t];
          }
          maskedTokens += masked;
        }
      }
      taken.set(task, groups);
    }
    // Exactly batchSize groups: each task held its share (checked above, and `take` returns that many
    // when the pool holds them), and the shares sum to batchSize (allocateBatch throws otherwise, when
    // the producer is built). A short batch is never handed out as NORMAL.
    const groups = [...taken.values()].flat();
    this.progress.markConsumed(new Map([...taken].map(([task, gs]) => [task, gs.length])));
    this.progress.finishConsume(trainStep);
    this.#publishExpiry();
    this.#counts.taken += groups.length;
    this.#strategy.observeTake(trainStep);
    this.#failedSinceBatch = 0;
    this.#changed.notify();
    this.#observer.taken?.(groups, trainStep);
    this.#lastBatch = {
      trainStep,
      status: 'NORMAL',
      groups,
      stats: batchStats(trainStep, taken, maskedTokens, this.progress.takeWindow(), this.#strategy.staleThreshold),
    };
    return this.#lastBatch;
  }

  // ── weight updates ────────────────────────────────────────────────────────────────────────────

  /**
   * Stop production for a weight update and bring every group in flight back (./pause-sequence.ts):
   * workers stop issuing inference calls at once (shared flag), in-flight calls are aborted (abort
   * mode) or allowed to finish (drain mode), and interrupted rollouts land as ABORTED with what they had.
   */
  async pause(): Promise<PauseReport> {
    const epoch = this.#lifecycle.beginPause();
    this.#changed.notify();
    this.#landed.notify();
    let report: PauseReport;
    try {
      // A resume or close before this returns (a trainer whose /pause timed out, a shutdown) ends it.
      report = await this.#pauses.run({
        inFlight: () => this.#inFlight.size,
        landedWithin: (ms) => this.#landedWithin(ms),
        stillPausing: () => this.#lifecycle.stillPausing(epoch),
      });
    } finally {
      this.#lifecycle.endPause();
    }
    this.#log.info(report, 'paused for a weight update');
    this.#observer.paused?.(report);
    return report;
  }

  /** After an in-place pause, the servers continue generation (pause-sequence.ts); a no-op otherwise. */
  continueServers(): Promise<void> {
    return this.#pauses.continueServers();
  }

  /**
   * New weights are loaded: tag new tokens with `modelStep` and produce again. `weightVersion` is the
   * servers' name for these weights (SGLang's `--weight-version`, a string): replies that carry another
   * one are reported as not serving them (worker/pause-gate.ts).
   */
  resume(modelStep: number, weightVersion: string | null = null, options: { pausedOnly?: boolean } = {}): void {
    if (!Number.isInteger(modelStep) || modelStep < this.#modelStep || modelStep > 0x7fffffff) {
      throw new RolloutEngineError(
        'ERR_INVALID_ARGUMENT',
        `modelStep must be an integer from the current model step ${this.#modelStep} to 2147483647 (got ${String(modelStep)})`,
      );
    }
    const versionProblem =
      weightVersion === null
        ? null
        : typeof weightVersion === 'string'
          ? announcedVersionProblem(weightVersion)
          : `must be a non-empty string of at most ${MAX_WEIGHT_VERSION_LENGTH} characters`;
    if (versionProblem !== null)
      throw new RolloutEngineError(
        'ERR_INVALID_ARGUMENT',
        `weightVersion ${versionProblem} (got ${preview(weightVersion)})`,
      );
    if (options.pausedOnly === true && this.#lifecycle.state === 'running') {
      const announced = this.#control.weightVersion;
      // A trainer's retry of the resume whose answer it lost names the same weights: done already.
      if (modelStep === this.#modelStep && (weightVersion === null || weightVersion === announced)) return;
      throw new RolloutEngineError(
        'ERR_ENGINE_STATE',
        `resume without a pause: the engine is running on model step ${this.#modelStep}${announced === null ? '' : ` (weightVersion ${JSON.stringify(announced)})`}, not paused, so modelStep ${modelStep}${weightVersion === null ? '' : ` (weightVersion ${JSON.stringify(weightVersion)})`} is refused; pause first, load the weights, then resume`,
      );
    }
    this.#lifecycle.resume();
    this.#modelStep = modelStep;
    this.#reportedModelStep = null; // learnt again from the first tokens the new weights generate
    this.#control.resume(modelStep, weightVersion);
    this.buffer.refresh(this.#expiry());
    this.#publishExpiry();
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
   * fail them half-way. A second call waits for the first.
   */
  close(): Promise<void> {
    if (!this.#lifecycle.beginClose()) return this.#closing ?? Promise.resolve();
    this.#closing = this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    this.#changed.notify();
    this.#landed.notify();
    await this.#background;
    await this.#pauses.close();
    await this.#outage.close(); // groups waiting for its verdict land now
    if (this.#inFlight.size > 0) {
      this.#control.cancel();
      const deadline = performance.now() + Math.min(this.#config.pause.timeoutMs, 10_000);
      while (this.#inFlight.size > 0 && performance.now() < deadline) {
        await this.#landedWithin(100);
      }
    }
    this.#lifecycle.endClose();
  }
}

/** Every inference endpoint (the default policy's and the agents' own) with its abort-all and in-place pause routes. */
function pauseTargets(
  config: ResolvedConfig,
  endpoints: readonly string[],
  abortRoutes: ReadonlyMap<string, ServerRoute | null> | undefined,
  inPlaceRoutes: ReadonlyMap<string, InPlaceRoutes | null> | undefined,
): { abortTargets: ServerRouteTarget[]; inPlaceTargets: InPlaceTarget[]; endpointCount: number } {
  const configured: ServerRoute | null =
    config.llm.abortPath === null
      ? null
      : { path: config.llm.abortPath ?? DIALECTS.generic.abort!.path, body: DIALECTS.generic.abort!.body };
  const abortTargets: ServerRouteTarget[] = endpoints.flatMap((url) => {
    const route = abortRoutes?.has(url) ? abortRoutes.get(url)! : configured;
    return route === null ? [] : [{ url, route }];
  });
  const inPlaceTargets = endpoints.flatMap((url) => {
    const routes = inPlaceRoutes?.has(url) ? inPlaceRoutes.get(url)! : DIALECTS.generic.pauseInPlace;
    return routes === null ? [] : [{ url, routes }];
  });
  return { abortTargets, inPlaceTargets, endpointCount: endpoints.length };
}

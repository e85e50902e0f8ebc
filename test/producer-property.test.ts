/**
 * Property test of the Producer's bookkeeping (src/coordinator/producer.ts, header "Invariants"):
 * random sequences of operations — groups coming back in any order with any outcome, batches taken,
 * weight-update pauses, resumes, checkpoint + restart — on a real Producer over a scripted pool
 * (test/support/scripted-pool.ts), for the sync and the async strategy.
 *
 * After every operation, with every callback flushed:
 * - every group id ever drawn from a sampler is in exactly one place: in flight (held by the pool),
 *   stored in the buffer, taken by the trainer, or dropped (seen through `buffer.onDrop`);
 * - `counts.scheduled = inFlight + stored + taken + dropped`, and each term matches what the test saw;
 * - no group id is drawn twice, taken twice or dropped twice, across restarts too;
 * - a NORMAL batch holds exactly `batchSize` groups (each task its share), every rollout COMPLETED, and
 *   none as stale as the stale threshold (sync: no token older than the weights being served);
 *   EXPIRED_BATCH only when the weights are too stale for the step (never with sync);
 *   UPDATE_WEIGHT_AND_ABORT only while paused; getBatch never waits with nothing in flight.
 *
 * Operations run one after the other with every callback flushed in between, except a getBatch asked
 * for a few microtasks after a resume (`thenBatch`): a trainer calls it that quickly, while the
 * background loop is still part-way through the round the resume woke it for.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { Sampler } from '../src/buffer/sampler.ts';
import { rolloutStaleness, staleThreshold } from '../src/buffer/staleness.ts';
import { resolveConfig, type ResolvedConfig } from '../src/config.ts';
import { allocateBatch } from '../src/coordinator/allocate.ts';
import { PauseControl } from '../src/coordinator/pause-control.ts';
import { CONTROL, NO_EXPIRY } from '../src/protocol/control-block.ts';
import { Producer, type Batch, type ProducerSnapshot } from '../src/coordinator/producer.ts';
import { createLogger } from '../src/log.ts';
import { decodeCheckpoint, encodeCheckpoint } from '../src/formats/checkpoint-file.ts';
import { Status } from '../src/domain/rollout.ts';
import { ScriptedPool, type Outcome } from './support/scripted-pool.ts';

const log = createLogger('silent');
const LLM_URL = 'http://127.0.0.1:9';
/** Groups settled while driving one getBatch before it counts as stuck. */
const DRIVE_BOUND = 120;

// ── generated inputs ────────────────────────────────────────────────────────────────────────────

interface Setup {
  strategy: 'sync' | 'async';
  batchSize: number;
  weights: number[];
  /** Not generated for the regression examples below (default 2). */
  groupSize?: number;
  filter: 'none' | 'drop-equal-rewards';
  partialRollout: boolean;
  maxStaleness: number;
  overSampleThreshold: number;
  tailBatchTriggerSize: number;
  takeOrder: 'fifo' | 'stalest';
  pauseMode: 'abort' | 'drain';
  /** Generated for async (sync refuses `keep`). */
  staleRollouts?: 'reset' | 'keep';
  /** Not generated (default null / 1); set by the regression examples below. */
  tokenStalenessThreshold?: number | null;
  syncWeightsInterval?: number;
}

type Op =
  /** Settle some held groups (picked by index modulo the number held) with the given outcomes. */
  | { op: 'settle'; picks: number[]; outcomes: Outcome[] }
  /** getBatch(next step), settling held groups one by one (scripted outcomes, then completed) until it settles; optionally a weight-update pause midway. */
  | { op: 'getBatch'; outcomes: Outcome[]; pauseAfter: number | null; pauseOutcomes: Outcome[]; leave: number }
  /** pause(): acknowledge, settle what is held (aborted unless scripted otherwise), leaving `leave` groups out to hit the timeout. */
  | { op: 'pause'; outcomes: Outcome[]; leave: number }
  /** resume() with model step + k; then, when `thenBatch` is set, getBatch(next step) that many microtasks later (callbacks not flushed). */
  | { op: 'resume'; k: number; thenBatch?: number }
  /** The trainer's weight update: pause (as above), then resume as above. */
  | { op: 'weightUpdate'; outcomes: Outcome[]; leave: number; k: number; thenBatch?: number }
  /** snapshot → checkpoint bytes → fresh Producer + pool + samplers → restore → start. */
  | { op: 'restart' };

const outcomeArb: fc.Arbitrary<Outcome> = fc.oneof(
  { weight: 6, arbitrary: fc.constant<Outcome>({ kind: 'completed' }) },
  { weight: 1, arbitrary: fc.constant<Outcome>({ kind: 'equal-rewards' }) },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant('aborted' as const),
      tokens: fc.integer({ min: 0, max: 2 }),
      finished: fc.array(fc.boolean(), { minLength: 1, maxLength: 2 }),
    }),
  },
  { weight: 1, arbitrary: fc.constant<Outcome>({ kind: 'failed' }) },
);

/** Scripted outcomes for a run of groups: mostly mixed, sometimes a burst of failures (the failure budget). */
const outcomesArb = (maxLength: number): fc.Arbitrary<Outcome[]> =>
  fc.oneof(
    { weight: 6, arbitrary: fc.array(outcomeArb, { maxLength }) },
    { weight: 1, arbitrary: fc.array(fc.constant<Outcome>({ kind: 'failed' }), { minLength: 3, maxLength: 10 }) },
  );

const abortArb: fc.Arbitrary<Outcome> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      kind: fc.constant('aborted' as const),
      tokens: fc.integer({ min: 0, max: 2 }),
      finished: fc.array(fc.boolean(), { minLength: 1, maxLength: 2 }),
    }),
  },
  { weight: 1, arbitrary: outcomeArb },
);

const leaveArb = fc.oneof(
  { weight: 12, arbitrary: fc.constant(0) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 2 }) },
);

/** Microtasks between a resume and the trainer's next getBatch; absent: no getBatch in that op. */
const thenBatchArb = fc.option(fc.integer({ min: 0, max: 8 }), { nil: undefined });

const opArb: fc.Arbitrary<Op> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constant('settle' as const),
      picks: fc.array(fc.nat(7), { minLength: 1, maxLength: 6 }),
      outcomes: outcomesArb(4),
    }),
  },
  {
    weight: 6,
    arbitrary: fc.record({
      op: fc.constant('getBatch' as const),
      outcomes: outcomesArb(10),
      pauseAfter: fc.oneof(
        { weight: 4, arbitrary: fc.constant(null) },
        { weight: 1, arbitrary: fc.integer({ min: 0, max: 4 }) },
      ),
      pauseOutcomes: fc.array(abortArb, { maxLength: 4 }),
      leave: leaveArb,
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      op: fc.constant('weightUpdate' as const),
      outcomes: fc.array(abortArb, { maxLength: 4 }),
      leave: leaveArb,
      k: fc.integer({ min: 0, max: 2 }),
      thenBatch: thenBatchArb,
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant('pause' as const),
      outcomes: fc.array(abortArb, { maxLength: 4 }),
      leave: leaveArb,
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant('resume' as const),
      k: fc.integer({ min: 0, max: 2 }),
      thenBatch: thenBatchArb,
    }),
  },
  { weight: 1, arbitrary: fc.constant<Op>({ op: 'restart' }) },
);

function setupArb(strategy: 'sync' | 'async'): fc.Arbitrary<Setup> {
  return (
    fc
      .record({
        strategy: fc.constant(strategy),
        batchSize: fc.integer({ min: 2, max: 4 }),
        weights: fc.oneof(
          fc.constant<number[]>([1]),
          fc.tuple(fc.integer({ min: 1, max: 2 }), fc.integer({ min: 1, max: 2 })),
          // Extreme but valid ratios (issue 28 item 4): 1e300 takes the batch from 1e-300, 1 shares it
          // with neither or with both; every NORMAL batch must still hold batchSize groups.
          fc.array(fc.constantFrom(1e-300, 1, 1e300), { minLength: 2, maxLength: 3 }),
        ),
        groupSize: fc.integer({ min: 1, max: 3 }),
        filter: fc.constantFrom('none' as const, 'drop-equal-rewards' as const),
        partialRollout: fc.boolean(),
        maxStaleness: fc.integer({ min: 0, max: 2 }),
        overSampleThreshold: fc.constantFrom(0, 0.25, 0.5, 1),
        tailBatchTriggerSize: fc.constantFrom(-1, 0, 2),
        takeOrder: fc.constantFrom('fifo' as const, 'stalest' as const),
        pauseMode: fc.constantFrom('abort' as const, 'drain' as const),
        staleRollouts:
          strategy === 'async' ? fc.constantFrom('reset' as const, 'keep' as const) : fc.constant('reset' as const),
      })
      // A group of one never has a reward spread: drop-equal-rewards would filter every group, and no
      // batch would ever be complete.
      .filter((s) => !(s.groupSize === 1 && s.filter === 'drop-equal-rewards'))
  );
}

function configFor(s: Setup): ResolvedConfig {
  return resolveConfig({
    seed: 7,
    batchSize: s.batchSize,
    modelStep: 0,
    logLevel: 'silent',
    tasks: s.weights.map((weight, i) => ({
      name: `t${i}`,
      env: { module: 'builtin:arithmetic' },
      groupSize: s.groupSize ?? 2,
      weight,
      maxSteps: 1,
    })),
    llm: { url: LLM_URL, abortPath: null },
    workers: { threads: 1 },
    producer: {
      strategy: s.strategy,
      filter: s.filter,
      partialRollout: s.partialRollout,
      maxStaleness: s.maxStaleness,
      overSampleThreshold: s.overSampleThreshold,
      tailBatchTriggerSize: s.tailBatchTriggerSize,
      takeOrder: s.takeOrder,
      staleRollouts: s.staleRollouts ?? 'reset',
      tokenStalenessThreshold: s.tokenStalenessThreshold ?? null,
      syncWeightsInterval: s.syncWeightsInterval ?? 1,
    },
    pause: { mode: s.pauseMode, timeoutMs: 50, resignalIntervalMs: 10 },
  });
}

// ── helpers ─────────────────────────────────────────────────────────────────────────────────────

async function flush(): Promise<void> {
  for (let i = 0; i < 3; i++) await new Promise(setImmediate);
}

/** A safety net only: fires when something that must settle quickly hangs (a bug). */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not settle within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** What the worker threads do on a pause broadcast: count themselves in ACKS and wake the waiter. */
function acknowledge(control: PauseControl): void {
  const view = new Int32Array(control.block);
  Atomics.add(view, CONTROL.ACKS, 1);
  Atomics.notify(view, CONTROL.ACKS);
}

function describeOp(op: Op): string {
  return JSON.stringify(op);
}

// ── the model run ───────────────────────────────────────────────────────────────────────────────

class Run {
  readonly config: ResolvedConfig;
  /** The stale threshold: production stops at it, and (stale rollouts reset) a rollout expires at it. */
  readonly threshold: number;
  /** Whether a rollout expires for its age: not when stale rollouts are kept. */
  readonly expires: boolean;
  /** Every group id ever drawn from a sampler (across restarts). */
  readonly drawn = new Set<string>();
  /** Group ids the trainer took (across restarts). */
  readonly taken = new Set<string>();
  /** Group id → drop reason (across restarts). */
  readonly dropped = new Map<string, string>();
  readonly problems: string[] = [];
  readonly trace: string[] = [];
  trainStep = 1;
  /** A getBatch the test gave up on (a problem is recorded) is still pending. */
  batchPending = false;
  /** counts.scheduled + counts.retried, and landings, when the current Producer started. */
  #dispatchBase = 0;
  #landedBase = 0;
  producer!: Producer;
  pool!: ScriptedPool;
  control!: PauseControl;

  constructor(config: ResolvedConfig) {
    this.config = config;
    const p = config.producer;
    // Sync means staleness 0, measured against the weights being served (checkBatch).
    this.threshold =
      p.strategy === 'async' ? staleThreshold(p.maxStaleness, p.syncWeightsInterval) : staleThreshold(0, 1);
    this.expires = p.staleRollouts === 'reset';
  }

  /** A fresh Producer, pool, control block and samplers; restored from `snapshot` (before start) if given. */
  async build(snapshot?: ProducerSnapshot): Promise<void> {
    const { config } = this;
    const samplers = new Map<string, Sampler>();
    for (const task of config.tasks) {
      const sampler = await Sampler.create(task, config.seed);
      const draw = sampler.draw.bind(sampler);
      sampler.draw = () => {
        const group = draw();
        if (this.drawn.has(group.id)) this.problems.push(`group id ${group.id} drawn twice from the sampler`);
        this.drawn.add(group.id);
        return group;
      };
      samplers.set(task.name, sampler);
    }
    this.pool = new ScriptedPool({ partialRollout: config.producer.partialRollout });
    this.control = new PauseControl(0);
    this.producer = new Producer({
      config,
      pool: this.pool,
      control: this.control,
      samplers,
      log,
      endpoints: [LLM_URL],
      hooks: {},
    });
    const onDrop = this.producer.buffer.onDrop;
    this.producer.buffer.onDrop = (group, reason) => {
      onDrop?.(group, reason);
      if (this.dropped.has(group.id))
        this.problems.push(`group ${group.id} dropped twice (${this.dropped.get(group.id)}, then ${reason})`);
      this.dropped.set(group.id, reason);
    };
    if (snapshot !== undefined) this.producer.restore(snapshot);
    this.#dispatchBase = this.producer.counts.scheduled + this.producer.counts.retried;
    this.#landedBase = sumValues(this.producer.counts.landed);
    this.producer.start();
  }

  async apply(op: Op): Promise<void> {
    this.trace.push(describeOp(op));
    switch (op.op) {
      case 'settle': {
        op.picks.forEach((pick, i) => {
          const ids = this.pool.heldIds();
          if (ids.length > 0) this.pool.settle(ids[pick % ids.length], op.outcomes[i] ?? { kind: 'completed' });
        });
        break;
      }
      case 'getBatch':
        await this.getBatch(op);
        break;
      case 'pause':
        await this.pause(op.outcomes, op.leave);
        break;
      case 'weightUpdate':
        await this.pause(op.outcomes, op.leave);
        await this.resume(op.k, op.thenBatch);
        break;
      case 'resume':
        await this.resume(op.k, op.thenBatch);
        break;
      case 'restart': {
        const snapshot = this.producer.snapshot();
        // Through the checkpoint codec, as writeCheckpoint/readCheckpoint do: no object is shared.
        const bytes = encodeCheckpoint({ v: 1, producer: snapshot as unknown as Record<string, unknown> });
        const restored = decodeCheckpoint(bytes, 'memory').producer as ProducerSnapshot;
        await within(this.producer.close(), 2_000, 'close() of the producer being replaced');
        await this.build(restored);
        break;
      }
    }
    await flush();
    this.check();
  }

  async pause(outcomes: Outcome[], leave: number): Promise<void> {
    const pending = this.producer.pause();
    acknowledge(this.control);
    await flush();
    const ids = this.pool.heldIds().slice(leave);
    ids.forEach((id, i) => this.pool.settle(id, outcomes[i] ?? { kind: 'aborted', tokens: 1, finished: [false] }));
    const report = await within(pending, 2_000, 'pause()');
    this.trace.push(`  paused: ${JSON.stringify(report)}`);
    if (report.stillInFlight !== this.pool.heldCount) {
      this.problems.push(
        `pause() reported ${report.stillInFlight} groups still in flight, the pool holds ${this.pool.heldCount}`,
      );
    }
  }

  /**
   * resume() with model step + k, then (when `thenBatch` is set) getBatch `thenBatch` microtasks later:
   * the background loop woken by the resume has not finished its round yet, as with a real trainer
   * (regression: a getBatch in that window hung with maxStaleness 0).
   */
  async resume(k: number, thenBatch: number | undefined): Promise<void> {
    this.producer.resume(this.producer.modelStep + k);
    this.trace.push(`  resumed at model step ${this.producer.modelStep}`);
    if (thenBatch === undefined) return;
    for (let i = 0; i < thenBatch; i++) await Promise.resolve();
    this.trace.push(`  getBatch ${thenBatch} microtasks after the resume`);
    await this.getBatch({ op: 'getBatch', outcomes: [], pauseAfter: null, pauseOutcomes: [], leave: 0 });
  }

  async getBatch(op: Extract<Op, { op: 'getBatch' }>): Promise<void> {
    const step = this.trainStep;
    let result: { batch: Batch } | { error: unknown } | null = null;
    this.batchPending = true;
    void this.producer.getBatch(step).then(
      (batch) => {
        result = { batch };
        this.batchPending = false;
      },
      (error: unknown) => {
        result = { error };
        this.batchPending = false;
      },
    );
    let settled = 0;
    let pausedHere = false;
    for (let round = 0; ; round++) {
      await flush();
      if (result !== null) break;
      if (!pausedHere && op.pauseAfter !== null && round >= op.pauseAfter) {
        pausedHere = true;
        this.trace.push('  pause while getBatch waits');
        await this.pause(op.pauseOutcomes, op.leave);
        continue;
      }
      const ids = this.pool.heldIds();
      if (ids.length === 0) {
        this.problems.push(
          `getBatch(${step}) is still waiting with no group in flight (paused=${this.producer.paused}, modelStep=${this.producer.modelStep}, producerFutureStep=${this.producer.producerFutureStep})`,
        );
        return;
      }
      if (settled >= DRIVE_BOUND) {
        this.problems.push(`getBatch(${step}) did not settle after ${DRIVE_BOUND} groups came back`);
        return;
      }
      this.pool.settle(ids[0], op.outcomes[settled] ?? { kind: 'completed' });
      settled++;
    }
    const r = result as { batch: Batch } | { error: unknown };
    if ('error' in r) {
      const code = (r.error as { code?: string }).code;
      this.trace.push(`  getBatch(${step}) rejected: ${code} ${(r.error as Error).message}`);
      if (code !== 'ERR_TOO_MANY_FAILED_GROUPS')
        this.problems.push(`getBatch(${step}) rejected unexpectedly: ${String((r.error as Error).stack ?? r.error)}`);
      return;
    }
    this.checkBatch(step, r.batch);
  }

  checkBatch(step: number, batch: Batch): void {
    const { config } = this;
    this.trace.push(`  getBatch(${step}) → ${batch.status} [${batch.groups.map((g) => g.id).join(', ')}]`);
    if (batch.trainStep !== step) this.problems.push(`getBatch(${step}) answered for train step ${batch.trainStep}`);
    if (batch.status === 'UPDATE_WEIGHT_AND_ABORT') {
      if (!this.producer.paused)
        this.problems.push(`getBatch(${step}) answered UPDATE_WEIGHT_AND_ABORT while not paused`);
      return;
    }
    if (batch.status === 'EXPIRED_BATCH') {
      if (config.producer.strategy !== 'async')
        this.problems.push(`getBatch(${step}) answered EXPIRED_BATCH with the sync strategy`);
      else if (
        step - this.producer.modelStep - 1 <
        Math.min(this.threshold, config.producer.tokenStalenessThreshold ?? Infinity)
      ) {
        this.problems.push(
          `getBatch(${step}) answered EXPIRED_BATCH though model step ${this.producer.modelStep} is fresh enough (threshold ${this.threshold})`,
        );
      }
      return;
    }
    if (batch.groups.length !== config.batchSize)
      this.problems.push(
        `NORMAL batch for step ${step} has ${batch.groups.length} groups, batchSize is ${config.batchSize}`,
      );
    // What the workers read to stop in-flight rollouts that will expire on landing: in step with the
    // buffer's own expiry (a rollout holding a token older than it is reset at the next put).
    const oldest = Atomics.load(new Int32Array(this.control.block), CONTROL.OLDEST_USEFUL_STEP);
    const expected = config.producer.strategy === 'async' && this.expires ? step + 1 - this.threshold : NO_EXPIRY;
    if (oldest !== expected)
      this.problems.push(
        `after getBatch(${step}) the workers were told tokens older than step ${oldest} expire, not ${expected}`,
      );
    // The stats count the rollouts at or past the threshold at the train step (async only: sync
    // measures against the served weights, so it counts none).
    const past =
      config.producer.strategy === 'async'
        ? batch.groups.flatMap((g) => g.rollouts).filter((r) => rolloutStaleness(r, step) >= this.threshold).length
        : 0;
    if (batch.stats?.staleness.pastThreshold !== past)
      this.problems.push(
        `batch ${step} says ${batch.stats?.staleness.pastThreshold} rollouts are at or past the stale threshold, ${past} are`,
      );
    const shares = allocateBatch(config.batchSize, config.tasks);
    for (const [task, share] of shares) {
      const n = batch.groups.filter((g) => g.taskName === task).length;
      if (n !== share)
        this.problems.push(`NORMAL batch for step ${step} has ${n} groups of task ${task}, its share is ${share}`);
    }
    for (const group of batch.groups) {
      if (this.taken.has(group.id)) this.problems.push(`group ${group.id} taken twice (again at step ${step})`);
      if (!this.drawn.has(group.id)) this.problems.push(`group ${group.id} taken but never drawn`);
      this.taken.add(group.id);
      if (group.status !== Status.COMPLETED) this.problems.push(`group ${group.id} taken with status ${group.status}`);
      for (const r of group.rollouts) {
        if (r.status !== Status.COMPLETED) this.problems.push(`rollout ${r.id} taken with status ${r.status}`);
        if (config.producer.tokenStalenessThreshold !== null && r.turns.some((t) => (t.responseIds?.length ?? 0) > 0)) {
          const kept = r.turns.reduce(
            (n, t) => n + (t.lossMask ? t.lossMask.reduce((a, b) => a + b, 0) : (t.responseIds?.length ?? 0)),
            0,
          );
          if (kept === 0)
            this.problems.push(`rollout ${r.id} taken at step ${step} with every token masked out of the loss`);
        }
        const measuredAt = config.producer.strategy === 'sync' ? this.producer.modelStep + 1 : step;
        const s = rolloutStaleness(r, measuredAt);
        if (this.expires && s >= this.threshold)
          this.problems.push(
            `rollout ${r.id} taken at step ${step} (model step ${this.producer.modelStep}) with staleness ${s} ≥ threshold ${this.threshold}, measured at step ${measuredAt}`,
          );
      }
    }
    this.trainStep = step + 1;
  }

  /** The accounting invariant; call with callbacks flushed. */
  check(): void {
    const { producer, pool } = this;
    const places = new Map<string, string[]>();
    const at = (id: string, where: string) => {
      const list = places.get(id) ?? [];
      list.push(where);
      places.set(id, list);
    };
    const held = pool.heldIds();
    const stored = producer.buffer.snapshot().groups.map((g) => g.id);
    for (const id of held) at(id, 'in flight');
    for (const id of stored) at(id, 'stored');
    for (const id of this.taken) at(id, 'taken');
    for (const [id, reason] of this.dropped) at(id, `dropped ${reason}`);
    for (const id of this.drawn) {
      const where = places.get(id) ?? [];
      if (where.length !== 1) this.problems.push(`group ${id} is in ${where.length} places: [${where.join(', ')}]`);
    }
    for (const id of places.keys())
      if (!this.drawn.has(id)) this.problems.push(`group ${id} is accounted for but was never drawn`);
    const c = producer.counts;
    const droppedTotal = c.dropped.FAILED + c.dropped.FILTERED + c.dropped.EXPIRED;
    // Kept stale rollouts: nothing expires for its age, so without the token-level mask nothing expires.
    if (!this.expires && this.config.producer.tokenStalenessThreshold === null) {
      const pooled = this.config.tasks.reduce((n, t) => n + producer.expired(t.name), 0);
      if (c.dropped.EXPIRED + pooled > 0)
        this.problems.push(
          `stale rollouts are kept, yet ${c.dropped.EXPIRED} groups were dropped EXPIRED and ${pooled} wait in the EXPIRED pool`,
        );
    }
    if (producer.inFlightTotal !== held.length || c.inFlight !== held.length) {
      this.problems.push(
        `in flight: producer says ${producer.inFlightTotal} (counts ${c.inFlight}), the pool holds ${held.length}`,
      );
    }
    if (c.scheduled !== this.drawn.size)
      this.problems.push(`counts.scheduled ${c.scheduled} ≠ ${this.drawn.size} groups drawn`);
    if (c.scheduled !== c.inFlight + stored.length + c.taken + droppedTotal) {
      this.problems.push(
        `counts.scheduled ${c.scheduled} ≠ inFlight ${c.inFlight} + stored ${stored.length} + taken ${c.taken} + dropped ${droppedTotal}`,
      );
    }
    if (c.taken !== this.taken.size)
      this.problems.push(`counts.taken ${c.taken} ≠ ${this.taken.size} groups the trainer took`);
    if (droppedTotal !== this.dropped.size)
      this.problems.push(
        `counts.dropped total ${droppedTotal} ≠ ${this.dropped.size} groups seen through buffer.onDrop`,
      );
    // Every dispatch is a fresh draw or a retry, and every dispatch lands once or is still out.
    const dispatched = c.scheduled + c.retried - this.#dispatchBase;
    if (dispatched !== pool.sent.length)
      this.problems.push(
        `counts.scheduled + counts.retried grew by ${dispatched}, the pool received ${pool.sent.length} groups`,
      );
    const landed = sumValues(c.landed) - this.#landedBase;
    if (landed !== pool.sent.length - held.length)
      this.problems.push(`counts.landed grew by ${landed}, the pool returned ${pool.sent.length - held.length} groups`);
    // Progress: consumed counts are the groups the trainer took, per task.
    for (const task of this.config.tasks) {
      let n = 0;
      for (const id of this.taken) if (id.startsWith(`${task.name}/`)) n++;
      if (producer.progress.consumedGroups[task.name] !== n)
        this.problems.push(
          `progress.consumedGroups[${task.name}] = ${producer.progress.consumedGroups[task.name]}, the trainer took ${n}`,
        );
    }
    // Async: the producer schedules toward target + over-sampling and no further — taking groups
    // never makes it re-make them (docs/ARCHITECTURE.md, "The producer's states": progress counts are absolute and cumulative).
    if (this.config.producer.strategy === 'async') {
      const shares = allocateBatch(this.config.batchSize, this.config.tasks);
      for (const task of this.config.tasks) {
        const share = shares.get(task.name)!;
        const bound =
          producer.progress.targetGroups[task.name] + Math.ceil(this.config.producer.overSampleThreshold * share);
        const have =
          producer.progress.consumedGroups[task.name] + producer.completed(task.name) + producer.inFlight(task.name);
        if (have > bound) {
          this.problems.push(
            `task ${task.name}: consumed + completed + in flight = ${have} exceeds target + over-sampling = ${bound}`,
          );
        }
      }
    }
    if (producer.progress.nextTrainStep > this.trainStep)
      this.problems.push(
        `progress.nextTrainStep ${producer.progress.nextTrainStep} is past the next step the trainer asks for (${this.trainStep})`,
      );
    // Expired groups are retried only when tailBatchTriggerSize ≥ 0; otherwise they are dropped and counted.
    if (this.config.producer.tailBatchTriggerSize < 0) {
      for (const g of producer.buffer.snapshot().groups) {
        if (g.status === Status.EXPIRED)
          this.problems.push(
            `group ${g.id} is stored EXPIRED though tailBatchTriggerSize is −1 (expired groups are dropped, never retried)`,
          );
      }
    }
    for (const v of pool.violations) this.problems.push(v);
    pool.violations.length = 0;
  }

  async close(): Promise<void> {
    // A getBatch still pending (already reported as a problem) is left alone: closing under it is not
    // what this test is about, and the sync getBatch loop would then spin on its microtasks forever.
    if (this.batchPending) return;
    if (this.producer.paused) this.producer.resume(this.producer.modelStep);
    await within(this.producer.close(), 2_000, 'close()');
  }
}

function sumValues(record: Record<string, number>): number {
  let n = 0;
  for (const v of Object.values(record)) n += v;
  return n;
}

async function runOps(setup: Setup, ops: Op[]): Promise<void> {
  const run = new Run(configFor(setup));
  await run.build();
  await flush();
  run.check();
  try {
    for (const op of ops) {
      await run.apply(op);
      if (run.problems.length > 0) break;
    }
  } finally {
    await run.close();
  }
  if (run.problems.length > 0) {
    assert.fail(`${run.problems.join('\n')}\n--- trace ---\n${run.trace.join('\n')}`);
  }
}

const opsArb = fc.array(opArb, { minLength: 1, maxLength: 30, size: 'max' });

/**
 * Found by the property below (shrunk counterexample). Two tasks, async, over-sampling 1 extra group
 * per task, stale threshold 2. Task t1's extra group t1/2 is made at model step 0 and is still
 * COMPLETED in the buffer when getBatch(3) refreshes the buffer: staleness 3 − 0 − 1 = 2 expires it.
 * The background loop is at that moment inside its round for step 3, waiting only for t0's groups
 * (t1's strategy call already returned NORMAL), so getBatch's `#changed.notify()` reaches no waiter.
 * When t0's groups land the round ends and the loop parks in `await this.#changed.wait()` (step 4 is
 * too stale to run ahead) without re-checking that t1 is now short (available 2 < target 3): nothing
 * is in flight, nothing will ever land, and getBatch(3) waits forever.
 */
const lostWakeUp: [Setup, Op[]] = [
  {
    strategy: 'async',
    batchSize: 2,
    weights: [1, 1],
    filter: 'none',
    partialRollout: false,
    maxStaleness: 1,
    overSampleThreshold: 0.25,
    tailBatchTriggerSize: -1,
    takeOrder: 'fifo',
    pauseMode: 'abort',
  },
  [
    { op: 'getBatch', outcomes: [], pauseAfter: null, pauseOutcomes: [], leave: 0 },
    { op: 'settle', picks: [0, 0], outcomes: [] },
    { op: 'weightUpdate', outcomes: [], leave: 0, k: 1 },
    { op: 'getBatch', outcomes: [], pauseAfter: null, pauseOutcomes: [], leave: 0 },
    { op: 'getBatch', outcomes: [], pauseAfter: null, pauseOutcomes: [], leave: 0 },
  ],
];

const asyncBase: Setup = {
  strategy: 'async',
  batchSize: 2,
  weights: [1],
  filter: 'none',
  partialRollout: false,
  maxStaleness: 0,
  overSampleThreshold: 0,
  tailBatchTriggerSize: 0,
  takeOrder: 'fifo',
  pauseMode: 'abort',
};
const getBatchOp: Op = { op: 'getBatch', outcomes: [], pauseAfter: null, pauseOutcomes: [], leave: 0 };

/**
 * Token-level mask (not in the generated configs). maxStaleness 0 × syncWeightsInterval 2 gives a stale
 * threshold of 2, so the trainer syncs weights every 2 steps and getBatch(2) at model step 0 is the
 * normal flow; tokenStalenessThreshold 1 masks every token generated at step 0 for train step 2. In
 * `#tryTake` both groups lose all their tokens, are reset EXPIRED and put back — with no
 * `#changed.notify()`, so the background loop (parked: its targets were met) never replaces them, and
 * getBatch(2) waits with nothing in flight. Even woken, it would regenerate at model step 0 and mask
 * again: `isModelExpired` only knows the group threshold, so EXPIRED_BATCH is never answered.
 */
const tokenMaskStall: [Setup, Op[]] = [
  { ...asyncBase, syncWeightsInterval: 2, tokenStalenessThreshold: 1 },
  [getBatchOp, getBatchOp],
];

/**
 * Token-level mask with tailBatchTriggerSize −1 (expired groups are not retryable). Group t0/1 is made
 * at model step 0; at train step 2 all its tokens are masked, `applyTokenMask` resets its members
 * EXPIRED and `#tryTake` puts it back with `buffer.put(group, expiry)` — which stores it in the EXPIRED
 * pool (applyExpiry only looks at COMPLETED/ABORTED members) instead of dropping and counting it. With
 * trigger −1 that pool is never drawn from: the group sits in the buffer for good.
 */
const tokenMaskNotDropped: [Setup, Op[]] = [
  {
    ...asyncBase,
    weights: [1, 1],
    maxStaleness: 1,
    overSampleThreshold: 1,
    tailBatchTriggerSize: -1,
    tokenStalenessThreshold: 1,
  },
  [
    getBatchOp,
    { op: 'weightUpdate', outcomes: [], leave: 0, k: 2 },
    { op: 'settle', picks: [0, 0, 0, 0], outcomes: [] },
    getBatchOp,
  ],
];

/**
 * The standard trainer loop with maxStaleness 0: getBatch(1), a weight update that finds nothing in
 * flight, resume(1), getBatch(2) at once. The resume wakes the background loop, which reads future
 * step 1 and runs a round for it (met at once: 2 consumed ≥ target 2); getBatch(2) pulls the future
 * step to 2 before that round ends; the round then advanced it from 2 to 3 instead of from 1 to 2. Step
 * 3 is too stale for model step 1, so the loop parked there without ever setting targets for step 2,
 * and getBatch(2) waited with nothing in flight. How many microtasks the window is depends on the
 * loop's code, so the example tries every delay from 0 to 8.
 */
const resumeThenBatch = (ticks: number): [Setup, Op[]] => [
  asyncBase,
  [
    getBatchOp,
    { op: 'weightUpdate', outcomes: [], leave: 0, k: 1, thenBatch: ticks },
    { op: 'weightUpdate', outcomes: [], leave: 0, k: 1, thenBatch: ticks },
    { op: 'resume', k: 1, thenBatch: ticks },
  ],
];

describe('producer bookkeeping under random operations', () => {
  it('async production with maxStaleness 0 produces the next batch after a pause and resume (regression: getBatch hung with the future step past the consumer)', async () => {
    for (let ticks = 0; ticks <= 8; ticks++) await runOps(...resumeThenBatch(ticks));
  });

  it('keeps producing for a task whose completed groups expire while the background round waits on another task', async () => {
    await runOps(...lostWakeUp);
  });

  it('answers getBatch when the token-level mask expires every group taken for the step', async () => {
    await runOps(...tokenMaskStall);
  });

  it('drops a group the token-level mask expires when expired groups are not retried', async () => {
    await runOps(...tokenMaskNotDropped);
  });

  it('accounts for every group exactly once with the sync strategy, through batches, pauses, resumes and restarts', async () => {
    await fc.assert(fc.asyncProperty(setupArb('sync'), opsArb, runOps), { numRuns: 150 });
  });

  it('accounts for every group exactly once with the async strategy, and never hands out a batch too stale to train on unless stale rollouts are kept', async () => {
    await fc.assert(fc.asyncProperty(setupArb('async'), opsArb, runOps), { numRuns: 300 });
  });
});

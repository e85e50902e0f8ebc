/**
 * A bounded pool of environment actors (the reference Interactor's ActorPool): at most `size` actors
 * alive at once, a fresh actor per episode, and an optional budget of episodes after which the pool is
 * "exhausted" — a clean end, not an error: `acquire` resolves null and the caller stops.
 *
 * Actors are never reused: an episode leaves an environment in a state only that episode knows, and a
 * remote actor's id must not be reset by two episodes. `done` always closes the actor (a DELETE for an
 * HTTP actor) and only then frees its slot, so the servers never hold more than `size` of our actors.
 *
 * Waiting is promise-based (a FIFO of resolvers woken by `done` / `close`), never polling.
 *
 * With `timeoutMs`, close() is bounded (env/bounded.ts): a close that never settles counts as a
 * close error and frees its slot when the time is up, so one hung actor cannot hold a slot for ever.
 * create() is not: what it waits for may be a module's first import (seconds, legitimately); the
 * caller bounds what it calls in it (rollout/worker-runtime.ts bounds the factory call).
 */
import { RolloutEngineError } from '../protocol/errors.ts';
import { settleWithin } from './bounded.ts';
import type { Environment } from './types.ts';

export interface ActorPoolOptions {
  /** Actors alive at once (handed out and not yet done); a positive integer (Number.MAX_SAFE_INTEGER = no bound). */
  size: number;
  /** Makes one actor; called once per `acquire` that gets a slot. */
  create: () => Environment | Promise<Environment>;
  /** Actors handed out over the pool's life before it is exhausted; null / undefined = no budget. */
  maxEpisodes?: number | null;
  /** Reachability check and connection warm-up (e.g. HttpEnvironments.prewarm); run once by `prewarm()`. */
  prewarm?: () => Promise<void>;
  /** Told when an actor's close() throws; the slot is freed and the actor counted as recycled anyway. */
  onCloseError?: (err: unknown, env: Environment) => void;
  /** Bound on each actor's close() call; null / undefined = none. */
  timeoutMs?: number | null;
  /** The error of a close() over `timeoutMs`. */
  timedOut?: () => Error;
}

export interface ActorPool {
  /**
   * A fresh actor once a slot is free (waiters are served first come, first served), or null when the
   * pool is closed or `maxEpisodes` actors have been handed out. Rejects with ERR_ACTOR_POOL_ABORTED
   * when `signal` aborts first, or with create()'s error.
   */
  acquire(signal?: AbortSignal): Promise<Environment | null>;
  /** Ends an actor: closes it, frees its slot. `failed`: it misbehaved (counted in `recycled`). Never rejects for a close error. */
  done(env: Environment, failed: boolean): Promise<void>;
  /** Runs the `prewarm` option once (again after a failure); resolves at once without one. */
  prewarm(): Promise<void>;
  /** Wakes every waiter with null; later `acquire`s resolve null. Actors still out are closed by their `done`. */
  close(): Promise<void>;
  readonly size: number;
  /** Slots taken: actors handed out (or being created / closed) and not yet released. */
  readonly busy: number;
  /** `acquire` calls waiting for a slot. */
  readonly waiting: number;
  /** Actors handed out over the pool's life (what `maxEpisodes` bounds). */
  readonly handedOut: number;
  /** Actors ended as failed, or whose close() threw. */
  readonly recycled: number;
}

interface Waiter {
  resolve(env: Environment | null): void;
  reject(err: unknown): void;
  /** Detaches the abort listener once the waiter is settled. */
  cleanup(): void;
}

export function createActorPool(options: ActorPoolOptions): ActorPool {
  return new Pool(options);
}

/**
 * Invariants (checked by the tests, kept by every method below):
 * - 0 ≤ busy ≤ size; a slot is taken before create() runs and freed only after the actor's close() settled;
 * - waiters are non-empty only while the pool is open and either busy = size, or the budget is fully
 *   reserved with a create() still pending (otherwise they would have been served or woken with null);
 * - handedOut ≤ maxEpisodes; it counts reservations, so concurrent acquires never overshoot the budget,
 *   and a create() that throws gives its reservation back (and the slot, to the next waiter);
 * - every actor is in `#out` from hand-out until its `done`, so a second `done` is caught, not double-counted.
 */
class Pool implements ActorPool {
  readonly size: number;
  readonly #create: ActorPoolOptions['create'];
  readonly #maxEpisodes: number | null;
  readonly #prewarm: (() => Promise<void>) | undefined;
  readonly #onCloseError: ActorPoolOptions['onCloseError'];
  readonly #timeoutMs: number | null;
  readonly #timedOut: () => Error;
  readonly #waiters: Waiter[] = [];
  readonly #out = new Set<Environment>();
  #busy = 0;
  #handedOut = 0;
  #recycled = 0;
  /** create() calls in progress (their reservations are counted in #handedOut and #busy). */
  #creating = 0;
  #closed = false;
  #prewarming: Promise<void> | null = null;

  constructor(options: ActorPoolOptions) {
    if (!Number.isInteger(options.size) || options.size < 1)
      throw new RangeError(`actor pool size must be a positive integer (got ${options.size})`);
    const max = options.maxEpisodes ?? null;
    if (max !== null && (!Number.isInteger(max) || max < 0))
      throw new RangeError(`actor pool maxEpisodes must be an integer >= 0 or null (got ${max})`);
    this.size = options.size;
    this.#create = options.create;
    this.#maxEpisodes = max;
    this.#prewarm = options.prewarm;
    this.#onCloseError = options.onCloseError;
    this.#timeoutMs = options.timeoutMs ?? null;
    this.#timedOut =
      options.timedOut ??
      (() =>
        new RolloutEngineError('ERR_ENV_TIMEOUT', `environment close() did not settle within ${this.#timeoutMs} ms`));
  }

  get busy(): number {
    return this.#busy;
  }
  get waiting(): number {
    return this.#waiters.length;
  }
  get handedOut(): number {
    return this.#handedOut;
  }
  get recycled(): number {
    return this.#recycled;
  }

  acquire(signal?: AbortSignal): Promise<Environment | null> {
    if (signal?.aborted) return Promise.reject(abortedError(signal));
    if (this.#finished()) return Promise.resolve(null);
    // FIFO: a newcomer never overtakes a waiter (and while anyone waits, no slot is free anyway).
    if (this.#waiters.length === 0 && this.#busy < this.size && !this.#spent()) return this.#handOut();
    return new Promise<Environment | null>((resolve, reject) => {
      const onAbort = () => {
        const i = this.#waiters.indexOf(waiter);
        if (i >= 0) this.#waiters.splice(i, 1);
        reject(abortedError(signal!));
      };
      const waiter: Waiter = {
        resolve,
        reject,
        cleanup: () => signal?.removeEventListener('abort', onAbort),
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.#waiters.push(waiter);
    });
  }

  async done(env: Environment, failed: boolean): Promise<void> {
    if (!this.#out.delete(env))
      throw new RolloutEngineError(
        'ERR_ACTOR_POOL_MISUSE',
        'actor pool: done() called for an actor that is not out (called twice, or the actor came from another pool)',
      );
    let recycle = failed;
    try {
      const closing = env.close?.();
      await (this.#timeoutMs === null
        ? closing
        : settleWithin(closing, { timeoutMs: this.#timeoutMs, timedOut: this.#timedOut }));
    } catch (err) {
      recycle = true;
      this.#onCloseError?.(err, env);
    }
    if (recycle) this.#recycled += 1;
    this.#busy -= 1;
    this.#dispatch();
  }

  prewarm(): Promise<void> {
    if (this.#prewarm === undefined) return Promise.resolve();
    this.#prewarming ??= this.#prewarm().catch((err: unknown) => {
      this.#prewarming = null; // a failed check is not cached: a later call checks again
      throw err;
    });
    return this.#prewarming;
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#wakeAllWithNull();
  }

  /** Every episode of the budget is reserved (some may still be being created). */
  #spent(): boolean {
    return this.#maxEpisodes !== null && this.#handedOut >= this.#maxEpisodes;
  }

  /**
   * No actor will ever be handed out again: closed, or the budget is spent and no create() is pending
   * (a pending one may still fail and give its reservation back, so until then waiters keep waiting).
   */
  #finished(): boolean {
    return this.#closed || (this.#spent() && this.#creating === 0);
  }

  /** Takes a slot and a reservation, then creates the actor; gives both back if create() throws. */
  async #handOut(): Promise<Environment> {
    this.#busy += 1;
    this.#handedOut += 1;
    this.#creating += 1;
    try {
      const env = await this.#create();
      this.#creating -= 1;
      this.#out.add(env);
      // If that was the budget's last actor, the waiters learn now that none will come.
      this.#dispatch();
      return env;
    } catch (err) {
      this.#creating -= 1;
      this.#busy -= 1;
      this.#handedOut -= 1;
      this.#dispatch();
      throw err;
    }
  }

  /** Serves waiters, in order, while slots and budget allow; wakes them with null once nothing can come. */
  #dispatch(): void {
    if (this.#finished()) {
      this.#wakeAllWithNull();
      return;
    }
    while (this.#waiters.length > 0 && this.#busy < this.size && !this.#spent()) {
      const waiter = this.#waiters.shift()!;
      waiter.cleanup();
      this.#handOut().then(waiter.resolve, waiter.reject);
    }
  }

  #wakeAllWithNull(): void {
    for (const waiter of this.#waiters.splice(0)) {
      waiter.cleanup();
      waiter.resolve(null);
    }
  }
}

function abortedError(signal: AbortSignal): RolloutEngineError {
  const reason = signal.reason instanceof Error ? signal.reason.message : String(signal.reason ?? 'aborted');
  return new RolloutEngineError('ERR_ACTOR_POOL_ABORTED', `waiting for an environment actor was cancelled: ${reason}`, {
    cause: signal.reason,
  });
}

import type { CancelSignal } from './cancel.ts';

/**
 * A counting semaphore with a first-come-first-served queue: the bound on episodes a worker runs at
 * once (`workers.rolloutsPerWorker`) and on inference calls in flight (`llm.maxConcurrency`).
 *
 * Invariants: 0 ≤ taken ≤ size; the queue is non-empty only while taken = size (a release hands its
 * slot straight to the oldest waiter, so `taken` does not dip and a newcomer cannot overtake).
 */
export class Slots {
  readonly size: number;
  #taken = 0;
  readonly #waiters: { grant(): void; cleanup(): void }[] = [];

  /** `size` = Infinity: never waits (acquire resolves at once). */
  constructor(size: number) {
    if (!(size === Infinity || (Number.isInteger(size) && size >= 1)))
      throw new RangeError(`slots size must be a positive integer or Infinity (got ${size})`);
    this.size = size;
  }

  get taken(): number {
    return this.#taken;
  }

  get waiting(): number {
    return this.#waiters.length;
  }

  /** Resolves once a slot is held; rejects with `signal`'s reason if it aborts first (no slot is then held). */
  acquire(signal?: CancelSignal): Promise<void> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.#taken < this.size) {
      this.#taken++;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => {
        const i = this.#waiters.indexOf(waiter);
        if (i >= 0) this.#waiters.splice(i, 1);
        reject(signal!.reason);
      };
      const waiter = {
        grant: () => {
          waiter.cleanup();
          resolve();
        },
        cleanup: () => signal?.removeEventListener('abort', onAbort),
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.#waiters.push(waiter);
    });
  }

  release(): void {
    if (this.#taken === 0) throw new Error('Slots.release() without a slot held');
    const next = this.#waiters.shift();
    if (next)
      next.grant(); // the slot passes to the next waiter: `taken` stays the same
    else this.#taken--;
  }
}

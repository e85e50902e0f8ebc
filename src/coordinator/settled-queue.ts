/**
 * Results of in-flight promises in the order they settle, awaited one at a time — the producer's
 * "wait for the next finished group" without re-racing every pending promise on each turn.
 *
 * Invariant: `size` = promises added and not yet handed out by `next()`. Added promises must not
 * reject (the worker pool's `runGroup` never does).
 */
export class SettledQueue<T> {
  readonly #ready: T[] = [];
  readonly #waiters: ((value: T) => void)[] = [];
  #size = 0;

  get size(): number {
    return this.#size;
  }

  add(promise: Promise<T>): void {
    this.#size++;
    void promise.then((value) => {
      const waiter = this.#waiters.shift();
      if (waiter) waiter(value);
      else this.#ready.push(value);
    });
  }

  /** The next settled value; rejects at once when nothing is in flight (waiting would hang forever). */
  next(): Promise<T> {
    if (this.#size === 0) return Promise.reject(new Error('SettledQueue.next() with nothing in flight'));
    this.#size--;
    if (this.#ready.length > 0) return Promise.resolve(this.#ready.shift()!);
    return new Promise((resolve) => this.#waiters.push(resolve));
  }
}

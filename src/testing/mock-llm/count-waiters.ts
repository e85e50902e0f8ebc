/** Promises that resolve once a count reaches a value (waitForInFlight, waitForRequests): no polling. */
export class CountWaiters {
  readonly #current: () => number;
  /** Unresolved waits; each is resolved (and removed) by the first notify() that finds its count reached. */
  readonly #waiting: { count: number; resolve: () => void }[] = [];

  constructor(current: () => number) {
    this.#current = current;
  }

  wait(count: number): Promise<void> {
    if (this.#current() >= count) return Promise.resolve();
    return new Promise((resolve) => this.#waiting.push({ count, resolve }));
  }

  /** Call after every change of the count. */
  notify(): void {
    const waiting = this.#waiting;
    for (let i = waiting.length - 1; i >= 0; i--)
      if (this.#current() >= waiting[i].count) waiting.splice(i, 1)[0].resolve();
  }
}

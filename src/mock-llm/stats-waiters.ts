/**
 * Promises that resolve once a test over the server's stats holds (waitForStats, waitForInFlight,
 * waitForRequests): no polling. The
 * parts whose counts the stats read call `changed()` after every change — a request arrives, starts
 * or stops generating, is held or released by `hangRate` — and each waiter is tested again then.
 */
export class StatsWaiters<S> {
  readonly #stats: () => S;
  /** Unresolved waits; each is resolved (and removed) by the first check that finds its test true. */
  readonly #waiting = new Set<{ test: (stats: S) => boolean; resolve: () => void }>();

  constructor(stats: () => S) {
    this.#stats = stats;
  }

  wait(test: (stats: S) => boolean): Promise<void> {
    if (test(this.#stats())) return Promise.resolve();
    return new Promise((resolve) => this.#waiting.add({ test, resolve }));
  }

  changed(): void {
    if (this.#waiting.size === 0) return;
    const now = this.#stats();
    for (const waiter of [...this.#waiting]) {
      if (waiter.test(now)) {
        this.#waiting.delete(waiter);
        waiter.resolve();
      }
    }
  }
}

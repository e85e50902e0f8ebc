/**
 * "Something changed" as an awaitable: every `wait()` pending when `notify()` is called resolves.
 * Waiters re-check their own condition afterwards, so a spurious wake-up is harmless and a missed
 * one impossible (the condition is checked before waiting, on the same tick).
 */
export class Notifier {
  #waiters: (() => void)[] = [];

  wait(): Promise<void> {
    return new Promise((resolve) => this.#waiters.push(resolve));
  }

  notify(): void {
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const resolve of waiters) resolve();
  }
}

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

/**
 * A wake-up for one waiter that is never lost: a `notify()` while nobody waits is remembered, and the
 * next `wait()` returns at once. The background production loop parks on this; a notify that
 * arrives while it is busy in a round must still make it look again afterwards.
 */
export class WakeUp {
  #pending = false;
  #waiter: (() => void) | null = null;

  wait(): Promise<void> {
    if (this.#pending) {
      this.#pending = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => (this.#waiter = resolve));
  }

  notify(): void {
    const waiter = this.#waiter;
    this.#waiter = null;
    if (waiter) waiter();
    else this.#pending = true;
  }
}

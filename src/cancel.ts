/**
 * What a cancellable operation needs of a signal — the part of AbortSignal that undici, the slots and
 * the inference client use. An AbortSignal is one; so is a CancelHub.
 */
export interface CancelSignal {
  readonly aborted: boolean;
  readonly reason: unknown;
  addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }): void;
  removeEventListener(type: 'abort', listener: () => void): void;
}

/**
 * A cancel signal for many concurrent listeners. Every inference call in flight on a worker listens on
 * the one pause signal, and Node's EventTarget walks its whole listener list on each add and remove
 * (a duplicate check): with thousands of calls in flight that is O(calls) per call. Here both are a
 * Set operation. Listeners run once, on the first abort(); later ones are ignored.
 */
export class CancelHub implements CancelSignal {
  #aborted = false;
  #reason: unknown = undefined;
  readonly #listeners = new Set<() => void>();

  get aborted(): boolean {
    return this.#aborted;
  }

  get reason(): unknown {
    return this.#reason;
  }

  addEventListener(_type: 'abort', listener: () => void): void {
    if (!this.#aborted) this.#listeners.add(listener);
  }

  removeEventListener(_type: 'abort', listener: () => void): void {
    this.#listeners.delete(listener);
  }

  abort(reason: unknown): void {
    if (this.#aborted) return;
    this.#aborted = true;
    this.#reason = reason;
    const listeners = [...this.#listeners];
    this.#listeners.clear();
    for (const listener of listeners) listener();
  }
}

/** setTimeout as a promise that `signal` cuts short (rejecting with its reason). */
export function delay(ms: number, signal?: CancelSignal): Promise<void> {
  if (signal?.aborted) return Promise.reject(signal.reason);
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

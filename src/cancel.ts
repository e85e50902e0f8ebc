/**
 * What a cancellable operation needs of a signal — the part of AbortSignal that undici, the slots and
 * the inference client use.
 *
 * Tried and measured: a Set-based hub for the calls in flight, since Node's EventTarget walks its
 * listener list on every add and remove. At the tens to hundreds of calls a worker holds it cost as
 * much or more per call than the walk (≈33 vs ≈30 µs per undici call in a loop of 32; a Set keyed by a
 * fresh closure per call has to hash each one), so inference calls listen on the gate's AbortSignal.
 */
export interface CancelSignal {
  readonly aborted: boolean;
  readonly reason: unknown;
  addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }): void;
  removeEventListener(type: 'abort', listener: () => void): void;
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

/**
 * What a cancellable operation needs of a signal — the part of AbortSignal that undici, the slots and
 * the inference client use.
 *
 * Inference calls do not add a listener each: the client keeps its calls in flight per signal and
 * puts one listener on the signal (llm/exchange.ts). (An earlier try, a Set-based hub beside undici's
 * `request()`, measured no cheaper on its own; the gain came with dropping `request()`'s body stream
 * too, and the two were not measured apart.)
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

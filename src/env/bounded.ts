/**
 * Time bounds on user code that may never settle: environment calls and episode hooks
 * (`tasks[].env.timeoutMs`). The watchdog only catches a blocked event loop; a promise that never
 * settles blocks nothing and would hold its episode, its group and its actor slot for ever.
 *
 * A value that is not a promise passes through untouched (no timer, no allocation): the synthetic
 * environments answer synchronously on the hot path. The call itself cannot be stopped — JavaScript
 * has no way to — so the caller must treat whatever it called as broken (discard the actor).
 */
import { EnvError, type EnvErrorCode } from './errors.ts';

type MaybePromise<T> = T | Promise<T>;

export interface Bound {
  timeoutMs: number;
  /** The error a late call rejects with; made only when the time is up. */
  timedOut: () => Error;
  /** Gives up at once when it aborts (a pause cancelling in-flight work), with `cancelled()`. */
  signal?: AbortSignal;
  cancelled?: () => Error;
}

/** `value`, or a rejection once `bound.timeoutMs` passed (or `bound.signal` aborted) first. */
export function settleWithin<T>(value: MaybePromise<T>, bound: Bound): MaybePromise<T> {
  if (!isThenable(value)) return value;
  const { signal } = bound;
  if (signal?.aborted && bound.cancelled !== undefined) {
    value.then(undefined, () => undefined); // a late rejection of an abandoned call is nobody's error
    return Promise.reject(bound.cancelled());
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => {
      done();
      reject(bound.cancelled!());
    };
    // Not unref'd: the bound must fire even when nothing else keeps the thread's loop alive.
    const timer = setTimeout(() => {
      done();
      reject(bound.timedOut());
    }, bound.timeoutMs);
    const done = () => {
      clearTimeout(timer);
      if (bound.cancelled !== undefined) signal?.removeEventListener('abort', onAbort);
    };
    if (bound.cancelled !== undefined) signal?.addEventListener('abort', onAbort, { once: true });
    value.then(
      (v) => {
        done();
        resolve(v);
      },
      (err: unknown) => {
        done();
        reject(err);
      },
    );
  });
}

/** The error of a call that did not settle in time, naming the option that bounds it. */
export function timeoutError(
  code: Extract<EnvErrorCode, 'ERR_ENV_TIMEOUT' | 'ERR_HOOK_TIMEOUT'>,
  taskName: string,
  call: string,
  timeoutMs: number,
  consequence: string,
): EnvError {
  return new EnvError(
    code,
    `task ${JSON.stringify(taskName)}: ${call} did not settle within ${timeoutMs} ms (tasks[].env.timeoutMs); ${consequence}`,
  );
}

/** Whether `value` is a promise (to wait for) rather than a value already there. */
export function isThenable<T>(value: MaybePromise<T>): value is Promise<T> {
  return typeof (value as { then?: unknown } | null)?.then === 'function';
}

/**
 * Every call into a task's user code from an episode — environment reset / getTaskPrompt / step and
 * the episode hooks — goes through the task's guard, which
 * - bounds it by `tasks[].env.timeoutMs` (env/bounded.ts): a call that never settles fails its
 *   rollout with ERR_ENV_TIMEOUT (a hook's is ignored, ERR_HOOK_TIMEOUT) instead of holding the
 *   episode, its group and its actor slot for ever;
 * - gives up on a pending environment call when a pause escalates to cancelling in-flight work
 *   (ERR_ENV_CANCELLED: the rollout comes back ABORTED, its actor is discarded), so a hung call does
 *   not hold a weight update or a shutdown either. Hooks are not cancelled: they only get the bound;
 * - marks the rollout as inside user code while the call runs synchronously (protocol/env-watch.ts),
 *   so a worker that dies there is blamed on this rollout alone.
 */
import { isThenable, settleWithin, timeoutError } from '../env/bounded.ts';
import { EnvError } from '../env/errors.ts';
import type { EnvCall, EnvWatchSlot } from '../protocol/env-watch.ts';
import type { RolloutState } from '../domain/rollout.ts';
import type { EnvCallGuard, PauseView } from './episode-context.ts';

type MaybePromise<T> = T | Promise<T>;

export interface EnvGuardOptions {
  taskName: string;
  timeoutMs: number;
  gate: PauseView;
  /** This worker's slot in the shared env watch; null = not watched. */
  watch: EnvWatchSlot | null;
  /** The pool's number for the run of a group (RunGroupMessage.dispatch); 0 = unknown (not watched). */
  dispatchOf: (groupId: string) => number;
}

export class EnvGuard implements EnvCallGuard {
  readonly #options: EnvGuardOptions;

  constructor(options: EnvGuardOptions) {
    this.#options = options;
  }

  call<T>(rollout: RolloutState, call: EnvCall, run: () => MaybePromise<T>): MaybePromise<T> {
    const { watch, timeoutMs, taskName } = this.#options;
    let value: MaybePromise<T>;
    if (watch === null) value = run();
    else {
      watch.enter(this.#options.dispatchOf(rollout.groupId), rollout.index, call);
      try {
        value = run();
      } finally {
        watch.leave();
      }
    }
    // A synchronous answer (the synthetic environments, on the hot path) needs no bound: return it
    // before building one.
    if (!isThenable(value)) return value;
    if (call === 'beforeInference' || call === 'onEpisodeEnd') {
      return settleWithin(value, {
        timeoutMs,
        timedOut: () =>
          timeoutError('ERR_HOOK_TIMEOUT', taskName, `hook ${call}()`, timeoutMs, 'ignored, as a hook that throws'),
      });
    }
    return settleWithin(value, {
      timeoutMs,
      timedOut: () =>
        timeoutError(
          'ERR_ENV_TIMEOUT',
          taskName,
          `environment ${call}()`,
          timeoutMs,
          'the rollout fails and its actor is discarded',
        ),
      signal: this.#options.gate.signal,
      cancelled: () =>
        new EnvError(
          'ERR_ENV_CANCELLED',
          `task ${JSON.stringify(taskName)}: environment ${call}() was still pending when in-flight work was cancelled for a weight update; the actor is discarded and the rollout runs again after the resume`,
        ),
    });
  }
}

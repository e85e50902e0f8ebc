/**
 * Which rollout is inside user code (an environment call or an episode hook), per worker thread, in
 * shared memory: what the coordinator reads after a worker died, to blame that rollout alone.
 *
 * A worker that dies (process.exit, out of memory, a spin the watchdog ends) takes every group it
 * runs down with it; most of them were healthy. The one to blame is the rollout whose environment
 * code was running on the thread when it died — a synchronous call (only one can run at a time on a
 * thread). So around each call a worker writes (dispatch, rollout index, call) into its slot, and
 * clears it when the call returns. Death strikes either inside such a window, and the slot names the
 * culprit, or outside every window (an environment's timer, a continuation after an await), and
 * nobody is blamed: every group on the worker is retried within its budget.
 *
 * Slot layout (Int32 each): OWNER (the worker's threadId; 0 = free), DISPATCH (the pool's number for
 * the group's run; 0 = no rollout inside), ROLLOUT (index in the group), CALL (index in ENV_CALLS).
 * A worker claims a free slot with a compare-exchange at start; only the coordinator frees the slot
 * of a dead worker, after reading it (`sweep`), so a replacement never overwrites a culprit unread.
 *
 * Write order: ROLLOUT and CALL before DISPATCH, and DISPATCH alone cleared — Atomics stores are
 * sequentially consistent, so a DISPATCH ≠ 0 seen by the coordinator always comes with its own
 * ROLLOUT and CALL, whatever instant the thread died at.
 */

export const ENV_CALLS = ['reset', 'getTaskPrompt', 'step', 'close', 'beforeInference', 'onEpisodeEnd'] as const;
export type EnvCall = (typeof ENV_CALLS)[number];

const OWNER = 0;
const DISPATCH = 1;
const ROLLOUT = 2;
const CALL = 3;
const SLOT_INTS = 4;

/** Room for every worker, replacements that start before the dead one's slot is swept, and a margin. */
export function createEnvWatch(threads: number): SharedArrayBuffer {
  return new SharedArrayBuffer((2 * threads + 2) * SLOT_INTS * Int32Array.BYTES_PER_ELEMENT);
}

/** The worker's side: its one slot. Without a free slot it runs unwatched (nobody blamed: retries only). */
export class EnvWatchSlot {
  readonly #view: Int32Array;
  /** Int32 offset of this worker's slot; −1 when none was free. */
  readonly #at: number;

  constructor(block: SharedArrayBuffer, threadId: number) {
    this.#view = new Int32Array(block);
    let at = -1;
    for (let i = 0; i + SLOT_INTS <= this.#view.length && at < 0; i += SLOT_INTS) {
      if (Atomics.compareExchange(this.#view, i + OWNER, 0, threadId) === 0) at = i;
    }
    this.#at = at;
    if (at >= 0) Atomics.store(this.#view, at + DISPATCH, 0);
  }

  get watched(): boolean {
    return this.#at >= 0;
  }

  enter(dispatch: number, rollout: number, call: EnvCall): void {
    if (this.#at < 0 || dispatch === 0) return;
    Atomics.store(this.#view, this.#at + ROLLOUT, rollout);
    Atomics.store(this.#view, this.#at + CALL, ENV_CALLS.indexOf(call));
    Atomics.store(this.#view, this.#at + DISPATCH, dispatch);
  }

  leave(): void {
    if (this.#at >= 0) Atomics.store(this.#view, this.#at + DISPATCH, 0);
  }
}

export interface Culprit {
  rollout: number;
  call: EnvCall;
}

/** The coordinator's side: numbers each run of a group, and reads the slots of dead workers. */
export class EnvWatch {
  readonly block: SharedArrayBuffer;
  readonly #view: Int32Array;
  #lastDispatch = 0;

  constructor(threads: number) {
    this.block = createEnvWatch(threads);
    this.#view = new Int32Array(this.block);
  }

  /** A fresh number for one run of a group, never 0 (wraps after 2³¹ − 1 runs: far beyond any run in flight). */
  nextDispatch(): number {
    this.#lastDispatch = this.#lastDispatch >= 0x7fffffff ? 1 : this.#lastDispatch + 1;
    return this.#lastDispatch;
  }

  /**
   * Reads and frees every slot whose owner is not among `live` (thread ids of the workers alive now):
   * dispatch → the rollout that was inside user code when its worker died.
   */
  sweep(live: ReadonlySet<number>): Map<number, Culprit> {
    const culprits = new Map<number, Culprit>();
    for (let i = 0; i + SLOT_INTS <= this.#view.length; i += SLOT_INTS) {
      const owner = Atomics.load(this.#view, i + OWNER);
      if (owner === 0 || live.has(owner)) continue;
      const dispatch = Atomics.load(this.#view, i + DISPATCH);
      if (dispatch !== 0)
        culprits.set(dispatch, {
          rollout: Atomics.load(this.#view, i + ROLLOUT),
          call: ENV_CALLS[Atomics.load(this.#view, i + CALL)] ?? 'step',
        });
      Atomics.store(this.#view, i + DISPATCH, 0);
      Atomics.compareExchange(this.#view, i + OWNER, owner, 0);
    }
    return culprits;
  }
}

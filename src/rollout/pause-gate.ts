/**
 * The worker's view of the pause broadcast (protocol/control-block.ts).
 *
 * `paused` and `modelStep` read shared memory directly, so an episode checking before each inference
 * call sees a pause the moment the coordinator writes it — no message has to be delivered first.
 * `signal` aborts in-flight inference calls when the coordinator escalates to CANCEL; `hold` aborts on
 * every pause, for streamed calls that come back at once with the tokens they hold (llm/client.ts).
 */
import { setMaxListeners } from 'node:events';
import { CONTROL, LAST_SEND, RunState, wallClockUs } from '../protocol/control-block.ts';

export class PauseGate {
  readonly #view: Int32Array;
  readonly #clock: BigInt64Array;
  #epoch: number;
  #cancel = quietController();
  #hold = quietController();
  #closed = false;

  constructor(block: SharedArrayBuffer) {
    this.#view = new Int32Array(block);
    this.#clock = new BigInt64Array(block);
    this.#epoch = Atomics.load(this.#view, CONTROL.EPOCH);
    this.#apply();
    void this.#watch();
  }

  get paused(): boolean {
    return Atomics.load(this.#view, CONTROL.STATE) !== RunState.RUNNING;
  }

  /** Called in the same tick as an inference call is handed to the transport (after checking `paused`). */
  noteSend(): void {
    Atomics.store(this.#clock, LAST_SEND, wallClockUs());
  }

  /** The weight version the coordinator last resumed with. */
  get modelStep(): number {
    return Atomics.load(this.#view, CONTROL.MODEL_STEP);
  }

  /**
   * Aborts when the coordinator cancels in-flight calls; a fresh one after each resume. Renewed here
   * too, not only by the watcher: a call made in the tick the resume is written (before the watcher
   * has run) must not take the old, aborted signal and be refused at once.
   */
  get signal(): AbortSignal {
    if (this.#cancel.signal.aborted && !this.paused) this.#cancel = quietController();
    return this.#cancel.signal;
  }

  /** Aborts when a pause begins (any state but RUNNING); a fresh one after each resume (renewed as `signal` is). */
  get hold(): AbortSignal {
    if (this.#hold.signal.aborted && !this.paused) this.#hold = quietController();
    return this.#hold.signal;
  }

  close(): void {
    this.#closed = true;
  }

  async #watch(): Promise<void> {
    while (!this.#closed) {
      const wait = Atomics.waitAsync(this.#view, CONTROL.EPOCH, this.#epoch);
      if (wait.async) await wait.value;
      this.#epoch = Atomics.load(this.#view, CONTROL.EPOCH);
      this.#apply();
      Atomics.add(this.#view, CONTROL.ACKS, 1);
      Atomics.notify(this.#view, CONTROL.ACKS);
    }
  }

  #apply(): void {
    const state = Atomics.load(this.#view, CONTROL.STATE);
    // Hold before cancelling: a worker that sees PAUSED and CANCEL at once (it missed the first
    // broadcast) still returns its streamed calls with their tokens; the cancel then cuts their connections.
    if (state !== RunState.RUNNING && !this.#hold.signal.aborted) this.#hold.abort(new Error('held for a weight update'));
    if (state === RunState.CANCEL && !this.#cancel.signal.aborted) {
      this.#cancel.abort(new Error('inference cancelled for a weight update'));
    }
    if (state === RunState.RUNNING && this.#cancel.signal.aborted) this.#cancel = quietController();
    if (state === RunState.RUNNING && this.#hold.signal.aborted) this.#hold = quietController();
  }
}

/**
 * Episodes waiting for an actor or a call slot listen on the one cancel signal (inference calls add one
 * listener per client, llm/exchange.ts): hundreds of listeners are possible.
 */
function quietController(): AbortController {
  const controller = new AbortController();
  setMaxListeners(0, controller.signal);
  return controller;
}

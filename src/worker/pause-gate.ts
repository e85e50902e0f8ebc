/**
 * The worker's view of the pause broadcast (protocol/control-block.ts).
 *
 * `paused` and `modelStep` read shared memory directly, so an episode checking before each inference
 * call sees a pause the moment the coordinator writes it — no message has to be delivered first.
 * `signal` aborts in-flight inference calls when the coordinator escalates to CANCEL; `hold` aborts on
 * every pause, for streamed calls that come back at once with the tokens they hold (llm/client.ts).
 */
import { setMaxListeners } from 'node:events';
import { CONTROL, LAST_SEND, readWeightVersion, RunState, wallClockUs } from '../protocol/control-block.ts';

/** Announced weight versions remembered: replies from before a few syncs back are not expected. */
const ANNOUNCED_KEPT = 16;

export class PauseGate {
  readonly #block: SharedArrayBuffer;
  /**
   * Weight versions the trainer announced at each resume → the model step they name, oldest first.
   * Filled only as epochs are applied, so a version is never paired with another resume's step.
   */
  readonly #announced = new Map<string, number>();
  readonly #view: Int32Array;
  readonly #clock: BigInt64Array;
  #epoch: number;
  #cancel = quietController();
  #hold = quietController();
  #closed = false;

  constructor(block: SharedArrayBuffer) {
    this.#block = block;
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

  /** A rollout with a response token of an older model step expires on landing (NO_EXPIRY: none does). */
  get oldestUsefulStep(): number {
    return Atomics.load(this.#view, CONTROL.OLDEST_USEFUL_STEP);
  }

  /** The weight version the coordinator last resumed with. */
  get modelStep(): number {
    return Atomics.load(this.#view, CONTROL.MODEL_STEP);
  }

  /**
   * The model step a reply's weight version stands for:
   * - no version in the reply: the step the coordinator last resumed with;
   * - a version the trainer announced (`resume({ modelStep, weightVersion })`): that announcement's step;
   * - the trainer never announced one: a version that is a whole number is the step itself (the
   *   mock, SGLang `--weight-version N`) unless it is newer than the current step (−1, below); any
   *   other name ("default") says nothing: the current step;
   * - versions were announced and this is none of them: −1 — the server is not serving the weights
   *   the trainer said it loaded (the caller reports it and tags the current step).
   */
  stepOfVersion(version: string | null): number {
    if (version === null) return this.modelStep;
    const announced = this.#announced.get(version);
    if (announced !== undefined) return announced;
    if (this.#announced.size > 0) return -1;
    if (/^\d{1,10}$/.test(version)) {
      const n = Number(version);
      // Newer than the step the trainer resumed with (a long-lived server after a trainer restart):
      // tagging it would make staleness negative, so it is reported like any unannounced version.
      if (n <= 0x7fffffff) return n > this.modelStep ? -1 : n;
    }
    return this.modelStep;
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

  /**
   * Aborts when a pause begins (any state but RUNNING, and IN_PLACE, whose calls the servers keep); a
   * fresh one after each resume (renewed as `signal` is).
   */
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
    if (state === RunState.RUNNING) {
      const version = readWeightVersion(this.#block);
      if (version !== null) {
        this.#announced.delete(version); // re-inserted as the newest
        this.#announced.set(version, Atomics.load(this.#view, CONTROL.MODEL_STEP));
        if (this.#announced.size > ANNOUNCED_KEPT) this.#announced.delete(this.#announced.keys().next().value!);
      }
    }
    // Hold before cancelling: a worker that sees PAUSED and CANCEL at once (it missed the first
    // broadcast) still returns its streamed calls with their tokens; the cancel then cuts their connections.
    // A pause in place leaves the calls in flight to their servers, which keep them.
    if (state !== RunState.RUNNING && state !== RunState.IN_PLACE && !this.#hold.signal.aborted)
      this.#hold.abort(new Error('held for a weight update'));
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

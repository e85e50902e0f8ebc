/**
 * The worker's view of the pause broadcast (protocol/control-block.ts).
 *
 * `paused` and `modelStep` read shared memory directly, so an episode checking before each inference
 * call sees a pause the moment the coordinator writes it — no message has to be delivered first.
 * `signal` aborts in-flight inference calls when the coordinator escalates to CANCEL; `hold` aborts on
 * every pause, for streamed calls that come back at once with the tokens they hold (llm/client.ts).
 * `signalFor` also aborts when the consumer moves past the oldest tokens a call's rollout holds, so a
 * server stops decoding a reply whose rollout is reset on landing whatever it generates.
 */
import { setMaxListeners } from 'node:events';
import { AnnouncedVersions } from '../domain/weight-versions.ts';
import type { CancelSignal } from '../cancel.ts';
import { CONTROL, LAST_SEND, NO_EXPIRY, readWeightVersion, RunState, wallClockUs } from '../protocol/control-block.ts';

export class PauseGate {
  readonly #block: SharedArrayBuffer;
  /**
   * Weight versions the trainer announced at each resume. Filled only as epochs are applied, so a
   * version is never paired with another resume's step.
   */
  readonly #announced = new AnnouncedVersions();
  readonly #view: Int32Array;
  readonly #clock: BigInt64Array;
  #epoch: number;
  #cancel = quietController();
  #hold = quietController();
  /**
   * The cancel signals `signalFor` hands out, by the oldest model step a call's rollout holds: calls of
   * rollouts begun on the same weights share one, so a rise of OLDEST_USEFUL_STEP aborts a few
   * controllers, not one per call (the client keeps one listener per signal: llm/exchange.ts).
   * Invariant: none is aborted — one is deleted in the tick it aborts, by expiry or by a cancel.
   */
  readonly #byOldestStep = new Map<number, AbortController>();
  #closed = false;

  constructor(block: SharedArrayBuffer) {
    this.#block = block;
    this.#view = new Int32Array(block);
    this.#clock = new BigInt64Array(block);
    this.#epoch = Atomics.load(this.#view, CONTROL.EPOCH);
    this.#apply();
    void this.#watch();
    void this.#watchExpiry();
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
   * The model step a reply's weight version stands for (domain/weight-versions.ts): −1 for a version
   * the trainer did not announce, or a whole number newer than the current step.
   */
  stepOfVersion(version: string | null): number {
    return this.#announced.stepOf(version, this.modelStep);
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
   * `signal`, and also aborted once a rollout holding tokens of `oldestStep` has expired: the consumer
   * moved past them (OLDEST_USEFUL_STEP), so the rollout is reset on landing whatever the call brings.
   * Just `signal` while nothing can expire.
   */
  signalFor(oldestStep: number): CancelSignal {
    const cancel = this.signal;
    const oldestUseful = this.oldestUsefulStep;
    if (oldestUseful === NO_EXPIRY || cancel.aborted) return cancel;
    if (oldestStep < oldestUseful) return AbortSignal.abort(expired(oldestStep, oldestUseful));
    let controller = this.#byOldestStep.get(oldestStep);
    if (controller === undefined) this.#byOldestStep.set(oldestStep, (controller = quietController()));
    return controller.signal;
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

  /**
   * Wakes when the coordinator moves OLDEST_USEFUL_STEP (coordinator/pause-control.ts notifies it) and
   * cuts the calls of rollouts it expired. A change missed between two waits is caught by the next
   * value: the check is against the newest, and the turn-boundary check stops the rest anyway.
   */
  async #watchExpiry(): Promise<void> {
    let seen = this.oldestUsefulStep;
    while (!this.#closed) {
      const wait = Atomics.waitAsync(this.#view, CONTROL.OLDEST_USEFUL_STEP, seen);
      if (wait.async) await wait.value;
      seen = this.oldestUsefulStep;
      if (seen === NO_EXPIRY) continue;
      for (const [step, controller] of this.#byOldestStep) {
        if (step >= seen) continue;
        this.#byOldestStep.delete(step);
        controller.abort(expired(step, seen));
      }
    }
  }

  #apply(): void {
    const state = Atomics.load(this.#view, CONTROL.STATE);
    if (state === RunState.RUNNING) {
      const version = readWeightVersion(this.#block);
      if (version !== null) this.#announced.announce(version, Atomics.load(this.#view, CONTROL.MODEL_STEP));
    }
    // Hold before cancelling: a worker that sees PAUSED and CANCEL at once (it missed the first
    // broadcast) still returns its streamed calls with their tokens; the cancel then cuts their connections.
    // A pause in place leaves the calls in flight to their servers, which keep them.
    if (state !== RunState.RUNNING && state !== RunState.IN_PLACE && !this.#hold.signal.aborted)
      this.#hold.abort(new Error('held for a weight update'));
    if (state === RunState.CANCEL && !this.#cancel.signal.aborted) {
      const reason = new Error('inference cancelled for a weight update');
      this.#cancel.abort(reason);
      for (const controller of this.#byOldestStep.values()) controller.abort(reason);
      this.#byOldestStep.clear();
    }
    if (state === RunState.RUNNING && this.#cancel.signal.aborted) this.#cancel = quietController();
    if (state === RunState.RUNNING && this.#hold.signal.aborted) this.#hold = quietController();
  }
}

function expired(step: number, oldestUseful: number): Error {
  return new Error(
    `the rollout expired: it holds tokens of model step ${step}, and the trainer takes none older than ${oldestUseful}`,
  );
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

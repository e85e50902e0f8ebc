/**
 * The coordinator's side of the pause broadcast (protocol/control-block.ts): write the state, bump the
 * epoch, wake every worker, and measure how long until they have all seen it.
 */
import {
  CONTROL,
  createControlBlock,
  LAST_SEND,
  readWeightVersion,
  RunState,
  writeWeightVersion,
} from '../protocol/control-block.ts';

export class PauseControl {
  readonly block: SharedArrayBuffer;
  readonly #view: Int32Array;
  readonly #clock: BigInt64Array;

  /**
   * `launchVersion`: what the inference servers call the weights of `modelStep` (their version at
   * start), published as if the trainer had announced it, so that replies naming it keep that step.
   */
  constructor(modelStep: number, launchVersion: string | null = null) {
    this.block = createControlBlock(modelStep);
    writeWeightVersion(this.block, launchVersion);
    this.#view = new Int32Array(this.block);
    this.#clock = new BigInt64Array(this.block);
  }

  /**
   * Milliseconds from `sinceUs` (wallClockUs() taken before the pause was written) to the last
   * inference call any worker sent; 0 when none was sent after it.
   */
  lastSendAfterMs(sinceUs: bigint): number {
    const last = Atomics.load(this.#clock, LAST_SEND);
    return last > sinceUs ? Number(last - sinceUs) / 1000 : 0;
  }

  get state(): RunState {
    return Atomics.load(this.#view, CONTROL.STATE) as RunState;
  }

  get modelStep(): number {
    return Atomics.load(this.#view, CONTROL.MODEL_STEP);
  }

  /** The servers' name for the weights of `modelStep`, as last announced (or found at launch); null: none. */
  get weightVersion(): string | null {
    return readWeightVersion(this.block);
  }

  pause(): void {
    this.#broadcast(RunState.PAUSED);
  }

  /** No new calls; those in flight are left to their servers, which keep them (pause.mode in-place). */
  pauseInPlace(): void {
    this.#broadcast(RunState.IN_PLACE);
  }

  /** Escalate: in-flight inference calls are cancelled client-side too. */
  cancel(): void {
    this.#broadcast(RunState.CANCEL);
  }

  /** Send the current state again (a worker that was busy in a long synchronous step re-reads it). */
  resignal(): void {
    this.#broadcast(this.state);
  }

  /**
   * Published without an epoch: workers read it at their next turn boundary (protocol/control-block.ts),
   * and those watching it cut the calls of rollouts it has just expired (worker/pause-gate.ts).
   */
  setOldestUsefulStep(step: number): void {
    if (Atomics.exchange(this.#view, CONTROL.OLDEST_USEFUL_STEP, step) !== step)
      Atomics.notify(this.#view, CONTROL.OLDEST_USEFUL_STEP);
  }

  /** `weightVersion`: the server's name for these weights, as the trainer announced it (null: none). */
  resume(modelStep: number, weightVersion: string | null = null): void {
    writeWeightVersion(this.block, weightVersion);
    Atomics.store(this.#view, CONTROL.MODEL_STEP, modelStep);
    this.#broadcast(RunState.RUNNING);
  }

  /**
   * Resolves with the milliseconds until `workers` acknowledgements arrived for the latest broadcast,
   * or null after `timeoutMs`. Waits with Atomics.waitAsync: no polling, the main loop stays free.
   */
  async waitForAcks(workers: number, timeoutMs: number, since = performance.now()): Promise<number | null> {
    const deadline = since + timeoutMs;
    for (;;) {
      const acks = Atomics.load(this.#view, CONTROL.ACKS);
      if (acks >= workers) return performance.now() - since;
      const left = deadline - performance.now();
      if (left <= 0) return null;
      const wait = Atomics.waitAsync(this.#view, CONTROL.ACKS, acks, left);
      if (wait.async) await wait.value; // resolves on notify or on its own timeout
    }
  }

  #broadcast(state: RunState): void {
    Atomics.store(this.#view, CONTROL.ACKS, 0);
    Atomics.store(this.#view, CONTROL.STATE, state);
    Atomics.add(this.#view, CONTROL.EPOCH, 1);
    Atomics.notify(this.#view, CONTROL.EPOCH);
  }
}

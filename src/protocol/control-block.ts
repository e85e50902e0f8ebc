/**
 * The pause broadcast: one SharedArrayBuffer the coordinator writes and every worker watches.
 *
 * A weight update must reach every worker within milliseconds. A message per worker queues behind
 * task traffic; a shared epoch counter does not: the coordinator writes the state, bumps EPOCH and
 * `Atomics.notify`s; each worker's `Atomics.waitAsync` on EPOCH wakes, applies the state, and counts
 * itself in ACKS. Hot-path checks ("may I start an inference call?") are a plain Atomics.load.
 *
 * ACKS is reset by the coordinator before each epoch bump; an ack that lands after a newer reset is
 * counted for the newer epoch — harmless, since the worker applies the latest state either way.
 */
export const RunState = {
  /** Episodes run normally. */
  RUNNING: 0,
  /** No new inference calls; calls in flight may finish (drain) or be aborted by the server. */
  PAUSED: 1,
  /** Paused, and in-flight calls are cancelled client-side as well. */
  CANCEL: 2,
} as const;
export type RunState = (typeof RunState)[keyof typeof RunState];

export const CONTROL = {
  STATE: 0,
  EPOCH: 1,
  ACKS: 2,
  MODEL_STEP: 3,
} as const;

const SLOTS = 4;

export function createControlBlock(modelStep: number): SharedArrayBuffer {
  const sab = new SharedArrayBuffer(SLOTS * Int32Array.BYTES_PER_ELEMENT);
  Atomics.store(new Int32Array(sab), CONTROL.MODEL_STEP, modelStep);
  return sab;
}

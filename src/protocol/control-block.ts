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
 *
 * LAST_SEND (a BigInt64 after the Int32 slots) is the wall-clock µs at which any worker last handed an
 * inference call to the transport. It is how a pause measures "every worker stopped issuing": an ack
 * only says a worker's event loop got round to the watcher, which a busy loop delays although it can
 * no longer send anything (the send path reads STATE in the same tick). Last writer wins: two workers
 * sending within the same microseconds may leave the slightly earlier time — not worth a CAS loop.
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

const INT32_SLOTS = 4;
/** Index of LAST_SEND in a BigInt64Array over the block (after the Int32 slots, 8-byte aligned). */
export const LAST_SEND = (INT32_SLOTS * Int32Array.BYTES_PER_ELEMENT) / BigInt64Array.BYTES_PER_ELEMENT;

export function createControlBlock(modelStep: number): SharedArrayBuffer {
  const sab = new SharedArrayBuffer((LAST_SEND + 1) * BigInt64Array.BYTES_PER_ELEMENT);
  Atomics.store(new Int32Array(sab), CONTROL.MODEL_STEP, modelStep);
  return sab;
}

/** Wall-clock time in µs, comparable across threads (each thread's performance.now() has its own origin). */
export function wallClockUs(): bigint {
  return BigInt(Math.round((performance.timeOrigin + performance.now()) * 1000));
}

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
 *
 * VERSION (UTF-8 bytes after LAST_SEND, their length in VERSION_LENGTH) is the weight version the
 * trainer announced with MODEL_STEP (`resume({ modelStep, weightVersion })`), or none (length −1).
 * Written before the epoch bump that publishes it; a worker reads it only when it applies an epoch,
 * so it never sees a step with another step's version.
 */
export const RunState = {
  /** Episodes run normally. */
  RUNNING: 0,
  /** No new inference calls; calls in flight may finish (drain) or be aborted by the server. */
  PAUSED: 1,
  /** Paused, and in-flight calls are cancelled client-side as well. */
  CANCEL: 2,
  /**
   * No new inference calls; the calls in flight are kept by their servers, paused in place (pause.mode
   * in-place), and go on after the resume: neither held nor cancelled here.
   */
  IN_PLACE: 3,
} as const;
export type RunState = (typeof RunState)[keyof typeof RunState];

export const CONTROL = {
  STATE: 0,
  EPOCH: 1,
  ACKS: 2,
  MODEL_STEP: 3,
  VERSION_LENGTH: 4,
  /**
   * The oldest model step whose tokens can still be taken: a rollout holding a response token of an
   * older step expires when it lands, whatever it generates next (coordinator/producer.ts publishes it
   * as the consumer moves; NO_EXPIRY when landings are not measured). Read at turn boundaries, and
   * notified when it changes: each worker then cancels the inference calls of rollouts it expired
   * (worker/pause-gate.ts), so a server stops decoding replies that would be thrown away. A worker
   * that misses a change stops those rollouts one turn later: nothing depends on the wake-up.
   */
  OLDEST_USEFUL_STEP: 5,
} as const;

/** OLDEST_USEFUL_STEP when nothing in flight can expire (sync production, no staleness bound). */
export const NO_EXPIRY = -0x80000000;

const INT32_SLOTS = 6; // all used; 6 keeps LAST_SEND 8-byte aligned
/** Index of LAST_SEND in a BigInt64Array over the block (after the Int32 slots, 8-byte aligned). */
export const LAST_SEND = (INT32_SLOTS * Int32Array.BYTES_PER_ELEMENT) / BigInt64Array.BYTES_PER_ELEMENT;

/** Byte offset of the announced weight version's UTF-8 bytes. */
export const VERSION_OFFSET = (LAST_SEND + 1) * BigInt64Array.BYTES_PER_ELEMENT;
/** Room for a weight version: 256 characters of any script (reply.ts MAX_WEIGHT_VERSION_LENGTH). */
export const VERSION_BYTES = 1024;

export function createControlBlock(modelStep: number): SharedArrayBuffer {
  const sab = new SharedArrayBuffer(VERSION_OFFSET + VERSION_BYTES);
  const view = new Int32Array(sab);
  Atomics.store(view, CONTROL.MODEL_STEP, modelStep);
  Atomics.store(view, CONTROL.VERSION_LENGTH, -1);
  Atomics.store(view, CONTROL.OLDEST_USEFUL_STEP, NO_EXPIRY);
  return sab;
}

/** Writes the announced weight version (null: none). The caller publishes it with an epoch bump. */
export function writeWeightVersion(sab: SharedArrayBuffer, version: string | null): void {
  const view = new Int32Array(sab);
  if (version === null) {
    Atomics.store(view, CONTROL.VERSION_LENGTH, -1);
    return;
  }
  const bytes = new TextEncoder().encode(version);
  if (bytes.length > VERSION_BYTES)
    throw new RangeError(`weight version is ${bytes.length} bytes of UTF-8; at most ${VERSION_BYTES} fit`);
  new Uint8Array(sab, VERSION_OFFSET, VERSION_BYTES).set(bytes);
  Atomics.store(view, CONTROL.VERSION_LENGTH, bytes.length);
}

export function readWeightVersion(sab: SharedArrayBuffer): string | null {
  const length = Atomics.load(new Int32Array(sab), CONTROL.VERSION_LENGTH);
  if (length < 0) return null;
  // TextDecoder refuses views of shared memory: copy the bytes out first.
  return new TextDecoder().decode(new Uint8Array(sab, VERSION_OFFSET, length).slice());
}

/** Wall-clock time in µs, comparable across threads (each thread's performance.now() has its own origin). */
export function wallClockUs(): bigint {
  return BigInt(Math.round((performance.timeOrigin + performance.now()) * 1000));
}

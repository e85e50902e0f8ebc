/**
 * The msgpack codec for `WireMessage`s, the bytes between threads. (Files and peers outside the
 * process have their own encodings, in formats/: checkpoint files, control API bodies.)
 *
 * `useRecords: false` keeps the bytes plain msgpack maps; `moreTypes: true` makes Int32Array /
 * Float32Array round-trip as typed arrays instead of Buffers.
 *
 * Messages between threads also keep shared references (`structuredClone`): every turn of a rollout
 * holds its prompt, and consecutive prompts are mostly the same message objects (the conversation so
 * far), so each message is sent once and the others point at it — a quarter fewer bytes per group and
 * the same sharing on the receiving side.
 *
 * A turn's token arrays (ids, logprobs, model steps, loss mask) travel beside the msgpack body, not in
 * it: msgpackr decodes each typed array into an ArrayBuffer of its own (an allocation, a copy, a
 * finaliser for the GC), 2–3 µs apiece at the ≈ 90 arrays of a multi-turn group — most of the main
 * thread's time per group. Beside the body they are one copied block, and each array a view into it.
 *
 *   [ u32 body length | msgpack body (arrays as [kind, offset, length]) | pad to 8 | regions, each 8-aligned ]
 *
 * A region is one array, or one run of overlapping views of a buffer (a turn's prompt ids are a
 * prefix of the next turn's: worker/prompt-prefix.ts); an offset is a multiple of its kind's size.
 */
import { Packr } from 'msgpackr';
import { PROTOCOL_VERSION, WIRE_MESSAGE_TYPES, type RunGroupMessage, type WireMessage } from './messages.ts';
import { restoreKeptTurns } from './result-delta.ts';
import { preview, ProtocolError } from '../errors.ts';
import { fillModelSteps, type RolloutGroup } from '../domain/rollout.ts';

const threadPackr = new Packr({ useRecords: false, moreTypes: true, structuredClone: true });

/** The turn fields carried beside the body, and the array kinds they may hold (a kind's index is its code). */
const TURN_ARRAYS = ['promptIds', 'responseIds', 'logprobs', 'modelSteps', 'lossMask', 'staleKv'] as const;
const ARRAY_KINDS = [Int32Array, Float32Array, Uint8Array] as const;
type TurnArray = InstanceType<(typeof ARRAY_KINDS)[number]>;
const HEADER_BYTES = 4;
const align8 = (n: number): number => (n + 7) & ~7;

/**
 * Encode to bytes that own their ArrayBuffer exactly (so it can be transferred). `pack()` returns a
 * view into a shared, reused buffer: it is copied into the message, with the arrays beside it.
 */
export function encodeMessage(message: WireMessage): Uint8Array {
  const beside = new ArraysBeside();
  const refsMessage = withArraysBeside(message, beside);
  beside.layout();
  const body = threadPackr.pack(refsMessage);
  const start = align8(HEADER_BYTES + body.byteLength);
  const out = new Uint8Array(start + beside.bytes);
  new DataView(out.buffer).setUint32(0, body.byteLength, true);
  out.set(body, HEADER_BYTES);
  beside.copyInto(out, start);
  return out;
}

/** Decode and check the envelope; a peer's garbage becomes a ProtocolError, never a crash later on. */
export function decodeMessage(bytes: Uint8Array): WireMessage {
  if (bytes.byteLength < HEADER_BYTES)
    throw new ProtocolError(`message is ${bytes.byteLength} bytes, shorter than its ${HEADER_BYTES}-byte header`);
  const bodyLength = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength).getUint32(0, true);
  if (HEADER_BYTES + bodyLength > bytes.byteLength) {
    throw new ProtocolError(
      `message header declares a ${bodyLength}-byte body, but only ${bytes.byteLength - HEADER_BYTES} bytes follow`,
    );
  }
  let value: unknown;
  try {
    value = threadPackr.unpack(bytes.subarray(HEADER_BYTES, HEADER_BYTES + bodyLength));
  } catch (err) {
    throw new ProtocolError(`message is not valid msgpack (${bytes.byteLength} bytes): ${(err as Error).message}`);
  }
  if (typeof value !== 'object' || value === null) {
    throw new ProtocolError(`message must be a map, got ${value === null ? 'null' : typeof value}`);
  }
  const { v, type } = value as { v?: unknown; type?: unknown };
  if (v !== PROTOCOL_VERSION) {
    throw new ProtocolError(
      `message.v must be ${PROTOCOL_VERSION}, got ${preview(v)} (worker and coordinator from different versions?)`,
    );
  }
  if (!WIRE_MESSAGE_TYPES.includes(type as WireMessage['type'])) {
    throw new ProtocolError(`message.type must be one of ${WIRE_MESSAGE_TYPES.join(', ')}, got ${preview(type)}`);
  }
  // One copy of the arrays block: the views keep it alive, not the whole message.
  const start = align8(HEADER_BYTES + bodyLength);
  // Uint8Array's slice, a copy: a Node Buffer's own slice is a view into its (pooled) buffer (a NATS message's data).
  restoreArrays(
    value as WireMessage,
    start < bytes.byteLength ? Uint8Array.prototype.slice.call(bytes, start).buffer : new ArrayBuffer(0),
  );
  return value as WireMessage;
}

/** Coordinator side: a group to run, as the bytes a task carries (`dispatch`: the env watch's number for this run). */
export function encodeRunGroup(group: RolloutGroup, modelStep: number, dispatch: number): Uint8Array {
  return encodeMessage({ v: PROTOCOL_VERSION, type: 'run-group', group, modelStep, enqueuedAt: Date.now(), dispatch });
}

/** Worker side: the group a task's bytes carry. */
export function decodeRunGroup(bytes: Uint8Array): RunGroupMessage {
  const message = decodeMessage(bytes);
  if (message.type !== 'run-group') throw new ProtocolError(`worker expects run-group messages, got ${message.type}`);
  return message;
}

/**
 * Coordinator side: the group a worker answered with for `sent` (the group as dispatched), whole
 * again — the turns it left out put back, the model steps it left implicit filled in.
 */
export function decodeGroupResult(bytes: Uint8Array, sent: RolloutGroup): RolloutGroup {
  const message = decodeMessage(bytes);
  if (message.type !== 'group-result') throw new ProtocolError(`worker answered ${message.type} to run-group`);
  return fillModelSteps(restoreKeptTurns(message.group, sent, message.keptTurns));
}

/**
 * The arrays of one message, laid out in order. An array met twice is laid out once, and so are views
 * of one buffer that overlap or touch (a turn's prompt ids viewing a later turn's:
 * worker/prompt-prefix.ts): one region per run of them, each view a reference into it. A region starts at its first
 * view's offset rounded down to 8, so every view keeps its offset mod 8 and views of any kind share
 * it; past those ≤ 7 bytes, bytes no view covers never travel (views into a pooled allocation, or into
 * a decoded block sent on again).
 */
class ArraysBeside {
  /** By buffer, in the order first met (the layout follows the turns). */
  readonly #byBuffer = new Map<ArrayBufferLike, BufferViews>();
  readonly #pieces: { buffer: ArrayBufferLike; from: number; length: number; at: number }[] = [];
  bytes = 0;

  /** A reference whose offset is filled in by `layout()`, before the body is packed. */
  ref(array: TurnArray, kind: number): Ref {
    const views = this.#byBuffer.get(array.buffer);
    if (views === undefined) {
      const ref: Ref = [kind, -1, array.length];
      this.#byBuffer.set(array.buffer, { first: array, ref, more: null }); // the usual case: an array owning its buffer
      return ref;
    }
    if (views.first === array) return views.ref;
    views.more ??= new Map();
    let ref = views.more.get(array);
    if (ref === undefined) views.more.set(array, (ref = [kind, -1, array.length]));
    return ref;
  }

  layout(): void {
    for (const [buffer, { first, ref, more }] of this.#byBuffer) {
      if (more === null) {
        ref[1] = this.#place(buffer, first.byteOffset, first.byteLength);
        continue;
      }
      const views: [TurnArray, Ref][] = [[first, ref], ...more];
      views.sort((x, y) => x[0].byteOffset - y[0].byteOffset);
      for (let i = 0; i < views.length; ) {
        // A run: views each starting at or before the end of the ones before it.
        const from = views[i][0].byteOffset & ~7;
        let to = views[i][0].byteOffset + views[i][0].byteLength;
        let j = i + 1;
        for (; j < views.length && views[j][0].byteOffset <= to; j++)
          to = Math.max(to, views[j][0].byteOffset + views[j][0].byteLength);
        const at = this.#place(buffer, from, to - from);
        for (; i < j; i++) views[i][1][1] = at + views[i][0].byteOffset - from;
      }
    }
  }

  copyInto(out: Uint8Array, start: number): void {
    for (const piece of this.#pieces) out.set(new Uint8Array(piece.buffer, piece.from, piece.length), start + piece.at);
  }

  #place(buffer: ArrayBufferLike, from: number, length: number): number {
    const at = this.bytes;
    this.#pieces.push({ buffer, from, length, at });
    this.bytes += align8(length);
    return at;
  }
}

/** A reference to an array beside the body: [kind, offset, length]. */
type Ref = [number, number, number];

/** The views met of one buffer: the first (often the only one), then any others. */
interface BufferViews {
  first: TurnArray;
  ref: Ref;
  more: Map<TurnArray, Ref> | null;
}

/** The message with each turn's arrays replaced by references into `beside`; the caller's objects are not changed. */
function withArraysBeside(message: WireMessage, beside: ArraysBeside): WireMessage {
  const rollouts = message.group.rollouts.map((rollout) => {
    if (rollout.turns.length === 0) return rollout;
    return { ...rollout, turns: rollout.turns.map((turn) => turnWithRefs(turn, beside)) };
  });
  return { ...message, group: { ...message.group, rollouts } };
}

function turnWithRefs<T extends object>(turn: T, beside: ArraysBeside): T {
  let copy: Record<string, unknown> | null = null;
  for (const field of TURN_ARRAYS) {
    const value = (turn as Record<string, unknown>)[field];
    if (value == null || !ArrayBuffer.isView(value)) continue;
    const kind = ARRAY_KINDS.indexOf(value.constructor as (typeof ARRAY_KINDS)[number]);
    if (kind === -1) continue; // another kind: msgpackr carries it in the body
    if (copy === null) copy = { ...(turn as Record<string, unknown>) };
    copy[field] = beside.ref(value as TurnArray, kind);
  }
  return (copy ?? turn) as T;
}

/** Each reference back to a view into `block`; a reference that does not fit it is a ProtocolError naming the field. */
function restoreArrays(message: WireMessage, block: ArrayBuffer): void {
  const views = new Map<number, TurnArray>(); // by offset: arrays the sender shared stay shared
  const rollouts = (message.group as { rollouts?: unknown } | undefined)?.rollouts;
  if (!Array.isArray(rollouts)) return; // not a group message: the receiver's checks name what is missing
  for (let r = 0; r < rollouts.length; r++) {
    const turns = (rollouts[r] as { turns?: unknown } | null)?.turns;
    if (!Array.isArray(turns)) continue;
    for (let t = 0; t < turns.length; t++) {
      const turn = turns[t] as Record<string, unknown> | null;
      if (turn !== null && typeof turn === 'object')
        restoreTurnArrays(turn, `message.group.rollouts[${r}].turns[${t}]`, block, views);
    }
  }
}

function restoreTurnArrays(
  turn: Record<string, unknown>,
  where: string,
  block: ArrayBuffer,
  views: Map<number, TurnArray>,
): void {
  for (const field of TURN_ARRAYS) {
    const ref = turn[field];
    if (!Array.isArray(ref)) continue;
    const [kind, offset, length] = ref as unknown[];
    const Kind = ARRAY_KINDS[kind as number];
    const fits =
      Kind !== undefined &&
      Number.isInteger(offset) &&
      Number.isInteger(length) &&
      (offset as number) >= 0 &&
      (offset as number) % Kind.BYTES_PER_ELEMENT === 0 &&
      (length as number) >= 0 &&
      (offset as number) + (length as number) * Kind.BYTES_PER_ELEMENT <= block.byteLength;
    if (!fits)
      throw new ProtocolError(
        `${where}.${field} must reference the arrays after the body, got ${preview(ref)} (${block.byteLength} bytes there)`,
      );
    let view = views.get(offset as number);
    if (view === undefined || view.constructor !== Kind || view.length !== length) {
      view = new Kind(block, offset as number, length as number);
      views.set(offset as number, view);
    }
    turn[field] = view;
  }
}

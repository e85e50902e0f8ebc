/**
 * The msgpack codec for `WireMessage`s — the only module that imports msgpackr.
 *
 * `useRecords: false` keeps the bytes plain msgpack maps; `moreTypes: true` makes Int32Array /
 * Float32Array round-trip as typed arrays instead of Buffers.
 *
 * Messages between threads also keep shared references (`structuredClone`): every turn of a rollout
 * holds its prompt, and consecutive prompts are mostly the same message objects (the conversation so
 * far), so each message is sent once and the others point at it — a quarter fewer bytes per group and
 * the same sharing on the receiving side. Checkpoints stay plain (no msgpackr extensions but typed arrays).
 */
import { Packr } from 'msgpackr';
import { PROTOCOL_VERSION, WIRE_MESSAGE_TYPES, type WireMessage } from './messages.ts';
import { preview, ProtocolError } from './errors.ts';

const threadPackr = new Packr({ useRecords: false, moreTypes: true, structuredClone: true });
const packr = new Packr({ useRecords: false, moreTypes: true });

/**
 * Encode to bytes that own their ArrayBuffer exactly. `pack()` returns a view into a shared, reused
 * buffer: transferring or keeping that view would detach or overwrite earlier results, so copy.
 */
export function encodeMessage(message: WireMessage): Uint8Array {
  return new Uint8Array(threadPackr.pack(message));
}

/** Decode and check the envelope; a peer's garbage becomes a ProtocolError, never a crash later on. */
export function decodeMessage(bytes: Uint8Array): WireMessage {
  let value: unknown;
  try {
    value = threadPackr.unpack(bytes);
  } catch (err) {
    throw new ProtocolError(`message is not valid msgpack (${bytes.byteLength} bytes): ${(err as Error).message}`);
  }
  if (typeof value !== 'object' || value === null) {
    throw new ProtocolError(`message must be a map, got ${value === null ? 'null' : typeof value}`);
  }
  const { v, type } = value as { v?: unknown; type?: unknown };
  if (v !== PROTOCOL_VERSION) {
    throw new ProtocolError(`message.v must be ${PROTOCOL_VERSION}, got ${preview(v)} (worker and coordinator from different versions?)`);
  }
  if (!WIRE_MESSAGE_TYPES.includes(type as WireMessage['type'])) {
    throw new ProtocolError(`message.type must be one of ${WIRE_MESSAGE_TYPES.join(', ')}, got ${preview(type)}`);
  }
  return value as WireMessage;
}

const CHECKPOINT_MAGIC = 'rollout-engine-checkpoint';

/** Checkpoint files are msgpack too: typed arrays stay typed, and nothing is re-tokenized. */
export function encodeCheckpoint(state: { v: number } & Record<string, unknown>): Uint8Array {
  return new Uint8Array(packr.pack({ magic: CHECKPOINT_MAGIC, ...state }));
}

export function decodeCheckpoint(bytes: Uint8Array, source: string): { v: number } & Record<string, unknown> {
  let value: unknown;
  try {
    value = packr.unpack(bytes);
  } catch (err) {
    throw new ProtocolError(`${source} is not a checkpoint (not msgpack: ${(err as Error).message})`);
  }
  if (typeof value !== 'object' || value === null || (value as { magic?: unknown }).magic !== CHECKPOINT_MAGIC) {
    throw new ProtocolError(`${source} is not a rollout-engine checkpoint`);
  }
  return value as { v: number } & Record<string, unknown>;
}

const peerPackr = new Packr({ useRecords: false });

/**
 * msgpack for outside peers (the control API's `Accept: application/msgpack`): plain maps, and typed
 * arrays as `bin` of their little-endian bytes — any msgpack library reads them, and a Python trainer
 * turns them into arrays without parsing (`numpy.frombuffer(b, '<i4')` for ids and model steps,
 * `'<f4'` for logprobs).
 */
export function encodeForPeer(value: unknown): Uint8Array {
  return new Uint8Array(peerPackr.pack(typedArraysAsBytes(value)));
}

/** Decode a peer's msgpack request body (a ProtocolError for anything that is not msgpack). */
export function decodeFromPeer(bytes: Uint8Array): unknown {
  try {
    return peerPackr.unpack(bytes);
  } catch (err) {
    throw new ProtocolError(`body is not valid msgpack (${bytes.byteLength} bytes): ${(err as Error).message}`);
  }
}

function typedArraysAsBytes(value: unknown): unknown {
  if (value === null || typeof value !== 'object') return value;
  if (ArrayBuffer.isView(value)) return Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  if (Array.isArray(value)) return value.map(typedArraysAsBytes);
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) out[k] = typedArraysAsBytes(v);
  return out;
}

/** JSON for outside readers (batch files, the control API): typed arrays become number lists. */
export function toJson(value: unknown): string {
  return JSON.stringify(value, (_key, v: unknown) => (ArrayBuffer.isView(v) && !(v instanceof DataView) ? Array.from(v as Int32Array) : v));
}

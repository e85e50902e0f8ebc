/**
 * Encodings for readers outside the process: msgpack a peer in any language reads (the control API's
 * `Accept: application/msgpack`), and JSON with typed arrays as number lists (batch files, the
 * control API's JSON).
 */
import { Packr } from 'msgpackr';
import { ProtocolError } from '../errors.ts';

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
  return JSON.stringify(value, (_key, v: unknown) =>
    ArrayBuffer.isView(v) && !(v instanceof DataView) ? Array.from(v as Int32Array) : v,
  );
}

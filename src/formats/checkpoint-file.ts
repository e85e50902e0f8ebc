/**
 * The checkpoint file's envelope: msgpack with a magic field, so that another file given as a
 * checkpoint is refused by name. Plain msgpack (no msgpackr extensions but typed arrays, no shared
 * references, unlike the thread codec): typed arrays stay typed, and nothing is re-tokenized on load.
 * What goes inside is coordinator/checkpoint.ts's.
 */
import { Packr } from 'msgpackr';
import { ProtocolError } from '../errors.ts';

const packr = new Packr({ useRecords: false, moreTypes: true });

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

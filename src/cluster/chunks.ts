/**
 * Messages larger than the server's max_payload (1 MiB by default; a long multi-turn group passes it),
 * in both directions: groups (coordinator → node) and results (node → coordinator).
 *
 * A message of n > 1 chunks is sent as its head — chunk 0, on the WORK or RESULTS stream as any
 * message, with HEADER.CHUNKS_ID and HEADER.CHUNKS (the count) — and chunks 1..n−1 on the CHUNKS
 * stream, subject `<chunkSubject>.<chunks id>.<index>`, each published with the dedupe id
 * `<chunks id>.<index>`. Why not every chunk on the work stream: its one consumer is shared by all
 * nodes, so the chunks of one group would go to different nodes. With the head as the unit of work
 * the delivery rules of ./nats-pool.ts hold unchanged: the head is acked only once the whole message
 * was handled, and a redelivered head reads all its chunks again.
 *
 * Invariant: the tail is stored before its head is published, so a receiver that has a head finds
 * every chunk — unless the set was removed: the sender's side purges it once the message was handled,
 * and the CHUNKS stream's max age (CHUNKS_MAX_AGE_MS) discards sets whose head never came (a sender
 * that died mid-set). A chunk not found reads as null, never as a shorter message.
 *
 * The chunks id is random per message sent (`randomUUID`), not the dispatch: two nodes that ran one
 * dispatch (a zombie and its successor) each publish a set of their own, so chunks of two different
 * results never mix; which result lands is decided by the head, as for a message of one chunk.
 */
import { randomUUID } from 'node:crypto';
import { headers as natsHeaders, type MsgHdrs } from '@nats-io/transport-node';
import type { JetStreamClient, JetStreamManager } from '@nats-io/jetstream';
import { ClusterError } from './errors.ts';
import { HEADER, type RunNames } from './names.ts';

/** A message is cut into this many chunks at most; past that it is ERR_NATS_TOO_LARGE (64 MiB at the default max_payload). */
export const MAX_CHUNKS = 64;
/** Room under max_payload left for a message's headers (dispatch, node, chunk ids: a few hundred bytes). */
export const HEADER_ROOM = 1_024;
/** A set whose head never came is discarded after this long (the CHUNKS stream's max age). */
export const CHUNKS_MAX_AGE_MS = 60 * 60_000;

/** The bytes of one chunk under this max_payload. */
export function chunkBytes(maxPayload: number): number {
  return Math.max(1, maxPayload - HEADER_ROOM);
}

/**
 * Cuts `bytes` into chunks of at most `chunkBytes(maxPayload)` (views, not copies); one chunk when it
 * fits. Past MAX_CHUNKS: ERR_NATS_TOO_LARGE, `what` naming the message.
 */
export function splitMessage(bytes: Uint8Array, maxPayload: number, what: string): Uint8Array[] {
  const size = chunkBytes(maxPayload);
  const count = Math.max(1, Math.ceil(bytes.byteLength / size));
  if (count > MAX_CHUNKS)
    throw new ClusterError(
      'ERR_NATS_TOO_LARGE',
      `${what} is ${bytes.byteLength} bytes encoded, over ${MAX_CHUNKS} chunks of the NATS server's max_payload (${maxPayload}); raise max_payload in the server's config`,
    );
  const parts: Uint8Array[] = [];
  for (let i = 0; i < count; i++) parts.push(bytes.subarray(i * size, Math.min(bytes.byteLength, (i + 1) * size)));
  return parts;
}

/** The message again from its chunks, in index order. */
export function joinChunks(parts: readonly Uint8Array[]): Uint8Array {
  if (parts.length === 1) return parts[0];
  const out = new Uint8Array(parts.reduce((n, p) => n + p.byteLength, 0));
  let at = 0;
  for (const part of parts) {
    out.set(part, at);
    at += part.byteLength;
  }
  return out;
}

/** A message ready to send: its head's bytes and chunk headers, and the tail to store first. */
export interface ChunkedMessage {
  head: Uint8Array;
  /** null for a message of one chunk. */
  id: string | null;
  tail: Uint8Array[];
}

export function chunkMessage(bytes: Uint8Array, maxPayload: number, what: string): ChunkedMessage {
  const parts = splitMessage(bytes, maxPayload, what);
  return { head: parts[0], id: parts.length > 1 ? randomUUID() : null, tail: parts.slice(1) };
}

/** Headers of the head: its chunks id and count (none for one chunk). */
export function headHeaders(message: ChunkedMessage, headers: MsgHdrs = natsHeaders()): MsgHdrs {
  if (message.id !== null) {
    headers.set(HEADER.CHUNKS_ID, message.id);
    headers.set(HEADER.CHUNKS, String(message.tail.length + 1));
  }
  return headers;
}

/** Stores chunks 1..n−1; safe to call again (each is deduplicated by `<chunks id>.<index>`). */
export async function publishTail(js: JetStreamClient, names: RunNames, message: ChunkedMessage): Promise<void> {
  if (message.id === null) return;
  const count = String(message.tail.length + 1);
  for (let i = 1; i <= message.tail.length; i++) {
    const headers = natsHeaders();
    headers.set(HEADER.CHUNKS_ID, message.id);
    headers.set(HEADER.CHUNKS, count);
    await js.publish(`${names.chunkSubject}.${message.id}.${i}`, message.tail[i - 1], {
      msgID: `${message.id}.${i}`,
      headers,
    });
  }
}

/**
 * The whole message of a head as received: its data when it has one chunk, else the head's data and
 * its tail read back from the CHUNKS stream; null when a chunk is gone (purged or past its max age)
 * or the head's chunk headers are not ours. A NATS failure throws: the caller naks the head.
 */
export async function readMessage(
  jsm: JetStreamManager,
  names: RunNames,
  data: Uint8Array,
  headers: MsgHdrs | undefined,
): Promise<Uint8Array | null> {
  // Copied before the first await: `data` may be a view into the client's read buffer.
  const head = new Uint8Array(data);
  const id = headers?.get(HEADER.CHUNKS_ID) ?? '';
  if (id === '') return head;
  const count = Number(headers?.get(HEADER.CHUNKS));
  if (!Number.isInteger(count) || count < 2 || count > MAX_CHUNKS || !/^[0-9a-f-]{36}$/.test(id)) return null;
  const parts: Uint8Array[] = [head];
  for (let i = 1; i < count; i++) {
    const chunk = await jsm.streams.getMessage(names.chunkStream, { last_by_subj: `${names.chunkSubject}.${id}.${i}` });
    if (chunk === null) return null;
    parts.push(chunk.data);
  }
  return joinChunks(parts);
}

/** Removes a handled message's chunks (its head named them); a failure leaves them to the max age. */
export async function purgeChunks(jsm: JetStreamManager, names: RunNames, id: string | null): Promise<void> {
  if (id === null || id === '') return;
  await jsm.streams.purge(names.chunkStream, { filter: `${names.chunkSubject}.${id}.>` }).catch(() => undefined);
}

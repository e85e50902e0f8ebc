/**
 * Chunks of a message larger than max_payload (src/cluster/chunks.ts): cut and joined byte for byte,
 * capped, and read back from a nats-server only when every chunk is there.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { jetstream, jetstreamManager, RetentionPolicy, StorageType } from '@nats-io/jetstream';
import {
  chunkBytes,
  chunkMessage,
  headHeaders,
  joinChunks,
  MAX_CHUNKS,
  publishTail,
  purgeChunks,
  readMessage,
  splitMessage,
} from '../../src/cluster/chunks.ts';
import { ClusterError } from '../../src/cluster/errors.ts';
import { HEADER, runNames } from '../../src/cluster/names.ts';
import { requireNatsServer, type NatsServer } from '../support/nats-server.ts';

const MAX_PAYLOAD = 8_192;

function bytesOf(length: number): Uint8Array {
  const bytes = new Uint8Array(length);
  for (let i = 0; i < length; i++) bytes[i] = (i * 31 + 7) % 251;
  return bytes;
}

describe('chunks of a message larger than max_payload', () => {
  it('a message of any size is cut into chunks under max_payload and joined back byte for byte', () => {
    const size = chunkBytes(MAX_PAYLOAD);
    for (const length of [0, 1, size - 1, size, size + 1, 5 * size + 7, MAX_CHUNKS * size]) {
      const bytes = bytesOf(length);
      const parts = splitMessage(bytes, MAX_PAYLOAD, 'the group');
      assert.equal(parts.length, Math.max(1, Math.ceil(length / size)), `${length} bytes`);
      assert.ok(parts.every((p) => p.byteLength <= size && p.byteLength > 0) || length === 0);
      assert.deepEqual(joinChunks(parts), bytes);
    }
  });

  it('a message past the chunk cap is ERR_NATS_TOO_LARGE naming its size and max_payload', () => {
    const length = MAX_CHUNKS * chunkBytes(MAX_PAYLOAD) + 1;
    assert.throws(
      () => splitMessage(new Uint8Array(length), MAX_PAYLOAD, "the group's result"),
      (err: unknown) =>
        err instanceof ClusterError &&
        err.code === 'ERR_NATS_TOO_LARGE' &&
        err.message.includes(`${length} bytes`) &&
        err.message.includes(`max_payload (${MAX_PAYLOAD})`),
    );
  });

  it('a message of one chunk has no chunk headers; a longer one names its id and count on its head', () => {
    const one = chunkMessage(bytesOf(10), MAX_PAYLOAD, 'the group');
    assert.equal(one.id, null);
    assert.equal(headHeaders(one).get(HEADER.CHUNKS), '');
    const three = chunkMessage(bytesOf(2 * chunkBytes(MAX_PAYLOAD) + 1), MAX_PAYLOAD, 'the group');
    assert.match(three.id ?? '', /^[0-9a-f-]{36}$/);
    assert.equal(three.tail.length, 2);
    assert.equal(headHeaders(three).get(HEADER.CHUNKS), '3');
    assert.equal(headHeaders(three).get(HEADER.CHUNKS_ID), three.id);
  });

  describe('on a nats-server', () => {
    let nats: NatsServer;
    let nc: NatsConnection;
    const names = runNames('chunks');
    before(async () => {
      nats = await requireNatsServer(`max_payload: ${MAX_PAYLOAD}\n`);
      nc = await connect({ servers: nats.url });
      const jsm = await jetstreamManager(nc);
      await jsm.streams.add({
        name: names.chunkStream,
        subjects: [`${names.chunkSubject}.>`],
        retention: RetentionPolicy.Limits,
        storage: StorageType.Memory,
        duplicate_window: 120_000_000_000,
      });
    });
    after(async () => {
      await nc?.close();
      await nats.stop();
    });

    it('a head reads back its whole message; a retried tail is stored once; once purged the head reads as null, not as a shorter message', async () => {
      assert.equal(nc.info?.max_payload, MAX_PAYLOAD);
      const js = jetstream(nc);
      const jsm = await jetstreamManager(nc);
      const bytes = bytesOf(4 * chunkBytes(MAX_PAYLOAD) + 100);
      const message = chunkMessage(bytes, MAX_PAYLOAD, 'the group');
      await publishTail(js, names, message);
      await publishTail(js, names, message); // a retry after a lost PubAck
      assert.equal((await jsm.streams.info(names.chunkStream)).state.messages, 4);
      const headers = headHeaders(message);
      assert.deepEqual(await readMessage(jsm, names, message.head, headers), bytes);
      await purgeChunks(jsm, names, message.id);
      assert.equal(await readMessage(jsm, names, message.head, headers), null);
      // A message of one chunk is its head.
      const small = chunkMessage(bytesOf(50), MAX_PAYLOAD, 'the group');
      assert.deepEqual(await readMessage(jsm, names, small.head, headHeaders(small)), bytesOf(50));
    });
  });
});

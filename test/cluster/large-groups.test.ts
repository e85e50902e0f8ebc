/**
 * Groups and results larger than the NATS server's max_payload travel in chunks (src/cluster/chunks.ts):
 * a nats-server with `max_payload: 65536`, groups whose prompts are ≈ 2 chunks and whose results are
 * several times max_payload, a node SIGKILLed while it runs one, every group accounted for.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { pino } from 'pino';
import { createEngine } from '../../src/index.ts';
import { assertAccounted } from '../support/accounting.ts';
import { requireNatsServer, type NatsServer } from '../support/nats-server.ts';
import { rolloutNode, type LogLine } from './support.ts';

const MAX_PAYLOAD = 65_536;
const STEPS = 3;
const BATCH = 4;

describe('groups and results larger than max_payload', () => {
  let nats: NatsServer;
  before(async () => {
    nats = await requireNatsServer(`max_payload: ${MAX_PAYLOAD}\n`);
  });
  after(async () => {
    await nats.stop();
  });

  it('groups and results several times max_payload land whole, a redelivered group reads its chunks again, and every group is accounted for', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-cluster-large-'));
    const dataset = join(dir, 'prompts.jsonl');
    // Reset params of ≈ 100 KB: every group sent is 2 chunks.
    writeFileSync(dataset, `${JSON.stringify({ padding: 'x'.repeat(100_000) })}\n`.repeat(4));
    const lines: LogLine[] = [];
    const stream = new Writable({
      write(chunk: Buffer, _encoding, done) {
        for (const text of chunk.toString().split('\n')) if (text !== '') lines.push(JSON.parse(text) as LogLine);
        done();
      },
    });
    const engine = createEngine(
      {
        batchSize: BATCH,
        // 400 think tokens a reply (≈ 40 KB with token ids and logprobs): results of 4 rollouts are ≈ 5 chunks.
        mock: { latencyMs: 300, thinkTokens: 400 },
        tasks: [
          {
            name: 'big',
            env: {
              module: new URL('../fixtures/params-counting-env.ts', import.meta.url).pathname,
              export: 'createEnv',
            },
            dataset,
            groupSize: 4,
            maxTokens: 4096,
          },
        ],
        producer: { strategy: 'sync' },
        workers: { nats: { url: nats.url, run: 'large', ackWaitMs: 1_500, maxDeliver: 6 } },
      },
      { log: pino({ level: 'debug' }, stream) },
    );
    const a = rolloutNode(nats.url, 'large', 'a');
    const b = rolloutNode(nats.url, 'large', 'b');
    try {
      await engine.start();
      // The sync strategy produces a step's groups when it is asked for.
      const firstBatch = engine.getBatch(1);
      // The first node to take a group is killed while it runs it: the other reads its chunks again.
      const [killed, other, taken] = await Promise.race(
        [a, b].map((node) =>
          node
            .waitFor((l) => l.msg === 'running group', 'running a group')
            .then((l) => [node, node === a ? b : a, l] as const),
        ),
      );
      assert.ok(Number(taken.chunks) > 1, `the group sent is in chunks: ${JSON.stringify(taken)}`);
      await killed.kill('SIGKILL');
      for (let step = 1; step <= STEPS; step++) {
        const batch = step === 1 ? await firstBatch : await engine.getBatch(step);
        assert.equal(batch.status, 'NORMAL');
        assert.equal(batch.groups.length, BATCH);
        for (const group of batch.groups) {
          assert.equal(group.status, 'COMPLETED', group.error ?? '');
          for (const rollout of group.rollouts)
            assert.ok((rollout.turns[0]?.responseIds?.length ?? 0) > 400, 'every reply whole');
        }
      }
      await other.waitFor(
        (l) => l.msg === 'running group' && l.dispatch === taken.dispatch && Number(l.delivery) >= 2,
        "the killed node's group delivered again to the other",
      );
      const landed = lines.filter((l) => l.msg === 'group landed');
      assert.ok(landed.length >= STEPS * BATCH);
      assert.ok(
        landed.every((l) => Number(l.chunks) >= 3),
        `every result is several times max_payload (9 chunks here): ${JSON.stringify(landed.map((l) => l.chunks))}`,
      );
      const stats = await engine.stats();
      const dropped = Object.values(stats.groups.dropped).reduce((x, y) => x + y, 0);
      assertAccounted(stats);
      assert.equal(stats.groups.taken, STEPS * BATCH);
      assert.equal(dropped, 0, JSON.stringify(stats.groups.dropped));
    } catch (err) {
      const said = lines.filter((l) => Number(l.level) >= 40 || l.msg === 'group landed');
      throw new Error(
        `${String(err)}\ncoordinator:\n${said
          .map((l) => JSON.stringify(l))
          .join('\n')
          .slice(-4000)}`,
      );
    } finally {
      await engine.close();
      await Promise.all([a, b].map((n) => n.kill('SIGTERM')));
    }
  });
});

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createEngine } from '../src/index.ts';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { resolveConfig } from '../src/config.ts';
import { readCheckpoint, writeCheckpoint } from '../src/coordinator/checkpoint.ts';
import type { ProducerSnapshot } from '../src/coordinator/producer.ts';
import { newGroup, Status, type TurnRecord } from '../src/protocol/rollout.ts';
import { sharePromptPrefix } from '../src/rollout/prompt-prefix.ts';
import { startMockLlm, type MockLlm } from '../src/testing/mock-llm/server.ts';
import { promptTokenIds } from '../src/testing/mock-llm/tokens.ts';

function turn(step: number, promptIds: number[] | null, agentId: string | null = null): TurnRecord {
  return {
    step,
    agentId,
    messages: [],
    response: '',
    finishReason: 'stop',
    promptIds: promptIds === null ? null : Int32Array.from(promptIds),
    responseIds: null,
    logprobs: null,
    modelSteps: null,
    seed: null,
    modelStep: 0,
    reward: 0,
    terminated: false,
    truncated: false,
    trainable: false,
    timings: { inferenceMs: 0, envMs: 0, totalMs: 0 },
  };
}

/** Record the turns one by one, as the agent loop does. */
function record(turns: TurnRecord[], from = 0): TurnRecord[] {
  for (let i = from; i < turns.length; i++) sharePromptPrefix(turns, from, i);
  return turns;
}

const ids = (turns: TurnRecord[]) => turns.map((t) => (t.promptIds === null ? null : Array.from(t.promptIds)));

describe('prompt ids shared along an episode (rollout/prompt-prefix.ts)', () => {
  it('makes every earlier prompt a view into the latest when each prompt extends the one before', () => {
    const turns = record([turn(1, [1, 2]), turn(2, [1, 2, 3, 4]), turn(3, [1, 2, 3, 4, 5, 6])]);
    assert.deepEqual(ids(turns), [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6]]);
    assert.ok(turns.every((t) => t.promptIds!.buffer === turns[2].promptIds!.buffer && t.promptIds!.byteOffset === 0));
  });

  it('keeps a prompt that is not an extension (a trimmed or rewritten history) in an array of its own, and shares again after it', () => {
    const turns = record([turn(1, [1, 2]), turn(2, [9, 2, 3]), turn(3, [9, 2, 3, 4])]);
    assert.deepEqual(ids(turns), [[1, 2], [9, 2, 3], [9, 2, 3, 4]]);
    assert.notEqual(turns[0].promptIds!.buffer, turns[2].promptIds!.buffer);
    assert.equal(turns[1].promptIds!.buffer, turns[2].promptIds!.buffer);
  });

  it('never changes turns before `from` (they came from the coordinator: result-delta.ts)', () => {
    const turns = [turn(1, [1]), turn(2, [1, 2]), turn(3, [1, 2, 3])];
    const received = turns[0].promptIds;
    record(turns, 1);
    assert.equal(turns[0].promptIds, received);
    assert.equal(turns[1].promptIds!.buffer, turns[2].promptIds!.buffer);
  });

  it('shares along each agent of a multi-agent episode separately', () => {
    const turns = record([turn(1, [1], 'a'), turn(1, [5], 'b'), turn(2, [1, 2], 'a'), turn(2, [5, 6], 'b')]);
    assert.deepEqual(ids(turns), [[1], [5], [1, 2], [5, 6]]);
    assert.equal(turns[0].promptIds!.buffer, turns[2].promptIds!.buffer);
    assert.equal(turns[1].promptIds!.buffer, turns[3].promptIds!.buffer);
  });

  it('leaves turns without prompt ids (a server that returns none) alone', () => {
    const turns = record([turn(1, null), turn(2, [1, 2])]);
    assert.deepEqual(ids(turns), [null, [1, 2]]);
  });
});

describe('prompt ids restored from a checkpoint', () => {
  it('are shared again along each rollout, with its messages (the file holds every turn\'s conversation whole)', () => {
    const config = resolveConfig({ llm: { url: 'http://127.0.0.1:9' }, tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' } }] });
    const group = newGroup({ taskName: 'guess', promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} }, 1);
    group.rollouts[0].turns = [turn(1, [1, 2]), turn(2, [1, 2, 3, 4]), turn(3, [1, 2, 3, 4, 5])];
    const said = [{ role: 'user' as const, content: 'guess' }, { role: 'assistant' as const, content: '50' }, { role: 'user' as const, content: 'higher' }];
    group.rollouts[0].turns.forEach((t, i) => (t.messages = said.slice(0, 1 + i)));
    group.rollouts[0].status = Status.COMPLETED;
    const path = join(mkdtempSync(join(tmpdir(), 'prompt-prefix-')), 'engine.ckpt');
    const snapshot = { modelStep: 0, progress: {}, buffer: { groups: [group], dropped: {}, lastDropReason: null }, samplers: {}, counts: {}, inFlight: [], lastBatch: null };
    writeCheckpoint(path, config, snapshot as unknown as ProducerSnapshot);
    const turns = readCheckpoint(path, config).buffer.groups[0].rollouts[0].turns;
    assert.deepEqual(ids(turns), [[1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5]]);
    assert.ok(turns.every((t) => t.promptIds!.buffer === turns[2].promptIds!.buffer));
    assert.deepEqual(turns.map((t) => t.messages.length), [1, 2, 3]);
    assert.ok(turns.every((t) => t.messages.every((m, k) => m === turns[2].messages[k])), 'each message is one object again');
  });
});

describe('prompt ids in a batch with the whole conversation sent (messageCut 0)', () => {
  let mock: MockLlm;
  before(async () => {
    mock = await startMockLlm({ port: 0, latencyMs: 0, seed: 3 });
  });
  after(() => mock.close());

  it('holds each prompt once: every earlier turn views the last turn\'s ids, and holds the ids the server sent for it', async () => {
    const engine = createEngine({
      logLevel: 'silent',
      llm: { url: mock.url },
      batchSize: 2,
      workers: { threads: 1 },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 2, maxSteps: 8, messageCut: 0 }],
    });
    try {
      await engine.start();
      const batch = await engine.getBatch();
      const multiTurn = batch.groups.flatMap((g) => g.rollouts).filter((r) => r.turns.length >= 2);
      assert.ok(multiTurn.length > 0, 'some rollout took more than one turn');
      for (const r of multiTurn) {
        const last = r.turns.at(-1)!.promptIds!;
        for (const t of r.turns) {
          assert.equal(t.promptIds!.buffer, last.buffer, `${r.id} turn ${t.step} holds its own copy`);
          assert.equal(t.promptIds!.byteOffset, last.byteOffset);
          assert.deepEqual(Array.from(t.promptIds!), promptTokenIds(t.messages), `${r.id} turn ${t.step}`);
        }
      }
    } finally {
      await engine.close();
    }
  });
});

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createEngine } from '../src/index.ts';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { resolveConfig } from '../src/config.ts';
import { configFingerprint, readCheckpoint, writeCheckpoint } from '../src/coordinator/checkpoint.ts';
import { decodeCheckpoint, encodeCheckpoint } from '../src/protocol/codec.ts';
import type { ProducerSnapshot } from '../src/coordinator/producer.ts';
import { newGroup, Status, type ChatMessage, type TurnRecord } from '../src/protocol/rollout.ts';
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

describe('conversations in checkpoints', () => {
  const config = resolveConfig({ llm: { url: 'http://127.0.0.1:9' }, tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' } }] });
  const said = Array.from({ length: 9 }, (_, i) => ({ role: i % 2 === 0 ? ('user' as const) : ('assistant' as const), content: `message ${i} `.repeat(50) }));
  /** A 5-turn rollout with the whole conversation sent: each turn's messages and prompt ids begin the next's. */
  function snapshotWithConversation(): ProducerSnapshot {
    const group = newGroup({ taskName: 'guess', promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} }, 1);
    const ids = Array.from({ length: 2000 }, (_, i) => i);
    group.rollouts[0].turns = [1, 2, 3, 4, 5].map((step) => ({ ...turn(step, ids.slice(0, 400 * step)), messages: said.slice(0, 2 * step - 1) }));
    group.rollouts[0].status = Status.COMPLETED;
    return { modelStep: 0, progress: {}, buffer: { groups: [group], dropped: {}, lastDropReason: null }, samplers: {}, counts: {}, inFlight: [], lastBatch: null } as unknown as ProducerSnapshot;
  }
  const tempPath = () => join(mkdtempSync(join(tmpdir(), 'prompt-prefix-')), 'engine.ckpt');
  const plainTurns = (snapshot: ProducerSnapshot) => snapshot.buffer.groups[0].rollouts[0].turns.map((t) => ({ ...t, promptIds: Array.from(t.promptIds!) }));

  it('write each conversation once (version 2), and read back the same turns, sharing their prompt ids and messages', () => {
    const snapshot = snapshotWithConversation();
    const path = tempPath();
    const bytes = writeCheckpoint(path, config, snapshot);
    const whole = encodeCheckpoint({ v: 1, fingerprint: {}, producer: snapshot as unknown as Record<string, unknown> }).byteLength;
    assert.ok(bytes < whole / 2, `${bytes} bytes, ${whole} with every turn whole`);
    const restored = readCheckpoint(path, config);
    assert.deepEqual(plainTurns(restored), plainTurns(snapshot));
    const turns = restored.buffer.groups[0].rollouts[0].turns;
    assert.ok(turns.every((t) => t.promptIds!.buffer === turns[4].promptIds!.buffer), 'prompt ids are views of the last');
    assert.ok(turns.every((t) => t.messages.every((m, k) => m === turns[4].messages[k])), 'each message is one object');
    assert.deepEqual(plainTurns(snapshotWithConversation()), plainTurns(snapshot), 'writing leaves the snapshot as it was');
  });

  it('read version 1 files (every turn whole) and share their conversations again', () => {
    const snapshot = snapshotWithConversation();
    const path = tempPath();
    writeFileSync(path, encodeCheckpoint({ v: 1, fingerprint: configFingerprint(config), producer: snapshot as unknown as Record<string, unknown> }));
    const restored = readCheckpoint(path, config);
    assert.deepEqual(plainTurns(restored), plainTurns(snapshot));
    const turns = restored.buffer.groups[0].rollouts[0].turns;
    assert.ok(turns.every((t) => t.promptIds!.buffer === turns[4].promptIds!.buffer));
    assert.ok(turns.every((t) => t.messages.every((m, k) => m === turns[4].messages[k])));
  });

  it('refuse a carrier that holds no messages array or no Int32Array of ids, naming the field, instead of crashing', () => {
    for (const [field, value, message] of [
      ['messages', 'hello', /turns\[0\]\.messagesPrefixOf must name a turn whose messages has at least its length/],
      ['promptIds', [1, 2, 3], /turns\[0\]\.promptIdsPrefixOf must name a turn whose promptIds has at least its length/],
    ] as const) {
      const path = tempPath();
      writeCheckpoint(path, config, snapshotWithConversation());
      const state = decodeCheckpoint(readFileSync(path), path) as unknown as { producer: ProducerSnapshot };
      (state.producer.buffer.groups[0].rollouts[0].turns[4] as unknown as Record<string, unknown>)[field] = value;
      writeFileSync(path, encodeCheckpoint(state as unknown as { v: number } & Record<string, unknown>));
      assert.throws(() => readCheckpoint(path, config), { code: 'ERR_CHECKPOINT', message });
    }
    const path = tempPath();
    writeCheckpoint(path, config, snapshotWithConversation());
    const state = decodeCheckpoint(readFileSync(path), path) as unknown as { producer: ProducerSnapshot };
    (state.producer.buffer.groups[0].rollouts[0].turns[4] as unknown as Record<string, unknown>).messages = null;
    writeFileSync(path, encodeCheckpoint(state as unknown as { v: number } & Record<string, unknown>));
    assert.throws(() => readCheckpoint(path, config), { code: 'ERR_CHECKPOINT', message: /turns\[0\]\.messagesPrefixOf must name a turn whose messages/ });
  });

  it('keep a message that differs only by a field one side lacks (regression: a missing field compared equal to undefined)', () => {
    const snapshot = snapshotWithConversation();
    const [first, second] = snapshot.buffer.groups[0].rollouts[0].turns;
    first.messages = [{ role: 'user', content: 'q', name: undefined }];
    second.messages = [{ role: 'user', content: 'q', tool_call_id: 'abc' } as unknown as ChatMessage, ...second.messages.slice(1)];
    const path = tempPath();
    writeCheckpoint(path, config, snapshot);
    const [a, b] = readCheckpoint(path, config).buffer.groups[0].rollouts[0].turns;
    assert.equal('tool_call_id' in a.messages[0], false);
    assert.equal((b.messages[0] as unknown as { tool_call_id: string }).tool_call_id, 'abc');
  });

  it('refuse a reference that names no turn carrying enough, naming the field', () => {
    const path = tempPath();
    writeCheckpoint(path, config, snapshotWithConversation());
    const state = decodeCheckpoint(readFileSync(path), path) as unknown as { producer: ProducerSnapshot };
    (state.producer.buffer.groups[0].rollouts[0].turns[1] as unknown as { messagesPrefixOf: unknown }).messagesPrefixOf = { turn: 9, length: 3 };
    writeFileSync(path, encodeCheckpoint(state as unknown as { v: number } & Record<string, unknown>));
    assert.throws(() => readCheckpoint(path, config), {
      code: 'ERR_CHECKPOINT',
      message: /producer\.buffer\.groups\[0\]\.rollouts\[0\]\.turns\[1\]\.messagesPrefixOf must name a turn whose messages has at least its length, got \{"turn":9,"length":3\}/,
    });
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

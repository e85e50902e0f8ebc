import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createEngine } from '../src/index.ts';
import type { TurnRecord } from '../src/domain/rollout.ts';
import { sharePromptPrefix } from '../src/worker/prompt-prefix.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/server.ts';
import { promptTokenIds } from '../src/mock-llm/tokens.ts';
import { turnRecord as turn } from './support/turns.ts';

/** Record the turns one by one, as the agent loop does. */
function record(turns: TurnRecord[], from = 0): TurnRecord[] {
  for (let i = from; i < turns.length; i++) sharePromptPrefix(turns, from, i);
  return turns;
}

const ids = (turns: TurnRecord[]) => turns.map((t) => (t.promptIds === null ? null : Array.from(t.promptIds)));

describe('prompt ids shared along an episode (worker/prompt-prefix.ts)', () => {
  it('makes every earlier prompt a view into the latest when each prompt extends the one before', () => {
    const turns = record([turn(1, [1, 2]), turn(2, [1, 2, 3, 4]), turn(3, [1, 2, 3, 4, 5, 6])]);
    assert.deepEqual(ids(turns), [
      [1, 2],
      [1, 2, 3, 4],
      [1, 2, 3, 4, 5, 6],
    ]);
    assert.ok(turns.every((t) => t.promptIds!.buffer === turns[2].promptIds!.buffer && t.promptIds!.byteOffset === 0));
  });

  it('keeps a prompt that is not an extension (a trimmed or rewritten history) in an array of its own, and shares again after it', () => {
    const turns = record([turn(1, [1, 2]), turn(2, [9, 2, 3]), turn(3, [9, 2, 3, 4])]);
    assert.deepEqual(ids(turns), [
      [1, 2],
      [9, 2, 3],
      [9, 2, 3, 4],
    ]);
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

describe('prompt ids in a batch with the whole conversation sent (messageCut 0)', () => {
  let mock: MockLlm;
  before(async () => {
    mock = await startMockLlm({ port: 0, latencyMs: 0, seed: 3 });
  });
  after(() => mock.close());

  it("holds each prompt once: every earlier turn views the last turn's ids, and holds the ids the server sent for it", async () => {
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

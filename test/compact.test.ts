import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { resolveConfig } from '../src/config.ts';
import { configFingerprint, readCheckpoint, writeCheckpoint } from '../src/coordinator/checkpoint.ts';
import type { ProducerSnapshot } from '../src/coordinator/producer.ts';
import { producerSnapshot } from './support/snapshot.ts';
import { decodeCheckpoint, encodeCheckpoint, toJson } from '../src/protocol/codec.ts';
import { compactGroup } from '../src/protocol/compact.ts';
import { newGroup, Status, type ChatMessage } from '../src/protocol/rollout.ts';
import { turnRecord as turn } from './support/turns.ts';

describe('the compact form (protocol/compact.ts)', () => {
  it('compacts messages that are equal copies (as a restored checkpoint holds them), past turns with no prompt ids', () => {
    const group = newGroup({ taskName: 't', promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} }, 1);
    const said = (n: number): ChatMessage[] =>
      [
        { role: 'user' as const, content: 'guess' },
        { role: 'assistant' as const, content: '50' },
        { role: 'user' as const, content: 'higher' },
      ].slice(0, n);
    group.rollouts[0].turns = [
      { ...turn(1, [1, 2]), messages: said(1) },
      { ...turn(2, null), messages: [] },
      { ...turn(2, [1, 2, 3]), messages: said(3) },
    ];
    const sent = JSON.parse(toJson(group));
    const [first, empty] = compactGroup(group).rollouts[0].turns;
    assert.deepEqual(
      [first.messages, first.messagesPrefixOf, first.promptIds, first.promptIdsPrefixOf],
      [null, { turn: 2, length: 1 }, null, { turn: 2, length: 2 }],
    );
    assert.deepEqual([empty.messages, empty.promptIds, 'messagesPrefixOf' in empty], [[], null, false]);
    assert.deepEqual(JSON.parse(toJson(group)), sent, 'the group given is not changed');
  });
});

describe('conversations in checkpoints', () => {
  const config = resolveConfig({
    llm: { url: 'http://127.0.0.1:9' },
    tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' } }],
  });
  const said = Array.from({ length: 9 }, (_, i) => ({
    role: i % 2 === 0 ? ('user' as const) : ('assistant' as const),
    content: `message ${i} `.repeat(50),
  }));
  /** A 5-turn rollout with the whole conversation sent: each turn's messages and prompt ids begin the next's. */
  function snapshotWithConversation(): ProducerSnapshot {
    const group = newGroup({ taskName: 'guess', promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} }, 1);
    const ids = Array.from({ length: 2000 }, (_, i) => i);
    group.rollouts[0].turns = [1, 2, 3, 4, 5].map((step) => ({
      ...turn(step, ids.slice(0, 400 * step)),
      messages: said.slice(0, 2 * step - 1),
    }));
    group.rollouts[0].status = Status.COMPLETED;
    return producerSnapshot(config, [group]);
  }
  const tempPath = () => join(mkdtempSync(join(tmpdir(), 'compact-')), 'engine.ckpt');
  const plainTurns = (snapshot: ProducerSnapshot) =>
    snapshot.buffer.groups[0].rollouts[0].turns.map((t) => ({ ...t, promptIds: Array.from(t.promptIds!) }));

  it('write each conversation once (version 2), and read back the same turns, sharing their prompt ids and messages', () => {
    const snapshot = snapshotWithConversation();
    const path = tempPath();
    const bytes = writeCheckpoint(path, config, snapshot);
    const whole = encodeCheckpoint({
      v: 1,
      fingerprint: {},
      producer: snapshot as unknown as Record<string, unknown>,
    }).byteLength;
    assert.ok(bytes < whole / 2, `${bytes} bytes, ${whole} with every turn whole`);
    const restored = readCheckpoint(path, config);
    assert.deepEqual(plainTurns(restored), plainTurns(snapshot));
    const turns = restored.buffer.groups[0].rollouts[0].turns;
    assert.ok(
      turns.every((t) => t.promptIds!.buffer === turns[4].promptIds!.buffer),
      'prompt ids are views of the last',
    );
    assert.ok(
      turns.every((t) => t.messages.every((m, k) => m === turns[4].messages[k])),
      'each message is one object',
    );
    assert.deepEqual(
      plainTurns(snapshotWithConversation()),
      plainTurns(snapshot),
      'writing leaves the snapshot as it was',
    );
  });

  it('read version 1 files (every turn whole) and share their conversations again', () => {
    const snapshot = snapshotWithConversation();
    const path = tempPath();
    writeFileSync(
      path,
      encodeCheckpoint({
        v: 1,
        fingerprint: configFingerprint(config),
        producer: snapshot as unknown as Record<string, unknown>,
      }),
    );
    const restored = readCheckpoint(path, config);
    assert.deepEqual(plainTurns(restored), plainTurns(snapshot));
    const turns = restored.buffer.groups[0].rollouts[0].turns;
    assert.ok(turns.every((t) => t.promptIds!.buffer === turns[4].promptIds!.buffer));
    assert.ok(turns.every((t) => t.messages.every((m, k) => m === turns[4].messages[k])));
  });

  it('refuse a carrier that holds no messages array or no Int32Array of ids, naming the field, instead of crashing', () => {
    for (const [field, value, message] of [
      ['messages', 'hello', /turns\[0\]\.messagesPrefixOf must name a turn whose messages has at least its length/],
      [
        'promptIds',
        [1, 2, 3],
        /turns\[0\]\.promptIdsPrefixOf must name a turn whose promptIds has at least its length/,
      ],
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
    assert.throws(() => readCheckpoint(path, config), {
      code: 'ERR_CHECKPOINT',
      message: /turns\[0\]\.messagesPrefixOf must name a turn whose messages/,
    });
  });

  it('refuse a snapshot whose counts, steps, cursors or groups are not what the producer needs, naming the field (regression: TypeErrors, and a count of null after restore)', () => {
    const cases: [(p: Record<string, any>, state: Record<string, any>) => void, RegExp][] = [
      [(_p, state) => delete state.producer, /: producer must be an object, got undefined/],
      [(_p, state) => delete state.fingerprint, /: fingerprint must be an object, got undefined/],
      [(p) => (p.buffer = null), /producer\.buffer\.groups must be an array, got null/],
      [(p) => (p.counts.scheduled = 'lots'), /producer\.counts\.scheduled must be a non-negative integer, got "lots"/],
      [
        (p) => (p.progress.nextConsumerStep = 'x'),
        /producer\.progress\.nextConsumerStep must be a positive integer, got "x"/,
      ],
      [(p) => delete p.samplers.guess, /producer\.samplers\.guess must be a non-negative integer/],
      [
        (p) => p.inFlight.push({ junk: true }),
        /producer\.inFlight\[0\]\.taskName must be a task of the config \(guess\), got undefined/,
      ],
      [
        (p) => (p.buffer.groups[0].status = 'WHATEVER'),
        /producer\.buffer\.groups\[0\]\.status must be one of INIT, COMPLETED/,
      ],
      [
        (p) => (p.buffer.groups[0].rollouts[0].reward = 'abc'),
        /producer\.buffer\.groups\[0\]\.rollouts\[0\]\.reward must be a finite number, got "abc"/,
      ],
      [
        (p) => (p.lastBatch = { trainStep: 0, groups: [] }),
        /producer\.lastBatch\.trainStep must be a positive integer, got 0/,
      ],
    ];
    for (const [edit, message] of cases) {
      const path = tempPath();
      writeCheckpoint(path, config, snapshotWithConversation());
      const state = decodeCheckpoint(readFileSync(path), path) as unknown as Record<string, any>;
      edit(state.producer, state);
      writeFileSync(path, encodeCheckpoint(state as { v: number } & Record<string, unknown>));
      assert.throws(() => readCheckpoint(path, config), { code: 'ERR_CHECKPOINT', message });
    }
  });

  it('keep a message that differs only by a field one side lacks (regression: a missing field compared equal to undefined)', () => {
    const snapshot = snapshotWithConversation();
    const [first, second] = snapshot.buffer.groups[0].rollouts[0].turns;
    first.messages = [{ role: 'user', content: 'q', name: undefined }];
    second.messages = [
      { role: 'user', content: 'q', tool_call_id: 'abc' } as unknown as ChatMessage,
      ...second.messages.slice(1),
    ];
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
    (
      state.producer.buffer.groups[0].rollouts[0].turns[1] as unknown as { messagesPrefixOf: unknown }
    ).messagesPrefixOf = { turn: 9, length: 3 };
    writeFileSync(path, encodeCheckpoint(state as unknown as { v: number } & Record<string, unknown>));
    assert.throws(() => readCheckpoint(path, config), {
      code: 'ERR_CHECKPOINT',
      message:
        /producer\.buffer\.groups\[0\]\.rollouts\[0\]\.turns\[1\]\.messagesPrefixOf must name a turn whose messages has at least its length, got \{"turn":9,"length":3\}/,
    });
  });
});

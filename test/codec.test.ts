import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Packr } from 'msgpackr';
import { decodeMessage, encodeMessage } from '../src/protocol/codec.ts';
import { PROTOCOL_VERSION, type GroupResultMessage } from '../src/protocol/messages.ts';
import { newGroup, Status, type TurnRecord } from '../src/protocol/rollout.ts';

function resultWithTokens(seed: number): GroupResultMessage {
  const group = newGroup({ taskName: 't', promptIndex: seed, drawIndex: seed, seed, envParams: { a: seed } }, 2);
  const turn: TurnRecord = {
    step: 1,
    agentId: null,
    messages: [{ role: 'user', content: `hi ${seed}` }],
    response: 'ok',
    finishReason: 'stop',
    promptIds: Int32Array.from({ length: 4096 }, (_, i) => i + seed),
    responseIds: Int32Array.from({ length: 1024 }, (_, i) => 2 * i + seed),
    logprobs: Float32Array.from({ length: 1024 }, (_, i) => -i / 1024 - seed),
    modelSteps: new Int32Array(1024).fill(seed),
    seed: 11,
    modelStep: seed,
    reward: 1,
    terminated: true,
    truncated: false,
    trainable: true,
    timings: { inferenceMs: 1, envMs: 2, totalMs: 3 },
  };
  group.rollouts[0].turns.push(turn);
  group.rollouts[0].status = Status.COMPLETED;
  return { v: PROTOCOL_VERSION, type: 'group-result', group, keptTurns: [0, 0], workerId: 7 };
}

/** The same message bytes with its msgpack body changed by `edit` (the arrays block kept as it was). */
function withBody(bytes: Uint8Array, edit: (body: unknown) => void): Uint8Array {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const bodyLength = view.getUint32(0, true);
  const start = (4 + bodyLength + 7) & ~7;
  const packr = new Packr({ useRecords: false, moreTypes: true, structuredClone: true });
  const body = packr.unpack(bytes.subarray(4, 4 + bodyLength));
  edit(body);
  const packed = packr.pack(body);
  const out = new Uint8Array(((4 + packed.byteLength + 7) & ~7) + bytes.byteLength - start);
  new DataView(out.buffer).setUint32(0, packed.byteLength, true);
  out.set(packed, 4);
  out.set(bytes.subarray(start), (4 + packed.byteLength + 7) & ~7);
  return out;
}

describe('msgpack codec', () => {
  it('round-trips token ids, logprobs and model steps as typed arrays with identical contents', () => {
    const message = resultWithTokens(3);
    const decoded = decodeMessage(encodeMessage(message)) as GroupResultMessage;
    const turn = decoded.group.rollouts[0].turns[0];
    assert.ok(turn.promptIds instanceof Int32Array);
    assert.ok(turn.responseIds instanceof Int32Array);
    assert.ok(turn.logprobs instanceof Float32Array);
    assert.ok(turn.modelSteps instanceof Int32Array);
    assert.deepEqual(decoded, message);
  });

  it('sends a message that several turns share once, and the decoded turns share it again', () => {
    const withSystem = (text: string) => {
      const message = resultWithTokens(5);
      const rollout = message.group.rollouts[0];
      const system = { role: 'system' as const, content: text };
      const first = rollout.turns[0];
      first.messages = [system, { role: 'user', content: 'guess' }];
      rollout.turns.push({
        ...first,
        step: 2,
        messages: [...first.messages, { role: 'assistant', content: '50' }, { role: 'user', content: 'higher' }],
      });
      return message;
    };
    const big = withSystem('x'.repeat(10_000));
    const bytes = encodeMessage(big);
    const grown = bytes.byteLength - encodeMessage(withSystem('x')).byteLength;
    assert.ok(grown > 9_000 && grown < 11_000, `a 10 kB system message in two turns adds ${grown} bytes: sent once`);
    const turns = (decodeMessage(bytes) as GroupResultMessage).group.rollouts[0].turns;
    assert.equal(turns[1].messages[0], turns[0].messages[0]);
    assert.deepEqual(turns[1].messages, big.group.rollouts[0].turns[1].messages);
  });

  it('gives each encoding its own buffer, so a later pack never overwrites or detaches an earlier one', () => {
    const first = encodeMessage(resultWithTokens(1));
    const firstCopy = Uint8Array.from(first);
    assert.equal(first.byteOffset, 0);
    assert.equal(
      first.buffer.byteLength,
      first.byteLength,
      'bytes must own their ArrayBuffer exactly, so it can be transferred',
    );
    const second = encodeMessage(resultWithTokens(2));
    structuredClone(second.buffer, { transfer: [second.buffer as ArrayBuffer] }); // detach the second one
    assert.deepEqual(first, firstCopy);
    const decoded = decodeMessage(first) as GroupResultMessage;
    assert.equal(decoded.group.rollouts[0].turns[0].responseIds![1], 2 + 1);
  });

  it('carries token arrays beside the body: decoded, they are views into one block, not an ArrayBuffer each (regression: 2–3 µs per array)', () => {
    const message = resultWithTokens(4);
    const rollout = message.group.rollouts[0];
    rollout.turns.push({
      ...rollout.turns[0],
      step: 2,
      responseIds: Int32Array.of(9, 8, 7),
      lossMask: Uint8Array.of(1, 0, 1),
    });
    const decoded = decodeMessage(encodeMessage(message)) as GroupResultMessage;
    const [first, second] = decoded.group.rollouts[0].turns;
    const blocks = new Set(
      [first.promptIds, first.responseIds, first.logprobs, first.modelSteps, second.responseIds, second.lossMask].map(
        (a) => a!.buffer,
      ),
    );
    assert.equal(blocks.size, 1);
    assert.equal(second.promptIds, first.promptIds, 'an array two turns shared is sent once and shared again');
    assert.deepEqual(decoded, message);
    assert.deepEqual(
      rollout.turns[1].responseIds,
      Int32Array.of(9, 8, 7),
      "encoding leaves the caller's turns as they were",
    );
  });

  it('lays out prompt ids that are prefix views of one array once, and the decoded turns view one copy of them', () => {
    const message = resultWithTokens(5);
    const rollout = message.group.rollouts[0];
    const last = rollout.turns[0].promptIds!; // 4096 ids = 16 KiB
    rollout.turns.unshift(
      { ...rollout.turns[0], step: 1, promptIds: last.subarray(0, 1000) },
      { ...rollout.turns[0], step: 2, promptIds: last.subarray(0, 3000) },
    );
    const shared = encodeMessage(message).byteLength;
    const apart = encodeMessage({
      ...message,
      group: {
        ...message.group,
        rollouts: [
          { ...rollout, turns: rollout.turns.map((t) => ({ ...t, promptIds: t.promptIds!.slice() })) },
          message.group.rollouts[1],
        ],
      },
    }).byteLength;
    assert.ok(
      apart - shared >= 4 * 4000,
      `the two earlier prompts ride inside the last one (${shared} vs ${apart} bytes)`,
    );
    const turns = (decodeMessage(encodeMessage(message)) as GroupResultMessage).group.rollouts[0].turns;
    assert.deepEqual(
      turns.map((t) => Array.from(t.promptIds!)),
      rollout.turns.map((t) => Array.from(t.promptIds!)),
    );
    assert.deepEqual(
      new Set(turns.map((t) => t.promptIds!.byteOffset)).size,
      1,
      'each earlier prompt is a prefix view of the last',
    );
  });

  it('lays out views spread thinly over a larger buffer one by one, so the bytes between them never travel', () => {
    const message = resultWithTokens(6);
    const pooled = new Int32Array(64 * 1024); // 256 KiB, as a pooled allocation might be
    pooled.set([1, 2, 3], 10);
    pooled.set([7, 8], 60_000);
    const [turn] = message.group.rollouts[0].turns;
    message.group.rollouts[0].turns.push({
      ...turn,
      step: 2,
      promptIds: pooled.subarray(10, 13),
      responseIds: pooled.subarray(60_000, 60_002),
    });
    const bytes = encodeMessage(message);
    assert.ok(bytes.byteLength < 64 * 1024, `${bytes.byteLength} bytes`);
    const second = (decodeMessage(bytes) as GroupResultMessage).group.rollouts[0].turns[1];
    assert.deepEqual(
      [Array.from(second.promptIds!), Array.from(second.responseIds!)],
      [
        [1, 2, 3],
        [7, 8],
      ],
    );
  });

  it('sends a decoded group on again with only the bytes its views cover (regression: logprobs rode twice inside a region of ids)', () => {
    const message = resultWithTokens(7);
    const rollout = message.group.rollouts[0];
    const base = rollout.turns[0];
    const last = base.promptIds!;
    // Three turns whose prompts are prefixes of the last: in the decoded block their ids and logprobs interleave.
    rollout.turns = [1000, 2000, 4096].map((n, i) => ({
      ...base,
      step: i + 1,
      promptIds: last.subarray(0, n),
      responseIds: base.responseIds!.slice(),
      logprobs: base.logprobs!.slice(),
    }));
    const first = encodeMessage(message);
    const again = encodeMessage(decodeMessage(first));
    assert.ok(
      again.byteLength <= first.byteLength,
      `${again.byteLength} bytes sent on, ${first.byteLength} the first time`,
    );
    assert.deepEqual(decodeMessage(again), message);
  });

  it('refuses a message whose array reference points outside the arrays after the body, naming the field', () => {
    const bytes = encodeMessage(resultWithTokens(1));
    const cut = bytes.subarray(0, bytes.byteLength - 8); // the last array loses its end
    assert.throws(() => decodeMessage(cut), {
      code: 'ERR_PROTOCOL',
      message: /message\.group\.rollouts\[0\]\.turns\[0\]\.modelSteps must reference the arrays after the body/,
    });
    assert.throws(() => decodeMessage(bytes.subarray(0, 10)), {
      code: 'ERR_PROTOCOL',
      message: /header declares a \d+-byte body, but only 6 bytes follow/,
    });
    // A negative offset (−4 % 4 is −0, so only an explicit bound refuses it) used to reach the typed-array constructor.
    const negative = withBody(
      bytes,
      (body) =>
        (((body as GroupResultMessage).group.rollouts[0].turns[0] as unknown as Record<string, unknown>).promptIds = [
          0, -4, 1,
        ]),
    );
    assert.throws(() => decodeMessage(negative), {
      code: 'ERR_PROTOCOL',
      message: /turns\[0\]\.promptIds must reference the arrays after the body, got \[0,-4,1\]/,
    });
  });

  it('rejects bytes from another protocol version with a message naming the field', () => {
    const bytes = encodeMessage({ ...resultWithTokens(1), v: 99 as typeof PROTOCOL_VERSION });
    assert.throws(() => decodeMessage(bytes), { code: 'ERR_PROTOCOL', message: /message\.v must be 2, got 99/ });
  });

  it('rejects garbage bytes and unknown message types with ERR_PROTOCOL instead of crashing', () => {
    assert.throws(() => decodeMessage(new Uint8Array([0xc1])), { code: 'ERR_PROTOCOL' });
    const bytes = encodeMessage({ ...resultWithTokens(1), type: 'nope' as 'group-result' });
    assert.throws(() => decodeMessage(bytes), { code: 'ERR_PROTOCOL', message: /message\.type must be one of/ });
  });
});

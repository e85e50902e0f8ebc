/** Trimming a conversation to the last messages before each inference call (src/rollout/trim.ts). */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { trimMessages } from '../src/rollout/trim.ts';
import type { ChatMessage } from '../src/protocol/rollout.ts';

describe('message trimming (messageCut)', () => {
  const conv: ChatMessage[] = [
    { role: 'system', content: 's' },
    ...Array.from(
      { length: 9 },
      (_, i): ChatMessage => ({ role: i % 2 === 0 ? 'user' : 'assistant', content: `m${i}` }),
    ),
  ];
  it('keeps the system message and the last 2 × cut − 1 messages', () => {
    assert.deepEqual(
      trimMessages(conv, 2).map((m) => m.content),
      ['s', 'm6', 'm7', 'm8'],
    );
    assert.deepEqual(
      trimMessages(conv.slice(1), 1).map((m) => m.content),
      ['m8'],
    );
  });
  it('keeps everything when cut is 0, and an empty prompt stays empty', () => {
    assert.equal(trimMessages(conv, 0).length, conv.length);
    assert.deepEqual(trimMessages([], 3), []);
  });
});

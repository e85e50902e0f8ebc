/** Prompt sampling (src/buffer/sampler.ts): the per-prompt seeds. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { mixSeed } from '../src/buffer/sampler.ts';

describe('prompt seeds', () => {
  it('are stable for a (run seed, task, prompt) and differ across prompts and tasks', () => {
    assert.equal(mixSeed(0, 'a', 1), mixSeed(0, 'a', 1));
    assert.notEqual(mixSeed(0, 'a', 1), mixSeed(0, 'a', 2));
    assert.notEqual(mixSeed(0, 'a', 1), mixSeed(0, 'b', 1));
    assert.notEqual(mixSeed(0, 'a', 1), mixSeed(1, 'a', 1));
  });
});

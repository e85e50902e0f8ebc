import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ProducerLifecycle } from '../src/coordinator/producer-state.ts';

describe('the producer lifecycle (coordinator/producer-state.ts)', () => {
  it('goes idle → running → pausing → paused → running → closing → closed, one epoch per resume', () => {
    const life = new ProducerLifecycle();
    assert.equal(life.state, 'idle');
    life.start();
    assert.equal(life.state, 'running');
    const epoch = life.beginPause();
    assert.deepEqual([life.state, epoch, life.paused, life.stillPausing(epoch)], ['pausing', 0, true, true]);
    life.endPause();
    assert.equal(life.state, 'paused');
    assert.equal(life.resume(), 1);
    assert.deepEqual([life.state, life.paused, life.stillPausing(epoch)], ['running', false, false]);
    assert.equal(life.beginClose(), true);
    assert.deepEqual([life.state, life.closed], ['closing', true]);
    life.endClose();
    assert.equal(life.state, 'closed');
  });

  it('stays pausing until the last of two overlapping pause sequences returns', () => {
    const life = new ProducerLifecycle();
    life.start();
    life.beginPause();
    life.beginPause(); // a trainer whose /pause timed out asks again
    life.endPause();
    assert.equal(life.state, 'pausing');
    life.endPause();
    assert.equal(life.state, 'paused');
  });

  it('ends a pause sequence when a resume comes before it returns, and the sequence returning leaves the state running', () => {
    const life = new ProducerLifecycle();
    life.start();
    const epoch = life.beginPause();
    life.resume();
    assert.equal(life.stillPausing(epoch), false);
    life.endPause();
    assert.equal(life.state, 'running');
  });

  it('resumes without a pause: running stays running with a new epoch', () => {
    const life = new ProducerLifecycle();
    life.start();
    assert.deepEqual([life.resume(), life.state], [1, 'running']);
  });

  it('refuses a transition from the wrong state with ERR_ENGINE_STATE naming both states', () => {
    const life = new ProducerLifecycle();
    assert.throws(() => life.beginPause(), {
      code: 'ERR_ENGINE_STATE',
      message: /cannot pause while it is idle \(only while running or pausing or paused\)/,
    });
    assert.throws(() => life.resume(), { code: 'ERR_ENGINE_STATE' });
    life.start();
    assert.throws(() => life.start(), { code: 'ERR_ENGINE_STATE', message: /cannot start while it is running/ });
    life.beginClose();
    assert.equal(life.beginClose(), false, 'a second close waits for the first');
    assert.throws(() => life.resume(), { code: 'ERR_ENGINE_STATE', message: /while it is closing/ });
    assert.throws(() => life.beginPause(), { code: 'ERR_ENGINE_STATE' });
  });
});

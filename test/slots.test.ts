import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { delay } from '../src/cancel.ts';
import { Slots } from '../src/slots.ts';

describe('Slots', () => {
  it('hands a released slot to the oldest waiter, so a newcomer never overtakes and taken never exceeds size', async () => {
    const slots = new Slots(2);
    await slots.acquire();
    await slots.acquire();
    const order: string[] = [];
    const a = slots.acquire().then(() => order.push('a'));
    const b = slots.acquire().then(() => order.push('b'));
    assert.equal(slots.waiting, 2);
    slots.release();
    await a;
    const c = slots.acquire().then(() => order.push('c')); // arrives while b still waits
    slots.release();
    slots.release();
    await Promise.all([b, c]);
    assert.deepEqual(order, ['a', 'b', 'c']);
    assert.equal(slots.taken, 2);
    assert.equal(slots.waiting, 0);
  });

  it('rejects a waiter whose signal aborts and takes it out of the queue without giving it a slot', async () => {
    const slots = new Slots(1);
    await slots.acquire();
    const controller = new AbortController();
    const waiting = slots.acquire(controller.signal);
    controller.abort(new Error('paused'));
    await assert.rejects(waiting, /paused/);
    assert.equal(slots.waiting, 0);
    slots.release();
    assert.equal(slots.taken, 0);
    await assert.rejects(slots.acquire(controller.signal), /paused/);
  });

  it('never waits with size Infinity, and refuses a size that is not a positive integer', async () => {
    const slots = new Slots(Infinity);
    await Promise.all(Array.from({ length: 1000 }, () => slots.acquire()));
    assert.equal(slots.taken, 1000);
    assert.throws(() => new Slots(0), /positive integer/);
    assert.throws(() => new Slots(1.5), /positive integer/);
    assert.throws(() => new Slots(1).release(), /without a slot held/);
  });
});

describe('delay', () => {
  it('resolves after its time, and rejects with the reason as soon as its signal aborts', async () => {
    await delay(1);
    const controller = new AbortController();
    const sleeping = delay(60_000, controller.signal);
    controller.abort(new Error('cancelled for a weight update'));
    await assert.rejects(sleeping, /cancelled for a weight update/);
    await assert.rejects(delay(1, controller.signal), /cancelled for a weight update/);
  });
});

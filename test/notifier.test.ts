/** The producer's wake-up primitive (src/coordinator/notifier.ts). */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Notifier } from '../src/coordinator/notifier.ts';

describe('Notifier', () => {
  it('wakes every waiter pending at notify(), and not the ones that start waiting later', async () => {
    const notifier = new Notifier();
    const woken: string[] = [];
    const a = notifier.wait().then(() => woken.push('a'));
    const b = notifier.wait().then(() => woken.push('b'));
    notifier.notify();
    let lateWoken = false;
    void notifier.wait().then(() => (lateWoken = true));
    await Promise.all([a, b]);
    await Promise.resolve();
    assert.deepEqual(woken, ['a', 'b']);
    assert.equal(lateWoken, false);
  });
});

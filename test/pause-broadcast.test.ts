/**
 * The weight-update pause as it travels: the main thread's PauseControl writes the shared control
 * block (src/coordinator/pause-control.ts), each worker's PauseGate reads it (src/worker/pause-gate.ts).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { PauseControl } from '../src/coordinator/pause-control.ts';
import { wallClockUs } from '../src/protocol/control-block.ts';
import { PauseGate } from '../src/worker/pause-gate.ts';

describe('pause broadcast: the last-send clock', () => {
  it('measures a pause by the last call a worker sent after the request, 0 when none was', () => {
    const control = new PauseControl(0);
    const gate = new PauseGate(control.block);
    gate.noteSend();
    const requested = wallClockUs();
    control.pause();
    assert.equal(control.lastSendAfterMs(requested), 0);
    const later = wallClockUs() - 5_000n; // a send stamped 5 ms after a request made then
    gate.noteSend();
    assert.ok(control.lastSendAfterMs(later) >= 5);
    gate.close();
  });
});

describe('pause broadcast: the worker gate', () => {
  it('gives a call made in the tick of a resume fresh hold and cancel signals, before its watcher has run (regression)', async () => {
    const control = new PauseControl(0);
    const gate = new PauseGate(control.block);
    control.pause();
    control.cancel();
    await control.waitForAcks(1, 5_000);
    assert.ok(gate.hold.aborted && gate.signal.aborted);
    control.resume(1);
    // The watcher has not run yet: the shared state says RUNNING, and the signals follow it.
    assert.equal(gate.paused, false);
    assert.equal(gate.hold.aborted, false);
    assert.equal(gate.signal.aborted, false);
    gate.close();
  });

  it('holds before it cancels when a worker sees the pause and its escalation at once (streamed calls keep their tokens)', async () => {
    const control = new PauseControl(0);
    const gate = new PauseGate(control.block);
    const order: string[] = [];
    gate.hold.addEventListener('abort', () => order.push('hold'));
    gate.signal.addEventListener('abort', () => order.push('cancel'));
    control.pause();
    control.cancel(); // both written before the worker's watcher runs
    await control.waitForAcks(1, 5_000);
    assert.deepEqual(order, ['hold', 'cancel']);
    gate.close();
  });
});

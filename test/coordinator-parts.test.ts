import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { allocateBatch } from '../src/coordinator/allocate.ts';
import { Notifier } from '../src/coordinator/notifier.ts';
import { PauseControl } from '../src/coordinator/pause-control.ts';
import { wallClockUs } from '../src/protocol/control-block.ts';
import { PauseGate } from '../src/rollout/pause-gate.ts';
import { ReplayBuffer } from '../src/buffer/replay-buffer.ts';
import { mixSeed } from '../src/buffer/sampler.ts';
import { trimMessages } from '../src/rollout/trim.ts';
import { omitKeptTurns, receivedTurns, restoreKeptTurns } from '../src/protocol/result-delta.ts';
import { fillModelSteps, groupStatus, newGroup, Status, type ChatMessage, type TurnRecord } from '../src/protocol/rollout.ts';

function deferred<T>() {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

describe('batch allocation across tasks', () => {
  it('splits by weight with the largest remainder, ties going to the task listed first', () => {
    assert.deepEqual([...allocateBatch(8, [{ name: 'a', weight: 1 }, { name: 'b', weight: 1 }])], [['a', 4], ['b', 4]]);
    assert.deepEqual([...allocateBatch(7, [{ name: 'a', weight: 1 }, { name: 'b', weight: 1 }])], [['a', 4], ['b', 3]]);
    assert.deepEqual([...allocateBatch(10, [{ name: 'a', weight: 1 }, { name: 'b', weight: 2 }, { name: 'c', weight: 3 }])], [['a', 2], ['b', 3], ['c', 5]]);
    assert.deepEqual([...allocateBatch(1, [{ name: 'a', weight: 1 }, { name: 'b', weight: 1 }, { name: 'c', weight: 1 }])], [['a', 1], ['b', 0], ['c', 0]]);
  });
});

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

describe('replay buffer', () => {
  function group(task: string, i: number, status: (typeof Status)[keyof typeof Status]) {
    const g = newGroup({ taskName: task, promptIndex: i, drawIndex: i, seed: i, envParams: {} }, 2);
    for (const r of g.rollouts) r.status = status;
    g.status = groupStatus(g.rollouts);
    if (status === Status.FAILED) g.rollouts[0].error = `boom ${i}`;
    return g;
  }

  it('takes COMPLETED groups first-in first-out and counts them per task', () => {
    const buffer = new ReplayBuffer(['a', 'b']);
    for (let i = 0; i < 3; i++) buffer.put(group('a', i, Status.COMPLETED));
    buffer.put(group('b', 9, Status.COMPLETED));
    assert.equal(buffer.count('a'), 3);
    assert.equal(buffer.count(), 4);
    assert.deepEqual(buffer.take('a', 2).map((g) => g.id), ['a/0', 'a/1']);
    assert.equal(buffer.count('a'), 1);
  });

  it('counts FAILED and FILTERED groups without storing them, keeping the last reason', () => {
    const buffer = new ReplayBuffer(['a']);
    buffer.put(group('a', 1, Status.FAILED));
    buffer.put(group('a', 2, Status.ABORTED));
    assert.deepEqual(buffer.dropped, { FAILED: 1, FILTERED: 0, EXPIRED: 0 });
    assert.equal(buffer.lastDropReason, 'boom 1');
    assert.equal(buffer.count('a', Status.ABORTED), 1);
    assert.equal(buffer.count('a', Status.COMPLETED), 0);
  });

  it('moves a group between status pools when it is put again', () => {
    const buffer = new ReplayBuffer(['a']);
    const g = group('a', 1, Status.ABORTED);
    buffer.put(g);
    for (const r of g.rollouts) r.status = Status.COMPLETED;
    g.status = Status.COMPLETED;
    buffer.put(g);
    assert.equal(buffer.count('a', Status.ABORTED), 0);
    assert.equal(buffer.count('a', Status.COMPLETED), 1);
  });
});

describe('group status', () => {
  it('is COMPLETED only when every member is, else the first present of FAILED > ABORTED > EXPIRED > FILTERED', () => {
    const g = newGroup({ taskName: 't', promptIndex: 0, drawIndex: 0, seed: 0, envParams: {} }, 3);
    const set = (...s: (typeof Status)[keyof typeof Status][]) => s.forEach((st, i) => (g.rollouts[i].status = st));
    set(Status.COMPLETED, Status.COMPLETED, Status.COMPLETED);
    assert.equal(groupStatus(g.rollouts), Status.COMPLETED);
    set(Status.COMPLETED, Status.ABORTED, Status.FAILED);
    assert.equal(groupStatus(g.rollouts), Status.FAILED);
    set(Status.EXPIRED, Status.ABORTED, Status.COMPLETED);
    assert.equal(groupStatus(g.rollouts), Status.ABORTED);
    set(Status.FILTERED, Status.EXPIRED, Status.COMPLETED);
    assert.equal(groupStatus(g.rollouts), Status.EXPIRED);
  });
});

describe('message trimming (messageCut)', () => {
  const conv: ChatMessage[] = [
    { role: 'system', content: 's' },
    ...Array.from({ length: 9 }, (_, i): ChatMessage => ({ role: i % 2 === 0 ? 'user' : 'assistant', content: `m${i}` })),
  ];
  it('keeps the system message and the last 2 × cut − 1 messages', () => {
    assert.deepEqual(trimMessages(conv, 2).map((m) => m.content), ['s', 'm6', 'm7', 'm8']);
    assert.deepEqual(trimMessages(conv.slice(1), 1).map((m) => m.content), ['m8']);
  });
  it('keeps everything when cut is 0, and an empty prompt stays empty', () => {
    assert.equal(trimMessages(conv, 0).length, conv.length);
    assert.deepEqual(trimMessages([], 3), []);
  });
});

describe('prompt seeds', () => {
  it('are stable for a (run seed, task, prompt) and differ across prompts and tasks', () => {
    assert.equal(mixSeed(0, 'a', 1), mixSeed(0, 'a', 1));
    assert.notEqual(mixSeed(0, 'a', 1), mixSeed(0, 'a', 2));
    assert.notEqual(mixSeed(0, 'a', 1), mixSeed(0, 'b', 1));
    assert.notEqual(mixSeed(0, 'a', 1), mixSeed(1, 'a', 1));
  });
});

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

describe('implicit model steps', () => {
  it('fills a turn whose tokens all have its model step, and keeps explicit (continued) or absent ones', () => {
    const group = newGroup({ taskName: 't', promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} }, 1);
    const base = { agentId: null, messages: [], response: 'r', finishReason: 'stop' as const, promptIds: null, logprobs: null, seed: null, reward: 0, terminated: false, truncated: false, trainable: true, timings: { inferenceMs: 0, envMs: 0, totalMs: 0 } };
    group.rollouts[0].turns.push(
      { ...base, step: 1, responseIds: Int32Array.of(5, 6, 7), modelSteps: null, modelStep: 4 },
      { ...base, step: 2, responseIds: Int32Array.of(8, 9), modelSteps: Int32Array.of(3, 4), modelStep: 4 },
      { ...base, step: 3, responseIds: null, modelSteps: null, modelStep: 4 },
    );
    const [implicit, continued, noIds] = fillModelSteps(group).rollouts[0].turns;
    assert.deepEqual(implicit.modelSteps, Int32Array.of(4, 4, 4));
    assert.deepEqual(continued.modelSteps, Int32Array.of(3, 4));
    assert.equal(noIds.modelSteps, null);
  });
});

describe('group results carry only the turns a worker added (protocol/result-delta.ts)', () => {
  const turn = (step: number): TurnRecord => ({ step, agentId: null, messages: [], response: `r${step}`, finishReason: 'stop', promptIds: null, responseIds: null, logprobs: null, modelSteps: null, seed: null, modelStep: 0, reward: 0, terminated: false, truncated: false, trainable: true, timings: { inferenceMs: 0, envMs: 0, totalMs: 0 } });

  it('leaves out the unchanged leading turns and puts them back from the group as sent', () => {
    const sent = newGroup({ taskName: 't', promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} }, 3);
    sent.rollouts[0].turns = [turn(1), turn(2)]; // continued: turn 3 added
    sent.rollouts[1].turns = [turn(1), turn(2)]; // partial last turn popped and continued
    sent.rollouts[2].turns = [turn(1)]; // reset to its prompt, played again
    const inWorker = structuredClone(sent); // what a worker decodes
    const received = receivedTurns(inWorker);
    inWorker.rollouts[0].turns.push(turn(3));
    inWorker.rollouts[1].turns.pop();
    inWorker.rollouts[1].turns.push(turn(2));
    inWorker.rollouts[2].turns = [turn(1)];
    const kept = omitKeptTurns(inWorker, received);
    assert.deepEqual(kept, [2, 1, 0]);
    assert.deepEqual(inWorker.rollouts.map((r) => r.turns.length), [1, 1, 1]);
    const back = restoreKeptTurns(structuredClone(inWorker), sent, kept);
    assert.deepEqual(back.rollouts.map((r) => r.turns.map((t) => t.step)), [[1, 2, 3], [1, 2], [1]]);
    assert.equal(back.rollouts[0].turns[0], sent.rollouts[0].turns[0]);
  });

  it('refuses counts that do not fit the group as sent, naming the field', () => {
    const sent = newGroup({ taskName: 't', promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} }, 1);
    assert.throws(() => restoreKeptTurns(structuredClone(sent), sent, [1]), /keptTurns\[0\] must be an integer from 0 to 0/);
    assert.throws(() => restoreKeptTurns(structuredClone(sent), sent, 'x'), /keptTurns must list one count per rollout/);
  });
});

/**
 * Produce progress (src/coordinator/progress.ts ProduceProgress): per-task targets by step, the
 * consumer and producer steps, the stats window, snapshot and restore — and the tokens a producer
 * counts as produced when interrupted groups are retried.
 */
import { noFailures } from '../src/domain/failure.ts';
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ProduceProgress } from '../src/coordinator/progress.ts';
import { batchOf, pauseWith, scriptedProducer, settled } from './support/scripted-producer.ts';

describe('produce progress (coordinator/progress.ts ProduceProgress)', () => {
  const twoTasks = [
    { name: 'a', weight: 1 },
    { name: 'b', weight: 1 },
  ];

  it('starts with every count at 0 and the consumer and producer at step 1', () => {
    const p = new ProduceProgress(twoTasks, 8);
    assert.deepEqual([p.nextTrainStep, p.producerFutureStep, p.targetUptoFutureStep, p.produceMs], [1, 1, 0, 0]);
    assert.deepEqual(
      [p.consumedGroups, p.targetGroups, p.rewardSum, p.producedSamples],
      [
        { a: 0, b: 0 },
        { a: 0, b: 0 },
        { a: 0, b: 0 },
        { a: 0, b: 0 },
      ],
    );
  });

  // batch 8 over a:b = 1:1 → shares 4/4 per step; targets are cumulative: share × steps covered.
  const targetRows: { calls: number[]; want: [number, number]; upto: number; arithmetic: string }[] = [
    { calls: [1], want: [4, 4], upto: 1, arithmetic: '4×1' },
    { calls: [3], want: [12, 12], upto: 3, arithmetic: '4×3' },
    { calls: [1, 2, 3], want: [12, 12], upto: 3, arithmetic: '4 + 4 + 4' },
    { calls: [3, 2], want: [12, 12], upto: 3, arithmetic: '4×3; going back to step 2 changes nothing' },
    { calls: [3, 3], want: [12, 12], upto: 3, arithmetic: '4×3; the same step again changes nothing' },
    { calls: [3, 5], want: [20, 20], upto: 5, arithmetic: '4×3 + 4×(5−3)' },
    { calls: [0], want: [0, 0], upto: 0, arithmetic: 'step 0 is already covered' },
  ];
  for (const { calls, want, upto, arithmetic } of targetRows) {
    it(`reaches targets ${want.join('/')} after ensureTargetUpto(${calls.join('), (')}) for batch 8 over tasks 1:1 (${arithmetic})`, () => {
      const p = new ProduceProgress(twoTasks, 8);
      for (const step of calls) p.ensureTargetUpto(step);
      assert.deepEqual(p.targetGroups, { a: want[0], b: want[1] });
      assert.equal(p.targetUptoFutureStep, upto);
    });
  }

  it('accumulates uneven shares per step: batch 7 over 1:1 is 4/3 per step, so step 3 gives 12/9', () => {
    const p = new ProduceProgress(twoTasks, 7);
    assert.deepEqual(
      [...p.shares()],
      [
        ['a', 4],
        ['b', 3],
      ],
    );
    p.ensureTargetUpto(3);
    assert.deepEqual(p.targetGroups, { a: 12, b: 9 });
  });

  it('moves the consumer and pulls the producer forward only when it is behind (beginConsume / finishConsume)', () => {
    const p = new ProduceProgress(twoTasks, 8);
    p.beginConsume(3); // producer 1 < 3 → 3
    assert.deepEqual([p.nextTrainStep, p.producerFutureStep], [3, 3]);
    p.finishConsume(3); // consumer 3 + 1
    assert.deepEqual([p.nextTrainStep, p.producerFutureStep], [4, 3]);
    p.advanceFutureStep(3);
    p.advanceFutureStep(4); // producer 3 → 5
    p.beginConsume(4); // producer 5 ≥ 4 stays
    assert.deepEqual([p.nextTrainStep, p.producerFutureStep], [4, 5]);
  });

  it('advances the producer only from the step whose targets were met: a consumer that pulled it forward meanwhile is not skipped (advanceFutureStep)', () => {
    const p = new ProduceProgress(twoTasks, 8);
    p.advanceFutureStep(1); // round for step 1 met: 1 → 2
    assert.equal(p.producerFutureStep, 2);
    p.beginConsume(3); // getBatch(3) during the round for step 2: producer 2 → 3
    p.advanceFutureStep(2); // that round ends: step 3 is not produced yet, the producer stays
    assert.equal(p.producerFutureStep, 3);
    p.advanceFutureStep(2); // and again: idempotent
    assert.equal(p.producerFutureStep, 3);
    p.advanceFutureStep(3);
    assert.equal(p.producerFutureStep, 4);
  });

  it('counts consumed groups cumulatively without touching the targets (4+4 then 4+3 → 8/7)', () => {
    const p = new ProduceProgress(twoTasks, 8);
    p.ensureTargetUpto(2);
    p.markConsumed(
      new Map([
        ['a', 4],
        ['b', 4],
      ]),
    );
    p.markConsumed(
      new Map([
        ['a', 4],
        ['b', 3],
      ]),
    );
    assert.deepEqual(p.consumedGroups, { a: 8, b: 7 });
    assert.deepEqual(p.targetGroups, { a: 8, b: 8 });
  });

  it('reports the window (mean reward (3+1)/(4+4) = 0.5, null without rewards) and resets it on takeWindow', () => {
    const p = new ProduceProgress(twoTasks, 8);
    p.addRewards('a', 3, 4);
    p.addRewards('a', 1, 4);
    p.addProduced('a', 2, 100);
    p.addProduced('b', 1, 30);
    p.addProduced('a', 1, 20);
    p.addFailures('infrastructure', 2);
    p.addFailures('timeout', 1);
    p.produceMs = 250;
    p.markConsumed(new Map([['a', 2]]));
    p.ensureTargetUpto(1);
    assert.deepEqual(p.takeWindow(), {
      meanReward: { a: 0.5, b: null },
      producedSamples: { a: 3, b: 1 },
      producedTokens: { a: 120, b: 30 },
      failures: { ...noFailures(), infrastructure: 2, timeout: 1 },
      produceMs: 250,
    });
    assert.deepEqual(p.takeWindow(), {
      meanReward: { a: null, b: null },
      producedSamples: { a: 0, b: 0 },
      producedTokens: { a: 0, b: 0 },
      failures: noFailures(),
      produceMs: 0,
    });
    // cumulative counts are not window statistics
    assert.deepEqual(
      [p.consumedGroups, p.targetGroups],
      [
        { a: 2, b: 0 },
        { a: 4, b: 4 },
      ],
    );
  });

  it('takes a snapshot that later changes do not alter', () => {
    const p = new ProduceProgress(twoTasks, 8);
    p.ensureTargetUpto(2);
    const snap = p.snapshot();
    p.ensureTargetUpto(5);
    p.markConsumed(new Map([['a', 4]]));
    assert.deepEqual(
      [snap.targetGroups, snap.consumedGroups, snap.targetUptoFutureStep],
      [{ a: 8, b: 8 }, { a: 0, b: 0 }, 2],
    );
  });

  it('restores every field in place, the task maps keeping their identity (consumed/target objects are the same references)', () => {
    const p = new ProduceProgress(twoTasks, 8);
    p.ensureTargetUpto(3); // 12/12
    p.beginConsume(2);
    p.markConsumed(
      new Map([
        ['a', 4],
        ['b', 4],
      ]),
    );
    p.finishConsume(2);
    p.addRewards('b', 2, 4);
    p.addProduced('a', 5, 50);
    p.produceMs = 10;
    const snap = p.snapshot();

    const q = new ProduceProgress(twoTasks, 8);
    const consumedBefore = q.consumedGroups;
    const targetBefore = q.targetGroups;
    const rewardBefore = q.rewardSum;
    q.restore(snap);
    assert.equal(q.consumedGroups, consumedBefore);
    assert.equal(q.targetGroups, targetBefore);
    assert.equal(q.rewardSum, rewardBefore);
    assert.deepEqual(
      [
        q.nextTrainStep,
        q.producerFutureStep,
        q.targetUptoFutureStep,
        q.produceMs,
        q.consumedGroups,
        q.targetGroups,
        q.rewardSum,
        q.rewardCount,
        q.producedSamples,
        q.producedTokens,
      ],
      [3, 2, 3, 10, { a: 4, b: 4 }, { a: 12, b: 12 }, { a: 0, b: 2 }, { a: 0, b: 4 }, { a: 5, b: 0 }, { a: 50, b: 0 }],
    );
    // and the restored object keeps working from there: step 4 adds one more share of 4
    q.ensureTargetUpto(4);
    assert.deepEqual(q.targetGroups, { a: 16, b: 16 });
    assert.equal(q.targetGroups, targetBefore);
  });

  it('restores a task missing from the snapshot to 0 and ignores a task it does not have', () => {
    const p = new ProduceProgress(twoTasks, 8);
    p.markConsumed(new Map([['b', 9]]));
    const state = { ...p.snapshot(), consumedGroups: { a: 5, zzz: 1 }, targetGroups: { a: 6 } };
    p.restore(state);
    assert.deepEqual(
      [p.consumedGroups, p.targetGroups],
      [
        { a: 5, b: 0 },
        { a: 6, b: 0 },
      ],
    );
  });
});

describe('produced tokens (issue 17 item 12)', () => {
  for (const partialRollout of [true, false]) {
    it(`counts each token once in producedTokens when an interrupted group is retried${partialRollout ? ' and continued' : ' from its prompt'}: 2 + 3, then 2 = 7 (regression: kept siblings and partial turns counted again)`, async () => {
      // The pause interrupts the group: member 0 completes with 2 tokens, member 1 stops after 3.
      // The retry keeps member 0 as it is and generates 2 tokens for member 1 (continuing its 3, or
      // restarting from its prompt). Generated in all: 2 + 3 + 2 = 7.
      const s = await scriptedProducer({ strategy: 'sync', partialRollout });
      try {
        const first = s.producer.getBatch(1);
        await settled();
        await pauseWith(s, { kind: 'aborted', tokens: 3, finished: [true, false] });
        assert.equal((await first).status, 'UPDATE_WEIGHT_AND_ABORT');
        s.producer.resume(0);
        const batch = await batchOf(s, 1);
        assert.equal(batch.status, 'NORMAL');
        assert.deepEqual(batch.stats?.producedSamples, { t0: 4 }); // the group landed twice
        assert.deepEqual(batch.stats?.producedTokens, { t0: 7 });
        assert.equal(batch.stats?.responseTokens, partialRollout ? 2 + 5 : 2 + 2);
      } finally {
        await s.producer.close();
      }
    });
  }
});

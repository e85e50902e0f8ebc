/**
 * The async production strategy (src/coordinator/strategies.ts AsyncStrategy): when the model is too
 * stale, when to draw from the EXPIRED pool or make a tail batch, how much to over-sample, and what
 * one produce round schedules. Every row shows its arithmetic.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { AsyncStrategy, SyncStrategy, type ProduceContext } from '../src/coordinator/strategies.ts';

describe('async strategy decisions (coordinator/strategies.ts AsyncStrategy)', () => {
  const strategy = (staleThreshold: number, tailBatchTriggerSize = 0, overSampleThreshold = 0) =>
    new AsyncStrategy({ produceThreshold: staleThreshold, tailBatchTriggerSize, overSampleThreshold });

  const expiredRows: [threshold: number, trainStep: number, modelStep: number, want: boolean, arithmetic: string][] = [
    [2, 5, 4, false, '5−4−1 = 0 < 2'],
    [2, 5, 3, false, '5−3−1 = 1 < 2'],
    [2, 5, 2, true, '5−2−1 = 2 ≥ 2'],
    [2, 5, 0, true, '5−0−1 = 4 ≥ 2'],
    [2, 5, 6, false, '5−6−1 = −2 < 2'],
    [1, 5, 4, false, '5−4−1 = 0 < 1 (threshold (0+1)×1)'],
    [1, 5, 3, true, '5−3−1 = 1 ≥ 1'],
    [12, 20, 8, false, '20−8−1 = 11 < 12 (threshold (2+1)×4)'],
    [12, 20, 7, true, '20−7−1 = 12 ≥ 12'],
  ];
  for (const [threshold, trainStep, modelStep, want, arithmetic] of expiredRows) {
    it(`${want ? 'calls' : 'does not call'} the model expired for train step ${trainStep}, model step ${modelStep}, threshold ${threshold}: ${arithmetic}`, () => {
      assert.equal(strategy(threshold).isModelExpired(trainStep, modelStep), want);
    });
  }

  const modeRows: [trigger: number, expired: number, fromExpiredPool: boolean, tailBatch: boolean, why: string][] = [
    [-1, 0, false, false, 'expired groups are never retried'],
    [-1, 50, false, false, 'expired groups are never retried, however many'],
    [0, 0, true, false, 'draw from the EXPIRED pool (first) whenever there is one, over-sampling kept'],
    [0, 7, true, false, 'draw from the EXPIRED pool, over-sampling kept'],
    [3, 0, false, false, '0 < 3: normal mode'],
    [3, 2, false, false, '2 < 3: normal mode'],
    [3, 3, true, true, '3 ≥ 3: tail batch'],
    [3, 10, true, true, '10 ≥ 3: tail batch'],
    [1, 1, true, true, '1 ≥ 1: tail batch'],
  ];
  for (const [trigger, expired, fromExpiredPool, tailBatch, why] of modeRows) {
    it(`with tailBatchTriggerSize ${trigger} and ${expired} expired groups gives fromExpiredPool=${fromExpiredPool}, tailBatch=${tailBatch} (${why})`, () => {
      assert.deepEqual(strategy(2, trigger).mode(expired), { fromExpiredPool, tailBatch });
    });
  }

  const oversampleRows: [threshold: number, share: number, tailBatch: boolean, want: number, arithmetic: string][] = [
    [0.5, 3, false, 2, 'ceil(0.5×3) = ceil(1.5)'],
    [0.25, 8, false, 2, 'ceil(0.25×8) = ceil(2)'],
    [0.2, 7, false, 2, 'ceil(0.2×7) = ceil(1.4)'],
    [0.3, 10, false, 3, 'ceil(0.3×10) = ceil(3)'],
    [0.1, 1, false, 1, 'ceil(0.1×1) = ceil(0.1)'],
    [1, 5, false, 5, 'ceil(1×5)'],
    [0, 8, false, 0, 'ceil(0×8)'],
    [0.5, 3, true, 0, 'tail batch: no over-sampling'],
    [2, 8, true, 0, 'tail batch: no over-sampling'],
  ];
  for (const [threshold, share, tailBatch, want, arithmetic] of oversampleRows) {
    it(`over-samples ${want} for overSampleThreshold ${threshold}, share ${share}${tailBatch ? ' in tail-batch mode' : ''}: ${arithmetic}`, () => {
      assert.equal(strategy(2, 0, threshold).oversample(share, tailBatch), want);
    });
  }

  for (const [trigger, want] of [
    [-1, false],
    [0, true],
    [2, true],
  ] as const) {
    it(`${want ? 'retries' : 'drops'} expired groups with tailBatchTriggerSize ${trigger}, where a sync run drops them whatever it says (as xtuner's sync tasks)`, () => {
      assert.equal(strategy(1, trigger).expiredRetryable, want);
      assert.equal(new SyncStrategy().expiredRetryable, false);
    });
  }

  it('over-samples ceil(0.14×50) = ceil(7.000000000000001) = 8 groups as the reference does (regression: a 1e-9 tolerance gave 7)', () => {
    assert.equal(0.14 * 50, 7.000000000000001);
    assert.equal(strategy(2, 0, 0.14).oversample(50, false), 8);
  });
});

describe('async strategy produce round (coordinator/strategies.ts AsyncStrategy.produce)', () => {
  /** A context whose spawned groups all land COMPLETED at the next landed(). */
  function fakeCtx(o: {
    target: number;
    expired?: number;
    consumed?: number;
    modelStep?: number;
    producerFutureStep?: number;
  }) {
    const log: boolean[] = [];
    let inFlight = 0;
    let completed = 0;
    const ctx: ProduceContext = {
      shouldAbort: () => false,
      spawn: (_task, fromExpiredPool) => {
        log.push(fromExpiredPool);
        inFlight++;
      },
      inFlight: () => inFlight,
      completed: () => completed,
      expired: () => o.expired ?? 0,
      available: () => (o.consumed ?? 0) + completed,
      target: () => o.target,
      checkFailures: () => {},
      hasRoom: () => true,
      holding: () => false,
      landed: async () => {
        completed += inFlight;
        inFlight = 0;
      },
      servingModelStep: o.modelStep ?? 4,
      producerFutureStep: o.producerFutureStep ?? 5,
    };
    return { ctx, log };
  }

  const rows: {
    name: string;
    opts: Parameters<typeof fakeCtx>[0];
    trigger: number;
    over: number;
    share: number;
    status: string;
    spawned: number;
    fromExpired: boolean;
  }[] = [
    {
      name: 'schedules target + oversample = 8 + ceil(0.5×8) = 12 groups from fresh prompts',
      opts: { target: 8 },
      trigger: -1,
      over: 0.5,
      share: 8,
      status: 'NORMAL',
      spawned: 12,
      fromExpired: false,
    },
    {
      name: 'counts consumed groups as available: target 16, consumed 8 → 16 + ceil(0.25×8) − 8 = 10 groups',
      opts: { target: 16, consumed: 8 },
      trigger: -1,
      over: 0.25,
      share: 8,
      status: 'NORMAL',
      spawned: 10,
      fromExpired: false,
    },
    {
      name: 'in tail-batch mode (3 expired ≥ trigger 3) schedules only the target, 8, from the EXPIRED pool',
      opts: { target: 8, expired: 3 },
      trigger: 3,
      over: 0.5,
      share: 8,
      status: 'NORMAL',
      spawned: 8,
      fromExpired: true,
    },
    {
      name: 'with trigger 0 draws from the EXPIRED pool and keeps over-sampling: 8 + ceil(0.5×8) = 12',
      opts: { target: 8, expired: 1 },
      trigger: 0,
      over: 0.5,
      share: 8,
      status: 'NORMAL',
      spawned: 12,
      fromExpired: true,
    },
    {
      name: 'stops with EXPIRED_BATCH when the model is too stale: 5−2−1 = 2 ≥ threshold 2, spawning nothing',
      opts: { target: 8, modelStep: 2, producerFutureStep: 5 },
      trigger: 0,
      over: 0.5,
      share: 8,
      status: 'EXPIRED_BATCH',
      spawned: 0,
      fromExpired: false,
    },
    {
      name: 'does nothing when the target is 0',
      opts: { target: 0 },
      trigger: 0,
      over: 0.5,
      share: 8,
      status: 'NORMAL',
      spawned: 0,
      fromExpired: false,
    },
    {
      name: 'does nothing when the target is already available: consumed 8 ≥ target 8',
      opts: { target: 8, consumed: 8 },
      trigger: 0,
      over: 0.5,
      share: 8,
      status: 'NORMAL',
      spawned: 0,
      fromExpired: false,
    },
  ];
  for (const row of rows) {
    it(`${row.name}`, async () => {
      const { ctx, log } = fakeCtx(row.opts);
      const s = new AsyncStrategy({
        produceThreshold: 2,
        tailBatchTriggerSize: row.trigger,
        overSampleThreshold: row.over,
      });
      assert.equal(await s.produce(ctx, 'a', row.share), row.status);
      assert.equal(log.length, row.spawned);
      assert.ok(log.every((f) => f === row.fromExpired));
    });
  }
});

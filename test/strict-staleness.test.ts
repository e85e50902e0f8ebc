/**
 * Issue 31 item 3, strict staleness at speed: deadline admission (src/coordinator/admission.ts) and
 * how the async strategy paces with it (src/coordinator/strategies.ts). The clock is injected and
 * landings are deferreds the test resolves: nothing sleeps.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { DeadlineAdmission } from '../src/coordinator/admission.ts';
import { AsyncStrategy, type ProduceContext } from '../src/coordinator/strategies.ts';
import { resolveConfig } from '../src/config.ts';

function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

/** Lifetimes 1 000 … 10 000 ms (p90 = 9 000) and batches taken every 10 000 ms: step 3 at 0, step 4 at 10 000. */
function measured(quantile = 0.9): DeadlineAdmission {
  const a = new DeadlineAdmission(quantile);
  for (let i = 1; i <= 10; i++) a.landed(i * 1000);
  a.taken(3, 0);
  a.taken(4, 10_000);
  return a;
}

describe('deadline admission (coordinator/admission.ts)', () => {
  it('admits every group until it has seen eight landings and two batches taken', () => {
    const a = new DeadlineAdmission(0.9);
    assert.deepEqual(a.decide(1e9, 0, 4), { admit: true, slackMs: null });
    for (let i = 0; i < 7; i++) a.landed(1e9);
    a.taken(1, 0);
    a.taken(2, 10);
    assert.equal(a.decide(1e9, 0, 4).admit, true, 'seven landings are not enough to predict from');
    a.landed(1e9);
    assert.equal(a.decide(1e9, 0, 4).admit, false, 'the eighth one is');
  });

  it('predicts a lifetime as the quantile of the recent landings', () => {
    assert.equal(measured(0.9).predictedLifetimeMs(), 9000);
    assert.equal(measured(0.5).predictedLifetimeMs(), 5000);
    assert.equal(measured(1).predictedLifetimeMs(), 10_000);
  });

  it('predicts again from each new landing', () => {
    const a = measured(1);
    assert.equal(a.predictedLifetimeMs(), 10_000);
    a.landed(20_000);
    assert.equal(a.predictedLifetimeMs(), 20_000, 'the new longest lifetime, not the one predicted before it');
  });

  it('predicts the trainer takes step D at the last take plus (D − its step) mean step times', () => {
    const a = measured();
    assert.equal(a.stepMs, 10_000);
    assert.equal(a.takeTimeOf(6), 30_000, '10 000 + (6 − 4) × 10 000');
  });

  it('admits a group that lands before the trainer takes its last useful step, model step + threshold', () => {
    // modelStep 2, threshold 4: staleness at step 6 is 6 − 2 − 1 = 3 < 4, at step 7 it is 4: D = 6, taken at 30 000.
    assert.deepEqual(measured().decide(20_000, 2, 4), { admit: true, slackMs: -1000 }, '20 000 + 9 000 ≤ 30 000');
  });

  it('holds back a group predicted to land after its last useful step is taken', () => {
    assert.deepEqual(measured().decide(22_000, 2, 4), { admit: false, slackMs: 1000 }, '22 000 + 9 000 > 30 000');
  });

  it('admits the same group once newer weights move its deadline out', () => {
    assert.equal(measured().decide(22_000, 4, 4).admit, true, 'D = 8, taken at 50 000');
  });

  it('admits everything when nothing expires (an infinite threshold: stale rollouts kept)', () => {
    assert.equal(measured().decide(1e12, 0, Infinity).admit, true);
  });

  it('follows the trainer pace with a weight of a quarter per batch taken', () => {
    const a = measured();
    a.taken(5, 30_000); // 20 000 for this step: 10 000 + (20 000 − 10 000) / 4
    assert.equal(a.stepMs, 12_500);
  });

  it('keeps the last 64 lifetimes only', () => {
    const a = new DeadlineAdmission(1);
    for (let i = 0; i < 64; i++) a.landed(1_000_000);
    for (let i = 0; i < 64; i++) a.landed(5);
    assert.equal(a.predictedLifetimeMs(), 5);
  });

  it('refuses a quantile outside (0, 1]', () => {
    assert.throws(() => new DeadlineAdmission(0), RangeError);
    assert.throws(() => new DeadlineAdmission(1.5), RangeError);
  });
});

describe('the async strategy paced by deadline admission (coordinator/strategies.ts)', () => {
  /** A task whose groups land when the test resolves `landing`; the clock is the test's. */
  function harness(o: { share: number; overSample: number; admission: DeadlineAdmission | null }) {
    let inFlight = 0;
    let completed = 0;
    let modelStep = 2;
    let landing = deferred();
    let spawned = 0;
    const ctx: ProduceContext = {
      shouldAbort: () => false,
      spawn: () => {
        spawned++;
        inFlight++;
      },
      inFlight: () => inFlight,
      completed: () => completed,
      expired: () => 0,
      available: () => completed,
      target: () => o.share,
      checkFailures: () => {},
      hasRoom: () => true,
      holding: () => false,
      landed: () => landing.promise,
      get servingModelStep() {
        return modelStep;
      },
      producerFutureStep: 3,
    };
    const clock = { now: 22_000 };
    const strategy = new AsyncStrategy({
      produceThreshold: 4,
      tailBatchTriggerSize: 0,
      overSampleThreshold: o.overSample,
      admission: o.admission,
      now: () => clock.now,
    });
    return {
      strategy,
      ctx,
      clock,
      spawned: () => spawned,
      setModelStep: (m: number) => (modelStep = m),
      /** `n` groups in flight land COMPLETED and the strategy is woken. */
      land: async (n: number) => {
        inFlight -= n;
        completed += n;
        const l = landing;
        landing = deferred();
        l.resolve();
        await Promise.resolve();
      },
    };
  }

  it('starts the batch and every over-sampled group at once without admission', () => {
    const h = harness({ share: 4, overSample: 1, admission: null });
    void h.strategy.produce(h.ctx, 't', 4);
    assert.equal(h.spawned(), 8, '4 + ceil(1 × 4)');
  });

  it('always starts what the next batch needs, and holds back the over-sampled groups that would pass the bound', () => {
    const h = harness({ share: 4, overSample: 1, admission: measured() });
    void h.strategy.produce(h.ctx, 't', 4);
    assert.equal(h.spawned(), 4, 'the share, though 22 000 + 9 000 > 30 000 holds the rest');
    assert.equal(h.strategy.held, 1);
    assert.deepEqual(h.strategy.admissionStats(), {
      quantile: 0.9,
      held: 1,
      predictedLifetimeMs: 9000,
      stepMs: 10_000,
    });
  });

  it('reports no admission figures without deadline admission', () => {
    assert.equal(harness({ share: 4, overSample: 1, admission: null }).strategy.admissionStats(), null);
  });

  it('starts the held groups once newer weights move their deadline out, at the next landing', async () => {
    const h = harness({ share: 4, overSample: 1, admission: measured() });
    const round = h.strategy.produce(h.ctx, 't', 4);
    assert.equal(h.spawned(), 4);
    h.setModelStep(4); // resumed with newer weights: the deadline step moves from 6 to 8, taken at 50 000
    await h.land(2);
    await new Promise<void>((resolve) => setImmediate(resolve));
    assert.equal(h.spawned(), 8, 'completed 2 + in flight 2 + 4 admitted = the 8 scheduled');
    await h.land(6);
    assert.equal(await round, 'NORMAL');
  });

  it('keeps holding at the next landing while the weights are the same and the deadline is no nearer to fitting', async () => {
    const h = harness({ share: 4, overSample: 1, admission: measured() });
    const round = h.strategy.produce(h.ctx, 't', 4);
    await h.land(2);
    await new Promise<void>((resolve) => setImmediate(resolve));
    assert.equal(h.spawned(), 4, 'completed 2 + in flight 2 already make the share: nothing more starts');
    assert.equal(h.strategy.held, 2);
    await h.land(2);
    assert.equal(await round, 'NORMAL');
  });
});

describe('producer.admission in the config (config.ts)', () => {
  it('defaults to eager with a quantile of 0.9', () => {
    const p = resolveConfig({}).producer;
    assert.equal(p.admission, 'eager');
    assert.equal(p.admissionQuantile, 0.9);
  });

  it('refuses deadline admission with sync production, naming producer.admission', () => {
    assert.throws(
      () => resolveConfig({ producer: { strategy: 'sync', admission: 'deadline' } }),
      (err: Error) => /producer\.admission/.test(err.message) && /async/.test(err.message),
    );
  });

  it('refuses an admission quantile of 0, naming producer.admissionQuantile', () => {
    assert.throws(
      () => resolveConfig({ producer: { strategy: 'async', admission: 'deadline', admissionQuantile: 0 } }),
      (err: Error) => /producer\.admissionQuantile/.test(err.message),
    );
  });
});

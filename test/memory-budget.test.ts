import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { createEngine, type Engine, type EngineStats } from '../src/index.ts';
import { deferred, within, type Deferred } from './support/waits.ts';
import { scriptedProducer, settled } from './support/scripted-producer.ts';

describe('memory budget', () => {
  const engines: Engine[] = [];
  after(() => Promise.all(engines.map((e) => e.close())));

  it('stops scheduling when the buffer and work in flight reach the budget, and goes on once the trainer takes', async () => {
    const budget = 400_000;
    // Landings are the events to wait on: production stops at a landing after which nothing is in
    // flight, and goes on when a later group lands. The observer runs inside the landing, before the
    // group is stored and before the producer reacts (schedules more if it has room), so the check
    // looks after a macrotask turn and a round trip through the workers; one check at a time, so
    // checks do not crowd the worker (a landing during a check asks for one more).
    let waiting: { stopped: Deferred<EngineStats> } | { landed: Deferred<void> } | null = null;
    let checking = false;
    let checkAgain = false;
    const onLanded = (): void => {
      const w = waiting;
      if (w === null) return;
      if ('landed' in w) {
        w.landed.resolve();
        return;
      }
      if (checking) return void (checkAgain = true);
      checking = true;
      setImmediate(async () => {
        try {
          await engine.stats();
          const s = await engine.stats();
          if (s.groups.inFlight === 0) w.stopped.resolve(s);
        } catch (err) {
          w.stopped.reject(err);
        }
        checking = false;
        if (checkAgain) (checkAgain = false), onLanded();
      });
    };
    const engine = createEngine(
      {
        logLevel: 'silent',
        batchSize: 4,
        workers: { threads: 1 },
        tasks: [{ name: 'math', env: { module: 'builtin:arithmetic' }, groupSize: 4, maxSteps: 1 }],
        producer: { strategy: 'async', maxStaleness: 1_000_000, overSampleThreshold: 1, memoryBudgetBytes: budget },
      },
      { observer: { landed: onLanded } },
    );
    engines.push(engine);
    await engine.start();
    assert.equal((await engine.getBatch(1)).status, 'NORMAL');
    // Nobody takes for a while: the producer runs ahead until the budget stops it.
    const stopped = deferred<EngineStats>();
    waiting = { stopped };
    onLanded(); // it may have stopped already
    await within(20_000, 'production stopping at the budget', stopped.promise);
    const full = await engine.stats();
    assert.equal(full.groups.inFlight, 0, 'production stopped');
    assert.ok(full.buffer.bytes <= budget, `buffer holds ${full.buffer.bytes} bytes, over the ${budget}-byte budget`);
    assert.ok(full.buffer.bytes > budget / 2, 'it filled most of the budget before stopping');
    assert.equal(
      full.groups.dropped.FAILED + full.groups.dropped.FILTERED + full.groups.dropped.EXPIRED,
      0,
      'nothing was dropped to make room',
    );
    // The trainer takes: room again, production goes on. Nothing was in flight at `full`, so a group
    // landing now was scheduled after it.
    const landed = deferred();
    waiting = { landed };
    assert.equal((await engine.getBatch(2)).status, 'NORMAL');
    await within(20_000, 'a group landing after the trainer took', landed.promise);
    assert.ok((await engine.stats()).groups.scheduled > full.groups.scheduled);
  });

  it('names the budget when it cannot hold even one batch', async () => {
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 8,
      workers: { threads: 1 },
      tasks: [{ name: 'math', env: { module: 'builtin:arithmetic' }, groupSize: 4, maxSteps: 1 }],
      producer: { strategy: 'sync', memoryBudgetBytes: 20_000 },
    });
    engines.push(engine);
    await engine.start();
    await assert.rejects(engine.getBatch(1), {
      code: 'ERR_PRODUCTION_STALLED',
      message: /producer\.memoryBudgetBytes \(20000\) cannot hold one batch/,
    });
  });
});

describe('memory budget full with nothing in flight (issue 28 item 4: SIGTERM always honoured)', () => {
  it('waits for the trainer instead of running empty steps ahead on the main thread (regression: maxStaleness 100000 ran 100000 steps of microtasks, no signal heard)', async () => {
    // A 4096-byte budget holds one group in flight (counted at 4096 bytes until one lands) and, once
    // it has landed and is stored, no room for another. Step 1's target is met by that group; step
    // 2's cannot be, and nothing is in flight to land: the loop must park until the trainer takes.
    const s = await scriptedProducer({ strategy: 'async', memoryBudgetBytes: 4096, maxStaleness: 100_000 });
    try {
      await settled();
      assert.equal(s.pool.heldCount, 1);
      s.pool.settle(s.pool.heldIds()[0], { kind: 'completed' });
      await settled();
      assert.equal(s.pool.heldCount, 0);
      assert.equal(s.producer.hasRoom(), false);
      assert.equal(s.producer.producerFutureStep, 2, 'targets of step 2 set, and no step past it');
      assert.equal(s.producer.progress.targetUptoFutureStep, 2);
      // The trainer takes step 1: room again, and step 2's group is sent; once it lands, step 3 waits
      // for the trainer as step 2 did.
      assert.equal((await s.producer.getBatch(1)).status, 'NORMAL');
      await settled();
      assert.equal(s.pool.heldCount, 1);
      s.pool.settle(s.pool.heldIds()[0], { kind: 'completed' });
      await settled();
      assert.deepEqual([s.pool.heldCount, s.producer.producerFutureStep, s.producer.completed('t0')], [0, 3, 1]);
    } finally {
      await s.producer.close();
    }
  });
});

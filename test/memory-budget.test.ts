import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, describe, it } from 'node:test';
import { createEngine, type Engine } from '../src/index.ts';

describe('memory budget', () => {
  const engines: Engine[] = [];
  after(() => Promise.all(engines.map((e) => e.close())));

  it('stops scheduling when the buffer and work in flight reach the budget, and goes on once the trainer takes', async () => {
    const budget = 400_000;
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 4,
      workers: { threads: 1 },
      tasks: [{ name: 'math', env: { module: 'builtin:arithmetic' }, groupSize: 4, maxSteps: 1 }],
      producer: { strategy: 'async', maxStaleness: 1_000_000, overSampleThreshold: 1, memoryBudgetBytes: budget },
    });
    engines.push(engine);
    await engine.start();
    assert.equal((await engine.getBatch(1)).status, 'NORMAL');
    // Nobody takes for a while: the producer runs ahead until the budget stops it.
    let scheduled = -1;
    for (let i = 0; i < 40; i++) {
      await sleep(50);
      const s = await engine.stats();
      if (s.groups.scheduled === scheduled && s.groups.inFlight === 0) break;
      scheduled = s.groups.scheduled;
    }
    const full = await engine.stats();
    assert.equal(full.groups.inFlight, 0, 'production stopped');
    assert.ok(full.buffer.bytes <= budget, `buffer holds ${full.buffer.bytes} bytes, over the ${budget}-byte budget`);
    assert.ok(full.buffer.bytes > budget / 2, 'it filled most of the budget before stopping');
    assert.equal(full.groups.dropped.FAILED + full.groups.dropped.FILTERED + full.groups.dropped.EXPIRED, 0, 'nothing was dropped to make room');
    // The trainer takes: room again, production goes on.
    assert.equal((await engine.getBatch(2)).status, 'NORMAL');
    await sleep(200);
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
    await assert.rejects(engine.getBatch(1), { code: 'ERR_PRODUCTION_STALLED', message: /producer\.memoryBudgetBytes \(20000\) cannot hold one batch/ });
  });
});

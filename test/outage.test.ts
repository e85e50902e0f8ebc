/**
 * Inference outages (coordinator/outage.ts): the monitor's verdicts with a scripted probe and clock,
 * then the engine against a proxy that takes the inference server away and brings it back.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createEngine, Status, type EngineStats } from '../src/index.ts';
import { resolveConfig } from '../src/config.ts';
import type { ConfigError } from '../src/errors.ts';
import { createLogger } from '../src/log.ts';
import { OUTAGE_CODE } from '../src/llm/errors.ts';
import { OutageMonitor } from '../src/coordinator/outage.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/server.ts';
import type { RolloutGroup } from '../src/domain/rollout.ts';
import { OutageProxy } from './fixtures/outage-proxy.ts';

const silent = createLogger('silent');

function deferred<T = void>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** A group of two whose first member's call met a possible outage (as worker/agent-loop.ts returns it). */
function outageGroup(): RolloutGroup {
  const member = (status: string, error: string | null) => ({ status, error }) as RolloutGroup['rollouts'][number];
  return {
    id: 'g',
    status: Status.ABORTED,
    error: null,
    rollouts: [
      member(
        Status.ABORTED,
        `${OUTAGE_CODE}: ERR_LLM_UNREACHABLE: inference server http://x unreachable: ECONNREFUSED`,
      ),
      member(Status.COMPLETED, null),
    ],
  } as unknown as RolloutGroup;
}

/** A monitor whose probes and waits the test answers one by one, on a clock it sets. */
function scripted(budgetMs = 60_000) {
  const probes: { url: string; answer: (up: boolean) => void }[] = [];
  const waits: { ms: number; done: () => void }[] = [];
  const probed = deferredQueue();
  const waited = deferredQueue();
  let clock = 0;
  const monitor = new OutageMonitor({
    endpoints: ['http://a', 'http://b'],
    budgetMs,
    log: silent,
    now: () => clock,
    probe: (url) => {
      const d = deferred<boolean>();
      probes.push({ url, answer: d.resolve });
      probed.tick();
      return d.promise;
    },
    wait: (ms) => {
      const d = deferred();
      waits.push({ ms, done: d.resolve });
      waited.tick();
      return d.promise;
    },
  });
  /** Answer the next round of probes (one per endpoint). */
  async function round(answers: [boolean, boolean]): Promise<void> {
    while (probes.length < 2) await probed.next();
    for (const [i, p] of probes.splice(0, 2).entries()) p.answer(answers[i]);
  }
  async function nextWait(): Promise<{ ms: number; done: () => void }> {
    while (waits.length === 0) await waited.next();
    return waits.shift()!;
  }
  return { monitor, round, nextWait, setClock: (ms: number) => void (clock = ms) };
}

/** Wakes whoever waits for the next event (a probe or a wait begun). */
function deferredQueue() {
  let d = deferred();
  return {
    next: () => d.promise,
    tick: () => {
      const done = d;
      d = deferred();
      done.resolve();
    },
  };
}

describe('outage monitor (coordinator/outage.ts)', () => {
  it("fails a group whose call failed while an endpoint answers, with the call's own reason", async () => {
    const { monitor, round } = scripted();
    const group = outageGroup();
    const settled = monitor.arrived(group, 0);
    assert.notEqual(settled, null, 'a group that met a possible outage waits for the verdict');
    assert.equal(monitor.holding, true, 'dispatches wait while the servers are asked');
    await round([false, true]);
    await settled;
    assert.equal(group.status, Status.FAILED);
    assert.equal(group.rollouts[0].error, 'ERR_LLM_UNREACHABLE: inference server http://x unreachable: ECONNREFUSED');
    assert.equal(group.rollouts[1].status, Status.COMPLETED);
    assert.equal(monitor.holding, false);
    assert.deepEqual(
      { ...monitor.stats(), currentMs: null },
      { state: 'up', currentMs: null, outages: 0, totalMs: 0, groupsAborted: 0, budgetMs: 60_000 },
    );
    await monitor.close();
  });

  it('lands at once a group that fails on its own, its member that met a possible outage reading as its own error', () => {
    const { monitor } = scripted();
    const group = outageGroup();
    group.rollouts[1].status = Status.FAILED;
    group.rollouts[1].error = 'ERR_LLM_BAD_REPLY: inference reply is not JSON';
    assert.equal(monitor.arrived(group, 0), null);
    assert.equal(monitor.holding, false, 'no probe: the group fails whole whatever the servers say');
    assert.equal(group.rollouts[0].error, 'ERR_LLM_UNREACHABLE: inference server http://x unreachable: ECONNREFUSED');
  });

  it('aborts the groups that meet an outage, holds dispatches, probes with growing backoff and ends it at the first answer', async () => {
    const { monitor, round, nextWait, setClock } = scripted();
    const first = outageGroup();
    const settled = monitor.arrived(first, 0);
    await round([false, false]);
    await settled;
    assert.equal(first.status, Status.ABORTED, 'it lands ABORTED, to be retried');
    assert.equal(monitor.stats().state, 'down');
    assert.equal(monitor.holding, true);
    // Another group meeting the same outage lands at once, without a probe of its own.
    const second = outageGroup();
    await monitor.arrived(second, 5);
    assert.equal(second.status, Status.ABORTED);
    const backoffs: number[] = [];
    for (let i = 0; i < 6; i++) {
      const wait = await nextWait();
      backoffs.push(wait.ms);
      wait.done();
      await round([false, false]);
    }
    assert.deepEqual(backoffs, [500, 1_000, 2_000, 4_000, 8_000, 10_000]);
    setClock(30_000);
    (await nextWait()).done();
    await round([true, false]);
    while (monitor.holding) await new Promise((r) => setImmediate(r));
    assert.deepEqual(monitor.stats(), {
      state: 'up',
      currentMs: null,
      outages: 1,
      totalMs: 30_000,
      groupsAborted: 2,
      budgetMs: 60_000,
    });
    // A group dispatched before the end met the outage: retried, whatever the servers say now.
    const late = outageGroup();
    await monitor.arrived(late, 29_000);
    assert.equal(late.status, Status.ABORTED);
    await monitor.close();
  });

  it('fails the groups of an outage past llm.outageBudgetMs and reports it once, then gives a fresh budget', async () => {
    const { monitor, round, nextWait, setClock } = scripted(1_000);
    const settled = monitor.arrived(outageGroup(), 0);
    await round([false, false]);
    await settled;
    const wait = await nextWait();
    assert.equal(wait.ms, 500);
    setClock(1_000);
    wait.done();
    await round([false, false]);
    while (monitor.spentError === null) await new Promise((r) => setImmediate(r));
    assert.equal(monitor.spentError.code, OUTAGE_CODE);
    assert.match(
      monitor.spentError.message,
      /no inference endpoint has answered for 1 s, more than llm\.outageBudgetMs = 1000 allows; last error: ERR_LLM_UNREACHABLE/,
    );
    const late = outageGroup();
    await monitor.arrived(late, 900);
    assert.equal(late.status, Status.FAILED);
    assert.match(late.rollouts[0].error!, /^ERR_LLM_OUTAGE: .*llm\.outageBudgetMs = 1000/);
    monitor.renewBudget();
    assert.equal(monitor.spentError, null);
    const again = outageGroup();
    await monitor.arrived(again, 1_000);
    assert.equal(again.status, Status.ABORTED, 'a fresh budget: groups are retried again');
    await monitor.close();
  });
});

describe('llm.outageBudgetMs', () => {
  it('is 5 minutes by default and refuses a negative value naming it', () => {
    assert.equal(resolveConfig({}).llm.outageBudgetMs, 300_000);
    assert.throws(
      () => resolveConfig({ llm: { outageBudgetMs: -1 } }),
      (err: ConfigError) => err.issues.some((i) => i.startsWith('llm.outageBudgetMs:') && i.includes('(got -1)')),
    );
  });
});

/** scheduled = in flight + stored in the buffer + taken + dropped (FAILED + FILTERED + EXPIRED). */
function assertAccounted(stats: EngineStats, when: string): void {
  const { scheduled, inFlight, taken, dropped } = stats.groups;
  const stored = stats.buffer.completed + stats.buffer.aborted + stats.buffer.expired;
  assert.equal(
    scheduled,
    inFlight + stored + taken + dropped.FAILED + dropped.FILTERED + dropped.EXPIRED,
    `${when}: ${JSON.stringify(stats.groups)} stored ${stored}`,
  );
}

describe('the engine through an inference outage', { timeout: 60_000 }, () => {
  let mock: MockLlm;
  let proxy: OutageProxy;
  before(async () => {
    mock = await startMockLlm({ port: 0, seed: 3, latencyMs: 2 });
    proxy = await OutageProxy.start(mock.url);
  });
  after(async () => {
    await proxy?.close();
    await mock?.close();
  });

  const engineConfig = (strategy: 'sync' | 'async', outageBudgetMs?: number) => ({
    logLevel: 'silent' as const,
    seed: 1,
    batchSize: 4,
    llm: {
      url: proxy.url,
      retries: 1,
      retryBackoffMs: 5,
      timeoutMs: 5_000,
      ...(outageBudgetMs !== undefined ? { outageBudgetMs } : {}),
    },
    workers: { threads: 1, groupsPerWorker: 8 },
    // One failed group tolerated: before, a 1.5 s outage failed every group in flight.
    producer: { strategy, maxFailedGroupsPerStep: 1, ...(strategy === 'async' ? { maxStaleness: 8 } : {}) },
    tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 2, maxSteps: 4, maxTokens: 16 }],
  });

  for (const [strategy, mode] of [
    ['sync', 'refuse'],
    ['async', '503'],
  ] as const) {
    it(`an inference outage of 1.5 s (${mode === 'refuse' ? 'connections refused' : 'every request answered 503'}, ${strategy} production) does not fail the run with ERR_TOO_MANY_FAILED_GROUPS`, async () => {
      proxy.chats = 0;
      const outageOver = deferred();
      // The outage begins at the 20th chat call, mid-batch, and lasts 1.5 s.
      proxy.onChat = (n) => {
        if (n !== 20) return;
        proxy.onChat = null;
        void proxy.down(mode).then(() => setTimeout(() => void proxy.up().then(outageOver.resolve), 1_500));
      };
      const engine = createEngine(engineConfig(strategy));
      try {
        await engine.start();
        for (let step = 1; step <= 4; step++) {
          const batch = await engine.getBatch(step);
          assert.equal(batch.status, 'NORMAL');
          assert.equal(batch.groups.length, 4);
          if (step === 2) await outageOver.promise; // the outage falls inside the first two steps
        }
        const stats = await engine.stats();
        assertAccounted(stats, 'after 4 steps');
        assert.equal(stats.groups.dropped.FAILED, 0, `no group failed: ${stats.buffer.lastDropReason}`);
        assert.equal(stats.outage.outages, 1);
        assert.ok(stats.outage.groupsAborted > 0, 'groups met the outage and were retried');
        assert.ok(stats.outage.totalMs >= 1_000, `the outage lasted ${stats.outage.totalMs} ms`);
        assert.equal(stats.outage.state, 'up');
        const metrics = await engine.metrics();
        assert.match(metrics, /rollout_engine_inference_outages_total 1/);
        assert.match(metrics, /rollout_engine_groups_outage_aborted_total [1-9]/);
      } finally {
        proxy.onChat = null;
        await proxy.up();
        await engine.close();
      }
    });
  }

  it('with one of two endpoints down, calls fail over to the other: no group fails and no outage is declared', async () => {
    const other = await OutageProxy.start(mock.url);
    const engine = createEngine({
      ...engineConfig('sync'),
      llm: { url: [proxy.url, other.url], retries: 0, retryBackoffMs: 1 },
    });
    try {
      await engine.start(); // both answer the start-up probe
      await other.down('refuse');
      for (let step = 1; step <= 3; step++) assert.equal((await engine.getBatch(step)).status, 'NORMAL');
      const stats = await engine.stats();
      assert.equal(stats.groups.dropped.FAILED, 0, `${stats.buffer.lastDropReason}`);
      assert.equal(stats.groups.landed.ABORTED, 0);
      assert.equal(stats.outage.outages, 0);
      assert.ok(proxy.forwarded > 0);
    } finally {
      await engine.close();
      await other.close();
    }
  });

  it('an outage longer than llm.outageBudgetMs makes getBatch reject with ERR_LLM_OUTAGE naming the option, and no group is lost', async () => {
    const engine = createEngine(engineConfig('async', 1_000));
    try {
      await engine.start();
      await proxy.down('503');
      await assert.rejects(engine.getBatch(1), (err: Error & { code?: string }) => {
        assert.equal(err.code, 'ERR_LLM_OUTAGE');
        assert.match(err.message, /llm\.outageBudgetMs = 1000/);
        return true;
      });
      assertAccounted(await engine.stats(), 'after the budget was spent');
      // Reported once: with the servers back, the same engine produces again.
      await proxy.up();
      const batch = await engine.getBatch(1);
      assert.equal(batch.status, 'NORMAL');
      assertAccounted(await engine.stats(), 'after the servers came back');
    } finally {
      await proxy.up();
      await engine.close();
    }
  });
});

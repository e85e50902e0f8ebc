import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { threadId } from 'node:worker_threads';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { createEngine, Status, type Engine, type EngineConfigInput, type RolloutGroup } from '../src/index.ts';
import { DIE_EXIT_CODE } from './fixtures/dying-env.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/server.ts';
import { assertSettled } from './support/accounting.ts';
import { chatCompletion, scriptedServer } from './support/http.ts';

const FAULTY_ENV = new URL('./fixtures/faulty-env.ts', import.meta.url).pathname;
const DYING_ENV = new URL('./fixtures/dying-env.ts', import.meta.url).pathname;
const HANGING_HOOKS = new URL('./fixtures/hanging-hooks.ts', import.meta.url).pathname;

function datasetOfLines(lines: object[]): string {
  const dir = mkdtempSync(join(tmpdir(), 'rollout-engine-'));
  const path = join(dir, 'prompts.jsonl');
  writeFileSync(path, lines.map((line) => JSON.stringify(line)).join('\n'));
  return path;
}

function datasetOf(modes: string[]): string {
  return datasetOfLines(modes.map((mode) => ({ mode })));
}

type TaskInput = NonNullable<EngineConfigInput['tasks']>[number];

/**
 * The task "faulty" on test/fixtures/faulty-env.ts, whose dataset lines say how each episode
 * misbehaves: one rollout a group and two steps unless `overrides` says otherwise.
 */
function faultyTask(
  dataset: string,
  { env, ...overrides }: Omit<Partial<TaskInput>, 'env'> & { env?: object } = {},
): TaskInput {
  return { name: 'faulty', env: { module: FAULTY_ENV, ...env }, dataset, groupSize: 1, maxSteps: 2, ...overrides };
}

describe('engine against the mock inference server, in real worker threads', () => {
  let mock: MockLlm;
  const engines: Engine[] = [];
  before(async () => {
    mock = await startMockLlm({ port: 0, seed: 1 });
  });
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    await mock.close();
  });
  function engine(config: Parameters<typeof createEngine>[0]): Engine {
    const e = createEngine({ logLevel: 'silent', ...config, llm: { url: mock.url, ...config?.llm } });
    engines.push(e);
    return e;
  }

  it('runs multi-turn guess-number episodes in a worker thread and records every turn with tokens', async () => {
    const e = engine({
      batchSize: 2,
      workers: { threads: 1 },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 3, maxSteps: 10 }],
    });
    await e.start();
    const batch = await e.getBatch();
    assert.equal(batch.trainStep, 1);
    assert.equal(batch.groups.length, 2);
    const rollouts = batch.groups.flatMap((g) => g.rollouts);
    assert.equal(rollouts.length, 6);
    assert.ok(
      rollouts.some((r) => r.turns.length > 1),
      'guess-number should take several turns',
    );
    for (const r of rollouts) {
      assert.equal(r.status, Status.COMPLETED);
      assert.notEqual(r.workerId, threadId, 'episodes run off the main thread');
      assert.ok(r.timings.totalMs >= r.timings.inferenceMs);
      for (const turn of r.turns) {
        assert.ok(turn.responseIds instanceof Int32Array && turn.responseIds.length > 0);
        assert.ok(turn.logprobs instanceof Float32Array && turn.logprobs.length === turn.responseIds.length);
        assert.ok(turn.modelSteps instanceof Int32Array && turn.modelSteps.length === turn.responseIds.length);
        assert.ok(turn.promptIds instanceof Int32Array && turn.promptIds.length > 0);
        assert.equal(turn.messages[0].role, 'system');
      }
      const last = r.turns.at(-1)!;
      assert.ok(last.terminated || last.truncated || r.truncated);
    }
    // the k members of a group share their prompt but play it differently
    const group = batch.groups[0];
    assert.equal(new Set(group.rollouts.map((r) => r.turns[0].messages[1].content)).size, 1);
  });

  it('keeps producing when episodes throw, reply badly, or kill their worker — each failure is a FAILED group with its reason', async () => {
    const modes = ['ok', 'throw', 'ok', 'exit', 'ok', 'bad-reply', 'ok', 'uncaught', ...Array(16).fill('ok')];
    const e = engine({
      batchSize: 6,
      workers: { threads: 2, groupsPerWorker: 2 },
      producer: { maxFailedGroupsPerStep: 20 },
      tasks: [faultyTask(datasetOf(modes), { env: { export: 'createEnv' }, groupSize: 2 })],
    });
    await e.start();
    const first = await e.getBatch();
    const second = await e.getBatch();
    for (const batch of [first, second]) {
      assert.equal(batch.groups.length, 6);
      assert.ok(batch.groups.every((g) => g.status === Status.COMPLETED));
    }
    const stats = await e.stats();
    assertSettled(stats);
    assert.ok(
      stats.groups.dropped.FAILED >= 4,
      `expected the four faulty prompts to fail, got ${JSON.stringify(stats.groups.dropped)}`,
    );
    assert.equal(stats.buffer.dropped.FAILED, stats.groups.dropped.FAILED);
  });

  it('reports why a group failed: the environment error, a bad reply field, or the worker exit code', async () => {
    const e = engine({
      batchSize: 1,
      workers: { threads: 1, groupsPerWorker: 1 },
      producer: { maxFailedGroupsPerStep: 1 },
      tasks: [faultyTask(datasetOf(['throw', 'exit', 'bad-reply']), { maxSteps: 1 })],
    });
    await e.start();
    await assert.rejects(e.getBatch(), (err: Error & { code?: string }) => {
      assert.equal(err.code, 'ERR_TOO_MANY_FAILED_GROUPS');
      assert.match(err.message, /2 groups failed/);
      assert.match(err.message, /worker exited with code: 3|exited with code 3/);
      return true;
    });
    assertSettled(await e.stats());
  });

  it('switches a task off with weight 0, as the reference producer does (regression: weight 0 was refused)', async () => {
    const e = engine({
      batchSize: 3,
      workers: { threads: 1 },
      tasks: [
        { name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 2, maxSteps: 4, weight: 0 },
        { name: 'arith', env: { module: 'builtin:arithmetic' }, groupSize: 2, maxSteps: 1, weight: 1 },
      ],
    });
    await e.start();
    for (const step of [1, 2]) {
      const batch = await e.getBatch(step);
      assert.equal(batch.groups.length, 3);
      assert.ok(
        batch.groups.every((g) => g.taskName === 'arith'),
        'no group of the switched-off task',
      );
    }
    assertSettled(await e.stats());
    assert.throws(
      () => createEngine({ tasks: [{ name: 'a', env: { module: 'builtin:arithmetic' }, weight: 0 }] }),
      /tasks\[0\]\.weight: every task has weight 0/,
    );
  });

  it('fails start() with a clear error, and no hang, when the inference server is unreachable', async () => {
    const e = createEngine({ logLevel: 'silent', llm: { url: 'http://127.0.0.1:9/v1' }, workers: { threads: 1 } });
    await assert.rejects(e.start(), {
      code: 'ERR_LLM_UNREACHABLE',
      message: /http:\/\/127\.0\.0\.1:9\/v1\/models unreachable: ECONNREFUSED/,
    });
    await e.close();
  });

  it('waits for a server gone mid-run, then fails the batch with ERR_LLM_OUTAGE once llm.outageBudgetMs is spent', async () => {
    const doomed = await startMockLlm({ port: 0 });
    const e = engine({
      batchSize: 2,
      llm: { url: doomed.url, retries: 1, retryBackoffMs: 1, outageBudgetMs: 500 },
      workers: { threads: 1 },
      producer: { maxFailedGroupsPerStep: 2 },
    });
    await e.start();
    await doomed.close();
    await assert.rejects(e.getBatch(), {
      code: 'ERR_LLM_OUTAGE',
      message: /llm\.outageBudgetMs = 500 allows; last error: ERR_LLM_UNREACHABLE/,
    });
    const stats = await e.stats();
    assertSettled(stats);
    assert.equal(stats.groups.dropped.FAILED, 0, 'the groups that met the outage wait in the buffer, ABORTED');
  });
});

describe('the worker watchdog', () => {
  it('terminates a worker whose environment spins, fails its group with the reason, and keeps producing', async () => {
    const mock = await startMockLlm({ port: 0 });
    const e = createEngine({
      logLevel: 'silent',
      llm: { url: mock.url },
      batchSize: 2,
      // Long enough that a healthy worker on a busy machine is never taken for a spinning one.
      workers: { threads: 1, groupsPerWorker: 1, watchdogMs: 2_000 },
      producer: { maxFailedGroupsPerStep: 5 },
      tasks: [faultyTask(datasetOf(['ok', 'spin', 'ok', 'ok', 'ok', 'ok']))],
    });
    try {
      await e.start();
      const batch = await e.getBatch();
      assert.equal(batch.status, 'NORMAL');
      const stats = await e.stats();
      assert.equal(stats.groups.dropped.FAILED, 1);
      assert.match(
        stats.buffer.lastDropReason ?? '',
        /did not answer for 2000 ms \(workers\.watchdogMs\) and was terminated by the watchdog/,
      );
      assertSettled(stats);
    } finally {
      await e.close();
      await mock.close();
    }
  });
});

describe('sampling seeds across dataset epochs', () => {
  it('samples a prompt drawn again in a later epoch with a new seed, keeping its environment seed (regression: every epoch resent the same sampling seeds)', async (t) => {
    const seeds: number[] = [];
    const server = await scriptedServer((req, res, body) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      if (req.method === 'GET') return void res.end('{"data":[{"id":"m"}]}');
      seeds.push((JSON.parse(body) as { seed: number }).seed);
      res.end(chatCompletion('4'));
    });
    t.after(() => server.close());
    const e = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      workers: { threads: 1 },
      llm: { url: server.url, model: 'm', returnTokenIds: false, logprobs: false },
      tasks: [
        {
          name: 'one',
          env: { module: 'builtin:arithmetic' },
          dataset: datasetOfLines([{ expression: '2 + 3' }]),
          groupSize: 1,
          maxSteps: 1,
        },
      ],
    });
    t.after(() => e.close());
    await e.start();
    const batch = await e.getBatch();
    const [first, second] = batch.groups.map((g) => g.sample);
    assert.equal(first.promptIndex, second.promptIndex, 'the one dataset line, drawn twice');
    assert.equal(first.seed, second.seed, 'the same task for the environment');
    assert.equal(seeds.length, 2);
    assert.notEqual(seeds[0], seeds[1], 'sampled anew');
  });
});

describe('environment calls that never settle (tasks[].env.timeoutMs)', () => {
  let mock: MockLlm;
  before(async () => {
    mock = await startMockLlm({ port: 0, seed: 1 });
  });
  after(async () => {
    await mock.close();
  });

  it('a hung step() fails only its rollout and production goes on, its actor slot freed', async () => {
    const dropped: RolloutGroup[] = [];
    const e = createEngine(
      {
        logLevel: 'silent',
        llm: { url: mock.url },
        batchSize: 2,
        workers: { threads: 1, groupsPerWorker: 2 },
        producer: { maxFailedGroupsPerStep: 5 },
        // One actor per worker: the batch completes only if the hung actor's slot is given back.
        tasks: [faultyTask(datasetOf(['hang', 'ok', 'ok', 'ok']), { env: { timeoutMs: 1_000, poolSize: 1 } })],
      },
      { observer: { dropped: (group) => void dropped.push(group) } },
    );
    try {
      await e.start();
      const batch = await e.getBatch();
      assert.equal(batch.status, 'NORMAL');
      assert.equal(batch.groups.length, 2);
      const stats = await e.stats();
      assertSettled(stats);
      assert.equal(stats.groups.dropped.FAILED, 1);
      assert.match(
        dropped[0].rollouts[0].error ?? '',
        /^ERR_ENV_TIMEOUT: task "faulty": environment step\(\) did not settle within 1000 ms \(tasks\[\]\.env\.timeoutMs\)/,
      );
    } finally {
      await e.close();
    }
  });

  it('a hook that never settles is given up on after the timeout and the episode goes on', async () => {
    const e = createEngine({
      logLevel: 'silent',
      llm: { url: mock.url },
      batchSize: 2,
      workers: { threads: 1 },
      tasks: [
        {
          name: 'hooked',
          env: { module: 'builtin:arithmetic', timeoutMs: 500 },
          hooks: { module: HANGING_HOOKS },
          groupSize: 2,
          maxSteps: 1,
        },
      ],
    });
    try {
      await e.start();
      const batch = await e.getBatch();
      assert.equal(batch.status, 'NORMAL');
      assert.ok(batch.groups.every((g) => g.rollouts.every((r) => r.status === Status.COMPLETED)));
      assertSettled(await e.stats());
    } finally {
      await e.close();
    }
  });

  it('a pause that cancels in-flight work brings home a group stuck in a hung environment call (regression: pauses gave up with it still in flight)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-engine-'));
    const marker = join(dir, 'hanging');
    const landed: RolloutGroup[] = [];
    const e = createEngine(
      {
        logLevel: 'silent',
        llm: { url: mock.url },
        batchSize: 1,
        workers: { threads: 1 },
        // Ample: the pause returns once the group is home; the bound only turns a hang into a failure.
        pause: { mode: 'abort', timeoutMs: 10_000, resignalIntervalMs: 100 },
        tasks: [faultyTask(datasetOfLines([{ mode: 'hang', marker }]), { maxSteps: 1 })],
      },
      { observer: { landed: (group) => void landed.push(group) } },
    );
    try {
      await e.start();
      const batch = e.getBatch(1);
      for (let i = 0; i < 1_000 && !existsSync(marker); i++) await sleep(10); // the episode is in its hung step()
      assert.ok(existsSync(marker), 'the episode never reached its step()');
      const report = await e.pauseForWeightUpdate();
      assert.equal(report.stillInFlight, 0);
      assert.equal(report.cancelled, true);
      assert.equal(landed.length, 1);
      assert.equal(landed[0].status, Status.ABORTED);
      assert.match(
        landed[0].rollouts[0].error ?? '',
        /^ERR_ENV_CANCELLED: task "faulty": environment step\(\) was still pending/,
      );
      assert.equal((await batch).status, 'UPDATE_WEIGHT_AND_ABORT');
      assertSettled(await e.stats());
    } finally {
      await e.close();
    }
  });
});

describe('a worker that dies (workers.deathRetries)', () => {
  let mock: MockLlm;
  before(async () => {
    mock = await startMockLlm({ port: 0, seed: 1 });
  });
  after(async () => {
    await mock.close();
  });

  it('fails only the group whose rollout killed the worker and retries the healthy groups it held (regression: every group on the worker failed)', async () => {
    const marker = join(mkdtempSync(join(tmpdir(), 'rollout-engine-')), 'died');
    const dropped: RolloutGroup[] = [];
    const e = createEngine(
      {
        logLevel: 'silent',
        llm: { url: mock.url },
        batchSize: 4,
        workers: { threads: 1, groupsPerWorker: 4 },
        producer: { maxFailedGroupsPerStep: 5 },
        tasks: [
          {
            name: 'dying',
            env: { module: DYING_ENV, params: { marker, healthy: 3 } },
            dataset: datasetOf(['die', 'ok', 'ok', 'ok', 'ok', 'ok']),
            groupSize: 1,
            maxSteps: 200,
          },
        ],
      },
      { observer: { dropped: (group) => void dropped.push(group) } },
    );
    try {
      await e.start();
      const batch = await e.getBatch();
      assert.equal(batch.status, 'NORMAL');
      assert.equal(batch.groups.length, 4);
      assert.ok(existsSync(marker), 'the worker died');
      const stats = await e.stats();
      assertSettled(stats);
      assert.equal(stats.groups.dropped.FAILED, 1, 'only the group that killed the worker failed');
      assert.equal(dropped[0].sample.envParams.mode, 'die');
      assert.match(
        dropped[0].error ?? '',
        new RegExp(
          `exited with code:? ?${DIE_EXIT_CODE}.*rollout \\S+ was in its environment step\\(\\) when the worker died`,
        ),
      );
      assert.equal(stats.groups.landed.ABORTED, 3, 'the three healthy groups it held came back ABORTED');
      assert.equal(stats.groups.retried, 3);
      assert.ok(batch.groups.every((g) => g.sample.envParams.mode === 'ok' && g.status === Status.COMPLETED));
    } finally {
      await e.close();
    }
  });

  it('fails a group whose worker keeps dying outside any environment call once workers.deathRetries is spent', async () => {
    const dropped: RolloutGroup[] = [];
    const e = createEngine(
      {
        logLevel: 'silent',
        llm: { url: mock.url },
        batchSize: 2,
        workers: { threads: 1, groupsPerWorker: 1, deathRetries: 1 },
        producer: { maxFailedGroupsPerStep: 5 },
        tasks: [faultyTask(datasetOf(['uncaught', 'ok', 'ok', 'ok']))],
      },
      { observer: { dropped: (group) => void dropped.push(group) } },
    );
    try {
      await e.start();
      const batch = await e.getBatch();
      assert.equal(batch.status, 'NORMAL');
      const stats = await e.stats();
      assertSettled(stats);
      assert.equal(stats.groups.landed.ABORTED, 1, 'sent again once');
      assert.equal(stats.groups.dropped.FAILED, 1);
      assert.match(
        dropped[0].error ?? '',
        /its worker died 2 times while running it, never inside its environment \(workers\.deathRetries = 1\)/,
      );
    } finally {
      await e.close();
    }
  });
});

/**
 * Every episode that does not end normally carries a kind (src/domain/failure.ts), and one that failed
 * by infrastructure — a sandbox killed under it, a judge that failed — is never trained as the
 * policy's outcome: it goes on in its slot from its last finished step (or its prompt), the group
 * keeps its size, and the count says so.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it, type TestContext } from 'node:test';
import { createEngine, Status, type Engine } from '../src/index.ts';
import type { RolloutState } from '../src/domain/rollout.ts';
import { FAILURE_KINDS, failureKindOf, failureKindOfReason, noFailures } from '../src/domain/failure.ts';
import { EnvError } from '../src/env/errors.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/index.ts';
import { guessNumberRow, SERVER_NAME, startNemoGymDouble } from './fixtures/nemo-gym-server.ts';

const INFRA_ENV = new URL('./fixtures/infra-faults-env.ts', import.meta.url).pathname;

describe('failure kinds', () => {
  it('sorts errors into kinds by their code, a 5xx after every retry as infrastructure and a 4xx as the environment', () => {
    const kind = (code: string, extra: object = {}) => failureKindOf(Object.assign(new Error('x'), { code }, extra));
    assert.equal(kind('ERR_ENV_INFRA'), 'infrastructure');
    assert.equal(kind('ERR_ENV_UNREACHABLE'), 'infrastructure');
    assert.equal(kind('ERR_ENV_STEP_UNCERTAIN'), 'infrastructure');
    assert.equal(failureKindOf(new EnvError('ERR_ENV_HTTP', 'x', { status: 503 })), 'infrastructure');
    assert.equal(failureKindOf(new EnvError('ERR_ENV_HTTP', 'x', { status: 404 })), 'environment');
    assert.equal(kind('ERR_ENV_TIMEOUT'), 'timeout');
    assert.equal(kind('ERR_LLM_TIMEOUT'), 'timeout');
    assert.equal(kind('ERR_LLM_HTTP'), 'inference');
    assert.equal(kind('ERR_LLM_OUTAGE'), 'inference');
    assert.equal(kind('ERR_ENV_BAD_REPLY'), 'parse');
    assert.equal(kind('ERR_CONTEXT_EXCEEDED'), 'environment');
    assert.equal(failureKindOf(new Error('the environment threw')), 'environment');
    assert.equal(failureKindOfReason('ERR_ENV_TIMEOUT: environment step() did not settle'), 'timeout');
    assert.equal(failureKindOfReason('worker failed'), 'environment');
    assert.deepEqual(Object.keys(noFailures()), [...FAILURE_KINDS]);
  });
});

describe('infrastructure failures against the mock inference server, in a worker thread', () => {
  let mock: MockLlm;
  const engines: Engine[] = [];
  before(async () => {
    mock = await startMockLlm({ port: 0, seed: 3 });
  });
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    await mock.close();
  });

  function engine(env: object, task: object = {}): Engine {
    const e = createEngine({
      logLevel: 'silent',
      batchSize: 4,
      workers: { threads: 1 },
      llm: { url: mock.url },
      tasks: [{ name: 'flaky', env: { module: INFRA_ENV, ...env }, groupSize: 4, maxSteps: 8, ...task }],
    });
    engines.push(e);
    return e;
  }

  it('reaches the trainer with 10 % of episodes killed by infrastructure: zero unmasked samples, every group whole, each one counted', async () => {
    const e = engine({ params: { every: 10 } });
    await e.start();
    let masked = 0;
    let counted = 0;
    for (let step = 1; step <= 5; step++) {
      const batch = await e.getBatch(step);
      assert.equal(batch.status, 'NORMAL');
      assert.equal(batch.groups.length, 4);
      for (const group of batch.groups) {
        assert.equal(group.rollouts.length, 4, 'the group keeps its size');
        for (const r of group.rollouts) {
          // What the trainer gets is a whole, normal episode: no trace of the killed one.
          assert.equal(r.status, Status.COMPLETED);
          assert.equal(r.failureKind, undefined);
          assert.equal(r.error, null);
          assert.ok(r.turns.length > 0);
          assert.ok(r.terminated || r.truncated);
          masked += r.maskedFailures ?? 0;
        }
      }
      counted += batch.stats.failures.infrastructure;
      assert.deepEqual(
        Object.entries(batch.stats.failures).filter(([kind, n]) => kind !== 'infrastructure' && n > 0),
        [],
      );
    }
    assert.ok(masked > 0, 'some episodes of the batches were run again after an infrastructure failure');
    // Every masked episode is counted, those of groups still in flight or in the buffer too.
    const stats = await e.stats();
    assert.ok(counted >= masked, `batch windows counted ${counted}, the batches' rollouts carry ${masked}`);
    assert.ok(stats.failures.infrastructure >= counted);
    assert.equal(stats.groups.landed.FAILED, 0, 'no group failed: each killed episode ran again');
  });

  /**
   * An engine producing sync against a mock server of its own, with the producer's thrown-away tokens
   * tallied by cause: after each batch nothing is in flight, and no other test's engine producing
   * ahead moves the server's count, so the server's count is this engine's final one.
   */
  async function countedEngine(
    t: TestContext,
    task: object,
  ): Promise<{ e: Engine; server: MockLlm; thrownAway: Map<string, number> }> {
    const server = await startMockLlm({ port: 0, seed: 3 });
    t.after(() => server.close());
    const thrownAway = new Map<string, number>();
    const e = createEngine(
      {
        logLevel: 'silent',
        batchSize: 4,
        workers: { threads: 1 },
        llm: { url: server.url },
        producer: { strategy: 'sync' },
        tasks: [{ name: 'flaky', env: { module: INFRA_ENV }, groupSize: 4, maxSteps: 8, ...task }],
      },
      { observer: { discarded: (tokens, cause) => void thrownAway.set(cause, (thrownAway.get(cause) ?? 0) + tokens) } },
    );
    engines.push(e);
    await e.start();
    return { e, server, thrownAway };
  }

  /** Takes `steps` batches, each NORMAL, showing every rollout to `visit`: the tokens produced for them and taken. */
  async function takeBatches(
    e: Engine,
    steps: number,
    visit: (rollout: RolloutState) => void,
  ): Promise<{ produced: number; taken: number }> {
    let produced = 0;
    let taken = 0;
    for (let step = 1; step <= steps; step++) {
      const batch = await e.getBatch(step);
      assert.equal(batch.status, 'NORMAL');
      for (const n of Object.values(batch.stats.producedTokens)) produced += n;
      taken += batch.stats.responseTokens;
      for (const g of batch.groups) for (const r of g.rollouts) visit(r);
    }
    return { produced, taken };
  }

  // Regression: an episode killed after its first reply was run again in the same dispatch, and the
  // reply it threw away was neither counted produced nor thrown away — the long-tail bench's waste
  // left out every infrastructure restart.
  it('counts the reply of an episode killed by infrastructure as produced and thrown away (restarted): the engine’s count of generated tokens is the server’s', async (t) => {
    const { e, server, thrownAway } = await countedEngine(t, { env: { module: INFRA_ENV, params: { every: 4 } } });
    let masked = 0;
    const { produced, taken } = await takeBatches(e, 3, (r) => {
      masked += r.maskedFailures ?? 0;
    });
    assert.ok(masked > 0, 'some episodes were killed after a reply and run again');
    assert.equal(produced, server.stats().completionTokens, 'every token the server generated is counted produced');
    assert.ok((thrownAway.get('restarted') ?? 0) > 0, JSON.stringify([...thrownAway]));
    assert.equal(thrownAway.get('expired'), undefined, 'nothing is stale in a sync run');
    // The rest is whole groups dropped (an episode killed again on its retry fails its group).
    const all = [...thrownAway.values()].reduce((a, b) => a + b, 0);
    assert.equal(all, produced - taken, 'what the trainer did not get was thrown away, and said why');
  });

  it('resumes an episode whose sandbox is lost at its third step from its second, on a fresh actor: only the lost step’s reply is thrown away', async (t) => {
    const { e, server, thrownAway } = await countedEngine(t, {
      env: { module: INFRA_ENV, params: { every: 3, atStep: 3 } },
      infraRetries: 8, // enough that no group fails: every loss below is a resumed step
    });
    let resumed = 0;
    let lostSteps = 0;
    const { produced, taken } = await takeBatches(e, 3, (r) => {
      const masked = r.maskedFailures ?? 0;
      if (masked === 0) return;
      assert.equal(r.status, Status.COMPLETED);
      assert.deepEqual(
        r.turns.map((turn) => turn.step),
        r.turns.map((_, i) => i + 1),
        'one turn a step, none lost or twice',
      );
      // The step played again is sent as it was the first time (the same prompt after the
      // replay, the same sampling seed), so its reply is the lost one's length.
      resumed++;
      lostSteps += masked * (r.turns[2].responseIds?.length ?? 0);
    });
    assert.ok(resumed > 0, 'some episodes lost their sandbox at step 3 and went on');
    assert.equal(produced, server.stats().completionTokens, 'every token the server generated is counted produced');
    assert.equal(
      thrownAway.get('restarted'),
      lostSteps,
      'thrown away: the lost steps’ replies, not the steps before them',
    );
    assert.equal(thrownAway.get('dropped'), undefined, 'no group failed');
    assert.equal(produced - taken, lostSteps);
  });

  it('masks a NeMo Gym judge that fails on 10 % of verifies: every sample the trainer gets was scored, every group whole', async () => {
    const double = await startNemoGymDouble();
    const dir = mkdtempSync(join(tmpdir(), 'rollout-infra-'));
    try {
      let verifies = 0;
      // The double's judge fails on every tenth /verify, as a flaky LLM judge would.
      Object.defineProperty(double, 'judgeFailure', { get: () => ++verifies % 10 === 0 });
      writeFileSync(join(dir, 'rows.jsonl'), `${JSON.stringify(guessNumberRow(50))}\n`);
      const e = createEngine({
        logLevel: 'silent',
        batchSize: 4,
        workers: { threads: 1 },
        llm: { url: mock.url },
        tasks: [
          {
            name: 'judged',
            env: { http: { urls: [double.url], name: SERVER_NAME }, protocol: 'nemo-gym' },
            dataset: join(dir, 'rows.jsonl'),
            groupSize: 4,
          },
        ],
      });
      engines.push(e);
      await e.start();
      let masked = 0;
      for (let step = 1; step <= 3; step++) {
        const batch = await e.getBatch(step);
        for (const group of batch.groups) {
          assert.equal(group.rollouts.length, 4);
          for (const r of group.rollouts) {
            assert.equal(r.status, Status.COMPLETED);
            assert.equal(r.failureKind, undefined);
            masked += r.maskedFailures ?? 0;
          }
        }
      }
      const stats = await e.stats();
      assert.ok(verifies >= 10, `${verifies} verifies`);
      assert.ok(masked > 0 || stats.failures.infrastructure > 0, 'the judge failed on some episode, and it ran again');
      assert.equal(stats.groups.landed.FAILED, 0);
      assert.equal(
        stats.failures.infrastructure,
        Math.floor(verifies / 10),
        'each judge failure counted once, as infrastructure',
      );
    } finally {
      await double.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('fails the group, never trains it, when the retries run out, and counts the failure as infrastructure', async () => {
    const e = engine({ params: { every: 1 } }, { infraRetries: 1 });
    await e.start();
    await assert.rejects(e.getBatch(1), (err: Error & { code?: string }) => err.code === 'ERR_TOO_MANY_FAILED_GROUPS');
    const stats = await e.stats();
    assert.ok(stats.groups.landed.FAILED > 0);
    assert.equal(stats.groups.taken, 0);
    assert.ok(stats.failures.infrastructure > 0);
    assert.equal(stats.failures.environment, 0);
  });

  it('does not run again an episode the environment itself broke: its kind is environment', async () => {
    const e = engine({ params: { every: 2, kind: 'environment' } });
    await e.start();
    await assert.rejects(e.getBatch(1), (err: Error & { code?: string }) => err.code === 'ERR_TOO_MANY_FAILED_GROUPS');
    const stats = await e.stats();
    assert.ok(stats.failures.environment > 0);
    assert.equal(stats.failures.infrastructure, 0);
  });
});

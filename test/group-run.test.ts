/**
 * A worker's group run never rejects (src/worker/group-run.ts): each step of it is made to throw in
 * turn — making each rollout's sample its own (the step that once ran outside the guard), the task's
 * set-up, an episode, the result's delta, the worker's bookkeeping — and the group still comes back,
 * every rollout in a final status and each failed one carrying its reason and kind. Then the same
 * through a WorkerRuntime in this thread, with a task that cannot run.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setImmediate as turnOfTheLoop } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { resolveConfig } from '../src/config.ts';
import { workerInit } from '../src/coordinator/worker-pool.ts';
import { newGroup, Status, type RolloutGroup, type TurnRecord } from '../src/domain/rollout.ts';
import { CONTROL, createControlBlock, RunState } from '../src/protocol/control-block.ts';
import { PROTOCOL_VERSION, type RunGroupMessage } from '../src/protocol/messages.ts';
import { restoreKeptTurns } from '../src/protocol/result-delta.ts';
import { settleEpisode, settleGroup, type GroupRun } from '../src/worker/group-run.ts';
import { WorkerRuntime } from '../src/worker/worker-runtime.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/index.ts';
import { C, group, I, sample, turn } from './support/groups.ts';
import { deferred } from './support/waits.ts';

const WORKER = 7;

function message(g: RolloutGroup): RunGroupMessage {
  return { v: PROTOCOL_VERSION, type: 'run-group', group: g, modelStep: 0, enqueuedAt: Date.now() };
}

/** A GroupRun whose play is `play`, counting begin / end and keeping every report. */
function recorded(play: GroupRun['play'], extra: Partial<GroupRun> = {}) {
  const seen = { begun: 0, ended: 0, reports: [] as string[] };
  const run: GroupRun = {
    workerId: WORKER,
    begin: () => void seen.begun++,
    play,
    end: () => void seen.ended++,
    report: (_group, reason) => void seen.reports.push(reason),
    ...extra,
  };
  return { run, seen };
}

/** Marks every rollout that is not yet COMPLETED as COMPLETED with one turn: a healthy play. */
async function playsWell(g: RolloutGroup): Promise<void> {
  for (const r of g.rollouts) {
    if (r.status === Status.COMPLETED) continue;
    r.turns = [turn([0])];
    r.status = Status.COMPLETED;
  }
}

describe('a group run in a worker never rejects (worker/group-run.ts)', () => {
  it('fails every rollout with the reason when the task cannot be set up, keeping a sibling completed earlier', async () => {
    const g = group('t', 0, C(1), I(), I());
    const { run, seen } = recorded(async () => {
      throw new Error('unknown task "t" (worker knows other)');
    });
    const result = await settleGroup(message(g), run);
    assert.equal(result.group.status, Status.FAILED);
    assert.equal(result.group.error, 'unknown task "t" (worker knows other)');
    assert.deepEqual(
      result.group.rollouts.map((r) => [r.status, r.failureKind, r.workerId]),
      [
        [Status.COMPLETED, undefined, null],
        [Status.FAILED, 'environment', WORKER],
        [Status.FAILED, 'environment', WORKER],
      ],
    );
    assert.equal(result.group.rollouts[1].error, 'unknown task "t" (worker knows other)');
    assert.deepEqual(result.keptTurns, [1, 0, 0], 'the completed sibling still travels as kept turns');
    assert.deepEqual(seen, { begun: 1, ended: 1, reports: ['unknown task "t" (worker knows other)'] });
  });

  it('fails the group with the reason when giving each rollout its own sample throws, the step once outside the guard', async () => {
    const g = newGroup(sample('t', 0), 2);
    // Shared by both rollouts (as decoded from the wire) and not cloneable: structuredClone throws.
    g.sample.envParams = { callback: () => 1 };
    let played = false;
    const { run, seen } = recorded(async () => {
      played = true;
    });
    const result = await settleGroup(message(g), run);
    assert.equal(played, false);
    assert.equal(result.group.status, Status.FAILED);
    assert.match(result.group.error ?? '', /could not be cloned/);
    for (const r of result.group.rollouts) {
      assert.equal(r.status, Status.FAILED);
      assert.equal(r.failureKind, 'environment');
      assert.equal(r.error, result.group.error);
    }
    assert.equal(seen.ended, 1, 'the worker counts the group done all the same');
  });

  it('fails only the episode that threw, and answers once its sibling has ended', async () => {
    const g = newGroup(sample('t', 0), 2);
    const [broken, healthy] = g.rollouts;
    const sibling = deferred();
    const { run } = recorded(async ({ group }) => {
      await Promise.all([
        settleEpisode(broken, WORKER, () => {
          throw new Error('the step recorder broke');
        }),
        settleEpisode(healthy, WORKER, async () => {
          await sibling.promise;
          await playsWell({ ...group, rollouts: [healthy] });
        }),
      ]);
    });
    let answered = false;
    const answer = settleGroup(message(g), run).then((result) => {
      answered = true;
      return result;
    });
    await turnOfTheLoop();
    assert.equal(answered, false, 'an episode that threw does not end its group while a sibling still plays');
    sibling.resolve();
    const result = await answer;
    assert.equal(broken.status, Status.FAILED);
    assert.equal(broken.error, 'the episode threw: the step recorder broke');
    assert.equal(broken.failureKind, 'environment');
    assert.equal(broken.workerId, WORKER);
    assert.equal(healthy.status, Status.COMPLETED);
    assert.equal(result.group.status, Status.FAILED);
  });

  it("gives a thrown episode the kind its error's code names", async () => {
    const g = newGroup(sample('t', 0), 1);
    await settleEpisode(g.rollouts[0], WORKER, async () => {
      throw Object.assign(new Error('environment step() did not settle'), { code: 'ERR_ENV_TIMEOUT' });
    });
    assert.equal(g.rollouts[0].status, Status.FAILED);
    assert.equal(g.rollouts[0].failureKind, 'timeout');
    assert.equal(g.rollouts[0].error, 'the episode threw: ERR_ENV_TIMEOUT: environment step() did not settle');
  });

  it('fails every rollout, a completed one too, and sends every turn when the result cannot be made', async () => {
    const received = turn([0]);
    const g = group('t', 0, C(1), I());
    g.rollouts[1].turns = [received];
    const { run, seen } = recorded(async ({ group }) => {
      await playsWell(group);
      // What the result's delta reads is broken: it throws.
      group.rollouts[1].turns = null as unknown as TurnRecord[];
    });
    const result = await settleGroup(message(g), run);
    assert.deepEqual(result.keptTurns, [0, 0]);
    assert.equal(result.group.status, Status.FAILED);
    for (const r of result.group.rollouts) {
      assert.equal(r.status, Status.FAILED);
      assert.match(r.error ?? '', /^the group's result could not be made: /);
      assert.equal(r.failureKind, 'environment');
    }
    assert.equal(seen.reports.length, 1);
  });

  it("answers the group as played when the worker's end count and its logger throw", async () => {
    const g = newGroup(sample('t', 0), 2);
    const { run } = recorded(({ group }) => playsWell(group), {
      end: () => {
        throw new Error('a counter broke');
      },
      report: () => {
        throw new Error('the logger broke');
      },
    });
    const result = await settleGroup(message(g), run);
    assert.equal(result.group.status, Status.COMPLETED);
    assert.deepEqual(
      result.group.rollouts.map((r) => r.status),
      [Status.COMPLETED, Status.COMPLETED],
    );
  });

  it('fails the group when the worker cannot take it on, without playing it or counting it done', async () => {
    const g = newGroup(sample('t', 0), 1);
    let played = false;
    const { run, seen } = recorded(
      async () => {
        played = true;
      },
      {
        begin: () => {
          throw new Error('the in-flight count broke');
        },
      },
    );
    const result = await settleGroup(message(g), run);
    assert.equal(played, false);
    assert.equal(seen.ended, 0, 'end takes back only what begin counted');
    assert.equal(result.group.status, Status.FAILED);
    assert.equal(result.group.rollouts[0].error, 'the in-flight count broke');
  });
});

describe('WorkerRuntime.runGroup never rejects, in this thread', () => {
  let dir: string;
  const runtimes: WorkerRuntime[] = [];
  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'group-run-'));
    writeFileSync(
      join(dir, 'factory-throws.mjs'),
      "export default function createEnv() { throw new Error('the factory broke'); }\n",
    );
    writeFileSync(
      join(dir, 'reset-throws.mjs'),
      [
        'export default function createEnv() {',
        '  return {',
        "    reset() { throw new Error('reset broke'); },",
        '    getTaskPrompt: () => [],',
        '    step: () => ({ observation: null, reward: 0, terminated: true, truncated: false }),',
        '  };',
        '}',
        '',
      ].join('\n'),
    );
    writeFileSync(join(dir, 'hooks-throw.mjs'), "throw new Error('the hooks module broke at import');\n");
  });
  after(async () => {
    await Promise.all(runtimes.map((r) => r.close()));
    rmSync(dir, { recursive: true, force: true });
  });

  function runtime(task: Record<string, unknown>): WorkerRuntime {
    const config = resolveConfig({
      logLevel: 'silent',
      llm: { url: 'http://127.0.0.1:9' },
      tasks: [{ name: 't', groupSize: 2, ...task }],
    });
    const r = new WorkerRuntime(workerInit(config, ['http://127.0.0.1:9'], createControlBlock(0)));
    runtimes.push(r);
    return r;
  }

  it('answers a group of a task it does not know with every rollout FAILED, naming the task', async () => {
    const r = runtime({ env: { module: join(dir, 'factory-throws.mjs') } });
    const result = await r.runGroup(message(newGroup(sample('elsewhere', 0), 2)));
    assert.equal(result.group.status, Status.FAILED);
    assert.match(result.group.error ?? '', /unknown task "elsewhere"/);
    assert.deepEqual(
      result.group.rollouts.map((x) => [x.status, x.failureKind]),
      [
        [Status.FAILED, 'environment'],
        [Status.FAILED, 'environment'],
      ],
    );
    assert.deepEqual((await r.stats()).inFlightGroups, 0, 'the group is counted done');
  });

  it("answers a group whose rollouts' shared sample cannot be cloned, where runGroup once rejected", async () => {
    const r = runtime({ env: { module: join(dir, 'reset-throws.mjs') } });
    const g = newGroup(sample('t', 0), 2);
    g.sample.envParams = { callback: () => 1 };
    const result = await r.runGroup(message(g));
    assert.equal(result.group.status, Status.FAILED);
    assert.match(result.group.error ?? '', /could not be cloned/);
    for (const x of result.group.rollouts) assert.equal(x.status, Status.FAILED);
    assert.deepEqual((await r.stats()).inFlightGroups, 0, 'the group is counted done');
  });

  it('answers a group whose environment factory throws with each rollout FAILED by the environment', async () => {
    const r = runtime({ env: { module: join(dir, 'factory-throws.mjs') } });
    const result = await r.runGroup(message(newGroup(sample('t', 0), 2)));
    assert.equal(result.group.status, Status.FAILED);
    for (const x of result.group.rollouts) {
      assert.equal(x.status, Status.FAILED);
      assert.match(x.error ?? '', /the factory broke/);
      assert.equal(x.failureKind, 'environment');
    }
  });

  it("answers a group whose environment's reset throws with each rollout FAILED, the reason kept", async () => {
    const r = runtime({ env: { module: join(dir, 'reset-throws.mjs') } });
    const result = await r.runGroup(message(newGroup(sample('t', 0), 2)));
    for (const x of result.group.rollouts) {
      assert.equal(x.status, Status.FAILED);
      assert.match(x.error ?? '', /reset broke/);
      assert.equal(x.failureKind, 'environment');
    }
  });

  it('answers a group whose hooks module does not load with every rollout FAILED by the environment', async () => {
    const r = runtime({
      env: { module: join(dir, 'reset-throws.mjs') },
      hooks: { module: join(dir, 'hooks-throw.mjs') },
    });
    const result = await r.runGroup(message(newGroup(sample('t', 0), 2)));
    assert.equal(result.group.status, Status.FAILED);
    assert.match(result.group.error ?? '', /the hooks module broke at import/);
    for (const x of result.group.rollouts) assert.equal(x.failureKind, 'environment');
  });
});

// Regression: an episode that failed by infrastructure while a pause was on was not run again, and
// came back FAILED: its group failed and was dropped, its finished episodes with it.
describe('an infrastructure failure during a pause, in a WorkerRuntime in this thread', () => {
  let dir: string;
  let mock: MockLlm;
  let runtime: WorkerRuntime | null = null;
  before(async () => {
    mock = await startMockLlm({ port: 0, seed: 4 });
    dir = mkdtempSync(join(tmpdir(), 'group-run-pause-'));
    writeFileSync(
      join(dir, 'sandbox.mjs'),
      [
        '// Three steps; the first rollout to reach step 2 loses its sandbox there, as a pause arrives.',
        'export default function createEnv() {',
        '  let n = 0;',
        '  return {',
        '    reset() { n = 0; return { observation: null }; },',
        "    getTaskPrompt: () => [{ role: 'user', content: 'Go on.' }],",
        '    step() {',
        '      n++;',
        '      if (n === 2 && globalThis.__loseSandboxDuringPause?.()) {',
        "        throw Object.assign(new Error('the sandbox was lost'), { code: 'ERR_ENV_INFRA' });",
        '      }',
        '      return { observation: null, reward: 1, terminated: n === 3, truncated: false };',
        '    },',
        '  };',
        '}',
        '',
      ].join('\n'),
    );
  });
  after(async () => {
    delete (globalThis as { __loseSandboxDuringPause?: unknown }).__loseSandboxDuringPause;
    await runtime?.close();
    await mock.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('sends the episode back interrupted, ready to go on from its last finished step after the resume, instead of failing its group', async () => {
    const config = resolveConfig({
      logLevel: 'silent',
      llm: { url: mock.url },
      producer: { partialRollout: true },
      tasks: [{ name: 't', groupSize: 2, maxSteps: 3, infraRetries: 2, env: { module: join(dir, 'sandbox.mjs') } }],
    });
    const block = createControlBlock(0);
    runtime = new WorkerRuntime(workerInit(config, [mock.url], block));
    let lost = 0;
    (globalThis as { __loseSandboxDuringPause?: () => boolean }).__loseSandboxDuringPause = () => {
      if (lost++ > 0) return false;
      Atomics.store(new Int32Array(block), CONTROL.STATE, RunState.PAUSED);
      return true;
    };
    const result = await runtime.runGroup(message(newGroup(sample('t', 0), 2)));
    assert.equal(lost > 0, true, 'a sandbox was lost');
    const hit = result.group.rollouts.find((r) => (r.maskedFailures ?? 0) > 0);
    assert.ok(hit, 'the failure was masked');
    assert.equal(hit.status, Status.ABORTED);
    assert.equal(hit.failureKind, undefined);
    assert.deepEqual(
      hit.turns.map((t) => t.step),
      [1],
      'its finished step kept, the one the failure cut short dropped',
    );
    assert.equal(result.group.status, Status.ABORTED, 'the group goes back to be sent again, not dropped');

    // After the resume the group is sent again as the coordinator holds it (partial rollouts on).
    Atomics.store(new Int32Array(block), CONTROL.STATE, RunState.RUNNING);
    const sent = structuredClone(result.group);
    const again = await runtime.runGroup(message(structuredClone(sent)));
    const back = restoreKeptTurns(again.group, sent, again.keptTurns);
    assert.equal(back.status, Status.COMPLETED);
    const resumed = back.rollouts.find((r) => r.id === hit.id)!;
    assert.deepEqual(
      resumed.turns.map((t) => [t.step, t.reward]),
      [
        [1, 1],
        [2, 1],
        [3, 1],
      ],
      'replayed step 1, played steps 2 and 3',
    );
    assert.equal(resumed.turns[0].response, hit.turns[0].response, 'step 1 kept, not generated again');
  });
});

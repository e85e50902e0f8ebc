/**
 * The engine against Safactory's env protocol, end to end: test/fixtures/safactory_env_server.py
 * reproduces the routes and reply shapes of env/app.py in github.com/AI45Lab/SAfactory at commit
 * 4fbd77abcb7bc23b370e99ad2c98c03d54822bbd (with the env_param its launcher builds,
 * core/data_manager/load_yaml.py) in the Python standard library, and counts the actions it applies
 * per instance. Needs python3 on PATH; run by `npm run test:python`.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { createEngine, Status, type Engine } from '../../src/index.ts';
import { startMockLlm, type MockLlm } from '../../src/mock-llm/server.ts';
import { spawnServer, type ChildServer } from '../fixtures/flaky-env-server.ts';
import { rollout } from '../support/cli.ts';

const FIXTURE = new URL('../fixtures/safactory_env_server.py', import.meta.url).pathname;

interface FixtureInstance {
  envname: string;
  id: string;
  state: string;
  deleted: boolean;
  env_param: unknown;
  session: string | null;
  seeds: (number | null)[];
  applied: unknown[];
  dropped: number[];
}

interface PlayedRollout {
  status: string;
  reward: number;
  terminated: boolean;
  truncated: boolean;
  error?: string | null;
  turns: {
    response: string;
    reward: number;
    terminated: boolean;
    truncated: boolean;
    messages: { role: string; content: string }[];
  }[];
}

const ROWS = [
  { min: 1, max: 16, target: 5 },
  { min: 1, max: 32 },
  { min: 10, max: 40, target: 33 },
];
const PARAMS = { max_turns: 6, win_reward: 2 };

async function startFixture(): Promise<
  ChildServer & { stats(): Promise<FixtureInstance[]>; faults(f: { drop_step_replies: number }): Promise<void> }
> {
  const child = await spawnServer('python3', [FIXTURE, '--port', '0'], /listening on (http:\/\/\S+)/);
  const json = async (path: string, init?: RequestInit) => {
    const res = await fetch(`${child.url}${path}`, { ...init, signal: AbortSignal.timeout(5_000) });
    assert.equal(res.status, 200, `${path}: ${res.status}`);
    return res.json();
  };
  return Object.assign(child, {
    stats: async () => ((await json('/_fixture/stats')) as { instances: FixtureInstance[] }).instances,
    faults: async (f: { drop_step_replies: number }) =>
      void (await json('/_fixture/faults', { method: 'POST', body: JSON.stringify(f) })),
  });
}

/**
 * Every rollout in the batches was played by one instance (its prompt names the instance's session),
 * and that instance applied exactly the rollout's actions, in order: none twice, none missing.
 */
function assertEachActionAppliedOnce(rollouts: PlayedRollout[], instances: FixtureInstance[]): void {
  const bySession = new Map(instances.filter((i) => i.session !== null).map((i) => [i.session!, i]));
  const matched = new Set<string>();
  for (const r of rollouts) {
    const session = /Game (\w+)\./.exec(r.turns[0].messages[0].content)?.[1];
    assert.ok(session !== undefined, `the prompt names its game: ${r.turns[0].messages[0].content}`);
    const instance = bySession.get(session);
    assert.ok(instance !== undefined, `an instance played game ${session}`);
    assert.ok(!matched.has(session), `game ${session} is one rollout's`);
    matched.add(session);
    assert.deepEqual(
      instance.applied,
      r.turns.map((t) => t.response),
      `instance ${instance.id} applied the rollout's actions once each, in order`,
    );
    assert.deepEqual(instance.dropped, []);
  }
  // Across every instance, those of rollouts that failed or were in flight at the end included: the
  // mock guesses inside the interval the feedback leaves, so the same action twice in a row on one
  // instance can only be a step sent again.
  for (const i of instances) {
    for (let k = 1; k < i.applied.length; k++)
      assert.notEqual(i.applied[k], i.applied[k - 1], `instance ${i.id} got step ${k + 1} twice`);
  }
}

describe('the engine against a Safactory env server (Python reproduction of its env/app.py)', {
  timeout: 120_000,
}, () => {
  let mock: MockLlm;
  const children: ChildServer[] = [];
  const engines: Engine[] = [];
  let dir: string;
  let dataset: string;
  before(async () => {
    mock = await startMockLlm({ port: 0, seed: 7 });
    dir = mkdtempSync(join(tmpdir(), 'safactory-'));
    dataset = join(dir, 'guess.jsonl');
    writeFileSync(dataset, `${ROWS.map((r) => JSON.stringify(r)).join('\n')}\n`);
  });
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    for (const child of children) assert.deepEqual(await child.stop(), { code: 0, signal: null }, child.output());
    await mock?.close();
  });
  async function fixture() {
    const f = await startFixture();
    children.push(f);
    return f;
  }
  function engine(url: string, extra: { http?: Record<string, unknown>; batchSize?: number } = {}): Engine {
    const e = createEngine({
      logLevel: 'silent',
      llm: { url: mock.url },
      batchSize: extra.batchSize ?? 2,
      workers: { threads: 1 },
      tasks: [
        {
          name: 'safactory-guess',
          env: { http: { urls: [url], name: 'guess_gym', ...extra.http }, params: PARAMS },
          dataset,
          groupSize: 2,
          maxSteps: 10,
        },
      ],
    });
    engines.push(e);
    return e;
  }

  it("`rollout run` starts against a server holding another client's instance and plays whole episodes to a reward, each action applied once", async () => {
    const server = await fixture();
    // Another client's instance, listed by GET /envs: not an environment name.
    const other = await fetch(`${server.url}/guess_gym/other-client-1/reset`, {
      method: 'POST',
      body: JSON.stringify({ env_param: { dataset: { min: 1, max: 8 } }, seed: 1 }),
    });
    assert.equal(other.status, 200);
    const config = join(dir, 'run.json');
    writeFileSync(
      config,
      JSON.stringify({
        llm: { url: mock.url },
        batchSize: 3,
        workers: { threads: 2 },
        tasks: [
          {
            name: 'safactory-guess',
            env: { http: { urls: [server.url], name: 'guess_gym' }, params: PARAMS },
            dataset: 'guess.jsonl',
            groupSize: 2,
            maxSteps: 10,
          },
        ],
      }),
    );
    const runDir = join(dir, 'run');
    const { code, stdout, stderr } = await rollout(['run', '--config', config, '--steps', '2', '--run-dir', runDir], {
      timeoutMs: 90_000,
    });
    assert.equal(code, 0, stderr);
    assert.match(stdout, /2 batches written to/);

    const groups = readFileSync(join(runDir, 'batches.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { status: string; rollouts: PlayedRollout[] });
    assert.equal(groups.length, 6, 'two batches of three groups');
    const rollouts = groups.flatMap((g) => g.rollouts);
    for (const g of groups) assert.equal(g.status, 'COMPLETED');
    for (const r of rollouts) {
      assert.equal(r.status, Status.COMPLETED);
      const last = r.turns.at(-1)!;
      assert.ok(last.terminated || last.truncated, 'played to the end of the game');
      // win_reward (env.params) reached the environment: a won game pays 2; max_turns (6) caps a lost one.
      if (last.terminated) assert.equal(last.reward, 2);
      else assert.equal(r.turns.length, 6);
    }
    assert.ok(
      rollouts.some((r) => r.turns.at(-1)!.terminated && r.turns.length > 1),
      'some games take several guesses and are won',
    );

    const instances = (await server.stats()).filter((i) => i.id !== 'other-client-1');
    const rows = ROWS.map((r) => JSON.stringify({ ...PARAMS, dataset: r }));
    for (const i of instances) {
      assert.ok(
        rows.includes(JSON.stringify(i.env_param)),
        `env_param {...env.params, dataset: line} (got ${JSON.stringify(i.env_param)})`,
      );
      assert.ok(i.seeds.length === 1 && Number.isInteger(i.seeds[0]), 'reset once, with an integer seed');
      assert.equal(i.deleted, true, `instance ${i.id} was deleted once its episode ended`);
    }
    assertEachActionAppliedOnce(rollouts, instances);
  });

  it('does not send a step again when its reply is lost (Safactory applies each step it receives): the episode runs again on a fresh instance, the action was applied once, every group whole', async () => {
    const server = await fixture();
    await server.faults({ drop_step_replies: 1 });
    const e = engine(server.url, { http: { retries: 3, retryBackoffMs: 1 } });
    await e.start();
    const batch = await e.getBatch();
    assert.equal(batch.status, 'NORMAL');
    const stats = await e.stats();
    // ERR_ENV_STEP_UNCERTAIN is not the policy's doing: the episode is masked and played again in its
    // slot (docs/FAILURES.md), so its group is whole and nothing is dropped.
    assert.equal(stats.groups.dropped.FAILED, 0);
    assert.equal(stats.failures.infrastructure, 1);
    for (const g of batch.groups) assert.equal(g.rollouts.length, 2, 'every group keeps its size');
    assert.ok(batch.groups.every((g) => g.rollouts.every((r) => r.status === Status.COMPLETED)));
    await e.close();

    const instances = await server.stats();
    const hit = instances.filter((i) => i.dropped.length > 0);
    assert.equal(hit.length, 1, 'one reply was dropped');
    const [lost] = hit;
    assert.equal(
      lost.applied.length,
      lost.dropped[0],
      'nothing reached that instance after the step whose reply was lost: not sent again',
    );
    assert.equal(lost.deleted, true);
    const rollouts = batch.groups.flatMap((g) => g.rollouts) as unknown as PlayedRollout[];
    assert.ok(
      !rollouts.some((r) => r.turns[0].messages[0].content.includes(`Game ${lost.session}.`)),
      'the episode whose reply was lost is not in the batch: it was played again on another instance',
    );
    assertEachActionAppliedOnce(
      rollouts,
      instances.filter((i) => i !== lost),
    );
  });

  it('refuses to start, in one line naming the server, dedupeSteps for a Safactory server and an environment it does not serve', async () => {
    const server = await fixture();
    const dedupe = await engine(server.url, { http: { dedupeSteps: true } })
      .start()
      .then(
        () => assert.fail('started'),
        (err: Error & { code?: string }) => err,
      );
    assert.equal(dedupe.code, 'ERR_INVALID_CONFIG');
    assert.match(
      dedupe.message,
      new RegExp(
        `http env: dedupeSteps: env server ${server.url} lists live instances on GET /envs \\(Safactory's protocol\\); a Safactory server applies every step it receives`,
      ),
    );
    const unknown = await engine(server.url, { http: { name: 'no_such_gym' } })
      .start()
      .then(
        () => assert.fail('started'),
        (err: Error & { code?: string }) => err,
      );
    assert.equal(unknown.code, 'ERR_ENV_HTTP');
    assert.match(
      unknown.message,
      new RegExp(
        `^env server ${server.url} does not serve environment "no_such_gym" \\(.*answered 400: Unknown envname 'no_such_gym'\\. Available: \\['guess_gym'\\]\\)$`,
      ),
    );
    assert.deepEqual(await server.stats(), [], 'checking the name created no instance');
  });
});

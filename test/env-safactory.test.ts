/**
 * The HTTP environment client against Safactory's env protocol, in process: a Node double of its
 * env/app.py (github.com/AI45Lab/SAfactory at 4fbd77abcb7bc23b370e99ad2c98c03d54822bbd; see
 * test/fixtures/safactory-double.ts) next to rollout-engine's own env server. The engine against a
 * Python reproduction of the same service is test/python/safactory.test.ts (npm run test:python).
 */
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { resolveConfig } from '../src/config.ts';
import { createEngine, Status, type Engine } from '../src/index.ts';
import { EnvError } from '../src/env/errors.ts';
import { createHttpEnvironments, type HttpEnvironments, type HttpEnvOptions } from '../src/env/http-env.ts';
import { startEnvServer, type EnvServer } from '../src/env/server.ts';
import { ConfigError } from '../src/errors.ts';
import { startMockLlm } from '../src/mock-llm/server.ts';
import { createProbeEnv, startFlakyProxy } from './fixtures/flaky-env-server.ts';
import { startSafactoryDouble, type SafactoryDouble } from './fixtures/safactory-double.ts';

async function rejection(promise: Promise<unknown>): Promise<Error & { code?: string; status?: number | null }> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof Error, `expected an Error, got ${String(err)}`);
    return err;
  }
  assert.fail('expected the call to fail');
}

describe("HTTP environments speaking Safactory's env protocol (a Node double of its env/app.py)", {
  timeout: 60_000,
}, () => {
  const cleanups: (() => Promise<unknown>)[] = [];
  after(async () => {
    for (const cleanup of cleanups.reverse()) await cleanup();
  });

  async function safactory(): Promise<SafactoryDouble> {
    const double = await startSafactoryDouble();
    cleanups.push(() => double.close());
    return double;
  }
  async function rolloutServer(): Promise<EnvServer> {
    const server = await startEnvServer({ envs: [{ name: 'probe', factory: createProbeEnv }] });
    cleanups.push(() => server.close());
    return server;
  }
  function client(urls: string[], overrides: Partial<HttpEnvOptions> = {}): HttpEnvironments {
    const envs = createHttpEnvironments({
      urls,
      name: 'counter_gym',
      timeoutMs: 2_000,
      retries: 2,
      retryBackoffMs: 1,
      maxResponseBytes: 1 << 20,
      dedupeSteps: false,
      protocol: 'auto',
      logger: { warn: () => {} },
      ...overrides,
    });
    cleanups.unshift(() => envs.close());
    return envs;
  }

  it("starts against a Safactory server whose GET /envs lists no instance yet, or only other clients' instances, ready and pending", async () => {
    const double = await safactory();
    await client([double.url]).prewarm();

    // Another client's instances: one ready, one still in its first reset.
    const other = client([double.url], { protocol: 'safactory' }).create();
    await other.reset({ seed: 1, params: {} });
    double.holdResets = true;
    const held = double.resetHeld();
    const pending = client([double.url], { protocol: 'safactory' }).create().reset({ seed: 2, params: {} });
    await held;
    const listed = (await fetch(`${double.url}/envs`).then((r) => r.json())) as { envs: { state: string }[] };
    assert.deepEqual(
      listed.envs.map((e) => e.state),
      ['ready', 'pending'],
    );
    await client([double.url]).prewarm();
    double.releaseResets();
    await pending;

    assert.equal(double.instances.length, 2, 'checking the name made no instance');
    assert.equal(
      double.refusedEnvParams,
      2,
      'each start asked the reset route about the name, with an env_param it refuses',
    );
  });

  it("refuses at start an environment the Safactory server does not serve, quoting the server's list", async () => {
    const double = await safactory();
    const err = await rejection(client([double.url], { name: 'no_such_gym' }).prewarm());
    assert.ok(err instanceof EnvError);
    assert.equal(err.code, 'ERR_ENV_HTTP');
    assert.equal(err.status, 400);
    assert.match(
      err.message,
      new RegExp(
        `^env server ${double.url} does not serve environment "no_such_gym" \\(.*answered 400: Unknown envname 'no_such_gym'\\. Available: \\['counter_gym'\\]\\)$`,
      ),
    );
    assert.equal(double.instances.length, 0);
  });

  it('reads a malformed instance list as ERR_ENV_BAD_REPLY naming the entry, the field and the value', async () => {
    const double = await safactory();
    double.envsReply = {
      envs: [
        { envname: 'counter_gym', id: 'a', state: 'ready' },
        { envname: 'counter_gym', id: 7, state: 'ready' },
      ],
    };
    const err = await rejection(client([double.url]).prewarm());
    assert.equal(err.code, 'ERR_ENV_BAD_REPLY');
    assert.equal(err.message, `GET ${double.url}/envs: envs[1].id must be a string (got 7)`);
    double.envsReply = { envs: [{ envname: 'counter_gym', id: 'a', state: 'ready' }, 'counter_gym'] };
    const mixed = await rejection(client([double.url]).prewarm());
    assert.equal(
      mixed.message,
      `GET ${double.url}/envs: envs[1] must be a Safactory instance {"envname": string, "id": string, "state": string} (got "counter_gym")`,
    );
  });

  it('sends env_param as {...env.params, dataset: line} with the seed, and the action alone on step', async () => {
    const double = await safactory();
    const envs = client([double.url], { params: { config_path: 'gym.yaml', max_turns: 3 } });
    const env = envs.create();
    const reset = await env.reset({ seed: 42, params: { question: 'q1', turns: 2 } });
    assert.deepEqual(reset.info, {
      kwargs: { config_path: 'gym.yaml', max_turns: 3, dataset: { question: 'q1', turns: 2 } },
    });
    await env.getTaskPrompt();
    const first = await env.step('a');
    const second = await env.step('b');
    assert.deepEqual([first.terminated, second.terminated, second.reward], [false, true, 1]);
    await env.close();

    assert.deepEqual(double.bodies.reset, [
      { env_param: { config_path: 'gym.yaml', max_turns: 3, dataset: { question: 'q1', turns: 2 } }, seed: 42 },
    ]);
    assert.deepEqual(double.bodies.step, [{ action: 'a' }, { action: 'b' }]);
    assert.deepEqual(
      double.instances.map((i) => [i.applied, i.deleted]),
      [[['a', 'b'], true]],
    );
  });

  it('sends the dataset line bare, with step indexes, to rollout env-server: auto tells the two apart by GET /envs', async () => {
    const server = await rolloutServer();
    const front = await startFlakyProxy(server.url, []);
    cleanups.push(() => front.close());
    const env = client([front.url], { name: 'probe' }).create();
    const reset = await env.reset({ seed: 3, params: { question: 'q1' } });
    assert.deepEqual(reset.info, { mode: { question: 'q1' } }, 'the probe environment echoes its reset params');
    await env.step('a');
    assert.deepEqual(
      front.seen.map((s) => [
        s.method,
        s.path.replace(/\/[^/]+\/(reset|step)$/, '/…/$1'),
        s.body === '' ? null : JSON.parse(s.body),
      ]),
      [
        ['GET', '/envs', null],
        ['POST', '/probe/…/reset', { env_param: { question: 'q1' }, seed: 3 }],
        ['POST', '/probe/…/step', { action: 'a', step: 1 }],
      ],
    );
  });

  it('does not resend a step whose reply was lost: ERR_ENV_STEP_UNCERTAIN, and Safactory applied it once', async () => {
    const double = await safactory();
    const env = client([double.url], { protocol: 'safactory', retries: 3 }).create();
    await env.reset({ seed: 1, params: { turns: 5 } });
    await env.step('one');
    double.dropStepReplies = 1;
    const err = await rejection(env.step('two'));
    assert.equal(err.code, 'ERR_ENV_STEP_UNCERTAIN');
    assert.match(err.message, /step 2 of env ".+" may have been applied/);
    assert.deepEqual(double.bodies.step, [{ action: 'one' }, { action: 'two' }], 'sent once');
    assert.deepEqual(double.instances[0].applied, ['one', 'two']);
  });

  it('starts a new Safactory instance when one actor is reset with other params (Safactory would reuse the old one and ignore them)', async () => {
    const double = await safactory();
    const env = client([double.url], { protocol: 'safactory' }).create();
    await env.reset({ seed: 1, params: { question: 'q1' } });
    await env.reset({ seed: 1, params: { question: 'q1' } });
    assert.equal(double.instances.length, 1, 'the same params: reset again in place');
    await env.reset({ seed: 2, params: { question: 'q2' } });
    assert.deepEqual(
      double.instances.map((i) => [(i.kwargs.dataset as { question: string }).question, i.deleted]),
      [
        ['q1', true],
        ['q2', false],
      ],
    );
  });

  it('refuses dedupeSteps for a Safactory server, in the config and at start when auto finds one', async () => {
    assert.throws(
      () =>
        resolveConfig({
          tasks: [
            {
              name: 't',
              env: {
                protocol: 'safactory',
                http: { urls: ['http://127.0.0.1:9'], name: 'counter_gym', dedupeSteps: true },
              },
            },
          ],
        }),
      (err: ConfigError) => {
        assert.deepEqual(err.issues, [
          'tasks[0].env.http.dedupeSteps: a Safactory server applies every step it receives (its step route takes no step index), so it cannot deduplicate steps (got true)',
        ]);
        return true;
      },
    );
    assert.throws(
      () => client(['http://127.0.0.1:9'], { protocol: 'safactory', dedupeSteps: true }),
      /http env: dedupeSteps: a Safactory server applies every step it receives/,
    );

    const double = await safactory();
    const err = await rejection(client([double.url], { dedupeSteps: true }).prewarm());
    assert.ok(err instanceof ConfigError);
    assert.deepEqual(err.issues, [
      `http env: dedupeSteps: env server ${double.url} lists live instances on GET /envs (Safactory's protocol); a Safactory server applies every step it receives (its step route takes no step index), so it cannot deduplicate steps (got true)`,
    ]);
    // Nor can an actor of that client reach the server's step route: its reset is refused the same way.
    const reset = await rejection(client([double.url], { dedupeSteps: true }).create().reset({ seed: 1, params: {} }));
    assert.ok(reset instanceof ConfigError);
    assert.equal(double.bodies.reset?.length ?? 0, 0);
  });

  it('refuses env.params a rollout env-server would ignore, and a params.dataset Safactory would replace', async () => {
    assert.throws(
      () =>
        resolveConfig({
          tasks: [
            {
              name: 't',
              env: { protocol: 'rollout', http: { urls: ['http://127.0.0.1:9'], name: 'probe' }, params: { level: 2 } },
            },
          ],
        }),
      (err: ConfigError) => {
        assert.deepEqual(err.issues, [
          'tasks[0].env.params: a rollout env-server takes no params from the engine (its environments get theirs from the server: rollout env-server --params) (got {"level":2})',
        ]);
        return true;
      },
    );
    assert.throws(
      () =>
        resolveConfig({
          tasks: [
            {
              name: 't',
              env: {
                protocol: 'safactory',
                http: { urls: ['http://127.0.0.1:9'], name: 'counter_gym' },
                params: { dataset: 'x' },
              },
            },
          ],
        }),
      (err: ConfigError) => {
        assert.deepEqual(err.issues, [
          'tasks[0].env.params.dataset: Safactory\'s env_param carries the dataset line under "dataset", which would replace this one (got "x")',
        ]);
        return true;
      },
    );
    const server = await rolloutServer();
    const err = await rejection(client([server.url], { name: 'probe', params: { level: 2 } }).prewarm());
    assert.ok(err instanceof ConfigError);
    assert.match(
      err.issues[0],
      new RegExp(
        `^http env: params: env server ${server.url} lists environment names on GET /envs \\(rollout env-server's protocol\\); a rollout env-server takes no params`,
      ),
    );
  });

  it('names the protocol a server speaks when the configured one is another, and listEnvs refuses a Safactory server (it lists no names)', async () => {
    const double = await safactory();
    await client([double.url], { protocol: 'safactory' }).create().reset({ seed: 1, params: {} }); // another client's instance
    const server = await rolloutServer();
    const wrongForSafactory = await rejection(client([double.url], { protocol: 'rollout' }).prewarm());
    assert.ok(wrongForSafactory instanceof ConfigError);
    assert.deepEqual(wrongForSafactory.issues, [
      `http env: protocol: env server ${double.url} lists live instances (Safactory's protocol) on GET /envs, so it does not speak "rollout"; set "safactory" or "auto" (got "rollout")`,
    ]);
    // A fresh Safactory server lists nothing: with "rollout" configured, that reads as serving nothing.
    const stillEmpty = await rejection(client([(await safactory()).url], { protocol: 'rollout' }).prewarm());
    assert.match(stillEmpty.message, /does not serve environment "counter_gym" \(GET \/envs lists: nothing\)/);
    const wrongForRollout = await rejection(client([server.url], { name: 'probe', protocol: 'safactory' }).prewarm());
    assert.ok(wrongForRollout instanceof ConfigError);
    assert.match(
      wrongForRollout.issues[0],
      /lists environment names \(rollout env-server's protocol\) on GET \/envs, so it does not speak "safactory"; set "rollout" or "auto"/,
    );

    const listed = await rejection(client([double.url]).listEnvs());
    assert.equal(listed.code, 'ERR_ENV_HTTP');
    assert.match(
      listed.message,
      /speaks Safactory's protocol: its GET \/envs lists live instances, not the environments it serves/,
    );
    assert.deepEqual(await client([server.url], { name: 'probe' }).listEnvs(), ['probe']);
  });

  it("the engine starts against the Safactory double and produces a batch, every reset carrying the task's env.params", async () => {
    const double = await safactory();
    const mock = await startMockLlm({ port: 0, seed: 1 });
    cleanups.push(() => mock.close());
    const engine: Engine = createEngine({
      logLevel: 'silent',
      llm: { url: mock.url },
      batchSize: 2,
      workers: { threads: 1 },
      tasks: [
        {
          name: 'remote',
          env: { http: { urls: [double.url], name: 'counter_gym' }, params: { max_turns: 4 } },
          groupSize: 2,
          maxSteps: 6,
        },
      ],
    });
    cleanups.unshift(() => engine.close());
    await engine.start();
    const batch = await engine.getBatch();
    assert.equal(batch.status, 'NORMAL');
    const rollouts = batch.groups.flatMap((g) => g.rollouts);
    assert.equal(rollouts.length, 4);
    for (const r of rollouts) {
      assert.equal(r.status, Status.COMPLETED);
      assert.equal(r.turns.length, 2, 'counter_gym ends after two steps');
      assert.equal(r.reward, 1);
    }
    const made = double.instances.length;
    assert.ok(made >= 4);
    for (const body of double.bodies.reset ?? []) {
      const { env_param: envParam } = body as { env_param: unknown };
      if (Array.isArray(envParam)) continue; // the start's name check
      assert.deepEqual(envParam, { max_turns: 4, dataset: {} });
    }
  });
});

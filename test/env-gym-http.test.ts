/**
 * The gym-http adapter (src/env/gym-http.ts) against a Node double of openai/gym-http-api's server
 * (test/fixtures/gym-http-server.ts, built from gym_http_server.py at 15b68c39): the seeded
 * guess-number episode it hosts is the built-in one, record for record; every fault mode fails with
 * its code and kind, and every instance created is closed.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { resolveConfig } from '../src/config.ts';
import { failureKindOf } from '../src/domain/failure.ts';
import { createGymHttpEnvironments, type GymHttpEnvironments } from '../src/env/gym-http.ts';
import type { HttpEnvOptions } from '../src/env/http-env.ts';
import { createEnv } from '../src/env/synthetic/guess-number.ts';
import type { Environment, StepResult } from '../src/env/types.ts';
import { ConfigError } from '../src/errors.ts';
import { createEngine, Status, type Engine } from '../src/index.ts';
import { rollout } from './support/cli.ts';
import { startGymHttpDouble, type GymHttpDouble } from './fixtures/gym-http-server.ts';

async function rejection(promise: Promise<unknown>): Promise<Error & { code?: string; status?: number | null }> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof Error, `expected an Error, got ${String(err)}`);
    return err;
  }
  assert.fail('expected the call to fail');
}

/** Binary search on the feedback: what a perfect player replies to each observation. */
function player(): (feedback: string | null) => string {
  let lo = 1;
  let hi = 100;
  let last = 0;
  return (feedback) => {
    if (feedback?.startsWith('Too low')) lo = last + 1;
    if (feedback?.startsWith('Too high')) hi = last - 1;
    last = Math.floor((lo + hi) / 2);
    return `I guess ${last}`;
  };
}

interface Played {
  prompts: unknown[];
  steps: Pick<StepResult, 'reward' | 'terminated' | 'truncated'>[];
}

async function play(env: Environment, seed: number, replies: (feedback: string | null) => string): Promise<Played> {
  await env.reset({ seed, params: {} });
  const played: Played = { prompts: [], steps: [] };
  let feedback: string | null = null;
  for (;;) {
    const prompt = await env.getTaskPrompt();
    if (Array.isArray(prompt) && prompt.length === 0) break;
    played.prompts.push(prompt);
    const result = await env.step(replies(feedback));
    played.steps.push({ reward: result.reward, terminated: result.terminated, truncated: result.truncated });
    feedback = String(result.observation);
    if (result.terminated || result.truncated) break;
  }
  await env.close?.();
  return played;
}

describe('gym-http environments (a double of openai/gym-http-api @15b68c39)', { timeout: 120_000 }, () => {
  const cleanups: (() => Promise<unknown>)[] = [];
  after(async () => {
    for (const cleanup of cleanups.reverse()) await cleanup();
  });

  async function double(): Promise<GymHttpDouble> {
    const d = await startGymHttpDouble();
    cleanups.push(() => d.close());
    return d;
  }
  function client(url: string, overrides: Partial<HttpEnvOptions> = {}): GymHttpEnvironments {
    const envs = createGymHttpEnvironments({
      urls: [url],
      name: 'GuessNumber-v0',
      timeoutMs: 2_000,
      retries: 2,
      retryBackoffMs: 1,
      maxResponseBytes: 1 << 20,
      dedupeSteps: false,
      protocol: 'gym-http',
      logger: { warn: () => {} },
      ...overrides,
    });
    cleanups.unshift(() => envs.close());
    return envs;
  }

  it('plays the seeded guess-number episode the built-in environment plays, prompt for prompt, and closes its instance', async () => {
    const d = await double();
    const envs = client(d.url);
    await envs.prewarm();
    for (const seed of [7, 12345]) {
      const remote = await play(envs.create(), seed, player());
      const local = await play(createEnv(), seed, player());
      assert.deepEqual(remote, local);
      assert.ok(remote.steps.at(-1)!.terminated, 'binary search wins');
    }
    assert.equal(d.live(), 0, 'every instance closed (prewarm’s too)');
    assert.deepEqual(d.closed, d.created);
  });

  it('maps done at the step limit with info["TimeLimit.truncated"] to truncated, not terminated, and drops the key', async () => {
    const d = await double();
    const env = client(d.url).create();
    await env.reset({ seed: 3, params: {} });
    let last: StepResult | null = null;
    for (let i = 0; i < 8; i++) last = await env.step('no number at all');
    assert.equal(last!.terminated, false);
    assert.equal(last!.truncated, true);
    assert.equal(last!.reward, -0.1);
    assert.equal(Object.hasOwn(last!.info ?? {}, 'TimeLimit.truncated'), false);
    assert.deepEqual(await env.getTaskPrompt(), [], 'the episode is over');
    const local = createEnv();
    local.reset({ seed: 3, params: {} });
    let mine: StepResult | null = null;
    for (let i = 0; i < 8; i++) mine = local.step('no number at all');
    assert.deepEqual([mine!.terminated, mine!.truncated], [false, true]);
    await env.close?.();
    assert.equal(d.live(), 0);
  });

  it('turns the reply into the action as env.gym.action says; an unusable reply is the policy’s failure', async () => {
    const d = await double();
    const integer = client(d.url, { gym: { action: 'integer', system: 'Be brief.' } }).create();
    await integer.reset({ seed: 9, params: {} });
    const prompt = (await integer.getTaskPrompt()) as { role: string }[];
    assert.deepEqual(
      prompt.map((m) => m.role),
      ['system', 'system', 'user'],
      'the configured system message, then the observation’s messages',
    );
    const step = await integer.step('between 1 and 100 I pick 50');
    assert.equal((step.info as { guess: number }).guess, 50, 'the last integer was sent');
    const err = await rejection(Promise.resolve().then(() => integer.step('no idea')));
    assert.equal(err.code, 'ERR_ENV_BAD_ACTION');
    assert.equal(failureKindOf(err), 'policy');
    await integer.close?.();

    const json = client(d.url, { gym: { action: 'json', system: null } }).create();
    await json.reset({ seed: 9, params: {} });
    assert.equal(((await json.step(' 50 ')).info as { guess: number }).guess, 50);
    assert.equal((await rejection(Promise.resolve().then(() => json.step('fifty')))).code, 'ERR_ENV_BAD_ACTION');
    await json.close?.();
    assert.equal(d.live(), 0);
  });

  it('fails with the server’s 400 message (ERR_ENV_HTTP, the environment’s kind) and never retries it', async () => {
    const d = await double();
    const err = await rejection(client(d.url, { name: 'CartPole-v0' }).prewarm());
    assert.equal(err.code, 'ERR_ENV_HTTP');
    assert.equal(err.status, 400);
    assert.equal(
      err.message,
      `POST ${d.url}/v1/envs/ (create of an instance of "CartPole-v0") answered 400: Attempted to look up malformed environment ID 'CartPole-v0'`,
    );
    assert.equal(failureKindOf(err), 'environment');
    assert.equal(d.calls.create, 1);

    // An empty reply is a missing action to the server (get_required_param).
    const env = client(d.url).create();
    await env.reset({ seed: 1, params: {} });
    const empty = await rejection(Promise.resolve().then(() => env.step('')));
    assert.equal(empty.status, 400);
    assert.match(empty.message, /answered 400: A required request parameter 'action' was not provided$/);
    await env.close?.();
    assert.equal(d.live(), 0);
  });

  it('retries a 5xx on create and reset, then fails ERR_ENV_HTTP as infrastructure; a step’s 5xx is never sent twice', async () => {
    const d = await double();
    const envs = client(d.url);
    d.faults.push({ route: 'create', kind: '500' });
    const env = envs.create();
    await env.reset({ seed: 5, params: {} });
    assert.equal(d.calls.create, 2, 'the 500 was retried');
    d.faults.push({ route: 'step', kind: '500' });
    const step = await rejection(Promise.resolve().then(() => env.step('50')));
    assert.equal(step.code, 'ERR_ENV_HTTP');
    assert.equal(step.status, 500);
    assert.equal(failureKindOf(step), 'infrastructure');
    assert.equal(d.calls.step, 1, 'a step is not sent again');
    await env.close?.();

    d.faults.push({ route: 'reset', kind: '500', times: 3 });
    const broken = envs.create();
    const reset = await rejection(broken.reset({ seed: 5, params: {} }) as Promise<unknown>);
    assert.equal(reset.code, 'ERR_ENV_HTTP');
    assert.equal(reset.status, 500);
    assert.match(reset.message, /answered 500: 500 Internal Server Error \(gave up after 3 attempts\)$/);
    assert.equal(failureKindOf(reset), 'infrastructure');
    await broken.close?.();
    assert.equal(d.live(), 0, 'the instance whose reset failed was closed');
  });

  it('bounds a call that hangs (ERR_ENV_TIMEOUT) and closes the instance', async () => {
    const d = await double();
    const envs = client(d.url, { timeoutMs: 300 });
    const env = envs.create();
    await env.reset({ seed: 5, params: {} });
    d.faults.push({ route: 'step', kind: 'hang' });
    const started = Date.now();
    const err = await rejection(Promise.resolve().then(() => env.step('50')));
    assert.equal(err.code, 'ERR_ENV_TIMEOUT');
    assert.equal(failureKindOf(err), 'timeout');
    assert.ok(Date.now() - started < 10_000, 'bounded by the 300 ms timeout, not hung');
    assert.equal(d.calls.step, 1);
    await env.close?.();
    assert.equal(d.live(), 0);
  });

  it('reads a reply of the wrong shape as ERR_ENV_BAD_REPLY naming the field', async () => {
    const d = await double();
    const envs = client(d.url);
    d.faults.push({ route: 'create', kind: 'malformed' });
    const a = envs.create();
    const created = await rejection(a.reset({ seed: 1, params: {} }) as Promise<unknown>);
    assert.equal(created.code, 'ERR_ENV_BAD_REPLY');
    assert.equal(
      created.message,
      `POST ${d.url}/v1/envs/: instance_id must be a non-empty string without "/" (got undefined)`,
    );
    assert.equal(failureKindOf(created), 'parse');
    await a.close?.();

    d.faults.push({ route: 'reset', kind: 'malformed' });
    const b = envs.create();
    const reset = await rejection(b.reset({ seed: 1, params: {} }) as Promise<unknown>);
    assert.equal(reset.code, 'ERR_ENV_BAD_REPLY');
    assert.match(reset.message, /\/reset\/: observation must be present \(got undefined\)$/);
    await b.close?.();

    const c = envs.create();
    await c.reset({ seed: 1, params: {} });
    d.faults.push({ route: 'step', kind: 'malformed' });
    const step = await rejection(Promise.resolve().then(() => c.step('50')));
    assert.equal(step.code, 'ERR_ENV_BAD_REPLY');
    assert.match(step.message, /\/step\/: reward must be a finite number \(got "zero"\)$/);
    await c.close?.();
    assert.equal(d.live(), 0);
  });

  it('cancels an episode closed mid-step (a pause, a shutdown): the step stops ERR_ENV_CANCELLED and the instance is closed', async () => {
    const d = await double();
    const envs = client(d.url, { timeoutMs: 60_000 });
    const env = envs.create();
    await env.reset({ seed: 5, params: {} });
    d.faults.push({ route: 'step', kind: 'hang' });
    const step = rejection(Promise.resolve().then(() => env.step('50')));
    while (d.calls.step === 0) await new Promise((r) => setTimeout(r, 5));
    const started = Date.now();
    await env.close?.();
    const err = await step;
    assert.equal(err.code, 'ERR_ENV_CANCELLED');
    assert.ok(Date.now() - started < 30_000, 'cancelled at the close, not at the 60 s timeout');
    assert.equal(d.live(), 0);

    // A connection cut without an answer mid-step: not sent again, an infrastructure failure.
    const other = envs.create();
    await other.reset({ seed: 6, params: {} });
    d.faults.push({ route: 'step', kind: 'drop' });
    const dropped = await rejection(Promise.resolve().then(() => other.step('50')));
    assert.equal(dropped.code, 'ERR_ENV_STEP_UNCERTAIN');
    assert.equal(failureKindOf(dropped), 'infrastructure');
    await other.close?.();
    assert.equal(d.live(), 0);
  });

  it('refuses in the config what a gym-http server cannot take: params, a dataset, dedupeSteps; gym options on another protocol', () => {
    const task = (env: object, extra: object = {}) => ({
      tasks: [{ name: 'g', env: { http: { urls: ['http://127.0.0.1:1'], name: 'GuessNumber-v0' }, ...env }, ...extra }],
    });
    const problems = (input: object): string => {
      try {
        resolveConfig(input);
      } catch (err) {
        assert.ok(err instanceof ConfigError);
        return err.message;
      }
      assert.fail('expected a config error');
    };
    assert.match(
      problems(task({ protocol: 'gym-http', params: { a: 1 } })),
      /tasks\[0\]\.env\.params: .*env_id and seed alone/,
    );
    assert.match(
      problems({
        tasks: [
          {
            name: 'g',
            env: { protocol: 'gym-http', http: { urls: ['http://127.0.0.1:1'], name: 'x', dedupeSteps: true } },
          },
        ],
      }),
      /tasks\[0\]\.env\.http\.dedupeSteps: a gym-http server applies every step it receives/,
    );
    const dir = mkdtempSync(join(tmpdir(), 'gym-cfg-'));
    writeFileSync(join(dir, 'd.jsonl'), '{"target": 3}\n');
    assert.match(
      problems(task({ protocol: 'gym-http' }, { dataset: join(dir, 'd.jsonl') })),
      /tasks\[0\]\.dataset: .*a dataset line would go unsent/,
    );
    assert.match(
      problems({
        tasks: [
          {
            name: 'g',
            env: {
              protocol: 'rollout',
              http: { urls: ['http://127.0.0.1:1'], name: 'x' },
              gym: { action: 'integer' },
            },
          },
        ],
      }),
      /tasks\[0\]\.env\.gym: applies to env\.protocol "gym-http" only/,
    );
    const ok = resolveConfig(task({ protocol: 'gym-http' }));
    assert.equal(ok.tasks[0].env?.protocol, 'gym-http');
  });

  it('gives the engine the same episode records through gym-http as the built-in guess-number, seed for seed', async () => {
    const d = await double();
    const engines: Engine[] = [];
    cleanups.push(() => Promise.all(engines.map((e) => e.close())));
    const run = async (env: object) => {
      const engine = createEngine({
        logLevel: 'silent',
        seed: 11,
        batchSize: 4,
        workers: { threads: 1 },
        tasks: [{ name: 'guess', env, groupSize: 2 }],
      });
      engines.push(engine);
      await engine.start();
      const batch = await engine.getBatch();
      await engine.close();
      return batch.groups
        .flatMap((g) => g.rollouts)
        .map((r) => {
          assert.equal(r.status, Status.COMPLETED, r.error ?? '');
          return {
            seed: r.sample.seed,
            reward: r.reward,
            terminated: r.terminated,
            truncated: r.truncated,
            turns: r.turns.map((t) => ({ messages: t.messages, response: t.response, reward: t.reward })),
          };
        })
        .sort((a, b) => a.seed - b.seed || a.reward! - b.reward!);
    };
    const local = await run({ module: 'builtin:guess-number' });
    const remote = await run({ protocol: 'gym-http', http: { urls: [d.url], name: 'GuessNumber-v0' } });
    assert.deepEqual(remote, local);
    assert.equal(d.live(), 0, 'every episode’s instance closed');
  });

  it('`rollout run --config` runs a task on a gym-http server from the documented config', async () => {
    const d = await double();
    const dir = mkdtempSync(join(tmpdir(), 'rollout-gym-http-'));
    const config = join(dir, 'gym.json');
    // docs/ENVIRONMENTS.md, "gym-http-api", with the double's URL.
    writeFileSync(
      config,
      JSON.stringify({
        batchSize: 4,
        tasks: [
          {
            name: 'guess',
            groupSize: 2,
            env: {
              protocol: 'gym-http',
              http: { urls: [d.url], name: 'GuessNumber-v0' },
              gym: { action: 'text', system: null },
            },
          },
        ],
      }),
    );
    const { code, stderr } = await rollout(
      ['run', '--config', config, '--steps', '1', '--run-dir', dir, '--threads', '1'],
      {
        timeoutMs: 60_000,
      },
    );
    assert.equal(code, 0, stderr);
    const [line] = readFileSync(join(dir, 'batches.jsonl'), 'utf8').trim().split('\n');
    assert.ok(line.length > 0);
    assert.ok(d.created.length >= 5, 'a prewarm instance, then one per episode');
    assert.equal(d.live(), 0);
  });
});

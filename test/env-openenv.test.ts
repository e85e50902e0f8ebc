/**
 * The OpenEnv client (src/env/openenv.ts) against a double of an OpenEnv server built from OpenEnv's
 * source (test/fixtures/openenv-server.ts): the session protocol, the mapping to the engine's
 * conversation, each fault mode with its error code and failure kind, the session closed on every
 * path, and `rollout run` from the docs' config giving the records the same environment gives in
 * process.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { resolveConfig } from '../src/config.ts';
import type { ChatMessage } from '../src/domain/rollout.ts';
import { failureKindOf } from '../src/domain/failure.ts';
import { createActorPool } from '../src/env/actor-pool.ts';
import { EnvError } from '../src/env/errors.ts';
import type { HttpEnvOptions } from '../src/env/http-env.ts';
import { OPENENV_DEFAULTS, type OpenEnvSettings } from '../src/env/protocol.ts';
import { createRemoteEnvironments, type RemoteEnvironments } from '../src/env/remote.ts';
import type { Environment, StepResult, ToolOutput } from '../src/env/types.ts';
import type { RolloutState } from '../src/domain/rollout.ts';
import { ConfigError } from '../src/errors.ts';
import { EnvGuard } from '../src/worker/env-guard.ts';
import type { PauseView } from '../src/worker/episode-context.ts';
import { startOpenEnvDouble, type OpenEnvDouble, type OpenEnvDoubleOptions } from './fixtures/openenv-server.ts';
import { rollout } from './support/cli.ts';
import { within } from './support/waits.ts';

const DOCS = new URL('../docs/ENVIRONMENTS.md', import.meta.url);
/** Bound on a wait for something that happens at once (a session ending): it only turns a hang into a failure, so generous for a busy machine. */
const SETTLE_MS = 30_000;

const doubles: OpenEnvDouble[] = [];
const clients: RemoteEnvironments[] = [];
after(async () => {
  await Promise.all(clients.map((c) => c.close()));
  await Promise.all(doubles.map((d) => d.close()));
});

async function double(options: OpenEnvDoubleOptions = {}): Promise<OpenEnvDouble> {
  const d = await startOpenEnvDouble(options);
  doubles.push(d);
  return d;
}

/** An actor as the OpenEnv client makes them: every method there, `close` included. */
type Actor = Environment & Required<Pick<Environment, 'close'>>;

function client(
  urls: string[],
  overrides: Partial<HttpEnvOptions> = {},
  openenv: Partial<OpenEnvSettings> = {},
): Omit<RemoteEnvironments, 'create'> & { create(): Actor } {
  const c = createRemoteEnvironments({
    urls,
    name: 'guess-number',
    timeoutMs: 5_000,
    retries: 2,
    retryBackoffMs: 1,
    maxResponseBytes: 1 << 20,
    dedupeSteps: false,
    protocol: 'openenv',
    params: {},
    openenv: { ...OPENENV_DEFAULTS, truncatedField: 'truncated', ...openenv },
    ...overrides,
  });
  clients.push(c);
  return c as Omit<RemoteEnvironments, 'create'> & { create(): Actor };
}

/** The EnvError a call fails with (the test fails if it resolves or throws something else). */
async function envError(promise: Promise<unknown> | unknown): Promise<EnvError> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof EnvError, `expected an EnvError, got ${(err as Error)?.stack ?? String(err)}`);
    return err;
  }
  assert.fail('expected the call to fail');
}

/** Plays guess-number by bisection; returns every step's result and the prompts seen. */
async function bisect(env: Environment, seed: number) {
  const reset = await env.reset({ seed, params: {} });
  let lo = Number(reset.info?.min);
  let hi = Number(reset.info?.max);
  const steps: StepResult[] = [];
  const prompts: ChatMessage[][] = [];
  for (;;) {
    const prompt = (await env.getTaskPrompt()) as ChatMessage[];
    if (prompt.length === 0) break;
    prompts.push(prompt);
    const guess = Math.floor((lo + hi) / 2);
    const result = await env.step(`My guess is ${guess}`);
    steps.push(result);
    if (result.terminated || result.truncated) break;
    const feedback = (result.observation as { messages: ChatMessage[] }).messages.at(-1)!.content;
    if (feedback.startsWith('Too low')) lo = guess + 1;
    else hi = guess - 1;
  }
  return { reset, steps, prompts };
}

async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

describe('OpenEnv environments (env.protocol "openenv")', () => {
  it("plays a seeded guess-number episode on one /ws session: the observation's messages are the prompt, the reply is the action's message, done is terminated", async () => {
    const d = await double();
    const c = client([d.url]);
    const env = c.create();
    const { reset, steps, prompts } = await bisect(env, 11);
    assert.equal(d.sessionsOpened, 1, 'one session for the whole episode');
    assert.deepEqual(Object.keys(reset.info ?? {}).sort(), ['guess', 'max', 'min', 'target', 'turns']);
    assert.equal(prompts[0][0].role, 'system');
    assert.match(prompts[0][0].content, /number guessing game/);
    assert.deepEqual(prompts[0][1], { role: 'user', content: 'Make your first guess.' });
    const last = steps.at(-1)!;
    assert.equal(last.terminated, true);
    assert.equal(last.truncated, false);
    assert.ok((last.reward as number) >= 0.5, `a win is rewarded (got ${last.reward})`);
    assert.deepEqual(Object.keys(last.info ?? {}).sort(), ['guess', 'max', 'min', 'target', 'turns']);
    assert.deepEqual(await env.getTaskPrompt(), [], 'a done episode prompts no more');
    await env.close();
    await within(SETTLE_MS, 'the session to end', d.whenIdle());
    assert.equal(d.closeMessages, 1, 'closed with the close message, as EnvClient.disconnect does');
  });

  it("makes a done episode truncated when the observation's truncatedField says so (OpenEnv itself has no truncation flag), terminated without that option", async () => {
    const d = await double({ params: { maxTurns: 2 } });
    for (const [truncatedField, expected] of [
      ['truncated', { terminated: false, truncated: true }],
      [null, { terminated: true, truncated: false }],
    ] as const) {
      const env = client([d.url], {}, { truncatedField }).create();
      await env.reset({ seed: 3, params: { target: 99 } });
      assert.equal((await env.step('1')).terminated, false);
      const end = await env.step('2');
      assert.deepEqual({ terminated: end.terminated, truncated: end.truncated }, expected);
      if (truncatedField === null) assert.equal(end.info?.truncated, true, 'the field is then plain info');
      await env.close();
    }
  });

  it('keeps the conversation itself when the prompt field is a text: that text, the reply, the next text', async () => {
    const d = await double({ textPrompt: true });
    const env = client([d.url], {}, { promptField: 'prompt' }).create();
    await env.reset({ seed: 5, params: { target: 40 } });
    const first = (await env.getTaskPrompt()) as ChatMessage[];
    assert.equal(first.length, 1);
    assert.equal(first[0].role, 'user');
    assert.match(first[0].content, /I have picked an integer between 1 and 100/);
    await env.step('50', { toolMessages: [] });
    assert.deepEqual(((await env.getTaskPrompt()) as ChatMessage[]).slice(1), [
      { role: 'assistant', content: '50' },
      { role: 'user', content: 'Too high.' },
    ]);
    const end = await env.step('40');
    assert.equal(end.terminated, true);
    assert.equal(end.info?.prompt, undefined, 'the prompt field is not info');
    await env.close();
  });

  it('passes env.params and the dataset line as reset kwargs beside the seed', async () => {
    const d = await double();
    const env = client([d.url], { params: { min: 10 } }).create();
    const reset = await env.reset({ seed: 1, params: { max: 12, target: 11 } });
    assert.deepEqual([reset.info?.min, reset.info?.max], [10, 12]);
    assert.equal((await env.step('11')).terminated, true);
    await env.close();
  });

  it("prewarm checks /health, /metadata and /schema, and names a configured field the server's models lack", async () => {
    const d = await double();
    await client([d.url]).prewarm();
    const err = await client([d.url], {}, { actionField: 'answer', promptField: 'question' })
      .prewarm()
      .then(
        () => assert.fail('prewarm passed'),
        (e: unknown) => e,
      );
    assert.ok(err instanceof ConfigError, String(err));
    assert.match(
      err.issues[0],
      /^env\.openenv\.actionField: .* has no action field "answer" \(GET \/schema action fields: metadata, message\)/,
    );
    assert.match(err.issues[1], /^env\.openenv\.promptField: .* has no observation field "question"/);
    assert.match(err.issues[1], /messages, target, turns/);
  });

  it('a 5xx on the HTTP routes is retried, then fails prewarm with ERR_ENV_HTTP 500: infrastructure', async () => {
    const d = await double();
    d.faults.http5xx = true;
    const err = await envError(client([d.url], { retries: 1 }).prewarm());
    assert.equal(err.code, 'ERR_ENV_HTTP');
    assert.equal(err.status, 500);
    assert.equal(failureKindOf(err), 'infrastructure');
    assert.match(
      err.message,
      /GET http:\/\/127\.0\.0\.1:\d+\/health \(health check\) answered 500.*gave up after 2 attempts/,
    );
  });

  it('HTTP /reset then /step on an OpenEnv server share no environment (simulation mode builds one per call): why episodes use /ws', async () => {
    const d = await double();
    const post = (path: string, body: unknown) =>
      fetch(`${d.url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
    assert.equal((await post('/reset', { seed: 1 })).status, 200);
    const step = await post('/step', { action: { message: '50' } });
    assert.equal(step.status, 500);
    assert.match(await step.text(), /step called before reset/);
    assert.equal(d.openSessions, 0);
  });

  it('a step that hangs fails ERR_ENV_TIMEOUT (timeout) within timeoutMs; the session is closed, and ends on the server once its step returns', async () => {
    const d = await double();
    const env = client([d.url], { timeoutMs: 300 }).create();
    await env.reset({ seed: 2, params: {} });
    d.faults.hangStep = true;
    const err = await envError(env.step('50'));
    assert.equal(err.code, 'ERR_ENV_TIMEOUT');
    assert.equal(failureKindOf(err), 'timeout');
    assert.match(err.message, /ws:\/\/127\.0\.0\.1:\d+\/ws: no reply to step 1 within 300 ms/);
    const again = await envError(env.step('51'));
    assert.equal(again.code, 'ERR_ENV_INFRA', 'a session that lost a reply cannot go on');
    await env.close();
    assert.equal(d.openSessions, 1, 'the server is still in the hung step');
    d.releaseSteps();
    await within(SETTLE_MS, 'the session to end', d.whenIdle());
  });

  it('a WebSocket dropped mid-episode fails the step with ERR_ENV_INFRA (infrastructure), never sent again', async () => {
    const d = await double();
    d.faults.dropOnStep = 2;
    const env = client([d.url]).create();
    await env.reset({ seed: 4, params: { target: 77 } });
    await env.step('50');
    const err = await envError(env.step('75'));
    assert.equal(err.code, 'ERR_ENV_INFRA');
    assert.equal(failureKindOf(err), 'infrastructure');
    assert.match(
      err.message,
      /the socket closed \(code 1006\) before the reply to step 2: the session and its environment are gone/,
    );
    assert.equal(d.steps, 2, 'the step was sent once');
    assert.equal((await envError(env.step('76'))).code, 'ERR_ENV_INFRA');
    await env.close();
    await within(SETTLE_MS, 'the session to end', d.whenIdle());
  });

  it('CAPACITY_REACHED is retried with backoff, and the episode starts once the server has room', async () => {
    const d = await double();
    d.faults.refuseSessions = 2;
    const env = client([d.url], { retries: 2 }).create();
    await env.reset({ seed: 6, params: {} });
    assert.equal(d.refused, 2);
    assert.equal(d.openSessions, 1);
    await env.close();
    await within(SETTLE_MS, 'the session to end', d.whenIdle());
  });

  it("capacity that does not free within the retries fails ERR_ENV_INFRA (infrastructure) with the server's numbers", async () => {
    const d = await double({ maxSessions: 1 });
    const c = client([d.url], { retries: 1 });
    const holder = c.create();
    await holder.reset({ seed: 1, params: {} });
    const err = await envError(c.create().reset({ seed: 1, params: {} }));
    assert.equal(err.code, 'ERR_ENV_INFRA');
    assert.equal(failureKindOf(err), 'infrastructure');
    assert.match(err.message, /CAPACITY_REACHED: Server at capacity: 1\/1 sessions active\..*gave up after 2 attempts/);
    assert.equal(d.refused, 2);
    await holder.close();
    await within(SETTLE_MS, 'the session to end', d.whenIdle());
  });

  it('a malformed reply fails ERR_ENV_BAD_REPLY (parse) naming the field; a frame over maxResponseBytes ends the session as a drop does (ERR_ENV_INFRA, saying so)', async () => {
    const d = await double();
    const cases = [
      {
        on: 'step',
        reply: 'not-json',
        code: 'ERR_ENV_BAD_REPLY',
        message: /step 1: reply is not JSON \(got "<html>502 Bad Gateway<\/html>"\)/,
      },
      {
        on: 'step',
        reply: 'bad-reward',
        code: 'ERR_ENV_BAD_REPLY',
        message: /data\.reward must be a finite number, a boolean or null \(got "high"\)/,
      },
      {
        on: 'reset',
        reply: 'no-observation',
        code: 'ERR_ENV_BAD_REPLY',
        message: /reset: data\.observation must be an object \(got undefined\)/,
      },
      {
        on: 'step',
        reply: 'huge',
        code: 'ERR_ENV_INFRA',
        message: /before the reply to step 1: .*\(a reply over maxResponseBytes = 65536 ends a socket the same way\)/,
      },
    ] as const;
    for (const { on, reply, code, message } of cases) {
      const env = client([d.url], { maxResponseBytes: 64 * 1024 }).create();
      d.faults.malformed = { on, reply };
      const call = async () => {
        await env.reset({ seed: 8, params: {} });
        await env.step('50');
      };
      const err = await envError(call());
      assert.equal(err.code, code, `${reply}: ${err.message}`);
      assert.equal(failureKindOf(err), code === 'ERR_ENV_INFRA' ? 'infrastructure' : 'parse');
      assert.match(err.message, message);
      await env.close();
    }
    await within(SETTLE_MS, 'every session to end', d.whenIdle());
  });

  it('the environment raising (EXECUTION_ERROR) or refusing the action (VALIDATION_ERROR) fails ERR_ENV_HTTP: environment; a factory that fails, ERR_ENV_INFRA', async () => {
    const d = await double();
    const failing = client([d.url]).create();
    const raised = await envError(failing.reset({ seed: 1, params: { colour: 'red' } }));
    assert.equal(raised.code, 'ERR_ENV_HTTP');
    assert.equal(failureKindOf(raised), 'environment');
    assert.match(
      raised.message,
      /reset: the server answered EXECUTION_ERROR: guess-number: unknown reset params\.colour/,
    );
    assert.equal(d.openSessions, 1, 'EXECUTION_ERROR leaves the session alive (http_server.py L1471-1478)');
    await failing.close();

    const env = client([d.url], {}, { actionField: 'answer' }).create();
    await env.reset({ seed: 1, params: {} });
    const refused = await envError(env.step('50'));
    assert.equal(refused.code, 'ERR_ENV_HTTP');
    assert.equal(failureKindOf(refused), 'environment');
    assert.match(
      refused.message,
      /VALIDATION_ERROR: Invalid message \(the action is \{"answer": reply\}: env\.openenv\.actionField; answer: Extra inputs are not permitted; message: Field required\)/,
    );
    await env.close();

    d.faults.factoryError = true;
    const factory = await envError(client([d.url], { retries: 0 }).create().reset({ seed: 1, params: {} }));
    assert.equal(factory.code, 'ERR_ENV_INFRA');
    assert.equal(failureKindOf(factory), 'infrastructure');
    assert.match(factory.message, /FACTORY_ERROR: Environment factory 'create_environment' failed to create instance/);
    await within(SETTLE_MS, 'every session to end', d.whenIdle());
  });

  it('a server that cannot be reached fails ERR_ENV_UNREACHABLE (infrastructure) after the retries', async () => {
    const port = await closedPort();
    const err = await envError(
      client([`http://127.0.0.1:${port}`], { retries: 1 })
        .create()
        .reset({ seed: 1, params: {} }),
    );
    assert.equal(err.code, 'ERR_ENV_UNREACHABLE');
    assert.equal(failureKindOf(err), 'infrastructure');
    assert.match(
      err.message,
      new RegExp(`ws://127\\.0\\.0\\.1:${port}/ws: could not open a session.*gave up after 2 attempts`),
    );
  });

  it('a pause that cancels a pending step (ERR_ENV_CANCELLED) closes the session through the actor pool; the server holds none once its step returns', async () => {
    const d = await double();
    const c = client([d.url]);
    const actors = createActorPool({ size: 1, create: () => c.create(), timeoutMs: 5_000 });
    const pause = new AbortController();
    const gate = { paused: false, modelStep: 0, oldestUsefulStep: 0, signal: pause.signal } as unknown as PauseView;
    const guard = new EnvGuard({ taskName: 'oe', timeoutMs: 30_000, gate, watch: null, dispatchOf: () => 0 });
    const rollout = { groupId: 'g', index: 0 } as RolloutState;
    const env = (await actors.acquire())!;
    await guard.call(rollout, 'reset', () => env.reset({ seed: 9, params: {} }));
    d.faults.hangStep = true;
    const arrived = d.stepArrived();
    const step = guard.call(rollout, 'step', () => env.step('50'));
    await within(SETTLE_MS, 'the step to reach the server', arrived);
    pause.abort(new Error('weight update'));
    const err = await envError(step);
    assert.equal(err.code, 'ERR_ENV_CANCELLED');
    await actors.done(env, true);
    assert.equal(d.openSessions, 1, 'the server finishes the step it is in before it reads the disconnect');
    d.releaseSteps();
    await within(SETTLE_MS, 'the session to end', d.whenIdle());
    assert.equal(d.openSessions, 0);
  });

  it("shutdown (the client's close) closes every session still open", async () => {
    const d = await double();
    const c = client([d.url]);
    const envs = [c.create(), c.create(), c.create()];
    await Promise.all(envs.map((e, i) => e.reset({ seed: i, params: {} })));
    assert.equal(d.openSessions, 3);
    await c.close();
    await within(SETTLE_MS, 'every session to end', d.whenIdle());
    assert.equal(d.closeMessages, 3);
    assert.equal((await envError(envs[0].step('50'))).code, 'ERR_ENV_CLOSED');
    assert.throws(
      () => c.create(),
      (e: unknown) => e instanceof EnvError && e.code === 'ERR_ENV_CLOSED',
    );
  });

  it("offers the environment's MCP tools (tools/list, tools/call on the episode's session) and plays tool-lookup through them", async () => {
    const d = await double({ env: 'tool-lookup' });
    const c = client([d.url], {}, { truncatedField: null, tools: true });
    await c.prewarm();
    const env = c.create() as Environment & Required<Pick<Environment, 'tools' | 'callTool' | 'close'>>;
    await env.reset({ seed: 21, params: {} });
    const tools = await env.tools();
    assert.deepEqual(tools, [
      {
        type: 'function',
        function: {
          name: 'lookup',
          description: 'The integer stored under a key.',
          parameters: { type: 'object', properties: { key: { type: 'string' } }, required: ['key'] },
        },
      },
    ]);
    const task = ((await env.getTaskPrompt()) as ChatMessage[])[1].content;
    const [a, b] = [...task.matchAll(/"(\w+)"/g)].map((m) => m[1]);
    const signal = new AbortController().signal;
    const values = await Promise.all(
      [a, b].map((key, i) => env.callTool({ id: `c${i}`, name: 'lookup', arguments: { key } }, signal)),
    );
    assert.ok(
      values.every((v) => typeof v === 'string' && /^\d+$/.test(v)),
      JSON.stringify(values),
    );
    const missing = (await env.callTool({ id: 'c9', name: 'lookup', arguments: { key: 'nope' } }, signal)) as Exclude<
      ToolOutput,
      string
    >;
    assert.equal(missing.isError, true);
    assert.match(missing.content, /no key "nope"/);
    const end = await env.step(`The sum is ${Number(values[0]) + Number(values[1])}`);
    assert.equal(end.reward, 1);
    assert.equal(end.terminated, true);
    assert.equal(end.info?.toolCalls, 3, "the calls ran on the episode's own environment");
    await env.close();
    await within(SETTLE_MS, 'the session to end', d.whenIdle());

    const none = await double();
    const err = await client([none.url], {}, { tools: true })
      .prewarm()
      .then(
        () => assert.fail('prewarm passed'),
        (e: unknown) => e,
      );
    assert.ok(err instanceof ConfigError);
    assert.match(
      err.issues[0],
      /^env\.openenv\.tools: .* lists no MCP tools \(POST \/mcp tools\/list: "Environment does not support MCP"\)/,
    );
  });

  it('refuses env.openenv without protocol "openenv", dedupeSteps with it, and a field that is not a name, naming the field', () => {
    const task = (env: object) => ({ tasks: [{ name: 't', env }] });
    const http = { urls: ['http://127.0.0.1:8000'], name: 'x' };
    const problems = (env: object) => {
      try {
        resolveConfig(task(env));
      } catch (err) {
        assert.ok(err instanceof ConfigError, String(err));
        return err.issues.join('\n');
      }
      return '';
    };
    assert.match(
      problems({ http, protocol: 'rollout', openenv: {} }),
      /tasks\[0\]\.env\.openenv: is read only with env\.protocol "openenv"/,
    );
    assert.match(
      problems({ http: { ...http, dedupeSteps: true }, protocol: 'openenv' }),
      /tasks\[0\]\.env\.http\.dedupeSteps: an OpenEnv server applies every step/,
    );
    assert.match(
      problems({ http, protocol: 'openenv', openenv: { actionField: 'a b' } }),
      /tasks\[0\]\.env\.openenv\.actionField: must be a field name/,
    );
    const resolved = resolveConfig(task({ http, protocol: 'openenv', params: { level: 2 } }));
    assert.deepEqual(resolved.tasks[0].env?.http, {
      ...http,
      timeoutMs: 30_000,
      retries: 2,
      retryBackoffMs: 500,
      maxResponseBytes: 16 * 1024 * 1024,
      dedupeSteps: false,
      protocol: 'openenv',
      params: { level: 2 },
      openenv: OPENENV_DEFAULTS,
    });
  });

  it("`rollout run` from the docs' OpenEnv config gives the step records builtin:guess-number gives in process", async () => {
    const d = await double();
    const section = readFileSync(DOCS, 'utf8')
      .split(/^## /m)
      .find((s) => s.startsWith('OpenEnv'));
    const block = /```json\n([\s\S]+?)```/.exec(section ?? '')?.[1];
    assert.ok(block !== undefined, 'docs/ENVIRONMENTS.md has a json config under ## OpenEnv');
    const documented = JSON.parse(block) as { tasks: { env: { http: { urls: string[] } } }[] };
    documented.tasks[0].env.http.urls = [d.url];
    const inProcess = structuredClone(documented) as { tasks: { env: unknown }[] };
    inProcess.tasks[0].env = { module: 'builtin:guess-number' };
    const shared = { seed: 5, batchSize: 2, producer: { strategy: 'sync' }, workers: { threads: 1 } };
    const records: string[][] = [];
    for (const config of [documented, inProcess]) {
      const dir = mkdtempSync(join(tmpdir(), 'rollout-openenv-'));
      try {
        writeFileSync(join(dir, 'config.json'), JSON.stringify({ ...config, ...shared }));
        const { code, stderr } = await rollout(
          ['run', '--config', join(dir, 'config.json'), '--steps', '1', '--run-dir', join(dir, 'run')],
          { timeoutMs: 90_000 },
        );
        assert.equal(code, 0, stderr);
        records.push(stepRecords(join(dir, 'run', 'steps')));
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    }
    assert.ok(records[0].length >= 8, `${records[0].length} step records`);
    assert.deepEqual(records[0], records[1]);
    assert.ok(records[0].some((r) => r.includes('"terminated":true')));
    assert.ok(d.sessionsOpened >= 8, `one session per rollout, 2 groups of 4 (got ${d.sessionsOpened})`);
    await within(SETTLE_MS, 'every session to end', d.whenIdle());
  });
});

/** The step records of a run, without what names the run (ids, times), sorted: comparable across runs. */
function stepRecords(dir: string): string[] {
  return readdirSync(dir)
    .flatMap((f) => readFileSync(join(dir, f), 'utf8').trim().split('\n'))
    .map((line) => {
      const { time, sessionId, rolloutId, groupId, ...rest } = JSON.parse(line) as Record<string, unknown>;
      return JSON.stringify(sorted(rest));
    })
    .sort();
}

/** `value` with every object's keys in order, so that equal records serialize alike. */
function sorted(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sorted);
  if (typeof value !== 'object' || value === null) return value;
  return Object.fromEntries(
    Object.keys(value)
      .sort()
      .map((k) => [k, sorted((value as Record<string, unknown>)[k])]),
  );
}

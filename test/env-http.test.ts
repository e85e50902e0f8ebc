import assert from 'node:assert/strict';
import { createServer as createHttpServer } from 'node:http';
import { createServer, type AddressInfo } from 'node:net';
import { after, describe, it } from 'node:test';
import { EnvError } from '../src/env/errors.ts';
import { createHttpEnvironments, type HttpEnvironments, type HttpEnvOptions } from '../src/env/http-env.ts';
import { startEnvServer, type EnvServer, type EnvServerOptions } from '../src/env/server.ts';
import { createEnv as createGuessNumberEnv } from '../src/env/synthetic/guess-number.ts';
import type { ChatMessage } from '../src/domain/rollout.ts';
import {
  createProbeEnv,
  spawnServer,
  startFlakyProxy,
  type ChildServer,
  type FlakyProxy,
  type ProxyRule,
} from './fixtures/flaky-env-server.ts';

const MAIN = new URL('../src/cli/main.ts', import.meta.url).pathname;
const PYTHON_SERVER = new URL('../examples/python_env_server.py', import.meta.url).pathname;

const warnings: string[] = [];
const quietLogger = { warn: (_details: object, message: string) => void warnings.push(message) };

/** Rejects with the EnvError the call throws, or fails the test if it resolves. */
async function envError(promise: Promise<unknown>): Promise<EnvError> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof EnvError, `expected an EnvError, got ${(err as Error)?.stack ?? String(err)}`);
    return err;
  }
  assert.fail('expected the call to fail');
}

/** A port nothing listens on: bound, then released. */
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** Plays guess-number by bisection over an HTTP actor; returns the step results. */
async function playGuessNumber(envs: HttpEnvironments, seed: number) {
  const env = envs.create();
  const reset = await env.reset({ seed, params: {} });
  let lo = Number(reset.info?.min);
  let hi = Number(reset.info?.max);
  assert.ok(
    Number.isInteger(lo) && Number.isInteger(hi),
    `reset info gives the range (got ${JSON.stringify(reset.info)})`,
  );
  const results = [];
  for (let turn = 1; turn <= 20; turn++) {
    const prompt = (await env.getTaskPrompt()) as ChatMessage[];
    assert.ok(Array.isArray(prompt) && prompt.length >= 2, 'a running game prompts');
    assert.equal(prompt[0].role, 'system');
    assert.equal(prompt.at(-1)!.role, 'user');
    const guess = Math.floor((lo + hi) / 2);
    const result = await env.step(`I guess ${guess}`);
    results.push(result);
    if (result.terminated || result.truncated) break;
    if (String(result.observation).startsWith('Too low')) lo = guess + 1;
    else if (String(result.observation).startsWith('Too high')) hi = guess - 1;
    else assert.fail(`unexpected feedback ${JSON.stringify(result.observation)}`);
  }
  assert.deepEqual(await env.getTaskPrompt(), [], 'a finished game prompts nothing');
  await env.close();
  // The id is gone on the server: any call on it is a 404.
  const gone = await envError(env.getTaskPrompt());
  assert.equal(gone.code, 'ERR_ENV_HTTP');
  assert.equal(gone.status, 404);
  return results;
}

describe('HTTP environments (env-server protocol client)', { timeout: 60_000 }, () => {
  const cleanups: (() => Promise<unknown>)[] = [];
  after(async () => {
    for (const cleanup of cleanups.reverse()) await cleanup();
  });

  async function serve(options: Partial<EnvServerOptions> = {}): Promise<EnvServer> {
    const server = await startEnvServer({
      envs: [
        { name: 'guess-number', factory: createGuessNumberEnv },
        { name: 'probe', factory: createProbeEnv },
      ],
      ...options,
    });
    cleanups.push(() => server.close());
    return server;
  }
  async function proxy(upstream: string, script: ProxyRule[]): Promise<FlakyProxy> {
    const p = await startFlakyProxy(upstream, script);
    cleanups.push(() => p.close());
    return p;
  }
  function client(urls: string[], overrides: Partial<HttpEnvOptions> = {}): HttpEnvironments {
    const envs = createHttpEnvironments({
      urls,
      name: 'guess-number',
      timeoutMs: 2_000,
      retries: 2,
      retryBackoffMs: 1,
      maxResponseBytes: 1 << 20,
      dedupeSteps: false,
      logger: quietLogger,
      ...overrides,
    });
    cleanups.unshift(() => envs.close()); // clients close before the servers they talk to
    return envs;
  }

  it('retries a call answered 503 twice (failFirst 2) and then succeeds', async () => {
    const server = await serve({ failFirst: 2 });
    const env = client([server.url]).create();
    const reset = await env.reset({ seed: 1, params: { target: 10 } });
    assert.match(String(reset.observation), /number guessing game/);
    const stats = server.stats();
    assert.equal(stats.faults.failed, 2);
    assert.equal(stats.requests, 3, 'two 503s, then the reset that went through');
    assert.equal(stats.live, 1);
  });

  it('trusts dedupeSteps only on a server whose GET /envs says it deduplicates (regression: any server was trusted, and a retried step could apply twice)', async () => {
    const server = await serve();
    await client([server.url], { dedupeSteps: true }).prewarm(); // rollout env-server says dedupes_steps: true
    const silent = createHttpServer((_req, res) =>
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"envs":["guess-number"]}'),
    );
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise((r) => silent.close(r)));
    const url = `http://127.0.0.1:${(silent.address() as AddressInfo).port}`;
    await client([url]).prewarm();
    await assert.rejects(client([url], { dedupeSteps: true }).prewarm(), {
      code: 'ERR_ENV_HTTP',
      message:
        /env\.http\.dedupeSteps is true, but env server .* does not say it deduplicates steps \(its GET \/envs has no "dedupes_steps": true\)/,
    });
  });

  it('does not retry a 4xx and fails with ERR_ENV_HTTP carrying the status and the server message', async () => {
    const server = await serve();
    const env = client([server.url]).create();
    const err = await envError(env.getTaskPrompt()); // never reset: unknown id
    assert.equal(err.code, 'ERR_ENV_HTTP');
    assert.equal(err.status, 404);
    assert.match(
      err.message,
      /GET http:\/\/127\.0\.0\.1:\d+\/guess-number\/.+\/get_task_prompt .* answered 404: unknown env id/,
    );
    assert.equal(server.stats().byRoute.get_task_prompt, 1, 'asked once');
  });

  it('fails a call that is never answered with ERR_ENV_TIMEOUT within the timeout', async () => {
    const server = await serve({ hangRate: 1 });
    const env = client([server.url], { timeoutMs: 200, retries: 1 }).create();
    const start = performance.now();
    const err = await envError(env.reset({ seed: 1, params: {} }));
    const elapsed = performance.now() - start;
    assert.equal(err.code, 'ERR_ENV_TIMEOUT');
    assert.match(err.message, /timed out after 200 ms.*gave up after 2 attempts/);
    assert.equal(server.stats().faults.hung, 2, 'a timeout is retried for reset');
    // The count and the message say how many attempts; the time, that each waited its 200 ms.
    assert.ok(elapsed >= 390 && elapsed < 10_000, `two 200 ms attempts (took ${elapsed.toFixed(0)} ms)`);
  });

  it('does not retry a step answered 500: ERR_ENV_STEP_UNCERTAIN, sent once', async () => {
    const server = await serve();
    const env = client([server.url]).create();
    await env.reset({ seed: 1, params: { target: 10 } });
    server.setFaults({ failRate: 1 });
    const before = server.stats().requests;
    const err = await envError(env.step('50'));
    server.setFaults({ failRate: 0 });
    assert.equal(err.code, 'ERR_ENV_STEP_UNCERTAIN');
    assert.equal(err.status, 500);
    assert.match(err.message, /step 1 of env ".+" may have been applied .* not retried .*answered 500/);
    assert.equal(server.stats().requests - before, 1, 'the step was sent once');
  });

  it('fails a step that times out with ERR_ENV_STEP_UNCERTAIN after a single attempt', async () => {
    const server = await serve();
    const env = client([server.url], { timeoutMs: 200 }).create();
    await env.reset({ seed: 1, params: { target: 10 } });
    server.setFaults({ hangRate: 1 });
    const err = await envError(env.step('50'));
    server.setFaults({ hangRate: 0 });
    assert.equal(err.code, 'ERR_ENV_STEP_UNCERTAIN');
    assert.match(err.message, /timed out after 200 ms/);
    assert.equal(server.stats().faults.hung, 1);
  });

  it('retries a step answered 503 when the server deduplicates steps (dedupeSteps)', async () => {
    const server = await serve();
    const env = client([server.url], { dedupeSteps: true }).create();
    await env.reset({ seed: 1, params: { target: 10 } });
    server.setFaults({ failFirst: 1 });
    const result = await env.step('50');
    assert.equal(result.observation, 'Too high.');
    assert.equal(result.info?.turns, 1);
    assert.equal(server.stats().stepsApplied, 1);
  });

  it('with dedupeSteps, retries a step whose reply was lost after it was applied, and the server applies it once', async () => {
    const server = await serve();
    const front = await proxy(server.url, ['pass', 'drop-after-apply']);
    const env = client([front.url], { dedupeSteps: true }).create();
    await env.reset({ seed: 1, params: { target: 10 } });
    const first = await env.step('50');
    assert.equal(first.info?.turns, 1, 'the cached reply of the applied step');
    assert.deepEqual(
      front.seen.map((s) => [s.rule, JSON.parse(s.body || 'null')?.step]),
      [
        ['pass', undefined],
        ['drop-after-apply', 1],
        ['pass', 1],
      ],
    );
    const stats = server.stats();
    assert.equal(stats.stepsApplied, 1, 'applied once');
    assert.equal(stats.dedupeHits, 1, 'the retry was answered from the cache');
    const second = await env.step('25');
    assert.equal(second.info?.turns, 2, "the next step is the game's second turn");
  });

  it('without dedupeSteps, fails a step whose reply was lost with ERR_ENV_STEP_UNCERTAIN (applied once, never twice)', async () => {
    const server = await serve();
    const front = await proxy(server.url, ['pass', 'drop-after-apply']);
    const env = client([front.url]).create();
    await env.reset({ seed: 1, params: { target: 10 } });
    const err = await envError(env.step('50'));
    assert.equal(err.code, 'ERR_ENV_STEP_UNCERTAIN');
    assert.match(err.message, /may have been applied/);
    assert.equal(front.seen.filter((s) => s.path.endsWith('/step')).length, 1);
    assert.equal(server.stats().stepsApplied, 1);
  });

  it('retries even a step when the connection is refused (it never reached a server), then fails ERR_ENV_UNREACHABLE', async () => {
    const port = await closedPort();
    const env = client([`http://127.0.0.1:${port}`]).create();
    const err = await envError(env.step('50'));
    assert.equal(err.code, 'ERR_ENV_UNREACHABLE');
    assert.match(err.message, /ECONNREFUSED.*gave up after 3 attempts/);
  });

  it('fails a reply larger than maxResponseBytes with ERR_ENV_TOO_LARGE naming the limit, whether declared or streamed', async () => {
    const server = await serve();
    const probe = client([server.url], { name: 'probe', maxResponseBytes: 1_000 });
    const err = await envError(probe.create().reset({ seed: 1, params: { observationBytes: 5_000 } }));
    assert.equal(err.code, 'ERR_ENV_TOO_LARGE');
    assert.match(err.message, /maxResponseBytes = 1000 bytes \(content-length \d+\)/);

    const front = await proxy(server.url, [{ status: 200, chunks: ['[', ' '.repeat(600), ' '.repeat(600), ']'] }]);
    const chunked = await envError(client([front.url], { maxResponseBytes: 1_000 }).create().getTaskPrompt());
    assert.equal(chunked.code, 'ERR_ENV_TOO_LARGE');
    assert.match(chunked.message, /maxResponseBytes = 1000 bytes \(more than 1000 bytes received\)/);
  });

  it('fails a reply that is not JSON, or has the wrong shape, with ERR_ENV_BAD_REPLY naming the field and the value', async () => {
    const server = await serve();
    const front = await proxy(server.url, [
      { status: 200, body: '<html>oops</html>' },
      { status: 200, body: '[{"role": "robot", "content": "hi"}]' },
    ]);
    const env = client([front.url]).create();
    const notJson = await envError(env.getTaskPrompt());
    assert.equal(notJson.code, 'ERR_ENV_BAD_REPLY');
    assert.match(notJson.message, /get_task_prompt: reply is not JSON \(got "<html>oops<\/html>"\)/);
    const badRole = await envError(env.getTaskPrompt());
    assert.equal(badRole.code, 'ERR_ENV_BAD_REPLY');
    assert.match(badRole.message, /getTaskPrompt\(\)\[0\]\.role must be one of .* \(got "robot"\)/);

    const probe = client([server.url], { name: 'probe' }).create();
    await probe.reset({ seed: 1, params: { badReply: 'reward' } });
    const badReward = await envError(probe.step('go'));
    assert.equal(badReward.code, 'ERR_ENV_BAD_REPLY');
    assert.match(badReward.message, /step\(\)\.reward must be a finite number.* \(got "lots"\)/);
  });

  it('prewarm fails with the URL and the name when a server does not serve the environment, and listEnvs lists what every server serves', async () => {
    const a = await serve();
    const b = await startEnvServer({ envs: [{ name: 'guess-number', factory: createGuessNumberEnv }] });
    cleanups.push(() => b.close());
    await client([a.url, b.url]).prewarm();
    assert.deepEqual(await client([a.url, b.url]).listEnvs(), ['guess-number']);
    const err = await envError(client([a.url, b.url], { name: 'probe' }).prewarm());
    assert.equal(err.code, 'ERR_ENV_HTTP');
    assert.equal(
      err.message,
      `env server ${b.url} does not serve environment "probe" (GET /envs lists: "guess-number")`,
    );
    const down = await envError(client([`http://127.0.0.1:${await closedPort()}`], { retries: 0 }).prewarm());
    assert.equal(down.code, 'ERR_ENV_UNREACHABLE');
  });

  it('spreads new actors over the servers, least busy first, then round-robin', async () => {
    const a = await serve();
    const b = await serve();
    const envs = client([a.url, b.url]);
    const actors = [envs.create(), envs.create(), envs.create(), envs.create()];
    assert.deepEqual(
      actors.map((x) => x.url),
      [a.url, b.url, a.url, b.url],
    );
    assert.equal(new Set(actors.map((x) => x.id)).size, 4, 'ids are unique');
    await actors[1].close(); // b now has one actor, a has two
    assert.equal(envs.create().url, b.url);
  });

  it('close() sends one DELETE, and a failing DELETE is logged, never thrown', async () => {
    const server = await serve();
    const env = client([server.url]).create();
    await env.reset({ seed: 1, params: {} });
    assert.equal(server.stats().live, 1);
    await Promise.all([env.close(), env.close()]);
    assert.equal(server.stats().byRoute.delete, 1);
    assert.equal(server.stats().live, 0);

    const orphan = client([`http://127.0.0.1:${await closedPort()}`], { retries: 0 }).create();
    const before = warnings.length;
    await orphan.close();
    assert.equal(warnings.length, before + 1);
    assert.match(warnings.at(-1)!, /DELETE failed \(ignored\)/);
  });

  it('plays a full guess-number episode against `rollout env-server` running builtin:guess-number in another process', async () => {
    const child: ChildServer = await spawnServer(
      process.execPath,
      ['--import', 'tsx', MAIN, 'env-server', '--env', 'builtin:guess-number', '--port', '0'],
      /env server listening on (http:\/\/\S+) \(envs: guess-number\)/,
    );
    cleanups.push(async () => assert.deepEqual(await child.stop(), { code: 0, signal: null }, child.output()));
    const envs = client([child.url]);
    await envs.prewarm();
    const results = await playGuessNumber(envs, 7);
    const last = results.at(-1)!;
    assert.equal(last.terminated, true, 'bisection finds the number within 8 guesses');
    assert.ok(typeof last.reward === 'number' && last.reward >= 0.5);
    assert.deepEqual(
      results.map((r) => r.info?.turns),
      results.map((_, i) => i + 1),
    );
  });

  it('plays a full guess-number episode against the Python standard-library server', async () => {
    const child: ChildServer = await spawnServer(
      'python3',
      [PYTHON_SERVER, '--port', '0'],
      /listening on (http:\/\/\S+)/,
    );
    cleanups.push(async () => assert.deepEqual(await child.stop(), { code: 0, signal: null }, child.output()));
    const envs = client([child.url], { name: 'guess-number-py', dedupeSteps: true });
    await envs.prewarm();
    const results = await playGuessNumber(envs, 7);
    const last = results.at(-1)!;
    assert.equal(last.terminated, true);
    assert.ok(typeof last.reward === 'number' && last.reward >= 0.5);
    assert.equal(last.info?.turns, results.length);
  });
});

import { CLI_MAIN, rollout } from './support/cli.ts';
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { resolveEnvModuleSpec } from '../src/cli/env-specs.ts';
import { startEnvServer, type EnvServer } from '../src/env/server.ts';
import { createEnv as createGuessNumberEnv } from '../src/env/synthetic/guess-number.ts';
import { createProbeEnv, probeCalls, spawnServer } from './fixtures/flaky-env-server.ts';

const MAIN = CLI_MAIN;

interface Answer {
  status: number;
  type: string;
  text: string;
  json: unknown;
}

async function call(url: string, method: string, path: string, body?: unknown, raw?: string): Promise<Answer> {
  const response = await fetch(`${url}${path}`, {
    method,
    headers: body === undefined && raw === undefined ? {} : { 'content-type': 'application/json' },
    body: raw ?? (body === undefined ? undefined : JSON.stringify(body)),
    // Only turns a hang into a failure: generous for a busy machine.
    signal: AbortSignal.timeout(30_000),
  });
  const text = await response.text();
  let json: unknown = null;
  try {
    json = JSON.parse(text);
  } catch {
    // a bare (text) reply
  }
  return { status: response.status, type: response.headers.get('content-type') ?? '', text, json };
}

describe('env server (in-process)', { timeout: 30_000 }, () => {
  let server: EnvServer;
  let url: string;
  before(async () => {
    server = await startEnvServer({
      envs: [
        { name: 'guess-number', factory: createGuessNumberEnv, params: { maxTurns: 5 } },
        { name: 'probe', factory: createProbeEnv },
      ],
      maxBodyBytes: 4_096,
    });
    url = server.url;
  });
  after(() => server.close());

  it('lists the served environments on GET /envs', async () => {
    const answer = await call(url, 'GET', '/envs');
    assert.equal(answer.status, 200);
    assert.deepEqual(answer.json, { envs: ['guess-number', 'probe'], dedupes_steps: true });
  });

  it('answers calls on an unknown id or environment with 404 and a JSON error, and DELETE of an unknown id with 200', async () => {
    for (const [method, path, body] of [
      ['GET', '/guess-number/nobody/get_task_prompt', undefined],
      ['POST', '/guess-number/nobody/step', { action: '1' }],
      ['GET', '/guess-number/nobody/health', undefined],
      ['GET', '/guess-number/nobody/is_done', undefined],
    ] as const) {
      const answer = await call(url, method, path, body);
      assert.equal(answer.status, 404, `${method} ${path}`);
      assert.match(
        (answer.json as { error: string }).error,
        /unknown env id "nobody" for guess-number \(reset it first\)/,
      );
    }
    const noEnv = await call(url, 'POST', '/chess/a/reset', { env_param: {} });
    assert.equal(noEnv.status, 404);
    assert.match(
      (noEnv.json as { error: string }).error,
      /unknown environment "chess" \(serving: guess-number, probe\)/,
    );
    const deleted = await call(url, 'DELETE', '/guess-number/nobody');
    assert.equal(deleted.status, 200);
  });

  it('rejects a reset without the env_param key, a body that is not JSON and an oversized body with 400, 400 and 413', async () => {
    const missing = await call(url, 'POST', '/guess-number/r1/reset', { seed: 1 });
    assert.equal(missing.status, 400);
    assert.match((missing.json as { error: string }).error, /needs the "env_param" key/);
    const notJson = await call(url, 'POST', '/guess-number/r1/reset', undefined, '{"env_param": ');
    assert.equal(notJson.status, 400);
    assert.match((notJson.json as { error: string }).error, /request body is not JSON/);
    const huge = await call(url, 'POST', '/guess-number/r1/reset', { env_param: { pad: 'x'.repeat(5_000) } });
    assert.equal(huge.status, 413);
    assert.match(
      (huge.json as { error: string }).error,
      /request body is \d+ bytes, over the limit of 4096 bytes \(maxBodyBytes, --max-body-bytes\)/,
    );
    // None of them created the id.
    assert.equal((await call(url, 'GET', '/guess-number/r1/health')).status, 404);
  });

  it('answers an error thrown inside the environment with a bare 500', async () => {
    await call(url, 'POST', '/probe/boom/reset', { env_param: { throwOnStep: true }, seed: 0 });
    const answer = await call(url, 'POST', '/probe/boom/step', { action: 'go' });
    assert.equal(answer.status, 500);
    assert.match(answer.type, /^text\/plain/);
    assert.equal(answer.text, 'environment error in step(): probe: step exploded');
  });

  it('plays the protocol: reset, get_task_prompt, step, is_done, describe, render, delete', async () => {
    const reset = await call(url, 'POST', '/guess-number/g1/reset', { env_param: { target: 3 }, seed: 9 });
    assert.equal(reset.status, 200);
    assert.deepEqual(
      (reset.json as { info: unknown }).info,
      { min: 1, max: 100, maxTurns: 5 },
      'factory params from the server apply',
    );
    const prompt = await call(url, 'GET', '/guess-number/g1/get_task_prompt');
    assert.equal((prompt.json as { role: string }[]).at(-1)!.role, 'user');
    const step = await call(url, 'POST', '/guess-number/g1/step', { action: '3', step: 1 });
    assert.deepEqual((step.json as { terminated: boolean; reward: number }).terminated, true);
    assert.deepEqual((await call(url, 'GET', '/guess-number/g1/is_done')).json, { done: true });
    assert.deepEqual((await call(url, 'GET', '/guess-number/g1/describe')).json, {
      env: 'guess-number',
      id: 'g1',
      steps: 1,
      done: true,
    });
    assert.match((await call(url, 'GET', '/guess-number/g1/render')).text, /Correct!/);
    assert.deepEqual((await call(url, 'GET', '/guess-number/g1/health')).json, {
      ok: true,
      env: 'guess-number',
      id: 'g1',
    });
    assert.deepEqual((await call(url, 'DELETE', '/guess-number/g1')).json, { deleted: true });
    assert.equal((await call(url, 'GET', '/guess-number/g1/get_task_prompt')).status, 404, 'gone after DELETE');
  });

  it('runs concurrent calls for one id one at a time, and different ids side by side', async () => {
    await call(url, 'POST', '/probe/s1/reset', { env_param: { slowTicks: 5 }, seed: 0 });
    await call(url, 'POST', '/probe/s2/reset', { env_param: { slowTicks: 5 }, seed: 0 });
    probeCalls.maxActive = 0;
    probeCalls.order.length = 0;
    const same = await Promise.all(
      Array.from({ length: 6 }, (_, i) => call(url, 'POST', '/probe/s1/step', { action: `a${i}` })),
    );
    assert.equal(probeCalls.maxActive, 1, 'one id never sees two calls at once');
    const turns = same.map((a) => (a.json as { info: { turns: number; action: string } }).info);
    // Each reply's turn number is the position at which the server applied it: a permutation of 1..6,
    // consistent with the order the environment saw the actions.
    assert.deepEqual(
      turns.map((t) => t.turns).sort((x, y) => x - y),
      [1, 2, 3, 4, 5, 6],
    );
    for (const t of turns) assert.equal(probeCalls.order[t.turns - 1], t.action);

    probeCalls.maxActive = 0;
    await Promise.all([
      call(url, 'POST', '/probe/s1/step', { action: 'x' }),
      call(url, 'POST', '/probe/s2/step', { action: 'y' }),
    ]);
    assert.equal(probeCalls.maxActive, 2, 'two ids run concurrently');
  });

  it('answers a repeated step index from the cache instead of applying it again, and refuses an out-of-order index with 409', async () => {
    await call(url, 'POST', '/guess-number/d1/reset', { env_param: { target: 40 }, seed: 0 });
    const before = server.stats();
    const first = await call(url, 'POST', '/guess-number/d1/step', { action: '50', step: 1 });
    const again = await call(url, 'POST', '/guess-number/d1/step', { action: '50', step: 1 });
    assert.equal(again.text, first.text);
    assert.equal((again.json as { info: { turns: number } }).info.turns, 1);
    const after = server.stats();
    assert.equal(after.stepsApplied - before.stepsApplied, 1);
    assert.equal(after.dedupeHits - before.dedupeHits, 1);
    const skipped = await call(url, 'POST', '/guess-number/d1/step', { action: '30', step: 3 });
    assert.equal(skipped.status, 409);
    assert.match(
      (skipped.json as { error: string }).error,
      /step index 3 out of order .* 1 step\(s\) applied since reset, so the next is 2/,
    );
    const bad = await call(url, 'POST', '/guess-number/d1/step', { action: 30 });
    assert.equal(bad.status, 400);
    assert.match((bad.json as { error: string }).error, /action must be a string.*\(got 30\)/);
  });

  it('injects faults: failFirst answers 503, failRate 500, dropReplyRate applies and then drops the connection', async () => {
    await call(url, 'POST', '/guess-number/f1/reset', { env_param: { target: 40 }, seed: 0 });
    server.setFaults({ failFirst: 2 });
    assert.equal((await call(url, 'GET', '/envs')).status, 503);
    assert.equal((await call(url, 'GET', '/envs')).status, 503);
    assert.equal((await call(url, 'GET', '/envs')).status, 200);
    server.setFaults({ failRate: 1 });
    assert.equal((await call(url, 'POST', '/guess-number/f1/step', { action: '50', step: 1 })).status, 500);
    server.setFaults({ failRate: 0, dropReplyRate: 1 });
    await assert.rejects(call(url, 'POST', '/guess-number/f1/step', { action: '50', step: 1 }));
    server.setFaults({ dropReplyRate: 0 });
    assert.deepEqual(
      (await call(url, 'GET', '/guess-number/f1/describe')).json,
      { env: 'guess-number', id: 'f1', steps: 1, done: false },
      'the 500 applied nothing, the dropped reply applied the step',
    );
    assert.throws(() => server.setFaults({ failRate: 2 }), /failRate must be a number in \[0, 1\] \(got 2\)/);
  });

  it('refuses factory params the environment rejects at start, naming the environment', async () => {
    await assert.rejects(
      startEnvServer({ envs: [{ name: 'guess-number', factory: createGuessNumberEnv, params: { maxTurn: 3 } }] }),
      /envs\.guess-number: the factory rejects its params \{"maxTurn":3\}: guess-number: unknown params\.maxTurn/,
    );
  });

  it('resolves --env specs: builtins, name=path#export, and names a missing file', () => {
    const builtin = resolveEnvModuleSpec('builtin:arithmetic');
    assert.equal(builtin.name, 'arithmetic');
    assert.match(builtin.moduleUrl, /src\/env\/synthetic\/arithmetic\.ts$/);
    const custom = resolveEnvModuleSpec('faulty=test/fixtures/faulty-env.ts#createEnv');
    assert.deepEqual([custom.name, custom.exportName], ['faulty', 'createEnv']);
    assert.throws(
      () => resolveEnvModuleSpec('x=./nowhere.ts'),
      /--env "x=\.\/nowhere\.ts": module file does not exist/,
    );
    assert.throws(
      () => resolveEnvModuleSpec('builtin:chess'),
      /unknown built-in environment \(expected one of builtin:guess-number, builtin:arithmetic, builtin:tool-lookup, builtin:echo-digit\)/,
    );
  });
});

describe('`rollout env-server` command', { timeout: 60_000 }, () => {
  it('prints its usage with --help and exits 0', async () => {
    const { code, stdout } = await rollout(['env-server', '--help']);
    assert.equal(code, 0);
    assert.match(stdout, /Usage: rollout env-server --env <spec>/);
  });

  it('fails with exit code 2 and the flag when --env is missing, and names an unknown builtin', async () => {
    const missing = await rollout(['env-server']);
    assert.equal(missing.code, 2);
    assert.match(missing.stderr, /--env is required/);
    const unknown = await rollout(['env-server', '--env', 'builtin:chess']);
    assert.equal(unknown.code, 1);
    assert.match(unknown.stderr, /ERR_INVALID_CONFIG.*--env "builtin:chess": unknown built-in environment/s);
  });

  it('serves builtins and a module from another process, with per-environment params, and stops with exit 0 on SIGTERM', async () => {
    const child = await spawnServer(
      process.execPath,
      [
        '--import',
        'tsx',
        MAIN,
        'env-server',
        '--env',
        'builtin:guess-number',
        '--env',
        'faulty=test/fixtures/faulty-env.ts#createEnv',
        '--params',
        'guess-number={"max": 10}',
        '--port',
        '0',
      ],
      /env server listening on (http:\/\/\S+) \(envs: guess-number, faulty\)/,
    );
    try {
      assert.deepEqual((await call(child.url, 'GET', '/envs')).json, {
        envs: ['guess-number', 'faulty'],
        dedupes_steps: true,
      });
      const reset = await call(child.url, 'POST', '/guess-number/c1/reset', { env_param: {}, seed: 3 });
      assert.deepEqual((reset.json as { info: unknown }).info, { min: 1, max: 10, maxTurns: 8 });
      await call(child.url, 'POST', '/faulty/c2/reset', { env_param: { mode: 'throw' } });
      const thrown = await call(child.url, 'POST', '/faulty/c2/step', { action: '4' });
      assert.equal(thrown.status, 500);
      assert.match(thrown.text, /faulty-env: step exploded/);
    } finally {
      assert.deepEqual(await child.stop(), { code: 0, signal: null }, child.output());
    }
  });
});

import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createEngine, Status, type Engine } from '../src/index.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/server.ts';
import { spawnServer, startFlakyProxy, type ChildServer } from './fixtures/flaky-env-server.ts';

const MAIN = new URL('../src/cli/main.ts', import.meta.url).pathname;
const PYTHON_SERVER = new URL('../examples/python_env_server.py', import.meta.url).pathname;

describe('the engine driving environments served by other processes', () => {
  let mock: MockLlm;
  let nodeServer: ChildServer;
  let pythonServer: ChildServer;
  const engines: Engine[] = [];
  before(async () => {
    mock = await startMockLlm({ port: 0, seed: 4 });
    nodeServer = await spawnServer(
      process.execPath,
      ['--import', 'tsx', MAIN, 'env-server', '--env', 'guess-number=builtin:guess-number', '--port', '0'],
      /listening on (http:\/\/\S+)/,
    );
    pythonServer = await spawnServer('python3', [PYTHON_SERVER, '--port', '0'], /listening on (http:\/\/\S+)/);
  });
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    await Promise.all([nodeServer?.stop(), pythonServer?.stop(), mock?.close()]);
  });
  function engine(env: Record<string, unknown>, extra: Record<string, unknown> = {}): Engine {
    const e = createEngine({
      logLevel: 'silent',
      llm: { url: mock.url },
      batchSize: 2,
      workers: { threads: 2 },
      tasks: [{ name: 'remote', env: env as never, groupSize: 3, maxSteps: 8 }],
      ...extra,
    });
    engines.push(e);
    return e;
  }

  it('plays multi-turn episodes against `rollout env-server`, one actor per episode, spread over two servers', async () => {
    const e = engine({
      http: { urls: [nodeServer.url, nodeServer.url], name: 'guess-number', dedupeSteps: true },
      poolSize: 4,
    });
    await e.start();
    const batch = await e.getBatch();
    assert.equal(batch.status, 'NORMAL');
    const rollouts = batch.groups.flatMap((g) => g.rollouts);
    assert.ok(rollouts.every((r) => r.status === Status.COMPLETED));
    assert.ok(rollouts.some((r) => r.turns.length > 1));
    // the same seed gives the same task over HTTP: members of a group saw the same first prompt
    for (const g of batch.groups) assert.equal(new Set(g.rollouts.map((r) => r.turns[0].messages[0].content)).size, 1);
  });

  it('plays full episodes against an env server written with the Python standard library', async () => {
    const e = engine({ http: { urls: [pythonServer.url], name: 'guess-number-py', dedupeSteps: true } });
    await e.start();
    const batch = await e.getBatch();
    assert.equal(batch.status, 'NORMAL');
    for (const r of batch.groups.flatMap((g) => g.rollouts)) {
      assert.equal(r.status, Status.COMPLETED);
      assert.ok(r.turns.length >= 1);
      assert.ok(r.terminated || r.truncated);
    }
  });

  it('refuses to start when an env server does not serve the configured environment, naming both', async () => {
    const e = engine({ http: { urls: [nodeServer.url], name: 'no-such-env' } });
    await assert.rejects(e.start(), (err: Error & { code?: string }) => {
      assert.equal(err.code, 'ERR_ENV_HTTP');
      assert.match(err.message, /no-such-env/);
      assert.ok(err.message.includes(nodeServer.url));
      return true;
    });
  });

  it('fails a rollout with the server message on a 4xx, retries a 5xx, and keeps producing', async () => {
    // The first reset is refused with 422, the next one gets a 503; everything else passes through.
    const proxy = await startFlakyProxy(nodeServer.url, [
      { status: 422, body: JSON.stringify({ error: 'seed out of range for this env' }), pathEndsWith: '/reset' },
      { status: 503, pathEndsWith: '/reset' },
    ]);
    try {
      const e = createEngine({
        logLevel: 'silent',
        llm: { url: mock.url },
        batchSize: 1,
        workers: { threads: 1, groupsPerWorker: 1 },
        tasks: [
          {
            name: 'remote',
            env: { http: { urls: [proxy.url], name: 'guess-number', retryBackoffMs: 1 } },
            groupSize: 1,
            maxSteps: 8,
          },
        ],
      });
      engines.push(e);
      await e.start();
      const batch = await e.getBatch();
      assert.equal(batch.status, 'NORMAL');
      const stats = await e.stats();
      assert.equal(stats.groups.dropped.FAILED, 1);
      assert.match(stats.buffer.lastDropReason ?? '', /ERR_ENV_HTTP.*422.*seed out of range for this env/);
      const resets = proxy.seen.filter((r) => r.path.endsWith('/reset'));
      assert.deepEqual(
        resets.slice(0, 3).map((r) => r.rule),
        ['status 422', 'status 503', 'pass'],
      );
    } finally {
      await proxy.close();
    }
  });
});

import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, realpathSync, statSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { createEngine, type ControlServer, type Engine } from '../src/index.ts';
import { controlToken } from '../src/cli/serve.ts';
import { readCheckpoint } from '../src/coordinator/checkpoint.ts';
import { decodeFromPeer, encodeForPeer } from '../src/formats/peer.ts';
import { spawnServer } from './fixtures/flaky-env-server.ts';
import { CLI_MAIN, rollout } from './support/cli.ts';

const TOKEN = 'sesame-open-please';

async function call(
  server: ControlServer,
  method: 'GET' | 'POST',
  path: string,
  options: { body?: string | Buffer; token?: string | null; headers?: Record<string, string> } = {},
) {
  const token = options.token === undefined ? TOKEN : options.token;
  const res = await request(`${server.url}${path}`, {
    method,
    body: options.body,
    headers: {
      'content-type': 'application/json',
      ...(token ? { authorization: `Bearer ${token}` } : {}),
      ...options.headers,
    },
  });
  const bytes = Buffer.from(await res.body.arrayBuffer());
  const type = String(res.headers['content-type'] ?? '');
  const body = type.startsWith('application/json')
    ? JSON.parse(bytes.toString())
    : type.startsWith('application/msgpack')
      ? decodeFromPeer(bytes)
      : bytes.toString();
  return { status: res.statusCode, body: body as any };
}

/** The full form of a compact batch (docs/CONTROL-API.md): each named prefix copied from the turn that carries it. */
function expandCompact(batch: any): any {
  for (const rollout of batch.groups.flatMap((g: any) => g.rollouts)) {
    for (const turn of rollout.turns) {
      const m = turn.messagesPrefixOf;
      if (m) turn.messages = rollout.turns[m.turn].messages.slice(0, m.length);
      const p = turn.promptIdsPrefixOf;
      if (p) {
        const ids = rollout.turns[p.turn].promptIds;
        turn.promptIds = ids instanceof Uint8Array ? ids.subarray(0, 4 * p.length) : ids.slice(0, p.length); // msgpack: int32 bytes
      }
      delete turn.messagesPrefixOf;
      delete turn.promptIdsPrefixOf;
    }
  }
  return batch;
}

/** Typed arrays and Buffers as plain arrays of bytes, so the two decodings compare by content. */
const plain = (value: unknown): unknown =>
  JSON.parse(
    JSON.stringify(value, (_k, v) =>
      v instanceof Uint8Array || (v && v.type === 'Buffer') ? Array.from(v instanceof Uint8Array ? v : v.data) : v,
    ),
  );

describe('compact batches (POST /batch {"compact": true})', () => {
  let engine: Engine;
  let server: ControlServer;
  before(async () => {
    engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      workers: { threads: 1 },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 2, maxSteps: 8, messageCut: 0 }],
    });
    await engine.start();
    server = await engine.listen({ port: 0, token: TOKEN });
  });
  after(() => engine.close());

  for (const accept of ['application/json', 'application/msgpack']) {
    it(`name the later turn whose conversation a turn begins, and expand to exactly the full batch (${accept})`, async () => {
      const step = accept === 'application/json' ? 1 : 2;
      const compact = await call(server, 'POST', '/batch', {
        body: JSON.stringify({ trainStep: step, compact: true }),
        headers: { accept },
      });
      assert.equal(compact.status, 200);
      const turns = compact.body.groups.flatMap((g: any) => g.rollouts.flatMap((r: any) => r.turns));
      assert.ok(
        turns.some((t: any) => t.messages === null && t.messagesPrefixOf),
        'some turn names the turn carrying its messages',
      );
      assert.ok(
        turns.some((t: any) => t.promptIds === null && t.promptIdsPrefixOf),
        'some turn names the turn carrying its prompt ids',
      );
      const bytes = (x: unknown) => Buffer.byteLength(JSON.stringify(plain(x)));
      // Asking for the same train step again hands out the same batch (redelivery): here in full.
      const full = await call(server, 'POST', '/batch', {
        body: JSON.stringify({ trainStep: step }),
        headers: { accept },
      });
      assert.ok(bytes(compact.body) < bytes(full.body));
      assert.deepEqual(plain(expandCompact(compact.body)), plain(full.body));
    });
  }

  it('refuses a compact flag that is not a boolean, naming the field, without taking the batch', async () => {
    const before = (await call(server, 'GET', '/status')).body.nextTrainStep;
    const res = await call(server, 'POST', '/batch', { body: JSON.stringify({ trainStep: before, compact: 'yes' }) });
    assert.deepEqual([res.status, res.body.error.code], [400, 'ERR_BAD_BODY']);
    assert.match(res.body.error.message, /compact must be true or false \(got "yes"\)/);
    assert.equal((await call(server, 'GET', '/status')).body.nextTrainStep, before);
  });
});

describe('train steps only go forward', () => {
  let engine: Engine;
  let server: ControlServer;
  before(async () => {
    engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      workers: { threads: 1 },
      producer: { strategy: 'async', maxStaleness: 100, maxSkippedSteps: 1000 },
    });
    await engine.start();
    server = await engine.listen({ port: 0, token: TOKEN });
  });
  after(() => engine.close());

  it('refuses a step before the last one handed out with 409 ERR_TRAIN_STEP, delivers the last again, and goes on producing (regression: async production hung)', async () => {
    const take = (trainStep: number) => call(server, 'POST', '/batch', { body: JSON.stringify({ trainStep }) });
    const ids = (res: Awaited<ReturnType<typeof take>>) => (res.body.groups as { id: string }[]).map((g) => g.id);
    assert.equal((await take(1)).body.status, 'NORMAL');
    const second = await take(3); // a trainer may skip a step
    assert.equal(second.body.status, 'NORMAL');
    for (const step of [1, 2]) {
      const refused = await take(step);
      assert.equal(refused.status, 409);
      assert.equal(refused.body.error.code, 'ERR_TRAIN_STEP');
      assert.equal(
        refused.body.error.message,
        `train step ${step} is behind the consumer, which is at step 4: steps only go forward; the last batch handed out, step 3, is delivered again when asked for`,
      );
    }
    await assert.rejects(engine.getBatch(2), { code: 'ERR_TRAIN_STEP' });
    assert.deepEqual(ids(await take(3)), ids(second), 'the last step is delivered again');
    const status = await call(server, 'GET', '/status');
    assert.equal(status.body.nextTrainStep, 4, 'a refused step does not move the consumer back');
    const next = await call(server, 'POST', '/batch', { body: '{}' });
    assert.deepEqual([next.body.trainStep, next.body.status], [4, 'NORMAL']);
  });

  it('refuses a step behind one that was asked for but expired, so the consumer never moves back', async () => {
    const expired = await call(server, 'POST', '/batch', { body: JSON.stringify({ trainStep: 300 }) }); // model step 0, maxStaleness 100
    assert.equal(expired.body.status, 'EXPIRED_BATCH');
    const behind = await call(server, 'POST', '/batch', { body: JSON.stringify({ trainStep: 250 }) });
    assert.deepEqual([behind.status, behind.body.error.code], [409, 'ERR_TRAIN_STEP']);
    assert.match(behind.body.error.message, /train step 250 is behind the consumer, which is at step 300/);
    await call(server, 'POST', '/pause');
    await call(server, 'POST', '/resume', { body: JSON.stringify({ modelStep: 299 }) });
    const taken = await call(server, 'POST', '/batch', { body: JSON.stringify({ trainStep: 300 }) });
    assert.deepEqual([taken.body.trainStep, taken.body.status], [300, 'NORMAL']);
  });
});

describe('train steps move a bounded distance ahead', () => {
  let engine: Engine;
  let server: ControlServer;
  let runDir: string;
  before(async () => {
    runDir = mkdtempSync(join(tmpdir(), 'rollout-api-'));
    engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      workers: { threads: 1 },
      runDir,
      producer: { maxSkippedSteps: 5 },
    });
    await engine.start();
    server = await engine.listen({ port: 0, token: TOKEN });
  });
  after(() => engine.close());

  it('refuses a train step of 2^31 − 1 with 409 naming producer.maxSkippedSteps, so real steps go on (regression: it was checkpointed and every real step got 409, restart included)', async () => {
    const take = (trainStep: number) => call(server, 'POST', '/batch', { body: JSON.stringify({ trainStep }) });
    assert.equal((await take(1)).body.status, 'NORMAL');
    const far = await take(2147483647);
    assert.deepEqual([far.status, far.body.error.code], [409, 'ERR_TRAIN_STEP']);
    assert.equal(
      far.body.error.message,
      'train step 2147483647 is too far ahead of the consumer, which is at step 2: at most producer.maxSkippedSteps (5) steps may be skipped, so the step must be at most 7',
    );
    await assert.rejects(engine.getBatch(8), { code: 'ERR_TRAIN_STEP' }, 'the library refuses it too');
    assert.equal((await call(server, 'GET', '/status')).body.nextTrainStep, 2, 'the consumer did not move');
    assert.equal(
      readCheckpoint(join(runDir, 'engine.ckpt'), engine.config).progress.nextTrainStep,
      2,
      'the checkpoint does not carry it',
    );
    assert.deepEqual(
      [(await take(2)).body.status, (await take(7)).body.status],
      ['NORMAL', 'NORMAL'],
      'the next step, and one skipping the most allowed, are taken',
    );
  });
});

describe('control API', () => {
  let engine: Engine;
  let server: ControlServer;
  before(async () => {
    engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      workers: { threads: 1 },
      producer: { strategy: 'async', maxStaleness: 1 },
    });
    await engine.start();
    server = await engine.listen({
      port: 0,
      token: TOKEN,
      maxBodyBytes: 1024,
      checkpointDir: mkdtempSync(join(tmpdir(), 'rollout-api-')),
    });
  });
  after(() => engine.close());

  it('answers /health without a token and binds to loopback by default', async () => {
    const res = await call(server, 'GET', '/health', { token: null });
    assert.deepEqual([res.status, res.body], [200, { status: 'ok' }]);
    assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+$/);
  });

  it('refuses every other route without the right bearer token (401, stable code)', async () => {
    for (const token of [null, 'wrong', `${TOKEN}x`]) {
      const res = await call(server, 'GET', '/status', { token });
      assert.equal(res.status, 401);
      assert.equal(res.body.error.code, 'ERR_UNAUTHORIZED');
    }
    assert.equal((await call(server, 'GET', '/metrics', { token: null })).status, 401);
  });

  it('reports status: model step, train step, in flight, counts per status, paused', async () => {
    const res = await call(server, 'GET', '/status');
    assert.equal(res.status, 200);
    for (const key of ['modelStep', 'nextTrainStep', 'paused', 'groups', 'buffer', 'llmUrl'])
      assert.ok(key in res.body, key);
    assert.equal(typeof res.body.groups.inFlight, 'number');
    assert.ok('COMPLETED' in res.body.groups.landed);
  });

  it('hands out a batch as JSON, and as msgpack with token ids as raw int32 bytes', async () => {
    const json = await call(server, 'POST', '/batch', { body: JSON.stringify({ trainStep: 1 }) });
    assert.equal(json.status, 200);
    assert.equal(json.body.status, 'NORMAL');
    assert.equal(json.body.groups.length, 2);
    assert.ok(Array.isArray(json.body.groups[0].rollouts[0].turns[0].responseIds));
    await call(server, 'POST', '/pause');
    await call(server, 'POST', '/resume', { body: JSON.stringify({ modelStep: 1 }) });
    const packed = await call(server, 'POST', '/batch', {
      body: JSON.stringify({ trainStep: 2 }),
      headers: { accept: 'application/msgpack' },
    });
    assert.equal(packed.status, 200);
    assert.equal(packed.body.status, 'NORMAL');
    const turn = packed.body.groups[0].rollouts[0].turns[0];
    assert.ok(turn.responseIds instanceof Uint8Array);
    const ids = new Int32Array(
      turn.responseIds.buffer.slice(
        turn.responseIds.byteOffset,
        turn.responseIds.byteOffset + turn.responseIds.byteLength,
      ),
    );
    assert.ok(ids.length > 0 && ids.every((id) => id >= 0));
  });

  it('answers a take while paused with UPDATE_WEIGHT_AND_ABORT, and an expired step with EXPIRED_BATCH', async () => {
    const pause = await call(server, 'POST', '/pause');
    assert.equal(pause.status, 200);
    assert.equal(typeof pause.body.allBackMs, 'number');
    assert.equal((await call(server, 'GET', '/status')).body.paused, true);
    const during = await call(server, 'POST', '/batch', { body: '{}' });
    assert.deepEqual([during.status, during.body.status, during.body.groups], [200, 'UPDATE_WEIGHT_AND_ABORT', []]);
    await call(server, 'POST', '/resume', { body: JSON.stringify({ modelStep: 1 }) });
    const expired = await call(server, 'POST', '/batch', { body: JSON.stringify({ trainStep: 9 }) });
    assert.deepEqual([expired.status, expired.body.status], [200, 'EXPIRED_BATCH']);
  });

  it('rejects malformed bodies with the field and value named', async () => {
    const notJson = await call(server, 'POST', '/resume', { body: '{"modelStep": ' });
    assert.deepEqual([notJson.status, notJson.body.error.code], [400, 'ERR_BAD_BODY']);
    const badField = await call(server, 'POST', '/resume', { body: JSON.stringify({ modelStep: 'two' }) });
    assert.equal(badField.status, 400);
    assert.match(badField.body.error.message, /modelStep must be an integer in \[0, 2147483647\] \(got "two"\)/);
    const older = await call(server, 'POST', '/resume', { body: JSON.stringify({ modelStep: 0 }) });
    assert.deepEqual([older.status, older.body.error.code], [400, 'ERR_INVALID_ARGUMENT']);
    const array = await call(server, 'POST', '/batch', { body: '[1]' });
    assert.equal(array.status, 400);
    const badStep = await call(server, 'POST', '/batch', { body: JSON.stringify({ trainStep: 0 }) });
    assert.match(badStep.body.error.message, /trainStep must be an integer in \[1, 2147483647\] \(got 0\)/);
    const noPath = await call(server, 'POST', '/checkpoint', { body: '{}' });
    assert.match(noPath.body.error.message, /path must be a non-empty string/);
    const nullBody = await call(server, 'POST', '/batch', { body: 'null' });
    assert.match(nullBody.body.error.message, /body must be an object \(got null\)/);
  });

  it('refuses a field a route does not take, naming it, without taking a batch (regression: {"trainstep": 5} took the next batch)', async () => {
    const before = (await call(server, 'GET', '/status')).body.groups.taken;
    const typo = await call(server, 'POST', '/batch', { body: JSON.stringify({ trainstep: 5 }) });
    assert.equal(typo.status, 400);
    assert.equal(typo.body.error.message, 'unknown field "trainstep" (POST /batch takes trainStep, compact)');
    const pause = await call(server, 'POST', '/pause', { body: JSON.stringify({ now: true }) });
    assert.equal(pause.body.error.message, 'unknown field "now" (POST /pause takes no fields)');
    assert.equal((await call(server, 'GET', '/status')).body.groups.taken, before);
  });

  it('refuses an oversized body with 413', async () => {
    const res = await call(server, 'POST', '/batch', {
      body: JSON.stringify({ trainStep: 3, padding: 'x'.repeat(4096) }),
    });
    assert.deepEqual([res.status, res.body.error.code], [413, 'ERR_BODY_TOO_LARGE']);
  });

  it('writes a checkpoint, and answers unknown routes and methods with 404 and 405', async () => {
    const res = await call(server, 'POST', '/checkpoint', { body: JSON.stringify({ path: 'run.ckpt' }) });
    assert.equal(res.status, 200);
    assert.ok(res.body.bytes > 0);
    assert.equal((await call(server, 'GET', '/nope')).body.error.code, 'ERR_NOT_FOUND');
    assert.equal((await call(server, 'GET', '/pause')).status, 405);
  });

  it('answers 429 with Retry-After once a client goes over the request rate', async () => {
    const limited = await engine.listen({ port: 0, rateLimitPerSecond: 5 });
    const statuses: number[] = [];
    for (let i = 0; i < 15; i++) statuses.push((await call(limited, 'GET', '/health', { token: null })).status);
    assert.ok(
      statuses.slice(0, 10).every((s) => s === 200),
      'a burst of twice the rate is allowed',
    );
    assert.ok(statuses.includes(429));
    const res = await call(limited, 'GET', '/health', { token: null });
    assert.equal(res.body.error.code, 'ERR_RATE_LIMITED');
  });

  it('serves Prometheus metrics: groups, latency by phase, staleness, tokens, pauses, workers', async () => {
    const res = await call(server, 'GET', '/metrics');
    assert.equal(res.status, 200);
    for (const name of [
      'rollout_engine_groups_landed_total',
      'rollout_engine_groups_taken_total',
      'rollout_engine_rollout_seconds_bucket{le="0.005",phase="inference"}',
      'rollout_engine_sample_staleness_bucket',
      'rollout_engine_tokens_total{kind="produced"}',
      'rollout_engine_pause_seconds_bucket',
      'rollout_engine_worker_rollouts_in_flight',
      'rollout_engine_worker_event_loop_delay_seconds',
      'rollout_engine_state{field="model_step"} 1',
    ]) {
      assert.ok(res.body.includes(name), `missing ${name}`);
    }
  });
});

describe('weight updates over the control API', () => {
  let engine: Engine;
  let server: ControlServer;
  before(async () => {
    engine = createEngine({ logLevel: 'silent', batchSize: 2, workers: { threads: 1 } });
    await engine.start();
    server = await engine.listen({ port: 0, token: TOKEN });
  });
  after(() => engine.close());
  const resume = (body: unknown) => call(server, 'POST', '/resume', { body: JSON.stringify(body) });

  it('refuses POST /resume without a pause with 409 naming the state, and answers a repeat of the last resume as done (regression: the model step jumped)', async () => {
    const jump = await resume({ modelStep: 5 });
    assert.deepEqual([jump.status, jump.body.error.code], [409, 'ERR_ENGINE_STATE']);
    assert.match(
      jump.body.error.message,
      /^resume without a pause: the engine is running on model step 0, not paused, so modelStep 5 is refused; pause first, load the weights, then resume$/,
    );
    assert.equal((await call(server, 'GET', '/status')).body.modelStep, 0, 'the model step did not move');
    assert.equal((await call(server, 'POST', '/pause')).status, 200);
    const resumed = await resume({ modelStep: 1, weightVersion: 'v1' });
    assert.deepEqual([resumed.status, resumed.body], [200, { resumed: true, modelStep: 1, weightVersion: 'v1' }]);
    // The trainer's retry of that resume (its answer lost): the same weights, named or not.
    assert.equal((await resume({ modelStep: 1, weightVersion: 'v1' })).status, 200);
    assert.equal((await resume({ modelStep: 1 })).status, 200);
    const renamed = await resume({ modelStep: 1, weightVersion: 'v2' });
    assert.deepEqual([renamed.status, renamed.body.error.code], [409, 'ERR_ENGINE_STATE']);
    assert.match(
      renamed.body.error.message,
      /running on model step 1 \(weightVersion "v1"\), not paused, so modelStep 1 \(weightVersion "v2"\) is refused/,
    );
    const status = (await call(server, 'GET', '/status')).body;
    assert.deepEqual([status.modelStep, status.paused], [1, false]);
  });

  it('refuses a weightVersion with NUL or a newline with 400 naming the field and the value, JSON-escaped (regression: accepted)', async () => {
    assert.equal((await call(server, 'POST', '/pause')).status, 200);
    for (const weightVersion of ['v\u00002', 'v2\nforged line', 'v2\r']) {
      const answer = await resume({ modelStep: 2, weightVersion });
      assert.deepEqual([answer.status, answer.body.error.code], [400, 'ERR_BAD_BODY'], weightVersion);
      assert.equal(
        answer.body.error.message,
        `weightVersion must hold no control characters (NUL, newlines, tabs) (got ${JSON.stringify(weightVersion)})`,
      );
    }
    // The library call is held to the same rule.
    await assert.rejects(engine.resume({ modelStep: 2, weightVersion: 'v\u00002' }), {
      code: 'ERR_INVALID_ARGUMENT',
      message: 'weightVersion must hold no control characters (NUL, newlines, tabs) (got "v\\u00002")',
    });
    assert.equal((await call(server, 'GET', '/status')).body.paused, true, 'still paused: nothing was resumed');
    assert.equal((await resume({ modelStep: 2, weightVersion: 'v2' })).status, 200);
  });
});

describe('control API security', () => {
  let engine: Engine;
  let open: ControlServer; // the default: no token
  let runDir: string;
  before(async () => {
    runDir = mkdtempSync(join(tmpdir(), 'rollout-api-'));
    engine = createEngine({ logLevel: 'silent', batchSize: 2, workers: { threads: 1 }, runDir });
    await engine.start();
    open = await engine.listen({ port: 0, allowHosts: ['rollout.internal'] });
  });
  after(() => engine.close());

  const port = () => open.port;
  const raw = async (
    server: ControlServer,
    method: string,
    path: string,
    headers: Record<string, string>,
    body?: string,
  ) => {
    const res = await request(`${server.url}${path}`, { method: method as 'GET', headers, body });
    const text = await res.body.text();
    return { status: res.statusCode, code: text.startsWith('{') ? JSON.parse(text).error?.code : undefined, text };
  };

  it('refuses a checkpoint path outside the run dir, or not a .ckpt, with 400 naming the field (regression: POST /checkpoint overwrote any file the process could write)', async () => {
    const outside = mkdtempSync(join(tmpdir(), 'rollout-outside-'));
    symlinkSync(outside, join(runDir, 'link'));
    for (const path of [
      join(outside, 'x.ckpt'),
      '../x.ckpt',
      'steps/../../x.ckpt',
      'link/x.ckpt',
      'batches.jsonl',
      '.rollout.lock',
      '',
      42,
    ]) {
      const res = await call(open, 'POST', '/checkpoint', { body: JSON.stringify({ path }), token: null });
      assert.deepEqual([res.status, res.body.error?.code], [400, 'ERR_BAD_BODY'], JSON.stringify(path));
      assert.match(res.body.error.message, /^path /, JSON.stringify(path));
    }
    assert.deepEqual(readdirSync(outside), [], 'nothing written outside the run dir');
    assert.equal(existsSync(join(runDir, 'batches.jsonl')), false);
    const ok = await call(open, 'POST', '/checkpoint', {
      body: JSON.stringify({ path: 'manual/one.ckpt' }),
      token: null,
    });
    assert.deepEqual([ok.status, ok.body.path], [200, join(realpathSync(runDir), 'manual', 'one.ckpt')]);
    assert.ok(statSync(ok.body.path).size > 0);
  });

  it('refuses every checkpoint path when the server has no run dir to keep them in', async () => {
    const bare = createEngine({ logLevel: 'silent', batchSize: 2, workers: { threads: 1 } });
    await bare.start();
    try {
      const server = await bare.listen({ port: 0 });
      const res = await call(server, 'POST', '/checkpoint', { body: JSON.stringify({ path: 'x.ckpt' }), token: null });
      assert.deepEqual([res.status, res.body.error.code], [400, 'ERR_BAD_BODY']);
      assert.match(res.body.error.message, /^path "x\.ckpt" cannot be written: this server has no run dir/);
    } finally {
      await bare.close();
    }
  });

  it('refuses text/plain, form and untyped bodies with 415 and acts on none (regression: a cross-site simple request body was parsed as JSON)', async () => {
    const taken = (await engine.stats()).groups.taken;
    for (const type of [
      'text/plain',
      'text/plain;charset=UTF-8',
      'application/x-www-form-urlencoded',
      'multipart/form-data; boundary=x',
    ]) {
      for (const [path, body] of [
        ['/pause', '{}'],
        ['/batch', '{"trainStep": 1}'],
        ['/checkpoint', '{"path": "cross.ckpt"}'],
      ] as const) {
        const res = await raw(open, 'POST', path, { 'content-type': type }, body);
        assert.deepEqual([res.status, res.code], [415, 'ERR_UNSUPPORTED_MEDIA_TYPE'], `${type} ${path}: ${res.text}`);
      }
    }
    const untyped = await raw(open, 'POST', '/batch', {}, '{"trainStep": 1}');
    assert.deepEqual([untyped.status, untyped.code], [415, 'ERR_UNSUPPORTED_MEDIA_TYPE'], untyped.text);
    assert.equal((await engine.stats()).paused, false);
    assert.equal((await engine.stats()).groups.taken, taken);
    assert.equal(existsSync(join(runDir, 'cross.ckpt')), false);
    const packed = await raw(open, 'POST', '/checkpoint', { 'content-type': 'application/x-msgpack' }, undefined);
    assert.equal(packed.status, 400, 'an empty body with a msgpack type is read (and lacks its path)');
    const x = await request(`${open.url}/checkpoint`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-msgpack' },
      body: Buffer.from(encodeForPeer({ path: 'packed.ckpt' })),
    });
    assert.equal(x.statusCode, 200, await x.body.text());
    const bodiless = await raw(open, 'GET', '/status', {});
    assert.equal(bodiless.status, 200, 'a request without a body needs no content type');
  });

  it('refuses a Host that is not loopback, the bound host or an allowed one with 403 (regression: a DNS-rebound page reached the API)', async () => {
    for (const host of [
      `attacker.example:${port()}`,
      'attacker.example',
      `127.0.0.1.attacker.example:${port()}`,
      `localhost@attacker.example`,
      '',
    ]) {
      for (const path of ['/health', '/status']) {
        const res = await raw(open, 'GET', path, { host });
        assert.deepEqual([res.status, res.code], [403, 'ERR_FORBIDDEN_HOST'], `${host} ${path}: ${res.text}`);
        assert.doesNotMatch(
          res.text,
          /rollout\.internal|\[::1\]/,
          'a rebound page reads the answer: it names no allowed host',
        );
      }
    }
    for (const host of [
      `localhost:${port()}`,
      `127.0.0.1:${port()}`,
      `[::1]:${port()}`,
      'LOCALHOST:9000',
      `rollout.internal:${port()}`,
      'rollout.internal',
    ]) {
      assert.equal((await raw(open, 'GET', '/status', { host })).status, 200, host);
    }
  });

  it('refuses a request from a web page on another origin with 403, the same host on another port included (regression: a cross-site request drove the API with no token)', async () => {
    const host = `localhost:${port()}`;
    for (const origin of [
      'http://attacker.example',
      `http://attacker.example:${port()}`,
      'http://localhost:3000',
      'null',
      'file://',
      'chrome-extension://abc',
    ]) {
      const res = await raw(open, 'POST', '/pause', { host, origin, 'content-type': 'application/json' }, '{}');
      assert.deepEqual([res.status, res.code], [403, 'ERR_FORBIDDEN_ORIGIN'], `${origin}: ${res.text}`);
    }
    assert.equal((await engine.stats()).paused, false);
    for (const origin of [`http://localhost:${port()}`, 'https://rollout.internal']) {
      assert.equal((await raw(open, 'GET', '/status', { host, origin })).status, 200, origin);
    }
  });

  it('answers a flood without the token with 401 and keeps the trainer under its rate (regression: unauthenticated requests pushed the trainer into 429s)', async () => {
    const guarded = await engine.listen({ port: 0, token: TOKEN, rateLimitPerSecond: 2 });
    const flood = await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        call(guarded, 'GET', i % 2 === 0 ? '/status' : '/health', { token: i % 4 === 0 ? 'wrong' : null }),
      ),
    );
    assert.ok(
      flood.every((r) => r.status === 401 || (r.status === 200 && r.body.status === 'ok')),
      'refused 401, or /health answered, never 429',
    );
    const trainer = [];
    for (let i = 0; i < 4; i++) trainer.push((await call(guarded, 'GET', '/status')).status);
    assert.deepEqual(trainer, [200, 200, 200, 200], "a burst of twice the rate is the trainer's");
    assert.equal((await call(guarded, 'GET', '/status')).status, 429, 'and its own requests still count');
  });
});

describe('rollout serve: access', () => {
  it('generates a token, says it once and requires it when serve binds beyond loopback without one (regression: --host 0.0.0.0 served the engine to anyone who reached the port)', async () => {
    for (const host of ['0.0.0.0', '::', '10.1.2.3', 'rollout.example']) {
      const { token, notice } = controlToken(host, null);
      assert.match(token ?? '', /^[\w-]{43}$/, host);
      assert.ok(
        notice?.includes(`--host ${host} reaches beyond loopback`) && notice.includes(`Authorization: Bearer ${token}`),
        notice ?? host,
      );
      assert.notEqual(controlToken(host, '').token, token, 'an empty token is none, and each is new');
    }
    for (const host of ['127.0.0.1', '127.0.0.2', 'localhost', '::1', '::ffff:127.0.0.1'])
      assert.deepEqual(controlToken(host, null), { token: null, notice: null }, host);
    assert.deepEqual(controlToken('0.0.0.0', 'given'), { token: 'given', notice: null });
    // The token it makes is what the server then requires.
    const engine = createEngine({ logLevel: 'silent', batchSize: 2, workers: { threads: 1 } });
    await engine.start();
    try {
      const { token } = controlToken('0.0.0.0', null);
      const server = await engine.listen({ port: 0, token });
      assert.equal((await call(server, 'GET', '/status', { token: null })).status, 401);
      assert.equal((await call(server, 'GET', '/status', { token })).status, 200);
    } finally {
      await engine.close();
    }
  });

  it('answers to an --allow-host name and writes checkpoints in its run dir, and refuses a malformed --allow-host', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-serve-'));
    const serve = await spawnServer(
      process.execPath,
      [
        '--import',
        'tsx',
        CLI_MAIN,
        'serve',
        '--port',
        '0',
        '--threads',
        '1',
        '--batch-size',
        '2',
        '--run-dir',
        runDir,
        '--allow-host',
        'rollout.internal',
      ],
      /control API listening on (http:\/\/\S+)/,
    );
    try {
      const get = async (host: string) => (await request(`${serve.url}/status`, { headers: { host } })).statusCode;
      assert.deepEqual([await get('rollout.internal:443'), await get('attacker.example')], [200, 403]);
      const res = await request(`${serve.url}/checkpoint`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ path: 'manual.ckpt' }),
      });
      assert.equal(res.statusCode, 200, await res.body.text());
      assert.ok(existsSync(join(runDir, 'manual.ckpt')));
    } finally {
      assert.equal((await serve.stop()).code, 0, serve.output());
    }
    const bad = await rollout(['serve', '--port', '0', '--allow-host', 'http://rollout.internal:80']);
    assert.equal(bad.code, 2);
    assert.match(
      bad.stderr,
      /--allow-host must be a host name or an IP address, without a scheme or port \(got "http:\/\/rollout\.internal:80"\)/,
    );
  });
});

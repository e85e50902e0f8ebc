/**
 * verifiers env-serve v1 (src/env/verifiers.ts over src/env/zmtp.ts) against a TypeScript double of
 * a verifiers env server (test/fixtures/verifiers-server.ts, built from verifiers @a60a606e): the
 * request is the one verifiers' own client sends, the environment's model calls go through the
 * base_url it is given (the engine's gateway), its episode comes back as the rollout's reward, and
 * every fault mode fails with its code and kind.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { resolveConfig } from '../src/config.ts';
import { failureKindOf } from '../src/domain/failure.ts';
import { createEnv } from '../src/env/synthetic/guess-number.ts';
import {
  createVerifiersEnvironments,
  VERIFIERS_API_KEY_VAR,
  type VerifiersEnvironments,
  type VerifiersRunSettings,
} from '../src/env/verifiers.ts';
import { encodeMessage, greeting } from '../src/env/zmtp.ts';
import { ConfigError } from '../src/errors.ts';
import { createEngine, Status, type Engine } from '../src/index.ts';
import { rollout } from './support/cli.ts';
import { startVerifiersDouble, type VerifiersDouble } from './fixtures/verifiers-server.ts';

async function rejection(promise: Promise<unknown>): Promise<Error & { code?: string }> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof Error, `expected an Error, got ${String(err)}`);
    return err;
  }
  assert.fail('expected the call to fail');
}

/** The reward the built-in game gives for these replies, and whether it ended by the turn limit. */
function replay(taskData: Record<string, unknown>, replies: string[]): { reward: number; truncated: boolean } {
  const env = createEnv();
  const { idx: _idx, ...params } = taskData;
  env.reset({ seed: Number(taskData.idx ?? 0), params });
  let reward = 0;
  let truncated = false;
  for (const reply of replies) {
    const step = env.step(reply);
    reward += step.reward as number;
    truncated = step.truncated;
  }
  return { reward, truncated };
}

/** A chat-completions server playing binary search on the game's feedback (a stand-in for the gateway). */
async function startPlayer(): Promise<{ url: string; close(): Promise<void> }> {
  const server: Server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      const { messages } = JSON.parse(body) as { messages: { role: string; content: string }[] };
      let lo = 1;
      let hi = 100;
      let last = 0;
      for (const m of messages) {
        if (m.role === 'assistant') last = Number(/\d+/.exec(m.content)?.[0] ?? 0);
        if (m.role === 'user' && m.content.startsWith('Too low')) lo = last + 1;
        if (m.role === 'user' && m.content.startsWith('Too high')) hi = last - 1;
      }
      const text = JSON.stringify({
        choices: [
          { index: 0, message: { role: 'assistant', content: `${Math.floor((lo + hi) / 2)}` }, finish_reason: 'stop' },
        ],
        usage: { prompt_tokens: 10, completion_tokens: 1 },
      });
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(text);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1/sessions/s1`,
    close: () => new Promise((r) => server.close(() => r())),
  };
}

const RUN: VerifiersRunSettings = { model: 'policy', sampling: { temperature: 0.7, max_tokens: 64 }, timeoutMs: 5_000 };

describe('verifiers env-serve v1 (a double of verifiers @a60a606e)', { timeout: 120_000 }, () => {
  const cleanups: (() => Promise<unknown>)[] = [];
  after(async () => {
    for (const cleanup of cleanups.reverse()) await cleanup();
  });
  async function double(): Promise<VerifiersDouble> {
    const d = await startVerifiersDouble();
    cleanups.push(() => d.close());
    return d;
  }
  function client(urls: string[], overrides: { timeoutMs?: number } = {}): VerifiersEnvironments {
    const envs = createVerifiersEnvironments({
      urls,
      name: 'guess-number',
      timeoutMs: overrides.timeoutMs ?? 2_000,
      retries: 0,
      retryBackoffMs: 0,
      maxResponseBytes: 1 << 20,
      dedupeSteps: false,
      protocol: 'verifiers',
    });
    cleanups.unshift(() => envs.close());
    return envs;
  }
  let player: { url: string; close(): Promise<void> } | null = null;
  async function baseURL(): Promise<string> {
    if (player === null) {
      player = await startPlayer();
      const p = player;
      cleanups.push(() => p.close());
    }
    return player.url;
  }

  it('runs an episode with the request verifiers’ own client sends, and takes Σ score × weight as the reward', async () => {
    const d = await double();
    const envs = client([d.url]);
    await envs.prewarm();
    const url = await baseURL();
    const result = await envs.run({ baseURL: url, params: { target: 71 }, signal: new AbortController().signal }, RUN);
    const [played] = d.episodes;
    assert.deepEqual(played.taskData, { target: 71 });
    assert.deepEqual(played.request.client, {
      type: 'eval',
      base_url: url,
      api_key_var: VERIFIERS_API_KEY_VAR,
      headers: {},
    });
    assert.equal(played.request.model, 'policy');
    assert.deepEqual(played.request.sampling, { temperature: 0.7, max_tokens: 64 });
    assert.equal(played.headers[0].authorization, 'Bearer EMPTY', 'no API key travels; the server’s variable is unset');
    assert.equal(result.reward, replay({ target: 71 }, played.replies).reward);
    assert.ok(result.reward > 0.5, 'binary search wins');
    assert.equal(result.truncated, false);
    assert.equal(d.running(), 0);
  });

  it('derives truncation from the trace’s stop condition (max_turns), as Trace.is_truncated does', async () => {
    const d = await double();
    const envs = client([d.url]);
    // A range binary search cannot finish in 8 guesses.
    const result = await envs.run(
      {
        baseURL: await baseURL(),
        params: { min: 1, max: 100_000, target: 99_999 },
        signal: new AbortController().signal,
      },
      RUN,
    );
    assert.equal(result.truncated, true);
    assert.equal(result.reward, replay({ min: 1, max: 100_000, target: 99_999 }, d.episodes[0].replies).reward);
  });

  it('maps success:false to ERR_ENV_INFRA (infrastructure), a refused task_data to ERR_ENV_REFUSED and ok:false to ERR_ENV_EPISODE (the environment’s)', async () => {
    const d = await double();
    const envs = client([d.url]);
    const input = { baseURL: await baseURL(), params: { target: 3 }, signal: new AbortController().signal };
    d.faults.push('fail');
    const infra = await rejection(envs.run(input, RUN));
    assert.equal(infra.code, 'ERR_ENV_INFRA');
    assert.match(infra.message, /run failed: RuntimeError: sandbox process died \(exit 137\)$/);
    assert.equal(failureKindOf(infra), 'infrastructure');

    const refused = await rejection(envs.run({ ...input, params: { question: 'x' } }, RUN));
    assert.equal(refused.code, 'ERR_ENV_REFUSED');
    assert.match(refused.message, /ValidationError: 1 validation error for GuessTaskData\nquestion: Extra inputs/);
    assert.equal(failureKindOf(refused), 'environment');

    d.faults.push('episode-error');
    const episode = await rejection(envs.run(input, RUN));
    assert.equal(episode.code, 'ERR_ENV_EPISODE');
    assert.match(episode.message, /the episode failed \(ok: false\): SandboxError: judge unavailable/);
    assert.equal(failureKindOf(episode), 'environment');
  });

  it('fails a dropped connection as ERR_ENV_INFRA, and opens a new one for the next episode', async () => {
    const d = await double();
    const envs = client([d.url]);
    const input = { baseURL: await baseURL(), params: { target: 3 }, signal: new AbortController().signal };
    d.faults.push('drop');
    const dropped = await rejection(envs.run(input, RUN));
    assert.equal(dropped.code, 'ERR_ENV_INFRA');
    assert.match(dropped.message, /connection lost or refused/);
    assert.equal(failureKindOf(dropped), 'infrastructure');
    assert.ok((await envs.run(input, RUN)).reward > 0);

    const refused = await rejection(client(['tcp://127.0.0.1:9']).prewarm());
    assert.equal(refused.code, 'ERR_ENV_INFRA');
    assert.match(refused.message, /^verifiers env server tcp:\/\/127\.0\.0\.1:9: connection lost or refused/);
  });

  it('reads a reply that is not msgpack, or bytes that are not a ZMTP frame, as ERR_ENV_BAD_REPLY (parse)', async () => {
    const d = await double();
    const envs = client([d.url]);
    const input = { baseURL: await baseURL(), params: { target: 3 }, signal: new AbortController().signal };
    d.faults.push('malformed');
    const malformed = await rejection(envs.run(input, RUN));
    assert.equal(malformed.code, 'ERR_ENV_BAD_REPLY');
    assert.match(malformed.message, /run: the reply is not msgpack/);
    assert.equal(failureKindOf(malformed), 'parse');
    d.faults.push('bad-frame');
    const frame = await rejection(envs.run(input, RUN));
    assert.equal(frame.code, 'ERR_ENV_BAD_REPLY');
    assert.match(frame.message, /malformed frame \(flags 0xf0\)/);
  });

  it('bounds a run that hangs by env.timeoutMs (ERR_ENV_TIMEOUT) and tells the server to cancel it', async () => {
    const d = await double();
    const envs = client([d.url]);
    d.faults.push('hang');
    const started = Date.now();
    const err = await rejection(
      envs.run(
        { baseURL: await baseURL(), params: { target: 3 }, signal: new AbortController().signal },
        {
          ...RUN,
          timeoutMs: 300,
        },
      ),
    );
    assert.equal(err.code, 'ERR_ENV_TIMEOUT');
    assert.equal(failureKindOf(err), 'timeout');
    assert.ok(Date.now() - started < 10_000, 'bounded by the 300 ms timeout, not hung');
    while (d.cancels.length === 0) await new Promise((r) => setTimeout(r, 5));
    assert.deepEqual(
      d.cancels.map((c) => c.cancelled),
      [true],
    );
    while (d.running() > 0) await new Promise((r) => setTimeout(r, 5));
  });

  it('cancels an episode mid-way when the engine pauses (ERR_ENV_CANCELLED), and on close (ERR_ENV_CLOSED)', async () => {
    const d = await double();
    // Each model call waits 2 s first: the pause lands mid-episode however busy the machine is.
    d.slowMs = 2_000;
    const envs = client([d.url]);
    const pause = new AbortController();
    d.faults.push('slow');
    const run = rejection(envs.run({ baseURL: await baseURL(), params: { target: 3 }, signal: pause.signal }, RUN));
    while (d.running() === 0) await new Promise((r) => setTimeout(r, 5));
    pause.abort();
    const err = await run;
    assert.equal(err.code, 'ERR_ENV_CANCELLED');
    while (d.cancels.length === 0) await new Promise((r) => setTimeout(r, 5));
    assert.equal(d.cancels[0].cancelled, true, 'the server found the live run and aborted it');
    while (d.running() > 0) await new Promise((r) => setTimeout(r, 5));
    assert.equal(d.episodes.length, 0, 'the episode never finished');

    d.faults.push('hang');
    const pending = rejection(
      envs.run({ baseURL: await baseURL(), params: { target: 3 }, signal: new AbortController().signal }, RUN),
    );
    while (d.running() === 0) await new Promise((r) => setTimeout(r, 5));
    await envs.close();
    const closed = await pending;
    assert.equal(closed.code, 'ERR_ENV_CLOSED');
    while (d.cancels.length < 2) await new Promise((r) => setTimeout(r, 5));
    assert.equal(d.cancels[1].cancelled, true);
  });

  it('speaks ZMTP 3 as libzmq does: the greeting, READY with Socket-Type, and a reply of the wrong frame count is refused', async () => {
    const g = greeting();
    assert.equal(g.length, 64);
    assert.equal(g.subarray(0, 12).toString('hex'), 'ff00000000000000007f0300');
    assert.equal(g.subarray(12, 32).toString('ascii').replace(/\0+$/, ''), 'NULL');
    assert.equal(
      encodeMessage([Buffer.from('ab'), Buffer.alloc(300)])
        .subarray(0, 13)
        .toString('hex'),
      '0102616202000000000000012c',
      'MORE on the first frame; the 300-byte one LONG',
    );
    const d = await double();
    const { connectDealer } = await import('../src/env/zmtp.ts');
    const got: Buffer[][] = [];
    const peer = await connectDealer(d.url, {
      timeoutMs: 1_000,
      maxFrameBytes: 1 << 20,
      onMessage: (p) => got.push(p),
    });
    peer.send([Buffer.from('only-two'), Buffer.from([0x80])]);
    peer.send([Buffer.from('h1'), Buffer.from('health'), Buffer.from([0x80])]);
    while (got.length === 0) await new Promise((r) => setTimeout(r, 5));
    assert.equal(got[0][0].toString(), 'h1', 'the 2-frame message was dropped without a reply');
    assert.equal(d.dropped, 1);
    peer.close();
  });

  it('refuses in the config a tcp:// URL for another protocol, an http URL for verifiers, params and an agent', () => {
    const problems = (env: object, extra: object = {}): string => {
      try {
        resolveConfig({ tasks: [{ name: 'v', env, ...extra }] });
      } catch (err) {
        assert.ok(err instanceof ConfigError);
        return err.message;
      }
      assert.fail('expected a config error');
    };
    assert.match(
      problems({ protocol: 'verifiers', http: { urls: ['http://127.0.0.1:5000'], name: 'g' } }),
      /tasks\[0\]\.env\.http\.urls\[0\]: a verifiers env server is reached over ZMQ: give tcp:\/\/host:port/,
    );
    assert.match(
      problems({ protocol: 'rollout', http: { urls: ['tcp://127.0.0.1:5000'], name: 'g' } }),
      /tasks\[0\]\.env\.http\.urls\[0\]: a tcp:\/\/ address is for env\.protocol "verifiers"/,
    );
    assert.match(
      problems({ protocol: 'verifiers', http: { urls: ['tcp://127.0.0.1:5000'], name: 'g' }, params: { a: 1 } }),
      /tasks\[0\]\.env\.params: a verifiers server's run takes the dataset line as task_data/,
    );
    assert.match(
      problems(
        { protocol: 'verifiers', http: { urls: ['tcp://127.0.0.1:5000'], name: 'g' } },
        { agent: { module: 'x.ts' } },
      ),
      /tasks\[0\]\.agent: a verifiers env server runs the episode itself/,
    );
    const ok = resolveConfig({
      tasks: [{ name: 'v', env: { protocol: 'verifiers', http: { urls: ['tcp://127.0.0.1:5000'], name: 'g' } } }],
    });
    assert.equal(ok.tasks[0].env?.protocol, 'verifiers');
  });

  it('runs a verifiers task in the engine: the model calls go through the gateway, its tokens are the turns, the episode’s reward the rollout’s', async () => {
    const d = await double();
    const dir = mkdtempSync(join(tmpdir(), 'verifiers-ds-'));
    writeFileSync(join(dir, 'tasks.jsonl'), '{"target": 12}\n{"target": 88}\n');
    const engine: Engine = createEngine({
      logLevel: 'silent',
      seed: 5,
      batchSize: 4,
      workers: { threads: 1 },
      tasks: [
        {
          name: 'vf-guess',
          dataset: join(dir, 'tasks.jsonl'),
          groupSize: 2,
          maxTokens: 48,
          env: { protocol: 'verifiers', http: { urls: [d.url], name: 'guess-number' }, timeoutMs: 60_000 },
        },
      ],
    });
    cleanups.push(() => engine.close());
    await engine.start();
    const batch = await engine.getBatch();
    const rollouts = batch.groups.flatMap((g) => g.rollouts);
    assert.equal(rollouts.length, batch.groups.length * 2);
    assert.ok(rollouts.length >= 4);
    for (const r of rollouts) {
      assert.equal(r.status, Status.COMPLETED, r.error ?? '');
      const played = d.episodes.find((e) =>
        (e.request.client as { base_url: string }).base_url.includes(encodeURIComponent(`${r.id}#`)),
      );
      assert.ok(played, `the server played rollout ${r.id} through its own gateway session`);
      assert.deepEqual(played.taskData, r.sample.envParams, 'task_data is the drawn dataset line');
      assert.equal(r.turns.length, played.replies.length, 'one turn per model call of the environment');
      const expected = replay(played.taskData, played.replies);
      assert.equal(r.reward, expected.reward, 'the rollout’s reward is the episode’s');
      assert.equal(r.truncated, expected.truncated);
      const s = r.stitched!;
      assert.equal(s.actionRanges.length, r.turns.length);
      r.turns.forEach((turn, i) => {
        const [start, end] = s.actionRanges[i];
        assert.deepEqual([...s.observationTokens.subarray(start, end)], [...turn.responseIds!]);
        assert.ok(turn.logprobs!.length === turn.responseIds!.length);
      });
      assert.equal(played.request.model, engine.config.llm.model);
      assert.deepEqual(played.request.sampling, { temperature: 1, max_tokens: 48 });
    }
  });

  it('`rollout run --config` runs a task on a verifiers env server from the documented config', async () => {
    const d = await double();
    const dir = mkdtempSync(join(tmpdir(), 'rollout-verifiers-'));
    writeFileSync(join(dir, 'tasks.jsonl'), '{"target": 40}\n{"target": 7}\n');
    const config = join(dir, 'verifiers.json');
    // docs/ENVIRONMENTS.md, "verifiers", with the double's address.
    writeFileSync(
      config,
      JSON.stringify({
        batchSize: 4,
        tasks: [
          {
            name: 'vf-guess',
            dataset: './tasks.jsonl',
            groupSize: 2,
            env: { protocol: 'verifiers', http: { urls: [d.url], name: 'guess-number' }, timeoutMs: 600_000 },
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
    assert.ok(readFileSync(join(dir, 'batches.jsonl'), 'utf8').trim().length > 0);
    assert.ok(d.episodes.length >= 4);
  });
});

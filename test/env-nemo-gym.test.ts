/**
 * NeMo Gym resources servers through env/nemo-gym.ts, against a Node double built from NeMo Gym's
 * source (github.com/NVIDIA-NeMo/Gym at 07d6b0d07b22fcf530b4c211dae2ee23100428e4; the traits and where
 * each comes from: test/fixtures/nemo-gym-server.ts). The double hosts the engine's guess-number as a
 * NeMo Gym environment would (a `guess` tool, verify rewarding), so an episode through the adapter is
 * compared with the builtin's; every fault mode is asserted with its code and failure kind.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { resolveConfig } from '../src/config.ts';
import { failureKindOf } from '../src/domain/failure.ts';
import type { ChatMessage } from '../src/domain/rollout.ts';
import type { HttpEnvOptions } from '../src/env/http-env.ts';
import { createNemoGymEnvironments, type NemoGymEnvironment, type NemoGymEnvironments } from '../src/env/nemo-gym.ts';
import { createRemoteEnvironments } from '../src/env/remote.ts';
import { createEnv as createGuessNumber, winReward } from '../src/env/synthetic/guess-number.ts';
import { ConfigError } from '../src/errors.ts';
import { toolMessagesOf } from '../src/worker/tools.ts';
import { rollout } from './support/cli.ts';
import { scriptedServer } from './support/http.ts';
import {
  guessNumberRow,
  lookupRow,
  SERVER_NAME,
  SESSION_COOKIE,
  startNemoGymDouble,
  type NemoGymDouble,
} from './fixtures/nemo-gym-server.ts';

async function rejection(promise: Promise<unknown>): Promise<Error & { code?: string; status?: number | null }> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof Error, `expected an Error, got ${String(err)}`);
    return err;
  }
  assert.fail('expected the call to fail');
}

const NEVER = new AbortController().signal;

describe('NeMo Gym resources servers as environments (a double of NeMo Gym @07d6b0d)', { timeout: 60_000 }, () => {
  const cleanups: (() => Promise<unknown>)[] = [];
  after(async () => {
    for (const cleanup of cleanups.reverse()) await cleanup();
  });

  async function gym(): Promise<NemoGymDouble> {
    const double = await startNemoGymDouble();
    cleanups.push(async () => {
      double.release();
      await double.close();
    });
    return double;
  }
  function client(urls: string[], overrides: Partial<HttpEnvOptions> = {}): NemoGymEnvironments {
    const envs = createNemoGymEnvironments({
      urls,
      name: SERVER_NAME,
      timeoutMs: 5_000,
      retries: 2,
      retryBackoffMs: 1,
      maxResponseBytes: 1 << 20,
      dedupeSteps: false,
      protocol: 'nemo-gym',
      params: {},
      ...overrides,
    });
    cleanups.unshift(() => envs.close());
    return envs;
  }

  /** The guess tool called once per number, the exchange as the agent loop builds it (worker/tools.ts). */
  async function guessWithTool(env: NemoGymEnvironment, numbers: number[]): Promise<ChatMessage[]> {
    const messages: ChatMessage[] = [];
    for (const [i, number] of numbers.entries()) {
      const id = `call_${i}`;
      const args = JSON.stringify({ number });
      const result = await env.callTool({ id, name: 'guess', arguments: { number } }, NEVER);
      messages.push(
        ...toolMessagesOf('', [{ id, name: 'guess', arguments: args, result, error: null, source: 'env', ms: 1 }]),
      );
    }
    return messages;
  }

  it('plays a seeded guess-number episode as the builtin does: the same prompt, the same feedback, the same reward', async () => {
    const double = await gym();
    const env = client([double.url]).create();
    const builtin = createGuessNumber();
    builtin.reset({ seed: 7, params: { target: 37 } });
    await env.reset({ seed: 7, params: guessNumberRow(37) });

    assert.deepEqual(env.getTaskPrompt(), builtin.getTaskPrompt());
    assert.deepEqual(env.tools(), [
      {
        type: 'function',
        function: {
          name: 'guess',
          description: 'Guess the number: answers whether it is too low, too high or correct.',
          parameters: {
            type: 'object',
            properties: { number: { type: 'integer', description: '' } },
            required: ['number'],
            additionalProperties: false,
          },
        },
      },
    ]);
    const toolMessages = await guessWithTool(env, [50, 25]);
    const outputs = toolMessages.filter((m) => m.role === 'tool').map((m) => JSON.parse(m.content).feedback);
    assert.deepEqual(outputs, [builtin.step('50').observation, builtin.step('25').observation]);
    const last = builtin.step('My guess is 37.');
    const result = await env.step('My guess is 37.', { toolMessages });
    assert.deepEqual(
      { reward: result.reward, terminated: result.terminated, truncated: result.truncated },
      { reward: last.reward, terminated: last.terminated, truncated: last.truncated },
    );
    assert.equal(result.reward, winReward(3));
    // The episode ended: nothing more to prompt, and no more tools.
    assert.deepEqual(env.getTaskPrompt(), []);
    assert.deepEqual(env.tools(), []);
    await env.close();
  });

  it('sends seed_session the row as it is and verify the row plus a Responses object built field by field', async () => {
    const double = await gym();
    const env = client([double.url]).create();
    const row = { ...guessNumberRow(37), task_id: 'g-1' };
    await env.reset({ seed: 0, params: row });
    const toolMessages = await guessWithTool(env, [50]);
    await env.step('37', { toolMessages });

    const [seed, , verify] = double.requests;
    assert.equal(seed.route, 'seed_session');
    assert.deepEqual(seed.body, row);
    assert.equal(verify.route, 'verify');
    const { response, ...rest } = verify.body as { response: Record<string, unknown> };
    assert.deepEqual(rest, row, 'the row echoed whole, beside the response');
    const {
      id,
      created_at,
      output,
      ...fields
    }: { id?: unknown; created_at?: unknown; output?: unknown } & Record<string, unknown> = response;
    assert.match(String(id), /^resp_[0-9a-f]{32}$/);
    assert.ok(Number.isInteger(created_at) && Math.abs((created_at as number) - Date.now() / 1000) < 60);
    assert.deepEqual(fields, {
      error: null,
      incomplete_details: null,
      instructions: null,
      metadata: null,
      model: '',
      object: 'response',
      parallel_tool_calls: true,
      temperature: null,
      tool_choice: 'auto',
      tools: ((row as Record<string, unknown>).responses_create_params as { tools: unknown }).tools,
      top_p: null,
      background: null,
      max_output_tokens: null,
      max_tool_calls: null,
      previous_response_id: null,
      prompt: null,
      reasoning: null,
      service_tier: null,
      status: 'completed',
      text: null,
      top_logprobs: null,
      truncation: null,
      usage: null,
      user: null,
    });
    const items = output as Record<string, unknown>[];
    assert.deepEqual(
      items.map((o) => o.type),
      ['function_call', 'function_call_output', 'message'],
    );
    // responses_converter.py postprocess_assistant_message_dict: a tool-call-only turn has no message item.
    assert.deepEqual(items[0], {
      arguments: '{"number":50}',
      call_id: 'call_0',
      name: 'guess',
      type: 'function_call',
      id: 'call_0',
      status: 'completed',
    });
    // simple_agent: NeMoGymFunctionCallOutput(type, call_id, output), the tool's raw body.
    assert.deepEqual(items[1], {
      call_id: 'call_0',
      output: '{"feedback":"Too high."}',
      type: 'function_call_output',
      id: null,
      status: null,
    });
    const { id: messageId, ...message } = items[2];
    assert.match(String(messageId), /^msg_[0-9a-f]{32}$/);
    assert.deepEqual(message, {
      content: [{ annotations: [], text: '37', type: 'output_text', logprobs: null }],
      role: 'assistant',
      status: 'completed',
      type: 'message',
    });
  });

  it("carries one rollout's session cookie on its tool calls and verify, and gives each rollout its own", async () => {
    const double = await gym();
    const envs = client([double.url]);
    const [a, b] = [envs.create(), envs.create()];
    await Promise.all([
      a.reset({ seed: 0, params: guessNumberRow(37) }),
      b.reset({ seed: 0, params: guessNumberRow(80) }),
    ]);
    const [ta, tb] = await Promise.all([guessWithTool(a, [37]), guessWithTool(b, [37])]);
    assert.deepEqual(
      [ta, tb].map((m) => JSON.parse(m[1].content).feedback),
      ['Correct! The number was 37.', 'Too low.'],
      'each tool call ran in its own session',
    );
    const [ra, rb] = await Promise.all([a.step('37', { toolMessages: ta }), b.step('80', { toolMessages: tb })]);
    assert.deepEqual([ra.reward, rb.reward], [winReward(2), winReward(2)]);
    const seeds = double.requests.filter((r) => r.route === 'seed_session');
    assert.equal(seeds.length, 2);
    assert.ok(
      seeds.every((r) => !r.carriedSession),
      'a seed starts a session: it carries none',
    );
    assert.notEqual(seeds[0].sessionId, seeds[1].sessionId);
    for (const seed of seeds) {
      const later = double.requests.filter((r) => r.route !== 'seed_session' && r.sessionId === seed.sessionId);
      assert.deepEqual(
        later.map((r) => [r.route, r.carriedSession]),
        [
          ['guess', true],
          ['verify', true],
        ],
      );
    }
    assert.ok(SESSION_COOKIE.endsWith(`___${SERVER_NAME}`));
  });

  it('runs the tool calls of one reply one at a time, in order, as simple_agent does', async () => {
    const double = await gym();
    const env = client([double.url]).create();
    await env.reset({ seed: 0, params: guessNumberRow(37) });
    double.hang.guess = 1;
    const first = env.callTool({ id: 'c1', name: 'guess', arguments: { number: 10 } }, NEVER);
    const second = env.callTool({ id: 'c2', name: 'guess', arguments: { number: 90 } }, NEVER);
    await double.held('guess');
    assert.equal(double.requests.filter((r) => r.route === 'guess').length, 1, 'the second waits for the first');
    double.release();
    assert.deepEqual([JSON.parse(await first).feedback, JSON.parse(await second).feedback], ['Too low.', 'Too high.']);
    assert.deepEqual(
      double.requests.filter((r) => r.route === 'guess').map((r) => r.body),
      [{ number: 10 }, { number: 90 }],
    );
  });

  it("shows a tool's 500 to the model as the tool's output, as NeMo Gym does, and never sends it again", async () => {
    const double = await gym();
    const env = client([double.url]).create();
    await env.reset({ seed: 0, params: guessNumberRow(37) });
    double.fail.guess = 1;
    assert.equal(
      await env.callTool({ id: 'c', name: 'guess', arguments: { number: 3 } }, NEVER),
      '"RuntimeError(\'injected\')"',
    );
    assert.equal(double.requests.filter((r) => r.route === 'guess').length, 1);
    // A body the route refuses (FastAPI's 422) is the model's to read too.
    const refused = await env.callTool({ id: 'd', name: 'guess', arguments: { number: 'three' } }, NEVER);
    assert.equal(JSON.parse(refused).detail[0].loc.join('.'), 'body.number');
  });

  it('times out a call that hangs (ERR_ENV_TIMEOUT, kind timeout), naming the URL, the call and env.http.timeoutMs', async () => {
    const double = await gym();
    const envs = client([double.url], { timeoutMs: 300, retries: 0 });
    double.hang.seed_session = 1;
    const err = await rejection(envs.create().reset({ seed: 0, params: guessNumberRow(37) }));
    assert.equal(err.code, 'ERR_ENV_TIMEOUT');
    assert.equal(failureKindOf(err), 'timeout');
    assert.match(
      err.message,
      new RegExp(
        `POST ${double.url}/seed_session \\(seed_session\\) timed out after 300 ms \\(env\\.http\\.timeoutMs\\)`,
      ),
    );
    await double.gone('seed_session');

    const env = envs.create();
    await env.reset({ seed: 0, params: guessNumberRow(37) });
    double.hang.verify = 1;
    const late = await rejection(env.step('37'));
    assert.equal(late.code, 'ERR_ENV_TIMEOUT');
    assert.equal(failureKindOf(late), 'timeout');
  });

  it('retries a 5xx on seed_session and verify, and after the last attempt fails ERR_ENV_HTTP 500, kind infrastructure', async () => {
    const double = await gym();
    const env = client([double.url], { retries: 2 }).create();
    double.fail.seed_session = 2;
    await env.reset({ seed: 0, params: guessNumberRow(37) });
    assert.equal(double.requests.filter((r) => r.route === 'seed_session').length, 3);
    double.fail.verify = 3;
    const err = await rejection(env.step('37'));
    assert.equal(err.code, 'ERR_ENV_HTTP');
    assert.equal(err.status, 500);
    assert.equal(failureKindOf(err), 'infrastructure');
    assert.match(err.message, /POST .*\/verify \(verify\) answered 500: .*gave up after 3 attempts/);
  });

  it('reports a judge that failed (_ng_failure_class "judge_failed") as ERR_ENV_INFRA, kind infrastructure, never reward 0', async () => {
    const double = await gym();
    const env = client([double.url]).create();
    await env.reset({ seed: 0, params: guessNumberRow(37) });
    double.judgeFailure = true;
    const err = await rejection(env.step('37'));
    assert.equal(err.code, 'ERR_ENV_INFRA');
    assert.equal(failureKindOf(err), 'infrastructure');
    assert.match(
      err.message,
      /_ng_failure_class "judge_failed": ClientConnectorError: Cannot connect to host judge:8000/,
    );
  });

  it('reports mask_sample and _ng_failure_terminal as ERR_ENV_INFRA, kind infrastructure, whatever the reward', async () => {
    const double = await gym();
    const envs = client([double.url]);
    for (const fault of ['maskSample', 'failureTerminal'] as const) {
      const env = envs.create();
      await env.reset({ seed: 0, params: guessNumberRow(37) });
      double[fault] = true;
      const err = await rejection(env.step('37'));
      double[fault] = false;
      assert.equal(err.code, 'ERR_ENV_INFRA');
      assert.equal(failureKindOf(err), 'infrastructure');
      assert.match(err.message, fault === 'maskSample' ? /mask_sample true/ : /_ng_failure_terminal true/);
    }
  });

  it('fails a malformed reply with ERR_ENV_BAD_REPLY, kind parse, naming the field', async () => {
    const double = await gym();
    const envs = client([double.url]);
    double.malformed.seed_session = 1;
    const notJson = await rejection(envs.create().reset({ seed: 0, params: guessNumberRow(37) }));
    assert.equal(notJson.code, 'ERR_ENV_BAD_REPLY');
    assert.equal(failureKindOf(notJson), 'parse');
    assert.match(notJson.message, /seed_session: reply is not JSON/);
    for (const [reply, field] of [
      [{ reward: 'high' }, /reward must be a finite number \(got "high"\)/],
      [{ reward: 1, mask_sample: 'yes' }, /mask_sample must be a boolean/],
      [[1], /reply must be an object/],
    ] as const) {
      const env = envs.create();
      await env.reset({ seed: 0, params: guessNumberRow(37) });
      double.verifyReply = reply;
      const err = await rejection(env.step('37'));
      assert.equal(err.code, 'ERR_ENV_BAD_REPLY');
      assert.equal(failureKindOf(err), 'parse');
      assert.match(err.message, field);
    }
  });

  it('gives up a tool call cancelled mid-episode (ERR_ENV_CANCELLED) and drops its request at the server', async () => {
    const double = await gym();
    const env = client([double.url]).create();
    await env.reset({ seed: 0, params: guessNumberRow(37) });
    double.hang.guess = 1;
    const cancel = new AbortController();
    const call = env.callTool({ id: 'c', name: 'guess', arguments: { number: 3 } }, cancel.signal);
    await double.held('guess');
    cancel.abort();
    const err = await rejection(call);
    assert.equal(err.code, 'ERR_ENV_CANCELLED');
    await double.gone('guess');
  });

  it('fails what is pending when the episode is closed mid-verify (ERR_ENV_CLOSED, kind infrastructure)', async () => {
    const double = await gym();
    const env = client([double.url]).create();
    await env.reset({ seed: 0, params: guessNumberRow(37) });
    double.hang.verify = 1;
    const verify = env.step('37');
    await double.held('verify');
    await env.close();
    const err = await rejection(verify);
    assert.equal(err.code, 'ERR_ENV_CLOSED');
    assert.equal(failureKindOf(err), 'infrastructure');
    await double.gone('verify');
  });

  it('fails ERR_ENV_UNREACHABLE, kind infrastructure, after its retries when nothing listens', async () => {
    const double = await startNemoGymDouble();
    await double.close();
    const err = await rejection(
      client([double.url], { retries: 2 })
        .create()
        .reset({ seed: 0, params: guessNumberRow(37) }),
    );
    assert.equal(err.code, 'ERR_ENV_UNREACHABLE');
    assert.equal(failureKindOf(err), 'infrastructure');
    assert.match(err.message, /unreachable: ECONNREFUSED .*gave up after 3 attempts/);
  });

  it('prewarms with GET / and tells a server by its session cookie: another NeMo Gym server is a config error naming it', async () => {
    const double = await gym();
    await client([double.url]).prewarm();
    const wrong = await rejection(client([double.url], { name: 'math_with_judge' }).prewarm());
    assert.ok(wrong instanceof ConfigError);
    assert.match(
      wrong.message,
      /name: .* is the NeMo Gym server "guess_number" \(its session cookie "GuessNumberResourcesServer___guess_number"\), not "math_with_judge"/,
    );
    const plain = await scriptedServer((_req, res) => res.end('{"status": "ok"}'));
    cleanups.push(() => plain.close());
    const notGym = await rejection(client([plain.url]).prewarm());
    assert.equal(notGym.code, 'ERR_ENV_BAD_REPLY');
    assert.match(
      notGym.message,
      /no NeMo Gym session cookie "<server class>___guess_number" in the reply \(cookies: none\)/,
    );
  });

  it("reads a row as NeMo Gym's converter does: a string input, instructions first, developer as system, earlier calls", async () => {
    const double = await gym();
    const env = client([double.url]).create();
    const row = (create: Record<string, unknown>) => ({ responses_create_params: create, target: 1 });
    env.checkResetParams(row({ input: 'hi' }));
    await env.reset({ seed: 0, params: row({ input: 'What is 2+2?' }) });
    assert.deepEqual(env.getTaskPrompt(), [{ role: 'user', content: 'What is 2+2?' }]);
    await env.reset({
      seed: 0,
      params: row({
        instructions: 'Be brief.',
        input: [
          { role: 'developer', content: 'Use the tools.' },
          {
            role: 'user',
            content: [
              { type: 'input_text', text: 'Guess ' },
              { type: 'input_text', text: 'again.' },
            ],
          },
          { type: 'function_call', call_id: 'c0', name: 'guess', arguments: '{"number": 5}' },
          { type: 'function_call_output', call_id: 'c0', output: '{"feedback": "Too low."}' },
        ],
      }),
    });
    assert.deepEqual(env.getTaskPrompt(), [
      { role: 'system', content: 'Be brief.\n\nUse the tools.' },
      { role: 'user', content: 'Guess again.' },
      {
        role: 'assistant',
        content: '',
        tool_calls: [{ id: 'c0', type: 'function', function: { name: 'guess', arguments: '{"number": 5}' } }],
      },
      { role: 'tool', content: '{"feedback": "Too low."}', tool_call_id: 'c0' },
    ]);
    for (const [create, field] of [
      [{ input: 'x', seed: 3 }, /responses_create_params\.seed must be absent/],
      [
        { input: [{ role: 'critic', content: 'x' }] },
        /input\[0\]\.role must be one of user, system, developer, assistant/,
      ],
      [
        { input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'u' }] }] },
        /input\[0\]\.content\[0\] must be a text part/,
      ],
      [{ input: 'x', tools: [{ type: 'web_search' }] }, /tools\[0\] must be a function tool/],
      [
        { input: 'x', tools: [{ type: 'function', name: 'verify' }] },
        /tools\[0\]\.name must be not one of the server's own routes/,
      ],
    ] as const) {
      assert.throws(() => env.checkResetParams(row(create)), field);
    }
    assert.throws(
      () => env.checkResetParams({ input: 'x' }),
      /nemo-gym row: responses_create_params must be an object/,
    );
  });

  it('refuses env.params and dedupeSteps with protocol nemo-gym, naming the field', async () => {
    const task = (env: Record<string, unknown>) => ({
      tasks: [
        {
          name: 'gym',
          env: { http: { urls: ['http://127.0.0.1:1'], name: SERVER_NAME }, protocol: 'nemo-gym', ...env },
        },
      ],
    });
    const config = resolveConfig(task({}));
    const http = config.tasks[0].env!.http! as HttpEnvOptions;
    assert.equal(http.protocol, 'nemo-gym');
    const remote = createRemoteEnvironments(http);
    assert.equal(typeof remote.create().callTool, 'function', 'env/remote.ts hands nemo-gym to its client');
    await remote.close();
    assert.throws(() => resolveConfig(task({ params: { target: 3 } })), /tasks\[0\]\.env\.params: .*NeMo Gym/);
    assert.throws(
      () =>
        resolveConfig({
          tasks: [
            {
              name: 'gym',
              env: {
                http: { urls: ['http://127.0.0.1:1'], name: SERVER_NAME, dedupeSteps: true },
                protocol: 'nemo-gym',
              },
            },
          ],
        }),
      /tasks\[0\]\.env\.http\.dedupeSteps: .*no step index/,
    );
  });

  it('`rollout run` from a README config plays NeMo Gym rows on the double with the mock LLM: tool calls, verify, rewards', async () => {
    const double = await gym();
    const dir = mkdtempSync(join(tmpdir(), 'rollout-nemo-gym-'));
    writeFileSync(join(dir, 'guess.jsonl'), `${JSON.stringify(guessNumberRow(50))}\n`);
    writeFileSync(
      join(dir, 'lookup.jsonl'),
      `${JSON.stringify(lookupRow({ amber: 120, birch: 7 }, 'amber', 'birch'))}\n`,
    );
    const task = (name: string) => ({
      name,
      env: { http: { urls: [double.url], name: SERVER_NAME }, protocol: 'nemo-gym' },
      dataset: `${name}.jsonl`,
      groupSize: 2,
    });
    // A perfect mock: the rewards are then known (guess-number's bisection starts at 50).
    writeFileSync(
      join(dir, 'config.json'),
      JSON.stringify({ mock: { mistakeRate: 0 }, tasks: [task('guess'), task('lookup')] }),
    );
    const runDir = join(dir, 'run');
    const { code, stderr } = await rollout([
      'run',
      '--config',
      join(dir, 'config.json'),
      '--steps',
      '1',
      '--batch-size',
      '2',
      '--threads',
      '1',
      '--run-dir',
      runDir,
    ]);
    assert.equal(code, 0, stderr);
    type Rollout = {
      taskName: string;
      status: string;
      reward: number;
      error: string | null;
      turns: { response: string; toolCalls?: { name: string; result: string; error: string | null }[] }[];
    };
    const rollouts = readFileSync(join(runDir, 'batches.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .flatMap((l) => JSON.parse(l).rollouts) as Rollout[];
    assert.deepEqual(rollouts.map((r) => r.taskName).sort(), ['guess', 'guess', 'lookup', 'lookup']);
    for (const r of rollouts) {
      assert.equal(r.status, 'COMPLETED', r.error ?? '');
      assert.equal(r.reward, 1, `${r.taskName}: ${JSON.stringify(r.turns)}`);
    }
    for (const r of rollouts.filter((r) => r.taskName === 'lookup')) {
      const calls = r.turns.flatMap((t) => t.toolCalls ?? []);
      assert.deepEqual(
        calls.map((c) => [c.name, c.result, c.error]),
        [
          ['lookup', '120', null],
          ['lookup', '7', null],
        ],
      );
      assert.equal(r.turns.at(-1)?.response, 'The sum is 127.');
    }
    // Every verify came in the session its seed opened, with the calls as function_call items.
    const verifies = double.requests.filter((r) => r.route === 'verify');
    assert.ok(verifies.length >= 4);
    for (const v of verifies) {
      assert.ok(v.carriedSession);
      const types = (v.body as { response: { output: { type: string }[] } }).response.output.map((o) => o.type);
      const isLookup = (v.body as { store?: unknown }).store !== undefined;
      assert.deepEqual(
        types,
        isLookup
          ? ['function_call', 'function_call', 'function_call_output', 'function_call_output', 'message']
          : ['message'],
      );
    }
  });
});

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { TestContext } from 'node:test';
import { decode, encode } from 'gpt-tokenizer/encoding/cl100k_base';
import { request } from 'undici';
import { createEnv as createGuessNumber } from '../src/env/synthetic/guess-number.ts';
import { startMockLlm } from '../src/mock-llm/server.ts';
import type { MockLlm, MockLlmOptions } from '../src/mock-llm/server.ts';

interface Completion {
  choices: {
    message: { role: string; content: string };
    finish_reason: string;
    token_ids?: number[];
    logprobs: { content: { token: string; logprob: number; bytes: null; top_logprobs: unknown[] }[] } | null;
  }[];
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  metadata: { weight_version: number };
  prompt_token_ids?: number[];
}

async function start(t: TestContext, options: MockLlmOptions = {}): Promise<MockLlm> {
  const mock = await startMockLlm(options);
  t.after(() => mock.close());
  return mock;
}

async function call(
  mock: MockLlm,
  method: 'GET' | 'POST',
  path: string,
  body?: unknown,
): Promise<{ status: number; json: any }> {
  const res = await request(`${mock.url}${path}`, {
    method,
    headers: { 'content-type': 'application/json' },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: res.statusCode, json: await res.body.json() };
}

async function chat(mock: MockLlm, body: Record<string, unknown>): Promise<Completion> {
  const { status, json } = await call(mock, 'POST', '/v1/chat/completions', body);
  assert.equal(status, 200, JSON.stringify(json));
  return json as Completion;
}

interface Chunk {
  id: string;
  object: string;
  choices: {
    delta: { role?: string; content?: string };
    finish_reason: string | null;
    token_ids?: number[];
    logprobs: Completion['choices'][0]['logprobs'];
  }[];
  prompt_token_ids?: number[];
  usage?: Completion['usage'];
  metadata?: { weight_version: number };
}

/** The data of each server-sent event of a streamed completion, in order; `onEvent` sees them as they arrive. */
async function streamEvents(
  mock: MockLlm,
  body: Record<string, unknown>,
  onEvent?: (data: string) => void,
): Promise<string[]> {
  const res = await request(`${mock.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  assert.equal(res.statusCode, 200);
  assert.match(String(res.headers['content-type']), /^text\/event-stream/);
  const events: string[] = [];
  let pending = '';
  for await (const chunk of res.body) {
    pending += chunk.toString('utf8');
    let end: number;
    while ((end = pending.indexOf('\n\n')) !== -1) {
      const event = pending.slice(0, end);
      pending = pending.slice(end + 2);
      assert.ok(event.startsWith('data: '), event);
      events.push(event.slice(6));
      onEvent?.(event.slice(6));
    }
  }
  assert.equal(pending, '');
  return events;
}

const HELLO = [{ role: 'user', content: 'Say something.' }];
const GUESS_PROMPT = (() => {
  const env = createGuessNumber();
  env.reset({ seed: 1, params: {} });
  return env.getTaskPrompt();
})();

describe('mock inference server', () => {
  it('answers /health and lists the configured model on /v1/models', async (t) => {
    const mock = await start(t, { model: 'my-model' });
    assert.match(mock.url, /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.deepEqual(await call(mock, 'GET', '/health'), { status: 200, json: { status: 'ok' } });
    const models = await call(mock, 'GET', '/v1/models');
    assert.equal(models.json.object, 'list');
    assert.deepEqual(
      models.json.data.map((m: { id: string }) => m.id),
      ['my-model'],
    );
  });

  it('returns integer token ids and negative logprobs, one per completion token, matching usage', async (t) => {
    const mock = await start(t, { thinkTokens: 30 });
    const reply = await chat(mock, { model: 'x', messages: GUESS_PROMPT, return_token_ids: true, logprobs: true });
    const choice = reply.choices[0];
    const ids = choice.token_ids!;
    assert.equal(choice.finish_reason, 'stop');
    assert.ok(ids.every((id) => Number.isInteger(id) && id >= 0));
    assert.equal(ids.length, reply.usage.completion_tokens);
    assert.equal(choice.logprobs!.content.length, ids.length);
    assert.ok(choice.logprobs!.content.every((e) => e.logprob < 0 && e.bytes === null));
    assert.equal(choice.logprobs!.content.map((e) => e.token).join(''), choice.message.content);
    // Real, canonical BPE ids: they decode to the content and are what the tokenizer itself produces.
    assert.equal(decode(ids), choice.message.content);
    assert.deepEqual(encode(choice.message.content), ids);
    assert.equal(reply.prompt_token_ids!.length, reply.usage.prompt_tokens);
    assert.match(decode(reply.prompt_token_ids!), /^<\|im_start\|>system\n[\s\S]*<\|im_start\|>assistant\n$/);
    assert.equal(reply.usage.total_tokens, reply.usage.prompt_tokens + reply.usage.completion_tokens);
  });

  it('leaves out token ids and logprobs unless asked, but always reports usage and the weight version', async (t) => {
    const mock = await start(t);
    const reply = await chat(mock, { messages: HELLO });
    assert.equal(reply.choices[0].token_ids, undefined);
    assert.equal(reply.prompt_token_ids, undefined);
    assert.equal(reply.choices[0].logprobs, null);
    assert.ok(reply.usage.completion_tokens > 0);
    assert.deepEqual(reply.metadata, { weight_version: 0 });
  });

  it('truncates to max_tokens (or max_completion_tokens) with finish_reason length', async (t) => {
    const mock = await start(t, { thinkTokens: 50 });
    for (const field of ['max_tokens', 'max_completion_tokens']) {
      const reply = await chat(mock, { messages: HELLO, [field]: 5, return_token_ids: true });
      assert.equal(reply.choices[0].finish_reason, 'length', field);
      assert.equal(reply.choices[0].token_ids!.length, 5, field);
      assert.equal(reply.usage.completion_tokens, 5, field);
    }
  });

  it('rejects a bad body with 400 and an OpenAI-style error naming the field and the value', async (t) => {
    const mock = await start(t);
    const cases: [unknown, string | null, RegExp][] = [
      ['{not json', null, /not valid JSON/],
      [{ model: 'x' }, 'messages', /messages must be a non-empty array \(got undefined\)/],
      [{ messages: [] }, 'messages', /messages must be a non-empty array \(got an empty array\)/],
      [
        { messages: [{ role: 'user', content: 42 }] },
        'messages[0].content',
        /messages\[0\]\.content must be .* \(got 42\)/,
      ],
      [{ messages: HELLO, max_tokens: -3 }, 'max_tokens', /max_tokens must be a positive integer \(got -3\)/],
      [{ messages: HELLO, logprobs: 'yes' }, 'logprobs', /logprobs must be a boolean \(got "yes"\)/],
      [
        { messages: HELLO, stream_options: { include_usage: true } },
        'stream_options',
        /stream_options is only allowed with stream: true/,
      ],
      [
        { messages: HELLO, stream: true, stream_options: { include_usage: 1 } },
        'stream_options.include_usage',
        /stream_options.include_usage must be a boolean \(got 1\)/,
      ],
    ];
    for (const [body, param, message] of cases) {
      const { status, json } = await call(mock, 'POST', '/v1/chat/completions', body);
      assert.equal(status, 400, JSON.stringify(body));
      assert.equal(json.error.type, 'invalid_request_error');
      assert.equal(json.error.param, param);
      assert.match(json.error.message, message);
    }
  });

  it('answers unknown routes with 404 and oversized bodies with 413', async (t) => {
    const mock = await start(t, { maxBodyBytes: 4096 });
    assert.equal((await call(mock, 'GET', '/v2/nothing')).status, 404);
    const big = { messages: [{ role: 'user', content: 'x'.repeat(10_000) }] };
    assert.equal((await call(mock, 'POST', '/v1/chat/completions', big)).status, 413);
  });

  it('answers an in-flight request on /admin/abort with finish_reason abort and only the tokens generated so far', async (t) => {
    const mock = await start(t, { tokensPerSecond: 2000, thinkTokens: 4000 });
    const pending = chat(mock, { messages: HELLO, return_token_ids: true, logprobs: true });
    await mock.waitForInFlight(1);
    // A 100-token answer on the same server comes back after 100 tokens' worth of time (50 ms): by then
    // the long request has generated some tokens, and is far from its 4000 (over 2 s).
    await chat(mock, { messages: HELLO, max_tokens: 100 });
    assert.deepEqual(await call(mock, 'POST', '/admin/abort'), { status: 200, json: { aborted: 1 } });
    const reply = await pending;
    const choice = reply.choices[0];
    assert.equal(choice.finish_reason, 'abort');
    assert.ok(choice.token_ids!.length > 0 && choice.token_ids!.length < 4000, `${choice.token_ids!.length} tokens`);
    assert.equal(choice.token_ids!.length, reply.usage.completion_tokens);
    assert.equal(choice.logprobs!.content.length, reply.usage.completion_tokens);
    assert.equal(decode(choice.token_ids!), choice.message.content);
    assert.deepEqual([mock.stats().aborted, mock.stats().inFlight], [1, 0]);
  });

  it('streams a reply as vLLM does (role first, then tokens, finish reason, usage, [DONE]) adding up to the whole reply', async (t) => {
    const mock = await start(t, { tokensPerSecond: 4000, thinkTokens: 120, streamIntervalMs: 5, seed: 1 });
    const body = { messages: GUESS_PROMPT, seed: 9, return_token_ids: true, logprobs: true };
    const whole = (await chat(mock, body)).choices[0];
    const events = await streamEvents(mock, { ...body, stream: true, stream_options: { include_usage: true } });
    assert.equal(events.at(-1), '[DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e) as Chunk);
    assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk' && c.id === chunks[0].id));
    assert.deepEqual(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
    assert.ok(chunks[0].prompt_token_ids!.length > 0);
    const usage = chunks.at(-1)!;
    assert.deepEqual(usage.choices, []);
    const tokens = chunks.slice(1, -1);
    assert.ok(tokens.length > 2, `${tokens.length} token events: the reply came in pieces`);
    assert.ok(tokens.slice(0, -1).every((c) => c.choices[0].finish_reason === null));
    assert.equal(tokens.at(-1)!.choices[0].finish_reason, whole.finish_reason);
    assert.equal(tokens.at(-1)!.metadata!.weight_version, 0);
    const ids = tokens.flatMap((c) => c.choices[0].token_ids!);
    assert.deepEqual(ids, whole.token_ids);
    assert.equal(tokens.map((c) => c.choices[0].delta.content).join(''), whole.message.content);
    assert.deepEqual(
      tokens.flatMap((c) => c.choices[0].logprobs!.content.map((l) => l.logprob)),
      whole.logprobs!.content.map((l) => l.logprob),
    );
    assert.equal(usage.usage!.completion_tokens, ids.length);
  });

  it('ends a stream aborted mid-way with finish_reason abort, its events holding exactly the tokens generated', async (t) => {
    const mock = await start(t, { tokensPerSecond: 2000, thinkTokens: 4000, streamIntervalMs: 5 });
    const events: string[] = [];
    let twoTokenEvents!: () => void;
    const started = new Promise<void>((r) => (twoTokenEvents = r));
    const reading = streamEvents(
      mock,
      {
        messages: HELLO,
        return_token_ids: true,
        logprobs: true,
        stream: true,
        stream_options: { include_usage: true },
      },
      (e) => {
        events.push(e);
        if (events.length === 3) twoTokenEvents(); // the role event and two with tokens
      },
    );
    await started;
    assert.deepEqual(await call(mock, 'POST', '/admin/abort'), { status: 200, json: { aborted: 1 } });
    const all = await reading;
    assert.equal(all.at(-1), '[DONE]');
    const chunks = all.slice(1, -1).map((e) => JSON.parse(e) as Chunk);
    const usage = chunks.pop()!;
    assert.equal(chunks.at(-1)!.choices[0].finish_reason, 'abort');
    const ids = chunks.flatMap((c) => c.choices[0].token_ids!);
    assert.ok(ids.length > 0 && ids.length < 4000, `${ids.length} tokens`);
    assert.equal(usage.usage!.completion_tokens, ids.length);
    assert.equal(chunks.flatMap((c) => c.choices[0].logprobs!.content).length, ids.length);
    assert.equal(decode(ids), chunks.map((c) => c.choices[0].delta.content).join(''));
    assert.deepEqual([mock.stats().aborted, mock.stats().inFlight], [1, 0]);
  });

  it('accepts SGLang /abort_request and abortAll() as the same abort', async (t) => {
    const mock = await start(t, { latencyMs: 60_000 });
    const pending = [chat(mock, { messages: HELLO }), chat(mock, { messages: HELLO })];
    await mock.waitForInFlight(2);
    assert.deepEqual((await call(mock, 'POST', '/abort_request', { abort_all: true })).json, { aborted: 2 });
    for (const reply of await Promise.all(pending)) {
      assert.equal(reply.choices[0].finish_reason, 'abort');
      assert.equal(reply.usage.completion_tokens, 0); // aborted during the latency phase: nothing generated yet
    }
    const third = chat(mock, { messages: HELLO });
    await mock.waitForInFlight(1);
    assert.equal(mock.abortAll(), 1);
    assert.equal((await third).choices[0].finish_reason, 'abort');
  });

  it('reports a weight version set over HTTP or in code in the metadata of later completions', async (t) => {
    const mock = await start(t, { weightVersion: 3 });
    assert.deepEqual((await call(mock, 'GET', '/admin/weight_version')).json, { weight_version: 3 });
    assert.deepEqual(await call(mock, 'POST', '/admin/weight_version', { weight_version: 7 }), {
      status: 200,
      json: { weight_version: 7 },
    });
    assert.equal(mock.weightVersion, 7);
    assert.deepEqual((await chat(mock, { messages: HELLO })).metadata, { weight_version: 7 });
    mock.setWeightVersion(9);
    assert.deepEqual((await chat(mock, { messages: HELLO })).metadata, { weight_version: 9 });
    const bad = await call(mock, 'POST', '/admin/weight_version', { weight_version: -1 });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'weight_version');
    assert.match(bad.json.error.message, /weight_version must be a non-negative integer \(got -1\)/);
    assert.throws(() => mock.setWeightVersion(1.5), /weight_version must be a non-negative integer \(got 1\.5\)/);
  });

  it('answers every completion with 500 when errorRate is 1 and counts the injected errors', async (t) => {
    const mock = await start(t, { errorRate: 1 });
    for (let i = 0; i < 3; i++) {
      const { status, json } = await call(mock, 'POST', '/v1/chat/completions', { messages: HELLO });
      assert.equal(status, 500);
      assert.equal(json.error.type, 'server_error');
    }
    assert.equal(mock.stats().errorsInjected, 3);
  });

  it('takes latencyMs plus completion tokens / tokensPerSecond to answer', async (t) => {
    const mock = await start(t, { latencyMs: 40, tokensPerSecond: 1000, thinkTokens: 60 });
    const began = performance.now();
    const reply = await chat(mock, { messages: HELLO });
    const expected = 40 + reply.usage.completion_tokens; // 1 ms per token at 1000 tokens/s
    assert.ok(performance.now() - began >= expected - 2, `${performance.now() - began} ms < ${expected} ms`);
  });

  it('rejects invalid options, naming the option and the value', async () => {
    await assert.rejects(startMockLlm({ errorRate: 2 }), {
      message: 'mock-llm: option errorRate must be in [0, 1] (got 2)',
    });
    await assert.rejects(startMockLlm({ thinkTokens: 1.5 }), /option thinkTokens must be an integer \(got 1\.5\)/);
    await assert.rejects(startMockLlm({ latency: 5 } as MockLlmOptions), /unknown option latency/);
  });

  it('closes promptly with a request in flight and an idle keep-alive connection open', async () => {
    const mock = await startMockLlm({ latencyMs: 60_000 });
    await call(mock, 'GET', '/health'); // leaves an idle keep-alive socket in undici's pool
    const pending = chat(mock, { messages: HELLO }).then(
      (reply) => reply.choices[0].finish_reason,
      () => 'connection closed',
    );
    await mock.waitForInFlight(1);
    const began = performance.now();
    await mock.close();
    // The request in flight would take 60 s: a close that waited for it would take that long.
    assert.ok(performance.now() - began < 20_000);
    assert.match(await pending, /^(abort|connection closed)$/);
    await mock.close(); // idempotent
  });
});

describe('mock policy', () => {
  it('plays guess-number imperfectly, so identical prompts get different guesses', async (t) => {
    const mock = await start(t, { mistakeRate: 0.5, seed: 11 });
    const replies = await Promise.all(Array.from({ length: 12 }, () => chat(mock, { messages: GUESS_PROMPT })));
    const guesses = new Set(replies.map((r) => r.choices[0].message.content.match(/-?\d+/g)!.at(-1)));
    assert.ok(guesses.size >= 2, `guesses: ${[...guesses]}`);
  });

  it('wins guess-number through the environment by binary search when it makes no mistakes', async (t) => {
    const mock = await start(t, { mistakeRate: 0, thinkTokens: 10 });
    for (const seed of [1, 2, 3]) {
      const env = createGuessNumber();
      env.reset({ seed, params: {} });
      let last;
      for (let prompt = env.getTaskPrompt(); prompt.length > 0; prompt = env.getTaskPrompt()) {
        last = env.step((await chat(mock, { messages: prompt })).choices[0].message.content);
      }
      assert.equal(last!.terminated, true, `seed ${seed}`);
      assert.ok((last!.reward as number) > 0 && (last!.info!.turns as number) <= 7);
    }
  });

  it('answers arithmetic right without mistakes and sometimes off by a little with them', async (t) => {
    const messages = [{ role: 'user', content: 'Compute 37 + 45 * 2 - 8. Answer with the number only.' }];
    const exact = await start(t, { mistakeRate: 0 });
    for (let i = 0; i < 5; i++)
      assert.match((await chat(exact, { messages })).choices[0].message.content, /(?<!\d)119\D*$/);
    const sloppy = await start(t, { mistakeRate: 1 });
    const answer = Number((await chat(sloppy, { messages })).choices[0].message.content.match(/-?\d+/g)!.at(-1));
    assert.ok(answer !== 119 && Math.abs(answer - 119) <= 3, String(answer));
  });
});

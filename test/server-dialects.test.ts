/**
 * What each inference server sends back, read as the server sends it (llm/reply.ts, llm/servers.ts),
 * and the engine's token-in episodes (`llm.api: tokens`). The reply shapes are those of the servers'
 * own source, named beside each test; the mock reproduces them per dialect (test/mock-dialects.test.ts).
 */
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { after, before, describe, it, type TestContext } from 'node:test';
import { createEngine, Status, type Engine } from '../src/index.ts';
import { chatPayload, LlmClient, type LlmClientOptions } from '../src/llm/client.ts';
import { parseChatReply } from '../src/llm/reply.ts';
import { ChatStream } from '../src/llm/stream-reply.ts';
import { checkServedVersions, DIALECTS, probeServer, serverGaps, type ServerInfo } from '../src/llm/servers.ts';
import { loadChatModel } from '../src/chat-model/model.ts';
import { PauseControl } from '../src/coordinator/pause-control.ts';
import { PauseGate } from '../src/worker/pause-gate.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/server.ts';
import { TEST_CLIENT } from './support/clients.ts';
import { scriptedServer, type ScriptedServer } from './support/http.ts';

type Handler = (req: IncomingMessage, body: string, res: ServerResponse) => void;

/** A loopback server answering with `handler`; every request's method, path and body recorded. */
function double(handler: Handler): Promise<ScriptedServer> {
  return scriptedServer((req, res, body) => handler(req, body, res));
}

function json(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
}

const CLIENT: Omit<LlmClientOptions, 'url'> = { ...TEST_CLIENT, maxReplyBytes: 1 << 20 };
/** The mode checkServedVersions is asked for where it does not matter (vLLM's replies carry no version in any). */
const CHAT = { api: 'chat', stream: false } as const;

describe('inference replies as each server sends them', () => {
  it('takes SGLang\'s string weight version "default" and its per-choice prompt_token_ids and token_ids (serving_chat.py _build_chat_response; return_token_ids, sglang#30917, protocol.py @004c82e)', () => {
    const reply = parseChatReply({
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: 'hi' },
          finish_reason: 'stop',
          matched_stop: 9,
          prompt_token_ids: [1, 2, 3],
          token_ids: [7, 9],
          logprobs: {
            content: [
              { token: 'hi', logprob: -0.5, bytes: [104, 105], top_logprobs: [] },
              { token: '<|im_end|>', logprob: -0.25, bytes: [], top_logprobs: [] },
            ],
          },
        },
      ],
      usage: { prompt_tokens: 3, completion_tokens: 2 },
      metadata: { weight_version: 'default' },
    });
    assert.equal(reply.weightVersion, 'default');
    assert.deepEqual(reply.promptIds, Int32Array.of(1, 2, 3));
    assert.deepEqual(reply.responseIds, Int32Array.of(7, 9));
    assert.deepEqual(reply.logprobs, Float32Array.of(-0.5, -0.25));
  });

  it("takes SGLang's response-level sglext ids when the choice has none (sglang#34488: input_ids shared, output_ids per choice)", () => {
    const reply = parseChatReply({
      choices: [{ index: 0, message: { role: 'assistant', content: 'hi' }, finish_reason: 'length' }],
      metadata: { weight_version: 'default' },
      sglext: { input_ids: [1, 2, 3], output_ids: [[7, 8]] },
    });
    assert.deepEqual(reply.promptIds, Int32Array.of(1, 2, 3));
    assert.deepEqual(reply.responseIds, Int32Array.of(7, 8));
    assert.throws(
      () =>
        parseChatReply({
          choices: [{ message: { content: '' }, finish_reason: 'stop' }],
          sglext: { output_ids: [7, 8] },
        }),
      { code: 'ERR_LLM_BAD_REPLY', message: /sglext\.output_ids\[0\] must be an array of token ids \(got 7\)/ },
    );
  });

  it("takes a streamed SGLang reply's ids from its one sglext chunk, and drops logprobs that leave out a token rather than misalign them (serving_chat.py _generate_chat_stream, sglang#34488)", () => {
    const head = { id: 'c', object: 'chat.completion.chunk', created: 1, model: 'm' };
    const lp = (token: string, logprob: number) => ({ content: [{ token, logprob, bytes: [], top_logprobs: [] }] });
    const chunk = (body: object) => `data: ${JSON.stringify({ ...head, ...body })}\n\n`;
    const streamOf = (logprobs: boolean, last: object | null) => {
      const stream = new ChatStream({ tokenIds: true, logprobs });
      const frames = [
        chunk({
          choices: [{ index: 0, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
        }),
        chunk({
          choices: [
            { index: 0, delta: { content: 'h' }, logprobs: logprobs ? lp('h', -0.5) : null, finish_reason: null },
          ],
        }),
        chunk({
          choices: [
            { index: 0, delta: { content: 'i' }, logprobs: logprobs ? lp('i', -0.25) : null, finish_reason: null },
          ],
        }),
        // The end-of-turn step's text is empty: no chunk, so its logprob is never sent.
        chunk({
          choices: [{ index: 0, delta: { content: null }, logprobs: null, finish_reason: 'stop', matched_stop: 9 }],
        }),
        last === null ? '' : chunk({ choices: [], usage: null, sglext: last }),
        chunk({ choices: [], usage: { prompt_tokens: 3, completion_tokens: 3, total_tokens: 6 } }),
        'data: [DONE]\n\n',
      ];
      stream.write(new TextEncoder().encode(frames.join('')));
      return stream.result();
    };
    const ids = { input_ids: [1, 2, 3], output_ids: [[7, 8, 9]] };
    const plain = streamOf(false, ids);
    assert.deepEqual(plain.promptIds, Int32Array.of(1, 2, 3));
    assert.deepEqual(plain.responseIds, Int32Array.of(7, 8, 9));
    assert.equal(plain.content, 'hi');
    const withLogprobs = streamOf(true, ids);
    assert.deepEqual(withLogprobs.responseIds, Int32Array.of(7, 8, 9));
    assert.equal(withLogprobs.logprobs, null, '2 logprobs for 3 tokens: which one is missing is not said');
    const older = streamOf(true, null);
    assert.equal(older.responseIds, null, 'a server without the extension: text only, as before');
    assert.deepEqual(older.logprobs, Float32Array.of(-0.5, -0.25));
  });

  it("reads llama.cpp's token ids from logprobs.content[].id (tools/server, no token_ids field)", () => {
    const reply = parseChatReply({
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: 'ab' },
          finish_reason: 'length',
          logprobs: {
            content: [
              { id: 64, token: 'a', logprob: -1.25, bytes: [97], top_logprobs: [] },
              { id: 65, token: 'b', logprob: -0.5, bytes: [98], top_logprobs: [] },
            ],
          },
        },
      ],
    });
    assert.deepEqual(reply.responseIds, Int32Array.of(64, 65));
    assert.deepEqual(reply.logprobs, Float32Array.of(-1.25, -0.5));
  });

  it("reads llama.cpp's ids from streamed chunks' logprobs too", () => {
    const stream = new ChatStream({ tokenIds: true, logprobs: true });
    const chunk = (id: number, text: string, finish: string | null) =>
      `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: text }, finish_reason: finish, logprobs: { content: [{ id, token: text, logprob: -0.25, bytes: [] }] } }] })}\n\n`;
    stream.write(new TextEncoder().encode(`${chunk(7, 'x', null) + chunk(8, 'y', 'stop')}data: [DONE]\n\n`));
    const result = stream.result();
    assert.deepEqual(result.responseIds, Int32Array.of(7, 8));
    assert.equal(result.content, 'xy');
  });

  it('reads finish reasons whatever their case (regression: a server answering "STOP" failed the rollout)', () => {
    assert.equal(
      parseChatReply({ choices: [{ message: { content: 'x' }, finish_reason: 'STOP' }] }).finishReason,
      'stop',
    );
    const stream = new ChatStream({ tokenIds: false, logprobs: false });
    stream.write(
      new TextEncoder().encode(
        `data: ${JSON.stringify({ choices: [{ delta: { content: 'x' }, finish_reason: 'Length' }] })}\n\ndata: [DONE]\n\n`,
      ),
    );
    assert.equal(stream.result().finishReason, 'length');
  });

  it('refuses a weight version that is no name at all, naming the field', () => {
    const base = { choices: [{ message: { content: '' }, finish_reason: 'stop' }] };
    assert.throws(() => parseChatReply({ ...base, metadata: { weight_version: { v: 1 } } }), {
      code: 'ERR_LLM_BAD_REPLY',
      message: /metadata\.weight_version must be a string/,
    });
    assert.equal(parseChatReply({ ...base, metadata: { weight_version: 12 } }).weightVersion, '12');
  });
});

describe('weight versions named by the trainer', () => {
  it('maps an announced version to its model step, and says -1 for a version the trainer did not announce', async () => {
    const control = new PauseControl(5);
    const gate = new PauseGate(control.block);
    try {
      assert.equal(gate.stepOfVersion(null), 5);
      assert.equal(
        gate.stepOfVersion('3'),
        3,
        'no announcement: a whole-number version is the step (mock, --weight-version N)',
      );
      assert.equal(gate.stepOfVersion('default'), 5, 'no announcement: SGLang\'s "default" names no step');
      assert.equal(
        gate.stepOfVersion('9'),
        -1,
        'newer than the step resumed with: reported, not tagged (regression: staleness went negative without a word)',
      );
      control.pause();
      control.resume(7, 'ckpt-7');
      await control.waitForAcks(1, 1_000);
      assert.equal(gate.stepOfVersion('ckpt-7'), 7);
      assert.equal(gate.stepOfVersion('default'), -1, 'the server still serves its launch weights');
      control.pause();
      control.resume(8, 'ckpt-8');
      await control.waitForAcks(1, 1_000);
      assert.equal(gate.stepOfVersion('ckpt-7'), 7, 'a reply generated before the last sync keeps its own step');
      assert.equal(gate.stepOfVersion('ckpt-8'), 8);
    } finally {
      gate.close();
      control.resume(8); // wakes the gate's watcher so it sees close()
    }
  });
});

describe('what an in-place pause tells of the weights behind each token', () => {
  const sglang: ServerInfo = {
    url: 'http://127.0.0.1:1',
    kind: 'sglang',
    models: ['m'],
    contextLength: null,
    abort: DIALECTS.sglang.abort,
    pauseInPlace: DIALECTS.sglang.pauseInPlace,
  };
  const inPlace = (api: 'chat' | 'tokens', stream: boolean) =>
    serverGaps(sglang, { api, stream, wantIds: true, pauseInPlace: true }).filter((g) => g.includes('spansVersions'));

  it('says at start that whole replies kept across an update cannot be split, and how to split them on SGLang', () => {
    assert.match(inPlace('tokens', false).join(), /llm.api "tokens" and llm.stream true/);
    assert.equal(inPlace('chat', true).length, 1);
    assert.deepEqual(inPlace('tokens', true), [], "SGLang's streamed /generate names the weights of each event");
  });
});

describe('the weights the servers serve at start', () => {
  it("keep the start's model step after the trainer names later ones (regression: step-0 tokens streamed across an in-place update were tagged step 1)", async () => {
    const control = new PauseControl(0, 'default');
    const gate = new PauseGate(control.block);
    try {
      assert.equal(gate.stepOfVersion('default'), 0);
      control.pause();
      control.resume(1, 'step-1');
      await control.waitForAcks(1, 1_000);
      assert.equal(gate.stepOfVersion('step-1'), 1);
      assert.equal(gate.stepOfVersion('default'), 0, 'the launch weights are step 0, not an unannounced version');
      assert.equal(gate.stepOfVersion('step-9'), -1);
    } finally {
      gate.close();
      control.resume(1); // wakes the gate's watcher so it sees close()
    }
  });
});

describe('probing an inference server at start (llm.server: auto)', () => {
  it('tells vLLM by /v1/models owned_by, reads max_model_len, and finds no abort route without dev mode (vllm api_server.py)', async (t) => {
    const server = await double((req, _body, res) => {
      if (req.url === '/v1/models')
        return json(res, 200, {
          object: 'list',
          data: [
            {
              id: 'Qwen/Qwen2.5-0.5B',
              object: 'model',
              owned_by: 'vllm',
              root: 'Qwen/Qwen2.5-0.5B',
              max_model_len: 32768,
            },
          ],
        });
      json(res, 404, { detail: 'Not Found' });
    });
    t.after(() => server.close());
    const info = await probeServer(server.url, { server: 'auto' });
    assert.equal(info.kind, 'vllm');
    assert.equal(info.contextLength, 32768);
    assert.equal(info.abort, null, 'GET /abort_requests answered 404: not in dev mode');
    assert.ok(
      server.requests.some((r) => r.method === 'GET' && r.path === '/abort_requests'),
      'the route is checked with a GET, which aborts nothing',
    );
    const gaps = serverGaps(info, { api: 'chat', stream: false, wantIds: true });
    assert.ok(
      gaps.some((g) => /no abort-all route.*VLLM_SERVER_DEV_MODE=1/.test(g)),
      gaps.join('\n'),
    );
    assert.ok(gaps.some((g) => /no weight version/.test(g)));
  });

  it("keeps vLLM's dev-mode abort route when it exists (405 to a GET) and aborts with a {} body", async (t) => {
    const server = await double((req, _body, res) => {
      if (req.url === '/v1/models')
        return json(res, 200, { data: [{ id: 'm', owned_by: 'vllm', max_model_len: 4096 }] });
      if (req.url === '/abort_requests')
        return req.method === 'POST' ? json(res, 200, {}) : json(res, 405, { detail: 'Method Not Allowed' });
      json(res, 404, { detail: 'Not Found' });
    });
    t.after(() => server.close());
    const info = await probeServer(server.url, { server: 'auto' });
    assert.deepEqual(info.abort, { path: '/abort_requests', body: '{}' });
  });

  it("tells llama.cpp by /props and takes a slot's n_ctx as the context (tools/server)", async (t) => {
    const server = await double((req, _body, res) => {
      if (req.url === '/v1/models')
        return json(res, 200, {
          object: 'list',
          data: [{ id: 'tiny.gguf', object: 'model', owned_by: 'llamacpp', meta: { n_ctx_train: 4096 } }],
        });
      if (req.url === '/props')
        return json(res, 200, {
          default_generation_settings: { n_ctx: 1024 },
          total_slots: 2,
          model_path: 'tiny.gguf',
        });
      json(res, 404, { error: { code: 404, message: 'File Not Found', type: 'not_found_error' } });
    });
    t.after(() => server.close());
    const info = await probeServer(server.url, { server: 'auto' });
    assert.equal(info.kind, 'llamacpp');
    assert.equal(info.contextLength, 1024);
    assert.equal(info.abort, null, 'llama.cpp has no abort route: closing the connection stops the slot');
    const gaps = serverGaps(info, { api: 'chat', stream: false, wantIds: true });
    assert.ok(
      gaps.some((g) => /no prompt token ids.*llm\.api "tokens", \/completion/.test(g)),
      gaps.join('\n'),
    );
    assert.ok(
      gaps.some((g) => /leave out the id and logprob of a token that ends inside a UTF-8 character/.test(g)),
      gaps.join('\n'),
    );
  });

  it('says nothing of SGLang chat ids on whole replies, says what a streamed one loses, and keeps its abort_all route', async (t) => {
    const server = await double((req, _body, res) => {
      if (req.url === '/v1/models')
        return json(res, 200, {
          object: 'list',
          data: [{ id: 'qwen', object: 'model', owned_by: 'sglang', root: 'qwen', max_model_len: 8192 }],
        });
      if (req.url === '/abort_request') return json(res, 405, { detail: 'Method Not Allowed' });
      // http_server.py get_weight_version @0025436eab0556737d615b36a4dd3e1e26e82f3d
      if (req.url === '/get_weight_version') return json(res, 200, { weight_version: 'default' });
      json(res, 404, { detail: 'Not Found' });
    });
    t.after(() => server.close());
    const info = await probeServer(server.url, { server: 'auto' });
    assert.equal(info.kind, 'sglang');
    assert.deepEqual(info.abort, { path: '/abort_request', body: '{"abort_all":true}' });
    assert.equal(info.weightVersion, 'default', "the version it serves at start, for the start's model step");
    assert.deepEqual(serverGaps(info, { api: 'chat', stream: false, wantIds: true }), []);
    const streamed = serverGaps(info, { api: 'chat', stream: true, wantIds: true });
    assert.ok(
      streamed.some((g) => /send their token ids once, after the last token \(sglext\)/.test(g)),
      streamed.join('\n'),
    );
    assert.deepEqual(serverGaps(info, { api: 'tokens', stream: false, wantIds: true }), []);
  });

  it("finds vLLM's in-place pause routes in dev mode only: GET /pause is 405 there, 404 without (dev/rlhf/api_router.py @0100a21)", async (t) => {
    for (const vllmDevMode of [true, false]) {
      const mock = await startMockLlm({ port: 0, dialect: 'vllm', vllmDevMode });
      t.after(() => mock.close());
      const info = await probeServer(mock.url, { server: 'auto' });
      assert.equal(info.kind, 'vllm');
      assert.deepEqual(info.pauseInPlace, vllmDevMode ? DIALECTS.vllm.pauseInPlace : null);
      // Said once at start, where pause.mode in-place asks for it, rather than at the first pause.
      const gaps = serverGaps(info, { api: 'chat', stream: false, wantIds: true, pauseInPlace: true });
      assert.equal(
        gaps.some((g) => /no in-place pause route: .*VLLM_SERVER_DEV_MODE=1/.test(g)),
        !vllmDevMode,
        gaps.join('\n'),
      );
      assert.deepEqual(DIALECTS.vllm.pauseInPlace, {
        pause: { path: '/pause?mode=keep&clear_cache=false', body: '' },
        resume: { path: '/resume', body: '' },
      });
    }
  });

  it('refuses at start a model the server does not serve, naming llm.model and what it lists', async (t) => {
    const mock = await startMockLlm({ port: 0, model: 'served-model' });
    t.after(() => mock.close());
    const engine = createEngine({
      logLevel: 'silent',
      llm: { url: mock.url, model: 'other-model' },
      workers: { threads: 1 },
    });
    await assert.rejects(engine.start(), {
      code: 'ERR_LLM_MODEL',
      message: /llm\.model: .* does not serve "other-model" \(it lists "served-model"\)/,
    });
    await engine.close();
  });
});

describe('chat requests in each dialect', () => {
  it('asks SGLang for return_token_ids on whole replies and for the sglext ids on streamed ones (it refuses return_token_ids with stream: 400)', async (t) => {
    const server = await double((_req, _body, res) =>
      json(res, 200, { choices: [{ message: { content: 'x' }, finish_reason: 'stop' }] }),
    );
    t.after(() => server.close());
    const client = new LlmClient({ ...CLIENT, url: server.url, server: { kind: 'sglang', contextLength: null } });
    t.after(() => client.close());
    await client.chat({ messages: [{ role: 'user', content: 'hi' }], maxTokens: 4, temperature: 1 });
    const sent = JSON.parse(server.requests[0].body);
    assert.equal(sent.return_token_ids, true, 'sglang#30917');
    assert.equal(sent.return_prompt_token_ids, true, 'the prompt ids from a release before it');
    const streamed = chatPayload(
      { ...CLIENT, stream: true },
      { messages: [], maxTokens: 1, temperature: 1 },
      DIALECTS.sglang.chatIdFields(true),
    ) as Record<string, unknown>;
    assert.equal(streamed.return_prompt_token_ids, undefined);
    assert.equal(streamed.return_token_ids, undefined);
    assert.equal(streamed.return_input_ids_in_sglext, true, 'sglang#34488');
    assert.equal(streamed.return_output_ids_in_sglext, true);
    const llamacpp = chatPayload(
      CLIENT,
      { messages: [], maxTokens: 1, temperature: 1 },
      DIALECTS.llamacpp.chatIdFields(false),
    ) as Record<string, unknown>;
    assert.equal(llamacpp.logprobs, true, "llama.cpp's ids come with the logprobs");
    assert.equal(llamacpp.return_token_ids, undefined);
  });

  it('ends a chat call the server refuses for its context as a truncation (vLLM, SGLang, llama.cpp wordings)', async (t) => {
    const wordings = [
      {
        object: 'error',
        message:
          "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (1600 in the messages, 500 in the completion).",
        type: 'BadRequestError',
        code: 400,
      },
      {
        object: 'error',
        message: "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
        type: 'BadRequestError',
        code: 400,
      },
      {
        error: {
          code: 400,
          message: 'the request exceeds the available context size, try increasing it',
          type: 'exceed_context_size_error',
          n_prompt_tokens: 1200,
          n_ctx: 1024,
        },
      },
    ];
    let i = 0;
    const server = await double((_req, _body, res) => json(res, 400, wordings[i++]));
    t.after(() => server.close());
    const client = new LlmClient({ ...CLIENT, url: server.url });
    t.after(() => client.close());
    for (let k = 0; k < wordings.length; k++) {
      const reply = await client.chat({ messages: [{ role: 'user', content: 'hi' }], maxTokens: 4, temperature: 1 });
      assert.equal(reply.finishReason, 'length');
      assert.ok(reply.contextExceeded !== undefined && reply.contextExceeded.length > 0);
    }
  });
});

describe('token-in episodes (llm.api: tokens)', () => {
  let mock: MockLlm;
  const engines: Engine[] = [];
  before(async () => {
    mock = await startMockLlm({ port: 0, seed: 3, tokenizer: 'qwen2.5' });
  });
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    await mock.close();
  });

  it('keeps each episode one exact token sequence: every prompt begins with the previous prompt + response ids', async () => {
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      llm: { url: mock.url, api: 'tokens', tokenizer: 'qwen2.5' },
      workers: { threads: 1 },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 2, maxSteps: 6, messageCut: 0 }],
    });
    engines.push(engine);
    await engine.start();
    const batch = await engine.getBatch();
    assert.equal(batch.status, 'NORMAL');
    const qwen = await loadChatModel('qwen2.5');
    let multiTurn = 0;
    for (const rollout of batch.groups.flatMap((g) => g.rollouts)) {
      assert.equal(rollout.status, Status.COMPLETED);
      if (rollout.turns.length > 1) multiTurn++;
      for (let i = 0; i < rollout.turns.length; i++) {
        const turn = rollout.turns[i];
        assert.ok(
          turn.promptIds && turn.responseIds && turn.logprobs,
          'token-in turns carry prompt ids, response ids and logprobs',
        );
        assert.equal(turn.logprobs.length, turn.responseIds.length);
        assert.equal(qwen.decode(Array.from(turn.responseIds)).replace(/<\|im_end\|>$/, ''), turn.response);
        if (i === 0) {
          assert.deepEqual(
            Array.from(turn.promptIds),
            qwen.encode(qwen.render(turn.messages, { addGenerationPrompt: true })),
            'the first prompt is the chat template rendered and tokenized',
          );
          continue;
        }
        const before = rollout.turns[i - 1];
        const prefix = [...before.promptIds!, ...before.responseIds!];
        assert.deepEqual(
          Array.from(turn.promptIds.subarray(0, prefix.length)),
          prefix,
          `turn ${i} extends turn ${i - 1}'s prompt + response exactly`,
        );
        assert.ok(turn.promptIds.length > prefix.length, 'and adds the new observation');
      }
    }
    assert.ok(multiTurn > 0, 'guess-number takes several turns');
  });

  it('counts the prompt before sending: over the context nothing is sent, and the reply says why', async (t) => {
    const qwen = await loadChatModel('qwen2.5');
    const messages = [{ role: 'user' as const, content: 'Guess a number between 1 and 100.' }];
    const length = qwen.encode(qwen.render(messages, { addGenerationPrompt: true })).length;
    const calls: unknown[] = [];
    const server = await double((_req, body, res) => (calls.push(JSON.parse(body)), json(res, 200, {})));
    t.after(() => server.close());
    const client = new LlmClient({
      ...CLIENT,
      url: server.url,
      api: 'tokens',
      server: { kind: 'vllm', contextLength: length },
      chatModel: () => loadChatModel('qwen2.5'),
    });
    t.after(() => client.close());
    const reply = await client.chat({ messages, maxTokens: 16, temperature: 1 }, undefined, 's1');
    assert.equal(reply.finishReason, 'length');
    assert.match(
      reply.contextExceeded ?? '',
      new RegExp(`the prompt is ${length} tokens and the server's context is ${length}`),
    );
    assert.equal(calls.length, 0, 'nothing sent');
  });
});

describe('context limits end episodes as truncated, not failed', () => {
  it('keeps the turns an episode has when the server refuses its next prompt for the context (chat mode)', async (t) => {
    // Every rollout's first call is answered; its second is refused as vLLM refuses an overflow.
    const calls = new Map<string, number>();
    const server = await double((req, body, res) => {
      if (req.url === '/v1/models') return json(res, 200, { data: [{ id: 'm', owned_by: 'vllm', max_model_len: 64 }] });
      if (req.url !== '/v1/chat/completions') return json(res, 404, { detail: 'Not Found' });
      const messages = (JSON.parse(body) as { messages: unknown[] }).messages;
      const key = JSON.stringify(messages[1] ?? messages[0]);
      const n = (calls.get(key) ?? 0) + 1;
      calls.set(key, n);
      if (messages.length > 2)
        return json(res, 400, {
          object: 'error',
          message:
            "This model's maximum context length is 64 tokens. However, you requested 80 tokens (60 in the messages, 20 in the completion).",
          type: 'BadRequestError',
          code: 400,
        });
      json(res, 200, {
        choices: [
          {
            index: 0,
            message: { role: 'assistant', content: '50' },
            finish_reason: 'stop',
            token_ids: [1, 2],
            logprobs: {
              content: [
                { token: '5', logprob: -1 },
                { token: '0', logprob: -1 },
              ],
            },
          },
        ],
        prompt_token_ids: [9, 9, 9],
      });
    });
    t.after(() => server.close());
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 1,
      llm: { url: server.url, model: 'm', abortPath: null },
      workers: { threads: 1 },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 2, maxSteps: 6, messageCut: 0 }],
    });
    t.after(() => engine.close());
    await engine.start();
    const batch = await engine.getBatch();
    assert.equal(batch.status, 'NORMAL');
    for (const rollout of batch.groups[0].rollouts) {
      assert.equal(rollout.status, Status.COMPLETED, rollout.error ?? '');
      assert.equal(rollout.truncated, true);
      assert.equal(rollout.finishReason, 'length');
      assert.equal(rollout.turns.length, 1, 'the refused call adds no turn');
      assert.equal(rollout.turns[0].trainable, true, 'the last turn holds the whole conversation and is trained on');
      assert.equal(rollout.turns[0].truncated, true);
    }
  });
});

describe("llama.cpp's left-out logprobs (tokens mode)", () => {
  it('computes again the logprob llama.cpp leaves out for a token ending inside a UTF-8 character (server-context.cpp process_token)', async (t) => {
    // Token 160 (a lone UTF-8 lead byte) got no completion_probabilities entry; the recompute call
    // (the prefix + a forced whole token) lists its raw logprob among the alternatives.
    const bodies: Record<string, unknown>[] = [];
    const server = await double((req, body, res) => {
      if (req.url === '/v1/models') return json(res, 200, { data: [{ id: 'm', owned_by: 'llamacpp' }] });
      const sent = JSON.parse(body) as Record<string, unknown>;
      bodies.push(sent);
      if (bodies.length === 1) {
        return json(res, 200, {
          tokens: [64, 160, 99, 151645],
          stop_type: 'eos',
          completion_probabilities: [
            { id: 64, logprob: -1 },
            { id: 99, logprob: -3 },
            { id: 151645, logprob: -4 },
          ],
        });
      }
      json(res, 200, {
        tokens: [64],
        stop_type: 'limit',
        completion_probabilities: [
          {
            id: 64,
            logprob: -9,
            top_logprobs: [
              { id: 5, logprob: -0.5 },
              { id: 160, logprob: -2.5 },
            ],
          },
        ],
      });
    });
    t.after(() => server.close());
    const client = new LlmClient({
      ...CLIENT,
      url: server.url,
      api: 'tokens',
      server: { kind: 'llamacpp', contextLength: null },
      chatModel: () => loadChatModel('qwen2.5'),
    });
    t.after(() => client.close());
    const reply = await client.chat(
      { messages: [{ role: 'user', content: 'hi' }], maxTokens: 8, temperature: 1 },
      undefined,
      's',
    );
    assert.deepEqual(Array.from(reply.responseIds!), [64, 160, 99, 151645]);
    assert.deepEqual(Array.from(reply.logprobs!), [-1, -2.5, -3, -4]);
    assert.equal(bodies.length, 2);
    const prompt = bodies[0].prompt as number[];
    assert.deepEqual(bodies[1].prompt, [...prompt, 64], 'the prefix up to the left-out token');
    assert.deepEqual(bodies[1].logit_bias, [[64, 100]], 'a whole token ("a") is forced, so its entry is sent');
    assert.equal(bodies[1].n_predict, 1);
  });

  it('fails the call, naming the token, when the recomputed alternatives do not hold it', async (t) => {
    let n = 0;
    const server = await double((_req, _body, res) => {
      if (n++ === 0) return json(res, 200, { tokens: [160], stop_type: 'limit', completion_probabilities: [] });
      json(res, 200, {
        tokens: [64],
        stop_type: 'limit',
        completion_probabilities: [{ id: 64, logprob: -9, top_logprobs: [{ id: 5, logprob: -0.5 }] }],
      });
    });
    t.after(() => server.close());
    const client = new LlmClient({
      ...CLIENT,
      url: server.url,
      api: 'tokens',
      server: { kind: 'llamacpp', contextLength: null },
      chatModel: () => loadChatModel('qwen2.5'),
    });
    t.after(() => client.close());
    await assert.rejects(
      client.chat({ messages: [{ role: 'user', content: 'hi' }], maxTokens: 1, temperature: 1 }, undefined, 's'),
      {
        code: 'ERR_LLM_BAD_REPLY',
        message: /left out the logprob of completion token 0 \(id 160, which ends inside a UTF-8 character\)/,
      },
    );
  });
});

/**
 * The engine against the mock speaking each server's dialect (src/mock-llm/dialects.ts names
 * the source of each trait). Each row of the inference-server table (docs/INFERENCE-SERVERS.md) is one of these.
 */
describe('the engine against each dialect of the mock', () => {
  const GUESS = [
    { name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 2, maxSteps: 4, messageCut: 0, maxTokens: 32 },
  ];
  type Trait = { promptIds: boolean; responseIds: boolean };
  const cases: { dialect: 'vllm' | 'sglang' | 'llamacpp'; api: 'chat' | 'tokens'; gets: Trait }[] = [
    { dialect: 'vllm', api: 'chat', gets: { promptIds: true, responseIds: true } },
    { dialect: 'vllm', api: 'tokens', gets: { promptIds: true, responseIds: true } },
    { dialect: 'sglang', api: 'chat', gets: { promptIds: true, responseIds: true } },
    { dialect: 'sglang', api: 'tokens', gets: { promptIds: true, responseIds: true } },
    { dialect: 'llamacpp', api: 'chat', gets: { promptIds: false, responseIds: true } },
    { dialect: 'llamacpp', api: 'tokens', gets: { promptIds: true, responseIds: true } },
  ];
  for (const { dialect, api, gets } of cases) {
    const yes = (b: boolean) => (b ? 'with' : 'without');
    it(`${dialect}, ${api} mode: plays whole episodes, ${yes(gets.promptIds)} prompt ids, ${yes(gets.responseIds)} response ids, with logprobs`, async (t) => {
      const mock = await startMockLlm({
        port: 0,
        seed: 5,
        dialect,
        model: 'm',
        ...(api === 'tokens' ? { tokenizer: 'qwen2.5' as const } : {}),
      });
      t.after(() => mock.close());
      const engine = createEngine({
        logLevel: 'silent',
        batchSize: 2,
        workers: { threads: 1 },
        llm: { url: mock.url, model: 'm', api },
        tasks: GUESS,
      });
      t.after(() => engine.close());
      await engine.start();
      const batch = await engine.getBatch();
      assert.equal(batch.status, 'NORMAL');
      for (const rollout of batch.groups.flatMap((g) => g.rollouts)) {
        assert.equal(rollout.status, Status.COMPLETED, rollout.error ?? '');
        for (const turn of rollout.turns) {
          assert.equal(turn.promptIds !== null, gets.promptIds, 'prompt ids');
          assert.equal(turn.responseIds !== null, gets.responseIds, 'response ids');
          assert.ok(turn.logprobs !== null && turn.logprobs.length > 0, 'logprobs');
          if (turn.responseIds !== null) assert.equal(turn.responseIds.length, turn.logprobs.length);
        }
      }
    });
  }

  it("sglang, streamed chat mode: keeps each turn's prompt and response ids from the sglext chunk (regression: a current SGLang's chat turns were text only)", async (t) => {
    const mock = await startMockLlm({ port: 0, seed: 5, dialect: 'sglang', model: 'm' });
    t.after(() => mock.close());
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      workers: { threads: 1 },
      llm: { url: mock.url, model: 'm', stream: true, logprobs: false },
      tasks: GUESS,
    });
    t.after(() => engine.close());
    await engine.start();
    const batch = await engine.getBatch();
    assert.equal(batch.status, 'NORMAL');
    const turns = batch.groups.flatMap((g) => g.rollouts.flatMap((r) => r.turns));
    assert.ok(turns.length > 0);
    for (const turn of turns) {
      assert.ok(turn.promptIds !== null && turn.promptIds.length > 0, 'prompt ids');
      assert.ok(turn.responseIds !== null && turn.responseIds.length > 0, 'response ids');
    }
  });

  const pauses: { name: string; options: Parameters<typeof startMockLlm>[0]; serverAbort: boolean }[] = [
    {
      name: 'vLLM in dev mode is aborted with POST /abort_requests {}',
      options: { dialect: 'vllm' },
      serverAbort: true,
    },
    {
      name: 'vLLM without dev mode has no abort route: calls are cancelled client-side',
      options: { dialect: 'vllm', vllmDevMode: false },
      serverAbort: false,
    },
    {
      name: 'SGLang is aborted with POST /abort_request {"abort_all": true}',
      options: { dialect: 'sglang' },
      serverAbort: true,
    },
    {
      name: 'llama.cpp has no abort route: calls are cancelled client-side',
      options: { dialect: 'llamacpp' },
      serverAbort: false,
    },
  ];
  for (const { name, options, serverAbort } of pauses) {
    it(`pauses: ${name}`, async (t) => {
      const mock = await startMockLlm({ port: 0, seed: 6, model: 'm', latencyMs: 60_000, ...options });
      t.after(() => mock.close());
      const engine = createEngine({
        logLevel: 'silent',
        batchSize: 2,
        workers: { threads: 1 },
        llm: { url: mock.url, model: 'm' },
        producer: { strategy: 'async' },
        tasks: GUESS,
      });
      t.after(() => engine.close());
      await engine.start();
      // Every call is held by the mock's latency: wait until the first ones have reached it.
      while (mock.stats().inFlight === 0) await new Promise((r) => setImmediate(r));
      const report = await engine.pauseForWeightUpdate();
      assert.equal(report.serverAbort, serverAbort);
      assert.equal(report.cancelled, !serverAbort);
      assert.equal(report.stillInFlight, 0);
    });
  }

  /** An async engine on `mock` with pause.mode in-place, started, with its first calls on the server. */
  async function inPlaceEngine(t: TestContext, options: Parameters<typeof startMockLlm>[0]) {
    const mock = await startMockLlm({ port: 0, seed: 6, model: 'm', ...options });
    t.after(() => mock.close());
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      workers: { threads: 1 },
      llm: { url: mock.url, model: 'm' },
      producer: { strategy: 'async', partialRollout: true },
      pause: { mode: 'in-place' },
      tasks: GUESS,
    });
    t.after(() => engine.close());
    await engine.start();
    await mock.waitForInFlight(1);
    return { mock, engine };
  }

  const inPlaceServers: { name: string; options: Parameters<typeof startMockLlm>[0] }[] = [
    // POST /pause_generation {"mode": "in_place"}, POST /continue_generation (llm/servers.ts SGLANG_IN_PLACE).
    { name: 'SGLang', options: { dialect: 'sglang' } },
    // POST /pause?mode=keep&clear_cache=false, POST /resume (llm/servers.ts VLLM_IN_PLACE, from
    // vllm/entrypoints/serve/dev/rlhf/api_router.py @0100a2129224e729af1b3b8ed42a900cdfe9a452).
    { name: 'vLLM in dev mode', options: { dialect: 'vllm' } },
  ];
  for (const { name, options } of inPlaceServers) {
    it(`pauses ${name} in place with pause.mode in-place: every call stays on the server and finishes after the resume, none aborted`, async (t) => {
      const { mock, engine } = await inPlaceEngine(t, { ...options, latencyMs: 400 });
      const report = await engine.pauseForWeightUpdate();
      assert.deepEqual([report.inPlace, report.serverAbort, report.cancelled], [true, false, false]);
      assert.ok(report.stillInFlight > 0, 'the groups stay out, their calls on the server');
      assert.ok(mock.stats().inFlight > 0);
      await engine.resume({ modelStep: 1 });
      assert.equal((await engine.getBatch(1)).status, 'NORMAL');
      assert.equal(mock.stats().aborted, 0, 'nothing was aborted: the calls went on from where they were');
    });
  }

  it('continues a server it paused in place when it closes before the resume, so other clients are not held there', async (t) => {
    const { mock, engine } = await inPlaceEngine(t, { dialect: 'sglang', latencyMs: 20 });
    assert.equal((await engine.pauseForWeightUpdate()).inPlace, true);
    await engine.close();
    const other = await fetch(`${mock.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'Guess a number.' }] }),
    });
    assert.equal(((await other.json()) as { choices: { finish_reason: string }[] }).choices[0].finish_reason, 'stop');
  });

  it('pauses by abort when pause.mode is in-place but the server cannot pause in place (vLLM without dev mode: cancelled client-side)', async (t) => {
    const { engine } = await inPlaceEngine(t, { dialect: 'vllm', vllmDevMode: false, latencyMs: 60_000 });
    const report = await engine.pauseForWeightUpdate();
    assert.deepEqual(
      [report.inPlace, report.serverAbort, report.cancelled, report.stillInFlight],
      [false, false, true, 0],
    );
  });

  it("tags SGLang's string versions with the announced step, and counts replies from weights the trainer did not announce", async (t) => {
    const mock = await startMockLlm({ port: 0, seed: 7, dialect: 'sglang', model: 'm' });
    t.after(() => mock.close());
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      workers: { threads: 1 },
      llm: { url: mock.url, model: 'm' },
      tasks: GUESS,
    });
    t.after(() => engine.close());
    await engine.start();
    const first = await engine.getBatch(1);
    assert.ok(
      first.groups.flatMap((g) => g.rollouts).every((r) => r.status === Status.COMPLETED),
      'a "default" version fails nothing',
    );
    // The trainer says it loaded "step-1", but the server still serves its launch weights ("default").
    await engine.pauseForWeightUpdate();
    await engine.resume({ modelStep: 1, weightVersion: 'step-1' });
    await engine.getBatch(2);
    const stale = (await engine.stats()).workers.reduce((n, w) => n + w.weightVersionMismatches, 0);
    assert.ok(stale > 0, 'replies with an unannounced version are counted');
    // Now the server loads them (SGLang's POST /update_weight_version) and the trainer announces them.
    const update = await fetch(`${mock.url}/update_weight_version`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ new_version: 'step-2' }),
    });
    assert.equal(update.status, 200);
    await engine.pauseForWeightUpdate();
    await engine.resume({ modelStep: 2, weightVersion: 'step-2' });
    const third = await engine.getBatch(3);
    for (const turn of third.groups.flatMap((g) => g.rollouts.flatMap((r) => r.turns)))
      if (turn.step > 0) assert.ok(turn.modelStep <= 2);
    assert.ok(
      third.groups.flatMap((g) => g.rollouts.flatMap((r) => r.turns)).some((turn) => turn.modelStep === 2),
      'tokens of the new weights carry step 2',
    );
    assert.equal(
      (await engine.stats()).workers.reduce((n, w) => n + w.weightVersionMismatches, 0),
      stale,
      'no new mismatch once the server serves what was announced',
    );
  });

  it("checks vLLM's served version on a resume that names the weights (its replies carry none; dev-mode GET /weight_info)", async (t) => {
    const mock = await startMockLlm({ port: 0, dialect: 'vllm', model: 'm' });
    t.after(() => mock.close());
    const info = await probeServer(mock.url, { server: 'auto' });
    assert.equal(info.kind, 'vllm');
    const post = (path: string, body: unknown) =>
      fetch(`${mock.url}${path}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
    assert.equal((await post('/update_weight_version', { new_version: 'step-0' })).status, 200);
    const problems = await checkServedVersions([info], 'step-1', 1, CHAT);
    assert.equal(problems.length, 1);
    assert.match(
      problems[0],
      /vLLM at .* serves weight version "step-0", not "step-1" announced with model step 1: it has not loaded the new weights/,
    );
    assert.equal((await post('/finish_weight_update', { weight_version: 'step-1' })).status, 200);
    assert.deepEqual(await checkServedVersions([info], 'step-1', 1, CHAT), []);
    const plain = await startMockLlm({ port: 0, dialect: 'vllm', model: 'm', vllmDevMode: false });
    t.after(() => plain.close());
    assert.deepEqual(
      await checkServedVersions([await probeServer(plain.url, { server: 'auto' })], 'step-1', 1, CHAT),
      [],
      'outside dev mode there is nothing to ask (said at start)',
    );
  });

  it('takes vLLM\'s "default" for no named version: a trainer that loads weights without naming them is not warned on every resume (regression; vllm#49040)', async (t) => {
    const mock = await startMockLlm({ port: 0, dialect: 'vllm', model: 'm' });
    t.after(() => mock.close());
    const info = await probeServer(mock.url, { server: 'auto' });
    // The trainer's weight update ends without a version, as vLLM allows: /weight_info stays "default".
    const finish = await fetch(`${mock.url}/finish_weight_update`, { method: 'POST' });
    assert.equal(finish.status, 200);
    const served = (await (await fetch(`${mock.url}/weight_info`)).json()) as { weight_version: unknown };
    assert.equal(served.weight_version, 'default');
    for (const step of [1, 2, 3]) assert.deepEqual(await checkServedVersions([info], `step-${step}`, step, CHAT), []);
  });
});

/**
 * The raw llama-server that the engine will talk to, as it really answers: the shapes and behaviours the
 * engine depends on (token ids in logprobs, token-id prompts, the context-size error, what a closed
 * connection does, which abort routes exist), pinned against llama.cpp de3ff81 as shipped by
 * node-llama-cpp 3.22.1, and the proof that the engine's Qwen2.5 template + tokenizer give exactly the
 * server's prompt ids.
 *
 * Needs `node --import tsx test/real-server/setup.ts` first (npm run test:real-server does both). Without
 * the cached build the suite is skipped with the reason, except under CI=true, where it fails.
 */
import assert from 'node:assert/strict';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { loadChatModel, type ChatMessageInput, type ChatModel } from '../../src/chat-model/model.ts';
import {
  LLAMA_CPP_COMMIT,
  MODEL_NAME,
  qwenTokenizerDir,
  realServerAvailable,
  startLlamaServer,
  type LlamaServer,
} from '../support/llama-server.ts';

const available = realServerAvailable();
const skip = available.ok || process.env.CI === 'true' ? false : available.reason;

/** Total context 4096 over 2 slots: each slot holds 2048 tokens (no --kv-unified). */
const CTX = 4096;
const SLOTS = 2;
const SLOT_CTX = CTX / SLOTS;

/** What the server's reply parser skips before the content: C isspace(). */
const LEADING_C_SPACE = /^[ \t\n\v\f\r]+/;

const IM_START = 151644;
const IM_END = 151645;
const ENDOFTEXT = 151643;
/** ` Hello`: one token with a leading space. */
const SPACE_HELLO = 21927;
/** The byte-level token for the lone byte 0xE4: the first byte of a 3-byte UTF-8 character, never a whole one. */
const LONE_LEAD_BYTE = 160;

interface Reply {
  status: number;
  headers: Headers;
  text: string;
  // Shapes are asserted field by field below.
  json: any;
}

let server: LlamaServer;
let qwen: ChatModel;

async function call(
  method: 'GET' | 'POST' | 'DELETE',
  path: string,
  body?: unknown,
  { headers = {}, timeoutMs = 30_000 }: { headers?: Record<string, string>; timeoutMs?: number } = {},
): Promise<Reply> {
  const res = await fetch(server.url + path, {
    method,
    headers: body === undefined ? headers : { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = text === '' ? undefined : JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, text, json };
}

const post = (path: string, body: unknown, options?: { headers?: Record<string, string>; timeoutMs?: number }) =>
  call('POST', path, body, options);
const get = (path: string) => call('GET', path);

/** The `data:` payloads of an SSE body, JSON-parsed; `[DONE]` stays a string. */
function sseEvents(text: string): unknown[] {
  return text
    .split('\n')
    .filter((line) => line.startsWith('data: '))
    .map((line) => line.slice(6))
    .map((data) => (data === '[DONE]' ? data : JSON.parse(data)));
}

interface Slot {
  id: number;
  n_ctx: number;
  is_processing: boolean;
  id_task: number;
  n_prompt_tokens: number;
}

async function slots(): Promise<Slot[]> {
  const reply = await get('/slots');
  assert.equal(reply.status, 200, reply.text);
  return reply.json as Slot[];
}

async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs: number): Promise<number> {
  const started = Date.now();
  for (;;) {
    if (await check()) return Date.now() - started;
    if (Date.now() - started > timeoutMs) assert.fail(`${what}: not within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function tokensPredicted(): Promise<number> {
  const metrics = await get('/metrics');
  const m = /^llamacpp:tokens_predicted_total (\S+)$/m.exec(metrics.text);
  assert.ok(m, metrics.text);
  return Number(m[1]);
}

const allIdle = async () => (await slots()).every((s) => !s.is_processing);
const anyBusy = async () => (await slots()).some((s) => s.is_processing);

/** A request on its own socket (no keep-alive), to be cut mid-generation. */
function openRequest(
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): { response: Promise<IncomingMessage>; cut: () => void } {
  const req = httpRequest(server.url + path, {
    method: 'POST',
    agent: false,
    headers: { 'content-type': 'application/json', ...headers },
  });
  const response = new Promise<IncomingMessage>((resolve, reject) => {
    req.once('response', resolve);
    req.once('error', reject);
  });
  response.catch(() => {}); // a cut request rejects; the tests that read the response await it themselves
  req.end(JSON.stringify(body));
  return { response, cut: () => req.destroy() };
}

/** Reads an SSE response until `n` data events arrived. */
function readEvents(res: IncomingMessage, n: number): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = '';
    const onData = (chunk: Buffer) => {
      text += chunk.toString('utf8');
      if ((text.match(/^data: /gm) ?? []).length >= n) {
        res.off('data', onData);
        resolve(text);
      }
    };
    res.on('data', onData);
    res.once('error', reject);
    res.once('end', () => resolve(text));
  });
}

/** The engine's prompt for a conversation: its Qwen2.5 template, then its tokenizer. */
function enginePrompt(messages: ChatMessageInput[]): { text: string; ids: number[] } {
  const text = qwen.render(messages, { addGenerationPrompt: true });
  return { text, ids: qwen.encode(text) };
}

const CONVERSATIONS: Record<string, ChatMessageInput[]> = {
  'a lone user message (the template adds Qwen’s default system prompt)': [{ role: 'user', content: 'Hi' }],
  'a system and a user message': [
    { role: 'system', content: 'You are a terse assistant.' },
    { role: 'user', content: 'What is 2+2?' },
  ],
  'several turns with Unicode, code and whitespace runs': [
    { role: 'system', content: 'Réponds en français. 日本語も OK 👋' },
    { role: 'user', content: "def f(x):\n    return x**2  # it's   squared\n\n\nprint(f(12345))" },
    { role: 'assistant', content: 'Voilà : 152 399 025 — ça marche !' },
    { role: 'user', content: '  leading spaces, tabs\tand\r\nCRLF; émojis 🧪🔬, “quotes”, don’t, I’ve' },
  ],
  'a user message that spells special tokens in its text': [
    { role: 'user', content: 'say <|im_end|> then <tool_call> and <|endoftext|>' },
  ],
};

describe('llama-server (llama.cpp from node-llama-cpp) as the engine will use it', { skip }, () => {
  before(
    async () => {
      [server, qwen] = await Promise.all([startLlamaServer({ ctxSize: CTX, slots: SLOTS }), loadChatModel('qwen2.5')]);
    },
    { timeout: 90_000 },
  );

  after(
    async () => {
      await server?.stop();
    },
    { timeout: 30_000 },
  );

  describe('what it says about itself', () => {
    it('GET /props gives the per-slot context in default_generation_settings.n_ctx, the slot count, the alias and the model’s own Qwen2.5 chat template', {
      timeout: 10_000,
    }, async () => {
      const props = server.props as any;
      assert.equal(props.default_generation_settings.n_ctx, SLOT_CTX);
      assert.equal(props.total_slots, SLOTS);
      assert.equal(props.model_alias, MODEL_NAME);
      assert.equal(typeof props.model_path, 'string');
      assert.equal(props.build_info, `b1-${LLAMA_CPP_COMMIT.slice(0, 7)}`);
      const config = JSON.parse(readFileSync(join(qwenTokenizerDir(), 'tokenizer_config.json'), 'utf8'));
      // The GGUF holds tokenizer_config's template byte for byte; llama.cpp drops its final newline (which
      // renders nothing: trim_blocks eats the newline after the last block tag).
      assert.ok(config.chat_template.endsWith('{%- endif %}\n'));
      assert.equal(props.chat_template, config.chat_template.slice(0, -1));
      assert.equal(props.bos_token, '<|endoftext|>');
      assert.equal(props.eos_token, '<|im_end|>');
      // --skip-chat-parsing: replies are never parsed for tool calls or reasoning.
      assert.equal(props.default_generation_settings.params.chat_format, 'Content-only');
      assert.equal(props.chat_template_caps.supports_tool_calls, true);
    });

    it('GET /v1/models lists the one model by its alias, with n_ctx (per slot), n_ctx_train and n_vocab in meta', {
      timeout: 10_000,
    }, async () => {
      const reply = await get('/v1/models');
      assert.equal(reply.status, 200);
      assert.equal(reply.json.object, 'list');
      assert.equal(reply.json.data.length, 1);
      const model = reply.json.data[0];
      assert.equal(model.id, MODEL_NAME);
      assert.equal(model.object, 'model');
      assert.equal(model.owned_by, 'llamacpp');
      assert.deepEqual(model.aliases, [MODEL_NAME]);
      assert.equal(model.meta.n_ctx, SLOT_CTX);
      assert.equal(model.meta.n_ctx_train, 4096);
      assert.equal(model.meta.n_vocab, 151665);
      // An Ollama-style list rides along under `models`.
      assert.equal(reply.json.models[0].model, MODEL_NAME);
    });

    it('GET /slots lists each slot with n_ctx and is_processing', { timeout: 10_000 }, async () => {
      const list = await slots();
      assert.equal(list.length, SLOTS);
      for (const [i, slot] of list.entries()) {
        assert.equal(slot.id, i);
        assert.equal(slot.n_ctx, SLOT_CTX);
        assert.equal(typeof slot.is_processing, 'boolean');
      }
    });
  });

  describe('token ids in replies', () => {
    it('a non-streamed chat completion with logprobs gives each generated token’s id in choices[0].logprobs.content[], with token, bytes, logprob and top_logprobs', {
      timeout: 30_000,
    }, async () => {
      const messages = [{ role: 'user', content: 'Hi' }];
      // The end-of-turn token is held off (the model ends a reply now and then: make_model.py), so the reply runs to max_tokens.
      const reply = await post('/v1/chat/completions', {
        model: MODEL_NAME,
        messages,
        max_tokens: 8,
        logprobs: true,
        top_logprobs: 2,
        seed: 7,
        logit_bias: { [IM_END]: -100 },
      });
      assert.equal(reply.status, 200, reply.text);
      const body = reply.json;
      assert.deepEqual(Object.keys(body).sort(), [
        'choices',
        'created',
        'id',
        'model',
        'object',
        'system_fingerprint',
        'timings',
        'usage',
      ]);
      assert.equal(body.object, 'chat.completion');
      assert.equal(body.model, MODEL_NAME);
      assert.match(body.id, /^chatcmpl-/);
      assert.equal(body.system_fingerprint, `b1-${LLAMA_CPP_COMMIT.slice(0, 7)}`);
      assert.deepEqual(Object.keys(body.usage).sort(), [
        'completion_tokens',
        'prompt_tokens',
        'prompt_tokens_details',
        'total_tokens',
      ]);
      assert.equal(typeof body.usage.prompt_tokens_details.cached_tokens, 'number');
      const choice = body.choices[0];
      assert.equal(choice.finish_reason, 'length');
      assert.equal(choice.index, 0);
      assert.deepEqual(Object.keys(choice.message).sort(), ['content', 'role']);
      assert.equal(choice.message.role, 'assistant');
      assert.equal(body.usage.completion_tokens, 8);
      assert.equal(body.usage.prompt_tokens, enginePrompt(messages).ids.length);
      assert.equal(body.timings.predicted_n, 8);
      const content: any[] = choice.logprobs.content;
      // One entry per token, except that a token ending inside a UTF-8 character gets none (see below).
      assert.ok(content.length >= 1 && content.length <= 8, String(content.length));
      for (const entry of content) {
        assert.deepEqual(Object.keys(entry).sort(), ['bytes', 'id', 'logprob', 'token', 'top_logprobs']);
        assert.ok(Number.isInteger(entry.id) && qwen.hasToken(entry.id));
        assert.ok(entry.logprob <= 0);
        assert.equal(entry.top_logprobs.length, 2);
        assert.deepEqual(Object.keys(entry.top_logprobs[0]).sort(), ['bytes', 'id', 'logprob', 'token']);
      }
      // The entries' bytes together are the generated text; the message is that text less its leading
      // whitespace (next test).
      const text = Buffer.concat(content.map((e) => Buffer.from(e.bytes))).toString('utf8');
      assert.equal(text.replace(LEADING_C_SPACE, ''), choice.message.content);
      if (content.length === 8) assert.equal(qwen.decode(content.map((e) => e.id)), text);
    });

    it('the message content loses the generated text’s leading whitespace (also in the first streamed delta); the token and its logprob entry keep it', {
      timeout: 30_000,
    }, async () => {
      const messages = [{ role: 'user', content: 'Hi' }];
      const reply = await post('/v1/chat/completions', {
        messages,
        max_tokens: 2,
        logprobs: true,
        top_logprobs: 1,
        logit_bias: { [SPACE_HELLO]: 100 },
      });
      assert.equal(reply.json.choices[0].message.content, 'Hello Hello');
      assert.deepEqual(
        reply.json.choices[0].logprobs.content.map((e: { token: string }) => e.token),
        [' Hello', ' Hello'],
      );
      const streamed = await post('/v1/chat/completions', {
        messages,
        max_tokens: 2,
        logprobs: true,
        top_logprobs: 1,
        logit_bias: { [SPACE_HELLO]: 100 },
        stream: true,
      });
      const deltas = (sseEvents(streamed.text) as any[])
        .filter((e) => e !== '[DONE]' && e.choices[0]?.delta?.content)
        .map((e) => e.choices[0].delta.content);
      assert.deepEqual(deltas, ['Hello', ' Hello']);
      const completion = await post('/completion', {
        prompt: enginePrompt(messages).ids,
        n_predict: 2,
        return_tokens: true,
        logit_bias: [[SPACE_HELLO, 100]],
      });
      assert.equal(completion.json.content, ' Hello Hello', '/completion keeps it');
    });

    it('a token that ends inside a UTF-8 character gets no logprobs entry and is never streamed: only /completion’s non-streamed tokens (return_tokens) has every id', {
      timeout: 30_000,
    }, async () => {
      const messages = [{ role: 'user', content: 'Hi' }];
      const bias = { [LONE_LEAD_BYTE]: 100 };
      const chat = await post('/v1/chat/completions', {
        messages,
        max_tokens: 1,
        logprobs: true,
        top_logprobs: 1,
        logit_bias: bias,
      });
      assert.equal(chat.json.usage.completion_tokens, 1);
      assert.equal(chat.json.choices[0].message.content, '\uFFFD');
      assert.equal('logprobs' in chat.json.choices[0], false, 'no logprobs at all when no entry is left');
      const streamed = await post('/v1/chat/completions', {
        messages,
        max_tokens: 1,
        logprobs: true,
        top_logprobs: 1,
        logit_bias: bias,
        stream: true,
      });
      const events = sseEvents(streamed.text) as any[];
      assert.equal(events.length, 2, 'not even the role chunk: the finish chunk and [DONE]');
      assert.deepEqual(events[0].choices[0], { finish_reason: 'length', index: 0, delta: {} });
      const completion = await post('/completion', {
        prompt: enginePrompt(messages).ids,
        n_predict: 1,
        n_probs: 1,
        return_tokens: true,
        logit_bias: [[LONE_LEAD_BYTE, 100]],
      });
      assert.deepEqual(completion.json.tokens, [LONE_LEAD_BYTE]);
      assert.equal('completion_probabilities' in completion.json, false);
      const completionStream = sseEvents(
        (
          await post('/completion', {
            prompt: [IM_START, 872],
            n_predict: 1,
            n_probs: 1,
            return_tokens: true,
            logit_bias: [[LONE_LEAD_BYTE, 100]],
            stream: true,
          })
        ).text,
      ) as any[];
      assert.equal(completionStream.length, 1);
      assert.deepEqual(completionStream[0].tokens, []);
      assert.equal(completionStream[0].tokens_predicted, 1);
    });

    it('logprobs without top_logprobs gives 20 alternatives per token, and top_logprobs: 0 gives no logprobs at all', {
      timeout: 30_000,
    }, async () => {
      const messages = [{ role: 'user', content: 'Hi' }];
      const twenty = await post('/v1/chat/completions', { messages, max_tokens: 1, logprobs: true });
      assert.equal(twenty.json.choices[0].logprobs.content[0].top_logprobs.length, 20);
      const none = await post('/v1/chat/completions', { messages, max_tokens: 1, logprobs: true, top_logprobs: 0 });
      assert.equal(none.status, 200);
      assert.equal('logprobs' in none.json.choices[0], false);
    });

    it('logprobs are the model’s own (before logit_bias and sampling), and a generated end-of-turn token is in logprobs with empty text', {
      timeout: 30_000,
    }, async () => {
      const reply = await post('/v1/chat/completions', {
        messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: 4,
        logprobs: true,
        top_logprobs: 1,
        logit_bias: { [IM_END]: 100 },
      });
      const choice = reply.json.choices[0];
      assert.equal(choice.finish_reason, 'stop');
      assert.equal(choice.message.content, '');
      assert.equal(reply.json.usage.completion_tokens, 1);
      const [eot] = choice.logprobs.content;
      assert.equal(eot.id, IM_END);
      assert.equal(eot.token, '');
      assert.deepEqual(eot.bytes, []);
      assert.ok(eot.logprob < -5, `the bias does not show in the logprob: ${eot.logprob}`);
      // The same prompt without the bias: the end-of-turn token's logprob among the alternatives is the same number.
      const plain = await post('/v1/chat/completions', {
        messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: 1,
        logprobs: true,
        top_logprobs: 5,
      });
      const unbiased = (
        plain.json.choices[0].logprobs.content[0].top_logprobs as { id: number; logprob: number }[]
      ).find((t) => t.id === IM_END);
      assert.ok(unbiased !== undefined, 'the end-of-turn token is among the top 5 of this model');
      assert.ok(Math.abs(unbiased.logprob - eot.logprob) < 1e-3, `${unbiased.logprob} vs ${eot.logprob}`);
    });

    it('a streamed chat completion carries logprobs with ids in every content chunk, then a finish_reason chunk, a usage chunk and [DONE]', {
      timeout: 30_000,
    }, async () => {
      const reply = await post('/v1/chat/completions', {
        messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: 5,
        ignore_eos: true,
        logprobs: true,
        top_logprobs: 1,
        stream: true,
        stream_options: { include_usage: true },
      });
      assert.equal(reply.status, 200);
      assert.match(reply.headers.get('content-type') ?? '', /^text\/event-stream/);
      const events = sseEvents(reply.text) as any[];
      assert.equal(events.at(-1), '[DONE]');
      const chunks = events.slice(0, -1);
      // First: the role, content null, no logprobs.
      assert.deepEqual(chunks[0].choices[0].delta, { role: 'assistant', content: null });
      const withLogprobs = chunks.filter((c) => c.choices[0]?.logprobs);
      let entries = 0;
      for (const chunk of withLogprobs) {
        assert.equal(chunk.object, 'chat.completion.chunk');
        assert.equal(chunk.choices[0].finish_reason, null);
        // One token per chunk: its entry rides on the chunk with its text.
        assert.equal(chunk.choices[0].logprobs.content.length, 1);
        const [entry] = chunk.choices[0].logprobs.content;
        assert.deepEqual(Object.keys(entry).sort(), ['bytes', 'id', 'logprob', 'token', 'top_logprobs']);
        assert.ok(qwen.hasToken(entry.id));
        assert.equal(entry.top_logprobs.length, 1);
        entries++;
      }
      assert.ok(entries >= 1 && entries <= 5, String(entries));
      const finish = chunks.find((c) => c.choices[0]?.finish_reason);
      assert.equal(finish.choices[0].finish_reason, 'length');
      assert.deepEqual(finish.choices[0].delta, {});
      const usage = chunks.at(-1);
      assert.deepEqual(usage.choices, []);
      assert.equal(usage.usage.completion_tokens, 5);
      assert.equal(typeof usage.timings.predicted_n, 'number');
      // Without stream_options.include_usage there is no usage chunk: the finish chunk carries the timings.
      const plain = sseEvents(
        (
          await post('/v1/chat/completions', {
            messages: [{ role: 'user', content: 'Hi' }],
            max_tokens: 2,
            ignore_eos: true,
            stream: true,
          })
        ).text,
      ) as any[];
      assert.equal(
        plain.some((e) => e !== '[DONE]' && 'usage' in e),
        false,
      );
      assert.equal(typeof plain.at(-2).timings.predicted_n, 'number');
      assert.equal(new Set(chunks.map((c) => c.id)).size, 1);
    });

    it('/completion takes the prompt as token ids and, with return_tokens and n_probs, gives the generated ids in tokens and completion_probabilities', {
      timeout: 30_000,
    }, async () => {
      const prompt = enginePrompt([{ role: 'user', content: 'Hi' }]).ids;
      const reply = await post('/completion', {
        prompt,
        n_predict: 6,
        ignore_eos: true,
        n_probs: 2,
        return_tokens: true,
        seed: 3,
      });
      assert.equal(reply.status, 200, reply.text);
      const body = reply.json;
      assert.deepEqual(
        Object.keys(body)
          .filter((k) => k !== 'completion_probabilities')
          .sort(),
        [
          'content',
          'generation_settings',
          'has_new_line',
          'id_slot',
          'index',
          'model',
          'prompt',
          'stop',
          'stop_type',
          'stopping_word',
          'timings',
          'tokens',
          'tokens_cached',
          'tokens_evaluated',
          'tokens_predicted',
          'truncated',
        ],
      );
      assert.equal(body.tokens.length, 6);
      assert.equal(body.tokens_predicted, 6);
      assert.equal(body.tokens_evaluated, prompt.length);
      assert.equal(body.stop, true);
      assert.equal(body.stop_type, 'limit');
      assert.equal(body.stopping_word, '');
      assert.equal(body.truncated, false);
      assert.equal(body.model, MODEL_NAME);
      assert.equal(body.prompt, qwen.decode(prompt));
      assert.ok(Number.isInteger(body.id_slot));
      assert.equal(body.generation_settings.n_probs, 2);
      assert.equal(body.timings.prompt_n + body.timings.cache_n, prompt.length);
      assert.equal(body.tokens_cached, prompt.length + 6 - 1);
      // completion_probabilities: one per token but for tokens ending inside a UTF-8 character (whose
      // entry is dropped, the next entry's bytes then holding both): the ids are a subsequence of tokens.
      const probs: any[] = body.completion_probabilities;
      let at = 0;
      for (const p of probs) {
        assert.deepEqual(Object.keys(p).sort(), ['bytes', 'id', 'logprob', 'token', 'top_logprobs']);
        assert.equal(p.top_logprobs.length, 2);
        while (at < body.tokens.length && body.tokens[at] !== p.id) at++;
        assert.ok(at < body.tokens.length, `probability for ${p.id} is not among tokens ${body.tokens}`);
        at++;
      }
      if (probs.length === 6) {
        assert.deepEqual(
          probs.map((p) => p.id),
          body.tokens,
        );
        assert.equal(body.content, qwen.decode(body.tokens));
      }
    });

    it('/completion without return_tokens leaves tokens empty, and post_sampling_probs turns logprob into prob and top_logprobs into top_probs', {
      timeout: 30_000,
    }, async () => {
      const reply = await post('/completion', {
        prompt: [IM_START, 872],
        n_predict: 2,
        ignore_eos: true,
        n_probs: 1,
        post_sampling_probs: true,
      });
      assert.deepEqual(reply.json.tokens, []);
      for (const p of reply.json.completion_probabilities) {
        assert.deepEqual(Object.keys(p).sort(), ['bytes', 'id', 'prob', 'token', 'top_probs']);
        assert.ok(p.prob > 0 && p.prob <= 1);
      }
    });

    it('/completion at an end-of-turn token stops with stop_type eos and keeps the id in tokens', {
      timeout: 30_000,
    }, async () => {
      const reply = await post('/completion', {
        prompt: [IM_START, 872],
        n_predict: 4,
        n_probs: 1,
        return_tokens: true,
        logit_bias: [[IM_END, 100]],
      });
      assert.equal(reply.json.stop_type, 'eos');
      assert.deepEqual(reply.json.tokens, [IM_END]);
      assert.equal(reply.json.content, '');
      assert.equal(reply.json.completion_probabilities[0].id, IM_END);
    });

    it('a streamed /completion sends tokens and completion_probabilities per chunk (id_slot -1 until the last), then a final chunk with stop true and no [DONE]', {
      timeout: 30_000,
    }, async () => {
      const reply = await post('/completion', {
        prompt: [IM_START, 872],
        n_predict: 3,
        ignore_eos: true,
        n_probs: 1,
        return_tokens: true,
        stream: true,
      });
      const events = sseEvents(reply.text) as any[];
      assert.equal(events.length, 4);
      for (const e of events.slice(0, 3)) {
        assert.equal(e.stop, false);
        assert.equal(e.id_slot, -1);
        assert.equal(e.tokens.length, 1);
        assert.equal(e.completion_probabilities[0].id, e.tokens[0]);
      }
      const last = events[3];
      assert.equal(last.stop, true);
      assert.deepEqual(last.tokens, []);
      assert.equal(last.stop_type, 'limit');
      assert.ok(last.id_slot >= 0);
    });
  });

  describe('replies are not parsed (--skip-chat-parsing)', () => {
    it('tool-call text stays in message.content, with tools in the request or not, and no tool_calls field appears', {
      timeout: 30_000,
    }, async () => {
      const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} } } }];
      for (const withTools of [false, true]) {
        const reply = await post('/v1/chat/completions', {
          messages: [{ role: 'user', content: 'Hi' }],
          ...(withTools ? { tools } : {}),
          max_tokens: 3,
          logit_bias: { 151657: 100 },
        });
        assert.equal(reply.status, 200, reply.text);
        assert.deepEqual(reply.json.choices[0].message, {
          role: 'assistant',
          content: '<tool_call><tool_call><tool_call>',
        });
        assert.equal(reply.json.choices[0].finish_reason, 'length');
      }
    });

    it('random replies, streamed or not, at temperature 1 over the whole vocabulary, all answer 200 without an error event', {
      timeout: 120_000,
    }, async () => {
      for (let seed = 1; seed <= 10; seed++) {
        const stream = seed % 2 === 0;
        const reply = await post('/v1/chat/completions', {
          messages: [{ role: 'user', content: 'Hi' }],
          max_tokens: 64,
          seed,
          stream,
          temperature: 1,
          top_k: 0,
          top_p: 1,
          min_p: 0,
          logprobs: true,
          top_logprobs: 1,
        });
        assert.equal(reply.status, 200, reply.text);
        if (stream)
          assert.equal(
            (sseEvents(reply.text) as any[]).some((e) => e !== '[DONE]' && 'error' in e),
            false,
            reply.text,
          );
      }
    });
  });

  describe('the Qwen2.5 template and tokenizer: the engine’s are the server’s', () => {
    for (const [name, messages] of Object.entries(CONVERSATIONS)) {
      it(`for ${name}, /apply-template and /tokenize give the engine’s text and ids, and the chat completion’s prompt is those ids`, {
        timeout: 30_000,
      }, async () => {
        const engine = enginePrompt(messages);
        const rendered = await post('/apply-template', { messages });
        assert.equal(rendered.status, 200, rendered.text);
        assert.deepEqual(rendered.json, { prompt: engine.text });
        const tokenized = await post('/tokenize', { content: engine.text });
        assert.deepEqual(tokenized.json, { tokens: engine.ids });
        // The ids the chat completion evaluated: run it in slot 0, then send the engine's ids to the same
        // slot; the server re-evaluates only what differs from its cache, so cache_n = all but the last
        // token proves every id equal.
        const chat = await post('/v1/chat/completions', { messages, max_tokens: 1, id_slot: 0 });
        assert.equal(chat.status, 200, chat.text);
        assert.equal(chat.json.usage.prompt_tokens, engine.ids.length);
        const completion = await post('/completion', { prompt: engine.ids, n_predict: 1, id_slot: 0 });
        assert.equal(completion.json.timings.cache_n, engine.ids.length - 1);
        assert.equal(completion.json.timings.prompt_n, 1);
      });
    }

    it('a conversation ending with an assistant message is closed and a new assistant turn opened (--no-prefill-assistant), as the template does with add_generation_prompt', {
      timeout: 30_000,
    }, async () => {
      const messages = [
        { role: 'user', content: 'Hi' },
        { role: 'assistant', content: 'Hello!' },
      ];
      const engine = enginePrompt(messages);
      assert.ok(engine.text.endsWith('<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>assistant\n'));
      const rendered = await post('/apply-template', { messages });
      assert.equal(rendered.json.prompt, engine.text);
      const chat = await post('/v1/chat/completions', { messages, max_tokens: 1 });
      assert.equal(chat.json.usage.prompt_tokens, engine.ids.length);
    });

    it('/tokenize matches the engine’s tokenizer on assorted text, special-token spellings included', {
      timeout: 30_000,
    }, async () => {
      const samples = [
        'Hello world',
        " it's  they're   we'll\tI'd",
        '12345678901234567890 3.14159 1e-9 0x1F',
        '日本語のテキスト、中文文本，한국어 텍스트',
        'emoji 🧪🔬👩‍🔬 and a composed é',
        'code: for (let i = 0; i < n; i++) { a[i] += b[i]; }\n\n\n    indented\r\n',
        '<|im_start|>user\nx<|im_end|><|endoftext|><tool_call>{"a":1}</tool_call><|fim_prefix|>',
        '   ',
        '\n\n',
      ];
      for (const text of samples) {
        const reply = await post('/tokenize', { content: text });
        assert.deepEqual(reply.json.tokens, qwen.encode(text), JSON.stringify(text));
      }
    });

    it('text not in Unicode NFC tokenizes differently: the engine composes it first (tokenizer.json’s NFC normalizer), llama.cpp does not', {
      timeout: 30_000,
    }, async () => {
      const decomposed = 'caf\u0065\u0301'; // café with a combining acute accent
      const server = (await post('/tokenize', { content: decomposed })).json.tokens;
      assert.notDeepEqual(server, qwen.encode(decomposed));
      assert.deepEqual(qwen.encode(decomposed), qwen.encode(decomposed.normalize('NFC')));
      assert.deepEqual(
        (await post('/tokenize', { content: decomposed.normalize('NFC') })).json.tokens,
        qwen.encode(decomposed),
      );
    });

    it('/tokenize with parse_special false reads special-token spellings as plain text, with_pieces gives {id, piece}; /detokenize gives {content}', {
      timeout: 30_000,
    }, async () => {
      const plain = await post('/tokenize', { content: '<|im_end|>', parse_special: false, with_pieces: true });
      assert.deepEqual(
        plain.json.tokens.map((t: { piece: string }) => t.piece),
        ['<', '|', 'im', '_end', '|', '>'],
      );
      assert.deepEqual(Object.keys(plain.json.tokens[0]).sort(), ['id', 'piece']);
      const special = await post('/tokenize', { content: 'a<|im_end|>' });
      assert.deepEqual(special.json, { tokens: [64, IM_END] });
      const withBos = await post('/tokenize', { content: 'a', add_special: true });
      assert.deepEqual(withBos.json, { tokens: [64] }, 'Qwen2.5 adds no BOS');
      const text = await post('/detokenize', { tokens: [IM_START, 872, 198, 13048, IM_END, ENDOFTEXT] });
      assert.deepEqual(text.json, { content: '<|im_start|>user\nHi<|im_end|><|endoftext|>' });
    });
  });

  describe('limits and errors', () => {
    it('a prompt longer than the slot’s context is refused with 400 and type exceed_context_size_error, before any streaming', {
      timeout: 30_000,
    }, async () => {
      const messages = [{ role: 'user', content: 'hello '.repeat(SLOT_CTX + 50) }];
      const promptTokens = enginePrompt(messages).ids.length;
      for (const stream of [false, true]) {
        const reply = await post('/v1/chat/completions', { messages, max_tokens: 4, ignore_eos: true, stream });
        assert.equal(reply.status, 400, reply.text);
        assert.match(reply.headers.get('content-type') ?? '', /application\/json/);
        assert.deepEqual(reply.json, {
          error: {
            code: 400,
            message: `request (${promptTokens} tokens) exceeds the available context size (${SLOT_CTX} tokens), try increasing it`,
            type: 'exceed_context_size_error',
            n_prompt_tokens: promptTokens,
            n_ctx: SLOT_CTX,
          },
        });
      }
      const ids = new Array(SLOT_CTX).fill(13048);
      const completion = await post('/completion', { prompt: ids, n_predict: 1 });
      assert.equal(completion.status, 400);
      assert.equal(completion.json.error.type, 'exceed_context_size_error');
      assert.equal(completion.json.error.n_prompt_tokens, SLOT_CTX);
    });

    it('a generation that reaches the end of the slot’s context stops early with stop_type limit and truncated true (finish_reason length in chat)', {
      timeout: 60_000,
    }, async () => {
      const prompt = new Array(SLOT_CTX - 20).fill(13048);
      const reply = await post('/completion', { prompt, n_predict: 100, ignore_eos: true, return_tokens: true });
      assert.equal(reply.status, 200, reply.text);
      assert.equal(reply.json.stop_type, 'limit');
      assert.equal(reply.json.truncated, true);
      assert.ok(
        reply.json.tokens_predicted < 100 && reply.json.tokens_predicted > 0,
        String(reply.json.tokens_predicted),
      );
      const text = qwen.decode(new Array(SLOT_CTX - 60).fill(13048));
      // ignore_eos: the tiny random model may otherwise sample <|im_end|> before the limit (a run read
      // finish_reason "stop"), which is not what this test is about.
      const chat = await post('/v1/chat/completions', {
        messages: [{ role: 'user', content: text }],
        max_tokens: 100,
        ignore_eos: true,
      });
      assert.equal(chat.status, 200, chat.text);
      assert.equal(chat.json.choices[0].finish_reason, 'length');
      assert.ok(chat.json.usage.completion_tokens < 100);
    });

    it('an unknown route answers 404 with an OpenAI-style error', { timeout: 10_000 }, async () => {
      const reply = await post('/v1/nope', {});
      assert.equal(reply.status, 404);
      assert.deepEqual(reply.json, { error: { message: 'File Not Found', type: 'not_found_error', code: 404 } });
    });
  });

  describe('stopping a generation', () => {
    it('closing the connection of a streamed chat completion frees its slot at the next token', {
      timeout: 60_000,
    }, async (t) => {
      await waitFor('idle before', allIdle, 30_000);
      const open = openRequest('/v1/chat/completions', {
        messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: SLOT_CTX - 40,
        stream: true,
        ignore_eos: true,
      });
      const res = await open.response;
      assert.equal(res.statusCode, 200);
      await readEvents(res, 4);
      assert.ok(await anyBusy(), 'a slot is processing');
      open.cut();
      const ms = await waitFor('slot freed after the stream was closed', allIdle, 5_000);
      t.diagnostic(`freed ${ms} ms after the close`);
      assert.ok(ms < 2_000, `${ms} ms`);
      const metrics = await get('/metrics');
      assert.match(metrics.text, /^llamacpp:requests_processing 0$/m);
    });

    it('closing the connection of a non-streamed chat completion is noticed only after a second with no result traffic on the server: then the slot is freed', {
      timeout: 60_000,
    }, async () => {
      await waitFor('idle before', allIdle, 30_000);
      const before = await tokensPredicted();
      const open = openRequest('/v1/chat/completions', {
        messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: SLOT_CTX - 40,
        ignore_eos: true,
      });
      await new Promise((r) => setTimeout(r, 400));
      open.cut();
      // The request's handler waits for its result 1 s at a time and checks the connection only when a
      // wait times out; any other request's result (even GET /slots) restarts the wait. So: quiet.
      await new Promise((r) => setTimeout(r, 2_500));
      assert.ok(await allIdle(), 'freed');
      const predicted = (await tokensPredicted()) - before;
      assert.ok(predicted < SLOT_CTX - 40, `cancelled after ${predicted} tokens`);
    });

    it('closing the connection of a non-streamed chat completion while other requests keep coming does not stop it: it runs to max_tokens', {
      timeout: 120_000,
    }, async () => {
      await waitFor('idle before', allIdle, 30_000);
      const before = await tokensPredicted();
      const open = openRequest('/v1/chat/completions', {
        messages: [{ role: 'user', content: 'Hi' }],
        max_tokens: 150,
        ignore_eos: true,
      });
      await waitFor('slot busy', anyBusy, 10_000);
      open.cut();
      await waitFor('the generation to end', allIdle, 100_000); // polls /slots every 20 ms: traffic
      assert.equal((await tokensPredicted()) - before, 150);
    });

    it('there is no abort route: POST /abort_request and /abort_requests answer 404, and /v1/chat/completions/control knows only reasoning_end', {
      timeout: 10_000,
    }, async () => {
      for (const path of ['/abort_request', '/abort_requests', '/v1/abort_request', '/abort']) {
        const reply = await post(path, { rid: 'x' });
        assert.equal(reply.status, 404, path);
        assert.deepEqual(reply.json, { error: { message: 'File Not Found', type: 'not_found_error', code: 404 } });
      }
      const abort = await post('/v1/chat/completions/control', { id: 'chatcmpl-x', action: 'abort' });
      assert.equal(abort.status, 400);
      assert.deepEqual(abort.json, {
        error: { code: 400, message: 'unknown control action', type: 'invalid_request_error' },
      });
      const reasoningEnd = await post('/v1/chat/completions/control', { id: 'chatcmpl-x', action: 'reasoning_end' });
      assert.equal(reasoningEnd.status, 200);
      assert.deepEqual(reasoningEnd.json, { success: false, message: 'no active completion for this id' });
    });

    it('a streamed request with an X-Conversation-Id header survives a closed connection, and DELETE /v1/stream?conv_id= stops it', {
      timeout: 60_000,
    }, async (t) => {
      await waitFor('idle before', allIdle, 30_000);
      const conv = `conv-${process.pid}-${Date.now()}`;
      const open = openRequest(
        '/v1/chat/completions',
        { messages: [{ role: 'user', content: 'Hi' }], max_tokens: SLOT_CTX - 40, stream: true, ignore_eos: true },
        { 'X-Conversation-Id': conv },
      );
      const res = await open.response;
      await readEvents(res, 3);
      open.cut();
      await new Promise((r) => setTimeout(r, 500));
      assert.ok(await anyBusy(), 'generation goes on without a client');
      const del = await call('DELETE', `/v1/stream?conv_id=${encodeURIComponent(conv)}`);
      assert.equal(del.status, 204);
      const ms = await waitFor('slot freed after DELETE /v1/stream', allIdle, 5_000);
      t.diagnostic(`freed ${ms} ms after the DELETE`);
      assert.ok(ms < 2_000, `${ms} ms`);
      const missing = await call('DELETE', '/v1/stream');
      assert.equal(missing.status, 400);
    });
  });
});

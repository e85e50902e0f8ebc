/**
 * The mock's dialects: each trait of vLLM, SGLang and llama.cpp that the mock reproduces, asserted
 * against the shape its server's source gives (the comment beside each names the file, function and
 * commit; src/mock-llm/dialects.ts holds the same references).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { TestContext } from 'node:test';
import { request } from 'undici';
import { startMockLlm } from '../src/mock-llm/server.ts';
import type { MockLlm, MockLlmOptions } from '../src/mock-llm/server.ts';
import { loadVocabulary } from '../src/mock-llm/vocab.ts';
import { within } from './support/waits.ts';

const ARITHMETIC = [{ role: 'user', content: 'Compute 2 + 3. Answer with the number only.' }];
/** cl100k `<|im_end|>`: the end-of-turn token the dialects return last on a natural stop. */
const IM_END = 100265;

async function start(t: TestContext, options: MockLlmOptions): Promise<MockLlm> {
  const mock = await startMockLlm({ host: '127.0.0.1', port: 0, ...options });
  t.after(() => mock.close());
  return mock;
}

interface Answer {
  status: number;
  text: string;
  json: any;
  headers: Record<string, string | string[] | undefined>;
}

async function call(mock: MockLlm, method: string, path: string, body?: unknown): Promise<Answer> {
  const res = await request(`${mock.url}${path}`, {
    method: method as 'GET',
    headers: { 'content-type': 'application/json' },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.body.text();
  let json: unknown = null;
  try {
    json = JSON.parse(text);
  } catch {
    // SSE, or an empty body
  }
  return { status: res.statusCode, text, json, headers: res.headers };
}

/** The JSON events of a server-sent event stream, [DONE] left out. */
function events(text: string): any[] {
  const out: any[] = [];
  for (const block of text.split('\n\n')) {
    if (!block.startsWith('data: ')) continue;
    const data = block.slice(6);
    if (data !== '[DONE]') out.push(JSON.parse(data));
  }
  assert.ok(text.trimEnd().endsWith('data: [DONE]'), 'the stream ends with [DONE]');
  return out;
}

describe('mock-llm dialect option', () => {
  it('refuses an unknown dialect with a coded error naming the option and the value', async () => {
    await assert.rejects(startMockLlm({ dialect: 'tgi' as never }), (error: Error & { code?: string }) => {
      assert.equal(error.code, 'ERR_INVALID_OPTION');
      assert.match(
        error.message,
        /mock-llm: option dialect must be one of default, vllm, sglang, llamacpp \(got "tgi"\)/,
      );
      return true;
    });
  });

  it('refuses a context length without a dialect, naming both options', async () => {
    await assert.rejects(
      startMockLlm({ contextLength: 4096 }),
      /option contextLength applies to the vllm, sglang and llamacpp dialects only \(set option dialect too\) \(got 4096\)/,
    );
  });

  it('refuses a non-integer weight version on the default dialect but takes a string on sglang', async (t) => {
    await assert.rejects(
      startMockLlm({ weightVersion: 'v1' }),
      /option weightVersion must be a non-negative integer \(got "v1"\)/,
    );
    const mock = await start(t, { dialect: 'sglang', weightVersion: 'run-7' });
    assert.equal(mock.reportedWeightVersion, 'run-7');
  });

  it('keeps the mock-only admin routes and numeric weight version on the default dialect', async (t) => {
    const mock = await start(t, { weightVersion: 3 });
    const reply = await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    assert.equal(reply.json.metadata.weight_version, 3);
    assert.equal((await call(mock, 'POST', '/admin/abort')).status, 200);
    assert.equal(mock.reportedWeightVersion, 3);
  });
});

describe('vllm dialect', () => {
  it('puts completion ids on the choice and prompt ids top level with return_token_ids, and no weight version (serving_chat.py chat_completion_full_generator @99c5632)', async (t) => {
    const mock = await start(t, { dialect: 'vllm', weightVersion: 5 });
    const { status, json } = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      return_token_ids: true,
      logprobs: true,
    });
    assert.equal(status, 200);
    const choice = json.choices[0];
    assert.ok(Array.isArray(choice.token_ids));
    assert.equal(choice.token_ids.at(-1), IM_END, 'a natural stop returns the sampled end-of-turn token');
    assert.equal(choice.logprobs.content.length, choice.token_ids.length);
    assert.ok(Array.isArray(choice.logprobs.content[0].bytes), 'vLLM logprob entries carry bytes');
    assert.ok(Array.isArray(json.prompt_token_ids) && json.prompt_token_ids.length === json.usage.prompt_tokens);
    assert.equal(json.usage.completion_tokens, choice.token_ids.length);
    assert.equal(choice.stop_reason, null);
    assert.equal('metadata' in json, false, 'vLLM replies carry no weight version');
    assert.equal(choice.message.content.includes('<|im_end|>'), false);
  });

  it('sends null token_ids and prompt_token_ids without return_token_ids (model_dump keeps unset Optional fields)', async (t) => {
    const mock = await start(t, { dialect: 'vllm' });
    const { json } = await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    assert.equal(json.choices[0].token_ids, null);
    assert.equal(json.prompt_token_ids, null);
    assert.equal(json.choices[0].logprobs, null);
  });

  it('answers a model it does not serve with 404 NotFoundError naming the model (engine/serving.py _check_model @00bd149)', async (t) => {
    const mock = await start(t, { dialect: 'vllm', model: 'Qwen/Qwen2.5-7B' });
    const chat = await call(mock, 'POST', '/v1/chat/completions', { model: 'gpt-4', messages: ARITHMETIC });
    assert.equal(chat.status, 404);
    assert.deepEqual(chat.json, {
      error: { message: 'The model `gpt-4` does not exist.', type: 'NotFoundError', param: 'model', code: 404 },
    });
    const completions = await call(mock, 'POST', '/v1/completions', { model: 'gpt-4', prompt: [1, 2, 3] });
    assert.equal(completions.status, 404);
    assert.equal(
      (await call(mock, 'POST', '/v1/chat/completions', { model: 'Qwen/Qwen2.5-7B', messages: ARITHMETIC })).status,
      200,
    );
  });

  it('lists the model with owned_by vllm and max_model_len = the context (models/serving.py show_available_models @00153c8)', async (t) => {
    const mock = await start(t, { dialect: 'vllm', contextLength: 4096, model: 'm' });
    const { json } = await call(mock, 'GET', '/v1/models');
    assert.equal(json.object, 'list');
    assert.equal(json.data[0].id, 'm');
    assert.equal(json.data[0].owned_by, 'vllm');
    assert.equal(json.data[0].max_model_len, 4096);
  });

  it('refuses prompt + max_tokens over the context with its 400 text, and caps a request without max_tokens (engine/serving.py _validate_input @00bd149)', async (t) => {
    const mock = await start(t, { dialect: 'vllm', contextLength: 30 });
    const over = await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC, max_tokens: 20 });
    assert.equal(over.status, 400);
    assert.deepEqual(over.json, {
      error: {
        message:
          "'max_tokens' or 'max_completion_tokens' is too large: 20. This model's maximum context length is 30 tokens and your request has 21 input tokens (20 > 30 - 21). (parameter=max_tokens, value=20)",
        type: 'BadRequestError',
        param: 'max_tokens',
        code: 400,
      },
    });
    const long = await call(mock, 'POST', '/v1/chat/completions', {
      messages: [{ role: 'user', content: 'word '.repeat(40) }],
    });
    assert.equal(long.status, 400);
    assert.match(
      long.json.error.message,
      /^This model's maximum context length is 30 tokens\. However, your request has \d+ input tokens\. Please reduce the length of the input messages\. \(parameter=input_tokens, value=\d+\)$/,
    );
    assert.equal(long.json.error.param, 'input_tokens');
  });

  it('gives a request without max_tokens the rest of the context as its budget (get_max_tokens)', async (t) => {
    const mock = await start(t, { dialect: 'vllm', contextLength: 30, thinkTokens: 50 });
    const capped = await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC, return_token_ids: true });
    assert.equal(capped.status, 200);
    assert.equal(capped.json.choices[0].finish_reason, 'length');
    assert.equal(capped.json.usage.total_tokens, 30);
  });

  it('streams prompt ids in the role chunk and token_ids per chunk, stop_reason at the end, and no weight version (chat_completion_stream_generator @99c5632)', async (t) => {
    const mock = await start(t, { dialect: 'vllm', tokensPerSecond: 2000, streamIntervalMs: 1 });
    const whole = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      seed: 9,
      return_token_ids: true,
      logprobs: true,
    });
    const streamed = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      seed: 9,
      return_token_ids: true,
      logprobs: true,
      stream: true,
    });
    const chunks = events(streamed.text);
    assert.deepEqual(chunks[0].prompt_token_ids, whole.json.prompt_token_ids);
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    const ids = chunks.slice(1).flatMap((c) => c.choices[0].token_ids);
    assert.deepEqual(ids, whole.json.choices[0].token_ids);
    const logprobs = chunks
      .slice(1)
      .flatMap((c) => c.choices[0].logprobs.content.map((e: { logprob: number }) => e.logprob));
    assert.deepEqual(
      logprobs,
      whole.json.choices[0].logprobs.content.map((e: { logprob: number }) => e.logprob),
      'vLLM streams the end token and its logprob too',
    );
    const last = chunks.at(-1);
    assert.equal(last.choices[0].finish_reason, 'stop');
    assert.equal(last.choices[0].stop_reason, null);
    assert.equal(
      chunks.some((c) => 'metadata' in c),
      false,
    );
    assert.equal(chunks.map((c) => c.choices[0].delta.content ?? '').join(''), whole.json.choices[0].message.content);
  });

  it('answers token-id prompts on /v1/completions with choice token ids and token_logprobs, and no metadata (completion/serving.py request_output_to_completion_response @030ea52)', async (t) => {
    const mock = await start(t, { dialect: 'vllm' });
    const vocab = await loadVocabulary('cl100k');
    const prompt = vocab.encode(
      '<|im_start|>user\nCompute 2 + 3. Answer with the number only.<|im_end|>\n<|im_start|>assistant\n',
    );
    const { status, json } = await call(mock, 'POST', '/v1/completions', {
      prompt,
      max_tokens: 50,
      logprobs: 1,
      return_token_ids: true,
    });
    assert.equal(status, 200);
    const choice = json.choices[0];
    assert.deepEqual(choice.prompt_token_ids, prompt);
    assert.equal(choice.token_ids.at(-1), vocab.endOfTurnId);
    assert.equal(choice.logprobs.token_logprobs.length, choice.token_ids.length);
    assert.equal('metadata' in json, false);
  });

  it('aborts every request in flight on POST /abort_requests {} and refuses an empty body (dev/rlhf/api_router.py abort_requests @0100a21)', async (t) => {
    const mock = await start(t, { dialect: 'vllm', latencyMs: 60_000 });
    const pending = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForInFlight(1);
    const empty = await call(mock, 'POST', '/abort_requests', '');
    assert.equal(empty.status, 400);
    assert.deepEqual(empty.json, {
      error: { message: 'Invalid JSON format', type: 'Bad Request', param: null, code: 400 },
    });
    const aborted = await call(mock, 'POST', '/abort_requests', {});
    assert.deepEqual(aborted.json, { status: 'aborted', aborted: 1 });
    assert.equal((await pending).json.choices[0].finish_reason, 'abort');
  });

  it('aborts only the named request ids on /abort_requests {request_ids}', async (t) => {
    const mock = await start(t, { dialect: 'vllm', latencyMs: 60_000 });
    const first = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForInFlight(1);
    const second = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForInFlight(2);
    const answer = await call(mock, 'POST', '/abort_requests', { request_ids: ['chatcmpl-mock-1'] });
    assert.deepEqual(answer.json, { status: 'aborted', aborted: 1 });
    assert.equal((await second).json.id, 'chatcmpl-mock-1');
    assert.equal(mock.stats().inFlight, 1);
    mock.abortAll();
    await first;
  });

  it('has no /abort_request and no mock admin routes: 404 {"detail":"Not Found"}, and 405 on a known route', async (t) => {
    const mock = await start(t, { dialect: 'vllm' });
    for (const path of ['/abort_request', '/admin/abort', '/generate', '/props', '/get_model_info']) {
      const answer = await call(mock, 'POST', path, {});
      assert.equal(answer.status, 404, path);
      assert.deepEqual(answer.json, { detail: 'Not Found' });
    }
    const wrong = await call(mock, 'GET', '/v1/chat/completions');
    assert.equal(wrong.status, 405);
    assert.deepEqual(wrong.json, { detail: 'Method Not Allowed' });
  });

  it('reads and sets a string weight version on the dev-mode routes, in no reply (dev/rlhf/api_router.py weight_info, update_weight_version @0100a21)', async (t) => {
    const mock = await start(t, { dialect: 'vllm' });
    assert.deepEqual((await call(mock, 'GET', '/weight_info')).json, { weight_version: 'default' });
    assert.deepEqual((await call(mock, 'POST', '/update_weight_version', { new_version: 'step-3' })).json, {
      success: true,
      new_version: 'step-3',
    });
    assert.deepEqual((await call(mock, 'GET', '/weight_info')).json, { weight_version: 'step-3' });
    const missing = await call(mock, 'POST', '/update_weight_version', {});
    assert.equal(missing.status, 422);
    assert.equal(missing.json.detail[0].type, 'missing');
    assert.equal(
      'metadata' in (await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC })).json,
      false,
    );
  });

  it('answers the dev-mode routes 404 when launched without VLLM_SERVER_DEV_MODE (vllmDevMode: false)', async (t) => {
    const mock = await start(t, { dialect: 'vllm', vllmDevMode: false });
    for (const [method, path] of [
      ['POST', '/abort_requests'],
      ['GET', '/weight_info'],
      ['POST', '/update_weight_version'],
      ['POST', '/pause?mode=keep'],
      ['POST', '/resume'],
    ]) {
      assert.equal((await call(mock, method, path, method === 'POST' ? {} : undefined)).status, 404, path);
    }
  });
});

describe('vllm dialect: pausing generation around a weight update', () => {
  // vllm/entrypoints/serve/dev/rlhf/api_router.py pause_generation, resume_generation
  // @0100a2129224e729af1b3b8ed42a900cdfe9a452 (dev mode only; query parameters, no body); the modes:
  // vllm/v1/engine/core.py EngineCoreProc.pause_scheduler @00080ee13c7a451fce071ccb8d0e94d395acf5a7.
  it('keeps a request in flight across POST /pause?mode=keep and finishes it after POST /resume, holding new ones meanwhile', async (t) => {
    const mock = await start(t, { dialect: 'vllm', latencyMs: 300 });
    const first = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForInFlight(1);
    const paused = await call(mock, 'POST', '/pause?mode=keep&clear_cache=false');
    assert.deepEqual([paused.status, paused.text], [200, '{"status":"paused"}']);
    const second = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForRequests(2);
    assert.equal(mock.stats().aborted, 0, 'a keep pause aborts nothing');
    const resumed = await call(mock, 'POST', '/resume');
    assert.deepEqual([resumed.status, resumed.text], [200, '{"status":"resumed"}']);
    for (const reply of await Promise.all([first, second]))
      assert.equal(reply.json.choices[0].finish_reason, 'stop', 'generated whole, not aborted');
    assert.equal(mock.stats().aborted, 0);
  });

  it('keeps the KV of a kept request only with clear_cache=false: by default its prompt and tokens are prefilled again after the resume (docs/training/async_rl.md @006ebac)', async (t) => {
    for (const clearCache of [false, true]) {
      const mock = await start(t, {
        dialect: 'vllm',
        capacity: { slots: 2, responseTokens: 5_000, lengthSigma: 0, speedup: 1 },
      });
      const pending = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC, max_tokens: 6_000 });
      await mock.waitForStats((s) => s.gpu!.generatedTokens > 0);
      assert.equal((await call(mock, 'POST', `/pause?mode=keep&clear_cache=${clearCache}`)).status, 200);
      // Preempted back to the queue once the step under way ends (vLLM answers once that is done).
      if (clearCache) await mock.waitForStats((s) => s.gpu!.queued === 1);
      const { prefilledTokens, generatedTokens } = mock.stats().gpu!;
      await call(mock, 'POST', '/resume');
      // The token after a prefill comes with its last chunk: two more tokens, and a retracted request has been prefilled again.
      await mock.waitForStats((s) => s.gpu!.generatedTokens >= generatedTokens + 2);
      const again = mock.stats().gpu!.prefilledTokens - prefilledTokens;
      if (clearCache) assert.ok(again > generatedTokens, `prefilled again: ${again} tokens`);
      else assert.equal(again, 0);
      mock.abortAll();
      assert.equal((await pending).json.choices[0].finish_reason, 'abort');
    }
  });

  it('answers what is in flight at once on POST /pause (mode abort, the default), then holds new requests until /resume', async (t) => {
    const mock = await start(t, { dialect: 'vllm', latencyMs: 60_000 });
    const first = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForInFlight(1);
    assert.equal((await call(mock, 'POST', '/pause')).status, 200);
    assert.equal((await first).json.choices[0].finish_reason, 'abort');
    const held = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForInFlight(1);
    mock.abortAll(); // the 60 s latency would outlive the test once resumed
    await call(mock, 'POST', '/resume');
    assert.equal((await held).json.choices[0].finish_reason, 'abort');
  });

  it("refuses another mode with vLLM's 400 listing the literal_error (server_utils.py validation_exception_handler @0753cee), and a GET with 405", async (t) => {
    const mock = await start(t, { dialect: 'vllm' });
    const wrong = await call(mock, 'POST', '/pause?mode=in_place');
    assert.equal(wrong.status, 400);
    assert.deepEqual(
      [wrong.json.error.type, wrong.json.error.param, wrong.json.error.code],
      ['Bad Request', 'query.mode', 400],
    );
    assert.equal(
      wrong.json.error.message,
      "1 validation error:\n  {'type': 'literal_error', 'loc': ('query', 'mode'), 'msg': \"Input should be 'abort', 'wait' or 'keep'\", 'input': 'in_place', 'ctx': {'expected': \"'abort', 'wait' or 'keep'\"}}",
    );
    assert.equal(
      (await call(mock, 'POST', '/pause?mode=keep&clear_cache=maybe')).json.error.param,
      'query.clear_cache',
    );
    assert.deepEqual((await call(mock, 'GET', '/pause')).json, { detail: 'Method Not Allowed' });
  });

  it('answers mode wait 501, naming it: in-flight requests finishing while new ones queue is not simulated', async (t) => {
    const mock = await start(t, { dialect: 'vllm' });
    for (const query of ['mode=wait', 'mode=keep&wait_for_inflight_requests=true']) {
      const wait = await call(mock, 'POST', `/pause?${query}`);
      assert.equal(wait.status, 501, query);
      assert.equal(wait.json.error.type, 'NotImplementedError');
      assert.match(wait.json.error.message, /pause mode 'wait' is not simulated/);
    }
    const reply = await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    assert.equal(reply.json.choices[0].finish_reason, 'stop', 'nothing was paused');
  });
});

describe('sglang dialect', () => {
  it('reports metadata.weight_version as the string "default", or the --weight-version string (serving_chat.py _build_chat_response @002897c; server_args.py weight_version)', async (t) => {
    const plain = await start(t, { dialect: 'sglang' });
    assert.equal(
      (await call(plain, 'POST', '/v1/chat/completions', { messages: ARITHMETIC })).json.metadata.weight_version,
      'default',
    );
    const launched = await start(t, { dialect: 'sglang', weightVersion: 12 });
    assert.equal(
      (await call(launched, 'POST', '/v1/chat/completions', { messages: ARITHMETIC })).json.metadata.weight_version,
      '12',
    );
  });

  it('puts prompt_token_ids on the choice with return_prompt_token_ids, and the completion ids too with return_token_ids (serving_chat.py _build_chat_response @002897c; sglang#30917, protocol.py @004c82e)', async (t) => {
    const mock = await start(t, { dialect: 'sglang' });
    const promptOnly = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      return_prompt_token_ids: true,
    });
    const choice = promptOnly.json.choices[0];
    assert.ok(
      Array.isArray(choice.prompt_token_ids) && choice.prompt_token_ids.length === promptOnly.json.usage.prompt_tokens,
    );
    assert.equal('prompt_token_ids' in promptOnly.json, false, 'not top level');
    assert.equal('token_ids' in choice, false, 'return_prompt_token_ids gives the prompt ids only');
    assert.equal(choice.matched_stop, IM_END);
    const both = (await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC, return_token_ids: true }))
      .json;
    assert.deepEqual(Object.keys(both.choices[0]).slice(-2), ['prompt_token_ids', 'token_ids']);
    assert.deepEqual(both.choices[0].prompt_token_ids, choice.prompt_token_ids);
    assert.equal(both.choices[0].token_ids.length, both.usage.completion_tokens);
    assert.equal(both.choices[0].token_ids.at(-1), IM_END, 'the sampled end token is among the ids');
    assert.equal('sglext' in both, false, 'no sglext unless asked');
    const plain = await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    assert.equal('prompt_token_ids' in plain.json.choices[0], false);
  });

  it('puts the sglext ids on a whole reply when asked: the prompt once, the output per choice (sglang#34488)', async (t) => {
    const mock = await start(t, { dialect: 'sglang' });
    const reference = (
      await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC, seed: 4, return_token_ids: true })
    ).json.choices[0];
    const asked = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      seed: 4,
      return_input_ids_in_sglext: true,
      return_output_ids_in_sglext: true,
    });
    assert.deepEqual(asked.json.sglext, { input_ids: reference.prompt_token_ids, output_ids: [reference.token_ids] });
    assert.deepEqual(Object.keys(asked.json).slice(-2), ['metadata', 'sglext']);
    const outputOnly = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      seed: 4,
      return_output_ids_in_sglext: true,
    });
    assert.deepEqual(outputOnly.json.sglext, { output_ids: [reference.token_ids] });
  });

  it('streams the sglext ids whole in one choices-less chunk after the finish chunk and before the usage one (sglang#34488)', async (t) => {
    const mock = await start(t, { dialect: 'sglang' });
    const whole = (
      await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC, seed: 4, return_token_ids: true })
    ).json.choices[0];
    const streamed = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      seed: 4,
      stream: true,
      stream_options: { include_usage: true },
      return_input_ids_in_sglext: true,
      return_output_ids_in_sglext: true,
    });
    const chunks = events(streamed.text);
    const at = chunks.findIndex((c) => c.sglext !== undefined);
    assert.ok(at > 0, streamed.text);
    assert.deepEqual(chunks[at].choices, []);
    assert.deepEqual(chunks[at].sglext, { input_ids: whole.prompt_token_ids, output_ids: [whole.token_ids] });
    assert.ok(chunks[at - 1].choices[0].finish_reason, 'right after the finish chunk');
    assert.ok(chunks[at + 1].usage, 'before the usage chunk');
    assert.equal(chunks.filter((c) => c.sglext !== undefined).length, 1, 'once per response');
    assert.equal(
      chunks.some((c) => c.choices[0]?.token_ids !== undefined),
      false,
      'no per-chunk ids',
    );
  });

  it('echoes any model name instead of checking it', async (t) => {
    const mock = await start(t, { dialect: 'sglang', model: 'served' });
    const answer = await call(mock, 'POST', '/v1/chat/completions', { model: 'anything', messages: ARITHMETIC });
    assert.equal(answer.status, 200);
    assert.equal(answer.json.model, 'anything');
  });

  it('refuses return_token_ids with stream: true with 400, as return_prompt_token_ids (sglang#30917: whole chat replies only)', async (t) => {
    const mock = await start(t, { dialect: 'sglang' });
    const answer = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      stream: true,
      return_token_ids: true,
    });
    assert.equal(answer.status, 400);
    assert.equal(answer.json.object, 'error');
    assert.match(answer.json.message, /^return_token_ids is not supported with streaming/);
  });

  it('refuses return_prompt_token_ids with stream: true with 400 (serving_chat.py _convert_to_internal_request @002897c)', async (t) => {
    const mock = await start(t, { dialect: 'sglang' });
    const answer = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      stream: true,
      return_prompt_token_ids: true,
    });
    assert.equal(answer.status, 400);
    assert.deepEqual(answer.json, {
      object: 'error',
      message:
        'return_prompt_token_ids is not supported with streaming. Please set stream=false when using return_prompt_token_ids=true.',
      type: 'BadRequestError',
      param: null,
      code: 400,
    });
  });

  it("streams no weight version and no token ids, and loses the end token's logprob (serving_chat.py _generate_stream_content: no chunk for an empty delta @002897c)", async (t) => {
    const mock = await start(t, { dialect: 'sglang' });
    const whole = await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC, seed: 4, logprobs: true });
    const streamed = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      seed: 4,
      logprobs: true,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = events(streamed.text);
    assert.equal(streamed.text.includes('weight_version'), false);
    assert.equal(streamed.text.includes('token_ids'), false);
    const streamedLogprobs = chunks.flatMap((c) => c.choices[0]?.logprobs?.content ?? []);
    const wholeLogprobs = whole.json.choices[0].logprobs.content;
    assert.equal(wholeLogprobs.at(-1).token, '<|im_end|>');
    assert.equal(streamedLogprobs.length, wholeLogprobs.length - 1, "every logprob but the end token's");
    assert.deepEqual(streamedLogprobs, wholeLogprobs.slice(0, -1));
    const finish = chunks.find((c) => c.choices[0]?.finish_reason);
    assert.deepEqual(finish.choices[0].delta, { role: null, content: null, reasoning_content: null, tool_calls: null });
    assert.equal(finish.choices[0].matched_stop, IM_END);
    assert.equal(chunks.at(-1).usage.completion_tokens, whole.json.usage.completion_tokens);
  });

  it('aborts every request on POST /abort_request {"abort_all": true} with an empty 200, or one by rid (http_server.py abort_request @0025436)', async (t) => {
    const mock = await start(t, { dialect: 'sglang', latencyMs: 60_000 });
    const first = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForInFlight(1);
    const second = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForInFlight(2);
    const byRid = await call(mock, 'POST', '/abort_request', { rid: 'chatcmpl-mock-0' });
    assert.equal(byRid.status, 200);
    assert.equal(byRid.text, '');
    assert.equal((await first).json.choices[0].finish_reason, 'abort');
    const all = await call(mock, 'POST', '/abort_request', { abort_all: true });
    assert.equal(all.status, 200);
    assert.equal((await second).json.choices[0].finish_reason, 'abort');
    assert.equal((await call(mock, 'POST', '/abort_requests', {})).status, 404, "vLLM's spelling is unknown to SGLang");
  });

  it('serves token-in /generate with output_ids, [logprob, id, null] entries, an object finish reason and the string version (tokenizer_manager.py _handle_batch_output @001067f)', async (t) => {
    const mock = await start(t, { dialect: 'sglang', weightVersion: 'w1' });
    const vocab = await loadVocabulary('cl100k');
    const input = vocab.encode(
      '<|im_start|>user\nCompute 2 + 3. Answer with the number only.<|im_end|>\n<|im_start|>assistant\n',
    );
    const { status, json } = await call(mock, 'POST', '/generate', {
      input_ids: input,
      sampling_params: { max_new_tokens: 64 },
      return_logprob: true,
      rid: 'r-1',
    });
    assert.equal(status, 200);
    assert.equal(json.output_ids.at(-1), vocab.endOfTurnId);
    assert.deepEqual(json.meta_info.finish_reason, { type: 'stop', matched: vocab.endOfTurnId });
    assert.equal(json.meta_info.id, 'r-1');
    assert.equal(json.meta_info.weight_version, 'w1');
    assert.equal(json.meta_info.prompt_tokens, input.length);
    assert.equal(json.meta_info.completion_tokens, json.output_ids.length);
    assert.deepEqual(
      json.meta_info.output_token_logprobs.map((e: unknown[]) => e[1]),
      json.output_ids,
    );
    assert.ok(json.meta_info.output_token_logprobs.every((e: unknown[]) => typeof e[0] === 'number' && e[2] === null));
    const short = await call(mock, 'POST', '/generate', { input_ids: input, sampling_params: { max_new_tokens: 1 } });
    assert.deepEqual(short.json.meta_info.finish_reason, { type: 'length', length: 1 });
    assert.equal('output_token_logprobs' in short.json.meta_info, false);
  });

  it('refuses an over-context request with its two messages: chat as an OpenAI error, /generate as {"error": {message}} (tokenizer_manager.py _validate_one_request @001067f)', async (t) => {
    const mock = await start(t, { dialect: 'sglang', contextLength: 30 });
    const chat = await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC, max_tokens: 20 });
    assert.equal(chat.status, 400);
    assert.equal(
      chat.json.message,
      "Requested token count exceeds the model's maximum context length of 30 tokens. You requested a total of 41 tokens: 21 tokens from the input messages and 20 tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.",
    );
    assert.equal(chat.json.object, 'error');
    const generate = await call(mock, 'POST', '/generate', {
      input_ids: Array.from({ length: 40 }, (_, i) => 100 + i),
    });
    assert.equal(generate.status, 400);
    assert.deepEqual(generate.json, {
      error: { message: "The input (40 tokens) is longer than the model's context length (30 tokens)." },
    });
    // /generate's default max_new_tokens is 128: a 20-token prompt already exceeds a 30-token context with it.
    const defaulted = await call(mock, 'POST', '/generate', {
      input_ids: Array.from({ length: 20 }, (_, i) => 100 + i),
    });
    assert.match(
      defaulted.json.error.message,
      /You requested a total of 148 tokens: 20 tokens from the input messages and 128 tokens for the completion/,
    );
  });

  it('tells its model, context and version on /v1/models, /get_model_info, /get_server_info and their newer names (http_server.py @0025436)', async (t) => {
    const mock = await start(t, { dialect: 'sglang', contextLength: 8192, model: 'm', weightVersion: 'v9' });
    const models = (await call(mock, 'GET', '/v1/models')).json;
    assert.equal(models.data[0].owned_by, 'sglang');
    assert.equal(models.data[0].max_model_len, 8192);
    for (const path of ['/get_model_info', '/model_info']) {
      const info = (await call(mock, 'GET', path)).json;
      assert.equal(info.model_path, 'm', path);
      assert.equal(info.is_generation, true);
      assert.equal(info.weight_version, 'v9');
    }
    for (const path of ['/get_server_info', '/server_info']) {
      const info = (await call(mock, 'GET', path)).json;
      assert.equal(info.context_length, 8192, path);
      assert.equal(info.weight_version, 'v9');
    }
    assert.equal((await call(mock, 'GET', '/props')).status, 404);
  });

  it('updates the string weight version on /update_weight_version and reports it on /get_weight_version and in replies (http_server.py update_weight_version @0025436)', async (t) => {
    const mock = await start(t, { dialect: 'sglang' });
    const updated = await call(mock, 'POST', '/update_weight_version', { new_version: 'step-2' });
    assert.deepEqual(updated.json, {
      success: true,
      message: 'Weight version updated to step-2',
      new_version: 'step-2',
    });
    assert.deepEqual((await call(mock, 'GET', '/get_weight_version')).json, { weight_version: 'step-2' });
    assert.equal(
      (await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC })).json.metadata.weight_version,
      'step-2',
    );
    mock.setWeightVersion(3);
    assert.equal(mock.reportedWeightVersion, '3');
    assert.equal(
      (await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC })).json.metadata.weight_version,
      '3',
    );
  });

  it('answers an unknown route with FastAPI\'s 404 {"detail":"Not Found"}', async (t) => {
    const mock = await start(t, { dialect: 'sglang' });
    const answer = await call(mock, 'GET', '/admin/weight_version');
    assert.equal(answer.status, 404);
    assert.deepEqual(answer.json, { detail: 'Not Found' });
  });
});

describe('sglang dialect: pausing generation around a weight update', () => {
  // python/sglang/srt/entrypoints/http_server.py pause_generation / continue_generation; modes from
  // docs/advanced_features/sglang_for_rl.md @067bfe93626b99d33a934c78ac24c0c71e5e5e17.
  it('keeps a request in flight across an in_place pause and finishes it after continue_generation, holding new ones meanwhile', async (t) => {
    const mock = await start(t, { dialect: 'sglang', latencyMs: 300 });
    const first = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForInFlight(1);
    const paused = await call(mock, 'POST', '/pause_generation', { mode: 'in_place' });
    assert.deepEqual([paused.status, paused.json], [200, { message: 'Generation paused successfully.', status: 'ok' }]);
    const second = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForRequests(2);
    assert.equal(mock.stats().aborted, 0, 'an in_place pause aborts nothing');
    const resumed = await call(mock, 'POST', '/continue_generation', {});
    assert.deepEqual(
      [resumed.status, resumed.json],
      [200, { message: 'Generation continued successfully.', status: 'ok' }],
    );
    for (const reply of await Promise.all([first, second]))
      assert.equal(reply.json.choices[0].finish_reason, 'stop', 'generated whole, not aborted');
    assert.equal(mock.stats().aborted, 0);
  });

  it('answers what is in flight at once on a pause in abort mode (the default), then holds new requests until continue', async (t) => {
    const mock = await start(t, { dialect: 'sglang', latencyMs: 60_000 });
    const first = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForInFlight(1);
    assert.equal((await call(mock, 'POST', '/pause_generation', {})).status, 200);
    assert.equal((await first).json.choices[0].finish_reason, 'abort');
    const held = call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    await mock.waitForInFlight(1);
    mock.abortAll(); // the 60 s latency would outlive the test once continued
    await call(mock, 'POST', '/continue_generation', {});
    assert.equal((await held).json.choices[0].finish_reason, 'abort');
  });

  it('refuses a pause without a body or with an unknown mode, 422 as FastAPI validates the request model', async (t) => {
    const mock = await start(t, { dialect: 'sglang' });
    const missing = await call(mock, 'POST', '/pause_generation', '');
    assert.equal(missing.status, 422);
    assert.equal(missing.json.detail[0].type, 'missing');
    const wrong = await call(mock, 'POST', '/pause_generation', { mode: 'keep' });
    assert.equal(wrong.status, 422);
    assert.deepEqual([wrong.json.detail[0].type, wrong.json.detail[0].loc], ['literal_error', ['body', 'mode']]);
    assert.equal((await call(mock, 'POST', '/continue_generation', '')).status, 422);
  });
});

describe('llamacpp dialect', () => {
  it('returns each token id only inside choices[0].logprobs.content[].id on chat, and no logprobs key unless asked (server-task.cpp to_json_oaicompat_chat @17f5f8a)', async (t) => {
    const mock = await start(t, { dialect: 'llamacpp' });
    const asked = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      logprobs: true,
      return_token_ids: true,
    });
    const choice = asked.json.choices[0];
    const entries = choice.logprobs.content;
    assert.ok(entries.every((e: { id: unknown }) => Number.isInteger(e.id)));
    assert.deepEqual(Object.keys(entries[0]), ['id', 'token', 'bytes', 'logprob', 'top_logprobs']);
    assert.equal(entries.at(-1).id, IM_END);
    assert.equal(entries.at(-1).token, '', 'an end-of-generation token sends no text');
    assert.equal(asked.json.usage.completion_tokens, entries.length);
    assert.equal(asked.text.includes('token_ids'), false);
    assert.equal(asked.text.includes('weight_version'), false);
    assert.equal(typeof asked.json.timings.prompt_n, 'number');
    const plain = await call(mock, 'POST', '/v1/chat/completions', { messages: ARITHMETIC });
    assert.equal('logprobs' in plain.json.choices[0], false);
  });

  it('answers token-id prompts on /completion with tokens, completion_probabilities, stop_type and tokens_evaluated (server-task.cpp to_json_non_oaicompat @17f5f8a)', async (t) => {
    const mock = await start(t, { dialect: 'llamacpp' });
    const vocab = await loadVocabulary('cl100k');
    const prompt = vocab.encode(
      '<|im_start|>user\nCompute 2 + 3. Answer with the number only.<|im_end|>\n<|im_start|>assistant\n',
    );
    const { status, json } = await call(mock, 'POST', '/completion', {
      prompt,
      n_predict: 64,
      n_probs: 1,
      return_tokens: true,
    });
    assert.equal(status, 200);
    assert.equal(json.tokens.at(-1), vocab.endOfTurnId);
    assert.equal(json.stop_type, 'eos');
    assert.equal(json.truncated, false);
    assert.equal(json.tokens_evaluated, prompt.length);
    assert.equal(json.tokens_predicted, json.tokens.length);
    assert.deepEqual(
      json.completion_probabilities.map((p: { id: number }) => p.id),
      json.tokens,
    );
    assert.deepEqual(Object.keys(json.completion_probabilities[0]), [
      'id',
      'token',
      'bytes',
      'logprob',
      'top_logprobs',
    ]);
    const short = await call(mock, 'POST', '/completion', { prompt, n_predict: 1 });
    assert.equal(short.json.stop_type, 'limit');
    assert.equal('completion_probabilities' in short.json, false);
  });

  it('refuses only a prompt that fills the context, with exceed_context_size_error and n_prompt_tokens / n_ctx (server-context.cpp update_slots @fb40266)', async (t) => {
    const mock = await start(t, { dialect: 'llamacpp', contextLength: 30 });
    const answer = await call(mock, 'POST', '/completion', { prompt: Array.from({ length: 30 }, (_, i) => 100 + i) });
    assert.equal(answer.status, 400);
    assert.deepEqual(answer.json, {
      error: {
        code: 400,
        message: 'the request exceeds the available context size, try increasing it',
        type: 'exceed_context_size_error',
        n_prompt_tokens: 30,
        n_ctx: 30,
      },
    });
    const chat = await call(mock, 'POST', '/v1/chat/completions', {
      messages: [{ role: 'user', content: 'word '.repeat(40) }],
    });
    assert.equal(chat.status, 400);
    assert.equal(chat.json.error.type, 'exceed_context_size_error');
  });

  it('does not refuse n_predict past the context but stops there, truncated with stop_type limit (server-context.cpp process_token @fb40266)', async (t) => {
    const mock = await start(t, { dialect: 'llamacpp', contextLength: 24, thinkTokens: 50 });
    const vocab = await loadVocabulary('cl100k');
    const prompt = vocab.encode('<|im_start|>user\nCompute 2 + 3.<|im_end|>\n<|im_start|>assistant\n');
    const { status, json } = await call(mock, 'POST', '/completion', { prompt, n_predict: 500 });
    assert.equal(status, 200);
    assert.equal(json.truncated, true);
    assert.equal(json.stop_type, 'limit');
    assert.equal(json.tokens.length, 24 - prompt.length);
  });

  it('tells the server context on /props default_generation_settings.n_ctx and lists owned_by llamacpp on /v1/models (server-context.cpp get_props, get_models @fb40266)', async (t) => {
    const mock = await start(t, { dialect: 'llamacpp', contextLength: 4096, model: 'qwen' });
    const props = (await call(mock, 'GET', '/props')).json;
    assert.equal(props.default_generation_settings.n_ctx, 4096);
    assert.equal(props.model_alias, 'qwen');
    assert.equal(typeof props.build_info, 'string');
    assert.equal(typeof props.chat_template, 'string');
    const models = (await call(mock, 'GET', '/v1/models')).json;
    assert.equal(models.data[0].owned_by, 'llamacpp');
    assert.equal(models.data[0].meta.n_ctx_train, 32768, 'the trained context, not the server one');
    assert.equal(models.models[0].name, 'qwen');
  });

  it('has no abort or weight-version route: each answers 404 "File Not Found" (server-http.cpp set_error_handler @aa6192d)', async (t) => {
    const mock = await start(t, { dialect: 'llamacpp' });
    for (const path of ['/abort_request', '/abort_requests', '/admin/abort', '/update_weight_version', '/generate']) {
      const answer = await call(mock, 'POST', path, {});
      assert.equal(answer.status, 404, path);
      assert.deepEqual(answer.json, { error: { message: 'File Not Found', type: 'not_found_error', code: 404 } });
    }
    assert.equal((await call(mock, 'GET', '/v1/chat/completions')).status, 404, 'an unmatched method is 404 too');
  });

  it('stops generating when the client closes the connection, its only way to abort', async (t) => {
    const mock = await start(t, { dialect: 'llamacpp', latencyMs: 60_000 });
    const controller = new AbortController();
    const pending = request(`${mock.url}/v1/chat/completions`, {
      method: 'POST',
      body: JSON.stringify({ messages: ARITHMETIC }),
      signal: controller.signal,
    }).catch(() => null);
    await mock.waitForInFlight(1);
    controller.abort();
    await pending;
    await within(
      5_000,
      'the server hears of the closed connection',
      mock.waitForStats((s) => s.inFlight === 0),
    );
    assert.equal(mock.stats().inFlight, 0);
    assert.equal(mock.stats().cancelled, 1);
  });

  it('streams logprob entries with ids and no token-id field', async (t) => {
    const mock = await start(t, { dialect: 'llamacpp' });
    const streamed = await call(mock, 'POST', '/v1/chat/completions', {
      messages: ARITHMETIC,
      logprobs: true,
      stream: true,
    });
    const chunks = events(streamed.text);
    const ids = chunks.flatMap((c) => c.choices[0]?.logprobs?.content.map((e: { id: number }) => e.id) ?? []);
    assert.equal(ids.at(-1), IM_END);
    assert.equal(streamed.text.includes('token_ids'), false);
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
  });
});

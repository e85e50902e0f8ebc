/**
 * The mock over HTTP sends routed experts and sampling masks in each server's encoding
 * (llm/routing-wire.ts names the sources), and the engine's readers take them back to the mock's
 * function of token and position. `routedExperts.vllmWire: 'lists'` is vLLM 0.21's form
 * (vllm/entrypoints/openai/chat_completion/protocol.py @0087e005dec9ed37e5564c4d13b38d350ce61992:
 * int16 `prompt_routed_experts` on the response, `routed_experts` on the choice); `sglangDtype`
 * SGLang's SGLANG_ROUTED_EXPERTS_DTYPE (python/sglang/srt/state_capturer/routed_experts_wire.py
 * @a6463a1003429d415506fe0d97b4c548b85444e1).
 */
import assert from 'node:assert/strict';
import { describe, it, type TestContext } from 'node:test';
import { request } from 'undici';
import { startMockLlm, type MockLlm, type MockLlmOptions } from '../src/mock-llm/server.ts';
import { loadVocabulary } from '../src/mock-llm/vocab.ts';
import { mockExpert, mockSupport } from '../src/mock-llm/routing.ts';
import { TOKEN_WIRES } from '../src/llm/token-wire.ts';
import { parseChatReply } from '../src/llm/reply.ts';
import type { RoutedExperts } from '../src/domain/routing.ts';

const ROUTING = { layers: 4, topK: 2, experts: 32 };
const fail = (why: string): Error => new Error(why);

async function start(t: TestContext, options: MockLlmOptions): Promise<MockLlm> {
  const mock = await startMockLlm({ host: '127.0.0.1', port: 0, ...options });
  t.after(() => mock.close());
  return mock;
}

async function post(mock: MockLlm, path: string, body: unknown): Promise<{ status: number; json: any }> {
  const res = await request(`${mock.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await res.body.text();
  return { status: res.statusCode, json: JSON.parse(text) };
}

/** vLLM's /v1/completions on token ids, asking for routed experts from `routedStart`. */
function vllmCompletion(mock: MockLlm, input: number[], routedStart: number): Promise<{ status: number; json: any }> {
  return post(mock, '/v1/completions', {
    model: 'mock-model',
    prompt: input,
    max_tokens: 8,
    logprobs: 1,
    return_token_ids: true,
    routed_experts_prompt_start: routedStart,
  });
}

async function prompt(): Promise<number[]> {
  const vocab = await loadVocabulary('cl100k');
  return vocab.encode('<|im_start|>user\nCompute 2 + 3.<|im_end|>\n<|im_start|>assistant\n');
}

function assertRows(r: RoutedExperts, sequence: readonly number[], start: number): void {
  assert.equal(r.start, start);
  assert.equal(r.rows, sequence.length - 1 - start, 'every forwarded position from the start, the last token not');
  for (let row = 0; row < r.rows; row++)
    for (let l = 0; l < r.layers; l++)
      for (let k = 0; k < r.topK; k++)
        assert.equal(
          r.ids[(row * r.layers + l) * r.topK + k],
          mockExpert(sequence[start + row], start + row, l, k, ROUTING.experts),
        );
}

describe('the mock’s routed experts over HTTP', () => {
  it('answers vLLM /v1/completions with a .npy routed_experts from routed_experts_prompt_start on', async (t) => {
    const mock = await start(t, { dialect: 'vllm', model: 'mock-model', routedExperts: ROUTING });
    const input = await prompt();
    const { status, json } = await vllmCompletion(mock, input, 3);
    assert.equal(status, 200, JSON.stringify(json));
    const r = TOKEN_WIRES.vllm.parse(json, fail, { routedFrom: 3, routingShape: null, samplingMask: false });
    assertRows(r.routedExperts!, [...input, ...r.completionIds], 3);
  });

  it('answers vLLM chat with routed_experts over prompt_token_ids and token_ids', async (t) => {
    const mock = await start(t, { dialect: 'vllm', model: 'mock-model', routedExperts: ROUTING });
    const { json } = await post(mock, '/v1/chat/completions', {
      model: 'mock-model',
      messages: [{ role: 'user', content: 'Compute 2 + 3.' }],
      max_tokens: 8,
      logprobs: true,
      return_token_ids: true,
    });
    const r = parseChatReply(json, { routedExperts: true });
    assertRows(r.routedExperts!, [...r.promptIds!, ...r.responseIds!], 0);
  });

  it('answers vLLM /v1/completions as 0.21 did with vllmWire lists: every row from 0, the prompt’s on the response', async (t) => {
    const mock = await start(t, {
      dialect: 'vllm',
      model: 'mock-model',
      routedExperts: { ...ROUTING, vllmWire: 'lists' },
    });
    const input = await prompt();
    const { status, json } = await vllmCompletion(mock, input, 3);
    assert.equal(status, 200, JSON.stringify(json));
    assert.equal(json.prompt_routed_experts.length, input.length, 'one row per prompt token, the start not read');
    assert.deepEqual([json.prompt_routed_experts[0].length, json.prompt_routed_experts[0][0].length], [4, 2]);
    assert.equal(json.choices[0].routed_experts.length, json.choices[0].token_ids.length - 1);
    const r = TOKEN_WIRES.vllm.parse(json, fail, { routedFrom: 3, routingShape: null, samplingMask: false });
    assertRows(r.routedExperts!, [...input, ...r.completionIds], 3);
  });

  it('answers vLLM chat as 0.21 did with vllmWire lists, read from position 0', async (t) => {
    const mock = await start(t, {
      dialect: 'vllm',
      model: 'mock-model',
      routedExperts: { ...ROUTING, vllmWire: 'lists' },
    });
    const { json } = await post(mock, '/v1/chat/completions', {
      model: 'mock-model',
      messages: [{ role: 'user', content: 'Compute 2 + 3.' }],
      max_tokens: 8,
      logprobs: true,
      return_token_ids: true,
    });
    assert.ok(Array.isArray(json.prompt_routed_experts));
    const r = parseChatReply(json, { routedExperts: true });
    assertRows(r.routedExperts!, [...r.promptIds!, ...r.responseIds!], 0);
  });

  it('answers SGLang /generate in the sglangDtype it is given, naming it in meta_info.routed_experts_dtype', async (t) => {
    const mock = await start(t, { dialect: 'sglang', routedExperts: { ...ROUTING, sglangDtype: 'uint16' } });
    const input = await prompt();
    const { json } = await post(mock, '/generate', {
      input_ids: input,
      sampling_params: { max_new_tokens: 8 },
      return_logprob: true,
      return_routed_experts: true,
      routed_experts_start_len: 1,
    });
    assert.equal(json.meta_info.routed_experts_dtype, 'uint16');
    const r = TOKEN_WIRES.sglang.parse(json, fail, {
      routedFrom: 1,
      routingShape: { layers: ROUTING.layers, topK: ROUTING.topK },
      samplingMask: false,
    });
    const sequence = [...input, ...r.completionIds];
    assert.equal(
      Buffer.from(json.meta_info.routed_experts, 'base64').length,
      2 * (sequence.length - 2) * ROUTING.layers * ROUTING.topK,
    );
    assertRows(r.routedExperts!, sequence, 1);
  });

  it('refuses a routedExperts option it does not know, naming it', async () => {
    await assert.rejects(
      startMockLlm({ dialect: 'vllm', routedExperts: { ...ROUTING, vllmWire: 'base64' as 'npy' } }),
      /routedExperts\.vllmWire/,
    );
  });

  it('answers SGLang /generate with int32 routed experts and sampling supports only when asked', async (t) => {
    const mock = await start(t, { dialect: 'sglang', routedExperts: ROUTING });
    const input = await prompt();
    const asked = await post(mock, '/generate', {
      input_ids: input,
      sampling_params: { max_new_tokens: 8, top_k: 20 },
      return_logprob: true,
      return_routed_experts: true,
      routed_experts_start_len: 2,
      return_sampling_mask: true,
    });
    const r = TOKEN_WIRES.sglang.parse(asked.json, fail, {
      routedFrom: 2,
      routingShape: { layers: ROUTING.layers, topK: ROUTING.topK },
      samplingMask: true,
    });
    assertRows(r.routedExperts!, [...input, ...r.completionIds], 2);
    const m = r.samplingMask!;
    r.completionIds.forEach((id, i) =>
      assert.deepEqual([...m.ids.subarray(m.offsets[i], m.offsets[i + 1])], mockSupport(id, input.length + i)),
    );
    const plain = await post(mock, '/generate', { input_ids: input, sampling_params: { max_new_tokens: 8 } });
    assert.equal('routed_experts' in plain.json.meta_info, false);
    const unbounded = await post(mock, '/generate', {
      input_ids: input,
      sampling_params: { max_new_tokens: 8 },
      return_sampling_mask: true,
    });
    assert.equal(unbounded.status, 400, 'a support over the whole vocabulary is refused, as SGLang does');
  });
});

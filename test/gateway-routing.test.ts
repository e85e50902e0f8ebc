/**
 * Routing replay and sampling masks through the token-trace gateway (docs/ROUTING-REPLAY.md): the
 * gateway asks its backend for them as the agent loop does, keeps each call's rows, and the stitched
 * sample carries them aligned with its observation — through extensions, a retried call and side
 * calls. The mock routes each token as a function of the token and its position only (mockExpert),
 * so a row shifted by one position, or kept on another token, no longer matches.
 */
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import type OpenAI from 'openai';
import type { ChatCompletionMessageParam } from 'openai/resources/chat/completions';
import { resolveGatewayOptions, startGateway, stitchTraces, type Gateway } from '../src/gateway/index.ts';
import type { CallTrace } from '../src/gateway/trace.ts';
import { hashIds } from '../src/gateway/trace.ts';
import type { RoutedExperts } from '../src/domain/routing.ts';
import { stitchSession } from '../src/llm/gateway-client.ts';
import { mockSupport, type MockRouting } from '../src/mock-llm/routing.ts';
import { startMockLlm, type MockLlm, type MockLlmOptions } from '../src/mock-llm/server.ts';
import { openaiClient } from './support/clients.ts';
import { assertCallRows, assertRowsOnTokens } from './support/routing.ts';

type Message = ChatCompletionMessageParam;

describe('routing replay through the token-trace gateway', () => {
  const closers: (() => Promise<void>)[] = [];
  after(async () => {
    for (const close of closers.reverse()) await close();
  });

  async function stack(mockOptions: MockLlmOptions, gatewayOptions: Partial<Parameters<typeof startGateway>[0]>) {
    const mock: MockLlm = await startMockLlm({ tokenizer: 'qwen2.5', thinkTokens: 4, ...mockOptions });
    closers.push(() => mock.close());
    const kind = mockOptions.dialect === 'sglang' ? 'sglang' : 'vllm';
    const gateway: Gateway = await startGateway({ backend: { kind, url: mock.url }, ...gatewayOptions });
    closers.push(() => gateway.close());
    return gateway;
  }

  /** Two turns, a judge's side call, the second turn retried, and a third turn: every splice the gateway makes. */
  async function session(openai: OpenAI, extra: Record<string, unknown> = {}): Promise<void> {
    const ask = async (messages: Message[]) =>
      (
        await openai.chat.completions.create({
          model: 'qwen2.5',
          messages,
          max_tokens: 24,
          ...extra,
        } as never)
      ).choices[0].message.content ?? '';
    const messages: Message[] = [{ role: 'user', content: 'Compute 17 + 25. Answer with the number only.' }];
    messages.push({ role: 'assistant', content: await ask(messages) });
    await ask([{ role: 'user', content: `Grade this answer: ${messages[1].content}` }]); // a side call
    messages.push({ role: 'user', content: 'Check your work.' });
    await ask(messages); // the second turn, then its retry (the agent re-sends it: a replay)
    messages.push({ role: 'assistant', content: await ask(messages) });
    messages.push({ role: 'user', content: 'And 3 + 4?' });
    messages.push({ role: 'assistant', content: await ask(messages) });
  }

  for (const routing of [
    { layers: 3, topK: 2, experts: 64 },
    // Ids up to 255: no 8-bit fill is left, so the sequence's rows are 16-bit.
    { layers: 2, topK: 2, experts: 256 },
  ] satisfies MockRouting[]) {
    it(`vLLM: every stitched position holds the experts its token was routed to there (${routing.experts} experts), each call asking only from where the session's rows end`, async () => {
      const gateway = await stack({ dialect: 'vllm', routedExperts: routing }, { routedExperts: true });
      await session(openaiClient(gateway.sessionBaseURL('s')));
      const calls = gateway.traces('s')!;
      assert.deepEqual(
        calls.map((c) => c.kind),
        ['main', 'side', 'main', 'main'],
        'the retried second turn took its own place',
      );
      let end = 0;
      for (const c of calls) {
        const sequence = [...c.promptIds, ...c.completionIds];
        assertCallRows(c.routedExperts!, sequence, routing);
        if (c.kind === 'side') assert.equal(c.routedExperts!.start, 0, 'a side call asks from 0');
        else {
          assert.equal(c.routedExperts!.start, end, 'a main call asks from where the previous one ended');
          end = sequence.length - 1;
        }
      }
      const sample = await stitchSession(gateway.url, 's', 1);
      assert.equal(sample.routedExperts!.ids.constructor, routing.experts <= 255 ? Uint8Array : Uint16Array);
      assert.equal(sample.routedExperts!.fill, routing.experts <= 255 ? 255 : 65535);
      assertRowsOnTokens(sample.routedExperts!, sample.observationTokens, routing);
      assert.equal(sample.samplingMask, undefined, 'vLLM sends no masks');
      const [side] = sample.sideCalls;
      assertCallRows(side.routedExperts!, [...side.promptIds, ...side.completionIds], routing);
    });
  }

  it('SGLang: routing with the configured shape, and each action token’s sampling support, when the call truncates', async () => {
    const routing: MockRouting = { layers: 2, topK: 3, experts: 40 };
    const gateway = await stack(
      { dialect: 'sglang', routedExperts: routing },
      { routedExperts: { layers: 2, topK: 3 }, samplingMasks: true },
    );
    await session(openaiClient(gateway.sessionBaseURL('g')), { top_p: 0.9 });
    const sample = await stitchSession(gateway.url, 'g', 0);
    assertRowsOnTokens(sample.routedExperts!, sample.observationTokens, routing);
    const mask = sample.samplingMask!;
    const obs = sample.observationTokens;
    assert.equal(mask.offsets.length, obs.length + 1);
    const inAction = (p: number) => sample.actionRanges.some(([a, b]) => p >= a && p < b);
    for (let p = 0; p < obs.length; p++) {
      const support = [...mask.ids.subarray(mask.offsets[p], mask.offsets[p + 1])];
      assert.deepEqual(support, inAction(p) ? mockSupport(obs[p], p) : [], `position ${p}`);
    }
    assert.ok(mask.logprobs!.every((lp, p) => (inAction(p) ? Math.abs(lp - Math.log(0.5)) < 1e-6 : lp === 0)));
    const [side] = sample.sideCalls;
    assert.deepEqual(
      [...side.samplingMask!.ids],
      [...side.completionIds].flatMap((id, i) => mockSupport(id, side.promptIds.length + i)),
    );

    // A call that does not truncate asks for no mask (SGLang refuses one over the whole vocabulary).
    const plain = openaiClient(gateway.sessionBaseURL('plain'));
    await plain.chat.completions.create({ model: 'q', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 8 });
    const unmasked = await stitchSession(gateway.url, 'plain', 0);
    assert.equal(unmasked.samplingMask, undefined);
    assertRowsOnTokens(unmasked.routedExperts!, unmasked.observationTokens, routing);
  });

  it('asks for nothing when not configured, and the stitched sample carries none', async () => {
    const gateway = await stack({ dialect: 'vllm', routedExperts: { layers: 1, topK: 1, experts: 8 } }, {});
    await session(openaiClient(gateway.sessionBaseURL('n')));
    const sample = await stitchSession(gateway.url, 'n', 0);
    assert.equal(sample.routedExperts, undefined);
    assert.equal(sample.sideCalls[0].routedExperts, undefined);
  });

  it('validates the options', () => {
    const backend = { kind: 'sglang' as const, url: 'http://127.0.0.1:1' };
    assert.equal(resolveGatewayOptions({ backend }).routedExperts, null);
    assert.deepEqual(resolveGatewayOptions({ backend, routedExperts: true }).routedExperts, { shape: null });
    assert.deepEqual(resolveGatewayOptions({ backend, routedExperts: { layers: 4, topK: 2 } }).routedExperts, {
      shape: { layers: 4, topK: 2 },
    });
    assert.throws(
      () => resolveGatewayOptions({ backend, routedExperts: { layers: 0, topK: 2 } }),
      /routedExperts.layers/,
    );
    assert.throws(() => resolveGatewayOptions({ backend, routedExperts: 'yes' as never }), /routedExperts/);
    assert.throws(() => resolveGatewayOptions({ backend, samplingMasks: 1 as never }), /samplingMasks/);
  });
});

describe('stitching routed experts', () => {
  const trace = (index: number, promptLength: number, completion: number[], extra: Partial<CallTrace>): CallTrace => ({
    index,
    promptLength,
    deltaLength: 0,
    promptHash: 0,
    completionIds: Int32Array.from(completion),
    logprobs: new Float32Array(completion.length),
    finishReason: 'stop',
    modelStep: 0,
    timings: { renderMs: 0, tokenizeMs: 0, backendMs: 0, totalMs: 0 },
    ...extra,
  });
  const rows = (start: number, ids: number[]): RoutedExperts => ({
    start,
    rows: ids.length,
    layers: 1,
    topK: 1,
    ids: Uint8Array.from(ids),
  });
  const tokens = [1, 2, 3, 4, 5, 6];

  it('places each call’s rows at their positions, the fill where none was reported', () => {
    const a = trace(0, 2, [3, 4], { promptHash: hashIds(tokens, 0, 2), routedExperts: rows(0, [10, 11, 12]) });
    const b = trace(1, 5, [6], { promptHash: hashIds(tokens, 0, 5), routedExperts: rows(3, [13, 14]) });
    const s = stitchTraces({ sessionId: 's', tokens, traces: [a, b] });
    assert.deepEqual([...s.routedExperts!.ids], [10, 11, 12, 13, 14, 255]);
    // A call whose rows were not sent leaves its positions to the fill, never to another call's rows.
    const gap = stitchTraces({ sessionId: 's', tokens, traces: [{ ...a, routedExperts: undefined }, b] });
    assert.deepEqual([...gap.routedExperts!.ids], [255, 255, 255, 13, 14, 255]);
  });

  it('fails loudly on rows past a call’s own sequence, or of another shape', () => {
    const a = trace(0, 2, [3, 4], { promptHash: hashIds(tokens, 0, 2), routedExperts: rows(0, [1, 1, 1, 1]) });
    const b = trace(1, 5, [6], { promptHash: hashIds(tokens, 0, 5) });
    assert.throws(() => stitchTraces({ sessionId: 's', tokens, traces: [a, b] }), {
      code: 'ERR_GATEWAY_STITCH',
      message: /call 0: routed experts: rows 0\.\.4 go past/,
    });
    const wide = { ...rows(3, [1, 2]), topK: 2, rows: 1 };
    assert.throws(
      () =>
        stitchTraces({
          sessionId: 's',
          tokens,
          traces: [
            { ...a, routedExperts: rows(0, [1]) },
            { ...b, routedExperts: wide },
          ],
        }),
      { code: 'ERR_GATEWAY_STITCH', message: /rows of 1 layers × 2 beside rows of 1 × 1/ },
    );
  });
});

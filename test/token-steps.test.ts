/**
 * Which weights sampled each token: SGLang's streamed /generate read event by event
 * (llm/generate-stream.ts), and the per-token model steps and stale-KV marks made of it
 * (worker/token-steps.ts). The event shapes are SGLang's (python/sglang/srt/managers/
 * tokenizer_manager_components/output_processor.py handle_batch_output
 * @7a464c40fc21eda40b059c10fd0944ae28115a84; http_server.py generate_request
 * @0025436eab0556737d615b36a4dd3e1e26e82f3d).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { GenerateStream } from '../src/llm/generate-stream.ts';
import type { ChatResult } from '../src/llm/reply.ts';
import { tokenSteps } from '../src/worker/token-steps.ts';

const utf8 = new TextEncoder();

interface Step {
  ids: number[];
  version: string;
  finish?: string;
}

/** SGLang's events for `steps` (tokens per step), cumulative unless `incremental`. */
function events(steps: Step[], incremental = false): string {
  let out = '';
  const all: number[] = [];
  for (const step of steps) {
    all.push(...step.ids);
    const ids = incremental ? step.ids : all.slice();
    out += `data: ${JSON.stringify({
      text: null,
      output_ids: ids,
      meta_info: {
        id: 'r1',
        finish_reason: step.finish === undefined ? null : { type: step.finish },
        prompt_tokens: 5,
        weight_version: step.version,
        completion_tokens: all.length,
        cached_tokens: 0,
        output_token_logprobs: ids.map((id) => [-id / 10, id, null]),
      },
    })}\n\n`;
  }
  return `${out}data: [DONE]\n\n`;
}

function read(text: string, chunkBytes = 7): GenerateStream {
  const stream = new GenerateStream();
  const bytes = utf8.encode(text);
  for (let i = 0; i < bytes.length; i += chunkBytes)
    assert.equal(stream.write(bytes.subarray(i, i + chunkBytes)), true);
  return stream;
}

const KEPT_ACROSS_UPDATE: Step[] = [
  { ids: [11, 12], version: '3' },
  { ids: [13], version: '3' },
  { ids: [14, 15], version: '4' },
  { ids: [16], version: '4', finish: 'stop' },
];

describe("SGLang's streamed /generate", () => {
  it('reads cumulative events into the tokens, their logprobs and which version sampled which', () => {
    const result = read(events(KEPT_ACROSS_UPDATE)).result();
    assert.deepEqual(result.completionIds, [11, 12, 13, 14, 15, 16]);
    assert.deepEqual(result.logprobs, [-1.1, -1.2, -1.3, -1.4, -1.5, -1.6]);
    assert.equal(result.finishReason, 'stop');
    assert.equal(result.weightVersion, '4');
    assert.deepEqual(result.versionSpans, [
      { end: 3, version: '3' },
      { end: 6, version: '4' },
    ]);
  });

  it('reads --incremental-streaming-output events to the same result', () => {
    assert.deepEqual(read(events(KEPT_ACROSS_UPDATE, true), 3).result(), read(events(KEPT_ACROSS_UPDATE)).result());
  });

  it('gives what arrived, as aborted, when a pause holds the call before the end', () => {
    const text = events(KEPT_ACROSS_UPDATE.slice(0, 2)).replace('data: [DONE]\n\n', '');
    const held = read(text).held();
    assert.deepEqual(held.completionIds, [11, 12, 13]);
    assert.equal(held.finishReason, 'abort');
    assert.deepEqual(held.versionSpans, [{ end: 3, version: '3' }]);
  });

  it('refuses an event whose output_ids are neither all the tokens so far nor the new ones, naming the field', () => {
    const stream = new GenerateStream();
    const bad = `data: ${JSON.stringify({ output_ids: [1, 2], meta_info: { completion_tokens: 5, output_token_logprobs: [] } })}\n\n`;
    assert.equal(stream.write(utf8.encode(bad)), false);
    assert.throws(() => stream.result(), /event 1: output_ids must be all 5 tokens so far or the 5 new ones/);
  });

  it("reports the server's error event as a bad reply with its message", () => {
    const stream = new GenerateStream();
    stream.write(utf8.encode(`data: {"error": {"message": "input is too long"}}\n\ndata: [DONE]\n\n`));
    assert.throws(() => stream.result(), {
      code: 'ERR_LLM_BAD_REPLY',
      message: /the server reported an error: input is too long/,
    });
  });

  it('refuses a stream that ends without a finish reason', () => {
    const text = events(KEPT_ACROSS_UPDATE.slice(0, 1));
    assert.throws(() => read(text).result(), /ended after 2 events without a meta_info.finish_reason/);
  });

  it('gives no version spans when an event with new tokens names no version', () => {
    const text = events(KEPT_ACROSS_UPDATE).replace('"weight_version":"4"', '"weight_version":null');
    assert.equal(read(text).result().versionSpans, undefined);
  });
});

function reply(n: number, extra: Partial<ChatResult>): ChatResult {
  return {
    content: '',
    finishReason: 'stop',
    promptIds: Int32Array.of(1, 2),
    responseIds: new Int32Array(n).fill(7),
    logprobs: new Float32Array(n),
    weightVersion: null,
    promptTokens: 2,
    completionTokens: n,
    ...extra,
  };
}
const stepOf = (version: string | null): number => (version === null ? 9 : Number(version));

describe('per-token model steps of a reply', () => {
  it('tags each token with the weights its event named, and marks the ones sampled on KV from earlier weights', () => {
    const steps = tokenSteps(
      reply(6, {
        weightVersion: '4',
        versionSpans: [
          { end: 3, version: '3' },
          { end: 6, version: '4' },
        ],
      }),
      3,
      stepOf,
    );
    assert.equal(steps.modelStep, 3);
    assert.deepEqual(steps.modelSteps, Int32Array.of(3, 3, 3, 4, 4, 4));
    assert.deepEqual(steps.staleKv, Uint8Array.of(0, 0, 0, 1, 1, 1));
    assert.equal(steps.spansVersions, false);
  });

  it('leaves a reply from one set of weights unmarked, its steps implicit', () => {
    const steps = tokenSteps(reply(4, { weightVersion: '5', versionSpans: [{ end: 4, version: '5' }] }), 4, stepOf);
    assert.deepEqual(steps, { modelStep: 5, modelSteps: null, staleKv: null, spansVersions: false });
  });

  it('marks a whole reply that ended on other weights than it began on as spanning versions, tagged with the older', () => {
    const steps = tokenSteps(reply(4, { weightVersion: '5' }), 4, stepOf);
    assert.deepEqual(steps, { modelStep: 4, modelSteps: null, staleKv: null, spansVersions: true });
  });

  it('does not mark a whole reply that began and ended on the same weights', () => {
    assert.equal(tokenSteps(reply(4, { weightVersion: '4' }), 4, stepOf).spansVersions, false);
  });

  it('does not mark a reply with no tokens', () => {
    assert.equal(tokenSteps(reply(0, { weightVersion: '5' }), 4, stepOf).spansVersions, false);
  });
});

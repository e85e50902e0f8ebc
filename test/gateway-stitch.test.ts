/** Stitching invariants as properties over arbitrary sessions, and the checks that catch broken traces. */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { stitchTraces } from '../src/gateway/stitch.ts';
import { hashIds } from '../src/gateway/trace.ts';
import type { CallTrace, SideCallTrace } from '../src/gateway/trace.ts';

interface CallSpec {
  delta: number[];
  completion: number[];
  logprobs: number[];
  step: number;
  finish: 'stop' | 'length' | 'abort';
}

/** What the gateway builds, call by call: prompt = everything so far + delta; then the completion. */
function session(calls: CallSpec[]): { tokens: number[]; traces: CallTrace[] } {
  const tokens: number[] = [];
  const traces: CallTrace[] = calls.map((call, index) => {
    tokens.push(...call.delta);
    const trace: CallTrace = {
      index,
      promptLength: tokens.length,
      deltaLength: call.delta.length,
      promptHash: hashIds(tokens),
      completionIds: Int32Array.from(call.completion),
      logprobs: Float32Array.from(call.logprobs),
      finishReason: call.finish,
      modelStep: call.step,
      timings: { renderMs: 0, tokenizeMs: 0, backendMs: 0, totalMs: 0 },
    };
    tokens.push(...call.completion);
    return trace;
  });
  return { tokens, traces };
}

const id = fc.integer({ min: 0, max: 151_664 });
const callSpec: fc.Arbitrary<CallSpec> = fc
  .record({
    delta: fc.array(id, { minLength: 1, maxLength: 30 }),
    completion: fc.array(id, { minLength: 0, maxLength: 30 }),
    step: fc.integer({ min: 0, max: 1000 }),
    finish: fc.constantFrom('stop' as const, 'length' as const, 'abort' as const),
  })
  .chain((c) =>
    fc
      .array(fc.float({ min: Math.fround(-20), max: Math.fround(-1e-4), noNaN: true }), {
        minLength: c.completion.length,
        maxLength: c.completion.length,
      })
      .map((logprobs) => ({ ...c, logprobs })),
  );

describe('stitching traces into a training sample', () => {
  it('covers exactly the completion tokens with action ranges, aligns logprobs and model steps, and makes the observation the last prompt + last completion', () => {
    fc.assert(
      fc.property(
        fc.array(callSpec, { minLength: 1, maxLength: 8 }),
        fc.option(fc.double({ min: -1, max: 1, noNaN: true })),
        (calls, reward) => {
          const { tokens, traces } = session(calls);
          const sample = stitchTraces({ sessionId: 's', tokens, traces }, { reward });
          const last = traces.at(-1)!;
          assert.deepEqual(Array.from(sample.observationTokens), tokens);
          assert.equal(sample.observationTokens.length, last.promptLength + last.completionIds.length);
          assert.equal(sample.actionRanges.length, calls.length);
          const covered = new Array<boolean>(tokens.length).fill(false);
          sample.actionRanges.forEach(([start, end], i) => {
            assert.equal(start, traces[i].promptLength);
            assert.deepEqual(Array.from(sample.observationTokens.subarray(start, end)), calls[i].completion);
            assert.deepEqual(Array.from(sample.rolloutLogprobs.subarray(start, end)), calls[i].logprobs);
            assert.ok(sample.modelSteps.subarray(start, end).every((s) => s === calls[i].step));
            for (let j = start; j < end; j++) covered[j] = true;
          });
          covered.forEach((inAction, j) => {
            if (inAction) return;
            assert.equal(sample.rolloutLogprobs[j], 0);
            assert.equal(sample.modelSteps[j], -1);
          });
          assert.equal(
            covered.filter(Boolean).length,
            calls.reduce((n, c) => n + c.completion.length, 0),
          );
          assert.equal(sample.truncated, calls.at(-1)!.finish === 'length');
          assert.equal(sample.reward, reward);
        },
      ),
      { numRuns: 200 },
    );
  });

  it('puts side calls beside the main sample, each with its own prompt, completion, logprobs and model step, in call order, and leaves the main sample as it is', () => {
    fc.assert(
      fc.property(
        fc.array(callSpec, { minLength: 1, maxLength: 6 }),
        fc.array(callSpec, { maxLength: 4 }),
        (calls, sides) => {
          const { tokens, traces } = session(calls);
          // Side calls numbered after the main ones and listed out of order: the sample orders them.
          const sideCalls: SideCallTrace[] = sides.map((c, i) => ({
            index: calls.length + sides.length - 1 - i,
            promptIds: Int32Array.from(c.delta),
            deltaLength: c.delta.length,
            completionIds: Int32Array.from(c.completion),
            logprobs: Float32Array.from(c.logprobs),
            finishReason: c.finish,
            modelStep: c.step,
            timings: { renderMs: 0, tokenizeMs: 0, backendMs: 0, totalMs: 0 },
          }));
          const { sideCalls: none, ...main } = stitchTraces({ sessionId: 's', tokens, traces });
          const { sideCalls: out, ...withSides } = stitchTraces({ sessionId: 's', tokens, traces, sideCalls });
          assert.deepEqual(withSides, main);
          assert.deepEqual(none, []);
          assert.deepEqual(
            out.map((c) => [
              c.index,
              Array.from(c.promptIds),
              Array.from(c.completionIds),
              Array.from(c.logprobs),
              c.finishReason,
              c.modelStep,
            ]),
            sideCalls
              .map((c, i) => [
                c.index,
                sides[i].delta,
                sides[i].completion,
                sides[i].logprobs,
                sides[i].finish,
                sides[i].step,
              ])
              .reverse(),
          );
        },
      ),
      { numRuns: 100 },
    );
  });

  it('fails with ERR_GATEWAY_STITCH when a side call does not have one logprob per completion token', () => {
    const { tokens, traces } = session([{ delta: [1, 2], completion: [10], logprobs: [-1], step: 0, finish: 'stop' }]);
    const side: SideCallTrace = {
      index: 1,
      promptIds: Int32Array.of(5),
      deltaLength: 1,
      completionIds: Int32Array.of(6, 7),
      logprobs: Float32Array.of(-1),
      finishReason: 'stop',
      modelStep: 0,
      timings: { renderMs: 0, tokenizeMs: 0, backendMs: 0, totalMs: 0 },
    };
    assert.throws(() => stitchTraces({ sessionId: 's', tokens, traces, sideCalls: [side] }), {
      code: 'ERR_GATEWAY_STITCH',
      message: /side call 1 has 1 logprobs for 2 completion tokens/,
    });
  });

  it('fails with ERR_GATEWAY_STITCH when an action span no longer holds the ids its call generated', () => {
    const { tokens, traces } = session([
      { delta: [1, 2, 3], completion: [10, 11], logprobs: [-1, -1], step: 0, finish: 'stop' },
      { delta: [4], completion: [12, 13], logprobs: [-1, -1], step: 0, finish: 'stop' },
    ]);
    tokens[7] = 99;
    assert.throws(() => stitchTraces({ sessionId: 's', tokens, traces }), {
      code: 'ERR_GATEWAY_STITCH',
      message: /call 1: token 7 is 99 but that call generated 13/,
    });
  });

  it('fails when a prompt token differs from what its call sent, or tokens trail the last action', () => {
    const calls: CallSpec[] = [
      { delta: [1, 2, 3], completion: [10], logprobs: [-1], step: 0, finish: 'stop' },
      { delta: [4], completion: [12], logprobs: [-1], step: 0, finish: 'stop' },
    ];
    const a = session(calls);
    a.tokens[4] = 77;
    assert.throws(() => stitchTraces({ sessionId: 's', tokens: a.tokens, traces: a.traces }), {
      code: 'ERR_GATEWAY_STITCH',
      message: /call 1: the first 5 tokens are not the prompt that call sent/,
    });
    const b = session(calls);
    b.tokens.push(5);
    assert.throws(() => stitchTraces({ sessionId: 's', tokens: b.tokens, traces: b.traces }), {
      code: 'ERR_GATEWAY_STITCH',
      message: /last action ends at token 6 but the session holds 7/,
    });
    assert.throws(() => stitchTraces({ sessionId: 's', tokens: [], traces: [] }), {
      code: 'ERR_GATEWAY_STITCH',
      message: /no completed call/,
    });
    const c = session(calls);
    assert.throws(() => stitchTraces({ sessionId: 's', tokens: c.tokens, traces: c.traces }, { reward: Number.NaN }), {
      code: 'ERR_GATEWAY_BAD_REQUEST',
      message: /reward must be a finite number or null \(got NaN\)/,
    });
  });
});

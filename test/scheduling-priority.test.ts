import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { rankOf, SGLANG_PRIORITY, VLLM_PRIORITY } from '../src/testing/mock-llm/admission.ts';
import { GpuModel, type GpuModelOptions, type Sequence } from '../src/testing/mock-llm/gpu-model.ts';

const SHAPE: GpuModelOptions = {
  slots: 1,
  decodeMs: 10,
  decodeMsPerSeq: 1,
  prefillTokensPerSecond: 1000,
  prefillChunkTokens: 64,
  prefixCacheTokens: 0,
};

const ids = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);

function drain(model: GpuModel): Sequence[] {
  const done: Sequence[] = [];
  for (let guard = 0; model.nextEventAt !== null && guard < 100_000; guard++)
    done.push(...model.advanceTo(model.nextEventAt));
  return done;
}

describe('GPU-like mock: priority scheduling (admission.ts)', () => {
  it('reads the field as each server does: vLLM lower first, SGLang higher first by default', () => {
    assert.ok(rankOf(1, VLLM_PRIORITY) < rankOf(5, VLLM_PRIORITY));
    assert.ok(rankOf(5, SGLANG_PRIORITY) < rankOf(1, SGLANG_PRIORITY));
    assert.equal(rankOf(undefined, VLLM_PRIORITY), 0);
    assert.equal(VLLM_PRIORITY.preemptThreshold, null);
    assert.equal(SGLANG_PRIORITY.preemptThreshold, 10);
  });

  it('admits the waiting sequence of the lowest rank first, the earliest among equals', () => {
    const model = new GpuModel({ ...SHAPE, priority: { preemptThreshold: null } });
    const ranks = [0, 5, 1, 1, -2];
    for (const [i, rank] of ranks.entries()) model.submit(0, { promptIds: [100 + i], outputIds: ids(2), rank });
    assert.deepEqual(
      drain(model).map((s) => s.id),
      [0, 4, 2, 3, 1],
    );
  });

  it('ignores ranks without priority scheduling: first come, first served', () => {
    const model = new GpuModel(SHAPE);
    for (const [i, rank] of [0, 5, -9].entries()) model.submit(0, { promptIds: [100 + i], outputIds: ids(2), rank });
    assert.deepEqual(
      drain(model).map((s) => s.id),
      [0, 1, 2],
    );
  });

  it('never preempts a running sequence under vLLM’s rule (only a full KV cache does, which the mock has not)', () => {
    const model = new GpuModel({ ...SHAPE, priority: { preemptThreshold: null } });
    model.submit(0, { promptIds: [1], outputIds: ids(5), rank: 0 });
    const urgent = model.submit(11, { promptIds: [2], outputIds: ids(2), rank: -1000 }).seq;
    assert.equal(urgent.state, 'queued');
    drain(model);
    assert.equal(model.counters().preempted, 0);
  });

  it('preempts the worst-ranked running sequence past SGLang’s threshold, which prefills again what it had', () => {
    const model = new GpuModel({ ...SHAPE, priority: { preemptThreshold: 10 } });
    const low = model.submit(0, { promptIds: [1, 2, 3], outputIds: ids(6), rank: 0 }).seq;
    model.advanceTo(40); // prefill step + a few decodes
    const generated = low.generated;
    assert.ok(generated > 0);
    // A gap of 10 is not enough: it waits.
    const near = model.submit(40, { promptIds: [9], outputIds: ids(1), rank: -10 }).seq;
    drain(model);
    assert.ok(near.admittedAt! >= low.doneAt!);
    assert.equal(model.counters().preempted, 0);

    const again = new GpuModel({ ...SHAPE, priority: { preemptThreshold: 10 } });
    const victim = again.submit(0, { promptIds: [1, 2, 3], outputIds: ids(6), rank: 0 }).seq;
    again.advanceTo(40);
    const had = victim.generated;
    const urgent = again.submit(victim.admittedAt! + 40, { promptIds: [9], outputIds: ids(1), rank: -11 }).seq;
    const order = drain(again).map((s) => s.id);
    assert.deepEqual(order, [urgent.id, victim.id]);
    assert.equal(again.counters().preempted, 1);
    // Its prompt and the tokens it had are prefilled again, nothing generated is lost.
    assert.ok(again.counters().prefilledTokens >= 3 + 1 + 3 + had);
    assert.equal(victim.generated, 6);
  });
});

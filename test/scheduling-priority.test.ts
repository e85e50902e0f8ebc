import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { rankOf, SGLANG_PRIORITY, VLLM_PRIORITY } from '../src/mock-llm/priority-scheduling.ts';
import { GpuModel, type GpuModelOptions } from '../src/mock-llm/gpu-model.ts';
import { chatPayload } from '../src/llm/client.ts';
import { priorityFields, trajectoryUrgency, URGENCY_LEVELS } from '../src/llm/priority.ts';
import { DIALECTS } from '../src/llm/servers.ts';
import { drain, ids } from './support/gpu-model.ts';

const SHAPE: GpuModelOptions = {
  slots: 1,
  decodeMs: 10,
  decodeMsPerSeq: 1,
  decodeMsPerKvToken: 0,
  prefillTokensPerSecond: 1000,
  prefillChunkTokens: 64,
  prefixCacheTokens: 0,
};

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

describe('trajectory priority (llm/priority.ts)', () => {
  const fresh = {
    turnsDone: 0,
    maxSteps: 4,
    meanTurns: null,
    ageMs: 0,
    meanEpisodeMs: null,
    staleness: 0,
    staleBound: 2,
  };

  it('is 0 for a fresh trajectory and grows with staleness, progress and age, to at most URGENCY_LEVELS', () => {
    assert.equal(trajectoryUrgency(fresh), 0);
    const stale = trajectoryUrgency({ ...fresh, staleness: 1 });
    const along = trajectoryUrgency({ ...fresh, turnsDone: 2, meanTurns: 3 });
    const old = trajectoryUrgency({ ...fresh, ageMs: 5_000, meanEpisodeMs: 10_000 });
    assert.deepEqual([stale, along, old], [25, 20, 10]);
    const worst = trajectoryUrgency({
      ...fresh,
      turnsDone: 3,
      meanTurns: 1,
      ageMs: 1e9,
      meanEpisodeMs: 1,
      staleness: 9,
    });
    assert.equal(worst, Math.round(URGENCY_LEVELS * (0.5 + 0.3 * 0.75 + 0.2)));
  });

  it('ranks staleness towards the bound above progress, and progress above age', () => {
    const stale = trajectoryUrgency({ ...fresh, staleness: 1 });
    const nearlyDone = trajectoryUrgency({ ...fresh, turnsDone: 3, meanTurns: 4 });
    const old = trajectoryUrgency({ ...fresh, ageMs: 1e9, meanEpisodeMs: 1 });
    assert.ok(stale > nearlyDone && nearlyDone > old, `${stale} > ${nearlyDone} > ${old}`);
  });

  it('has no staleness term without a bound, and predicts remaining turns by maxSteps until an episode has ended', () => {
    assert.equal(trajectoryUrgency({ ...fresh, staleness: 5, staleBound: null }), 0);
    // 1 of 4 turns done, none finished yet: 3 remain; with a mean of 2 turns, 1 remains.
    assert.equal(trajectoryUrgency({ ...fresh, turnsDone: 1 }), Math.round(100 * 0.3 * (1 / 4)));
    assert.equal(trajectoryUrgency({ ...fresh, turnsDone: 1, meanTurns: 2 }), Math.round(100 * 0.3 * (1 / 2)));
  });

  it('goes in each dialect’s own field and reading, and not to servers without one', () => {
    assert.deepEqual(priorityFields(DIALECTS.vllm, 30), { priority: URGENCY_LEVELS - 30 });
    assert.deepEqual(priorityFields(DIALECTS.sglang, 30), { priority: 30 });
    assert.deepEqual(priorityFields(DIALECTS.llamacpp, 30), {});
    assert.deepEqual(priorityFields(DIALECTS.openai, 30), {});
    assert.deepEqual(priorityFields(DIALECTS.vllm, undefined), {});
    const body = chatPayload(
      { model: 'm', logprobs: false, returnTokenIds: false },
      { messages: [{ role: 'user', content: 'hi' }], maxTokens: 4, temperature: 1, urgency: 70 },
      null,
      'vllm',
      DIALECTS.vllm.priority,
    ) as Record<string, unknown>;
    assert.equal(body.priority, 30);
    const none = chatPayload(
      { model: 'm', logprobs: false, returnTokenIds: false },
      { messages: [{ role: 'user', content: 'hi' }], maxTokens: 4, temperature: 1 },
      null,
      'vllm',
      DIALECTS.vllm.priority,
    ) as Record<string, unknown>;
    assert.equal('priority' in none, false);
  });

  it('orders the mock’s queue as the engine meant: the more urgent call first, in either reading', () => {
    for (const [dialect, rule] of [
      [DIALECTS.vllm, VLLM_PRIORITY],
      [DIALECTS.sglang, SGLANG_PRIORITY],
    ] as const) {
      const field = (u: number) => (priorityFields(dialect, u) as { priority: number }).priority;
      assert.ok(rankOf(field(80), rule) < rankOf(field(20), rule), dialect.kind);
    }
  });
});

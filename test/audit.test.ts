/**
 * The consistency audit (src/coordinator/audit.ts, docs/AUDIT.md): rollouts sampled from the mock in
 * each server's dialect are re-scored on it through that server's prompt-scoring route
 * (llm/score-wire.ts); the clean path reads exactly 0, and each drift fault the mock injects
 * (mock-llm/scoring.ts) is flagged in the segment it hits. Then the engine end to end: the sampled
 * fraction, the batch stats, /metrics, POST /audit and config validation. Servers on 127.0.0.1, port 0.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { createEngine, type Engine } from '../src/engine.ts';
import { ConfigError } from '../src/errors.ts';
import { Auditor, auditSelects } from '../src/coordinator/audit.ts';
import { auditRollout, emptySkips } from '../src/coordinator/audit-segments.ts';
import type { RolloutGroup, RolloutState, TurnRecord } from '../src/domain/rollout.ts';
import type { ServerKind } from '../src/llm/servers.ts';
import { createLogger } from '../src/log.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/server.ts';
import { loadVocabulary, type MockVocabulary } from '../src/mock-llm/vocab.ts';
import type { DriftFault } from '../src/mock-llm/scoring.ts';
import type { ControlServer } from '../src/control/server.ts';

const silent = createLogger('silent');

interface Sampled {
  ids: number[];
  logprobs: number[];
}

/** One generation on the mock in its dialect's token-in route, as the engine's llm.api tokens sends it. */
async function generate(mock: MockLlm, kind: 'sglang' | 'vllm', prompt: number[], maxTokens: number): Promise<Sampled> {
  const body =
    kind === 'sglang'
      ? {
          input_ids: prompt,
          sampling_params: { max_new_tokens: maxTokens, temperature: 1, sampling_seed: 7 },
          return_logprob: true,
        }
      : { prompt, max_tokens: maxTokens, logprobs: 1, return_token_ids: true, seed: 7 };
  const res = await request(`${mock.url}${kind === 'sglang' ? '/generate' : '/v1/completions'}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const json = (await res.body.json()) as any;
  assert.equal(res.statusCode, 200, JSON.stringify(json));
  if (kind === 'sglang')
    return { ids: json.output_ids, logprobs: json.meta_info.output_token_logprobs.map((e: unknown[]) => e[0]) };
  return { ids: json.choices[0].token_ids, logprobs: json.choices[0].logprobs.token_logprobs };
}

function turn(step: number, prompt: number[], sampled: Sampled, modelSteps: number[] | null = null): TurnRecord {
  return {
    step,
    agentId: null,
    messages: [],
    response: '',
    finishReason: 'stop',
    promptIds: Int32Array.from(prompt),
    responseIds: Int32Array.from(sampled.ids),
    logprobs: Float32Array.from(sampled.logprobs),
    modelSteps: Int32Array.from(modelSteps ?? sampled.ids.map(() => 0)),
    seed: 7,
    modelStep: modelSteps?.[0] ?? 0,
    reward: 0,
    terminated: false,
    truncated: false,
    trainable: true,
    timings: { inferenceMs: 0, envMs: 0, totalMs: 0 },
  };
}

function rolloutOf(turns: TurnRecord[], id = 'task/0#0'): { group: RolloutGroup; rollout: RolloutState } {
  const rollout = { id, groupId: 'task/0', index: 0, taskName: 'task', status: 'COMPLETED', turns } as RolloutState;
  const group = { id: 'task/0', taskName: 'task', rollouts: [rollout], sampling: { temperature: 1 } } as RolloutGroup;
  return { group, rollout };
}

function auditorFor(mock: MockLlm, kind: ServerKind, modelStep = 0): Auditor {
  return new Auditor({
    settings: { fraction: 1, threshold: 0.05, concurrency: 2, maxTokenShare: 100 },
    serverFor: () => ({ url: mock.url, kind, model: null }),
    serving: () => ({ modelStep, paused: false }),
    log: silent,
  });
}

/** A ChatML conversation up to the open assistant turn, in the mock's vocabulary. */
function chatPrompt(vocab: MockVocabulary, user: string, history: number[] = []): number[] {
  return [...history, ...vocab.encode(`<|im_start|>user\n${user}<|im_end|>\n<|im_start|>assistant\n`)];
}

describe('the consistency audit against the mock in each server dialect', () => {
  let vocab: MockVocabulary;
  const mocks: MockLlm[] = [];
  const start = async (dialect: 'sglang' | 'vllm' | 'llamacpp', faults: DriftFault[] = []): Promise<MockLlm> => {
    const mock = await startMockLlm({ host: '127.0.0.1', port: 0, dialect, seed: 3 });
    mock.setDriftFaults(faults);
    mocks.push(mock);
    return mock;
  };
  before(async () => {
    vocab = await loadVocabulary('cl100k');
  });
  after(() => Promise.all(mocks.map((m) => m.close())));

  /** Two turns, the second's prompt extending the first's prompt and reply. */
  async function twoTurns(mock: MockLlm, kind: 'sglang' | 'vllm', between?: () => void): Promise<TurnRecord[]> {
    const p1 = chatPrompt(vocab, 'Compute 12 + 30. Answer with the number only.');
    const s1 = await generate(mock, kind, p1, 24);
    between?.();
    const step = between === undefined ? 0 : 1;
    const p2 = chatPrompt(vocab, 'Are you sure? Say it again.', [...p1, ...s1.ids, ...vocab.encode('\n')]);
    const s2 = await generate(mock, kind, p2, 24);
    return [
      turn(1, p1, s1),
      turn(
        2,
        p2,
        s2,
        s2.ids.map(() => step),
      ),
    ];
  }

  for (const kind of ['sglang', 'vllm'] as const) {
    it(`reads exactly zero on a clean two-turn rollout re-scored through ${kind}'s scoring route`, async () => {
      const mock = await start(kind);
      const { group, rollout } = rolloutOf(await twoTurns(mock, kind));
      const [report] = await auditorFor(mock, kind).auditNow([{ group, rollout }]);
      assert.ok(report.tokens > 10, `compared ${report.tokens} tokens`);
      assert.equal(report.maxAbsDelta, 0);
      assert.equal(report.meanAbsDelta, 0);
      assert.deepEqual(report.flagged, []);
      assert.deepEqual(
        report.segments.map((s) => s.name),
        ['turn 1', 'turn 1 start', 'turn 2', 'turn 2 start'],
      );
    });
  }

  it('flags stale KV kept across a weight update in the turn sampled after it, and skips the turn before', async () => {
    const mock = await start('sglang', ['stale-kv']);
    const turns = await twoTurns(mock, 'sglang', () => mock.setWeightVersion(1));
    const { group, rollout } = rolloutOf(turns);
    const [report] = await auditorFor(mock, 'sglang', 1).auditNow([{ group, rollout }]);
    assert.equal(report.skipped.weightsMoved, turns[0].responseIds?.length);
    assert.ok(report.flagged.includes('turn 2'), `flagged: ${report.flagged}`);
    assert.ok(report.flagged.includes('step 1 (after update)'), `flagged: ${report.flagged}`);
    assert.ok(report.bySegment.afterUpdate.meanAbsDelta > 0.05);
    assert.equal(report.bySegment.beforeUpdate.tokens, 0);
  });

  it('reads zero across the same weight update when the server recomputed the KV (no fault)', async () => {
    const mock = await start('sglang');
    const turns = await twoTurns(mock, 'sglang', () => mock.setWeightVersion(1));
    const { group, rollout } = rolloutOf(turns);
    const [report] = await auditorFor(mock, 'sglang', 1).auditNow([{ group, rollout }]);
    assert.ok(report.tokens > 0);
    assert.equal(report.maxAbsDelta, 0);
  });

  it('flags a prompt the server re-tokenised from the first token of every turn on', async () => {
    const mock = await start('vllm', ['retokenized-prompt']);
    const { group, rollout } = rolloutOf(await twoTurns(mock, 'vllm'));
    const [report] = await auditorFor(mock, 'vllm').auditNow([{ group, rollout }]);
    for (const name of ['turn 1', 'turn 1 start', 'turn 2', 'turn 2 start'])
      assert.ok(report.flagged.includes(name), `${name} not in ${report.flagged}`);
    assert.ok(report.bySegment.turnStart.meanAbsDelta > 0.05);
  });

  /** A turn cut after 3 tokens by a pause, continued after a weight update as a resume sends it. */
  async function resumedTurn(mock: MockLlm): Promise<TurnRecord> {
    const prompt = chatPrompt(vocab, 'Compute 7 * 6. Answer with the number only.');
    const head = await generate(mock, 'sglang', prompt, 3);
    mock.setWeightVersion(1);
    const rest = await generate(mock, 'sglang', [...prompt, ...head.ids], 24);
    return turn(1, prompt, { ids: [...head.ids, ...rest.ids], logprobs: [...head.logprobs, ...rest.logprobs] }, [
      ...head.ids.map(() => 0),
      ...rest.ids.map(() => 1),
    ]);
  }

  it('reads zero on a turn continued after a weight update, the tokens before it skipped', async () => {
    const mock = await start('sglang');
    const { group, rollout } = rolloutOf([await resumedTurn(mock)]);
    const [report] = await auditorFor(mock, 'sglang', 1).auditNow([{ group, rollout }]);
    assert.equal(report.skipped.weightsMoved, 3);
    assert.ok(report.bySegment.afterUpdate.tokens > 0);
    assert.equal(report.maxAbsDelta, 0);
  });

  it('flags a first token dropped after a resume in the tokens sampled after it', async () => {
    const mock = await start('sglang', ['dropped-first-token']);
    const { group, rollout } = rolloutOf([await resumedTurn(mock)]);
    const [report] = await auditorFor(mock, 'sglang', 1).auditNow([{ group, rollout }]);
    assert.ok(report.flagged.includes('step 1 (after update)'), `flagged: ${report.flagged}`);
    assert.ok(report.flagged.includes('turn 1'), `flagged: ${report.flagged}`);
  });

  it('flags truncation the server applied without being asked, in every segment', async () => {
    const mock = await start('sglang', ['hidden-truncation']);
    const { group, rollout } = rolloutOf(await twoTurns(mock, 'sglang'));
    const [report] = await auditorFor(mock, 'sglang').auditNow([{ group, rollout }]);
    assert.ok(report.meanAbsDelta > 0.05, `mean ${report.meanAbsDelta}`);
    assert.equal(report.flagged.length, report.segments.length);
  });

  it('counts the tokens of a server that cannot score prompts (llama.cpp) as skipped, and sends nothing', async () => {
    const mock = await start('sglang');
    const { group, rollout } = rolloutOf(await twoTurns(mock, 'sglang'));
    const before = mock.stats().requests;
    const auditor = auditorFor(mock, 'llamacpp');
    const [report] = await auditor.auditNow([{ group, rollout }]);
    assert.equal(report.tokens, 0);
    assert.equal(
      report.skipped.cannotScore,
      rollout.turns.reduce((n, t) => n + (t.responseIds?.length ?? 0), 0),
    );
    assert.equal(mock.stats().requests, before);
    assert.equal(auditor.totals().cost.scoredTokens, 0);
  });
});

describe('the audit arithmetic', () => {
  it('takes |recorded − re-scored| per token after rounding the re-scored value to float32, by segment', () => {
    const t = turn(
      1,
      [1, 2],
      { ids: [10, 11, 12, 13, 14, 15], logprobs: [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6] },
      [0, 0, 0, 0, 1, 1],
    );
    const { rollout } = rolloutOf([t]);
    const scores = Float64Array.from([-0.1, -0.2, -0.3, -0.4, -0.7, -0.6]);
    const report = auditRollout(rollout, [scores], {
      server: 'x',
      modelStep: 1,
      threshold: 0.05,
      skipped: emptySkips(),
    });
    assert.equal(report.tokens, 6);
    assert.equal(report.maxAbsDelta, Math.abs(Math.fround(-0.5) - Math.fround(-0.7)));
    assert.equal(report.bySegment.turnStart.maxAbsDelta, 0);
    assert.equal(report.bySegment.turnRest.tokens, 2);
    assert.equal(report.bySegment.beforeUpdate.tokens, 4);
    assert.equal(report.bySegment.afterUpdate.tokens, 2);
    assert.deepEqual(report.flagged, ['step 1 (after update)']);
  });

  it('selects the same rollouts for a fraction on every run, about that share of them', () => {
    const ids = Array.from({ length: 2000 }, (_, i) => `task/${i >> 2}#${i & 3}`);
    const chosen = ids.filter((id) => auditSelects(id, 0.1)).length;
    assert.ok(chosen > 140 && chosen < 260, `${chosen} of 2000`);
    assert.deepEqual(
      ids.filter((id) => auditSelects(id, 0.1)),
      ids.filter((id) => auditSelects(id, 0.1)),
    );
    assert.equal(ids.filter((id) => auditSelects(id, 0)).length, 0);
  });
});

describe('the audit in the engine', () => {
  let engine: Engine;
  let server: ControlServer;
  before(async () => {
    engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      workers: { threads: 1 },
      audit: { fraction: 1, concurrency: 4 },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 2, maxSteps: 4 }],
    });
    await engine.start();
    server = await engine.listen({ port: 0 });
  });
  after(() => engine.close());

  const post = async (path: string, body: unknown) => {
    const res = await request(`${server.url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    return { status: res.statusCode, body: (await res.body.json()) as any };
  };

  it('re-scores the last batch on POST /audit and reads exactly zero on the built-in mock', async () => {
    const batch = await engine.getBatch(1);
    assert.equal(batch.status, 'NORMAL');
    const { status, body } = await post('/audit', {});
    assert.equal(status, 200);
    assert.equal(body.rollouts.length, 4);
    assert.equal(body.flagged, 0);
    for (const r of body.rollouts) {
      assert.ok(r.tokens > 0, `${r.rolloutId}: nothing compared`);
      assert.equal(r.maxAbsDelta, 0);
    }
    const one = await post('/audit', { rolloutId: body.rollouts[0].rolloutId });
    assert.equal(one.body.rollouts.length, 1);
  });

  it('answers 400 naming the field for an unknown rollout or both names', async () => {
    const unknown = await post('/audit', { rolloutId: 'no/such#0' });
    assert.equal(unknown.status, 400);
    assert.match(unknown.body.error.message, /rolloutId "no\/such#0"/);
    const both = await post('/audit', { rolloutId: 'a', groupId: 'b' });
    assert.equal(both.status, 400);
  });

  it('reports the sampled audit in the next batch, the run totals and /metrics, with its cost', async () => {
    const batch = await engine.getBatch(2);
    assert.equal(batch.status, 'NORMAL');
    const audit = batch.status === 'NORMAL' ? batch.stats?.audit : undefined;
    assert.ok(audit !== undefined, 'batch.stats.audit');
    assert.equal(audit.maxAbsDelta, 0);
    const totals = (await engine.stats()).audit;
    assert.ok(totals !== undefined && totals.rollouts >= 4 && totals.tokens > 0);
    assert.ok(totals.cost.scoredTokens > 0 && totals.cost.generatedTokens > 0);
    const metrics = await engine.metrics();
    assert.match(metrics, /rollout_engine_audit_rollouts_total\{result="clean"\} \d+/);
    assert.match(metrics, /rollout_engine_audit_tokens_total\{kind="sent"\} \d+/);
    assert.match(metrics, /rollout_engine_audit_abs_delta_logprob_bucket/);
  });
});

describe('audit config', () => {
  it('names the field of a bad value', () => {
    assert.throws(
      () => createEngine({ audit: { fraction: 2 } }),
      (err: unknown) => err instanceof ConfigError && /audit\.fraction/.test((err as Error).message),
    );
    assert.throws(
      () => createEngine({ audit: { threshold: 0 } }),
      (err: unknown) => err instanceof ConfigError && /audit\.threshold/.test((err as Error).message),
    );
    assert.throws(
      () => createEngine({ audit: { fractions: 0.1 } } as never),
      (err: unknown) => err instanceof ConfigError && /audit/.test((err as Error).message),
    );
  });
});

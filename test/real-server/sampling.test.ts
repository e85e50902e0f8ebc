/**
 * The llama.cpp sampling defect of issue 27, against the real llama-server: the engine used to send only
 * `temperature` and `seed`, so llama-server sampled from its default truncated distribution (top_k 40,
 * top_p 0.95, min_p 0.05: common/common.h common_params_sampling, llama.cpp de3ff815) while it reports,
 * and the engine recorded, each token's logprob under the model's whole distribution
 * (server-common.cpp get_token_probabilities: the softmax of the raw logits). The engine now sends the
 * neutral value of every truncating or penalising setting the task leaves unset (llm/token-wire.ts
 * samplingFields).
 *
 * The model (make_model.py) is near-flat over Qwen2.5's 151,665 tokens: at a position, its 40 most
 * likely tokens hold about 0.1 % of the probability. So:
 * - sampled from the truncated distribution, every token is among its position's 40 most likely (the
 *   top 40 the server reports with n_probs 40), and its recorded logprob is far above the entropy;
 * - sampled from the distribution the logprobs describe, a token is among the 40 most likely with the
 *   probability those 40 hold — which the server reports — and E[1 / (V · p(token))] = 1 exactly.
 *
 * False failures: the count of tokens among their top 40, C, is a sum of indicators whose conditional
 * probabilities p_i are the reported top-40 masses; exp(λC − (e^λ − 1)Σp_i) is a supermartingale, so
 * P(C ≥ a and Σp_i ≤ m) ≤ e^−m (e·m / a)^a: with m = 2 (asserted; Σp_i ≈ 0.6 here) and a = 20, at most
 * 7·10⁻¹³. Without the fix C is N by construction (all but the odd token at llama.cpp's rank-40 boundary:
 * ≥ 99 % asserted). The means are asserted ≥ 20 standard errors away from their bounds (measured: raw mean
 * logprob −10.2 truncated, −11.8 full; inverse-probability mean 0.18 truncated, 1.00 full).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createEngine, Status, type Engine, type EngineConfigInput } from '../../src/index.ts';
import { loadChatModel, type ChatModel } from '../../src/chat-model/model.ts';
import { TOKEN_WIRES } from '../../src/llm/token-wire.ts';
import { MODEL_NAME, realServerAvailable, startLlamaServer, type LlamaServer } from '../support/llama-server.ts';

const available = realServerAvailable();
const skip = available.ok || process.env.CI === 'true' ? false : available.reason;

const VOCAB = 151_665;
const TOP = 40;
/** Tokens per reply, replies (seeds) per side: N ≈ 512 tokens (llama.cpp reports no entry for a token ending inside a UTF-8 character). */
const TOKENS = 64;
const SEEDS = 8;
/** The martingale Chernoff bound's m and a (see the file's comment). */
const MASS_BOUND = 2;
const COUNT_BOUND = 20;

interface Entry {
  id: number;
  logprob: number;
  top_logprobs: { id: number; logprob: number }[];
}

interface Stats {
  n: number;
  /** Tokens among their position's 40 most likely. */
  inTop: number;
  /** Σ over positions of the reported top-40 probability mass. */
  topMass: number;
  meanLogprob: number;
  /** Mean of 1 / (V · p(token)): 1 when tokens are drawn from the recorded distribution over the whole vocabulary. */
  meanInverse: number;
}

function stats(entries: Entry[]): Stats {
  let inTop = 0;
  let topMass = 0;
  let logprobs = 0;
  let inverse = 0;
  for (const e of entries) {
    assert.equal(e.top_logprobs.length, TOP);
    if (e.top_logprobs.some((t) => t.id === e.id)) inTop++;
    for (const t of e.top_logprobs) topMass += Math.exp(t.logprob);
    logprobs += e.logprob;
    inverse += Math.exp(-e.logprob) / VOCAB;
  }
  const n = entries.length;
  return { n, inTop, topMass, meanLogprob: logprobs / n, meanInverse: inverse / n };
}

describe('llama-server samples from the distribution its logprobs describe, as the engine asks', {
  skip,
  timeout: 600_000,
}, () => {
  let server: LlamaServer;
  let qwen: ChatModel;
  const engines: Engine[] = [];
  before(async () => {
    [server, qwen] = await Promise.all([startLlamaServer({ ctxSize: 4096, slots: 2 }), loadChatModel('qwen2.5')]);
  });
  after(async () => {
    await Promise.all(engines.splice(0).map((e) => e.close()));
    await server?.stop();
  });

  async function sample(body: (seed: number, prompt: number[]) => Record<string, unknown>): Promise<Stats> {
    const prompt = qwen.encode(qwen.render([{ role: 'user', content: 'Hi' }], { addGenerationPrompt: true }));
    const entries: Entry[] = [];
    for (let seed = 1; seed <= SEEDS; seed++) {
      // ignore_eos: every reply runs its 64 tokens (it also keeps the end token out of the sampled set,
      // which only lowers C: the bound's direction).
      const res = await fetch(`${server.url}/completion`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ ...body(seed, prompt), ignore_eos: true }),
        signal: AbortSignal.timeout(120_000),
      });
      const json = (await res.json()) as { completion_probabilities: Entry[] };
      assert.equal(res.status, 200, JSON.stringify(json));
      entries.push(...json.completion_probabilities);
    }
    return stats(entries);
  }

  it('without the neutral settings every token comes from the 40 most likely and its logprob is far above the entropy; with them, tokens fall there only as often as the recorded probabilities say', async (t) => {
    // What the engine sent before: the token-in body of llm/token-wire.ts, less every sampling field but these.
    const before = await sample((seed, prompt) => ({
      prompt,
      n_predict: TOKENS,
      n_probs: TOP,
      post_sampling_probs: false,
      return_tokens: true,
      cache_prompt: true,
      temperature: 1,
      seed,
    }));
    const now = await sample((seed, prompt) =>
      TOKEN_WIRES.llamacpp.body({ promptIds: prompt, maxTokens: TOKENS, topLogprobs: TOP, temperature: 1, seed }, null),
    );
    t.diagnostic(`before: ${JSON.stringify(before)}`);
    t.diagnostic(`now: ${JSON.stringify(now)}`);
    assert.ok(before.n >= 500 && now.n >= 500, `${before.n} and ${now.n} tokens`);

    // The defect: a truncated sampler, recorded as if it were the model.
    assert.ok(before.inTop >= before.n * 0.99, `${before.inTop} of ${before.n} among the top 40`);
    assert.ok(before.topMass / before.n < 0.01, 'the model is near-flat: its top 40 hold under 1 % at a position');
    // The fix: tokens among the top 40 no more often than those 40's recorded probability allows.
    assert.ok(now.topMass <= MASS_BOUND, `top-40 mass summed over positions: ${now.topMass}`);
    assert.ok(
      now.inTop < COUNT_BOUND,
      `${now.inTop} of ${now.n} among the top 40 (expected ${now.topMass.toFixed(2)})`,
    );

    // The logprobs recorded: far above the full distribution's when truncated (each ≥ the 40th's), at
    // its level when not; and the inverse-probability identity holds only for the fix.
    assert.ok(before.meanLogprob > -10.7, `mean logprob ${before.meanLogprob}`);
    assert.ok(now.meanLogprob < -11.2, `mean logprob ${now.meanLogprob}`);
    assert.ok(before.meanInverse < 0.4, `E[1/(V p)] ${before.meanInverse}`);
    assert.ok(now.meanInverse > 0.7 && now.meanInverse < 1.4, `E[1/(V p)] ${now.meanInverse}`);
  });

  const engineConfig = (api: 'tokens' | 'chat', sampling: Record<string, number>): EngineConfigInput => ({
    logLevel: 'silent',
    batchSize: 4,
    workers: { threads: 1 },
    llm: { url: server.url, model: MODEL_NAME, timeoutMs: 120_000, api },
    tasks: [
      {
        name: 'guess',
        env: { module: 'builtin:guess-number' },
        groupSize: 2,
        maxSteps: 2,
        messageCut: 0,
        maxTokens: 48,
        ...sampling,
      },
    ],
  });

  for (const api of ['tokens', 'chat'] as const) {
    it(`${api} mode: the engine's recorded logprobs are at the whole distribution's level and its groups record temperature 1 alone; a task's topK 40 is sent and recorded`, async (t) => {
      const run = async (sampling: Record<string, number>) => {
        const e = createEngine(engineConfig(api, sampling));
        engines.push(e);
        await e.start();
        const batch = await e.getBatch();
        assert.equal(batch.status, 'NORMAL');
        const logprobs: number[] = [];
        for (const group of batch.groups) {
          assert.deepEqual(group.sampling, { temperature: 1, ...sampling });
          for (const rollout of group.rollouts) {
            assert.equal(rollout.status, Status.COMPLETED, rollout.error ?? '');
            for (const turn of rollout.turns) {
              assert.ok(turn.logprobs !== null);
              // Tokens mode fills what llama.cpp leaves out, from the whole vocabulary when the token is
              // not among the 100 most likely; chat mode keeps the tokens it has entries for.
              for (const lp of turn.logprobs) if (!Number.isNaN(lp)) logprobs.push(lp);
            }
          }
        }
        await e.close();
        const mean = logprobs.reduce((a, b) => a + b, 0) / logprobs.length;
        t.diagnostic(`${JSON.stringify(sampling)}: ${logprobs.length} tokens, mean logprob ${mean.toFixed(3)}`);
        assert.ok(logprobs.length >= 100, `${logprobs.length} tokens`);
        return mean;
      };
      // Per token the logprob's standard deviation is ≈ 0.42 (full) and ≈ 0.21 (top 40): over ≥ 100
      // tokens the bounds are ≥ 15 standard errors from the measured means (−11.8, −10.2).
      assert.ok((await run({})) < -11.2);
      assert.ok((await run({ topK: TOP })) > -10.8);
    });
  }
});

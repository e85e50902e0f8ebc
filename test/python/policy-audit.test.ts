/**
 * The consistency audit against the reference policy server (python/rollout_engine/policy), which
 * speaks SGLang's /generate: a rollout's exact ids re-scored with `max_new_tokens: 0` and
 * `logprob_start_len` must give back the logprobs recorded when they were sampled, up to the server's
 * own numerical noise — sampling runs a prefill then one decode step per token on a KV cache, scoring
 * one full-sequence forward, so float32 sums run in another order. The measured noise is printed and
 * bounded here; docs/AUDIT.md states it. A truncating sampler (top_k) is scored with the same
 * settings, so it reads the same noise.
 *
 * Needs python3 with torch (Debian: python3-torch); skipped without it, failed under CI=true.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { createEngine, type Engine } from '../../src/index.ts';
import { runToExit } from '../support/cli.ts';
import {
  PYTHONPATH,
  pythonWithTorch,
  startPolicyServer,
  stopPolicyServer,
  type PolicyServer,
} from '../support/policy-server.ts';

const CI = process.env.CI === 'true';
const MIN = 60_000;
const SERVED = 'tiny-policy';
/** The bound the measured noise must stay under (float32 forward, another summation order). */
const NOISE_BOUND = 1e-4;

const MAKE_MODEL = `
import sys, torch
from rollout_engine.policy import ModelConfig, init_model, save_pretrained
model = init_model(ModelConfig(d_model=32, n_layers=2, n_heads=2, max_len=2048), seed=1)
gen = torch.Generator().manual_seed(1001)
with torch.no_grad():
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=gen) * 0.4)
    model.lm_head.weight[model.config.eos_token_id] *= 5
save_pretrained(model, sys.argv[1] + "/m0")
`;

describe('the consistency audit against the reference policy server', { timeout: 10 * MIN }, () => {
  let python: string | null = null;
  let dir: string;
  let server: PolicyServer | undefined;
  const engines: Engine[] = [];

  before(
    async () => {
      python = await pythonWithTorch();
      if (python === null) {
        if (CI) assert.fail('no python3 with torch (Debian: python3-torch)');
        return;
      }
      dir = mkdtempSync(join(tmpdir(), 'policy-audit-'));
      const made = await runToExit(python, ['-c', MAKE_MODEL, dir], { timeoutMs: 2 * MIN, env: { PYTHONPATH } });
      assert.equal(made.code, 0, made.stderr);
      server = await startPolicyServer(python, join(dir, 'm0'), ['--served-model-name', SERVED]);
    },
    { timeout: 3 * MIN },
  );
  after(async () => {
    await Promise.all(engines.splice(0).map((e) => e.close()));
    await stopPolicyServer(server);
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  for (const shape of [{ temperature: 0.8 }, { temperature: 1, topK: 20 }] as const) {
    it(`reads only the server's numerical noise on a clean multi-turn batch (${JSON.stringify(shape)})`, async (t) => {
      if (python === null) return t.skip('no python3 with torch');
      const engine = createEngine({
        logLevel: 'silent',
        batchSize: 2,
        workers: { threads: 1 },
        audit: { fraction: 1 },
        llm: {
          url: server!.url,
          server: 'sglang',
          api: 'tokens',
          tokenizer: join(dir, 'm0'),
          model: SERVED,
          timeoutMs: MIN,
        },
        tasks: [
          {
            name: 'guess',
            env: { module: 'builtin:guess-number' },
            groupSize: 2,
            maxSteps: 3,
            messageCut: 0,
            maxTokens: 48,
            ...shape,
          },
        ],
      });
      engines.push(engine);
      await engine.start();
      const batch = await engine.getBatch(1);
      assert.equal(batch.status, 'NORMAL');
      const reports = await engine.audit();
      const tokens = reports.reduce((n, r) => n + r.tokens, 0);
      const max = Math.max(...reports.map((r) => r.maxAbsDelta));
      const mean = reports.reduce((s, r) => s + r.meanAbsDelta * r.tokens, 0) / tokens;
      console.log(
        `policy server audit ${JSON.stringify(shape)}: ${reports.length} rollouts, ${tokens} tokens, mean |Δ| ${mean.toExponential(3)}, max |Δ| ${max.toExponential(3)}`,
      );
      assert.ok(tokens > 20, `compared ${tokens} tokens`);
      assert.ok(max < NOISE_BOUND, `max |Δ| ${max} over ${NOISE_BOUND}`);
      assert.equal(reports.filter((r) => r.flagged.length > 0).length, 0);
      await engine.close();
    });
  }
});

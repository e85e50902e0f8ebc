/**
 * A real policy learns through the engine, and every token it trains on checks out
 * (examples/grpo_learn.py, docs/LEARNING.md): the reference policy (rollout_engine.policy, a small
 * transformer, seeded) is trained by GRPO on builtin:echo-digit through `rollout serve` and the
 * reference policy server, on CPU, with the sync strategy and with async + partial rollouts + in-place
 * pause (and + abort pause, whose continued turns are prefilled again under the new weights). Each run
 * must go from chance to the learned level within the step bound, and its token check — every trained
 * token's logprob recomputed under the weights of the model step it is tagged with — must pass.
 *
 * Run by `npm run test:python`; under CI=true a missing torch fails instead of skipping.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { runToExit, type CliResult } from '../support/cli.ts';
import { pythonWithTorch } from '../support/policy-server.ts';

const REPO = new URL('../../', import.meta.url).pathname;
const EXAMPLE = join(REPO, 'examples', 'grpo_learn.py');
const CI = process.env.CI === 'true';
const MIN = 60_000;
/** The learned level must be reached by this train step (docs/LEARNING.md states it). */
const STEP_BOUND = 150;
/** Wall-clock bound of one run (the example stops itself there; the test allows a minute more). */
const RUN_SECONDS = 300;
const TOLERANCE = 1e-4;

/** What the example writes to <out>/curve.json (the fields read here). */
interface Curve {
  label: string;
  chance: number;
  target: number;
  learned_at: number | null;
  steps_run: number;
  reward_step1: number;
  reward_last: number;
  tokens_checked: number;
  max_abs_delta: number;
  inexact_tokens: number;
  inexact_mean_abs_delta: number | null;
  inexact_max_abs_delta: number | null;
  multi_step_turns: number;
  multi_step_rollouts: number;
  model_steps_tagged: number;
  steps: { step: number; reward: number; model_steps: string }[];
}

/** The first python that imports torch, numpy and msgpack (the pyenv `python3` on PATH may not). */
function show(out: CliResult): string {
  return `exit ${out.code}\n--- stdout ---\n${out.stdout}\n--- stderr ---\n${out.stderr}`;
}

describe('a real policy learns through the engine, and every trained token checks out', { timeout: 25 * MIN }, () => {
  let python: string | null = null;
  let dir: string;

  before(async () => {
    python = await pythonWithTorch('torch, numpy, msgpack');
    if (python === null && CI)
      assert.fail('no python3 with torch, numpy and msgpack (Debian: python3-torch python3-numpy python3-msgpack)');
    dir = mkdtempSync(join(tmpdir(), 'grpo-learn-'));
  });
  after(() => {
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  /** Runs the example to the learned level (or its bounds) and returns its output and curve. */
  async function learn(name: string, args: string[]): Promise<{ out: CliResult; curve: Curve }> {
    const out = await runToExit(
      python!,
      [
        EXAMPLE,
        '--out',
        join(dir, name),
        '--max-steps',
        String(STEP_BOUND),
        '--max-seconds',
        String(RUN_SECONDS),
        '--require-learned',
        ...args,
      ],
      { timeoutMs: (RUN_SECONDS + 60) * 1000, env: { NODE: process.execPath } },
    );
    assert.doesNotMatch(out.stdout, /TOKEN CHECK FAILED/, show(out));
    assert.equal(out.code, 0, show(out));
    const curve = JSON.parse(readFileSync(join(dir, name, 'curve.json'), 'utf8')) as Curve;
    return { out, curve };
  }

  /** What every run must show: chance at the start, the learned level within the bound, every exact token exact. */
  function assertLearnedAndChecked({ out, curve }: { out: CliResult; curve: Curve }): void {
    const context = `${curve.label}\n${out.stdout}`;
    assert.ok(
      curve.reward_step1 < 0.1,
      `step 1 is near chance (${curve.chance.toFixed(4)}): ${curve.reward_step1}\n${context}`,
    );
    assert.ok(curve.learned_at !== null && curve.learned_at <= STEP_BOUND, `learned by step ${STEP_BOUND}\n${context}`);
    assert.ok(curve.reward_last >= curve.target, `the last steps are at the learned level\n${context}`);
    assert.ok(curve.tokens_checked > 1000, `tokens checked: ${curve.tokens_checked}`);
    assert.ok(curve.max_abs_delta <= TOLERANCE, `max |Δ| ${curve.max_abs_delta} within ${TOLERANCE}`);
    assert.match(out.stdout, /token check: \d+ tokens exact within 0\.0001 \(max \|Δ\| [\d.e+-]+\), 0 mismatches/);
    // One line per step, as many as the curve holds.
    assert.equal([...out.stdout.matchAll(/^step \d+: reward /gm)].length, curve.steps_run);
  }

  it('runs the token check on hand-made rollouts: exact ones pass, each defect fails naming rollout, turn and token', async (t) => {
    if (python === null) return t.skip('torch is not installed');
    const out = await runToExit(python, [EXAMPLE, '--self-test'], { timeoutMs: 2 * MIN });
    assert.equal(out.code, 0, show(out));
    assert.match(out.stdout, /self-test: exact rollouts pass: \d+ tokens checked, max \|Δ\| [\d.e+-]+, \d+ inexact/);
    assert.match(out.stdout, /self-test: a logprob off by 0\.001 fails: .*rollout r0 .*turn 1 token 2/);
    assert.match(
      out.stdout,
      /self-test: a re-tokenised prompt fails: .*rollout r1 .*turn 1: its prompt does not begin/,
    );
    assert.match(
      out.stdout,
      /self-test: an unknown model step fails: .*model step 7, which this trainer never produced/,
    );
    assert.match(out.stdout, /self-test: a stale-KV token is reported, not failed: 1 inexact/);
    assert.match(out.stdout, /self-test: passed/);
  });

  it('learns with the sync strategy, every trained token exact', { timeout: 7 * MIN }, async (t) => {
    if (python === null) return t.skip('torch is not installed');
    const run = await learn('sync', ['--strategy', 'sync']);
    assertLearnedAndChecked(run);
    assert.equal(run.curve.inexact_tokens, 0, 'sync production keeps no generation across a weight update');
    assert.equal(run.curve.multi_step_turns, 0);
  });

  it('learns with async + partial rollouts + in-place pause: tokens of several model steps checked, stale-KV drift reported beside', {
    timeout: 7 * MIN,
  }, async (t) => {
    if (python === null) return t.skip('torch is not installed');
    const run = await learn('async-in-place', ['--strategy', 'async', '--partial', '--pause-mode', 'in-place']);
    assertLearnedAndChecked(run);
    const { curve } = run;
    // Off-policy for real: batches held tokens of more than one model step, and turns that went on
    // across a weight update, so the check covered both.
    assert.ok(
      curve.steps.some((s) => s.model_steps.includes(' ')),
      `a batch with tokens of 2+ model steps\n${run.out.stdout}`,
    );
    assert.ok(curve.multi_step_turns > 0, `a turn generated across a weight update\n${run.out.stdout}`);
    // Tokens sampled after an in-place update on a KV cache from earlier weights: counted, with their drift.
    assert.ok(curve.inexact_tokens > 0, `stale-KV tokens identified\n${run.out.stdout}`);
    assert.ok(curve.inexact_max_abs_delta !== null && curve.inexact_mean_abs_delta !== null);
    assert.match(run.out.stdout, /inexact \d+ \(drift mean [\d.e+-]+ max [\d.e+-]+\)/);
  });

  it('learns with async + partial rollouts + abort pause: continued turns, prefilled again under the new weights, are exact', {
    timeout: 7 * MIN,
  }, async (t) => {
    if (python === null) return t.skip('torch is not installed');
    const run = await learn('async-abort', ['--strategy', 'async', '--partial', '--pause-mode', 'abort']);
    assertLearnedAndChecked(run);
    assert.ok(run.curve.multi_step_turns > 0, `a partial turn continued after a weight update\n${run.out.stdout}`);
    assert.equal(run.curve.inexact_tokens, 0, 'an aborted generation keeps no KV cache: nothing inexact');
  });
});

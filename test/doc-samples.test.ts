/**
 * The sample outputs the README and docs/ show are what the commands print: each block under a
 * `<!-- sample: id (npm run docs:samples) -->` marker is run again here (scripts/doc-samples.ts) and
 * compared, with what changes from run to run masked (a run's time and rate, its run dir's name). The
 * library example's sample is checked by test/readme.test.ts, which runs the example anyway.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { markersOn, ROOT, SAMPLES, sampleBlock, withSample } from '../scripts/doc-samples.ts';

/** A run of a few seconds, generous for a busy machine. */
const SAMPLE_TIMEOUT_MS = 150_000;

const pages = [
  'README.md',
  ...readdirSync(join(ROOT, 'docs')).flatMap((f) => (f.endsWith('.md') ? [`docs/${f}`] : [])),
];
const read = (page: string) => readFileSync(join(ROOT, page), 'utf8');

describe('sample outputs in the docs', () => {
  it('every sample marker names a sample of its page, and every sample has its marker', () => {
    const marked = pages.flatMap((page) => markersOn(read(page)).map((id) => `${page}: ${id}`)).sort();
    const known = SAMPLES.map((s) => `${s.page}: ${s.id}`).sort();
    assert.deepEqual(marked, known);
  });

  it('masks only what changes from run to run', () => {
    const summary = SAMPLES.find((s) => s.id === 'run-summary')!;
    const a =
      'rollout run: 3 batches written to /…/runs/20261128-232731-5c1f9e0a/batches.jsonl\n  rollouts    96, mean reward 0.551\n  time        3.40 s, 114.0 steps/s';
    const b =
      'rollout run: 3 batches written to /…/runs/20261129-010203-00ff00ff/batches.jsonl\n  rollouts    96, mean reward 0.551\n  time        12.05 s, 32.1 steps/s';
    assert.equal(summary.mask(a), summary.mask(b));
    assert.notEqual(summary.mask(a), summary.mask(a.replace('0.551', '0.552')));
    assert.equal(
      withSample('x\n<!-- sample: s (npm run docs:samples) -->\n```\nold\n```\ny', 's', 'new'),
      'x\n<!-- sample: s (npm run docs:samples) -->\n```\nnew\n```\ny',
    );
  });

  for (const sample of SAMPLES.filter((s) => s.checkedBy === undefined))
    it(`${sample.page}: the ${sample.id} sample is what the command prints`, {
      timeout: SAMPLE_TIMEOUT_MS,
    }, async () => {
      const shown = sampleBlock(read(sample.page), sample.id, sample.page);
      const actual = await sample.produce();
      assert.equal(
        sample.mask(shown),
        sample.mask(actual),
        `${sample.page}'s ${sample.id} sample is out of date: run \`npm run docs:samples\` and commit ${sample.page}`,
      );
    });
});

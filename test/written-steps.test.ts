import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync, readFileSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { writtenSteps } from '../src/cli/written-steps.ts';
import { rollout, runToExit } from './support/cli.ts';

const SCAN = new URL('./fixtures/scan-written-steps.ts', import.meta.url).pathname;
const MiB = 1024 * 1024;

/** Lines of `perStep` groups for steps 1..steps, with text that is several bytes per character in UTF-8. */
function batchLines(steps: number, perStep: number): string[] {
  const lines: string[] = [];
  for (let step = 1; step <= steps; step++)
    for (let g = 0; g < perStep; g++)
      lines.push(
        JSON.stringify({ trainStep: step, id: `g-${step}-${g}`, text: `é€𝄞 ${'x'.repeat((step * 7 + g) % 50)}` }),
      );
  return lines;
}

describe('resuming from a batches file', () => {
  it("`rollout run --resume` on a batches file past V8's string limit resumes instead of dying with ERR_STRING_TOO_LONG (regression)", async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-huge-'));
    const args = ['--batch-size', '2', '--threads', '1', '--run-dir', runDir];
    assert.equal((await rollout(['run', '--steps', '1', ...args])).code, 0);
    const path = join(runDir, 'batches.jsonl');
    const written = readFileSync(path, 'utf8');
    // Past 512 MiB without writing it: the file is extended with a hole (what a crash can leave at the
    // end of a file being appended to). The step before it is whole; the cut tail goes.
    truncateSync(path, 600 * MiB);
    const { code, stderr } = await rollout(['run', '--resume', '--steps', '2', ...args], { timeoutMs: 120_000 });
    assert.equal(code, 0, stderr);
    assert.doesNotMatch(stderr, /ERR_STRING_TOO_LONG/);
    const lines = readFileSync(path, 'utf8');
    assert.ok(lines.startsWith(written), 'step 1 as it was');
    assert.deepEqual(
      lines
        .trim()
        .split('\n')
        .map((l) => (JSON.parse(l) as { trainStep: number }).trainStep),
      [1, 1, 2, 2],
    );
  });

  it('a batches file is scanned in bounded memory: 640 MiB read with a peak resident size far below it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-scan-mem-'));
    const path = join(dir, 'batches.jsonl');
    writeFileSync(path, `${batchLines(3, 2).join('\n')}\n`);
    const whole = statSync(path).size;
    truncateSync(path, 640 * MiB); // a hole: nothing written to disk
    const { code, stdout, stderr } = await runToExit(
      process.execPath,
      ['--import', 'tsx', SCAN, path, '2', String(MiB)],
      { timeoutMs: 60_000 },
    );
    assert.equal(code, 0, stderr);
    const result = JSON.parse(stdout) as { first: number; last: number; maxRssBytes: number };
    assert.deepEqual({ first: result.first, last: result.last }, { first: 1, last: 3 });
    assert.ok(
      result.maxRssBytes < 256 * MiB,
      `peak resident size ${Math.round(result.maxRssBytes / MiB)} MiB while reading a 640 MiB file`,
    );
    assert.equal(statSync(path).size, whole, 'cut back to its last whole step');
  });

  it('a batches file read in chunks smaller than its lines gives the first and last whole steps and is cut back to the last one, byte for byte', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-scan-'));
    const path = join(dir, 'batches.jsonl');
    const lines = batchLines(2000, 4);
    const whole = `${lines.join('\n')}\n`;
    // Step 2001 cut short: two of its four lines, and a third cut in the middle of a multi-byte character.
    const next = batchLines(2001, 4).slice(8000);
    const extra = next.slice(0, 2);
    const third = Buffer.from(next[2]);
    const cut = third.subarray(0, third.indexOf('é') + 3); // inside the three bytes of '€'
    writeFileSync(path, `${whole}${extra.join('\n')}\n`);
    appendFileSync(path, cut);
    for (const chunkBytes of [13, 61, 4096]) {
      const copy = join(dir, `copy-${chunkBytes}.jsonl`);
      writeFileSync(copy, readFileSync(path));
      assert.deepEqual(await writtenSteps(copy, 4, { chunkBytes }), { first: 1, last: 2000 });
      assert.equal(readFileSync(copy, 'utf8'), whole);
    }
    assert.deepEqual(await writtenSteps(join(dir, 'missing.jsonl'), 4), { first: 0, last: 0 });
  });

  it('a batches file with a line longer than the longest group is refused naming the line, and left alone; a cut line that long is dropped', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-scan-long-'));
    const path = join(dir, 'batches.jsonl');
    const [one, two] = batchLines(1, 2);
    const long = JSON.stringify({ trainStep: 2, pad: 'y'.repeat(500) });
    const text = `${one}\n${two}\n${long}\n`;
    writeFileSync(path, text);
    await assert.rejects(writtenSteps(path, 2, { maxLineBytes: 200, chunkBytes: 64 }), {
      code: 'ERR_USAGE',
      message: /batches\.jsonl line 3 is longer than 200 bytes/,
    });
    assert.equal(readFileSync(path, 'utf8'), text);
    writeFileSync(path, `${one}\n${two}\n${long}`); // no newline: the crash cut it
    assert.deepEqual(await writtenSteps(path, 2, { maxLineBytes: 200, chunkBytes: 64 }), { first: 1, last: 1 });
    assert.equal(readFileSync(path, 'utf8'), `${one}\n${two}\n`);
  });
});

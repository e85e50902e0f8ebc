/**
 * `rollout run` in this process, so what it keeps reachable can be seen: each batch it writes is
 * watched through a WeakRef, and a full garbage collection at the last write shows which are still
 * held. GC is exposed at run time (v8.setFlagsFromString, `gc` taken from a fresh context), as the
 * memory bench does, so the test needs no Node flag; the flag stays in this file's own process.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { runCommand } from '../src/cli/run.ts';
import type { Batch } from '../src/coordinator/producer.ts';
import { BatchFileWriter } from '../src/formats/batch-file.ts';

function exposedGc(): () => void {
  setFlagsFromString('--expose-gc');
  return runInNewContext('gc') as () => void;
}

describe('rollout run memory', () => {
  it('a long rollout run keeps no written batch for its summary (regression: every batch was kept until the heap ran out)', async (t) => {
    const gc = exposedGc();
    const steps = 40;
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-run-memory-'));
    const watched: WeakRef<Batch>[] = [];
    let heldAtLastWrite: number | null = null;
    const write = BatchFileWriter.prototype.write;
    // Patched by hand: a mock records each call's arguments, which would hold every batch itself.
    t.after(() => void (BatchFileWriter.prototype.write = write));
    BatchFileWriter.prototype.write = async function (this: BatchFileWriter, batch: Batch) {
      await write.call(this, batch);
      watched.push(new WeakRef(batch));
      if (batch.trainStep !== steps) return;
      // A WeakRef keeps its target for the rest of the job that made or read it: collect in a later one.
      await new Promise<void>((resolve) => setImmediate(resolve));
      gc();
      heldAtLastWrite = watched.filter((ref) => ref.deref() !== undefined).length;
    };
    t.mock.method(console, 'log', () => undefined); // the summary, read from summary.json instead
    const logLevel = process.env.LOG_LEVEL;
    process.env.LOG_LEVEL = 'warn';
    t.after(() => (logLevel === undefined ? delete process.env.LOG_LEVEL : (process.env.LOG_LEVEL = logLevel)));

    const code = await runCommand(['--steps', `${steps}`, '--batch-size', '1', '--threads', '1', '--run-dir', runDir]);
    assert.equal(code, 0);
    assert.equal(watched.length, steps, 'every batch was written through the watched writer');
    // The batch being written is held by its caller; any other still held would grow with the run.
    assert.equal(heldAtLastWrite, 1, `${heldAtLastWrite} of ${steps} written batches still held at the last write`);
    const summary = JSON.parse(readFileSync(join(runDir, 'summary.json'), 'utf8')) as Record<string, unknown>;
    const groups = readFileSync(join(runDir, 'batches.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { rollouts: { reward: number }[] });
    const rewards = groups.flatMap((g) => g.rollouts.map((r) => r.reward));
    assert.deepEqual([summary.batches, summary.groups, summary.rollouts], [steps, steps, rewards.length]);
    const mean = rewards.reduce((n, r) => n + r, 0) / rewards.length;
    assert.ok(Math.abs((summary.meanReward as number) - mean) < 1e-9, `mean reward ${summary.meanReward}, not ${mean}`);
  });
});

/**
 * What a `rollout run` left in its run dir's `batches.jsonl`, and the promise every kill-and-resume
 * test checks on it: each train step whole and once, no group id twice.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

export interface WrittenGroup {
  trainStep: number;
  id: string;
  status: string;
}

/** Every group line of `runDir/batches.jsonl`, in the order written. */
export function readBatches(runDir: string): WrittenGroup[] {
  return readFileSync(join(runDir, 'batches.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((line) => JSON.parse(line) as WrittenGroup);
}

/** Steps 1..`steps` each with exactly `batch` groups, none missing, and no group id written twice. */
export function assertEveryStepOnce(groups: WrittenGroup[], steps: number, batch: number): void {
  const perStep = new Map<number, number>();
  for (const g of groups) perStep.set(g.trainStep, (perStep.get(g.trainStep) ?? 0) + 1);
  assert.deepEqual(
    [...perStep.keys()].sort((a, b) => a - b),
    Array.from({ length: steps }, (_, i) => i + 1),
    'every train step, none missing',
  );
  for (const [step, n] of perStep) assert.equal(n, batch, `step ${step} has ${n} groups`);
  assert.equal(new Set(groups.map((g) => g.id)).size, groups.length, 'no group delivered twice');
}

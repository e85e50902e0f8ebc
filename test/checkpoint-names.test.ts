import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { resolveConfig } from '../src/config.ts';
import { readCheckpoint, writeCheckpoint } from '../src/coordinator/checkpoint.ts';
import { decodeCheckpoint, encodeCheckpoint } from '../src/formats/checkpoint-file.ts';
import { producerSnapshot } from './support/snapshot.ts';

describe('checkpoint field names (coordinator/checkpoint.ts)', () => {
  const config = resolveConfig({
    llm: { url: 'http://127.0.0.1:9' },
    tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' } }],
  });

  it('reads a version 2 checkpoint, whose progress says nextConsumerStep, consumedSamples and targetSamples, under the names of today', () => {
    const snapshot = producerSnapshot(config, []);
    Object.assign(snapshot.progress, {
      nextTrainStep: 4,
      producerFutureStep: 5,
      consumedGroups: { guess: 24 },
      targetGroups: { guess: 40 },
    });
    const path = join(mkdtempSync(join(tmpdir(), 'ckpt-names-')), 'engine.ckpt');
    writeCheckpoint(path, config, snapshot);
    // Rewritten as version 2 wrote it: the same fields under their former names.
    const state = decodeCheckpoint(readFileSync(path), path) as Record<string, any>;
    const { nextTrainStep, consumedGroups, targetGroups, ...rest } = state.producer.progress;
    state.v = 2;
    state.producer.progress = {
      ...rest,
      nextConsumerStep: nextTrainStep,
      consumedSamples: consumedGroups,
      targetSamples: targetGroups,
    };
    writeFileSync(path, encodeCheckpoint(state as { v: number } & Record<string, unknown>));
    const read = readCheckpoint(path, config).progress;
    assert.deepEqual(
      [read.nextTrainStep, read.producerFutureStep, read.consumedGroups, read.targetGroups],
      [4, 5, { guess: 24 }, { guess: 40 }],
    );
    assert.ok(!('nextConsumerStep' in read) && !('consumedSamples' in read) && !('targetSamples' in read));
  });

  it('reads a last batch written before its stats counted the rollouts past the stale threshold as none past it', () => {
    const snapshot = producerSnapshot(config, []);
    const staleness = { min: 0, max: 1, mean: 0.5 }; // as written then: no pastThreshold
    snapshot.lastBatch = { trainStep: 3, status: 'NORMAL', groups: [], stats: { staleness } } as never;
    const path = join(mkdtempSync(join(tmpdir(), 'ckpt-names-')), 'engine.ckpt');
    writeCheckpoint(path, config, snapshot);
    assert.deepEqual(readCheckpoint(path, config).lastBatch?.stats.staleness, { ...staleness, pastThreshold: 0 });
  });

  it('refuses a checkpoint version it does not know, naming the ones it reads', () => {
    const path = join(mkdtempSync(join(tmpdir(), 'ckpt-names-')), 'engine.ckpt');
    writeCheckpoint(path, config, producerSnapshot(config, []));
    const state = decodeCheckpoint(readFileSync(path), path) as Record<string, any>;
    state.v = 9;
    writeFileSync(path, encodeCheckpoint(state as { v: number } & Record<string, unknown>));
    assert.throws(() => readCheckpoint(path, config), {
      code: 'ERR_CHECKPOINT',
      message: /checkpoint version 9 is not supported \(expected 1, 2 or 3\)/,
    });
  });
});

import assert from 'node:assert/strict';
import { existsSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { createEngine } from '../src/index.ts';

describe('engine.checkpoint', () => {
  it('engine.checkpoint(path) makes the directories the path names instead of throwing ENOENT (regression: the README trainer loop crashed at its first checkpoint)', async () => {
    const base = mkdtempSync(join(tmpdir(), 'rollout-ckpt-dir-'));
    const path = join(base, 'runs', 'my-run', 'engine.ckpt');
    // Embedded mock server and synthetic environments: no network beyond loopback.
    const engine = createEngine({ logLevel: 'silent', batchSize: 2, workers: { threads: 1 } });
    try {
      await engine.start();
      await engine.getBatch(1);
      const saved = await engine.checkpoint(path);
      assert.equal(saved.path, path);
      assert.ok(saved.bytes > 0);
      assert.ok(existsSync(path));
      const resumed = createEngine({ logLevel: 'silent', batchSize: 2, workers: { threads: 1 }, resumeFrom: path });
      try {
        await resumed.start();
        assert.equal(
          (await resumed.stats()).nextTrainStep,
          2,
          'the checkpoint written into the new directory is a whole one',
        );
      } finally {
        await resumed.close();
      }
    } finally {
      await engine.close();
    }
  });
});

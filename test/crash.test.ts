import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { assertEveryStepOnce, readBatches } from './support/batches.ts';

import { CLI_MAIN } from './support/cli.ts';

/** `rollout run` on one worker thread in this run dir (with this config file, if any), then `more`. */
const runArgs = (config: string | null, runDir: string, ...more: string[]): string[] => [
  '--import',
  'tsx',
  CLI_MAIN,
  'run',
  ...(config === null ? [] : ['--config', config]),
  '--run-dir',
  runDir,
  '--threads',
  '1',
  ...more,
];
const STEPS = 8;
const BATCH = 4;

/** One attempt of the run; SIGKILLed after `killAfterMs` unless it finishes first. */
function attempt(
  runDir: string,
  killAfterMs: number | null,
): Promise<{ code: number | null; signal: NodeJS.Signals | null; stderr: string }> {
  // A mock slow enough (30 ms a call, 500 tokens/s) that a run takes a few seconds: kills land mid-run.
  const config = join(runDir, '..', `${runDir.split('/').pop()}.json`);
  writeFileSync(
    config,
    JSON.stringify({
      mock: { latencyMs: 30, tokensPerSecond: 500, thinkTokens: 10 },
      producer: { partialRollout: true, maxStaleness: 1 },
    }),
  );
  return new Promise((resolve) => {
    const args = runArgs(
      config,
      runDir,
      '--steps',
      String(STEPS),
      '--batch-size',
      String(BATCH),
      '--strategy',
      'async',
      '--resume',
    );
    const child = spawn(process.execPath, args, {
      env: { ...process.env, LOG_LEVEL: 'warn', LOG_FORMAT: 'json' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (c) => (stderr += c));
    const timer = killAfterMs === null ? null : setTimeout(() => child.kill('SIGKILL'), killAfterMs);
    child.on('exit', (code, signal) => {
      if (timer) clearTimeout(timer);
      resolve({ code, signal, stderr });
    });
  });
}

/** A small deterministic PRNG, so a failing sequence of kill times can be replayed. */
function rng(seed: number) {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s ^ (s >>> 15), 0x2c1b3c6d) + 0x6d2b79f5) >>> 0;
    return s / 2 ** 32;
  };
}

describe('crash safety', () => {
  it('a run SIGKILLed at random points and resumed each time delivers every step once: no gaps, no duplicates', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-crash-'));
    const random = rng(Number(process.env.CRASH_SEED ?? 7));
    let kills = 0;
    for (let i = 0; i < 14; i++) {
      // Six kills at random moments (start-up, mid-batch, mid-checkpoint), then let it finish.
      const killAfter = kills < 6 ? 400 + Math.floor(random() * 2600) : null;
      const result = await attempt(runDir, killAfter);
      if (result.signal === 'SIGKILL') {
        kills++;
        continue;
      }
      assert.equal(result.code, 0, `attempt ${i} failed:\n${result.stderr}`);
      break;
    }
    assert.ok(kills >= 3, `only ${kills} attempts were killed before finishing`);
    const path = join(runDir, 'batches.jsonl');
    assert.ok(existsSync(path));
    const groups = readBatches(runDir);
    assertEveryStepOnce(groups, STEPS, BATCH);
    assert.ok(groups.every((g) => g.status === 'COMPLETED'));
  });

  it('SIGTERM stops a run cleanly: groups in flight come back, a checkpoint is written, exit code 0', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-term-'));
    const child = spawn(process.execPath, runArgs(null, runDir, '--steps', '1000', '--batch-size', '4'), {
      env: { ...process.env, LOG_LEVEL: 'warn', LOG_FORMAT: 'json' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (c) => (stderr += c));
    // Wait until it has written a batch, then ask it to stop.
    await new Promise<void>((resolve) => {
      const check = setInterval(() => {
        if (existsSync(join(runDir, 'engine.ckpt'))) {
          clearInterval(check);
          resolve();
        }
      }, 50);
    });
    child.kill('SIGTERM');
    const code = await new Promise<number | null>((resolve) => child.on('exit', (c) => resolve(c)));
    assert.equal(code, 0, stderr);
    assert.match(stderr, /stopped by a signal after \d+ batches; continue with --resume/);
    assert.ok(existsSync(join(runDir, 'summary.json')));
  });

  it('a run without per-batch checkpoints, stopped by SIGTERM, resumes from the checkpoint the stop wrote: every step once, no group twice (regression: it began again)', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-term-noeach-'));
    const config = join(runDir, '..', `${runDir.split('/').pop()}.json`);
    writeFileSync(config, JSON.stringify({ checkpointEachBatch: false }));
    const args = runArgs(config, runDir, '--batch-size', '4');
    const batches = join(runDir, 'batches.jsonl');
    const child = spawn(process.execPath, [...args, '--steps', '1000'], {
      env: { ...process.env, LOG_LEVEL: 'warn', LOG_FORMAT: 'json' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (c) => (stderr += c));
    // Wait until it has written a whole batch, then ask it to stop.
    await new Promise<void>((resolve) => {
      const check = setInterval(() => {
        if (existsSync(batches) && readFileSync(batches, 'utf8').split('\n').length > 4) {
          clearInterval(check);
          resolve();
        }
      }, 50);
    });
    child.kill('SIGTERM');
    assert.equal(await new Promise<number | null>((resolve) => child.on('exit', (c) => resolve(c))), 0, stderr);
    assert.ok(existsSync(join(runDir, 'engine.ckpt')), 'the stop wrote a checkpoint');
    const stoppedAt = Math.max(
      ...readFileSync(batches, 'utf8')
        .trim()
        .split('\n')
        .map((l) => (JSON.parse(l) as { trainStep: number }).trainStep),
    );
    const resumed = spawn(process.execPath, [...args, '--resume', '--steps', String(stoppedAt + 2)], {
      env: { ...process.env, LOG_LEVEL: 'warn' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let resumedErr = '';
    resumed.stderr.on('data', (c) => (resumedErr += c));
    assert.equal(await new Promise<number | null>((resolve) => resumed.on('exit', (c) => resolve(c))), 0, resumedErr);
    const groups = readFileSync(batches, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { trainStep: number; id: string });
    const steps = Array.from({ length: stoppedAt + 2 }, (_, i) => i + 1);
    assert.deepEqual([...new Set(groups.map((g) => g.trainStep))], steps);
    assert.ok(
      steps.every((step) => groups.filter((g) => g.trainStep === step).length === 4),
      'each step whole, once',
    );
    assert.equal(new Set(groups.map((g) => g.id)).size, groups.length, 'no group delivered twice');
  });
});

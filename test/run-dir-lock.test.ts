import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { lockRunDir, newRunDir } from '../src/cli/run-dir.ts';
import { CLI_MAIN, rollout } from './support/cli.ts';

const HOLDER = new URL('./fixtures/hold-run-dir-lock.ts', import.meta.url).pathname;

/** `rollout <args>` run in `cwd`, to its exit (killed after 60 s). */
function rolloutIn(cwd: string, args: string[]): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve, reject) => {
    // tsx by its resolved URL: the child's cwd is a temporary dir without node_modules.
    const child = spawn(process.execPath, ['--import', import.meta.resolve('tsx'), CLI_MAIN, ...args], {
      cwd,
      env: { ...process.env, LOG_LEVEL: 'warn' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (c) => (stderr += c));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`rollout ${args.join(' ')} did not finish in 60 s\n${stderr}`));
    }, 60_000);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stderr });
    });
  });
}

describe('run dir lock', () => {
  it("two `rollout run` started at once without --run-dir (a seed sweep) write two run dirs, each with its own seed's groups (regression: both wrote runs/<timestamp>)", async () => {
    const cwd = mkdtempSync(join(tmpdir(), 'rollout-sweep-'));
    const common = ['run', '--steps', '1', '--batch-size', '2', '--threads', '1'];
    const results = await Promise.all([
      rolloutIn(cwd, [...common, '--seed', '1']),
      rolloutIn(cwd, [...common, '--seed', '2']),
    ]);
    for (const r of results) assert.equal(r.code, 0, r.stderr);
    const dirs = readdirSync(join(cwd, 'runs'));
    assert.equal(dirs.length, 2, `two run dirs, got ${dirs.join(', ')}`);
    const ids = dirs.map((d) =>
      readFileSync(join(cwd, 'runs', d, 'batches.jsonl'), 'utf8')
        .trim()
        .split('\n')
        .map((l) => (JSON.parse(l) as { id: string }).id),
    );
    for (const own of ids) assert.equal(own.length, 2, 'one batch of two groups in each dir');
  });

  it('default run dir names made at once (the same second) never collide', () => {
    const parent = mkdtempSync(join(tmpdir(), 'rollout-names-'));
    const dirs = Array.from({ length: 200 }, () => newRunDir(parent, 'serve-'));
    assert.equal(new Set(dirs).size, dirs.length);
    assert.equal(readdirSync(parent).length, dirs.length, 'each made, none shared');
    for (const d of dirs) assert.match(d, /serve-\d{8}-\d{6}-[0-9a-f]{8}$/);
  });

  it('`rollout run --resume` on a run dir another process holds is refused with its pid, and the batches file is left alone (regression: two --resume wrote steps twice)', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-locked-'));
    const args = ['--steps', '1', '--batch-size', '2', '--threads', '1', '--run-dir', runDir];
    assert.equal((await rollout(['run', ...args])).code, 0);
    const before = readFileSync(join(runDir, 'batches.jsonl'), 'utf8');
    const lock = await lockRunDir(runDir); // the test process stands in for a run still stopping
    try {
      const second = await rollout(['run', '--resume', ...args]);
      assert.equal(second.code, 2, second.stderr);
      assert.match(
        second.stderr,
        new RegExp(
          `run dir ${runDir} is in use by another rollout process \\(pid ${process.pid}\\): wait for it to exit, or choose another --run-dir`,
        ),
      );
      const served = await rollout(['serve', '--port', '0', '--resume', '--run-dir', runDir]);
      assert.equal(served.code, 2, served.stderr);
      assert.match(served.stderr, /is in use by another rollout process/);
    } finally {
      await lock.release();
    }
    assert.equal(readFileSync(join(runDir, 'batches.jsonl'), 'utf8'), before);
    assert.equal((await rollout(['run', '--resume', ...args, '--steps', '2'])).code, 0, 'released, the run continues');
  });

  it('of two processes racing for one run dir exactly one gets it, and a second path to the same dir is the same lock', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-race-'));
    const link = `${runDir}-link`;
    symlinkSync(runDir, link);
    const results = await Promise.allSettled([lockRunDir(runDir), lockRunDir(link), lockRunDir(runDir)]);
    const held = results.filter((r) => r.status === 'fulfilled');
    assert.equal(held.length, 1, 'one holder');
    for (const r of results)
      if (r.status === 'rejected') assert.equal((r.reason as { code: string }).code, 'ERR_USAGE');
    await (held[0] as PromiseFulfilledResult<{ release(): Promise<void> }>).value.release();
  });

  it('a lock holder killed with SIGKILL leaves the run dir free at once, and nothing behind in it', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-killed-'));
    const child = spawn(process.execPath, ['--import', 'tsx', HOLDER, runDir], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const exited = new Promise((resolve) => child.on('exit', resolve));
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('the holder did not lock in 30 s')), 30_000);
        child.stdout.on('data', (c) => {
          if (String(c).includes('locked')) {
            clearTimeout(timer);
            resolve();
          }
        });
      });
      await assert.rejects(lockRunDir(runDir), { code: 'ERR_USAGE', message: new RegExp(`\\(pid ${child.pid}\\)`) });
    } finally {
      child.kill('SIGKILL');
      await exited;
    }
    const lock = await lockRunDir(runDir);
    await lock.release();
    if (process.platform === 'linux') assert.deepEqual(readdirSync(runDir), [], 'an abstract socket leaves no file');
  });
});

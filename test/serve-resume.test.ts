import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { CLI_MAIN, rollout } from './support/cli.ts';

interface Served {
  child: ChildProcess;
  url: string;
  stderr: () => string;
}

/** `rollout serve` on port 0, once it prints its listening line; killed if it is not up in 30 s. */
function serve(args: string[]): Promise<Served> {
  const child = spawn(process.execPath, ['--import', 'tsx', CLI_MAIN, 'serve', '--port', '0', ...args], {
    env: { ...process.env, LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stderr!.on('data', (c) => (stderr += c));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`rollout serve did not start in 30 s\n${stderr}`));
    }, 30_000);
    child.stdout!.on('data', (c) => {
      stdout += c;
      const m = /control API listening on (http:\/\/\S+)/.exec(stdout);
      if (m) {
        clearTimeout(timer);
        resolve({ child, url: m[1], stderr: () => stderr });
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`rollout serve exited with ${code} before listening\n${stderr}`));
    });
  });
}

/** SIGTERM, then the exit code (SIGKILL after 30 s). */
function stop(served: Served): Promise<number | null> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => served.child.kill('SIGKILL'), 30_000);
    served.child.once('exit', (code) => {
      clearTimeout(timer);
      resolve(code);
    });
    served.child.kill('SIGTERM');
  });
}

async function post(url: string, body: unknown): Promise<any> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  assert.equal(res.status, 200, await res.clone().text());
  return res.json();
}

describe('rollout serve restarts', () => {
  it("`rollout serve` restarted with its own command line refuses the run dir's checkpoint, and with --resume continues after it (regression: it began again at step 1 and handed out trained group ids)", async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-serve-resume-'));
    const args = ['--run-dir', runDir, '--batch-size', '2', '--threads', '1', '--strategy', 'sync'];
    const first = await serve(args);
    let stepOne: string[];
    try {
      const batch = await post(`${first.url}/batch`, { trainStep: 1 });
      assert.equal(batch.status, 'NORMAL');
      stepOne = batch.groups.map((g: { id: string }) => g.id);
    } finally {
      assert.equal(await stop(first), 0, first.stderr());
    }
    const checkpoint = join(runDir, 'engine.ckpt');
    const saved = readFileSync(checkpoint);

    const again = await rollout(['serve', '--port', '0', ...args]);
    assert.equal(again.code, 2, again.stderr);
    assert.match(again.stderr, /engine\.ckpt already holds a run's checkpoint: pass --resume/);
    assert.deepEqual(readFileSync(checkpoint), saved, 'the resume point is left as it was');

    const resumed = await serve([...args, '--resume']);
    try {
      const status = (await (await fetch(`${resumed.url}/status`)).json()) as { nextTrainStep: number };
      assert.equal(status.nextTrainStep, 2);
      const batch = await post(`${resumed.url}/batch`, {});
      assert.equal(batch.status, 'NORMAL');
      assert.equal(batch.trainStep, 2);
      const ids: string[] = batch.groups.map((g: { id: string }) => g.id);
      assert.deepEqual(
        ids.filter((id) => stepOne.includes(id)),
        [],
        'no group id of step 1 handed out again',
      );
    } finally {
      assert.equal(await stop(resumed), 0, resumed.stderr());
    }
  });

  it('`rollout serve --resume` on a run dir without a checkpoint starts the run (a supervisor may always pass it)', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-serve-fresh-'));
    const served = await serve([
      '--run-dir',
      runDir,
      '--batch-size',
      '2',
      '--threads',
      '1',
      '--strategy',
      'sync',
      '--resume',
    ]);
    try {
      const status = (await (await fetch(`${served.url}/status`)).json()) as { nextTrainStep: number };
      assert.equal(status.nextTrainStep, 1);
    } finally {
      assert.equal(await stop(served), 0, served.stderr());
    }
  });

  it('`rollout serve --resume` without --run-dir is refused with exit code 2', async () => {
    const { code, stderr } = await rollout(['serve', '--port', '0', '--resume']);
    assert.equal(code, 2);
    assert.match(stderr, /--resume needs --run-dir/);
  });
});

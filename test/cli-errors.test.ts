/**
 * What the CLI says and leaves behind when it fails or refuses (issue 17, items 9 and 10): one line
 * per error in the same shape for every command, and nothing written that a refused command should
 * not write. Through the real CLI (test/support/cli.ts).
 */
import { rollout } from './support/cli.ts';
import assert from 'node:assert/strict';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';

const FAULTY_ENV = new URL('./fixtures/faulty-env.ts', import.meta.url).pathname;

function mkRunDir(): string {
  return mkdtempSync(join(tmpdir(), 'rollout-cli-errors-'));
}

/** A TCP port on 127.0.0.1 held open by this process, so a command told to listen on it finds it in use. */
async function heldPort(): Promise<{ port: number; server: Server }> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { port: (server.address() as { port: number }).port, server };
}

describe('rollout CLI errors', () => {
  it('a port in use is the same one line from every command that listens, exit 2 (regression: a stack, a raw Node error, "internal")', async () => {
    const { port, server } = await heldPort();
    try {
      const commands: Record<string, string[]> = {
        'mock-llm': ['mock-llm', '--port', String(port)],
        'env-server': ['env-server', '--env', 'builtin:guess-number', '--port', String(port)],
        gateway: ['gateway', '--embedded-mock', '--port', String(port)],
        serve: ['serve', '--port', String(port), '--threads', '1', '--run-dir', mkRunDir()],
      };
      const results = await Promise.all(Object.entries(commands).map(async ([name, args]) => ({ name, ...(await rollout(args)) })));
      for (const { name, code, stderr } of results) {
        assert.equal(code, 2, `${name}: ${stderr}`);
        assert.equal(stderr, `rollout ${name}: cannot listen on 127.0.0.1:${port}: address in use (EADDRINUSE)\n`, name);
      }
    } finally {
      server.close();
    }
  });

  it('a failed run that wrote batches leaves them and a summary with the reason, and prints the error once', async () => {
    const dir = mkRunDir();
    const dataset = join(dir, 'prompts.jsonl');
    writeFileSync(dataset, ['ok', 'throw', 'throw', 'throw'].map((mode) => JSON.stringify({ mode })).join('\n'));
    const config = join(dir, 'config.json');
    writeFileSync(config, JSON.stringify({ batchSize: 1, producer: { maxFailedGroupsPerStep: 1 }, tasks: [{ name: 'f', env: { module: FAULTY_ENV }, dataset, groupSize: 1, maxSteps: 1 }] }));
    const runDir = join(dir, 'run');
    // LOG_LEVEL error: each failed rollout's warning names the reason too.
    const { code, stdout, stderr } = await rollout(['run', '--config', config, '--steps', '3', '--threads', '1', '--run-dir', runDir], { env: { LOG_LEVEL: 'error' } });
    assert.equal(code, 1, stderr);
    assert.equal(readFileSync(join(runDir, 'batches.jsonl'), 'utf8').trim().split('\n').length, 1);
    const summary = JSON.parse(readFileSync(join(runDir, 'summary.json'), 'utf8')) as { batches: number; error: string | null };
    assert.equal(summary.batches, 1);
    assert.match(summary.error ?? '', /step exploded/);
    assert.match(stdout, /^rollout run: 1 batches written to /);
    assert.equal(`${stdout}${stderr}`.match(/step exploded/g)?.length, 1, `${stdout}${stderr}`);
  });

  it('`rollout run --resume` refused for a checkpoint of another point in the run, or of another config, writes nothing: batches file, cut tail and summary as they were (regression: summary.json overwritten)', async () => {
    const runDir = mkRunDir();
    const args = ['--batch-size', '2', '--threads', '1', '--run-dir', runDir];
    assert.equal((await rollout(['run', '--steps', '1', ...args])).code, 0);
    const stale = readFileSync(join(runDir, 'engine.ckpt'));
    assert.equal((await rollout(['run', '--resume', '--steps', '3', ...args])).code, 0);
    writeFileSync(join(runDir, 'engine.ckpt'), stale);
    appendFileSync(join(runDir, 'batches.jsonl'), '{"trainStep": 4, "cut sh'); // what a crash mid-write leaves
    const before = { batches: readFileSync(join(runDir, 'batches.jsonl'), 'utf8'), summary: readFileSync(join(runDir, 'summary.json'), 'utf8') };
    const { code, stdout, stderr } = await rollout(['run', '--resume', '--steps', '4', ...args]);
    assert.equal(code, 2);
    assert.equal(stdout, '');
    assert.match(stderr, /^rollout run: --resume: .*batches\.jsonl ends at step 3 but .*engine\.ckpt handed out step 1: .*\n$/);
    assert.deepEqual({ batches: readFileSync(join(runDir, 'batches.jsonl'), 'utf8'), summary: readFileSync(join(runDir, 'summary.json'), 'utf8') }, before);
    // Refused by the checkpoint itself: another config's.
    const other = await rollout(['run', '--resume', '--steps', '4', '--seed', '7', ...args]);
    assert.equal(other.code, 1);
    assert.equal(other.stdout, '');
    assert.match(other.stderr, /^rollout run: ERR_CHECKPOINT_MISMATCH: .*engine\.ckpt was written by a run with a different config: - seed: checkpoint has 0, config has 7\n$/);
    assert.deepEqual({ batches: readFileSync(join(runDir, 'batches.jsonl'), 'utf8'), summary: readFileSync(join(runDir, 'summary.json'), 'utf8') }, before);
  });

  it('`rollout run --resume` on a run dir that does not exist is refused, and the dir is not made (regression: a fresh run started)', async () => {
    const runDir = join(mkRunDir(), 'no-such-run');
    const { code, stdout, stderr } = await rollout(['run', '--resume', '--run-dir', runDir]);
    assert.equal(code, 2);
    assert.equal(stdout, '');
    assert.equal(stderr, `rollout run: --resume: run dir ${runDir} does not exist; give the dir of the run to continue, or drop --resume to start one\n`);
    assert.equal(existsSync(runDir), false);
  });

  it('`rollout run --resume` summarises the whole run, the batches of the process that crashed too (regression: only its own)', async () => {
    const runDir = mkRunDir();
    const args = ['--batch-size', '2', '--threads', '1', '--run-dir', runDir];
    assert.equal((await rollout(['run', '--steps', '2', ...args])).code, 0);
    const path = join(runDir, 'batches.jsonl');
    writeFileSync(path, `${readFileSync(path, 'utf8').trim().split('\n').slice(0, 2).join('\n')}\n`); // a crash before step 2 was written out
    const { code, stdout, stderr } = await rollout(['run', '--resume', '--steps', '3', ...args]);
    assert.equal(code, 0, stderr);
    const groups = readFileSync(path, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { rollouts: { reward: number; turns: { responseIds: number[] }[] }[] });
    const rollouts = groups.flatMap((g) => g.rollouts);
    const summary = JSON.parse(readFileSync(join(runDir, 'summary.json'), 'utf8')) as Record<string, number>;
    assert.deepEqual(
      { batches: summary.batches, batchesThisProcess: summary.batchesThisProcess, groups: summary.groups, rollouts: summary.rollouts, turns: summary.turns, responseTokens: summary.responseTokens },
      {
        batches: 3,
        batchesThisProcess: 2,
        groups: 6,
        rollouts: rollouts.length,
        turns: rollouts.reduce((n, r) => n + r.turns.length, 0),
        responseTokens: rollouts.reduce((n, r) => n + r.turns.reduce((m, t) => m + t.responseIds.length, 0), 0),
      },
    );
    assert.ok(Math.abs(summary.meanReward - rollouts.reduce((n, r) => n + r.reward, 0) / rollouts.length) < 1e-9);
    assert.match(stdout, /^rollout run: 3 batches written to .* \(2 by this process\)\n/);
  });
});

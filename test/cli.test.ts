import { CLI_MAIN, rollout } from './support/cli.ts';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';

const MAIN = CLI_MAIN;
const HUGE_REWARD_ENV = new URL('./fixtures/huge-reward-env.ts', import.meta.url).pathname;

/** The train step of each line of a batches file. */
function stepsOf(lines: string[]): number[] {
  return lines.map((l) => (JSON.parse(l) as { trainStep: number }).trainStep);
}

/** A run dir whose config (two groups per batch) starts from the checkpoint of a finished two-step run. */
async function startingAfterTwoSteps(): Promise<{ runDir: string; config: string }> {
  const origin = mkdtempSync(join(tmpdir(), 'rollout-cli-origin-'));
  assert.equal(
    (await rollout(['run', '--steps', '2', '--batch-size', '2', '--threads', '1', '--run-dir', origin])).code,
    0,
  );
  const runDir = mkdtempSync(join(tmpdir(), 'rollout-cli-later-'));
  const config = join(runDir, 'config.json');
  writeFileSync(config, JSON.stringify({ batchSize: 2, resumeFrom: join(origin, 'engine.ckpt') }));
  return { runDir, config };
}

describe('rollout CLI', () => {
  it('`rollout run --compact` writes turns that name the later turn carrying their conversation', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-run-'));
    const { code, stderr } = await rollout([
      'run',
      '--steps',
      '1',
      '--batch-size',
      '4',
      '--threads',
      '1',
      '--run-dir',
      runDir,
      '--compact',
    ]);
    assert.equal(code, 0, stderr);
    const rollouts = readFileSync(join(runDir, 'batches.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .flatMap((l) => JSON.parse(l).rollouts);
    const named = rollouts.flatMap((r: any) =>
      r.turns.filter((t: any) => t.messagesPrefixOf).map((t: any) => [t, r.turns[t.messagesPrefixOf.turn]]),
    );
    assert.ok(named.length > 0, 'some turn names a later one');
    for (const [turn, carrier] of named) {
      assert.equal(turn.messages, null);
      assert.ok(
        Array.isArray(carrier.messages) && carrier.messages.length >= turn.messagesPrefixOf.length,
        'the named turn carries its messages whole',
      );
    }
  });

  it('`rollout run` summarises rewards of 1e308 with a finite mean reward, resumed too (regression: Infinity)', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-run-'));
    const config = join(runDir, 'config.json');
    writeFileSync(
      config,
      JSON.stringify({ tasks: [{ name: 'huge', env: { module: HUGE_REWARD_ENV }, groupSize: 2, maxSteps: 1 }] }),
    );
    const args = ['--config', config, '--batch-size', '2', '--threads', '1', '--run-dir', runDir];
    for (const run of [
      ['--steps', '2'],
      ['--resume', '--steps', '3'],
    ]) {
      const { code, stdout, stderr } = await rollout(['run', ...run, ...args]);
      assert.equal(code, 0, stderr);
      const summary = JSON.parse(readFileSync(join(runDir, 'summary.json'), 'utf8')) as Record<string, number>;
      assert.ok(Math.abs(summary.meanReward - 1e308) <= 1e308 * 1e-12, `mean reward ${summary.meanReward}`);
      assert.match(stdout, /mean reward (9\.9+\d*e\+307|1(\.0+\d*)?e\+308)\n/);
    }
  });

  it('`rollout run` on embedded defaults writes batches as JSONL and prints a summary', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-run-'));
    const { code, stdout, stderr } = await rollout(['run', '--steps', '2', '--batch-size', '4', '--run-dir', runDir]);
    assert.equal(code, 0, stderr);
    const lines = readFileSync(join(runDir, 'batches.jsonl'), 'utf8').trim().split('\n');
    assert.equal(lines.length, 8, 'two batches of four groups');
    const groups = lines.map((l) => JSON.parse(l));
    assert.deepEqual([...new Set(groups.map((g) => g.trainStep))], [1, 2]);
    assert.deepEqual([...new Set(groups.map((g) => g.taskName))].sort(), ['arithmetic', 'guess-number']);
    for (const g of groups) {
      assert.equal(g.status, 'COMPLETED');
      assert.equal(g.rollouts.length, 4);
      for (const r of g.rollouts) {
        assert.equal(typeof r.reward, 'number');
        const turn = r.turns[0];
        assert.ok(Array.isArray(turn.responseIds) && turn.responseIds.every(Number.isInteger));
        assert.equal(turn.logprobs.length, turn.responseIds.length);
        assert.equal(turn.modelSteps.length, turn.responseIds.length);
      }
    }
    assert.match(stdout, /2 batches written to/);
    assert.match(stdout, /rollouts\s+32, mean reward -?\d+\.\d{3}/);
    assert.match(stdout, /steps\/s/);
    const summary = JSON.parse(readFileSync(join(runDir, 'summary.json'), 'utf8'));
    assert.equal(summary.groups, 8);
  });

  it('`rollout run` with audit.fraction > 0 puts the audit in summary.json, and leaves it out otherwise', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-run-audit-'));
    const config = join(dir, 'config.json');
    writeFileSync(config, JSON.stringify({ audit: { fraction: 1 } }));
    const args = ['--steps', '1', '--batch-size', '2', '--threads', '1'];
    const audited = await rollout(['run', '--config', config, ...args, '--run-dir', join(dir, 'audited')]);
    assert.equal(audited.code, 0, audited.stderr);
    const summary = JSON.parse(readFileSync(join(dir, 'audited', 'summary.json'), 'utf8'));
    assert.equal(typeof summary.audit, 'object');
    assert.equal(typeof summary.audit.rollouts, 'number');
    const plain = await rollout(['run', ...args, '--run-dir', join(dir, 'plain')]);
    assert.equal(plain.code, 0, plain.stderr);
    assert.equal(JSON.parse(readFileSync(join(dir, 'plain', 'summary.json'), 'utf8')).audit, undefined);
  });

  it('`rollout run --config examples/config.json` runs the example config as it is shipped, on the built-in mock and synthetic environments', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-example-'));
    try {
      const config = new URL('../examples/config.json', import.meta.url).pathname;
      const { code, stdout, stderr } = await rollout(['run', '--config', config, '--run-dir', runDir]);
      assert.equal(code, 0, stderr);
      assert.match(stdout, /3 batches written to/);
      const groups = readFileSync(join(runDir, 'batches.jsonl'), 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l));
      assert.deepEqual([...new Set(groups.map((g) => g.trainStep))], [1, 2, 3]);
      assert.deepEqual([...new Set(groups.map((g) => g.taskName))].sort(), ['arithmetic', 'guess-number']);
      assert.ok(groups.every((g) => g.status === 'COMPLETED'));
    } finally {
      rmSync(runDir, { recursive: true, force: true });
    }
  });

  it('`rollout run --resume` after a crash cut a batch short writes that step again whole, the same batch (regression)', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-cli-resume-'));
    const args = ['--batch-size', '4', '--threads', '1', '--run-dir', runDir];
    const first = await rollout(['run', '--steps', '2', ...args]);
    assert.equal(first.code, 0, first.stderr);
    const path = join(runDir, 'batches.jsonl');
    const written = readFileSync(path, 'utf8').trim().split('\n');
    assert.equal(written.length, 8);
    // Step 2 cut after one of its four groups and in the middle of the next line.
    writeFileSync(path, `${written.slice(0, 5).join('\n')}\n${written[5].slice(0, 20)}`);
    const { code, stderr } = await rollout(['run', '--resume', '--steps', '3', ...args]);
    assert.equal(code, 0, stderr);
    const lines = readFileSync(path, 'utf8').trim().split('\n');
    assert.deepEqual(stepsOf(lines), [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
    assert.deepEqual(lines.slice(0, 8), written, 'step 2 is the batch handed out before the crash, delivered again');
  });

  it('`rollout run` refuses a run dir that already holds batches unless told --resume, and --resume without its checkpoint (regression: groups written twice)', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-cli-again-'));
    const args = ['--steps', '1', '--batch-size', '2', '--threads', '1', '--run-dir', runDir];
    assert.equal((await rollout(['run', ...args])).code, 0);
    const before = readFileSync(join(runDir, 'batches.jsonl'), 'utf8');
    const again = await rollout(['run', ...args]);
    assert.equal(again.code, 2);
    assert.match(again.stderr, /batches\.jsonl already holds batches: pass --resume/);
    rmSync(join(runDir, 'engine.ckpt'));
    const resumed = await rollout(['run', '--resume', ...args]);
    assert.equal(resumed.code, 2);
    assert.match(resumed.stderr, /--resume: .*engine\.ckpt is missing/);
    assert.equal(readFileSync(join(runDir, 'batches.jsonl'), 'utf8'), before, 'the batches file is left as it was');
  });

  it('`rollout run` from a checkpoint named in the config continues after its last step (regression: it began again at step 1)', async () => {
    const { runDir, config } = await startingAfterTwoSteps();
    const { code, stderr } = await rollout([
      'run',
      '--config',
      config,
      '--steps',
      '1',
      '--threads',
      '1',
      '--run-dir',
      runDir,
    ]);
    assert.equal(code, 0, stderr);
    assert.deepEqual(stepsOf(readFileSync(join(runDir, 'batches.jsonl'), 'utf8').trim().split('\n')), [3, 3]);
  });

  it("`rollout run --resume` of a run that began from a config's checkpoint continues from its own checkpoint, and the same command finishes it (regression: groups delivered twice)", async () => {
    const { runDir, config } = await startingAfterTwoSteps();
    const args = ['--config', config, '--steps', '2', '--threads', '1', '--run-dir', runDir];
    assert.equal((await rollout(['run', ...args])).code, 0);
    const path = join(runDir, 'batches.jsonl');
    const written = readFileSync(path, 'utf8').trim().split('\n');
    writeFileSync(path, `${written.slice(0, 2).join('\n')}\n`); // a crash before step 4 was written out
    const { code, stderr } = await rollout(['run', '--resume', ...args]);
    assert.equal(code, 0, stderr);
    assert.deepEqual(
      readFileSync(path, 'utf8').trim().split('\n'),
      written,
      'steps 3 and 4, step 4 the batch handed out before the crash',
    );
  });

  it('`rollout run --resume` refuses a checkpoint older than its batches file, leaving both as they were', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-cli-stale-'));
    const args = ['--batch-size', '2', '--threads', '1', '--run-dir', runDir];
    assert.equal((await rollout(['run', '--steps', '1', ...args])).code, 0);
    const stale = readFileSync(join(runDir, 'engine.ckpt'));
    assert.equal((await rollout(['run', '--resume', '--steps', '3', ...args])).code, 0);
    writeFileSync(join(runDir, 'engine.ckpt'), stale);
    const before = readFileSync(join(runDir, 'batches.jsonl'), 'utf8');
    const { code, stderr } = await rollout(['run', '--resume', '--steps', '4', ...args]);
    assert.equal(code, 2);
    assert.match(stderr, /--resume: .*batches\.jsonl ends at step 3 but .*engine\.ckpt handed out step 1/);
    assert.equal(readFileSync(join(runDir, 'batches.jsonl'), 'utf8'), before);
  });

  it('`rollout run --resume` names the line of a batches file that is not JSON, and leaves the file alone', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-cli-corrupt-'));
    const args = ['--steps', '1', '--batch-size', '2', '--threads', '1', '--run-dir', runDir];
    assert.equal((await rollout(['run', ...args])).code, 0);
    const path = join(runDir, 'batches.jsonl');
    const [one] = readFileSync(path, 'utf8').split('\n');
    writeFileSync(path, `${one}\ngarbage{\n`);
    const { code, stderr } = await rollout(['run', '--resume', ...args]);
    assert.equal(code, 2);
    assert.match(stderr, /batches\.jsonl line 2 is not JSON/);
    assert.equal(readFileSync(path, 'utf8'), `${one}\ngarbage{\n`);
  });

  it('`rollout run` that fails before its first batch prints its error once and leaves no empty batches.jsonl or zeroed summary.json (regression)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-fail-summary-'));
    const { code, stdout, stderr } = await rollout(['run', '--llm-url', 'http://127.0.0.1:9/v1', '--run-dir', dir], {
      timeoutMs: 20_000,
    });
    assert.equal(code, 1);
    assert.equal(stdout, '');
    assert.equal(stderr.match(/ERR_LLM_UNREACHABLE/g)?.length, 1, stderr);
    assert.deepEqual(readdirSync(dir), [], 'nothing written in the run dir');
  });

  it('`rollout run --config` rejects a bad config with the field, the value and exit code 1', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-cfg-'));
    const config = join(dir, 'bad.json');
    writeFileSync(
      config,
      JSON.stringify({ batchSize: 'eight', tasks: [{ name: 'x', env: { module: './missing.js' } }] }),
    );
    const { code, stderr } = await rollout(['run', '--config', config, '--run-dir', dir]);
    assert.equal(code, 1);
    assert.match(stderr, /ERR_INVALID_CONFIG/);
    assert.match(stderr, /batchSize: .*expected number.*\(got "eight"\)/);
    assert.match(stderr, /tasks\[0\]\.env\.module: module file does not exist/);
  });

  it('`rollout run --llm-url` to a dead server exits 1 with a clear message instead of hanging', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-dead-'));
    const { code, stderr } = await rollout(['run', '--llm-url', 'http://127.0.0.1:9/v1', '--run-dir', dir], {
      timeoutMs: 20_000,
    });
    assert.equal(code, 1);
    assert.match(stderr, /ERR_LLM_UNREACHABLE: .*127\.0\.0\.1:9.*ECONNREFUSED/);
  });

  it('`rollout mock-llm --port 0` serves the OpenAI API until it is told to stop', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', MAIN, 'mock-llm', '--port', '0', '--latency-ms', '1']);
    try {
      const url = await new Promise<string>((resolve, reject) => {
        let out = '';
        child.stdout.on('data', (c) => {
          out += c;
          const m = /listening on (http:\/\/\S+)/.exec(out);
          if (m) resolve(m[1]);
        });
        child.on('exit', (code) => reject(new Error(`mock-llm exited with ${code}`)));
      });
      const res = await fetch(`${url}/v1/models`);
      assert.equal(res.status, 200);
      const body = (await res.json()) as { data: { id: string }[] };
      assert.equal(body.data[0].id, 'mock-policy');
    } finally {
      const exited = new Promise((r) => child.on('exit', r));
      child.kill('SIGTERM');
      assert.equal(await exited, 0);
    }
  });

  it('prints help for the program and for each command, and exits 2 on an unknown flag', async () => {
    assert.match((await rollout(['--help'])).stdout, /Commands:\n\s+run/);
    assert.match((await rollout(['run', '--help'])).stdout, /--llm-url <url>/);
    assert.match((await rollout(['mock-llm', '--help'])).stdout, /--tokens-per-second/);
    const bad = await rollout(['run', '--stpes', '2']);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /Unknown option '--stpes'/);
  });
});

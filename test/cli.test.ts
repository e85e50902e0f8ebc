import { CLI_MAIN, rollout } from './support/cli.ts';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';

const MAIN = CLI_MAIN;


describe('rollout CLI', () => {
  it('`rollout run --compact` writes turns that name the later turn carrying their conversation', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-run-'));
    const { code, stderr } = await rollout(['run', '--steps', '1', '--batch-size', '4', '--threads', '1', '--run-dir', runDir, '--compact']);
    assert.equal(code, 0, stderr);
    const rollouts = readFileSync(join(runDir, 'batches.jsonl'), 'utf8').trim().split('\n').flatMap((l) => JSON.parse(l).rollouts);
    const named = rollouts.flatMap((r: any) => r.turns.filter((t: any) => t.messagesPrefixOf).map((t: any) => [t, r.turns[t.messagesPrefixOf.turn]]));
    assert.ok(named.length > 0, 'some turn names a later one');
    for (const [turn, carrier] of named) {
      assert.equal(turn.messages, null);
      assert.ok(Array.isArray(carrier.messages) && carrier.messages.length >= turn.messagesPrefixOf.length, 'the named turn carries its messages whole');
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

  it('`rollout run --resume` after a crash cut a batch short writes that step again whole (regression)', async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-cli-resume-'));
    const line = (step: number, i: number) => JSON.stringify({ trainStep: step, id: `earlier/${step}/${i}` });
    // Step 1 whole, step 2 cut after one of its four groups and in the middle of the next line.
    writeFileSync(join(runDir, 'batches.jsonl'), `${[1, 2, 3, 4].map((i) => line(1, i)).join('\n')}\n${line(2, 1)}\n{"trainStep":2,"id`);
    const { code, stderr } = await rollout(['run', '--resume', '--steps', '3', '--batch-size', '4', '--threads', '1', '--run-dir', runDir]);
    assert.equal(code, 0, stderr);
    const steps = readFileSync(join(runDir, 'batches.jsonl'), 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { trainStep: number }).trainStep);
    assert.deepEqual(steps, [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
  });

  it('`rollout run --config` rejects a bad config with the field, the value and exit code 1', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-cfg-'));
    const config = join(dir, 'bad.json');
    writeFileSync(config, JSON.stringify({ batchSize: 'eight', tasks: [{ name: 'x', env: { module: './missing.js' } }] }));
    const { code, stderr } = await rollout(['run', '--config', config, '--run-dir', dir]);
    assert.equal(code, 1);
    assert.match(stderr, /ERR_INVALID_CONFIG/);
    assert.match(stderr, /batchSize: .*expected number.*\(got "eight"\)/);
    assert.match(stderr, /tasks\[0\]\.env\.module: module file does not exist/);
  });

  it('`rollout run --llm-url` to a dead server exits 1 with a clear message instead of hanging', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-dead-'));
    const { code, stderr } = await rollout(['run', '--llm-url', 'http://127.0.0.1:9/v1', '--run-dir', dir], { timeoutMs: 20_000 });
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

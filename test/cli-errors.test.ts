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

/**
 * `rollout run --config <config> --threads 1 --run-dir <runDir>`, which must be refused: exit 1,
 * nothing on stdout. Returns what it said on stderr.
 */
async function refusedRun(config: string, runDir: string): Promise<string> {
  const { code, stdout, stderr } = await rollout(['run', '--config', config, '--threads', '1', '--run-dir', runDir]);
  assert.equal(code, 1, stderr);
  assert.equal(stdout, '');
  return stderr;
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
      const results = await Promise.all(
        Object.entries(commands).map(async ([name, args]) => ({ name, ...(await rollout(args)) })),
      );
      for (const { name, code, stderr } of results) {
        assert.equal(code, 2, `${name}: ${stderr}`);
        assert.equal(
          stderr,
          `rollout ${name}: cannot listen on 127.0.0.1:${port}: address in use (EADDRINUSE)\n`,
          name,
        );
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
    writeFileSync(
      config,
      JSON.stringify({
        batchSize: 1,
        producer: { maxFailedGroupsPerStep: 1 },
        tasks: [{ name: 'f', env: { module: FAULTY_ENV }, dataset, groupSize: 1, maxSteps: 1 }],
      }),
    );
    const runDir = join(dir, 'run');
    // LOG_LEVEL error: each failed rollout's warning names the reason too.
    const { code, stdout, stderr } = await rollout(
      ['run', '--config', config, '--steps', '3', '--threads', '1', '--run-dir', runDir],
      { env: { LOG_LEVEL: 'error' } },
    );
    assert.equal(code, 1, stderr);
    assert.equal(readFileSync(join(runDir, 'batches.jsonl'), 'utf8').trim().split('\n').length, 1);
    const summary = JSON.parse(readFileSync(join(runDir, 'summary.json'), 'utf8')) as {
      batches: number;
      error: string | null;
    };
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
    const before = {
      batches: readFileSync(join(runDir, 'batches.jsonl'), 'utf8'),
      summary: readFileSync(join(runDir, 'summary.json'), 'utf8'),
    };
    const { code, stdout, stderr } = await rollout(['run', '--resume', '--steps', '4', ...args]);
    assert.equal(code, 2);
    assert.equal(stdout, '');
    assert.match(
      stderr,
      /^rollout run: --resume: .*batches\.jsonl ends at step 3 but .*engine\.ckpt handed out step 1: .*\n$/,
    );
    assert.deepEqual(
      {
        batches: readFileSync(join(runDir, 'batches.jsonl'), 'utf8'),
        summary: readFileSync(join(runDir, 'summary.json'), 'utf8'),
      },
      before,
    );
    // Refused by the checkpoint itself: another config's.
    const other = await rollout(['run', '--resume', '--steps', '4', '--seed', '7', ...args]);
    assert.equal(other.code, 1);
    assert.equal(other.stdout, '');
    assert.match(
      other.stderr,
      /^rollout run: ERR_CHECKPOINT_MISMATCH: .*engine\.ckpt was written by a run with a different config: - seed: checkpoint has 0, config has 7\n$/,
    );
    assert.deepEqual(
      {
        batches: readFileSync(join(runDir, 'batches.jsonl'), 'utf8'),
        summary: readFileSync(join(runDir, 'summary.json'), 'utf8'),
      },
      before,
    );
  });

  it('`rollout run --resume` on a run dir that does not exist is refused, and the dir is not made (regression: a fresh run started)', async () => {
    const runDir = join(mkRunDir(), 'no-such-run');
    const { code, stdout, stderr } = await rollout(['run', '--resume', '--run-dir', runDir]);
    assert.equal(code, 2);
    assert.equal(stdout, '');
    assert.equal(
      stderr,
      `rollout run: --resume: run dir ${runDir} does not exist; give the dir of the run to continue, or drop --resume to start one\n`,
    );
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
    const groups = readFileSync(path, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { rollouts: { reward: number; turns: { responseIds: number[] }[] }[] });
    const rollouts = groups.flatMap((g) => g.rollouts);
    const summary = JSON.parse(readFileSync(join(runDir, 'summary.json'), 'utf8')) as Record<string, number>;
    assert.deepEqual(
      {
        batches: summary.batches,
        batchesThisProcess: summary.batchesThisProcess,
        groups: summary.groups,
        rollouts: summary.rollouts,
        turns: summary.turns,
        responseTokens: summary.responseTokens,
      },
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

  it('bad input in a config or a dataset line is one line naming the field or the line, and the run writes nothing', async () => {
    const dir = mkRunDir();
    const file = (name: string, text: string) => (writeFileSync(join(dir, name), text), join(dir, name));
    const deep = file('deep.jsonl', `${'{"a":'.repeat(3000)}1${'}'.repeat(3000)}\n`);
    const seeded = file('seeded.jsonl', '{"seed": 1e300}\n');
    const task = (dataset: string) => ({ tasks: [{ name: 'g', env: { module: 'builtin:guess-number' }, dataset }] });
    const cases: [unknown, RegExp][] = [
      [
        task(deep),
        /^rollout run: ERR_INVALID_CONFIG: task g dataset .*deep\.jsonl:1: nested deeper than 64 levels \(at a\.a\.a.*….*a\.a\); environment params are not that deep\n$/,
      ],
      [
        task(seeded),
        /^rollout run: ERR_INVALID_CONFIG: task g dataset .*seeded\.jsonl:1: seed must be an integer in \[0, 2147483647\] \(got 1e\+300\)\n$/,
      ],
      [
        task(dir),
        /^rollout run: ERR_INVALID_CONFIG: tasks\[0\]\.dataset: is not a file \(got ".*", resolved to .*\)\n$/,
      ],
      [
        { tasks: [{ name: 'g', env: { module: '/dev/zero' } }] },
        /^rollout run: ERR_INVALID_CONFIG: tasks\[0\]\.env\.module: is not a file \(got "\/dev\/zero", resolved to \/dev\/zero\)\n$/,
      ],
      [
        { seed: -1, llm: { retries: 1e9 } },
        /^rollout run: ERR_INVALID_CONFIG: seed: .*>=0 \(got -1\)\nrollout run: ERR_INVALID_CONFIG: llm\.retries: .*<=100 \(got 1000000000\)\n$/,
      ],
    ];
    for (const [i, [config, expected]] of cases.entries()) {
      const runDir = join(dir, `run-${i}`);
      const stderr = await refusedRun(file(`config-${i}.json`, JSON.stringify(config)), runDir);
      assert.match(stderr, expected);
      assert.equal(existsSync(runDir), false, 'the run dir it made is gone again');
    }
  });

  it("a misspelt field in a built-in environment's dataset line is refused at start naming the line and the field (regression: it trained on random tasks)", async () => {
    const dir = mkRunDir();
    writeFileSync(join(dir, 'guess.jsonl'), '{"target": 5}\n\n{"min": 1, "max": 10, "tagret": 5}\n');
    writeFileSync(join(dir, 'sums.jsonl'), '{"expression": "2 + 3"}\n{"expression": "2 + (3)"}\n');
    const tasks = {
      guess: { name: 'guess', env: { module: 'builtin:guess-number' }, dataset: 'guess.jsonl' },
      sums: { name: 'sums', env: { module: 'builtin:arithmetic' }, dataset: 'sums.jsonl', maxSteps: 1 },
    };
    const expected = {
      guess: `rollout run: ERR_INVALID_CONFIG: task guess dataset ${join(dir, 'guess.jsonl')}:3: guess-number: unknown reset params.tagret (known: min, max, target)\n`,
      sums: `rollout run: ERR_INVALID_CONFIG: task sums dataset ${join(dir, 'sums.jsonl')}:2: arithmetic: reset params.expression must look like "37 + 45 * 2 - 8" (got "2 + (3)")\n`,
    };
    for (const name of ['guess', 'sums'] as const) {
      const config = join(dir, `${name}.json`);
      writeFileSync(config, JSON.stringify({ tasks: [tasks[name]] }));
      const stderr = await refusedRun(config, join(dir, `run-${name}`));
      assert.equal(stderr, expected[name]);
    }
  });

  it('a broken environment module is refused at start with one line naming the task and the module: a syntax error, a missing export, a factory that throws (regression: found after 5 groups failed)', async () => {
    const dir = mkRunDir();
    const modules = {
      syntax: ['export default function () {\n  return { reset( { } ;\n}\n', /cannot be loaded \(SyntaxError: /],
      export: [
        'export const createEnv = () => ({});\n',
        /cannot be loaded \(env\.export: "default" of .*export\.js is not a function \(got undefined; function exports: createEnv\)\)/,
      ],
      throws: [
        'export default function () { throw new Error("no GPU here"); }\n',
        /: its factory throws on env\.params \{"level":3\} \(no GPU here\)/,
      ],
    } as const;
    for (const [name, [source, why]] of Object.entries(modules)) {
      const module = join(dir, `${name}.js`);
      writeFileSync(module, source);
      const config = join(dir, `${name}.json`);
      writeFileSync(
        config,
        JSON.stringify({
          tasks: [
            { name: 'fine', env: { module: 'builtin:arithmetic' } },
            { name: `broken-${name}`, env: { module: `./${name}.js`, params: { level: 3 } } },
          ],
        }),
      );
      const stderr = await refusedRun(config, join(dir, `run-${name}`));
      assert.equal(stderr.split('\n').length, 2, stderr);
      assert.ok(
        stderr.startsWith(`rollout run: ERR_INVALID_CONFIG: tasks[1] (broken-${name}): env module file://${module}`),
        stderr,
      );
      assert.match(stderr, why);
    }
  });
});

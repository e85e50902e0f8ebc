import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createEngine, ConfigError } from '../src/index.ts';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { resolveConfig } from '../src/config.ts';
import { Sampler } from '../src/buffer/sampler.ts';

function issuesOf(input: unknown): string[] {
  try {
    resolveConfig(input);
  } catch (err) {
    assert.ok(err instanceof ConfigError);
    assert.equal(err.code, 'ERR_INVALID_CONFIG');
    return err.issues;
  }
  assert.fail('expected a ConfigError');
}

describe('config validation', () => {
  it('refuses task weights whose sum overflows the batch split, naming the largest (regression: weight 1e308 spun for ever)', () => {
    const tasks = (w: number[]) =>
      w.map((weight, i) => ({ name: `t${i}`, env: { module: 'builtin:arithmetic' }, weight }));
    assert.deepEqual(issuesOf({ batchSize: 8, tasks: tasks([1, 1e308]) }), [
      "tasks[1].weight: batchSize (8) × the sum of the tasks' weights overflows a double; weights are ratios between tasks: use small numbers such as 1 and 3 (got 1e+308)",
    ]);
    assert.equal(issuesOf({ batchSize: 2, tasks: tasks([1e308, 1e308]) }).length, 1, 'two: the sum itself overflows');
    assert.doesNotThrow(() => resolveConfig({ batchSize: 8, tasks: tasks([1, 1e300]) }), 'large but finite is a split');
  });

  it('fills every default from an empty config: two synthetic tasks and the embedded mock server', () => {
    const config = resolveConfig({});
    assert.deepEqual(
      config.tasks.map((t) => t.name),
      ['guess-number', 'arithmetic'],
    );
    assert.equal(config.llm.url, null);
    assert.ok(config.workers.threads >= 1);
    assert.match(config.tasks[0].env!.moduleUrl!, /^file:.*guess-number\.(ts|js)$/);
  });

  it('names the field, the value and what was expected for each bad option', () => {
    const issues = issuesOf({
      batchSize: 0,
      tasks: [{ name: 'x', env: { module: 'builtin:arithmetic' }, groupSize: 'four' }],
      llm: { url: 'not a url' },
    });
    assert.ok(
      issues.some((i) => i.startsWith('batchSize:') && i.includes('(got 0)')),
      issues.join('\n'),
    );
    assert.ok(
      issues.some((i) => i.startsWith('tasks[0].groupSize:') && i.includes('expected number') && i.includes('"four"')),
      issues.join('\n'),
    );
    assert.ok(
      issues.some((i) => i.startsWith('llm.url:') && i.includes('"not a url"')),
      issues.join('\n'),
    );
  });

  it('refuses sizes no run can mean, naming the field (regression: threads 1e9 and overSampleThreshold 1e308 ran out of memory)', () => {
    const issues = issuesOf({
      workers: { threads: 1e9 },
      producer: { strategy: 'async', overSampleThreshold: 1e308 },
      batchSize: 1e7,
    });
    assert.ok(
      issues.some((i) => i.startsWith('workers.threads:') && i.includes('<=1024') && i.includes('(got 1000000000)')),
      issues.join('\n'),
    );
    assert.ok(
      issues.some((i) => i.startsWith('producer.overSampleThreshold:') && i.includes('<=100')),
      issues.join('\n'),
    );
    assert.ok(
      issues.some((i) => i.startsWith('batchSize:') && i.includes('<=1000000')),
      issues.join('\n'),
    );
  });

  it('refuses seeds and retries no run can mean, naming the field (regression: seed -1 or 1e300 and llm.retries 1e9 were accepted)', () => {
    const issues = issuesOf({ seed: -1, llm: { retries: 1e9 } });
    assert.ok(
      issues.some((i) => i.startsWith('seed:') && i.includes('(got -1)')),
      issues.join('\n'),
    );
    assert.ok(
      issues.some((i) => i.startsWith('llm.retries:') && i.includes('<=100')),
      issues.join('\n'),
    );
    assert.ok(issuesOf({ seed: 1e300 }).some((i) => i.startsWith('seed:')));
  });

  it('names a dataset that is a directory, or a line too deep or with a seed out of range (regression: EISDIR with a stack; 3000 levels overflowed the encoder)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-dataset-'));
    assert.ok(
      issuesOf({ tasks: [{ name: 't', env: { module: 'builtin:arithmetic' }, dataset: dir }] }).some((i) =>
        i.startsWith('tasks[0].dataset: is not a file'),
      ),
    );
    const deep = join(dir, 'deep.jsonl');
    writeFileSync(deep, `{"a": 1}\n${'{"x":'.repeat(3000)}1${'}'.repeat(3000)}\n`);
    const task = resolveConfig({ tasks: [{ name: 't', env: { module: 'builtin:arithmetic' }, dataset: deep }] })
      .tasks[0];
    await assert.rejects(Sampler.create(task, 0), {
      name: 'ConfigError',
      message: /dataset .*deep\.jsonl:2: nested deeper than 64 levels/,
    });
    const seeded = join(dir, 'seeded.jsonl');
    writeFileSync(seeded, '{"seed": 1e300}\n');
    const task2 = resolveConfig({ tasks: [{ name: 't', env: { module: 'builtin:arithmetic' }, dataset: seeded }] })
      .tasks[0];
    await assert.rejects(Sampler.create(task2, 0), {
      message: /seeded\.jsonl:1: seed must be an integer in \[0, 2147483647\]/,
    });
  });

  it('rejects unknown options, so a typo is not silently ignored', () => {
    const issues = issuesOf({ batchsize: 8 });
    assert.deepEqual(issues, ['(root): unknown option "batchsize"']);
  });

  it('rejects an environment module that does not exist, naming the task and the resolved path', () => {
    const issues = issuesOf({ tasks: [{ name: 'x', env: { module: './nowhere/env.js' } }] });
    assert.match(
      issues[0],
      /^tasks\[0\]\.env\.module: module file does not exist \(got "\.\/nowhere\/env\.js", resolved to .*nowhere\/env\.js\)$/,
    );
    const builtin = issuesOf({ tasks: [{ name: 'x', env: { module: 'builtin:chess' } }] });
    assert.match(
      builtin[0],
      /unknown built-in environment \(got "builtin:chess"; expected one of builtin:guess-number, builtin:arithmetic, builtin:tool-lookup, builtin:echo-digit\)/,
    );
  });

  it('rejects an environment or hooks module that is not a regular file, naming the field (regression: env.module /dev/zero hung the start)', () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-config-module-'));
    const env = { module: 'builtin:arithmetic' };
    const cases: [unknown, string][] = [
      [
        { name: 'x', env: { module: '/dev/zero' } },
        'tasks[0].env.module: is not a file (got "/dev/zero", resolved to /dev/zero)',
      ],
      [
        { name: 'x', env: { module: dir } },
        `tasks[0].env.module: is not a file (got ${JSON.stringify(dir)}, resolved to ${dir})`,
      ],
      [
        { name: 'x', env, hooks: { module: '/dev/zero' } },
        'tasks[0].hooks.module: is not a file (got "/dev/zero", resolved to /dev/zero)',
      ],
    ];
    for (const [task, issue] of cases) assert.deepEqual(issuesOf({ tasks: [task] }), [issue]);
  });

  it('rejects duplicate task names', () => {
    const env = { module: 'builtin:arithmetic' };
    const issues = issuesOf({
      tasks: [
        { name: 'a', env },
        { name: 'a', env },
      ],
    });
    assert.match(issues[0], /^tasks\[1\]\.name: duplicate task name "a"/);
  });

  it('throws from createEngine before anything starts', () => {
    assert.throws(() => createEngine({ workers: { threads: -1 } }), {
      code: 'ERR_INVALID_CONFIG',
      message: /workers\.threads: .*\(got -1\)/,
    });
  });
});

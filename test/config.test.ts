import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createEngine, ConfigError } from '../src/index.ts';
import { resolveConfig } from '../src/config.ts';

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
  it('fills every default from an empty config: two synthetic tasks and the embedded mock server', () => {
    const config = resolveConfig({});
    assert.deepEqual(config.tasks.map((t) => t.name), ['guess-number', 'arithmetic']);
    assert.equal(config.llm.url, null);
    assert.ok(config.workers.threads >= 1);
    assert.match(config.tasks[0].env!.moduleUrl!, /^file:.*guess-number\.(ts|js)$/);
  });

  it('names the field, the value and what was expected for each bad option', () => {
    const issues = issuesOf({ batchSize: 0, tasks: [{ name: 'x', env: { module: 'builtin:arithmetic' }, groupSize: 'four' }], llm: { url: 'not a url' } });
    assert.ok(issues.some((i) => i.startsWith('batchSize:') && i.includes('(got 0)')), issues.join('\n'));
    assert.ok(issues.some((i) => i.startsWith('tasks[0].groupSize:') && i.includes('expected number') && i.includes('"four"')), issues.join('\n'));
    assert.ok(issues.some((i) => i.startsWith('llm.url:') && i.includes('"not a url"')), issues.join('\n'));
  });

  it('refuses sizes no run can mean, naming the field (regression: threads 1e9 and overSampleThreshold 1e308 ran out of memory)', () => {
    const issues = issuesOf({ workers: { threads: 1e9 }, producer: { strategy: 'async', overSampleThreshold: 1e308 }, batchSize: 1e7 });
    assert.ok(issues.some((i) => i.startsWith('workers.threads:') && i.includes('<=1024') && i.includes('(got 1000000000)')), issues.join('\n'));
    assert.ok(issues.some((i) => i.startsWith('producer.overSampleThreshold:') && i.includes('<=100')), issues.join('\n'));
    assert.ok(issues.some((i) => i.startsWith('batchSize:') && i.includes('<=1000000')), issues.join('\n'));
  });

  it('rejects unknown options, so a typo is not silently ignored', () => {
    const issues = issuesOf({ batchsize: 8 });
    assert.deepEqual(issues, ['(root): unknown option "batchsize"']);
  });

  it('rejects an environment module that does not exist, naming the task and the resolved path', () => {
    const issues = issuesOf({ tasks: [{ name: 'x', env: { module: './nowhere/env.js' } }] });
    assert.match(issues[0], /^tasks\[0\]\.env\.module: module file does not exist \(got "\.\/nowhere\/env\.js", resolved to .*nowhere\/env\.js\)$/);
    const builtin = issuesOf({ tasks: [{ name: 'x', env: { module: 'builtin:chess' } }] });
    assert.match(builtin[0], /unknown built-in environment \(got "builtin:chess"; expected one of builtin:guess-number, builtin:arithmetic\)/);
  });

  it('rejects duplicate task names', () => {
    const env = { module: 'builtin:arithmetic' };
    const issues = issuesOf({ tasks: [{ name: 'a', env }, { name: 'a', env }] });
    assert.match(issues[0], /^tasks\[1\]\.name: duplicate task name "a"/);
  });

  it('throws from createEngine before anything starts', () => {
    assert.throws(() => createEngine({ workers: { threads: -1 } }), { code: 'ERR_INVALID_CONFIG', message: /workers\.threads: .*\(got -1\)/ });
  });
});

/**
 * What a user expects of any command-line tool (issue 32, item 3): a config file may carry comments,
 * `--version`, `help <command>`, "did you mean" for a mistyped flag or command, a distinct default
 * port per server, a LICENSE, and `engines` true to the dependencies. Through the real CLI
 * (test/support/cli.ts) where the CLI is what is promised.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { parseJsonWithComments } from '../src/cli/config-flags.ts';
import { rollout } from './support/cli.ts';

describe('config files with comments', () => {
  it('a config file may hold // and /* */ comments, and a // inside a string stays part of the string', () => {
    const text = `{
      // where the policy is served
      "llm": { "url": "http://127.0.0.1:8000/v1" /* vLLM */ },
      "batchSize": 8 // groups per step
    }`;
    assert.deepEqual(parseJsonWithComments(text), { llm: { url: 'http://127.0.0.1:8000/v1' }, batchSize: 8 });
  });

  it('`rollout run --config` reads a commented config file and checks its fields', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-jsonc-'));
    const config = join(dir, 'commented.json');
    writeFileSync(config, '{\n  // eight groups per step, written as a word by mistake\n  "batchSize": "eight"\n}\n');
    const { code, stderr } = await rollout(['run', '--config', config, '--run-dir', dir]);
    assert.equal(code, 1);
    assert.doesNotMatch(stderr, /not a valid JSON config/);
    assert.match(stderr, /ERR_INVALID_CONFIG: batchSize: .*\(got "eight"\)/);
  });

  it('a config file that is not JSON even without its comments is refused naming the file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-jsonc-'));
    const config = join(dir, 'broken.json');
    writeFileSync(config, '{ /* a comment */ "batchSize": 8,, }\n');
    const { code, stderr } = await rollout(['run', '--config', config, '--run-dir', dir]);
    assert.equal(code, 1);
    assert.match(stderr, /broken\.json: not a valid JSON config/);
  });
});

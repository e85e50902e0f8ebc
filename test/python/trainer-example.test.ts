/**
 * The Python trainer example (examples/python_trainer.py) against a real `rollout serve`: run by
 * `npm run test:python`, since it needs python3.
 */
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { request } from 'undici';
import { spawnServer, type ChildServer } from '../fixtures/flaky-env-server.ts';
import { runToExit } from '../support/cli.ts';

const MAIN = new URL('../../src/cli/main.ts', import.meta.url).pathname;
const PYTHON_TRAINER = new URL('../../examples/python_trainer.py', import.meta.url).pathname;

describe('the Python trainer example', () => {
  let serve: ChildServer;
  before(async () => {
    const runDir = mkdtempSync(join(tmpdir(), 'rollout-serve-'));
    serve = await spawnServer(
      process.execPath,
      [
        '--import',
        'tsx',
        MAIN,
        'serve',
        '--port',
        '0',
        '--strategy',
        'async',
        '--batch-size',
        '4',
        '--threads',
        '1',
        '--run-dir',
        runDir,
      ],
      /control API listening on (http:\/\/\S+)/,
    );
  });
  after(async () => {
    const exit = await serve.stop();
    assert.equal(exit.code, 0, 'rollout serve exits 0 on SIGTERM');
  });

  it('takes batches, pauses, loads weights into the mock server, resumes, and prints what it got', async () => {
    const out = await runToExit('python3', [PYTHON_TRAINER, '--url', serve.url, '--steps', '4', '--sync-every', '2']);
    assert.equal(out.code, 0, out.stderr);
    assert.match(out.stdout, /step 1: 4 groups, 16 rollouts, mean reward -?\d\.\d{3}, max staleness 0/);
    assert.match(out.stdout, /weights -> 2: pause took \d+\.\d ms/);
    assert.match(out.stdout, /done: taken 16 groups, model step 4/);
  });

  it("takes compact batches and expands them to the full ones (the example's expand_compact)", async () => {
    const out = await runToExit('python3', [
      PYTHON_TRAINER,
      '--url',
      serve.url,
      '--steps',
      '2',
      '--sync-every',
      '100',
      '--compact',
    ]);
    assert.equal(out.code, 0, out.stderr);
    const lines = [...out.stdout.matchAll(/step (\d+): .*, (\d+) prompt tokens, (\d+) messages/g)];
    assert.equal(lines.length, 2, out.stdout);
    // The last batch is handed out again for its train step: here in full, to count what the example counted.
    const [, step, tokens, messages] = lines[1];
    const res = await request(`${serve.url}/batch`, {
      method: 'POST',
      body: JSON.stringify({ trainStep: Number(step) }),
      headers: { 'content-type': 'application/json' },
    });
    const full = (await res.body.json()) as {
      groups: { rollouts: { turns: { promptIds: number[] | null; messages: unknown[] }[] }[] }[];
    };
    const turns = full.groups.flatMap((g) => g.rollouts.flatMap((r) => r.turns));
    assert.deepEqual(
      [Number(tokens), Number(messages)],
      [turns.reduce((n, t) => n + (t.promptIds?.length ?? 0), 0), turns.reduce((n, t) => n + t.messages.length, 0)],
    );
  });
});

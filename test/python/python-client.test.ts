/**
 * The Python package (python/, `rollout_engine`) as a user gets it: installed with pip into a fresh
 * venv (made under the OS temp dir with --system-site-packages, for Debian's numpy / msgpack / torch:
 * no package index is reached), its unittest suite run from a copy beside it — so the installed
 * package is what the tests import, not the source tree — against `rollout serve` launched from this
 * clone, then examples/grpo_train.py for a few steps. Run by `npm run test:python`; under CI=true a
 * missing torch or msgpack fails instead of skipping.
 */
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { runToExit, type CliResult } from '../support/cli.ts';

const REPO = new URL('../../', import.meta.url).pathname;
const CI = process.env.CI === 'true';
const MIN = 60_000;

/** The first python that imports what the package needs (the pyenv `python3` on PATH may not). */
async function pythonWith(modules: string[]): Promise<string | null> {
  for (const python of [
    ...new Set([process.env.PYTHON, '/usr/bin/python3', 'python3'].filter((c): c is string => !!c)),
  ]) {
    const out = await runToExit(python, ['-c', `import ${modules.join(', ')}, venv`], { timeoutMs: MIN }).catch(
      () => null,
    );
    if (out?.code === 0) return python;
  }
  return null;
}

function show(out: CliResult): string {
  return `exit ${out.code}\n--- stdout ---\n${out.stdout}\n--- stderr ---\n${out.stderr}`;
}

describe('the Python package rollout_engine, installed with pip', { timeout: 10 * MIN }, () => {
  let dir: string;
  let venvPython: string | null = null;
  let torch = false;
  const env = { NODE: process.execPath, ROLLOUT_REPO: REPO, PIP_NO_INDEX: '1', PIP_DISABLE_PIP_VERSION_CHECK: '1' };

  before(
    async () => {
      const python = await pythonWith(['numpy', 'msgpack']);
      if (python === null) {
        if (CI) assert.fail('no python3 with numpy and msgpack (Debian: python3-numpy python3-msgpack python3-venv)');
        return;
      }
      dir = mkdtempSync(join(tmpdir(), 'rollout-python-'));
      // The package from a copy: pip builds in the source tree, and the clone stays as it was.
      cpSync(join(REPO, 'python'), join(dir, 'src'), {
        recursive: true,
        filter: (p) => !/(__pycache__|\.egg-info|[/\\]build)$/.test(p),
      });
      const venv = join(dir, 'venv');
      const made = await runToExit(python, ['-m', 'venv', '--system-site-packages', venv], { timeoutMs: 2 * MIN });
      assert.equal(made.code, 0, show(made));
      venvPython = join(venv, 'bin', 'python');
      const installed = await runToExit(
        venvPython,
        ['-m', 'pip', 'install', '--no-deps', '--no-build-isolation', join(dir, 'src')],
        { timeoutMs: 3 * MIN, env },
      );
      assert.equal(installed.code, 0, show(installed));
      torch = (await runToExit(venvPython, ['-c', 'import torch'], { timeoutMs: MIN })).code === 0;
    },
    { timeout: 6 * MIN },
  );
  after(() => {
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  it('imports from the venv it was installed in, with its type marker', async (t) => {
    if (venvPython === null) return t.skip('no python3 with numpy and msgpack');
    const out = await runToExit(
      venvPython,
      [
        '-c',
        'import rollout_engine, os; print(os.path.dirname(rollout_engine.__file__)); print(os.path.exists(os.path.join(os.path.dirname(rollout_engine.__file__), "py.typed")))',
      ],
      { timeoutMs: MIN },
    );
    assert.equal(out.code, 0, show(out));
    const [where, typed] = out.stdout.trim().split('\n');
    assert.ok(where.startsWith(join(dir, 'venv')), `imported from ${where}`);
    assert.equal(typed, 'True');
  });

  it('passes its unittest suite against a real rollout serve', { timeout: 9 * MIN }, async (t) => {
    if (venvPython === null) return t.skip('no python3 with numpy and msgpack');
    const run = join(dir, 'run');
    cpSync(join(REPO, 'python', 'tests'), join(run, 'tests'), {
      recursive: true,
      filter: (p) => !p.endsWith('__pycache__'),
    });
    const out = await runToExit(venvPython, ['-m', 'unittest', 'discover', '-v', '-s', join(run, 'tests'), '-t', run], {
      timeoutMs: 8 * MIN,
      env,
    });
    assert.equal(out.code, 0, show(out));
    const ran = /Ran (\d+) tests?/.exec(out.stderr);
    assert.ok(ran !== null && Number(ran[1]) >= 15, show(out));
    if (CI) assert.doesNotMatch(out.stderr, /skipped/, 'nothing is skipped under CI=true');
  });

  it('trains the GRPO example for a few steps, printing loss and reward per step and syncing weights', {
    timeout: 4 * MIN,
  }, async (t) => {
    if (venvPython === null) return t.skip('no python3 with numpy and msgpack');
    if (!torch) {
      if (CI) assert.fail('torch is missing (Debian: python3-torch)');
      return t.skip('torch is not installed');
    }
    const out = await runToExit(
      venvPython,
      [join(REPO, 'examples', 'grpo_train.py'), '--steps', '4', '--sync-every', '2'],
      { timeoutMs: 3 * MIN, env },
    );
    assert.equal(out.code, 0, show(out));
    const steps = [
      ...out.stdout.matchAll(
        /^step (\d+): loss [+-]\d+\.\d{4} {2}reward -?\d+\.\d{3} {2}\(\d+ samples, \d+ action tokens/gm,
      ),
    ].map((m) => Number(m[1]));
    assert.deepEqual(steps, [1, 2, 3, 4], out.stdout);
    assert.match(out.stdout, /weights -> step 2: the mock serves weight version 2 /);
    assert.match(out.stdout, /weights -> step 4: the mock serves weight version 4 /);
    assert.match(out.stdout, /done: 4 steps in [\d.]+ s, 16 groups taken, model step 4/);
  });

  it('checks its type hints with mypy --strict where mypy is installed', { timeout: 6 * MIN }, async (t) => {
    if (venvPython === null) return t.skip('no python3 with numpy and msgpack');
    if ((await runToExit(venvPython, ['-c', 'import mypy'], { timeoutMs: MIN })).code !== 0) {
      if (CI) assert.fail('mypy is missing (Debian: python3-mypy)');
      return t.skip('mypy is not installed (Debian: python3-mypy)');
    }
    const out = await runToExit(
      venvPython,
      [
        '-m',
        'mypy',
        '--strict',
        // The package's own settings (msgpack ships no type information): mypy reads only the cwd's otherwise.
        '--config-file',
        join(REPO, 'python', 'pyproject.toml'),
        join(REPO, 'python', 'rollout_engine'),
      ],
      {
        timeoutMs: 5 * MIN,
      },
    );
    assert.equal(out.code, 0, show(out));
  });
});

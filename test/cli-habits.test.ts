/**
 * What a user expects of any command-line tool (issue 32, item 3): a config file may carry comments,
 * `--version`, `help <command>`, "did you mean" for a mistyped flag or command, a distinct default
 * port per server, a LICENSE, and `engines` true to the dependencies. Through the real CLI
 * (test/support/cli.ts) where the CLI is what is promised.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { DEFAULT_PORTS } from '../src/cli/args.ts';
import { parseJsonWithComments } from '../src/cli/config-flags.ts';
import { closest } from '../src/cli/suggest.ts';
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

const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as {
  version: string;
  license: string;
  engines: { node: string };
};

describe('CLI habits', () => {
  it('`rollout --version` prints the package version and exits 0', async () => {
    for (const flag of ['--version', '-V']) {
      const { code, stdout } = await rollout([flag]);
      assert.equal(code, 0);
      assert.equal(stdout, `rollout-engine ${pkg.version}\n`);
    }
  });

  it("`rollout help <command>` prints that command's help, not the program's", async () => {
    const help = await rollout(['help', 'run']);
    assert.equal(help.code, 0);
    assert.equal(help.stdout, (await rollout(['run', '--help'])).stdout);
    assert.match(help.stdout, /^Usage: rollout run /);
    assert.match((await rollout(['help', 'gateway'])).stdout, /^Usage: rollout gateway /);
    assert.match((await rollout(['help'])).stdout, /Commands:\n\s+run/);
  });

  it('an unknown command exits 2 and names the command it was probably meant to be', async () => {
    const typo = await rollout(['serv']);
    assert.equal(typo.code, 2);
    assert.match(typo.stderr, /^rollout: unknown command "serv" \(did you mean serve\?\)/);
    assert.match((await rollout(['help', 'gatway'])).stderr, /unknown command "gatway" \(did you mean gateway\?\)/);
    const far = await rollout(['frobnicate']);
    assert.equal(far.code, 2);
    assert.doesNotMatch(far.stderr, /did you mean/);
  });

  it("an unknown flag exits 2 and names the command's flag it was probably meant to be", async () => {
    const typo = await rollout(['run', '--bach-size', '4']);
    assert.equal(typo.code, 2);
    assert.equal(
      typo.stderr,
      "rollout run: Unknown option '--bach-size' (did you mean --batch-size?); see rollout help run\n",
    );
    assert.match((await rollout(['mock-llm', '--latency=3'])).stderr, /did you mean --latency-ms\?/);
    assert.doesNotMatch((await rollout(['serve', '--zzz'])).stderr, /did you mean/);
  });

  it('suggestions are only offered for near misses', () => {
    const commands = ['run', 'serve', 'node', 'mock-llm', 'env-server', 'gateway', 'loadtest', 'help'];
    assert.equal(closest('rnu', commands), 'run');
    assert.equal(closest('mock', commands), 'mock-llm');
    assert.equal(closest('train', commands), null);
    assert.equal(closest('--stpes', ['--steps', '--seed']), '--steps');
  });

  it('each server command has its own default port, and its help says which', async () => {
    const ports = Object.values(DEFAULT_PORTS);
    assert.equal(new Set(ports).size, ports.length, JSON.stringify(DEFAULT_PORTS));
    for (const [command, port] of Object.entries(DEFAULT_PORTS)) {
      const { stdout } = await rollout(['help', command]);
      assert.match(stdout, new RegExp(`--port <n> .*\\(default ${port}; 0 = any free port\\)`), command);
    }
  });

  it('the repository has the LICENSE file package.json names', () => {
    assert.equal(pkg.license, 'Apache-2.0');
    const license = readFileSync(new URL('../LICENSE', import.meta.url), 'utf8');
    assert.match(license, /^\s*Apache License\s+Version 2\.0, January 2004/);
  });

  it("package.json's engines admits no Node version a runtime dependency refuses, except @nats-io/nuid, whose code runs on it", () => {
    const lock = JSON.parse(readFileSync(new URL('../package-lock.json', import.meta.url), 'utf8')) as {
      packages: Record<string, { dev?: boolean; engines?: { node?: string } | string[] }>;
    };
    const floor = /^>=(\d+)\.(\d+)$/.exec(pkg.engines.node);
    assert.ok(floor, `engines.node is a plain floor (got ${pkg.engines.node})`);
    const lowest = [Number(floor[1]), Number(floor[2])] as const;
    // Declares node >= 22.x, but needs only globalThis.crypto.getRandomValues (Node >= 19); npm warns
    // EBADENGINE on Node 20 and installs it (docs/CLI.md "Node versions").
    const EXCEPTIONS = new Set(['node_modules/@nats-io/nuid']);
    const refusing: string[] = [];
    for (const [path, entry] of Object.entries(lock.packages)) {
      const range = Array.isArray(entry.engines) ? undefined : entry.engines?.node;
      if (path === '' || entry.dev || range === undefined || EXCEPTIONS.has(path)) continue;
      if (!admits(range, lowest)) refusing.push(`${path} (${range})`);
    }
    assert.deepEqual(refusing, []);
    const nuid = lock.packages['node_modules/@nats-io/nuid'].engines as { node: string };
    assert.equal(admits(nuid.node, lowest), false, 'nuid admits the floor now: drop the exception');
  });
});

/** Whether an engines range admits Node major.minor (the forms the lockfile holds: >=, ^, *, ||). */
function admits(range: string, [major, minor]: readonly [number, number]): boolean {
  return range.split('||').some((alternative) => {
    const text = alternative.trim();
    if (text === '*') return true;
    const m = /^(>=|\^)\s*(\d+)(?:\.(\d+|x))?(?:\.(\d+|x))?$/.exec(text);
    if (m === null) throw new Error(`engines range not understood: ${range}`);
    const [want, wantMinor] = [Number(m[2]), m[3] === undefined || m[3] === 'x' ? 0 : Number(m[3])];
    if (m[1] === '^') return major === want && minor >= wantMinor;
    return major > want || (major === want && minor >= wantMinor);
  });
}

/**
 * The NATS client (worker nodes) and the MCP SDK (MCP tools) are optional dependencies
 * (src/optional-packages.ts): loaded when their feature is used, never by a default run, and a
 * missing one fails its feature with one line naming the feature, the package and the install
 * command.
 *
 * What a process loads is read with a resolve hook (test/support/record-packages.mjs) that writes
 * down every package specifier. On Node 20 the hook does not see what worker threads import, so the
 * worker side is held by the import graph instead: nothing a thread's entry reaches through static
 * imports imports an optional package statically.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { createClusterPool, loadRolloutNode } from '../src/cluster/index.ts';
import { McpConnection } from '../src/env/mcp.ts';
import { loadOptional, OPTIONAL_PACKAGES, OptionalPackageError, requireInstalled } from '../src/optional-packages.ts';
import { importGraph } from './support/layering.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const RECORDER = join(ROOT, 'test', 'support', 'record-packages.mjs');
/** A run of a few seconds; generous, as the machine may be busy with other suites. */
const CHILD_TIMEOUT_MS = 120_000;
const OPTIONAL = Object.values(OPTIONAL_PACKAGES).flatMap((f) => [...f.packages]);
const isOptional = (specifier: string) => OPTIONAL.some((p) => specifier === p || specifier.startsWith(`${p}/`));
/** A package that is installed nowhere: what an import of a missing optional dependency meets. */
const NOT_INSTALLED = '@rollout-engine-test/not-installed';

const scratch = mkdtempSync(join(tmpdir(), 'optional-packages-'));
after(() => rmSync(scratch, { recursive: true, force: true }));

/** Runs `node --import tsx --import record-packages.mjs …args` and returns the packages it resolved. */
async function packagesLoaded(name: string, args: string[]): Promise<string[]> {
  const record = join(scratch, `${name}.txt`);
  await new Promise<void>((resolve, reject) => {
    execFile(
      process.execPath,
      ['--import', 'tsx', '--import', RECORDER, ...args],
      {
        cwd: ROOT,
        timeout: CHILD_TIMEOUT_MS,
        env: { ...process.env, LOG_LEVEL: 'silent', RECORD_PACKAGES: record },
      },
      (err, _out, errOut) => (err ? reject(new Error(`${err.message}\n${errOut}`)) : resolve()),
    );
  });
  return readFileSync(record, 'utf8').split('\n').filter(Boolean);
}

describe('optional packages', () => {
  it('`rollout run` with the defaults loads neither the NATS client nor the MCP SDK', {
    timeout: CHILD_TIMEOUT_MS + 10_000,
  }, async () => {
    const loaded = await packagesLoaded('run', [
      'src/cli/main.ts',
      'run',
      '--steps',
      '1',
      '--batch-size',
      '2',
      '--run-dir',
      join(scratch, 'run'),
    ]);
    assert.ok(loaded.includes('piscina'), `the recorder saw the run's packages: ${loaded.join(', ')}`);
    assert.deepEqual(loaded.filter(isOptional), []);
  });

  it('each is loaded where its feature is used (the recorder sees them when they are)', {
    timeout: CHILD_TIMEOUT_MS + 10_000,
  }, async () => {
    const script = `
      import { appendFileSync } from 'node:fs';
      const { loadRolloutNode } = await import('./src/cluster/index.ts');
      const { importMcpSdk, McpServers } = await import('./src/env/mcp.ts');
      new McpServers([{ command: 'true', args: [] }]);
      appendFileSync(process.env.RECORD_PACKAGES, '-- used\\n');
      await loadRolloutNode();
      await importMcpSdk();
    `;
    const loaded = await packagesLoaded('use', ['--input-type=module', '-e', script]);
    const used = loaded.indexOf('-- used');
    assert.ok(used >= 0);
    assert.deepEqual(loaded.slice(0, used).filter(isOptional), [], 'importing the modules loads neither');
    const after = new Set(loaded.slice(used + 1).filter(isOptional));
    for (const pkg of ['@nats-io/transport-node', '@nats-io/jetstream', '@nats-io/kv', '@modelcontextprotocol/sdk'])
      assert.ok(
        [...after].some((s) => s === pkg || s.startsWith(`${pkg}/`)),
        `${pkg} loaded on use`,
      );
  });

  it('no module a thread starts from reaches an optional package through static imports', () => {
    const edges = importGraph(ROOT);
    const entries = ['src/cli/main.ts', 'src/index.ts', 'workers/episode-worker.ts'];
    const reached = new Set(entries);
    for (let grew = true; grew; ) {
      grew = false;
      for (const e of edges)
        if (e.kind === 'static' && !e.typeOnly && reached.has(e.from) && !reached.has(e.to)) {
          reached.add(e.to);
          grew = true;
        }
    }
    assert.ok(
      reached.has('src/worker/worker-runtime.ts') && reached.has('src/env/mcp.ts'),
      'the walk reaches the workers',
    );
    // `import type` is erased; any other static import of a package loads it with the module.
    const STATIC_PACKAGE =
      /^(?:import(?!\s+type\b)\s[^;'"]*?\sfrom\s*|import\s*|export\s[^;'"]*?\sfrom\s*)['"]([^'"./][^'"]*)['"]/gm;
    const offenders: string[] = [];
    for (const file of [...reached].sort())
      for (const m of readFileSync(join(ROOT, file), 'utf8').matchAll(STATIC_PACKAGE))
        if (isOptional(m[1])) offenders.push(`${file} imports ${m[1]}`);
    assert.deepEqual(offenders, [], 'import these on use, through loadOptional (src/optional-packages.ts)');
  });

  it('a missing NATS client fails worker nodes with one line: the feature, the packages, the install command', async () => {
    const missing = () => import(NOT_INSTALLED);
    for (const attempt of [
      () => loadRolloutNode(missing as never),
      () => createClusterPool({} as never, missing as never),
    ]) {
      const err = await attempt().then(
        () => assert.fail('loaded a package that is not installed'),
        (e: unknown) => e,
      );
      assert.ok(err instanceof OptionalPackageError);
      assert.equal(err.code, 'ERR_OPTIONAL_PACKAGE');
      assert.equal(err.feature, 'nats');
      assert.equal(err.missing, NOT_INSTALLED);
      assert.doesNotMatch(err.message, /\n/);
      assert.match(err.message, /^worker nodes \(workers\.nats, rollout node\) need @nats-io\/transport-node/);
      assert.match(err.message, /run `npm install @nats-io\/transport-node @nats-io\/jetstream @nats-io\/kv`$/);
    }
  });

  it('a missing MCP SDK fails the MCP server with one line, and not the process', async () => {
    const connection = new McpConnection({ command: 'true', args: [] }, () => import(NOT_INSTALLED) as never);
    await assert.rejects(connection.tools(), (err: Error & { code?: string }) => {
      assert.equal(err.code, 'ERR_OPTIONAL_PACKAGE');
      assert.doesNotMatch(err.message, /\n/);
      assert.match(err.message, /^MCP tools \(tasks\[\]\.tools\.mcp\) need @modelcontextprotocol\/sdk/);
      assert.match(err.message, /run `npm install @modelcontextprotocol\/sdk`$/);
      return true;
    });
    await connection.close();
  });

  it('a run that configures MCP servers is refused at start without the SDK, not run with no tools', () => {
    assert.doesNotThrow(() => requireInstalled('mcp'));
    assert.throws(
      () => requireInstalled('mcp', () => import.meta.resolve(`${NOT_INSTALLED}/client/index.js`)),
      (err: Error & { code?: string }) => {
        assert.equal(err.code, 'ERR_OPTIONAL_PACKAGE');
        assert.match(err.message, /^MCP tools \(tasks\[\]\.tools\.mcp\) need @modelcontextprotocol\/sdk/);
        return true;
      },
    );
  });

  it('passes any other failure of the import through unchanged', async () => {
    const boom = new Error('boom');
    await assert.rejects(
      loadOptional('mcp', () => Promise.reject(boom)),
      (err) => err === boom,
    );
  });

  it('package.json lists the MCP SDK as an optional dependency, the NATS client as a dependency, and the lockfile agrees', () => {
    const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
      optionalDependencies?: Record<string, string>;
    };
    const lock = JSON.parse(readFileSync(join(ROOT, 'package-lock.json'), 'utf8')) as {
      packages: Record<string, { optional?: boolean; optionalDependencies?: Record<string, string> }>;
    };
    for (const name of OPTIONAL_PACKAGES.mcp.packages) {
      assert.ok(pkg.optionalDependencies?.[name], `${name} is in optionalDependencies`);
      assert.equal(pkg.dependencies[name], undefined, `${name} is not also in dependencies`);
      assert.equal(
        lock.packages[''].optionalDependencies?.[name],
        pkg.optionalDependencies?.[name],
        'run `npm install --package-lock-only`',
      );
      assert.equal(lock.packages[`node_modules/${name}`]?.optional, true, `the lockfile marks ${name} optional`);
    }
    // npm leaves out an optional dependency whose engines refuse the running Node, with everything under
    // it: @nats-io/nuid says node >= 22, so as an optional dependency the NATS client would not be
    // installed on Node 20 at all. When nuid admits Node 20, move it to optionalDependencies.
    const nuid = lock.packages['node_modules/@nats-io/nuid'] as { engines?: { node?: string } };
    assert.equal(nuid.engines?.node, '>= 22.x', 'nuid admits Node 20 now: the NATS client can be optional');
    for (const name of OPTIONAL_PACKAGES.nats.packages) assert.ok(pkg.dependencies[name], `${name} is in dependencies`);
  });
});

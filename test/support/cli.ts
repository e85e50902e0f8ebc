/** Runs the `rollout` CLI from source (or any command) as a child process, bounded, for commands that exit by themselves. */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';

export const CLI_MAIN = new URL('../../src/cli/main.ts', import.meta.url).pathname;

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function rollout(
  args: string[],
  { timeoutMs = 60_000, env = { LOG_LEVEL: 'warn' } as Record<string, string> } = {},
): Promise<CliResult> {
  return runToExit(process.execPath, ['--import', 'tsx', CLI_MAIN, ...args], { timeoutMs, env });
}

/** Runs a command to its exit, collecting its output; killed and rejected after `timeoutMs`. */
export function runToExit(
  command: string,
  args: string[],
  { timeoutMs = 60_000, env = {} as Record<string, string> } = {},
): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { env: { ...process.env, ...env } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c) => (stdout += c));
    child.stderr.on('data', (c) => (stderr += c));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${command} ${args.join(' ')} did not finish in ${timeoutMs} ms\n${stdout}\n${stderr}`));
    }, timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** The URL a server process prints as `listening on http://…` on stdout; rejects, naming `what` and its stderr, if it exits first. */
export function listeningUrl(
  child: ChildProcessWithoutNullStreams,
  what: string,
  stderr: () => string,
): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    let stdout = '';
    child.stdout.on('data', (c) => {
      stdout += c;
      const match = /listening on (http:\/\/[\d.]+:\d+)/.exec(stdout);
      if (match) resolve(match[1]);
    });
    child.once('close', () => reject(new Error(`${what} exited before listening:\n${stderr()}`)));
  });
}

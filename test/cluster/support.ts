/**
 * Child processes of the cluster tests (coordinators, nodes) whose pino JSON log lines the test waits
 * on: `waitFor(pred)` resolves with the first line, seen or still to come, that matches — events,
 * not sleeps, decide when a test kills what.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { CLI_MAIN } from '../support/cli.ts';

export type LogLine = Record<string, unknown> & { msg?: string };

export class LoggedProcess {
  readonly child: ChildProcess;
  readonly lines: LogLine[] = [];
  stderr = '';
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  #waiters: { pred: (l: LogLine) => boolean; resolve: (l: LogLine) => void }[] = [];

  constructor(args: string[], env: Record<string, string> = {}) {
    this.child = spawn(process.execPath, ['--import', 'tsx', CLI_MAIN, ...args], {
      env: { ...process.env, LOG_FORMAT: 'json', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.child.stdout!.resume();
    let partial = '';
    this.child.stderr!.on('data', (chunk: Buffer) => {
      this.stderr += chunk.toString();
      partial += chunk.toString();
      const parts = partial.split('\n');
      partial = parts.pop()!;
      for (const text of parts) {
        let line: LogLine;
        try {
          line = JSON.parse(text) as LogLine;
        } catch {
          continue;
        }
        this.lines.push(line);
        this.#waiters = this.#waiters.filter((w) => (w.pred(line) ? (w.resolve(line), false) : true));
      }
    });
    this.exited = new Promise((resolve) => this.child.once('exit', (code, signal) => resolve({ code, signal })));
  }

  waitFor(pred: (line: LogLine) => boolean, what: string, timeoutMs = 60_000): Promise<LogLine> {
    const seen = this.lines.find(pred);
    if (seen !== undefined) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`no log line ${what} within ${timeoutMs} ms:\n${this.stderr.slice(-4000)}`)),
        timeoutMs,
      );
      timer.unref();
      this.#waiters.push({ pred, resolve: (l) => (clearTimeout(timer), resolve(l)) });
      void this.exited.then(({ code, signal }) => {
        clearTimeout(timer);
        reject(
          new Error(`the process exited (${signal ?? code}) before a log line ${what}:\n${this.stderr.slice(-4000)}`),
        );
      });
    });
  }

  count(pred: (line: LogLine) => boolean): number {
    return this.lines.filter(pred).length;
  }

  async kill(signal: NodeJS.Signals): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill(signal);
    return this.exited;
  }
}

export function rolloutNode(
  url: string,
  run: string,
  id: string,
  extra: string[] = [],
  env: Record<string, string> = {},
): LoggedProcess {
  return new LoggedProcess(['node', '--nats', url, '--run', run, '--id', id, '--threads', '1', ...extra], {
    LOG_LEVEL: 'debug',
    ...env,
  });
}

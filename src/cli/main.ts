#!/usr/bin/env node
/**
 * `rollout` — the command-line entry point. Each subcommand lives in its own module and returns an
 * exit code or throws; what a thrown error prints is decided here alone (failureReport), so every
 * command reports alike.
 */
import { ConfigError, RolloutEngineError } from '../protocol/errors.ts';
import { envServerCommand } from './env-server.ts';
import { gatewayCommand } from './gateway.ts';
import { loadtestCommand } from './loadtest.ts';
import { mockLlmCommand } from './mock-llm.ts';
import { runCommand } from './run.ts';
import { serveCommand } from './serve.ts';

const HELP = `Usage: rollout <command> [options]

Commands:
  run        produce training batches (embedded mock server + synthetic environments by default)
  serve      run the engine behind the control API a trainer drives (batches, pause, resume, metrics)
  mock-llm   start the built-in mock inference server
  env-server serve environment modules over the env-server protocol
  gateway    OpenAI-compatible token-trace gateway: records per-session token traces, stitches training samples
  loadtest   measure throughput, latency, pauses, memory and CPU against the mock server (JSON + HTML report)
  help       show this help

Run \`rollout <command> --help\` for a command's options.`;

const COMMANDS: Record<string, (argv: string[]) => Promise<number>> = {
  run: runCommand,
  serve: serveCommand,
  'mock-llm': mockLlmCommand,
  'env-server': envServerCommand,
  gateway: gatewayCommand,
  loadtest: loadtestCommand,
};

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command === undefined || command === 'help' || command === '--help' || command === '-h') {
    console.log(HELP);
    return command === undefined ? 1 : 0;
  }
  const run = COMMANDS[command];
  if (run === undefined) {
    console.error(`rollout: unknown command ${JSON.stringify(command)}\n\n${HELP}`);
    return 2;
  }
  return run(rest);
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (err: unknown) => {
    const { lines, exitCode } = failureReport(process.argv[2] ?? '', err);
    for (const line of lines) console.error(line);
    process.exitCode = exitCode;
  },
);

/** Errors the user fixes on the command line (a flag, a port, a run dir): exit 2, as for a bad flag. */
const USAGE_CODES = new Set(['ERR_USAGE', 'ERR_LISTEN']);

/**
 * What a failed command prints, in one shape for every command: `rollout <cmd>: [CODE: ]message`,
 * one line per error (a config's problems one per line, each naming its field), no stack unless
 * LOG_LEVEL=debug. Usage errors and a port in use exit 2; everything else 1.
 */
function failureReport(command: string, err: unknown): { lines: string[]; exitCode: number } {
  const prefix = `rollout ${command}:`;
  const code = (err as { code?: unknown } | null)?.code;
  const oneLine = (text: string) => text.replace(/\s*\n\s*/g, ' ');
  if (err instanceof ConfigError)
    return { lines: err.issues.map((issue) => `${prefix} ${err.code}: ${oneLine(issue)}`), exitCode: 1 };
  if (typeof code === 'string' && (USAGE_CODES.has(code) || code.startsWith('ERR_PARSE_ARGS')))
    return { lines: [`${prefix} ${oneLine((err as Error).message)}`], exitCode: 2 };
  if (err instanceof RolloutEngineError)
    return { lines: [`${prefix} ${err.code}: ${oneLine(err.message)}`], exitCode: 1 };
  // Not an engine error: a bug, or something nothing here expected. Its stack is for a bug report.
  const debug = process.env.LOG_LEVEL === 'debug' || process.env.LOG_LEVEL === 'trace';
  const text =
    err instanceof Error
      ? `${typeof code === 'string' ? `${code}: ` : ''}${oneLine(err.message)}`
      : oneLine(String(err));
  return {
    lines: [`${prefix} ${text}`, ...(debug && err instanceof Error && err.stack ? [err.stack] : [])],
    exitCode: 1,
  };
}

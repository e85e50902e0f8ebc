#!/usr/bin/env node
/**
 * `rollout` — the command-line entry point. Each subcommand lives in its own module and returns an
 * exit code or throws; what a thrown error prints is decided here alone (failureReport), so every
 * command reports alike.
 */
import { existsSync, readFileSync } from 'node:fs';
import { ConfigError, RolloutEngineError } from '../errors.ts';
import { ENV_SERVER_HELP, envServerCommand } from './env-server.ts';
import { GATEWAY_HELP, gatewayCommand } from './gateway.ts';
import { LOADTEST_HELP, loadtestCommand } from './loadtest.ts';
import { MOCK_LLM_HELP, mockLlmCommand } from './mock-llm.ts';
import { NODE_HELP, nodeCommand } from './node.ts';
import { RUN_HELP, runCommand } from './run.ts';
import { SERVE_HELP, serveCommand } from './serve.ts';
import { closest, flagsOf } from './suggest.ts';

const HELP = `Usage: rollout <command> [options]

Commands:
  run        produce training batches (embedded mock server + synthetic environments by default)
  serve      run the engine behind the control API a trainer drives (batches, pause, resume, metrics)
  node       a worker node: runs groups for a coordinator started with --nats (NATS JetStream)
  mock-llm   start the built-in mock inference server
  env-server serve environment modules over the env-server protocol
  gateway    OpenAI-compatible token-trace gateway: records per-session token traces, stitches training samples
  loadtest   measure throughput, latency, pauses, memory and CPU against the mock server (JSON + HTML report)
  help       show this help, or a command's: rollout help <command>

Options:
  -h, --help     show this help
  -V, --version  print the version

Run \`rollout help <command>\` (or \`rollout <command> --help\`) for a command's options.`;

interface Command {
  run: (argv: string[]) => Promise<number>;
  help: string;
}

const COMMANDS: Record<string, Command> = {
  run: { run: runCommand, help: RUN_HELP },
  serve: { run: serveCommand, help: SERVE_HELP },
  node: { run: nodeCommand, help: NODE_HELP },
  'mock-llm': { run: mockLlmCommand, help: MOCK_LLM_HELP },
  'env-server': { run: envServerCommand, help: ENV_SERVER_HELP },
  gateway: { run: gatewayCommand, help: GATEWAY_HELP },
  loadtest: { run: loadtestCommand, help: LOADTEST_HELP },
};

async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command === '--version' || command === '-V' || command === 'version') {
    console.log(`rollout-engine ${packageVersion()}`);
    return 0;
  }
  if (command === undefined || command === '--help' || command === '-h') {
    console.log(HELP);
    return command === undefined ? 1 : 0;
  }
  if (command === 'help') {
    if (rest[0] === undefined) {
      console.log(HELP);
      return 0;
    }
    const known = COMMANDS[rest[0]];
    if (known === undefined) return unknownCommand(rest[0]);
    console.log(known.help);
    return 0;
  }
  const known = COMMANDS[command];
  if (known === undefined) return unknownCommand(command);
  try {
    return await known.run(rest);
  } catch (err) {
    throw withFlagSuggestion(command, known, err);
  }
}

function unknownCommand(command: string): number {
  const near = closest(command, [...Object.keys(COMMANDS), 'help']);
  const hint = near === null ? '' : ` (did you mean ${near}?)`;
  console.error(`rollout: unknown command ${JSON.stringify(command)}${hint}\n\n${HELP}`);
  return 2;
}

/**
 * node:util parseArgs's "Unknown option '--x'. To specify a positional argument starting with a '-',
 * place it at the end…", made short and pointed: the nearest flag the command's help lists, and
 * where the rest are.
 */
function withFlagSuggestion(command: string, known: Command, err: unknown): unknown {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code !== 'string' || !code.startsWith('ERR_PARSE_ARGS')) return err;
  const unknown = /^Unknown option '(--?[^']+)'/.exec((err as Error).message)?.[1];
  if (unknown === undefined) return err;
  const near = closest(unknown.split('=')[0], flagsOf(known.help));
  const hint = near === null ? '' : ` (did you mean ${near}?)`;
  return Object.assign(new Error(`Unknown option '${unknown}'${hint}; see rollout help ${command}`), { code });
}

/** This package's version: package.json is two folders up from src/cli/, three from dist/src/cli/. */
function packageVersion(): string {
  for (const up of ['../../package.json', '../../../package.json']) {
    const url = new URL(up, import.meta.url);
    if (!existsSync(url)) continue;
    const pkg = JSON.parse(readFileSync(url, 'utf8')) as { name?: string; version?: string };
    if (pkg.name === 'rollout-engine' && typeof pkg.version === 'string') return pkg.version;
  }
  return 'unknown';
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

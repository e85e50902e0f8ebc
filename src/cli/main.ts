#!/usr/bin/env node
/**
 * `rollout` — the command-line entry point. Each subcommand lives in its own module and returns an
 * exit code; errors with a code (config, usage, inference) print one readable line, not a stack.
 */
import { RolloutEngineError } from '../protocol/errors.ts';
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
    if (err instanceof RolloutEngineError) console.error(`rollout: ${err.code}: ${err.message}`);
    else if ((err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS')) console.error(`rollout: ${(err as Error).message}`);
    else console.error(err);
    process.exitCode = (err as { code?: string }).code === 'ERR_USAGE' || (err as { code?: string }).code?.startsWith('ERR_PARSE_ARGS') ? 2 : 1;
  },
);

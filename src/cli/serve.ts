import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { checkAllowedHost, isLoopback } from '../control/access.ts';
import { createEngine } from '../engine.ts';
import { untilSignal, portFlag, UsageError, DEFAULT_PORTS } from './args.ts';
import { CONFIG_FLAGS, configFromFlags } from './config-flags.ts';
import { lockRunDir, newRunDir } from './run-dir.ts';

export const SERVE_HELP = `Usage: rollout serve [options]

Run the engine and serve the control API a trainer drives it with: take a batch for a train step,
pause for a weight update, resume with a model step, checkpoint, status, Prometheus metrics.
With no --config and no --llm-url it runs on embedded defaults (built-in mock inference server,
synthetic environments). See docs/CONTROL-API.md and examples/python_trainer.py.

Options:
  --config <file>      JSON engine config; paths in it are relative to it
  --llm-url <url>      OpenAI-compatible inference server (overrides llm.url)
  --model <name>       model name to request (overrides llm.model)
  --server <kind>      auto | vllm | sglang | llamacpp | openai | generic (overrides llm.server)
  --api <api>          chat | tokens: send token ids rendered with --tokenizer (overrides llm.api)
  --tokenizer <name>   qwen2.5, or a directory with tokenizer.json (overrides llm.tokenizer)
  --batch-size <n>     groups per batch (overrides batchSize)
  --threads <n>        worker threads (overrides workers.threads)
  --seed <n>           run seed (overrides seed)
  --strategy <s>       sync | async (overrides producer.strategy)
  --nats <url>         run groups on worker nodes (\`rollout node\`) over NATS JetStream (sets workers.nats.url)
  --run-dir <dir>      step records go to <dir>/steps, the checkpoint to <dir>/engine.ckpt
                       (default runs/serve-<timestamp>-<random>, a new dir); locked for the life of
                       the process: a second process on the same dir is refused
  --resume             continue the run in --run-dir from its engine.ckpt (a restart after a crash or a
                       stop); without one it starts the run. A run dir holding a checkpoint is refused
                       without --resume
  --host <addr>        address to bind (default 127.0.0.1: loopback only)
  --port <n>           port (default ${DEFAULT_PORTS.serve}; 0 = any free port)
  --token <t>          require "Authorization: Bearer <t>" (default: $ROLLOUT_TOKEN, else none on
                       loopback; beyond loopback a random one, printed once to stderr)
  --allow-host <name>  a host name clients may reach the API by, besides loopback and --host (a DNS
                       name, a proxy's); repeatable. Other Host headers are refused (403)
  --stop-with-stdin    stop as on SIGTERM when standard input ends: a parent holding a pipe to it
                       stops the engine when it exits, however it dies (rollout_engine.launch does)
  -h, --help           show this help`;

/**
 * The token the control API requires: the one given; else, bound beyond loopback, a random one, with
 * the line that tells it (once: it is in no file). Anyone who can reach the port could otherwise
 * drive the engine, and "I forgot --token" must not be how a run gets exposed.
 */
export function controlToken(host: string, given: string | null): { token: string | null; notice: string | null } {
  if (given !== null && given !== '') return { token: given, notice: null };
  if (isLoopback(host)) return { token: null, notice: null };
  const token = randomBytes(32).toString('base64url');
  return {
    token,
    notice: `rollout serve: --host ${host} reaches beyond loopback and no --token (or $ROLLOUT_TOKEN) was given; requests must carry\n  Authorization: Bearer ${token}`,
  };
}

export async function serveCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      ...CONFIG_FLAGS,
      'run-dir': { type: 'string' },
      resume: { type: 'boolean' },
      host: { type: 'string' },
      port: { type: 'string' },
      token: { type: 'string' },
      'allow-host': { type: 'string', multiple: true },
      'stop-with-stdin': { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
  if (values.help) {
    console.log(SERVE_HELP);
    return 0;
  }
  const port = portFlag(values.port) ?? DEFAULT_PORTS.serve;
  const { 'allow-host': allowHostFlags = [], ...flags } = values;
  const allowHosts = allowHostFlags.map((name) => {
    try {
      return checkAllowedHost(name);
    } catch {
      throw new UsageError(
        `--allow-host must be a host name or an IP address, without a scheme or port (got ${JSON.stringify(name)})`,
      );
    }
  });
  const { config, configPath } = configFromFlags(flags);
  if (values.resume && values['run-dir'] === undefined && typeof config.runDir !== 'string')
    throw new UsageError('--resume needs --run-dir (the directory of the run to continue)');
  const named = values['run-dir'] ?? (typeof config.runDir === 'string' ? config.runDir : null);
  const runDir = named === null ? newRunDir(resolve('runs'), 'serve-') : resolve(named);
  // Held until this process exits, taken before the checkpoint is looked at: a supervisor restarting
  // serve while the old process is still stopping is refused instead of running one run twice.
  await lockRunDir(runDir);
  config.runDir = runDir;
  const checkpointPath = join(runDir, 'engine.ckpt');
  // As `rollout run`: the run dir's checkpoint is the resume point of a run whose batches a trainer has
  // trained on. Starting over at step 1 would hand out those group ids again, and the first batch's
  // checkpoint would overwrite the real resume point — so it is continued when asked, refused if not.
  if (existsSync(checkpointPath)) {
    if (!values.resume)
      throw new UsageError(
        `${checkpointPath} already holds a run's checkpoint: pass --resume to continue that run, or choose another --run-dir`,
      );
    // The run's own checkpoint, whatever checkpointEachBatch says (a signal stop writes one too), and
    // not the checkpoint the run may have started from (a config's resumeFrom).
    config.resumeFrom = checkpointPath;
  }
  if (values.resume) config.resume = true;
  const engine = createEngine(config, { baseDir: configPath === undefined ? process.cwd() : dirname(configPath) });
  try {
    await engine.start();
    const host = values.host ?? '127.0.0.1';
    const { token, notice } = controlToken(host, values.token ?? process.env.ROLLOUT_TOKEN ?? null);
    const server = await engine.listen({ host, port, token, allowHosts });
    if (notice !== null) console.error(notice);
    // One line a supervisor (or a test) can wait for.
    console.log(`control API listening on ${server.url} (inference: ${engine.llmUrl})`);
    await untilSignal({ stdinEnd: values['stop-with-stdin'] === true });
    // Graceful stop: groups in flight come home, then the state is saved for --resume-style restarts.
    await engine.pauseForWeightUpdate();
    await engine.checkpoint(checkpointPath);
  } finally {
    await engine.close();
  }
  return 0;
}

import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { createEngine } from '../index.ts';
import { untilSignal, portFlag } from './args.ts';
import { CONFIG_FLAGS, configFromFlags } from './config-flags.ts';

export const SERVE_HELP = `Usage: rollout serve [options]

Run the engine and serve the control API a trainer drives it with: take a batch for a train step,
pause for a weight update, resume with a model step, checkpoint, status, Prometheus metrics.
With no --config and no --llm-url it runs on embedded defaults (built-in mock inference server,
synthetic environments). See README "Control API" and examples/python_trainer.py.

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
  --run-dir <dir>      step records go to <dir>/steps (default runs/serve-<timestamp>)
  --host <addr>        address to bind (default 127.0.0.1: loopback only)
  --port <n>           port (default 8100; 0 = any free port)
  --token <t>          require "Authorization: Bearer <t>" (default: $ROLLOUT_TOKEN, else none)
  -h, --help           show this help`;

export async function serveCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: { ...CONFIG_FLAGS, 'run-dir': { type: 'string' }, host: { type: 'string' }, port: { type: 'string' }, token: { type: 'string' }, help: { type: 'boolean', short: 'h' } },
    strict: true,
  });
  if (values.help) {
    console.log(SERVE_HELP);
    return 0;
  }
  const port = portFlag(values.port) ?? 8100;
  const { config, configPath } = configFromFlags(values);
  config.runDir = resolve(values['run-dir'] ?? (typeof config.runDir === 'string' ? config.runDir : join('runs', `serve-${Date.now()}`)));
  const engine = createEngine(config, { baseDir: configPath === undefined ? process.cwd() : dirname(configPath) });
  try {
    await engine.start();
    const server = await engine.listen({ host: values.host ?? '127.0.0.1', port, token: values.token ?? process.env.ROLLOUT_TOKEN ?? null });
    // One line a supervisor (or a test) can wait for.
    console.log(`control API listening on ${server.url} (inference: ${engine.llmUrl})`);
    await untilSignal();
    // Graceful stop: groups in flight come home, then the state is saved for --resume-style restarts.
    await engine.pauseForWeightUpdate();
    await engine.checkpoint(join(config.runDir as string, 'engine.ckpt'));
  } finally {
    await engine.close();
  }
  return 0;
}

import { parseArgs } from 'node:util';
import { intFlag, numberFlag, untilSignal, portFlag } from './args.ts';

export const MOCK_LLM_HELP = `Usage: rollout mock-llm [options]

Start the built-in mock inference server (OpenAI-compatible) and keep it running until Ctrl-C.
It plays the synthetic environments imperfectly, returns real BPE token ids and logprobs in the
vLLM shape (whole or streamed as server-sent events), and can be aborted or given a new weight version like a real server.

Options:
  --port <n>               port to listen on (default 8000; 0 = any free port)
  --host <addr>            address to bind (default 127.0.0.1)
  --model <name>           model id it serves (default mock-policy)
  --latency-ms <ms>        fixed latency per request (default 0)
  --tokens-per-second <n>  generation rate per request; 0 = instant (default 0)
  --stream-interval-ms <ms>  a streamed reply (stream: true) sends its new tokens this often (default 20)
  --think-tokens <n>       filler tokens before every answer, to size responses (default 0)
  --mistake-rate <p>       how often the policy plays badly, 0..1 (default 0.3)
  --error-rate <p>         fraction of requests answered 500, 0..1 (default 0)
  --weight-version <n>     weight version reported in replies (default 0)
  --seed <n>               policy seed (default 0)
  -h, --help               show this help

Routes: GET /health, GET /v1/models, POST /v1/chat/completions, POST /admin/abort (alias
/abort_request), GET|POST /admin/weight_version.`;

export async function mockLlmCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      port: { type: 'string' },
      host: { type: 'string' },
      model: { type: 'string' },
      'latency-ms': { type: 'string' },
      'tokens-per-second': { type: 'string' },
      'stream-interval-ms': { type: 'string' },
      'think-tokens': { type: 'string' },
      'mistake-rate': { type: 'string' },
      'error-rate': { type: 'string' },
      'weight-version': { type: 'string' },
      seed: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
  if (values.help) {
    console.log(MOCK_LLM_HELP);
    return 0;
  }
  // Undefined values are left to the mock's defaults (resolveMockLlmOptions skips them).
  const options = {
    port: portFlag(values.port) ?? 8000,
    host: values.host ?? '127.0.0.1',
    model: values.model,
    latencyMs: numberFlag('latency-ms', values['latency-ms']),
    tokensPerSecond: numberFlag('tokens-per-second', values['tokens-per-second']),
    streamIntervalMs: numberFlag('stream-interval-ms', values['stream-interval-ms'], { min: 1, max: 60_000 }),
    thinkTokens: intFlag('think-tokens', values['think-tokens']),
    mistakeRate: numberFlag('mistake-rate', values['mistake-rate'], { max: 1 }),
    errorRate: numberFlag('error-rate', values['error-rate'], { max: 1 }),
    weightVersion: intFlag('weight-version', values['weight-version']),
    seed: intFlag('seed', values.seed),
  };
  const { startMockLlm } = await import('../testing/mock-llm/server.ts');
  const server = await startMockLlm(options);
  console.log(`mock inference server listening on ${server.url} (model ${options.model ?? 'mock-policy'})`);
  await untilSignal();
  await server.close();
  return 0;
}

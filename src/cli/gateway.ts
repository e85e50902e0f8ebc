import { parseArgs } from 'node:util';
import { UsageError, intFlag, untilSignal, portFlag, DEFAULT_PORTS } from './args.ts';

export const GATEWAY_HELP = `Usage: rollout gateway --backend-url <url> [options]
       rollout gateway --embedded-mock [options]

Start the token-trace gateway: an OpenAI-compatible server in front of a token-in/token-out inference
backend. Agents talk to it with any OpenAI client; it renders each conversation with the model's chat
template, tokenizes only the new part of every turn, records prompt ids, completion ids, logprobs and
weight versions per session, and stitches a session into one training sample.

Options:
  --backend-url <url>        the inference server, e.g. http://127.0.0.1:8000
  --backend <kind>           vllm (POST /v1/completions with token ids), sglang (POST /generate) or
                             llamacpp (POST /completion); default vllm
  --embedded-mock            serve from a built-in mock backend speaking the tokenizer's vocabulary
                             (qwen2.5 only; for trying the gateway without a GPU)
  --port <n>                 port to listen on (default ${DEFAULT_PORTS.gateway}; 0 = any free port)
  --host <addr>              address to bind (default 127.0.0.1)
  --model <name>             model id served on /v1/models and sent to the backend (default: the tokenizer name)
  --tokenizer <name|dir>     qwen2.5 (built in) or a directory with tokenizer.json + tokenizer_config.json (default qwen2.5)
  --max-context <n>          context window in tokens (default: the tokenizer's model_max_length, at most 32768)
  --default-max-tokens <n>   completion budget when a request names none (default: the rest of the context)
  --session-ttl-ms <ms>      release a session idle this long (default 600000)
  --max-sessions <n>         live sessions at most (default 10000)
  --backend-timeout-ms <ms>  budget of one backend call (default 600000)
  -h, --help                 show this help

Sessions: put the id in the path (baseURL http://host:port/v1/sessions/<id>), in the x-session-id
header, or in the body as session_id; a call without one is a session of its own (its id comes back
as session_id and x-session-id).

Routes: POST /v1/chat/completions (stream or not), GET /v1/models, GET /health, POST /tokenize,
GET|DELETE /v1/sessions/<id>, GET /v1/sessions/<id>/traces, POST /v1/sessions/<id>/stitch {reward?}.
The backend's API key, if it needs one, is read from ROLLOUT_BACKEND_API_KEY.`;

export async function gatewayCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      'backend-url': { type: 'string' },
      backend: { type: 'string' },
      'embedded-mock': { type: 'boolean' },
      port: { type: 'string' },
      host: { type: 'string' },
      model: { type: 'string' },
      tokenizer: { type: 'string' },
      'max-context': { type: 'string' },
      'default-max-tokens': { type: 'string' },
      'session-ttl-ms': { type: 'string' },
      'max-sessions': { type: 'string' },
      'backend-timeout-ms': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
  if (values.help) {
    console.log(GATEWAY_HELP);
    return 0;
  }
  const kind = values.backend ?? 'vllm';
  if (kind !== 'vllm' && kind !== 'sglang' && kind !== 'llamacpp')
    throw new UsageError(`--backend must be vllm, sglang or llamacpp (got ${JSON.stringify(kind)})`);
  const tokenizer = values.tokenizer ?? 'qwen2.5';
  const embedded = values['embedded-mock'] === true;
  if (embedded === (values['backend-url'] !== undefined)) {
    throw new UsageError('give exactly one of --backend-url <url> or --embedded-mock (see rollout gateway --help)');
  }
  if (embedded && (kind !== 'vllm' || tokenizer !== 'qwen2.5')) {
    throw new UsageError(
      `--embedded-mock serves the vllm shape in the qwen2.5 vocabulary (got --backend ${kind} --tokenizer ${tokenizer})`,
    );
  }
  const port = portFlag(values.port) ?? DEFAULT_PORTS.gateway;
  const options = {
    host: values.host ?? '127.0.0.1',
    port,
    tokenizer,
    model: values.model ?? null,
    maxContext: intFlag('max-context', values['max-context'], { min: 2 }) ?? null,
    defaultMaxTokens: intFlag('default-max-tokens', values['default-max-tokens'], { min: 1 }) ?? null,
    sessionTtlMs: intFlag('session-ttl-ms', values['session-ttl-ms'], { min: 1 }),
    maxSessions: intFlag('max-sessions', values['max-sessions'], { min: 1 }),
  };
  const backendTimeoutMs = intFlag('backend-timeout-ms', values['backend-timeout-ms'], { min: 1 });

  let mock: { url: string; close(): Promise<void> } | null = null;
  if (embedded) {
    const { startMockLlm } = await import('../mock-llm/server.ts');
    mock = await startMockLlm({ tokenizer: 'qwen2.5' });
  }
  const { startGateway } = await import('../gateway/server.ts');
  let gateway;
  try {
    gateway = await startGateway({
      ...options,
      backend: {
        kind,
        url: mock?.url ?? values['backend-url']!,
        timeoutMs: backendTimeoutMs,
        apiKey: process.env.ROLLOUT_BACKEND_API_KEY ?? null,
      },
    });
  } catch (err) {
    await mock?.close();
    throw err;
  }
  console.log(
    `token-trace gateway listening on ${gateway.url} (OpenAI baseURL ${gateway.baseURL}; model ${gateway.model}, context ${gateway.maxContext}) ` +
      `→ ${kind} backend ${mock !== null ? `${mock.url} (embedded mock)` : values['backend-url']}`,
  );
  await untilSignal();
  await gateway.close();
  await mock?.close();
  return 0;
}

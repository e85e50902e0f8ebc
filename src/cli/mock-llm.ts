import { parseArgs } from 'node:util';
import { GPU_PROFILE_NAMES, type CapacityOptions, type GpuProfileName } from '../mock-llm/gpu.ts';
import { UsageError, intFlag, numberFlag, untilSignal, portFlag, DEFAULT_PORTS } from './args.ts';

export const MOCK_LLM_HELP = `Usage: rollout mock-llm [options]

Start the built-in mock inference server (OpenAI-compatible) and keep it running until Ctrl-C.
It plays the synthetic environments imperfectly, returns real BPE token ids and logprobs in the
vLLM shape (whole or streamed as server-sent events), and can be aborted or given a new weight version like a real server.
With --dialect it speaks one real server's wire format instead, gaps included (docs/MOCK-SERVER.md).

Options:
  --port <n>               port to listen on (default ${DEFAULT_PORTS['mock-llm']}; 0 = any free port)
  --host <addr>            address to bind (default 127.0.0.1)
  --model <name>           model id it serves (default mock-policy)
  --latency-ms <ms>        fixed latency per request (default 0)
  --tokens-per-second <n>  generation rate per request; 0 = instant (default 0)
  --stream-interval-ms <ms>  a streamed reply (stream: true) sends its new tokens this often (default 20)
  --think-tokens <n>       filler tokens before every answer, to size responses (default 0)
  --mistake-rate <p>       how often the policy plays badly, 0..1 (default 0.3)
  --error-rate <p>         fraction of requests answered 500, 0..1 (default 0)
  --weight-version <v>     weight version reported in replies (default 0; sglang and vllm: a string,
                           default "default")
  --seed <n>               policy seed (default 0)
  --dialect <name>         default, vllm, sglang or llamacpp: whose routes and reply shapes to speak
                           (default: default, the mock's own vLLM-like superset)
  --context <n>            context window in tokens, enforced with the dialect's own 400 and reported
                           by its info routes (dialects only; default 32768)
  --no-dev-mode            vllm dialect: without the VLLM_SERVER_DEV_MODE routes (/abort_requests,
                           /pause, /resume, /weight_info, /update_weight_version answer 404)
  --tokenizer <name|dir>   vocabulary of the token-in routes: cl100k (default), qwen2.5 (what
                           rollout gateway sends), or a directory with tokenizer.json + tokenizer_config.json
  --stop-with-stdin        stop as on SIGTERM when standard input ends: a parent holding a pipe to it
                           stops the server when it exits, however it dies (the bench's mocks do)
  -h, --help               show this help

GPU-like mock (replaces --latency-ms and --tokens-per-second; defaults: one Llama-3-8B replica on an
H200, fitted on a measurement, docs/MOCK-CALIBRATION.md; metrics at GET /admin/gpu):
  --capacity <slots>       sequence slots; requests beyond them queue (continuous batching; 256)
  --capacity-profile <name>          where the cost knobs below default from: h200-8b (measured; the
                                     default), h100-8b (its memory-bound terms × 1.43 for the H100's
                                     bandwidth), h100-8b-flat (the context-blind model of earlier runs)
  --capacity-decode-ms <ms>          a decode step's fixed time (h200-8b: 5.82)
  --capacity-decode-ms-per-seq <ms>  what each running sequence adds to a step (0.0145)
  --capacity-decode-ms-per-kv-token <ms>  what each KV token held by the decoding sequences adds
                                     to a step (2.86e-5; 0 = context-blind)
  --capacity-prefill-tokens-per-second <n>  prefill rate (34000)
  --capacity-prefill-chunk <n>       tokens one step may process, decodes first (8192)
  --capacity-prefix-cache <tokens>   prefix cache size, LRU; 0 = none (800000)
  --capacity-response-tokens <n>     median response length, drawn log-normal per prompt and per
                                     reply (default: the answer + --think-tokens)
  --capacity-length-sigma <σ>        σ of log(length): 0 = fixed, 1 = p99 ≈ 10× the median (1)
  --capacity-speedup <x>             GPU milliseconds per real one, to run long workloads fast (1)
  --capacity-scheduling <policy>     fcfs, or priority: requests' priority field orders the queue as
                                     the dialect's server does (vLLM lower first; SGLang higher
                                     first, preempting past a gap of 10) (fcfs)

Routes (default dialect): GET /health, GET /v1/models, POST /v1/chat/completions, POST
/v1/completions (token-id prompts), POST /admin/abort (alias /abort_request), GET|POST
/admin/weight_version. The dialects serve their server's routes instead.`;

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
      dialect: { type: 'string' },
      context: { type: 'string' },
      'no-dev-mode': { type: 'boolean' },
      tokenizer: { type: 'string' },
      capacity: { type: 'string' },
      'capacity-decode-ms': { type: 'string' },
      'capacity-decode-ms-per-seq': { type: 'string' },
      'capacity-decode-ms-per-kv-token': { type: 'string' },
      'capacity-profile': { type: 'string' },
      'capacity-prefill-tokens-per-second': { type: 'string' },
      'capacity-prefill-chunk': { type: 'string' },
      'capacity-prefix-cache': { type: 'string' },
      'capacity-response-tokens': { type: 'string' },
      'capacity-length-sigma': { type: 'string' },
      'capacity-speedup': { type: 'string' },
      'capacity-scheduling': { type: 'string' },
      'stop-with-stdin': { type: 'boolean' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
  if (values.help) {
    console.log(MOCK_LLM_HELP);
    return 0;
  }
  const dialect = values.dialect ?? 'default';
  if (!['default', 'vllm', 'sglang', 'llamacpp'].includes(dialect)) {
    throw new UsageError(`--dialect must be one of default, vllm, sglang, llamacpp (got ${JSON.stringify(dialect)})`);
  }
  if (values.context !== undefined && dialect === 'default') {
    throw new UsageError(
      `--context needs --dialect vllm, sglang or llamacpp (got --context ${JSON.stringify(values.context)} without one)`,
    );
  }
  // SGLang's --weight-version is any string; the mock's own is an integer (a trainer's step).
  const stringVersion = dialect === 'sglang' || dialect === 'vllm';
  const weightVersion =
    stringVersion && values['weight-version'] !== undefined && !/^\d+$/.test(values['weight-version'])
      ? values['weight-version']
      : intFlag('weight-version', values['weight-version']);
  // Undefined values are left to the mock's defaults (resolveMockLlmOptions skips them).
  const options = {
    port: portFlag(values.port) ?? DEFAULT_PORTS['mock-llm'],
    host: values.host ?? '127.0.0.1',
    model: values.model,
    latencyMs: numberFlag('latency-ms', values['latency-ms']),
    tokensPerSecond: numberFlag('tokens-per-second', values['tokens-per-second']),
    streamIntervalMs: numberFlag('stream-interval-ms', values['stream-interval-ms'], { min: 1, max: 60_000 }),
    thinkTokens: intFlag('think-tokens', values['think-tokens']),
    mistakeRate: numberFlag('mistake-rate', values['mistake-rate'], { max: 1 }),
    errorRate: numberFlag('error-rate', values['error-rate'], { max: 1 }),
    weightVersion,
    seed: intFlag('seed', values.seed),
    dialect: dialect as 'default' | 'vllm' | 'sglang' | 'llamacpp',
    contextLength: intFlag('context', values.context, { min: 2 }),
    vllmDevMode: values['no-dev-mode'] === true ? false : undefined,
    tokenizer: values.tokenizer,
    capacity: capacityFlags(values),
  };
  const { startMockLlm } = await import('../mock-llm/server.ts');
  const server = await startMockLlm(options);
  const tokenizer = server.options.tokenizer === 'cl100k' ? '' : `, tokenizer ${server.options.tokenizer}`;
  const speaks = dialect === 'default' ? '' : `, ${dialect} dialect, context ${server.options.contextLength ?? 32768}`;
  const gpu =
    server.options.capacity === null
      ? ''
      : `, GPU-like: ${server.options.capacity.profile}, ${server.options.capacity.slots} slots${server.options.capacity.speedup === 1 ? '' : ` at ${server.options.capacity.speedup}× speed`}`;
  console.log(
    `mock inference server listening on ${server.url} (model ${options.model ?? 'mock-policy'}${speaks}${tokenizer}${gpu})`,
  );
  await untilSignal({ stdinEnd: values['stop-with-stdin'] === true });
  await server.close();
  return 0;
}

/** The --capacity* flags as option capacity: null without --capacity, whose sub-flags then make no sense. */
function capacityFlags(values: Record<string, string | boolean | undefined>): CapacityOptions | null {
  const str = (name: string) => values[name] as string | undefined;
  const sub = Object.keys(values).filter((k) => k.startsWith('capacity-') && values[k] !== undefined);
  if (values.capacity === undefined) {
    if (sub.length > 0)
      throw new UsageError(
        `--${sub[0]} needs --capacity <slots> (got --${sub[0]} ${JSON.stringify(values[sub[0]])} without it)`,
      );
    return null;
  }
  const responseTokens = intFlag('capacity-response-tokens', str('capacity-response-tokens'), { min: 1 });
  const profile = str('capacity-profile');
  const scheduling = str('capacity-scheduling');
  if (profile !== undefined && !(GPU_PROFILE_NAMES as string[]).includes(profile))
    throw new UsageError(
      `--capacity-profile must be one of ${GPU_PROFILE_NAMES.join(', ')} (got ${JSON.stringify(profile)})`,
    );
  return {
    ...(profile === undefined ? {} : { profile: profile as GpuProfileName }),
    slots: intFlag('capacity', str('capacity'), { min: 1, max: 65_536 }),
    decodeMs: numberFlag('capacity-decode-ms', str('capacity-decode-ms'), { min: 0.001 }),
    decodeMsPerSeq: numberFlag('capacity-decode-ms-per-seq', str('capacity-decode-ms-per-seq')),
    decodeMsPerKvToken: numberFlag('capacity-decode-ms-per-kv-token', str('capacity-decode-ms-per-kv-token')),
    prefillTokensPerSecond: numberFlag(
      'capacity-prefill-tokens-per-second',
      str('capacity-prefill-tokens-per-second'),
      { min: 1 },
    ),
    prefillChunkTokens: intFlag('capacity-prefill-chunk', str('capacity-prefill-chunk'), { min: 1 }),
    prefixCacheTokens: intFlag('capacity-prefix-cache', str('capacity-prefix-cache')),
    ...(responseTokens === undefined ? {} : { responseTokens }),
    lengthSigma: numberFlag('capacity-length-sigma', str('capacity-length-sigma'), { max: 4 }),
    speedup: numberFlag('capacity-speedup', str('capacity-speedup'), { min: 0.001, max: 1_000 }),
    ...(scheduling === undefined ? {} : { scheduling: schedulingFlag(scheduling) }),
  };
}

function schedulingFlag(value: string): 'fcfs' | 'priority' {
  if (value !== 'fcfs' && value !== 'priority')
    throw new UsageError(`--capacity-scheduling must be fcfs or priority (got ${JSON.stringify(value)})`);
  return value;
}

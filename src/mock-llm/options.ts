/**
 * Options of the mock inference server: defaults and validation in one place. Every error names the
 * option and the value, because these come from CLI flags and load-test configs as often as from code.
 */
import { show } from '../env/synthetic/params.ts';
import { RolloutEngineError } from '../errors.ts';
import type { MockRouting } from './routing.ts';
import { GPU_DEFAULTS, GPU_PROFILE_NAMES, GPU_PROFILES, type CapacityOptions, type ResolvedCapacity } from './gpu.ts';
import { MAX_RESPONSE_TOKENS } from './lengths.ts';
import { MOCK_TOKENIZERS } from './vocab.ts';
import type { MockTokenizer } from './vocab.ts';

/**
 * Whose wire format the mock speaks: `default` is the mock's own vLLM-like superset (token ids,
 * weight version and abort on every route, any model name accepted); the others reproduce one real
 * server's shapes and its gaps (dialects.ts names the source of each trait).
 */
export const MOCK_DIALECTS = ['default', 'vllm', 'sglang', 'llamacpp'] as const;
export type MockDialect = (typeof MOCK_DIALECTS)[number];

/** The context a dialect reports and enforces when `contextLength` is not given (Qwen2.5's 32k window). */
export const DIALECT_DEFAULT_CONTEXT = 32_768;

export interface MockLlmOptions {
  /** Interface to listen on. */
  host?: string;
  /** TCP port; 0 picks a free one (read it back from `MockLlm.port`). */
  port?: number;
  /** Model id served by `/v1/models` and echoed in completions. Requests may name any model. */
  model?: string;
  /** Fixed delay before the first token of every completion (prefill / queueing), in ms. */
  latencyMs?: number;
  /** Output generation rate per request; 0 = the whole answer is ready after `latencyMs`. */
  tokensPerSecond?: number;
  /**
   * A streamed completion (`stream: true`) sends the tokens generated since its last event every
   * streamIntervalMs (vLLM sends one event per scheduler step, i.e. per token; a coarser interval keeps
   * the mock's own CPU small next to the clients' under hundreds of streams).
   */
  streamIntervalMs?: number;
  /** Seeds the policy, the logprobs and error injection. */
  seed?: number;
  /**
   * Weight version reported in every completion's `metadata.weight_version`: a non-negative integer
   * for the default dialect. The sglang and vllm dialects report a string, as those servers do
   * (`--weight-version`): an integer given here is reported as its decimal string, and without one
   * they report "default".
   */
  weightVersion?: number | string;
  /**
   * Injected faults, as per-request probabilities (chat and token-in completions). One die per request,
   * drawn from the seed and the request's arrival index, picks at most one fault: the rates are bands
   * of [0, 1) in this order, so their sum must be ≤ 1, and a given seed faults the same requests
   * whatever the other knobs say about the policy.
   *
   * errorRate: answered 500 at once.
   */
  errorRate?: number;
  /** Answered 429 at once with `Retry-After: 0` (a server shedding load; the client may retry now). */
  rateLimitRate?: number;
  /** The connection is reset (RST) without an answer, after the request body was read. */
  resetRate?: number;
  /**
   * Never answered: the request is held until the client hangs up (its timeout or cancel) or close().
   * `/admin/abort` does not release it — a stuck request ignores the server's abort, as a wedged
   * scheduler would.
   */
  hangRate?: number;
  /** Answered 200 after the usual generation time with a body that is not JSON. */
  malformedRate?: number;
  /**
   * Answered 200 after the usual generation time, with a `content-length` larger than the body:
   * the first part of the real completion is sent, then the connection is cut mid-body.
   */
  truncateRate?: number;
  /** Reasoning-like filler tokens (no digits) prepended to every answer: sets the response size. */
  thinkTokens?: number;
  /**
   * The filler written as a reasoning model's thinking: `<think>\n…\n</think>\n\n` before the answer
   * (Qwen3's shape), so a chat template that drops earlier reasoning has something to drop.
   */
  thinkTags?: boolean;
  /** How often the policy plays imperfectly (random guess / off-by-a-little answer). */
  mistakeRate?: number;
  /** Largest accepted request body; bigger ones get 413. */
  maxBodyBytes?: number;
  /**
   * Vocabulary of the token-in endpoint (`POST /v1/completions` with token-id prompts): `cl100k` (the
   * mock's own) or `qwen2.5` (for a token-trace gateway using the Qwen2.5 tokenizer; loaded at start).
   * The chat endpoint always speaks cl100k.
   */
  tokenizer?: MockTokenizer;
  /** Wire format: `default` (the mock's own), or `vllm`, `sglang`, `llamacpp` (see MOCK_DIALECTS). */
  dialect?: MockDialect;
  /**
   * Context window in tokens, enforced as the dialect's server does (prompt + max tokens over it is a
   * 400 with that server's message) and reported by its info routes. Dialects only (null = 32768 for
   * them); the default dialect has no context limit.
   */
  contextLength?: number | null;
  /**
   * vllm dialect: serve the routes vLLM registers only with VLLM_SERVER_DEV_MODE=1 (`/abort_requests`,
   * `/pause`, `/resume`, `/weight_info`, `/update_weight_version`); false = a plain `vllm serve`, on
   * which they are 404.
   */
  vllmDevMode?: boolean;
  /**
   * The GPU-like mock (gpu.ts): a replica with sequence slots, continuous batching, a decode step
   * that slows with the sequences running, prefill with a prefix cache, and long-tailed response
   * lengths; its metrics at `GET /admin/gpu` and in stats().gpu. `{}` takes the defaults (one
   * Llama-3-8B replica on an H200, profile `h200-8b`, GPU_DEFAULTS); null = the fixed-rate mock of latencyMs and
   * tokensPerSecond, which this replaces (leave them at 0).
   */
  capacity?: CapacityOptions | null;
  /**
   * vllm and sglang dialects: a mixture-of-experts server launched with
   * `--enable-return-routed-experts`, routing as mockExpert says (routing.ts). vLLM then sends
   * `routed_experts` on every choice (`vllmWire`: its `.npy`, or 0.21's lists with
   * `prompt_routed_experts`), SGLang `meta_info.routed_experts` when a /generate asks for them
   * (`sglangDtype`: its wire dtype); null = a server without it.
   */
  routedExperts?: MockRouting | null;
}

export type ResolvedMockLlmOptions = Readonly<
  Required<Omit<MockLlmOptions, 'contextLength' | 'capacity' | 'routedExperts'>> & {
    contextLength: number | null;
    capacity: ResolvedCapacity | null;
    routedExperts: MockRouting | null;
  }
>;

export const MOCK_LLM_DEFAULTS: ResolvedMockLlmOptions = Object.freeze({
  host: '127.0.0.1',
  port: 0,
  model: 'mock-policy',
  latencyMs: 0,
  tokensPerSecond: 0,
  streamIntervalMs: 20,
  seed: 0,
  weightVersion: 0,
  errorRate: 0,
  rateLimitRate: 0,
  resetRate: 0,
  hangRate: 0,
  malformedRate: 0,
  truncateRate: 0,
  thinkTokens: 0,
  thinkTags: false,
  mistakeRate: 0.3,
  maxBodyBytes: 8 * 1024 * 1024,
  tokenizer: 'cl100k',
  dialect: 'default',
  contextLength: null,
  vllmDevMode: true,
  capacity: null,
  routedExperts: null,
});

const KNOWN = Object.keys(MOCK_LLM_DEFAULTS);

/** The fault knobs, in the order their bands are laid out on the per-request die. */
export const MOCK_FAULTS = [
  'errorRate',
  'rateLimitRate',
  'resetRate',
  'hangRate',
  'malformedRate',
  'truncateRate',
] as const;
export type MockFaultOption = (typeof MOCK_FAULTS)[number];

function fail(name: string, rule: string, value: unknown): never {
  throw new RolloutEngineError('ERR_INVALID_OPTION', `mock-llm: option ${name} ${rule} (got ${show(value)})`);
}

function integer(name: string, value: unknown, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value)) fail(name, 'must be an integer', value);
  if (value < min || value > max) fail(name, `must be in [${min}, ${max}]`, value);
  return value;
}

function finite(name: string, value: unknown, min: number, max: number): number {
  if (typeof value !== 'number' || !Number.isFinite(value)) fail(name, 'must be a finite number', value);
  if (value < min || value > max) fail(name, `must be in [${min}, ${max}]`, value);
  return value;
}

function text(name: string, value: unknown): string {
  if (typeof value !== 'string' || value.length === 0) fail(name, 'must be a non-empty string', value);
  return value;
}

function oneOf<T extends string>(name: string, value: unknown, allowed: readonly T[]): T {
  if (!allowed.includes(value as T)) fail(name, `must be one of ${allowed.join(', ')}`, value);
  return value as T;
}

export function resolveMockLlmOptions(options: MockLlmOptions = {}): ResolvedMockLlmOptions {
  if (typeof options !== 'object' || options === null || Array.isArray(options))
    fail('(options)', 'must be an object', options);
  for (const key of Object.keys(options)) {
    if (!KNOWN.includes(key))
      throw new RolloutEngineError(
        'ERR_INVALID_OPTION',
        `mock-llm: unknown option ${key} (known: ${KNOWN.join(', ')})`,
      );
  }
  const o = { ...MOCK_LLM_DEFAULTS };
  for (const [key, value] of Object.entries(options))
    if (value !== undefined) (o as Record<string, unknown>)[key] = value;
  const rates = Object.fromEntries(MOCK_FAULTS.map((name) => [name, finite(name, o[name], 0, 1)])) as Record<
    MockFaultOption,
    number
  >;
  const total = MOCK_FAULTS.reduce((sum, name) => sum + rates[name], 0);
  // One die per request: overlapping bands would make some faults silently rarer than asked.
  if (total > 1 + 1e-9) {
    const given = MOCK_FAULTS.filter((name) => rates[name] > 0).map((name) => `${name}=${rates[name]}`);
    throw new RolloutEngineError(
      'ERR_INVALID_OPTION',
      `mock-llm: fault rates must sum to at most 1 (got ${given.join(' + ')} = ${Math.round(total * 1e6) / 1e6})`,
    );
  }
  const dialect = oneOf('dialect', o.dialect, MOCK_DIALECTS);
  if (dialect === 'default' && o.contextLength !== null) {
    fail(
      'contextLength',
      'applies to the vllm, sglang and llamacpp dialects only (set option dialect too)',
      o.contextLength,
    );
  }
  return Object.freeze({
    host: text('host', o.host),
    port: integer('port', o.port, 0, 65535),
    model: text('model', o.model),
    latencyMs: finite('latencyMs', o.latencyMs, 0, 3_600_000),
    tokensPerSecond: finite('tokensPerSecond', o.tokensPerSecond, 0, 1e9),
    streamIntervalMs: finite('streamIntervalMs', o.streamIntervalMs, 1, 60_000),
    seed: integer('seed', o.seed, Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER),
    weightVersion:
      dialect === 'default'
        ? validateWeightVersion(o.weightVersion, 'option weightVersion')
        : versionLabel(options.weightVersion),
    ...rates,
    thinkTokens: integer('thinkTokens', o.thinkTokens, 0, 1_000_000),
    thinkTags: boolean('thinkTags', o.thinkTags),
    mistakeRate: finite('mistakeRate', o.mistakeRate, 0, 1),
    maxBodyBytes: integer('maxBodyBytes', o.maxBodyBytes, 1024, 1024 * 1024 * 1024),
    tokenizer: tokenizer(o.tokenizer),
    dialect,
    contextLength: o.contextLength === null ? null : integer('contextLength', o.contextLength, 2, 1 << 30),
    vllmDevMode: boolean('vllmDevMode', o.vllmDevMode),
    capacity: o.capacity === null ? null : capacity(o.capacity, o.latencyMs, o.tokensPerSecond),
    routedExperts: o.routedExperts === null ? null : routing(o.routedExperts),
  });
}

function routing(value: unknown): MockRouting {
  const r = value as Partial<MockRouting> | null;
  if (typeof r !== 'object' || r === null) fail('routedExperts', 'must be {layers, topK, experts} or null', value);
  for (const key of Object.keys(r))
    if (!['layers', 'topK', 'experts', 'vllmWire', 'sglangDtype'].includes(key))
      fail(`routedExperts.${key}`, 'is not an option', value);
  if (r.vllmWire !== undefined && r.vllmWire !== 'npy' && r.vllmWire !== 'lists')
    fail('routedExperts.vllmWire', 'must be "npy" or "lists"', r.vllmWire);
  if (r.sglangDtype !== undefined && !['int32', 'uint16', 'uint8'].includes(r.sglangDtype))
    fail('routedExperts.sglangDtype', 'must be "int32", "uint16" or "uint8"', r.sglangDtype);
  const experts = integer('routedExperts.experts', r.experts, 1, 65536);
  return Object.freeze({
    layers: integer('routedExperts.layers', r.layers, 1, 1024),
    topK: integer('routedExperts.topK', r.topK, 1, experts),
    experts,
    ...(r.vllmWire !== undefined ? { vllmWire: r.vllmWire } : {}),
    ...(r.sglangDtype !== undefined ? { sglangDtype: r.sglangDtype } : {}),
  });
}

const CAPACITY_KEYS = Object.keys(GPU_DEFAULTS);

function capacity(value: unknown, latencyMs: unknown, tokensPerSecond: unknown): ResolvedCapacity {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    fail('capacity', 'must be an object (or null)', value);
  for (const key of Object.keys(value)) {
    if (!CAPACITY_KEYS.includes(key))
      throw new RolloutEngineError(
        'ERR_INVALID_OPTION',
        `mock-llm: unknown option capacity.${key} (known: ${CAPACITY_KEYS.join(', ')})`,
      );
  }
  // The replica sets every reply's timing: a fixed latency on top would be a second, different model.
  if (latencyMs !== 0) fail('latencyMs', 'must be 0 with option capacity (the GPU model sets the timing)', latencyMs);
  if (tokensPerSecond !== 0)
    fail('tokensPerSecond', 'must be 0 with option capacity (the GPU model sets the timing)', tokensPerSecond);
  const profile = (value as CapacityOptions).profile ?? GPU_DEFAULTS.profile;
  if (!GPU_PROFILE_NAMES.includes(profile))
    fail('capacity.profile', `must be one of ${GPU_PROFILE_NAMES.join(', ')}`, profile);
  // The profile's cost knobs, then each knob given.
  const c = { ...GPU_DEFAULTS, ...GPU_PROFILES[profile], profile } as Record<string, unknown>;
  for (const [key, v] of Object.entries(value)) if (v !== undefined) c[key] = v;
  const resolved = {
    profile,
    slots: integer('capacity.slots', c.slots, 1, 65_536),
    decodeMs: finite('capacity.decodeMs', c.decodeMs, 0.001, 60_000),
    decodeMsPerSeq: finite('capacity.decodeMsPerSeq', c.decodeMsPerSeq, 0, 60_000),
    decodeMsPerKvToken: finite('capacity.decodeMsPerKvToken', c.decodeMsPerKvToken, 0, 1_000),
    prefillTokensPerSecond: finite('capacity.prefillTokensPerSecond', c.prefillTokensPerSecond, 1, 1e9),
    prefillChunkTokens: integer('capacity.prefillChunkTokens', c.prefillChunkTokens, 1, 1 << 24),
    prefixCacheTokens: integer('capacity.prefixCacheTokens', c.prefixCacheTokens, 0, 1 << 30),
    responseTokens:
      c.responseTokens === null ? null : integer('capacity.responseTokens', c.responseTokens, 1, MAX_RESPONSE_TOKENS),
    lengthSigma: finite('capacity.lengthSigma', c.lengthSigma, 0, 4),
    speedup: finite('capacity.speedup', c.speedup, 0.001, 1_000),
    scheduling: oneOf('capacity.scheduling', c.scheduling, ['fcfs', 'priority'] as const),
  };
  return Object.freeze(resolved);
}

function boolean(name: string, value: unknown): boolean {
  if (typeof value !== 'boolean') fail(name, 'must be a boolean', value);
  return value;
}

/** A built-in vocabulary by name, or a directory holding tokenizer.json and tokenizer_config.json. */
function tokenizer(value: unknown): MockTokenizer {
  if (
    typeof value === 'string' &&
    ((MOCK_TOKENIZERS as readonly string[]).includes(value) || /[\\/]/.test(value) || value.startsWith('.'))
  )
    return value;
  throw new RolloutEngineError(
    'ERR_INVALID_OPTION',
    `mock-llm: option tokenizer must be one of ${MOCK_TOKENIZERS.join(', ')} (got ${show(value)}), or a tokenizer directory path (one with a / in it)`,
  );
}

/** The weight version a string-versioned dialect reports: SGLang's ServerArgs.weight_version defaults to "default". */
function versionLabel(value: unknown): string {
  if (value === undefined) return 'default';
  if (typeof value === 'string' && value.length > 0) return value;
  return String(validateWeightVersion(value, 'option weightVersion'));
}

/** Weight versions are non-negative integers, like a trainer's step counter. */
export function validateWeightVersion(value: unknown, name = 'weight_version'): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0) {
    throw new RolloutEngineError(
      'ERR_INVALID_OPTION',
      `mock-llm: ${name} must be a non-negative integer (got ${show(value)})`,
    );
  }
  return value;
}

/**
 * Gateway options: defaults and validation in one place. Errors (ERR_INVALID_CONFIG) name the option
 * and the value, since these come from CLI flags as often as from code.
 */
import { ConfigError, preview } from '../errors.ts';
import { BACKEND_DEFAULTS, type BackendOptions } from './backend.ts';
import type { SideCallMode } from './prompt.ts';
import type { RoutingShape } from '../llm/routing-wire.ts';
import type { ReleaseReason } from './sessions.ts';

export interface GatewayOptions {
  /** The token-in backend (`model` defaults to the gateway's `model`, or none when that is unset). */
  backend: BackendOptions;
  /** Interface to listen on (default 127.0.0.1). */
  host?: string;
  /** TCP port; 0 picks a free one (read it back from `Gateway.port`). */
  port?: number;
  /** Tokenizer + chat template: a built-in name (`qwen2.5`) or a directory with tokenizer.json and tokenizer_config.json. */
  tokenizer?: string;
  /** Model id served on /v1/models and echoed in replies (default: the tokenizer name). */
  model?: string | null;
  /** Context window in tokens: prompt + completion never exceed it (default: the tokenizer's model_max_length, capped at 32768). */
  maxContext?: number | null;
  /** Completion budget when a request names none; null = the rest of the context. */
  defaultMaxTokens?: number | null;
  /** A session idle this long is released with its traces (ms). */
  sessionTtlMs?: number;
  /** Live sessions at most; more get 429. */
  maxSessions?: number;
  /** Weight version recorded for calls whose backend reports none; `setModelStep` changes it. */
  modelStep?: number;
  /**
   * The backend's name for the weights of `modelStep` (its weight version at start), taken as
   * announced: a reply naming it keeps that step after `setModelStep` names later weights.
   */
  weightVersion?: string | null;
  /**
   * Whether `modelStep` is the newest weights there are (a trainer's step, as under the engine): a
   * whole-number version naming a newer step is then a mismatch, as in the workers, rather than that
   * step. Default false: `modelStep` only labels replies without a version.
   */
  modelStepIsNewest?: boolean;
  /**
   * Called for each reply whose weight version is not the weights served when the call went out
   * (none announced, or older ones), with the step expected and the step its tokens are tagged
   * with; counted in `stats().weightVersionMismatches` either way.
   */
  onVersionMismatch?: ((version: string, expected: number, tagged: number) => void) | null;
  maxBodyBytes?: number;
  /**
   * A call that does not extend its session's conversation: `record` (default) generates it and keeps
   * it as a side call of the session, a sample of its own; `refuse` answers 400 ERR_GATEWAY_PREFIX_MISMATCH.
   */
  sideCalls?: SideCallMode;
  /** Side calls one session keeps at most (each holds its own prompt ids); one more is refused. */
  maxSideCalls?: number;
  /** Called whenever a session's traces are dropped, with why (metrics, or waiting for a TTL in tests). */
  onSessionReleased?: ((sessionId: string, reason: ReleaseReason) => void) | null;
  /**
   * Routing replay (docs/ROUTING-REPLAY.md), as `llm.routedExperts`: ask the backend for the experts
   * each token was routed to and lay them on the stitched sample. `true` takes the shape from the
   * reply (vLLM's `.npy`); SGLang sends none, so it needs `{layers, topK}`. Default false.
   */
  routedExperts?: boolean | RoutingShape;
  /**
   * As `llm.samplingMasks`: ask SGLang for each sampled token's support, for calls whose sampling
   * truncates it (top_k, top_p < 1 or min_p); the support of an untruncated call is the vocabulary.
   */
  samplingMasks?: boolean;
}

export interface ResolvedGatewayOptions {
  backend: Required<Omit<GatewayOptions['backend'], 'completeTokenId' | 'routingShape'>>;
  host: string;
  port: number;
  tokenizer: string;
  model: string | null;
  maxContext: number | null;
  defaultMaxTokens: number | null;
  sessionTtlMs: number;
  maxSessions: number;
  modelStep: number;
  weightVersion: string | null;
  modelStepIsNewest: boolean;
  onVersionMismatch: ((version: string, expected: number, tagged: number) => void) | null;
  maxBodyBytes: number;
  sideCalls: SideCallMode;
  maxSideCalls: number;
  onSessionReleased: ((sessionId: string, reason: ReleaseReason) => void) | null;
  /** Routed experts asked for, shaped by `shape` where the backend sends none; null = not asked. */
  routedExperts: { shape: RoutingShape | null } | null;
  samplingMasks: boolean;
}

export const GATEWAY_DEFAULTS = Object.freeze({
  host: '127.0.0.1',
  port: 0,
  tokenizer: 'qwen2.5',
  sessionTtlMs: 10 * 60_000,
  maxSessions: 10_000,
  modelStep: 0,
  maxBodyBytes: 16 * 1024 * 1024,
  sideCalls: 'record' as SideCallMode,
  // Each side call holds up to a context of prompt ids (128 KiB at 32k tokens): 32 MiB a session at worst.
  maxSideCalls: 256,
  backendTimeoutMs: BACKEND_DEFAULTS.timeoutMs,
  backendConnections: BACKEND_DEFAULTS.connections,
});

/** Default context when the tokenizer config names none, and the cap on model_max_length (Qwen says 131072). */
export const DEFAULT_MAX_CONTEXT = 32_768;

const KNOWN = [
  'backend',
  'host',
  'port',
  'tokenizer',
  'model',
  'maxContext',
  'defaultMaxTokens',
  'sessionTtlMs',
  'maxSessions',
  'modelStep',
  'weightVersion',
  'modelStepIsNewest',
  'onVersionMismatch',
  'maxBodyBytes',
  'sideCalls',
  'maxSideCalls',
  'onSessionReleased',
  'routedExperts',
  'samplingMasks',
];
const KNOWN_BACKEND = ['kind', 'url', 'model', 'apiKey', 'timeoutMs', 'connections'];

function fail(name: string, rule: string, value: unknown): never {
  throw new ConfigError([`gateway.${name}: ${rule} (got ${preview(value)})`]);
}

function integer(name: string, value: unknown, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min || value > max)
    fail(name, `must be an integer in [${min}, ${max}]`, value);
  return value;
}

function text(name: string, value: unknown): string {
  if (typeof value !== 'string' || value.length === 0) fail(name, 'must be a non-empty string', value);
  return value;
}

function oneOf<T extends string>(name: string, value: unknown, allowed: readonly T[]): T {
  if (!allowed.includes(value as T)) fail(name, `must be ${allowed.map((a) => JSON.stringify(a)).join(' or ')}`, value);
  return value as T;
}

function flag(name: string, value: unknown): boolean {
  if (typeof value !== 'boolean') fail(name, 'must be true or false', value);
  return value;
}

function callback<T>(name: string, value: T): T {
  if (typeof value !== 'function') fail(name, 'must be a function', value);
  return value;
}

function unknownKeys(where: string, obj: object, known: string[]): void {
  for (const key of Object.keys(obj)) {
    if (!known.includes(key))
      throw new ConfigError([`gateway.${where}${key}: unknown option (known: ${known.join(', ')})`]);
  }
}

export function resolveGatewayOptions(options: GatewayOptions): ResolvedGatewayOptions {
  if (typeof options !== 'object' || options === null) fail('(options)', 'must be an object', options);
  unknownKeys('', options, KNOWN);
  const b = options.backend;
  if (typeof b !== 'object' || b === null) fail('backend', 'must be an object {kind, url}', b);
  unknownKeys('backend.', b, KNOWN_BACKEND);
  if (b.kind !== 'vllm' && b.kind !== 'sglang' && b.kind !== 'llamacpp')
    fail('backend.kind', 'must be "vllm", "sglang" or "llamacpp"', b.kind);
  const url = text('backend.url', b.url);
  if (!/^https?:\/\//.test(url)) fail('backend.url', 'must be an http(s) URL', url);
  const model = options.model === undefined || options.model === null ? null : text('model', options.model);
  return {
    backend: {
      kind: b.kind,
      url,
      model: b.model === undefined ? model : b.model === null ? null : text('backend.model', b.model),
      apiKey: b.apiKey ?? null,
      timeoutMs: integer('backend.timeoutMs', b.timeoutMs ?? GATEWAY_DEFAULTS.backendTimeoutMs, 1),
      connections: integer('backend.connections', b.connections ?? GATEWAY_DEFAULTS.backendConnections, 1, 100_000),
    },
    host: text('host', options.host ?? GATEWAY_DEFAULTS.host),
    port: integer('port', options.port ?? GATEWAY_DEFAULTS.port, 0, 65535),
    tokenizer: text('tokenizer', options.tokenizer ?? GATEWAY_DEFAULTS.tokenizer),
    model,
    maxContext:
      options.maxContext === undefined || options.maxContext === null
        ? null
        : integer('maxContext', options.maxContext, 2),
    defaultMaxTokens:
      options.defaultMaxTokens === undefined || options.defaultMaxTokens === null
        ? null
        : integer('defaultMaxTokens', options.defaultMaxTokens, 1),
    sessionTtlMs: integer('sessionTtlMs', options.sessionTtlMs ?? GATEWAY_DEFAULTS.sessionTtlMs, 1, 2 ** 31 - 1),
    maxSessions: integer('maxSessions', options.maxSessions ?? GATEWAY_DEFAULTS.maxSessions, 1),
    modelStep: integer('modelStep', options.modelStep ?? GATEWAY_DEFAULTS.modelStep, 0),
    weightVersion:
      options.weightVersion === undefined || options.weightVersion === null
        ? null
        : text('weightVersion', options.weightVersion),
    modelStepIsNewest: flag('modelStepIsNewest', options.modelStepIsNewest ?? false),
    onVersionMismatch:
      options.onVersionMismatch === undefined || options.onVersionMismatch === null
        ? null
        : callback('onVersionMismatch', options.onVersionMismatch),
    maxBodyBytes: integer('maxBodyBytes', options.maxBodyBytes ?? GATEWAY_DEFAULTS.maxBodyBytes, 1024),
    sideCalls: oneOf('sideCalls', options.sideCalls ?? GATEWAY_DEFAULTS.sideCalls, ['record', 'refuse'] as const),
    maxSideCalls: integer('maxSideCalls', options.maxSideCalls ?? GATEWAY_DEFAULTS.maxSideCalls, 1),
    onSessionReleased:
      options.onSessionReleased === undefined || options.onSessionReleased === null
        ? null
        : callback('onSessionReleased', options.onSessionReleased),
    routedExperts: routing(options.routedExperts ?? false),
    samplingMasks: flag('samplingMasks', options.samplingMasks ?? false),
  };
}

function routing(value: unknown): { shape: RoutingShape | null } | null {
  if (value === false) return null;
  if (value === true) return { shape: null };
  if (typeof value !== 'object' || value === null)
    fail('routedExperts', 'must be true, false or {layers, topK}', value);
  unknownKeys('routedExperts.', value, ['layers', 'topK']);
  const shape = value as Partial<RoutingShape>;
  return {
    shape: {
      layers: integer('routedExperts.layers', shape.layers, 1, 4096),
      topK: integer('routedExperts.topK', shape.topK, 1, 4096),
    },
  };
}

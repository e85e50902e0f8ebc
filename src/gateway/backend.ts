/**
 * Token-in / token-out inference client: the gateway sends prompt ids and gets completion ids and
 * their logprobs back, so no text is ever re-tokenised between the policy and the trace.
 *
 * Two wire shapes, picked by `kind`:
 * - `vllm`: `POST /v1/completions {model, prompt: number[], max_tokens, temperature, logprobs: k,
 *   return_token_ids: true, seed?}` → `choices[0].token_ids`, `choices[0].logprobs.token_logprobs`,
 *   `choices[0].finish_reason`, and `metadata.weight_version` where the server reports one;
 * - `sglang`: `POST /generate {input_ids, sampling_params, return_logprob: true}` → `output_ids`,
 *   `meta_info.output_token_logprobs` ([logprob, id, text] per token), `meta_info.finish_reason`
 *   (`{type}` or a string) and `meta_info.weight_version`.
 *
 * No retries here: the agent's own OpenAI client retries the gateway's 5xx, and two retry layers
 * multiply. One undici Pool per backend origin; keep-alive is what keeps the per-call cost small.
 */
import { Pool } from 'undici';
import { TRANSPORT_ERROR_CODES } from '../llm/client.ts';
import { ConfigError, serverMessage } from '../protocol/errors.ts';
import { GatewayError } from './errors.ts';
import { GATEWAY_DEFAULTS } from './options.ts';

export type BackendKind = 'vllm' | 'sglang';

export interface BackendOptions {
  kind: BackendKind;
  /** Base URL of the server, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is accepted for vLLM). */
  url: string;
  /** Model name sent to vLLM (`model`); null = the server's default model. */
  model?: string | null;
  apiKey?: string | null;
  /** Whole-request budget (generation included), ms. */
  timeoutMs?: number;
  connections?: number;
}

/** Sampling settings an agent may send and a backend honours; unset = the backend's default. */
export interface SamplingParams {
  temperature?: number;
  topP?: number;
  topK?: number;
  minP?: number;
  presencePenalty?: number;
  frequencyPenalty?: number;
  repetitionPenalty?: number;
  seed?: number;
  stop?: string[];
}

const SAMPLING_PARAMS = ['temperature', 'topP', 'topK', 'minP', 'presencePenalty', 'frequencyPenalty', 'repetitionPenalty', 'seed', 'stop'] as const satisfies readonly (keyof SamplingParams)[];

/** The sampling settings of anything that carries them (a parsed chat request). */
export function samplingParamsOf(source: SamplingParams): SamplingParams {
  const params: SamplingParams = {};
  for (const key of SAMPLING_PARAMS) (params as Record<string, unknown>)[key] = source[key];
  return params;
}

export interface SamplingRequest extends SamplingParams {
  promptIds: readonly number[];
  maxTokens: number;
  /** Alternatives per position to return besides the sampled token (OpenAI top_logprobs); 0 = none. */
  topLogprobs: number;
}

export interface TopLogprob {
  token: string | null;
  tokenId: number | null;
  logprob: number;
}

export interface GenerationResult {
  completionIds: number[];
  /** Logprob of each sampled token; same length as completionIds. */
  logprobs: number[];
  /** Per position, when alternatives were asked for and the server sent them. */
  topLogprobs: TopLogprob[][] | null;
  finishReason: string;
  /** The weight version the server reports for this generation, null when it reports none. */
  weightVersion: number | null;
}

export interface TokenBackend {
  readonly kind: BackendKind;
  /** Full URL of the generate endpoint, for messages. */
  readonly endpoint: string;
  generate(request: SamplingRequest, signal?: AbortSignal): Promise<GenerationResult>;
  close(): Promise<void>;
}

export function createTokenBackend(options: BackendOptions): TokenBackend {
  if (options.kind !== 'vllm' && options.kind !== 'sglang') {
    throw new ConfigError([`backend.kind: must be "vllm" or "sglang" (got ${JSON.stringify(options.kind)})`]);
  }
  let base: URL;
  try {
    base = new URL(options.url);
  } catch {
    throw new ConfigError([`backend.url: must be an http(s) URL (got ${JSON.stringify(options.url)})`]);
  }
  const timeoutMs = options.timeoutMs ?? GATEWAY_DEFAULTS.backendTimeoutMs;
  const prefix = base.pathname.replace(/\/+$/, '').replace(/\/v1$/, '');
  const path = options.kind === 'vllm' ? `${prefix}/v1/completions` : `${prefix}/generate`;
  const endpoint = `${base.origin}${path}`;
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (options.apiKey) headers.authorization = `Bearer ${options.apiKey}`;
  const pool = new Pool(base.origin, {
    connections: options.connections ?? GATEWAY_DEFAULTS.backendConnections,
    // A non-streaming generation sends headers only when it is done: both timeouts are the request
    // budget, so no timer or composite signal is needed per call (as in llm/client.ts).
    headersTimeout: timeoutMs,
    bodyTimeout: timeoutMs,
    keepAliveTimeout: 60_000,
  });
  const encodeBody = options.kind === 'vllm' ? (r: SamplingRequest) => vllmBody(r, options.model ?? null) : sglangBody;
  const parse = options.kind === 'vllm' ? parseVllm : parseSglang;

  return {
    kind: options.kind,
    endpoint,
    async generate(request, signal) {
      let status: number;
      let text: string;
      try {
        const response = await pool.request({ method: 'POST', path, headers, body: JSON.stringify(encodeBody(request)), signal });
        status = response.statusCode;
        text = await response.body.text();
      } catch (err) {
        const code = (err as { code?: string }).code ?? (err as Error).name;
        if (signal?.aborted) throw new GatewayError('ERR_BACKEND_ABORTED', `backend call to ${endpoint} cancelled: ${String(signal.reason instanceof Error ? signal.reason.message : signal.reason)}`, { cause: err });
        if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') {
          throw new GatewayError('ERR_BACKEND_TIMEOUT', `backend ${endpoint} did not answer within ${timeoutMs} ms (backend.timeoutMs)`, { cause: err });
        }
        const hint = TRANSPORT_ERROR_CODES.has(code) ? ' (is the backend running? check --backend-url)' : '';
        throw new GatewayError('ERR_BACKEND_UNREACHABLE', `backend ${endpoint} unreachable: ${code} ${(err as Error).message}${hint}`, { cause: err });
      }
      if (status !== 200) {
        // A 4xx is about the request (vLLM's own context check, a bad sampling value): the agent
        // should see it as its own error, not as a gateway fault.
        const passOn = status >= 400 && status < 500 && status !== 404 && status !== 405;
        throw new GatewayError('ERR_BACKEND_HTTP', `backend ${endpoint} answered ${status}: ${serverMessage(text)}`, { status: passOn ? status : 502, details: { backend_status: status } });
      }
      let json: unknown;
      try {
        json = JSON.parse(text);
      } catch {
        throw badReply(endpoint, `the body is not JSON: ${JSON.stringify(text.slice(0, 80))}`);
      }
      return parse(json, endpoint);
    },
    close: () => pool.close(),
  };
}

function vllmBody(r: SamplingRequest, model: string | null): Record<string, unknown> {
  return {
    ...(model !== null ? { model } : {}),
    prompt: r.promptIds,
    max_tokens: r.maxTokens,
    // The sampled token's logprob is always needed for the trace; alternatives only when asked.
    logprobs: Math.max(1, r.topLogprobs),
    return_token_ids: true,
    // The completion is decoded from ids by the gateway: text-side trimming must not drop tokens.
    include_stop_str_in_output: true,
    ...(r.temperature !== undefined ? { temperature: r.temperature } : {}),
    ...(r.topP !== undefined ? { top_p: r.topP } : {}),
    ...(r.topK !== undefined ? { top_k: r.topK } : {}),
    ...(r.minP !== undefined ? { min_p: r.minP } : {}),
    ...(r.presencePenalty !== undefined ? { presence_penalty: r.presencePenalty } : {}),
    ...(r.frequencyPenalty !== undefined ? { frequency_penalty: r.frequencyPenalty } : {}),
    ...(r.repetitionPenalty !== undefined ? { repetition_penalty: r.repetitionPenalty } : {}),
    ...(r.seed !== undefined ? { seed: r.seed } : {}),
    ...(r.stop !== undefined ? { stop: r.stop } : {}),
  };
}

function sglangBody(r: SamplingRequest): Record<string, unknown> {
  const sampling: Record<string, unknown> = { max_new_tokens: r.maxTokens, no_stop_trim: true };
  if (r.temperature !== undefined) sampling.temperature = r.temperature;
  if (r.topP !== undefined) sampling.top_p = r.topP;
  if (r.topK !== undefined) sampling.top_k = r.topK;
  if (r.minP !== undefined) sampling.min_p = r.minP;
  if (r.presencePenalty !== undefined) sampling.presence_penalty = r.presencePenalty;
  if (r.frequencyPenalty !== undefined) sampling.frequency_penalty = r.frequencyPenalty;
  if (r.repetitionPenalty !== undefined) sampling.repetition_penalty = r.repetitionPenalty;
  if (r.seed !== undefined) sampling.sampling_seed = r.seed;
  if (r.stop !== undefined) sampling.stop = r.stop;
  return {
    input_ids: r.promptIds,
    sampling_params: sampling,
    return_logprob: true,
    ...(r.topLogprobs > 0 ? { top_logprobs_num: r.topLogprobs } : {}),
  };
}

function badReply(endpoint: string, why: string): GatewayError {
  return new GatewayError('ERR_BACKEND_BAD_REPLY', `backend ${endpoint} reply unusable: ${why}`);
}

function isTokenIds(value: unknown): value is number[] {
  return Array.isArray(value) && value.every((v) => Number.isSafeInteger(v) && (v as number) >= 0);
}

/** Integer weight versions only: SGLang's default version is the string "default", which means "none". */
function weightVersionOf(value: unknown): number | null {
  if (typeof value === 'number' && Number.isSafeInteger(value)) return value;
  if (typeof value === 'string' && /^-?\d+$/.test(value)) return Number(value);
  return null;
}

function parseVllm(json: unknown, endpoint: string): GenerationResult {
  const reply = json as { choices?: unknown; metadata?: { weight_version?: unknown } | null } | null;
  const choice = (Array.isArray(reply?.choices) ? reply.choices[0] : undefined) as
    | { token_ids?: unknown; logprobs?: { token_logprobs?: unknown; top_logprobs?: unknown } | null; finish_reason?: unknown }
    | undefined;
  if (typeof choice !== 'object' || choice === null) throw badReply(endpoint, 'no choices[0]');
  if (!isTokenIds(choice.token_ids)) {
    throw badReply(endpoint, `choices[0].token_ids must be an array of token ids (got ${typeof choice.token_ids}); vLLM needs return_token_ids support (>= 0.10.2)`);
  }
  const ids = choice.token_ids;
  const logprobs = choice.logprobs?.token_logprobs;
  if (!Array.isArray(logprobs) || logprobs.length !== ids.length || !logprobs.every((v) => typeof v === 'number')) {
    throw badReply(endpoint, `choices[0].logprobs.token_logprobs must hold one number per token (${ids.length} tokens, got ${Array.isArray(logprobs) ? `${logprobs.length} entries` : typeof logprobs})`);
  }
  if (typeof choice.finish_reason !== 'string') throw badReply(endpoint, `choices[0].finish_reason must be a string (got ${JSON.stringify(choice.finish_reason)})`);
  let top: TopLogprob[][] | null = null;
  const rawTop = choice.logprobs?.top_logprobs;
  if (Array.isArray(rawTop) && rawTop.length === ids.length) {
    // vLLM keys alternatives by token text: ids are unknown, and text is ambiguous for partial bytes.
    top = rawTop.map((entry) =>
      typeof entry === 'object' && entry !== null ? Object.entries(entry as Record<string, number>).map(([token, logprob]) => ({ token, tokenId: null, logprob })) : [],
    );
  }
  return { completionIds: ids, logprobs: logprobs as number[], topLogprobs: top, finishReason: choice.finish_reason, weightVersion: weightVersionOf(reply?.metadata?.weight_version) };
}

function parseSglang(json: unknown, endpoint: string): GenerationResult {
  const reply = (Array.isArray(json) ? json[0] : json) as { output_ids?: unknown; meta_info?: Record<string, unknown> } | null;
  if (typeof reply !== 'object' || reply === null) throw badReply(endpoint, 'the body is not an object');
  if (!isTokenIds(reply.output_ids)) throw badReply(endpoint, `output_ids must be an array of token ids (got ${typeof reply.output_ids})`);
  const ids = reply.output_ids;
  const meta = reply.meta_info ?? {};
  const entries = meta.output_token_logprobs;
  if (!Array.isArray(entries) || entries.length !== ids.length) {
    throw badReply(endpoint, `meta_info.output_token_logprobs must hold one [logprob, id, text] per token (${ids.length} tokens, got ${Array.isArray(entries) ? `${entries.length} entries` : typeof entries})`);
  }
  const logprobs = new Array<number>(ids.length);
  for (let i = 0; i < ids.length; i++) {
    const e = entries[i] as unknown[];
    if (!Array.isArray(e) || typeof e[0] !== 'number') throw badReply(endpoint, `meta_info.output_token_logprobs[${i}] must be [logprob, id, text] (got ${JSON.stringify(e)})`);
    if (e[1] !== undefined && e[1] !== null && e[1] !== ids[i]) throw badReply(endpoint, `meta_info.output_token_logprobs[${i}] is for token ${String(e[1])} but output_ids[${i}] is ${ids[i]}`);
    logprobs[i] = e[0];
  }
  const finish = meta.finish_reason as { type?: unknown } | string | null | undefined;
  const finishReason = typeof finish === 'string' ? finish : typeof finish?.type === 'string' ? finish.type : null;
  if (finishReason === null) throw badReply(endpoint, `meta_info.finish_reason must be a string or {type} (got ${JSON.stringify(finish)})`);
  let top: TopLogprob[][] | null = null;
  const rawTop = meta.output_top_logprobs;
  if (Array.isArray(rawTop) && rawTop.length === ids.length) {
    top = rawTop.map((row) =>
      Array.isArray(row)
        ? (row as unknown[][]).map((e) => ({ logprob: Number(e[0]), tokenId: typeof e[1] === 'number' ? e[1] : null, token: typeof e[2] === 'string' ? e[2] : null }))
        : [],
    );
  }
  return { completionIds: ids, logprobs, topLogprobs: top, finishReason, weightVersion: weightVersionOf(meta.weight_version) };
}


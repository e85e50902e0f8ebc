/**
 * Token-in / token-out wire shapes of each inference server: the request body for a prompt given as
 * token ids, and the reply read back into completion ids with their logprobs. Shared by the gateway's
 * backend (gateway/backend.ts) and the engine's `llm.api: tokens` (llm/client.ts), so each server's
 * shape is written once.
 *
 * - vLLM `POST /v1/completions {model, prompt: number[], max_tokens, logprobs: k, return_token_ids}` →
 *   `choices[0].token_ids`, `choices[0].logprobs.token_logprobs`, `choices[0].finish_reason`
 *   (vllm/entrypoints/openai/serving_completion.py);
 * - SGLang `POST /generate {input_ids, sampling_params, return_logprob}` → `output_ids`,
 *   `meta_info.output_token_logprobs` ([logprob, id, text] per token), `meta_info.finish_reason`
 *   (`{type}`), `meta_info.weight_version` (python/sglang/srt/entrypoints/http_server.py generate_request);
 * - llama.cpp `POST /completion {prompt: number[], n_predict, n_probs, return_tokens}` → `tokens`,
 *   `completion_probabilities[]` (`id`, `logprob`), `stop_type` (`eos` | `limit` | `word` | `none`),
 *   `tokens_evaluated` (tools/server/server-task.cpp: stop_type_to_str, probs_vector_to_json).
 */

import type { VersionSpan } from './reply.ts';
import type { RoutedExperts, SamplingMask } from '../domain/routing.ts';
import { readSglangMask, readSglangRouted, readVllmReplyRouted, type RoutingShape } from './routing-wire.ts';

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

export interface SamplingRequest extends SamplingParams {
  promptIds: readonly number[] | Int32Array;
  maxTokens: number;
  /** Alternatives per position to return besides the sampled token (OpenAI top_logprobs); 0 = none. */
  topLogprobs: number;
  /** Routed experts wanted from this sequence position on (vLLM `routed_experts_prompt_start`, SGLang `routed_experts_start_len`); absent = not asked. */
  routedFrom?: number;
  /** SGLang's sampling support per token (`return_sampling_mask`). */
  samplingMask?: boolean;
}

/** What a reply is read with besides its own body: where its routed rows start and their shape where the server sends none. */
export interface ReadContext {
  routedFrom: number | null;
  routingShape: RoutingShape | null;
  samplingMask: boolean;
}

const NOTHING_ASKED: ReadContext = { routedFrom: null, routingShape: null, samplingMask: false };

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
  /** `stop`, `length` or `abort` (each server's own words mapped to these where they differ). */
  finishReason: string;
  /** The weight version the server reports for this generation (as text), null when it reports none. */
  weightVersion: string | null;
  /** Positions whose logprob the server left out (llama.cpp: a token ending inside a UTF-8 character); NaN there. */
  missingLogprobs?: number[];
  /** Which weights sampled which tokens, from a streamed reply (llm/generate-stream.ts); see ChatResult.versionSpans. */
  versionSpans?: VersionSpan[];
  /** Routed experts of `promptIds ++ completionIds`, when asked and sent. */
  routedExperts?: RoutedExperts;
  /** Sampling support per completion token, when asked and sent. */
  samplingMask?: SamplingMask;
}

export type TokenWireKind = 'vllm' | 'sglang' | 'llamacpp';

export interface TokenWire {
  /** Path after the server's base (no `/v1` prefix handling here: the route is absolute). */
  path: '/v1/completions' | '/generate' | '/completion';
  body(request: SamplingRequest, model: string | null): Record<string, unknown>;
  /** The reply, or an error made by `fail` naming what is wrong. */
  parse(json: unknown, fail: (why: string) => Error, context?: ReadContext): GenerationResult;
}

export const TOKEN_WIRES: Record<TokenWireKind, TokenWire> = {
  vllm: { path: '/v1/completions', body: vllmBody, parse: parseVllm },
  sglang: { path: '/generate', body: (r) => sglangBody(r), parse: parseSglang },
  llamacpp: { path: '/completion', body: (r) => llamacppBody(r), parse: parseLlamacpp },
};

/** Plain arrays for JSON.stringify (an Int32Array would serialise as an object). */
function ids(promptIds: readonly number[] | Int32Array): readonly number[] {
  return promptIds instanceof Int32Array ? Array.from(promptIds) : promptIds;
}

/** Each server's name for each sampling setting (SGLang: `sampling_seed`; llama.cpp: `repeat_penalty`). */
type SamplingNames = Record<keyof SamplingParams, string>;
const OPENAI_NAMES: SamplingNames = {
  temperature: 'temperature',
  topP: 'top_p',
  topK: 'top_k',
  minP: 'min_p',
  presencePenalty: 'presence_penalty',
  frequencyPenalty: 'frequency_penalty',
  repetitionPenalty: 'repetition_penalty',
  seed: 'seed',
  stop: 'stop',
};
const SGLANG_NAMES: SamplingNames = { ...OPENAI_NAMES, seed: 'sampling_seed' };
const LLAMACPP_NAMES: SamplingNames = { ...OPENAI_NAMES, repetitionPenalty: 'repeat_penalty' };

/**
 * The settings besides temperature that reshape the distribution a token is sampled from: truncation
 * (top-p, top-k, min-p) and penalties. A task may set them (`tasks[].topP`, …), and the batch records
 * what it set (`group.sampling`); every one left unset is sent at the server's neutral value, so that
 * the distribution sampled from is the model's own at the temperature — a server's default is not:
 * - llama.cpp samples with top_k 40, top_p 0.95, min_p 0.05 unless the request says otherwise, or what
 *   its flags or the model's GGUF `general.sampling.*` keys say (common/common.h common_params_sampling;
 *   common/common.cpp common_init_sampler_from_model; llama.cpp de3ff815ea7d559ee917f063901b8986f038abc6);
 * - vLLM fills an unset top_k, top_p, min_p and repetition_penalty from the model's
 *   generation_config.json (`--generation-config auto`, its default: vllm/config/model.py
 *   get_diff_sampling_param @0052a5b818980ce8a0477706aaf9f75bd5af72cd) — Qwen2.5-Instruct's is top_p 0.8,
 *   top_k 20, repetition_penalty 1.05;
 * - SGLang does the same with `--sampling-defaults model`, its default (python/sglang/srt/server_args.py),
 *   and with `--preferred-sampling-params`.
 */
export const SHAPING_KEYS = [
  'topP',
  'topK',
  'minP',
  'repetitionPenalty',
  'presencePenalty',
  'frequencyPenalty',
] as const;
export type SamplingSettings = Pick<SamplingParams, (typeof SHAPING_KEYS)[number]>;
const OTHER_KEYS = ['temperature', 'seed', 'stop'] as const satisfies readonly (keyof SamplingParams)[];

/** A server whose sampling names and neutral values are known: a token wire's, or the plain OpenAI API's (chat). */
export type SamplingDialect = TokenWireKind | 'openai';

const NAMES: Record<SamplingDialect, SamplingNames> = {
  vllm: OPENAI_NAMES,
  sglang: SGLANG_NAMES,
  llamacpp: LLAMACPP_NAMES,
  openai: OPENAI_NAMES,
};

/** What "off" is on each server, for each shaping setting. */
const NEUTRAL: Record<SamplingDialect, Required<SamplingSettings> | null> = {
  // vllm/sampling_params.py SamplingParams (@00388f6573ccfcffad607b8c9ecdf341a4669ceb): top_k 0 or -1 is
  // every token ("quietly accept -1 as disabled"); releases before 0.7 refuse 0, so -1.
  vllm: { topP: 1, topK: -1, minP: 0, repetitionPenalty: 1, presencePenalty: 0, frequencyPenalty: 0 },
  // python/sglang/srt/sampling/sampling_params.py (@0bebedd800a35ae29a9adeab6617605970d724bd): top_k -1
  // is the whole vocabulary; 0 is refused ("top_k must be -1 (disable) or at least 1").
  sglang: { topP: 1, topK: -1, minP: 0, repetitionPenalty: 1, presencePenalty: 0, frequencyPenalty: 0 },
  // tools/server/server-schema.cpp make_llama_cmpl_schema: top_k 0 = disabled (limits 0..INT32_MAX),
  // top_p 1.0, min_p 0, repeat_penalty 1.0, frequency/presence 0 = disabled.
  llamacpp: { topP: 1, topK: 0, minP: 0, repetitionPenalty: 1, presencePenalty: 0, frequencyPenalty: 0 },
  // The OpenAI API's own defaults are neutral (top_p 1, penalties 0), some of its models refuse top_p, and
  // it has no top_k, min_p or repetition_penalty: only what the task sets is sent (and a task that sets
  // one it lacks is refused at start: llm/servers.ts unhonouredSampling).
  openai: null,
};

/**
 * llama.cpp's samplers that no task setting names, kept out of the chain. `samplers` lists the chain
 * (common/sampling.cpp common_sampler_init builds it from that list), in llama.cpp's default order
 * minus DRY, top-n-sigma, typical-p and XTC: those are then off whatever the server's flags or the
 * model's `general.sampling.sequence` say, and adaptive-p too (added only when listed). Mirostat 1 or 2
 * replaces the whole chain; a dynamic temperature range makes each token's temperature depend on the
 * distribution's entropy (llama_sampler_init_temp_ext).
 */
const LLAMACPP_CHAIN = Object.freeze({
  samplers: Object.freeze(['penalties', 'top_k', 'top_p', 'min_p', 'temperature']),
  mirostat: 0,
  dynatemp_range: 0,
});

/**
 * The sampling fields of a request to `dialect`, under its names, into `out`: every setting `r` sets,
 * and each shaping setting it leaves unset at the server's neutral value (see SHAPING_KEYS).
 */
export function samplingFields(
  dialect: SamplingDialect,
  r: SamplingParams,
  out: Record<string, unknown> = {},
): Record<string, unknown> {
  const names = NAMES[dialect];
  const neutral = NEUTRAL[dialect];
  for (const key of OTHER_KEYS) if (r[key] !== undefined) out[names[key]] = r[key];
  for (const key of SHAPING_KEYS) {
    const value = r[key] ?? neutral?.[key];
    if (value !== undefined) out[names[key]] = value;
  }
  if (dialect === 'llamacpp') Object.assign(out, LLAMACPP_CHAIN);
  return out;
}

function vllmBody(r: SamplingRequest, model: string | null): Record<string, unknown> {
  const body: Record<string, unknown> = {
    ...(model !== null ? { model } : {}),
    prompt: ids(r.promptIds),
    max_tokens: r.maxTokens,
    // The sampled token's logprob is always needed for the trace; alternatives only when asked.
    logprobs: Math.max(1, r.topLogprobs),
    return_token_ids: true,
    // The completion is decoded from ids by the caller: text-side trimming must not drop tokens.
    include_stop_str_in_output: true,
  };
  // Routed experts are sent whenever the server has them on; the request only skips prompt rows.
  if (r.routedFrom !== undefined && r.routedFrom > 0) body.routed_experts_prompt_start = r.routedFrom;
  return samplingFields('vllm', r, body);
}

function sglangBody(r: SamplingRequest): Record<string, unknown> {
  return {
    input_ids: ids(r.promptIds),
    sampling_params: samplingFields('sglang', r, { max_new_tokens: r.maxTokens, no_stop_trim: true }),
    return_logprob: true,
    ...(r.topLogprobs > 0 ? { top_logprobs_num: r.topLogprobs } : {}),
    ...(r.routedFrom !== undefined ? { return_routed_experts: true, routed_experts_start_len: r.routedFrom } : {}),
    ...(r.samplingMask === true ? { return_sampling_mask: true } : {}),
  };
}

function llamacppBody(r: SamplingRequest): Record<string, unknown> {
  const body: Record<string, unknown> = {
    prompt: ids(r.promptIds),
    n_predict: r.maxTokens,
    // One probability entry per sampled token is what carries its logprob (and id).
    n_probs: Math.max(1, r.topLogprobs),
    // The model's own distribution, softmax of the raw logits (server-common.cpp get_token_probabilities):
    // the one sampled from at temperature 1 with the chain neutral. Post-sampling ones would be `prob`s of
    // the chain's candidates, the whole vocabulary sorted per token.
    post_sampling_probs: false,
    return_tokens: true,
    // The session's earlier turns stay in the slot's KV cache: each turn only adds its new tokens.
    cache_prompt: true,
  };
  return samplingFields('llamacpp', r, body);
}

function isTokenIds(value: unknown): value is number[] {
  return Array.isArray(value) && value.every((v) => Number.isSafeInteger(v) && (v as number) >= 0);
}

/** A version as text: SGLang's are strings ("default" unless launched with --weight-version). */
function versionText(value: unknown): string | null {
  if (typeof value === 'string') return value;
  if (Number.isSafeInteger(value)) return String(value);
  return null;
}

function parseVllm(
  json: unknown,
  fail: (why: string) => Error,
  context: ReadContext = NOTHING_ASKED,
): GenerationResult {
  const reply = json as {
    choices?: unknown;
    metadata?: { weight_version?: unknown } | null;
    usage?: { prompt_tokens?: unknown } | null;
  } | null;
  const choice = (Array.isArray(reply?.choices) ? reply.choices[0] : undefined) as
    | {
        routed_experts?: unknown;
        token_ids?: unknown;
        logprobs?: { token_logprobs?: unknown; top_logprobs?: unknown } | null;
        finish_reason?: unknown;
      }
    | undefined;
  if (typeof choice !== 'object' || choice === null) throw fail('no choices[0]');
  if (!isTokenIds(choice.token_ids)) {
    throw fail(
      `choices[0].token_ids must be an array of token ids (got ${typeof choice.token_ids}); vLLM needs return_token_ids support (>= 0.10.2)`,
    );
  }
  const completionIds = choice.token_ids;
  const logprobs = choice.logprobs?.token_logprobs;
  if (
    !Array.isArray(logprobs) ||
    logprobs.length !== completionIds.length ||
    !logprobs.every((v) => typeof v === 'number')
  ) {
    throw fail(
      `choices[0].logprobs.token_logprobs must hold one number per token (${completionIds.length} tokens, got ${Array.isArray(logprobs) ? `${logprobs.length} entries` : typeof logprobs})`,
    );
  }
  if (typeof choice.finish_reason !== 'string')
    throw fail(`choices[0].finish_reason must be a string (got ${JSON.stringify(choice.finish_reason)})`);
  let top: TopLogprob[][] | null = null;
  const rawTop = choice.logprobs?.top_logprobs;
  if (Array.isArray(rawTop) && rawTop.length === completionIds.length) {
    // vLLM keys alternatives by token text: ids are unknown, and text is ambiguous for partial bytes.
    top = rawTop.map((entry) =>
      typeof entry === 'object' && entry !== null
        ? Object.entries(entry as Record<string, number>).map(([token, logprob]) => ({ token, tokenId: null, logprob }))
        : [],
    );
  }
  let routedExperts: RoutedExperts | undefined;
  if (context.routedFrom !== null) {
    const promptTokens = reply?.usage?.prompt_tokens;
    try {
      routedExperts = readVllmReplyRouted(reply as Record<string, unknown>, choice as Record<string, unknown>, {
        start: context.routedFrom,
        promptLength: Number.isSafeInteger(promptTokens) ? (promptTokens as number) : null,
        completionLength: completionIds.length,
      });
    } catch (err) {
      const why = (err as Error).message;
      throw fail(why.startsWith('routed_experts') ? `choices[0].${why}` : why);
    }
  }
  return {
    completionIds,
    logprobs: logprobs as number[],
    topLogprobs: top,
    finishReason: choice.finish_reason.toLowerCase(),
    weightVersion: versionText(reply?.metadata?.weight_version),
    ...(routedExperts !== undefined ? { routedExperts } : {}),
  };
}

function parseSglang(
  json: unknown,
  fail: (why: string) => Error,
  context: ReadContext = NOTHING_ASKED,
): GenerationResult {
  const reply = (Array.isArray(json) ? json[0] : json) as {
    output_ids?: unknown;
    meta_info?: Record<string, unknown>;
  } | null;
  if (typeof reply !== 'object' || reply === null) throw fail('the body is not an object');
  if (!isTokenIds(reply.output_ids))
    throw fail(`output_ids must be an array of token ids (got ${typeof reply.output_ids})`);
  const completionIds = reply.output_ids;
  const meta = reply.meta_info ?? {};
  const entries = meta.output_token_logprobs;
  if (!Array.isArray(entries) || entries.length !== completionIds.length) {
    throw fail(
      `meta_info.output_token_logprobs must hold one [logprob, id, text] per token (${completionIds.length} tokens, got ${Array.isArray(entries) ? `${entries.length} entries` : typeof entries})`,
    );
  }
  const logprobs = new Array<number>(completionIds.length);
  for (let i = 0; i < completionIds.length; i++) {
    const e = entries[i] as unknown[];
    if (!Array.isArray(e) || typeof e[0] !== 'number')
      throw fail(`meta_info.output_token_logprobs[${i}] must be [logprob, id, text] (got ${JSON.stringify(e)})`);
    if (e[1] !== undefined && e[1] !== null && e[1] !== completionIds[i])
      throw fail(
        `meta_info.output_token_logprobs[${i}] is for token ${String(e[1])} but output_ids[${i}] is ${completionIds[i]}`,
      );
    logprobs[i] = e[0];
  }
  const finish = meta.finish_reason as { type?: unknown } | string | null | undefined;
  const finishReason = typeof finish === 'string' ? finish : typeof finish?.type === 'string' ? finish.type : null;
  if (finishReason === null)
    throw fail(`meta_info.finish_reason must be a string or {type} (got ${JSON.stringify(finish)})`);
  let top: TopLogprob[][] | null = null;
  const rawTop = meta.output_top_logprobs;
  if (Array.isArray(rawTop) && rawTop.length === completionIds.length) {
    top = rawTop.map((row) =>
      Array.isArray(row)
        ? (row as unknown[][]).map((e) => ({
            logprob: Number(e[0]),
            tokenId: typeof e[1] === 'number' ? e[1] : null,
            token: typeof e[2] === 'string' ? e[2] : null,
          }))
        : [],
    );
  }
  let routedExperts: RoutedExperts | undefined;
  let samplingMask: SamplingMask | undefined;
  try {
    if (context.routedFrom !== null && meta.routed_experts != null) {
      const promptTokens = meta.prompt_tokens;
      const sequenceLength = Number.isSafeInteger(promptTokens)
        ? (promptTokens as number) + completionIds.length
        : null;
      routedExperts = readSglangRouted(
        meta.routed_experts,
        context.routedFrom,
        context.routingShape,
        meta.routed_experts_dtype,
        sequenceLength,
      );
    }
    if (context.samplingMask) samplingMask = readSglangMask(meta, completionIds) ?? undefined;
  } catch (err) {
    throw fail((err as Error).message);
  }
  return {
    completionIds,
    logprobs,
    topLogprobs: top,
    finishReason: finishReason.toLowerCase(),
    weightVersion: versionText(meta.weight_version),
    ...(routedExperts !== undefined ? { routedExperts } : {}),
    ...(samplingMask !== undefined ? { samplingMask } : {}),
  };
}

/** llama.cpp's stop_type → the OpenAI finish reason its own chat route gives for it. */
const LLAMACPP_FINISH: Record<string, string> = { eos: 'stop', word: 'stop', limit: 'length', none: 'length' };

function parseLlamacpp(json: unknown, fail: (why: string) => Error): GenerationResult {
  const reply = json as {
    tokens?: unknown;
    completion_probabilities?: unknown;
    stop_type?: unknown;
    truncated?: unknown;
  } | null;
  if (typeof reply !== 'object' || reply === null) throw fail('the body is not an object');
  if (!isTokenIds(reply.tokens))
    throw fail(`tokens must be an array of token ids (got ${typeof reply.tokens}); send return_tokens: true`);
  const completionIds = reply.tokens;
  const probs = reply.completion_probabilities;
  if (!Array.isArray(probs) || probs.length > completionIds.length) {
    throw fail(
      `completion_probabilities must hold at most one entry per token (${completionIds.length} tokens, got ${Array.isArray(probs) ? `${probs.length} entries` : typeof probs}); send n_probs ≥ 1`,
    );
  }
  // A token whose text ends inside a UTF-8 character gets no entry (server-context.cpp process_token:
  // it is never added to the slot's outputs), so entries are matched to tokens by id; the gaps are
  // listed for the caller to fill (llm/token-chat.ts), NaN until then.
  const logprobs = new Array<number>(completionIds.length);
  const missing: number[] = [];
  let top: TopLogprob[][] | null = null;
  let j = 0;
  for (let i = 0; i < completionIds.length; i++) {
    const e = probs[j] as { id?: unknown; logprob?: unknown; top_logprobs?: unknown } | undefined;
    if (e === undefined || e.id !== completionIds[i]) {
      logprobs[i] = Number.NaN;
      missing.push(i);
      continue;
    }
    j++;
    if (typeof e.logprob !== 'number')
      throw fail(`completion_probabilities[${j - 1}].logprob must be a number (got ${JSON.stringify(e.logprob)})`);
    logprobs[i] = e.logprob;
    if (Array.isArray(e.top_logprobs)) {
      top ??= [];
      top[i] = topOf(e.top_logprobs);
    }
  }
  if (j !== probs.length)
    throw fail(
      `completion_probabilities[${j}] is for token ${String((probs[j] as { id?: unknown })?.id)}, which is not among the tokens after the ones matched`,
    );
  const stop = reply.stop_type;
  const finishReason = typeof stop === 'string' ? (LLAMACPP_FINISH[stop.toLowerCase()] ?? stop.toLowerCase()) : null;
  if (finishReason === null) throw fail(`stop_type must be a string (got ${JSON.stringify(stop)})`);
  return {
    completionIds,
    logprobs,
    topLogprobs: top !== null && missing.length === 0 && top.length === completionIds.length ? top : null,
    finishReason,
    weightVersion: null,
    ...(missing.length > 0 ? { missingLogprobs: missing } : {}),
  };
}

function topOf(entries: { id?: unknown; token?: unknown; logprob?: unknown }[]): TopLogprob[] {
  return entries.map((t) => ({
    tokenId: typeof t.id === 'number' ? t.id : null,
    token: typeof t.token === 'string' ? t.token : null,
    logprob: Number(t.logprob),
  }));
}

/**
 * Alternatives asked for when a missing logprob is computed again: the sampled token is most often
 * among them; sampled from the whole distribution (see SHAPING_KEYS), it can be anywhere in it.
 */
export const LLAMACPP_RECOMPUTE_TOP = 100;
/**
 * Every alternative: asked for when the token is not among the first ones (≈14 MB of JSON for a 152k
 * vocabulary, and rare). The server gives at most the vocabulary (server-context.cpp populate_token_probs
 * takes min(n_probs, candidates)).
 */
const LLAMACPP_RECOMPUTE_ALL = 0x7fffffff;

/**
 * The request that gives back the logprob llama.cpp left out for the token after `prefix`: one token
 * generated there, forced (`logit_bias`) to `completeToken` — one whose text is whole, so it gets its
 * entry — whose alternatives are the raw distribution at that position (the bias is applied after the
 * logprobs are read). The prefix is in the slot's cache: only one position is computed.
 */
export function llamacppRecomputeBody(
  prefix: readonly number[],
  completeToken: number,
  alternatives = LLAMACPP_RECOMPUTE_TOP,
): Record<string, unknown> {
  return {
    prompt: prefix,
    n_predict: 1,
    n_probs: alternatives,
    post_sampling_probs: false,
    return_tokens: true,
    cache_prompt: true,
    logit_bias: [[completeToken, 100]],
  };
}

/** The logprob of `tokenId` among the alternatives of a recompute reply's one entry; null when it is not there. */
function recomputedLogprob(json: unknown, tokenId: number): number | null {
  const entry = (
    json as { completion_probabilities?: { top_logprobs?: { id?: unknown; logprob?: unknown }[] }[] } | null
  )?.completion_probabilities?.[0];
  const hit = entry?.top_logprobs?.find((t) => t.id === tokenId);
  return typeof hit?.logprob === 'number' ? hit.logprob : null;
}

/**
 * Fills the logprobs a llama.cpp reply left out (`missingLogprobs`), one recompute call each
 * (`post`: the caller's transport, with its bounds). Rare — a token that ends inside a UTF-8
 * character — and cheap: the prefix is cached in the slot. A token not among the recomputed
 * alternatives fails the call: a made-up logprob would be trained on.
 */
export async function fillMissingLogprobs(
  result: GenerationResult,
  promptIds: readonly number[] | Int32Array,
  completeToken: number,
  post: (body: Record<string, unknown>) => Promise<unknown>,
  fail: (why: string) => Error,
): Promise<GenerationResult> {
  const missing = result.missingLogprobs;
  if (missing === undefined) return result;
  const prompt = Array.from(promptIds);
  for (const i of missing) {
    const tokenId = result.completionIds[i];
    const prefix = prompt.concat(result.completionIds.slice(0, i));
    let logprob = recomputedLogprob(await post(llamacppRecomputeBody(prefix, completeToken)), tokenId);
    logprob ??= recomputedLogprob(
      await post(llamacppRecomputeBody(prefix, completeToken, LLAMACPP_RECOMPUTE_ALL)),
      tokenId,
    );
    if (logprob === null)
      throw fail(
        `llama.cpp left out the logprob of completion token ${i} (id ${tokenId}, which ends inside a UTF-8 character), and it is not among the alternatives at that position when computed again, the whole vocabulary asked for`,
      );
    result.logprobs[i] = logprob;
  }
  delete result.missingLogprobs;
  return result;
}

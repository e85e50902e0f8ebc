/**
 * Inference server dialects: what each server kind answers, where, and what it lacks.
 *
 * The OpenAI chat API is common ground, but what an RL engine needs beyond it — token ids, prompt ids,
 * an abort-all route, a weight version, a token-in route, the context length — is different on each
 * server. Each trait below names the source it was read from; the mock (src/mock-llm,
 * `--dialect`) reproduces the same traits and its tests name the same sources.
 *
 * `probeServer` tells the kind at start (`llm.server: auto`) from what the server answers, reads the
 * context length and whether the abort and in-place pause routes exist, and says once what the user loses.
 */
import { Pool, request } from 'undici';
import { serverMessage } from '../errors.ts';
import { LlmError } from './errors.ts';
import type { SHAPING_KEYS, SamplingDialect } from './token-wire.ts';

export const SERVER_KINDS = ['vllm', 'sglang', 'llamacpp', 'openai', 'generic'] as const;
/**
 * `generic`: a server that is none of the known ones but may have their extras (the shipped mock, a
 * router, a gateway): asked for everything vLLM-style, abort at `/abort_request` — the engine's
 * behaviour before dialects existed.
 */
export type ServerKind = (typeof SERVER_KINDS)[number];

/** A path may carry a query (vLLM's pause takes its mode there). */
export interface InPlaceRoutes {
  pause: { path: string; body: string };
  resume: { path: string; body: string };
}

/**
 * SGLang's: POST /pause_generation {"mode": "in_place"}, then POST /continue_generation
 * (python/sglang/srt/entrypoints/http_server.py; the modes in docs/advanced_features/sglang_for_rl.md
 * at 067bfe93626b99d33a934c78ac24c0c71e5e5e17 — in_place keeps running requests and their KV cache,
 * and a cache flush fails until generation continues). Older releases' /pause_generation takes no
 * mode and aborts: there a pause still loses nothing, it just does not keep the KV cache.
 */
const SGLANG_IN_PLACE: InPlaceRoutes = {
  pause: { path: '/pause_generation', body: '{"mode":"in_place"}' },
  resume: { path: '/continue_generation', body: '{}' },
};

/**
 * vLLM's, in dev mode only: POST /pause?mode=keep&clear_cache=false, then POST /resume — query
 * parameters, no body read, 200 {"status": "paused"} / {"status": "resumed"}
 * (vllm/entrypoints/serve/dev/rlhf/api_router.py @0100a2129224e729af1b3b8ed42a900cdfe9a452). keep
 * freezes running and waiting requests, new ones queue, until resume (vllm/v1/engine/core.py
 * EngineCoreProc.pause_scheduler @00080ee13c7a451fce071ccb8d0e94d395acf5a7); clear_cache=false keeps
 * their KV, where the default, true, resets the prefix cache with the running requests preempted, to
 * be prefilled again (docs/training/async_rl.md @006ebac240f34ddcd36383832b28c25840d2ea80; the router's
 * docstring says keep ignores it, the engine does not). Older releases' /pause (v0.14: no mode) ignores
 * the mode and aborts: as on older SGLang, a pause still loses nothing.
 */
const VLLM_IN_PLACE: InPlaceRoutes = {
  pause: { path: '/pause?mode=keep&clear_cache=false', body: '' },
  resume: { path: '/resume', body: '' },
};

export interface ServerDialect {
  kind: ServerKind;
  label: string;
  /** Request fields that ask a chat completion for token ids (beyond `logprobs: true`). */
  chatIdFields(stream: boolean): Record<string, unknown> | null;
  /** Whether chat replies carry the response's token ids / the prompt's ids when asked (whole, streamed). */
  chatResponseIds: boolean;
  chatPromptIds: (stream: boolean) => boolean;
  /** What a server of this kind needs to send chat token ids: named when one answers without them. */
  chatIdsFrom: string;
  /**
   * Whether its replies carry a weight version, for `llm.api` and `llm.stream`; where they do not, a
   * resume that names the weights asks `versionRoute` (checkServedVersions).
   */
  weightVersion(api: 'chat' | 'tokens', stream: boolean): boolean;
  /** Abort-all route and body; null = the server has none (a pause cancels calls client-side). */
  abort: { path: string; body: string } | null;
  /**
   * Routes that pause generation with every request kept where it is, KV and all, and continue it
   * (`pause.mode: in-place`); null = none (such a pause aborts instead).
   */
  pauseInPlace: InPlaceRoutes | null;
  /** Token-in route for `llm.api: tokens`; null = none. */
  tokenRoute: '/v1/completions' | '/generate' | '/completion' | null;
  /**
   * Whether its token-in route streams (`llm.stream`) with each event naming the weights that sampled
   * it (SGLang's /generate, llm/generate-stream.ts): a call kept across an in-place weight update is
   * then split token by token (worker/token-steps.ts). Other routes answer whole.
   */
  tokenStreamVersions: boolean;
  /** How to keep what the missing abort route loses, for the start-up line. */
  abortHint: string;
  /** GET route answering `{"weight_version"}`: checked on a resume where replies carry no version; null = none. */
  versionRoute: string | null;
  /** Whose names and neutral values its sampling fields take (llm/token-wire.ts samplingFields). */
  sampling: SamplingDialect;
  /**
   * The distribution its reported logprobs are of, by default: `unscaled` = the model's own (softmax of
   * the raw logits: temperature 1, before truncation and penalties), `scaled` = at the request's
   * temperature, before truncation; null = not known.
   */
  logprobsOf: 'unscaled' | 'scaled' | null;
  /** Shaping settings it has no field for: a task that sets one is refused at start (unhonouredSampling). */
  lacks: readonly ShapingKey[];
  /**
   * How its request field `priority` is read when the server runs with priority scheduling
   * (`llm.priority`, llm/priority.ts); null = it has none, and nothing is sent.
   */
  priority: 'lower-first' | 'higher-first' | null;
}

type ShapingKey = (typeof SHAPING_KEYS)[number];

/** One place that samples on an endpoint (config.ts samplingUses), for the start-up check of what the server honours. */
export interface SamplingUse {
  /** Where its temperature is set: `tasks[0]`, or `llm.policies.<agent>`. */
  where: string;
  temperature: number;
  /** Each shaping setting it sends, with the config path it is set at. */
  fields: { path: string; key: ShapingKey; value: number }[];
}

const VLLM: ServerDialect = {
  kind: 'vllm',
  label: 'vLLM',
  // vllm/entrypoints/openai/protocol.py ChatCompletionRequest.return_token_ids (≥ 0.10.2): the reply
  // then has top-level prompt_token_ids and choices[i].token_ids, streamed chunks included.
  chatIdFields: () => ({ return_token_ids: true }),
  chatResponseIds: true,
  chatPromptIds: () => true,
  chatIdsFrom: 'vLLM ≥ 0.10.2 (return_token_ids: choices[0].token_ids, prompt_token_ids)',
  // Replies carry none: the version lives behind dev-mode routes only.
  weightVersion: () => false,
  // vllm/entrypoints/openai/api_server.py: POST /abort_requests, registered only with
  // VLLM_SERVER_DEV_MODE=1, a JSON body naming no request ids aborts them all ({}; an empty body is a 400).
  abort: { path: '/abort_requests', body: '{}' },
  pauseInPlace: VLLM_IN_PLACE,
  tokenRoute: '/v1/completions',
  tokenStreamVersions: false,
  abortHint: 'launch vLLM with VLLM_SERVER_DEV_MODE=1 (it then serves POST /abort_requests), or set llm.stream: true',
  // vllm/entrypoints/serve/dev/rlhf/api_router.py (dev mode only): GET /weight_info {"weight_version"}.
  versionRoute: '/weight_info',
  sampling: 'vllm',
  // `--logprobs-mode`, default raw_logprobs: "the values before applying any logit processors"; only
  // processed_logprobs gives them after penalties, temperature and top-k/top-p (vllm/config/model.py
  // ModelConfig.logprobs_mode @0052a5b818980ce8a0477706aaf9f75bd5af72cd; vllm/v1/sample/sampler.py
  // Sampler.forward @3e342658b2e9c85a30a54d19e64e5ad77b8a26a6). Not told by any route: the default is assumed.
  logprobsOf: 'unscaled',
  lacks: [],
  // protocol.py ChatCompletionRequest.priority / CompletionRequest.priority: "lower means earlier
  // handling", honoured with --scheduling-policy priority (v1/core/sched/request_queue.py
  // PriorityRequestQueue, (priority, arrival_time)); older releases refuse a non-zero one without it.
  priority: 'lower-first',
};

const SGLANG: ServerDialect = {
  kind: 'sglang',
  label: 'SGLang',
  // Whole replies: return_token_ids puts prompt_token_ids and token_ids on each choice (sgl-project/sglang
  // #30917; protocol.py ChatCompletionRequest / ChatCompletionResponseChoice
  // @004c82e07d876f6e4a0ad6e15325706b0f478f1a); return_prompt_token_ids is kept for releases before it,
  // which give the prompt's only (serving_chat.py @002897c23becbd522d88b8115a763a21765f978a). Both are a
  // 400 on a streamed request, so a stream asks for the response-level extension instead (#34488):
  // sglext.input_ids and sglext.output_ids[choice], in one `choices: []` chunk after the last token.
  // Older servers ignore fields they do not know (pydantic's default) and answer with text only,
  // which the client says once.
  chatIdFields: (stream) => (stream ? SGLANG_STREAM_IDS : SGLANG_WHOLE_IDS),
  chatResponseIds: true,
  chatPromptIds: () => true,
  chatIdsFrom:
    'an SGLang with return_token_ids (sgl-project/sglang#30917) or, streamed, return_output_ids_in_sglext (#34488)',
  // metadata.weight_version, a string: "default" unless launched with --weight-version (ServerArgs);
  // /generate's streamed events carry meta_info.weight_version too, but no chat stream chunk carries
  // one (serving_chat.py _generate_chat_stream @002897c23becbd522d88b8115a763a21765f978a).
  weightVersion: (api, stream) => api === 'tokens' || !stream,
  // python/sglang/srt/entrypoints/http_server.py abort_request: {"abort_all": true} (older releases
  // take only `rid`, and then abort nothing).
  abort: { path: '/abort_request', body: '{"abort_all":true}' },
  pauseInPlace: SGLANG_IN_PLACE,
  tokenRoute: '/generate',
  tokenStreamVersions: true,
  abortHint: 'use an SGLang release whose /abort_request takes abort_all, or set llm.stream: true',
  // http_server.py: GET /get_weight_version, asked on resume where replies carry none (streamed chat).
  versionRoute: '/get_weight_version',
  // Its chat route takes the OpenAI names (`seed`, not /generate's `sampling_seed`: serving_chat.py maps
  // it) and the same neutral values as /generate (top_k -1).
  sampling: 'vllm',
  // python/sglang/srt/layers/sampler.py Sampler.forward: the log of softmax(logits / temperature), after
  // the penalties, before top-k and min-p (top-p renormalised @584f55d1ce76e57478ef233d04f6afbfd585960f,
  // before it in later releases); the unscaled ones with SGLANG_RETURN_ORIGINAL_LOGPROB=1.
  logprobsOf: 'scaled',
  lacks: [],
  // Request `priority` on chat and /generate, honoured with --enable-priority-scheduling: higher first
  // unless --schedule-low-priority-values-first (managers/schedule_policy.py priority_sign).
  priority: 'higher-first',
};

const SGLANG_WHOLE_IDS = { return_prompt_token_ids: true, return_token_ids: true };
const SGLANG_STREAM_IDS = { return_input_ids_in_sglext: true, return_output_ids_in_sglext: true };

const LLAMACPP: ServerDialect = {
  kind: 'llamacpp',
  label: 'llama.cpp llama-server',
  // tools/server/server-task.cpp (llama.cpp bundled by node-llama-cpp 3.22.1): no token_ids field; with
  // logprobs each logprobs.content[] entry carries the token's `id` (completion_token_output::
  // probs_vector_to_json, read by llm/reply.ts logprobIds). Chat replies carry no prompt ids: /completion does.
  chatIdFields: () => null,
  chatResponseIds: true,
  chatPromptIds: () => false,
  chatIdsFrom: "a llama-server whose logprobs.content[] entries carry each token's id",
  weightVersion: () => false,
  // No abort route (server-context.cpp registers none): closing the connection stops the slot.
  abort: null,
  pauseInPlace: null,
  tokenRoute: '/completion',
  tokenStreamVersions: false,
  abortHint: 'set llm.stream: true (a pause then keeps the tokens a call has received)',
  versionRoute: null,
  sampling: 'llamacpp',
  // post_sampling_probs false, as the engine asks (server-context.cpp populate_token_probs →
  // server-common.cpp get_token_probabilities): the softmax of the raw logits, before the whole chain.
  logprobsOf: 'unscaled',
  lacks: [],
  // No per-request priority among its request fields: its slots are served in arrival order.
  priority: null,
};

const OPENAI: ServerDialect = {
  kind: 'openai',
  label: 'OpenAI-compatible',
  chatIdFields: () => null,
  chatResponseIds: false,
  chatPromptIds: () => false,
  chatIdsFrom: 'a server that sends them (set llm.server)',
  weightVersion: () => false,
  abort: null,
  pauseInPlace: null,
  tokenRoute: null,
  tokenStreamVersions: false,
  abortHint: 'set llm.stream: true',
  versionRoute: null,
  sampling: 'openai',
  logprobsOf: null,
  // The OpenAI API's sampling fields are temperature, top_p, presence_penalty and frequency_penalty.
  lacks: ['topK', 'minP', 'repetitionPenalty'],
  priority: null,
};

const GENERIC: ServerDialect = {
  kind: 'generic',
  label: 'OpenAI-compatible (vLLM-style extras)',
  chatIdFields: () => ({ return_token_ids: true }),
  chatResponseIds: true,
  chatPromptIds: () => true,
  chatIdsFrom: 'return_token_ids (choices[0].token_ids, prompt_token_ids)',
  weightVersion: () => true,
  abort: { path: '/abort_request', body: '{"abort_all":true}' },
  // The mock's default dialect serves SGLang's routes (mock-llm/pause-routes.ts).
  pauseInPlace: SGLANG_IN_PLACE,
  tokenRoute: '/v1/completions',
  tokenStreamVersions: false,
  abortHint: "set llm.abortPath to the server's abort-all route, or llm.stream: true",
  versionRoute: null,
  sampling: 'vllm',
  // The shipped mock's logprobs belong to no model; a router's are its servers'.
  logprobsOf: null,
  lacks: [],
  // vLLM's reading, as the shipped mock's default dialect (mock-llm/priority-scheduling.ts).
  priority: 'lower-first',
};

export const DIALECTS: Record<ServerKind, ServerDialect> = {
  vllm: VLLM,
  sglang: SGLANG,
  llamacpp: LLAMACPP,
  openai: OPENAI,
  generic: GENERIC,
};

/** What the engine learnt about one inference endpoint at start. */
export interface ServerInfo {
  url: string;
  kind: ServerKind;
  /** Model ids `/v1/models` lists. */
  models: string[];
  /** Tokens a sequence may hold (prompt + completion); null when the server does not say. */
  contextLength: number | null;
  /** The abort-all route in use (after `llm.abortPath` and the probe); null = cancel client-side. */
  abort: { path: string; body: string } | null;
  /** The dialect's in-place pause routes, where the probe found them; null = none (such a pause aborts). */
  pauseInPlace: InPlaceRoutes | null;
  /**
   * The weight version it served at start, where it says (the dialect's version route: SGLang's
   * `"default"` unless launched with `--weight-version`); absent where it does not. The engine takes
   * it for the weights of the model step it starts at (worker/pause-gate.ts), so tokens those weights
   * sample keep that step after the trainer names later ones.
   */
  weightVersion?: string;
}

export interface ProbeOptions {
  /** `llm.server`: `auto` tells the kind from the answers. */
  server: ServerKind | 'auto';
  apiKey?: string | null;
  /** `llm.abortPath`: undefined = the dialect's route, null = none, a path = that route. */
  abortPath?: string | null;
  timeoutMs?: number;
}

/** `owned_by` of `/v1/models` entries → kind (vLLM and SGLang ModelCard defaults, llama.cpp's server). */
const OWNERS: Record<string, ServerKind> = {
  vllm: 'vllm',
  sglang: 'sglang',
  llamacpp: 'llamacpp',
  openai: 'openai',
  system: 'openai',
  'openai-internal': 'openai',
};

/**
 * Where a server's own routes live (`/props`, `/abort_requests`, `/generate`…): the path of the URL the
 * engine is given, without a trailing slash or the `/v1` of the OpenAI routes.
 */
export function serverRoot(url: URL): string {
  return url.pathname.replace(/\/+$/, '').replace(/\/v1$/, '');
}

/**
 * Probes one endpoint: `/v1/models` (which must answer: a down or misconfigured server is one clear
 * error at start), then what the kind needs — llama.cpp's `/props` for its per-slot context, whether
 * the abort and in-place pause routes exist (vLLM serves them in dev mode only).
 */
export async function probeServer(url: string, options: ProbeOptions): Promise<ServerInfo> {
  const base = new URL(url);
  const prefix = serverRoot(base);
  const pool = new Pool(base.origin, { connections: 1 });
  const headers: Record<string, string> = options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {};
  const timeoutMs = options.timeoutMs ?? 5_000;
  const get = async (path: string): Promise<{ status: number; json: unknown; text: string }> => {
    const response = await pool.request({
      method: 'GET',
      path: `${prefix}${path}`,
      headers,
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await response.body.text();
    let json: unknown = null;
    try {
      json = JSON.parse(text);
    } catch {
      // not JSON: only the status counts
    }
    return { status: response.statusCode, json, text };
  };
  // A GET, which aborts and pauses nothing: FastAPI answers 405 on a POST-only route, 404 where there is none.
  const routeExists = async (path: string): Promise<boolean> => {
    const probe = await get(path.replace(/\?.*$/, '')).catch(() => null);
    return probe !== null && probe.status !== 404;
  };
  try {
    let models: { status: number; json: unknown; text: string };
    try {
      models = await get('/v1/models');
    } catch (err) {
      const code = (err as { code?: string }).code ?? (err as Error).name;
      throw new LlmError(
        'ERR_LLM_UNREACHABLE',
        `inference server ${base.origin}${prefix}/v1/models unreachable: ${code} ${(err as Error).message} (check llm.url / --llm-url)`,
        { cause: err },
      );
    }
    if (models.status !== 200) {
      throw new LlmError(
        'ERR_LLM_HTTP',
        `GET ${base.origin}${prefix}/v1/models answered ${models.status}: ${serverMessage(models.text)}`,
        { status: models.status },
      );
    }
    const entries = Array.isArray((models.json as { data?: unknown } | null)?.data)
      ? ((models.json as { data: unknown[] }).data as Record<string, unknown>[])
      : [];
    const ids = entries.map((m) => String(m?.id));
    const owner = typeof entries[0]?.owned_by === 'string' ? (entries[0].owned_by as string) : '';
    let kind: ServerKind = options.server === 'auto' ? (OWNERS[owner] ?? 'generic') : options.server;
    let contextLength = positiveInt(entries[0]?.max_model_len);
    if (kind === 'llamacpp' || (options.server === 'auto' && kind === 'generic' && owner !== 'rollout-engine-mock')) {
      const props = await get('/props').catch(() => null);
      const settings = (props?.json as { default_generation_settings?: { n_ctx?: unknown } } | null)
        ?.default_generation_settings;
      if (props?.status === 200 && settings !== undefined) {
        kind = 'llamacpp';
        // n_ctx of one slot (server-context.cpp: default_generation_settings.n_ctx = slot_n_ctx): what one
        // sequence may hold, the server's context divided among its --parallel slots.
        contextLength = positiveInt(settings.n_ctx) ?? contextLength;
      }
    }
    const dialect = DIALECTS[kind];
    let abort =
      options.abortPath === undefined
        ? dialect.abort
        : options.abortPath === null
          ? null
          : { path: options.abortPath, body: dialect.abort?.body ?? '{"abort_all":true}' };
    if (abort !== null && options.abortPath === undefined && kind !== 'generic' && !(await routeExists(abort.path)))
      abort = null;
    let pauseInPlace = dialect.pauseInPlace;
    // Asked at start, not at the first pause: without the route a pause.mode in-place pause aborts at once.
    if (pauseInPlace !== null && kind !== 'generic' && !(await routeExists(pauseInPlace.pause.path)))
      pauseInPlace = null;
    // SGLang: GET /get_weight_version; vLLM in dev mode: GET /weight_info — {"weight_version"} both.
    const served =
      dialect.versionRoute === null || kind === 'generic' ? null : await get(dialect.versionRoute).catch(() => null);
    const weightVersion = (served?.json as { weight_version?: unknown } | null)?.weight_version;
    return {
      url,
      kind,
      models: ids,
      contextLength,
      abort,
      pauseInPlace,
      ...(served?.status === 200 && (typeof weightVersion === 'string' || Number.isSafeInteger(weightVersion))
        ? { weightVersion: String(weightVersion) }
        : {}),
    };
  } finally {
    await pool.close();
  }
}

function positiveInt(value: unknown): number | null {
  return Number.isSafeInteger(value) && (value as number) > 0 ? (value as number) : null;
}

/**
 * What the user loses on this server, one sentence each, for the start-up warning (empty when nothing):
 * said at start, not discovered at the first pause.
 */
export function serverGaps(
  info: ServerInfo,
  options: { api: 'chat' | 'tokens'; stream: boolean; wantIds: boolean; pauseInPlace?: boolean },
): string[] {
  const dialect = DIALECTS[info.kind];
  const gaps: string[] = [];
  if (options.pauseInPlace === true && info.pauseInPlace === null) {
    gaps.push(
      info.kind === 'vllm'
        ? 'no in-place pause route: pause.mode in-place pauses by abort (launch vLLM with VLLM_SERVER_DEV_MODE=1 for /pause and /resume)'
        : 'no in-place pause route: pause.mode in-place pauses by abort',
    );
  }
  // A call kept across an in-place update ends on other weights than it began on; only a streamed
  // token-in route whose events name their weights says which tokens came from which.
  const splitKnown = dialect.tokenStreamVersions && options.api === 'tokens' && options.stream;
  if (options.pauseInPlace === true && info.pauseInPlace !== null && !splitKnown) {
    gaps.push(
      dialect.tokenStreamVersions
        ? 'a reply kept across an in-place weight update is marked spansVersions, its tokens all tagged with the older step: which token came from which weights is known only with llm.api "tokens" and llm.stream true (each streamed /generate event names its weights)'
        : 'a reply kept across an in-place weight update is marked spansVersions, its tokens all tagged with the older step: its replies do not say which token came from which weights',
    );
  }
  if (info.abort === null && !options.stream) {
    gaps.push(
      `no abort-all route: a pause cancels calls client-side and a non-streamed call loses the tokens it had generated (to keep them: ${dialect.abortHint})`,
    );
  }
  if (!dialect.weightVersion(options.api, options.stream)) {
    const replies = dialect.weightVersion(options.api, false) ? 'its streamed replies' : 'its replies';
    gaps.push(
      dialect.versionRoute === null
        ? `${replies} carry no weight version: a server that did not load the weights the trainer announced goes unnoticed`
        : `${replies} carry no weight version: a resume with a weightVersion is checked against ${dialect.versionRoute} instead${info.kind === 'vllm' ? ' (vLLM: dev mode only)' : ''}`,
    );
  }
  if (options.api === 'chat' && options.wantIds) {
    if (!dialect.chatResponseIds)
      gaps.push(
        `its chat replies carry no response token ids: turns are kept as text only (exact tokens: llm.api "tokens"${dialect.tokenRoute ? `, ${dialect.tokenRoute}` : ''})`,
      );
    else if (!dialect.chatPromptIds(options.stream))
      gaps.push(
        `its ${options.stream ? 'streamed ' : ''}chat replies carry no prompt token ids (exact prompts: llm.api "tokens"${dialect.tokenRoute ? `, ${dialect.tokenRoute}` : ''})`,
      );
    // serving_chat.py _generate_chat_stream (#34488): the ids come once, after the last token, and a
    // decode step whose text is empty (the end-of-turn token) sends no chunk, so its logprob is lost.
    if (info.kind === 'sglang' && options.stream)
      gaps.push(
        'its streamed chat replies send their token ids once, after the last token (sglext): a call held by a pause keeps its text only, and a turn whose streamed logprobs leave out a token (a step with no text: the end-of-turn token) keeps its ids without logprobs (all of both: llm.stream false, or llm.api "tokens")',
      );
    // server-context.cpp process_token: a token whose text ends inside a UTF-8 character is never
    // reported, and the reply's text loses its leading whitespace (test/real-server pins both).
    if (info.kind === 'llamacpp')
      gaps.push(
        'its chat replies leave out the id and logprob of a token that ends inside a UTF-8 character (multi-byte text), and trim the text\'s leading whitespace: exact tokens need llm.api "tokens"',
      );
  }
  return gaps;
}

/** The field each shaping setting is sent as, for messages (the OpenAI names; llama.cpp's repeat_penalty aside). */
const FIELD: Record<ShapingKey, string> = {
  topP: 'top_p',
  topK: 'top_k',
  minP: 'min_p',
  repetitionPenalty: 'repetition_penalty',
  presencePenalty: 'presence_penalty',
  frequencyPenalty: 'frequency_penalty',
};

/**
 * Settings the config sends to a server that has no field for them (the plain OpenAI API and top_k),
 * one problem each for a ConfigError at start. Refused rather than warned of: the OpenAI API answers an
 * unknown sampling field with 400, so every call would fail; a lenient server would drop it, and the
 * batch would record a truncation the tokens were never sampled with.
 */
export function unhonouredSampling(info: ServerInfo, uses: readonly SamplingUse[]): string[] {
  const dialect = DIALECTS[info.kind];
  const problems = new Set<string>();
  for (const use of uses)
    for (const f of use.fields)
      if (dialect.lacks.includes(f.key))
        problems.add(
          `${f.path}: ${dialect.label} at ${info.url} has no ${FIELD[f.key]} (it takes temperature, top_p, presence_penalty and frequency_penalty); leave it unset, or set llm.server if the server is vLLM, SGLang or llama.cpp (got ${f.value})`,
        );
  return [...problems];
}

/**
 * Where the recorded logprobs are not those of the distribution the tokens were sampled from, one
 * sentence each for the start-up warning: a temperature other than 1 on a server that reports unscaled
 * logprobs; truncation or penalties a task sets, which every known server leaves out of its logprobs
 * (the batch records them: group.sampling); a server of unknown kind, whose defaults the engine cannot set.
 */
export function samplingGaps(info: ServerInfo, uses: readonly SamplingUse[], options: { logprobs: boolean }): string[] {
  if (!options.logprobs) return [];
  const dialect = DIALECTS[info.kind];
  const gaps: string[] = [];
  const list = (items: string[]) => [...new Set(items)].join(', ');
  const scaled = uses.filter((u) => u.temperature !== 1);
  if (dialect.logprobsOf === 'unscaled' && scaled.length > 0) {
    const fix =
      info.kind === 'vllm'
        ? 'launch vLLM with --logprobs-mode processed_logprobs, or sample at temperature 1'
        : 'sample at temperature 1';
    gaps.push(
      `its logprobs are of the model's unscaled distribution (temperature 1${info.kind === 'vllm' ? ": vLLM's default --logprobs-mode raw_logprobs" : ''}), but ${list(scaled.map((u) => `${u.where} samples at temperature ${u.temperature}`))}: those recorded logprobs are not of the distribution sampled from (${fix})`,
    );
  }
  const shaped = uses.flatMap((u) => u.fields.map((f) => `${f.path} ${f.value}`));
  if (dialect.logprobsOf !== null && shaped.length > 0)
    gaps.push(
      `its logprobs are of the distribution before truncation${dialect.logprobsOf === 'unscaled' ? ' and penalties' : ''}${info.kind === 'vllm' ? ' (unless vLLM runs with --logprobs-mode processed_logprobs)' : ''}, but ${list(shaped)} reshape the one sampled from: the batch records them (group.sampling) for the trainer`,
    );
  if (info.kind === 'openai')
    gaps.push(
      "the engine cannot turn off an OpenAI-compatible server's own truncation (top_k, min_p): if it truncates by default, the recorded logprobs are not of the distribution sampled from (set llm.server if it is vLLM, SGLang or llama.cpp)",
    );
  return gaps;
}

/**
 * What vLLM's /weight_info answers until a version is named: each EngineCore starts at "default", and a
 * finish_weight_update that names none keeps it (vllm-project/vllm#49040; the route in
 * vllm/entrypoints/serve/dev/rlhf/api_router.py @0100a2129224e729af1b3b8ed42a900cdfe9a452). It says
 * which weights are served no more than null did before: a trainer that loads weights without naming
 * them is not told, on every resume, that they were not loaded.
 */
const UNNAMED_VERSION = 'default';

/**
 * On a resume that names the weights (`weightVersion`), asks each server whose replies carry no
 * version (vLLM; SGLang's streamed chat, `api` and `stream` being `llm.api` and `llm.stream`) what it
 * serves, through its version route: a trainer that resumed without loading the weights is reported
 * instead of going unnoticed. Returns one sentence per server that serves another named version,
 * each a weight-version mismatch to count; a server without the route (vLLM outside dev mode), one
 * that names none, or one that does not answer in time says nothing (its start-up line said so).
 * Where replies carry a version, each reply is checked instead (worker/inference-call.ts).
 */
export async function checkServedVersions(
  servers: readonly ServerInfo[],
  announced: string,
  modelStep: number,
  options: { api: 'chat' | 'tokens'; stream: boolean; apiKey?: string | null; timeoutMs?: number },
): Promise<string[]> {
  const checks = servers.map(async (info) => {
    const dialect = DIALECTS[info.kind];
    if (dialect.weightVersion(options.api, options.stream) || dialect.versionRoute === null) return null;
    const base = new URL(info.url);
    const prefix = serverRoot(base);
    try {
      const response = await request(`${base.origin}${prefix}${dialect.versionRoute}`, {
        headers: options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {},
        signal: AbortSignal.timeout(options.timeoutMs ?? 2_000),
      });
      const text = await response.body.text();
      if (response.statusCode !== 200) return null;
      const served = (JSON.parse(text) as { weight_version?: unknown }).weight_version;
      // SGLang's "default" is the launch weights' name (ServerArgs.weight_version), which its replies
      // carry too: serving it after another was announced is the mismatch a reply would show.
      if (
        served === undefined ||
        served === null ||
        (info.kind === 'vllm' && served === UNNAMED_VERSION) ||
        String(served) === announced
      )
        return null;
      return `${dialect.label} at ${info.url} serves weight version ${JSON.stringify(String(served))}, not ${JSON.stringify(announced)} announced with model step ${modelStep}: it has not loaded the new weights (tokens are tagged with step ${modelStep} all the same)`;
    } catch {
      return null;
    }
  });
  return (await Promise.all(checks)).filter((x): x is string => x !== null);
}

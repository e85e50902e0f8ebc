/**
 * The wire formats of three real inference servers, for `dialect: 'vllm' | 'sglang' | 'llamacpp'`:
 * where each puts token ids, prompt ids, logprobs and the weight version, what it answers on its
 * token-in and info routes, how it refuses a request over its context, and what it answers on a route
 * it does not have. The shapes and the gaps are the servers' own, read in their source; every trait
 * names the file, the function and the commit it was read at (the commits are the versions the
 * project's source index holds, so the three servers are of slightly different dates):
 *
 * - vLLM ≈ v0.11 (`return_token_ids`, and the validation messages of that release line);
 * - SGLang after sgl-project/sglang#30917 and #34488 (`return_token_ids` on whole chat replies, the
 *   `sglext` prompt and output ids streamed or not, string weight versions);
 * - llama.cpp llama-server after the 2025 split of server.cpp into server-*.cpp.
 *
 * Hot-path serialisers build JSON text by hand from cached fragments, as response.ts does: a rollout
 * benchmark runs the dialects too.
 */
import { createRng } from '../env/synthetic/rng.ts';
import { logprobAt, LOGPROB_STREAM_TAG } from './completions.ts';
import type { MockChatRequest } from './request.ts';
import { bad, objectBody } from './request.ts';
import { logprobText, type TokenDraws } from './response.ts';
import { requestStreamSeed } from './policy.ts';
import { decodeIds, END_OF_TURN_ID, tokenJson } from './tokens.ts';
import type { MockVocabulary } from './vocab.ts';

export type Dialect = 'vllm' | 'sglang' | 'llamacpp';

/** What a served chat completion carries into its serialiser. */
export interface DialectChat {
  index: number;
  /** The model name the reply names (vLLM: the served name; SGLang: the request's; llama.cpp: its alias). */
  model: string;
  content: string;
  finishReason: string;
  /** Completion ids: on a natural stop they end in END_OF_TURN_ID, as a real server's sampled ids do. */
  ids: readonly number[];
  promptIds: readonly number[];
  request: MockChatRequest;
  /** The reported weight version (SGLang only puts it in replies). */
  version: string;
  /** Logprob draws for ids[0..]; null without logprobs. */
  draws: TokenDraws | null;
  /** llama.cpp: the generation stopped at the context size. */
  truncated: boolean;
  created: number;
}

// ---------------------------------------------------------------------------------------------------
// Token fragments
// ---------------------------------------------------------------------------------------------------

const bytesCache = new Map<number, string>();

/** The UTF-8 bytes of a token's text as a JSON array (cl100k, the chat vocabulary). */
function tokenBytesJson(id: number): string {
  let json = bytesCache.get(id);
  if (json === undefined) {
    json = JSON.stringify([...Buffer.from(decodeIds([id]), 'utf8')]);
    bytesCache.set(id, json);
  }
  return json;
}

/**
 * `logprobs.content` entries of ids[from..to) for one dialect. The alternatives list holds the sampled
 * token only when alternatives were asked for: the mock has no distribution to rank.
 */
export function dialectLogprobEntries(
  dialect: Dialect,
  ids: readonly number[],
  from: number,
  to: number,
  draws: TokenDraws,
  withTop: boolean,
): string {
  let json = '';
  for (let i = from; i < to; i++) {
    const id = ids[i];
    const lp = logprobText(draws.next(id));
    if (i > from) json += ',';
    if (dialect === 'llamacpp') {
      // llama.cpp tools/server/server-task.cpp completion_token_output::probs_vector_to_json @17f5f8a80d8ac9c18c23ecb2321640daeec77096:
      // {id, token, bytes, logprob, top_logprobs:[{id, token, bytes, logprob}]}; the token is the text
      // sent, and an end-of-generation token sends none (server-context.cpp process_token @fb4026604c67c682f552337ec9b91eced0abd35a).
      const eog = id === END_OF_TURN_ID;
      const token = eog ? '""' : tokenJson(id);
      const bytes = eog ? '[]' : tokenBytesJson(id);
      const top = withTop ? `{"id":${id},"token":${token},"bytes":${bytes},"logprob":${lp}}` : '';
      json += `{"id":${id},"token":${token},"bytes":${bytes},"logprob":${lp},"top_logprobs":[${top}]}`;
    } else if (dialect === 'sglang') {
      // SGLang python/sglang/srt/entrypoints/openai/protocol.py ChatCompletionTokenLogprob @9b116dffe828b2dfa7ec0e4d061555b6c354b67a: {token, bytes, logprob, top_logprobs}
      const top = withTop ? `{"token":${tokenJson(id)},"bytes":${tokenBytesJson(id)},"logprob":${lp}}` : '';
      json += `{"token":${tokenJson(id)},"bytes":${tokenBytesJson(id)},"logprob":${lp},"top_logprobs":[${top}]}`;
    } else {
      // vLLM vllm/entrypoints/openai/serving_chat.py OpenAIServingChat._create_chat_logprobs @99c5632fc2d252a6f25afa76347df392eb898c42: {token, logprob, bytes, top_logprobs}
      const top = withTop ? `{"token":${tokenJson(id)},"logprob":${lp},"bytes":${tokenBytesJson(id)}}` : '';
      json += `{"token":${tokenJson(id)},"logprob":${lp},"bytes":${tokenBytesJson(id)},"top_logprobs":[${top}]}`;
    }
  }
  return json;
}

/**
 * Whether alternatives go into top_logprobs: vLLM and SGLang list `top_logprobs` of them (0 = none);
 * llama.cpp's chat route turns `logprobs: true` into n_probs = top_logprobs ?? 20
 * (tools/server/utils.hpp oaicompat_chat_params_parse; not re-read at a pinned commit here).
 */
export function wantsAlternatives(dialect: Dialect, request: MockChatRequest): boolean {
  if (dialect === 'llamacpp') return request.topLogprobs === null || request.topLogprobs > 0;
  return request.topLogprobs !== null && request.topLogprobs > 0;
}

// ---------------------------------------------------------------------------------------------------
// Chat replies
// ---------------------------------------------------------------------------------------------------

function usageJson(prompt: number, completion: number, dialect: Dialect): string {
  if (dialect === 'llamacpp')
    return `{"completion_tokens":${completion},"prompt_tokens":${prompt},"total_tokens":${prompt + completion}}`;
  return `{"prompt_tokens":${prompt},"total_tokens":${prompt + completion},"completion_tokens":${completion},"prompt_tokens_details":null}`;
}

/**
 * vLLM's chat.completion (serving_chat.py chat_completion_full_generator @99c5632fc2d252a6f25afa76347df392eb898c42,
 * protocol ChatCompletionResponse): `return_token_ids` puts the completion ids in `choices[i].token_ids`
 * and the prompt ids top level in `prompt_token_ids` (both null otherwise, as model_dump keeps them);
 * `stop_reason` beside the finish reason; no weight version anywhere.
 */
export function vllmChatJson(c: DialectChat): string {
  const r = c.request;
  const logprobs =
    c.draws === null
      ? 'null'
      : `{"content":[${dialectLogprobEntries('vllm', c.ids, 0, c.ids.length, c.draws, wantsAlternatives('vllm', r))}]}`;
  return (
    `{"id":"chatcmpl-mock-${c.index}","object":"chat.completion","created":${c.created},"model":${JSON.stringify(c.model)},` +
    `"choices":[{"index":0,"message":{"role":"assistant","content":${JSON.stringify(c.content)},"tool_calls":[],"reasoning_content":null},` +
    `"logprobs":${logprobs},"finish_reason":${JSON.stringify(c.finishReason)},"stop_reason":null,` +
    `"token_ids":${r.returnTokenIds ? JSON.stringify(c.ids) : 'null'}}],"service_tier":null,"system_fingerprint":null,` +
    `"usage":${usageJson(c.promptIds.length, c.ids.length, 'vllm')},"prompt_logprobs":null,` +
    `"prompt_token_ids":${r.returnTokenIds ? JSON.stringify(c.promptIds) : 'null'},"kv_transfer_params":null}`
  );
}

/**
 * SGLang's chat.completion (python/sglang/srt/entrypoints/openai/serving_chat.py
 * OpenAIServingChat._build_chat_response @002897c23becbd522d88b8115a763a21765f978a): the prompt ids
 * go on each choice when the request sets `return_prompt_token_ids`; `matched_stop` names the stop
 * token; the response's `metadata.weight_version` is ServerArgs.weight_version, a string ("default"
 * unless launched with --weight-version or updated). Since sgl-project/sglang#30917 (protocol.py
 * ChatCompletionResponseChoice @004c82e07d876f6e4a0ad6e15325706b0f478f1a) `return_token_ids` puts both
 * the prompt's and the completion's ids on the choice, after `matched_stop`; since #34488 the
 * response-level `sglext` holds `input_ids` (the prompt) and `output_ids` (one array per choice) when
 * asked, after `metadata`, and is left out otherwise.
 */
export function sglangChatJson(c: DialectChat): string {
  const r = c.request;
  const logprobs =
    c.draws === null
      ? 'null'
      : `{"content":[${dialectLogprobEntries('sglang', c.ids, 0, c.ids.length, c.draws, wantsAlternatives('sglang', r))}]}`;
  const matched =
    c.finishReason === 'stop' && c.ids[c.ids.length - 1] === END_OF_TURN_ID ? String(END_OF_TURN_ID) : 'null';
  return (
    `{"id":"chatcmpl-mock-${c.index}","object":"chat.completion","created":${c.created},"model":${JSON.stringify(c.model)},` +
    `"choices":[{"index":0,"message":{"role":"assistant","content":${JSON.stringify(c.content)},"reasoning_content":null,"tool_calls":null},` +
    `"logprobs":${logprobs},"finish_reason":${JSON.stringify(c.finishReason)},"matched_stop":${matched}` +
    (r.returnPromptTokenIds || r.returnTokenIds ? `,"prompt_token_ids":${JSON.stringify(c.promptIds)}` : '') +
    (r.returnTokenIds ? `,"token_ids":${JSON.stringify(c.ids)}` : '') +
    `}],"usage":${usageJson(c.promptIds.length, c.ids.length, 'sglang')},"metadata":{"weight_version":${JSON.stringify(c.version)}}` +
    (r.sglextIds.input || r.sglextIds.output ? `,"sglext":${sglextJson(r, c.promptIds, c.ids)}` : '') +
    '}'
  );
}

/** SGLang's `sglext` ids (#34488): the fields not asked for are left out, as its serializer drops None. */
export function sglextJson(r: MockChatRequest, promptIds: readonly number[], ids: readonly number[]): string {
  const fields: string[] = [];
  if (r.sglextIds.input) fields.push(`"input_ids":${JSON.stringify(promptIds)}`);
  if (r.sglextIds.output) fields.push(`"output_ids":[${JSON.stringify(ids)}]`);
  return `{${fields.join(',')}}`;
}

/** A build_info string in llama.cpp's `b<number>-<hash>` form (the real one is the build's). */
export const LLAMACPP_BUILD_INFO = 'b0-rollout-engine-mock';

function timingsJson(promptTokens: number, predicted: number): string {
  // llama.cpp tools/server/server-task.cpp result_timings::to_json @17f5f8a80d8ac9c18c23ecb2321640daeec77096 (the mock's times are nominal)
  return (
    `{"cache_n":0,"prompt_n":${promptTokens},"prompt_ms":1,"prompt_per_token_ms":${promptTokens > 0 ? 1 / promptTokens : 0},"prompt_per_second":${promptTokens * 1000},` +
    `"predicted_n":${predicted},"predicted_ms":1,"predicted_per_token_ms":${predicted > 0 ? 1 / predicted : 0},"predicted_per_second":${predicted * 1000}}`
  );
}

/**
 * llama.cpp's chat.completion (tools/server/server-task.cpp server_task_result_cmpl_final::to_json_oaicompat_chat
 * @17f5f8a80d8ac9c18c23ecb2321640daeec77096): no token-id field at all — each token's id is only in
 * `choices[0].logprobs.content[].id`, and `logprobs` is there only when asked for; finish_reason
 * "stop" for an end-of-generation token or a stop word, "length" otherwise; `timings` beside `usage`;
 * no weight version.
 */
export function llamacppChatJson(c: DialectChat): string {
  const r = c.request;
  const logprobs =
    c.draws === null
      ? ''
      : `,"logprobs":{"content":[${dialectLogprobEntries('llamacpp', c.ids, 0, c.ids.length, c.draws, wantsAlternatives('llamacpp', r))}]}`;
  return (
    `{"choices":[{"finish_reason":${JSON.stringify(c.finishReason)},"index":0,"message":{"role":"assistant","content":${JSON.stringify(c.content)}}${logprobs}}],` +
    `"created":${c.created},"model":${JSON.stringify(c.model)},"system_fingerprint":"${LLAMACPP_BUILD_INFO}","object":"chat.completion",` +
    `"usage":${usageJson(c.promptIds.length, c.ids.length, 'llamacpp')},"id":"chatcmpl-mock-${c.index}","timings":${timingsJson(c.promptIds.length, c.ids.length)}}`
  );
}

// ---------------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------------

/** An answer that is not a completion: status, body, and whether it counts as a rejection. */
export interface DialectError {
  status: number;
  body: string;
}

/**
 * vLLM's ErrorResponse (vllm/entrypoints/openai/engine/serving.py OpenAIServing.create_error_response
 * @00bd1493b3e82d6c13c68ee8a0e1c5a96707e190): {"error": {message, type, param, code}}.
 */
export function vllmError(status: number, type: string, message: string, param: string | null = null): DialectError {
  return {
    status,
    body: `{"error":{"message":${JSON.stringify(message)},"type":${JSON.stringify(type)},"param":${JSON.stringify(param)},"code":${status}}}`,
  };
}

/** SGLang's OpenAI-route ErrorResponse (protocol.py ErrorResponse @9b116dffe828b2dfa7ec0e4d061555b6c354b67a): flat, with object "error". */
export function sglangOpenAiError(status: number, message: string, type = 'BadRequestError'): DialectError {
  return {
    status,
    body: `{"object":"error","message":${JSON.stringify(message)},"type":${JSON.stringify(type)},"param":null,"code":${status}}`,
  };
}

/** SGLang's native-route error (http_server.py _create_error_response, used by /generate @0025436eab0556737d615b36a4dd3e1e26e82f3d): {"error": {message}}, 400. */
export function sglangNativeError(message: string): DialectError {
  return { status: 400, body: `{"error":{"message":${JSON.stringify(message)}}}` };
}

/**
 * llama.cpp's error body (tools/server/server-common.cpp format_error_response @aa6192d38defc9a5d9fb2987413f71b18f214270,
 * wrapped in {"error": …}): {code, message, type}; exceed_context_size_error adds n_prompt_tokens and
 * n_ctx (server-context.cpp send_error @fb4026604c67c682f552337ec9b91eced0abd35a).
 */
export function llamacppError(status: number, type: string, message: string, extra = ''): DialectError {
  return {
    status,
    body: `{"error":{"code":${status},"message":${JSON.stringify(message)},"type":${JSON.stringify(type)}${extra}}}`,
  };
}

/**
 * What a server answers on a route it does not have. vLLM and SGLang are FastAPI apps: Starlette's
 * default 404/405 (vLLM registers its handler for fastapi.HTTPException only, which Starlette's own
 * routing exception is not a subclass of — api_server.py build_app @0001948bc76939369ca855c90b36d81256477e85).
 * llama-server answers every unmatched path and method with one body (tools/server/server-http.cpp
 * set_error_handler @aa6192d38defc9a5d9fb2987413f71b18f214270).
 */
export function unknownRoute(dialect: Dialect, methodNotAllowed: boolean): DialectError {
  if (dialect === 'llamacpp')
    return { status: 404, body: '{"error":{"message":"File Not Found","type":"not_found_error","code":404}}' };
  return methodNotAllowed
    ? { status: 405, body: '{"detail":"Method Not Allowed"}' }
    : { status: 404, body: '{"detail":"Not Found"}' };
}

/** A body the mock could not parse, in the dialect's error shape (the real servers' own validators word it differently). */
export function badRequest(
  dialect: Dialect,
  route: 'openai' | 'native',
  message: string,
  param: string | null,
): DialectError {
  if (dialect === 'vllm') return vllmError(400, 'BadRequestError', message, param);
  if (dialect === 'sglang') return route === 'native' ? sglangNativeError(message) : sglangOpenAiError(400, message);
  return llamacppError(400, 'invalid_request_error', message);
}

// ---------------------------------------------------------------------------------------------------
// Context limits
// ---------------------------------------------------------------------------------------------------

/**
 * The context check each server makes before generating: an error to answer, or the most tokens the
 * generation may take (Infinity = no cap beyond max tokens). `maxTokens` is what the request asked
 * for (null = not given).
 */
export function checkContext(
  dialect: Dialect,
  route: 'openai' | 'native',
  promptTokens: number,
  maxTokens: number | null,
  context: number,
): { error: DialectError } | { cap: number } {
  const p = promptTokens;
  if (dialect === 'vllm') {
    // vllm/entrypoints/openai/engine/serving.py OpenAIServing._validate_input @00bd1493b3e82d6c13c68ee8a0e1c5a96707e190:
    // VLLMValidationError (its __str__ appends "(parameter=…, value=…)", vllm/exceptions.py) → 400
    // BadRequestError with param; without max_tokens the budget is the rest of the context (get_max_tokens).
    if (p >= context) {
      return {
        error: vllmError(
          400,
          'BadRequestError',
          `This model's maximum context length is ${context} tokens. However, your request has ${p} input tokens. Please reduce the length of the input messages. (parameter=input_tokens, value=${p})`,
          'input_tokens',
        ),
      };
    }
    if (maxTokens !== null && p + maxTokens > context) {
      return {
        error: vllmError(
          400,
          'BadRequestError',
          `'max_tokens' or 'max_completion_tokens' is too large: ${maxTokens}. This model's maximum context length is ${context} tokens and your request has ${p} input tokens (${maxTokens} > ${context} - ${p}). (parameter=max_tokens, value=${maxTokens})`,
          'max_tokens',
        ),
      };
    }
    return { cap: context - p };
  }
  if (dialect === 'sglang') {
    // python/sglang/srt/managers/tokenizer_manager.py TokenizerManager._validate_one_request @001067fffe33427bee0ed2f007fb7551a1d76b44:
    // ValueError → 400 in the route's error shape; no max_new_tokens = no total check (generation stops at the context).
    const error = (message: string): { error: DialectError } => ({
      error: route === 'native' ? sglangNativeError(message) : sglangOpenAiError(400, message),
    });
    if (p >= context)
      return error(`The input (${p} tokens) is longer than the model's context length (${context} tokens).`);
    if (maxTokens !== null && maxTokens + p > context) {
      return error(
        `Requested token count exceeds the model's maximum context length of ${context} tokens. You requested a total of ${maxTokens + p} tokens: ${p} tokens from the input messages and ${maxTokens} tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.`,
      );
    }
    return { cap: context - p };
  }
  // llama.cpp tools/server/server-context.cpp update_slots @fb4026604c67c682f552337ec9b91eced0abd35a: only the
  // prompt is checked (n_tokens >= n_ctx); n_predict is not — generation stops when the context is full
  // (process_token: truncated, STOP_TYPE_LIMIT), after n_ctx - prompt tokens.
  if (p >= context) {
    return {
      error: llamacppError(
        400,
        'exceed_context_size_error',
        'the request exceeds the available context size, try increasing it',
        `,"n_prompt_tokens":${p},"n_ctx":${context}`,
      ),
    };
  }
  return { cap: context - p };
}

// ---------------------------------------------------------------------------------------------------
// Token-in routes
// ---------------------------------------------------------------------------------------------------

/** A token-in request of any dialect, normalised. */
export interface TokenInRequest {
  prompt: number[] | string;
  /** null = the server's default (SGLang 128; llama.cpp until the end or the context). */
  maxTokens: number | null;
  /** Alternatives per token asked for (0 = logprobs without alternatives); null = no logprobs. */
  logprobs: number | null;
  seed: number | undefined;
  /** SGLang `rid` (abort_request by id). */
  rid: string | null;
  /** vLLM `return_token_ids` (token ids and prompt ids on the choice). */
  returnTokenIds?: boolean;
  /** Where routed experts are asked from (vLLM `routed_experts_prompt_start`, SGLang `routed_experts_start_len`); null = not asked (SGLang). */
  routedFrom?: number | null;
  /** SGLang `return_sampling_mask`. */
  samplingMask?: boolean;
  /** vLLM `prompt_logprobs`: a scoring request (scoring.ts). */
  promptLogprobs?: number | null;
  /** SGLang `logprob_start_len` (-1, its default, = output tokens only): with max_new_tokens 0, a scoring request. */
  logprobStartLen?: number | null;
  /** vLLM's and SGLang's `priority` (GenerateReqInput.priority); undefined when absent. */
  priority?: number;
}

const isIds = (v: unknown): v is number[] =>
  Array.isArray(v) && v.length > 0 && v.every((x) => Number.isSafeInteger(x) && (x as number) >= 0);
const isInt = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v);

/**
 * SGLang `POST /generate` (python/sglang/srt/managers/io_struct.py GenerateReqInput; http_server.py
 * generate_request @0025436eab0556737d615b36a4dd3e1e26e82f3d): `input_ids` (or `text`),
 * `sampling_params` {max_new_tokens (SamplingParams default 128), sampling_seed, …}, `return_logprob`,
 * `top_logprobs_num`, `rid`. One prompt per request here; `stream` is refused by the mock.
 */
export function parseGenerateRequest(raw: string): TokenInRequest {
  const b = objectBody(raw);
  let prompt: number[] | string;
  if (b.input_ids !== undefined && b.input_ids !== null) {
    if (!isIds(b.input_ids))
      bad('input_ids', 'must be a non-empty array of token ids (one prompt per request in the mock)', b.input_ids);
    prompt = b.input_ids;
  } else if (typeof b.text === 'string' && b.text.length > 0) {
    prompt = b.text;
  } else {
    bad('input_ids', 'or text must be given', b.input_ids);
  }
  const sp = (b.sampling_params ?? {}) as Record<string, unknown>;
  if (typeof sp !== 'object' || Array.isArray(sp)) bad('sampling_params', 'must be an object', b.sampling_params);
  const maxNew = sp.max_new_tokens;
  if (maxNew !== undefined && maxNew !== null && !(isInt(maxNew) && maxNew >= 0))
    bad('sampling_params.max_new_tokens', 'must be a non-negative integer', maxNew);
  const seed = sp.sampling_seed;
  if (seed !== undefined && seed !== null && !isInt(seed))
    bad('sampling_params.sampling_seed', 'must be an integer', seed);
  if (b.stream === true) bad('stream', 'is not supported by the mock on /generate (send stream: false)', true);
  const top = b.top_logprobs_num;
  if (top !== undefined && top !== null && !(isInt(top) && top >= 0))
    bad('top_logprobs_num', 'must be a non-negative integer', top);
  const rid = typeof b.rid === 'string' ? b.rid : null;
  const routedStart = b.routed_experts_start_len;
  if (routedStart !== undefined && routedStart !== null && !(isInt(routedStart) && routedStart >= 0))
    bad('routed_experts_start_len', 'must be a non-negative integer', routedStart);
  // test/registered/sampling/test_sampling_mask.py @cbc9dac0598670d685bc387da08e47cbe4a27cc6: a mask
  // over the whole vocabulary (no top_k, top_p or min_p) and a streamed one are 400s.
  const samplingMask = b.return_sampling_mask === true;
  if (samplingMask) {
    const bounded =
      (isInt(sp.top_k) && sp.top_k > 0) ||
      (typeof sp.top_p === 'number' && sp.top_p < 1) ||
      (typeof sp.min_p === 'number' && sp.min_p > 0);
    if (!bounded)
      bad('return_sampling_mask', 'needs top_k, top_p < 1 or min_p > 0 (an unbounded support is refused)', true);
  }
  const start = b.logprob_start_len;
  if (start !== undefined && start !== null && !(isInt(start) && start >= -1))
    bad('logprob_start_len', 'must be an integer >= -1', start);
  const priority = b.priority;
  if (priority !== undefined && priority !== null && !isInt(priority)) bad('priority', 'must be an integer', priority);
  return {
    ...(isInt(priority) ? { priority } : {}),
    routedFrom: b.return_routed_experts === true ? (isInt(routedStart) ? routedStart : 0) : null,
    samplingMask,
    prompt,
    logprobStartLen: isInt(start) && start >= 0 && b.return_logprob === true ? start : null,
    // python/sglang/srt/sampling/sampling_params.py SamplingParams(max_new_tokens=128) is the default.
    maxTokens: isInt(maxNew) ? maxNew : 128,
    logprobs: b.return_logprob === true ? ((top as number | undefined) ?? 0) : null,
    seed: isInt(seed) ? seed : undefined,
    rid,
  };
}

/**
 * llama.cpp `POST /completion` (tools/server/server-task.cpp params_from_json_cmpl; server-context.cpp
 * post_completions @fb4026604c67c682f552337ec9b91eced0abd35a): `prompt` as token ids or text,
 * `n_predict` (-1 = until the end or the context), `n_probs`, `seed`. Mixed prompts and `stream` are
 * refused by the mock.
 */
export function parseLlamaCompletionRequest(raw: string): TokenInRequest {
  const b = objectBody(raw);
  const prompt = b.prompt;
  if (!(isIds(prompt) || (typeof prompt === 'string' && prompt.length > 0)))
    bad(
      'prompt',
      'must be a non-empty array of token ids or a string (mixed prompts are not supported by the mock)',
      prompt,
    );
  const n = b.n_predict;
  if (n !== undefined && n !== null && !(isInt(n) && n >= -1)) bad('n_predict', 'must be an integer >= -1', n);
  const probs = b.n_probs;
  if (probs !== undefined && probs !== null && !(isInt(probs) && probs >= 0))
    bad('n_probs', 'must be a non-negative integer', probs);
  const seed = b.seed;
  if (seed !== undefined && seed !== null && !isInt(seed)) bad('seed', 'must be an integer', seed);
  if (b.stream === true) bad('stream', 'is not supported by the mock on /completion (send stream: false)', true);
  return {
    prompt: prompt as number[] | string,
    maxTokens: isInt(n) && n >= 0 ? n : null,
    logprobs: isInt(probs) && probs > 0 ? probs : null,
    // llama.cpp's default seed is LLAMA_DEFAULT_SEED (random per request); -1 means the same.
    seed: isInt(seed) && seed !== -1 ? seed : undefined,
    rid: null,
  };
}

/** What a served token-in completion carries into its serialiser. */
export interface DialectTokens {
  index: number;
  model: string;
  vocab: MockVocabulary;
  ids: readonly number[];
  promptIds: readonly number[];
  finishReason: 'stop' | 'length' | 'abort';
  truncated: boolean;
  version: string;
  request: TokenInRequest;
  seed: number;
  offset: number;
  /** SGLang: the request id meta_info names (the request's `rid`, else one of the mock's). */
  rid?: string;
  /** The mock's model's draws for the reply (scoring.ts); absent: the request's random ones. */
  draws?: () => TokenDraws;
}

function tokenDraws(t: DialectTokens): TokenDraws {
  if (t.draws !== undefined) return t.draws();
  // The token-in logprobs of every dialect are the default /v1/completions draws (completions.ts).
  const rng = createRng(requestStreamSeed(t.seed, t.index, t.request.seed, LOGPROB_STREAM_TAG));
  for (let i = 0; i < t.offset; i++) rng.next();
  return rng;
}

/** Text of ids without a final end-of-turn token (servers skip special tokens in text). */
function textOf(t: DialectTokens): string {
  const stopped = t.ids.length > 0 && t.ids[t.ids.length - 1] === t.vocab.endOfTurnId;
  return t.vocab.decode(stopped ? t.ids.slice(0, -1) : t.ids);
}

/**
 * SGLang /generate reply (tokenizer_manager.py TokenizerManager._handle_batch_output
 * @001067fffe33427bee0ed2f007fb7551a1d76b44): {text, output_ids, meta_info}; meta_info has id,
 * finish_reason as an object ({type: "stop", matched: <token id>} | {type: "length", length: n} |
 * {type: "abort"}), prompt_tokens, weight_version (the string), completion_tokens, cached_tokens, and
 * with return_logprob `output_token_logprobs` as [logprob, token id, null] (no text unless
 * return_text_in_logprobs) and `output_top_logprobs` when top_logprobs_num > 0.
 */
export function sglangGenerateJson(t: DialectTokens): string {
  const finish =
    t.finishReason === 'stop'
      ? { type: 'stop', matched: t.ids[t.ids.length - 1] }
      : t.finishReason === 'length'
        ? { type: 'length', length: t.ids.length }
        : { type: 'abort' };
  const meta: Record<string, unknown> = {
    id: t.rid ?? `mock-${t.index}`,
    finish_reason: finish,
    prompt_tokens: t.promptIds.length,
    weight_version: t.version,
    completion_tokens: t.ids.length,
    cached_tokens: 0,
  };
  if (t.request.logprobs !== null) {
    const draws = tokenDraws(t);
    const entries: [number, number, null][] = t.ids.map((id) => [logprobAt(draws.next(id)), id, null]);
    meta.output_token_logprobs = entries;
    if (t.request.logprobs > 0) meta.output_top_logprobs = entries.map((e) => [e]);
  }
  return JSON.stringify({ text: textOf(t), output_ids: t.ids, meta_info: meta });
}

/**
 * llama.cpp /completion reply (server-task.cpp server_task_result_cmpl_final::to_json_non_oaicompat
 * @17f5f8a80d8ac9c18c23ecb2321640daeec77096): content, tokens (the generated ids, end token
 * included), stop, tokens_predicted, tokens_evaluated (the prompt), truncated (the context filled),
 * stop_type ("eos" | "limit" | "word" | "none"), timings, and with n_probs > 0
 * `completion_probabilities` [{id, token, bytes, logprob, top_logprobs}].
 */
export function llamacppCompletionJson(t: DialectTokens): string {
  const stopType = t.finishReason === 'stop' ? 'eos' : t.finishReason === 'length' ? 'limit' : 'none';
  const res: Record<string, unknown> = {
    index: 0,
    content: textOf(t),
    tokens: t.ids,
    id_slot: 0,
    stop: true,
    model: t.model,
    tokens_predicted: t.ids.length,
    tokens_evaluated: t.promptIds.length,
    generation_settings: {
      n_predict: t.request.maxTokens ?? -1,
      seed: t.request.seed ?? 4294967295,
      n_probs: t.request.logprobs ?? 0,
    },
    prompt: t.vocab.decode(t.promptIds),
    has_new_line: false,
    truncated: t.truncated,
    stop_type: stopType,
    stopping_word: '',
    tokens_cached: t.promptIds.length + t.ids.length,
    timings: JSON.parse(timingsJson(t.promptIds.length, t.ids.length)),
  };
  if (t.request.logprobs !== null) {
    const draws = tokenDraws(t);
    res.completion_probabilities = t.ids.map((id) => {
      const eog = id === t.vocab.endOfTurnId;
      const token = eog ? '' : t.vocab.tokenText(id);
      const bytes = [...Buffer.from(token, 'utf8')];
      const logprob = logprobAt(draws.next(id));
      return { id, token, bytes, logprob, top_logprobs: [{ id, token, bytes, logprob }] };
    });
  }
  return JSON.stringify(res);
}

/**
 * Parsing an OpenAI chat-completion reply into what the agent loop needs. A reply that cannot be used
 * becomes an LlmError naming the field and the value — the rollout fails with it, nothing crashes.
 */
import type { FinishReason } from '../domain/rollout.ts';
import { LlmError } from './errors.ts';
import { preview } from '../errors.ts';
import type { ParsedToolCall } from './tool-calls.ts';
import type { RoutedExperts, SamplingMask } from '../domain/routing.ts';
import { readVllmReplyRouted } from './routing-wire.ts';

export interface ChatResult {
  content: string;
  finishReason: FinishReason;
  /**
   * Prompt ids where the server puts them: vLLM's top-level `prompt_token_ids`, SGLang's per-choice
   * `choices[0].prompt_token_ids` (asked with `return_prompt_token_ids`), a token-in reply's own prompt.
   */
  promptIds: Int32Array | null;
  /** vLLM `choices[0].token_ids`, or llama.cpp's `logprobs.content[].id` when every entry has one. */
  responseIds: Int32Array | null;
  /** `choices[0].logprobs.content[].logprob`, aligned with responseIds when both are present. */
  logprobs: Float32Array | null;
  /**
   * Weight version reported by the server (`metadata.weight_version`, SGLang `meta_info`, or top
   * level), as text: SGLang's are strings ("default" unless launched with `--weight-version`), so a
   * version is a name the trainer announces, not a number (domain/weight-versions.ts maps it to a step).
   */
  weightVersion: string | null;
  promptTokens: number | null;
  completionTokens: number | null;
  /**
   * Set (to the server's words, or the count) when the call did not fit the server's context: nothing
   * was generated, and the episode ends as truncated (llm/context.ts).
   */
  contextExceeded?: string;
  /**
   * The tools the reply called (chat: `choices[0].message.tool_calls`; tokens: parsed from the text,
   * llm/tool-calls.ts); absent when it called none.
   */
  toolCalls?: ParsedToolCall[];
  /**
   * Which weights sampled which response tokens, from a streamed reply whose every token-carrying
   * event named its weight version (SGLang's meta_info, the reference policy server): consecutive
   * spans, the last ending at the last token. Absent where the reply says less — a whole reply names
   * only the version that ended it.
   */
  versionSpans?: VersionSpan[];
  /** Routed experts of the call's sequence (`promptIds ++ responseIds`), when asked and sent (llm/routing-wire.ts). */
  routedExperts?: RoutedExperts;
  /** Each response token's sampling support, when asked and sent. */
  samplingMask?: SamplingMask;
  /**
   * `api: tokens`: the chat template rendered this turn's conversation so that it no longer starts
   * with the previous turn's prompt + sampled ids (Qwen3 drops earlier reasoning, a template writes
   * tool calls its own way), and what was done about it (`llm.historyMode`, llm/token-chat.ts).
   */
  historyRewrite?: HistoryRewrite;
}

/** A turn whose re-rendered history diverged from the sampled sequence (ChatResult.historyRewrite). */
export interface HistoryRewrite {
  /**
   * `kept`: the prompt is the previous prompt + sampled ids + the new messages' ids (the sampled
   * continuation); `split`: the prompt is the whole re-rendered conversation, a new training segment.
   */
  mode: 'kept' | 'split';
  /** Why a `keep-sampled` turn was split all the same (the new messages could not be cut out of the render). */
  fallback?: string;
  /** Where the render diverges: the sampled sequence's token index and the render's character. */
  token: number;
  char: number;
  /** A few tokens of each side from there, as text. */
  sampledText: string;
  renderedText: string;
}

/** Tokens from the previous span's `end` (0 for the first) up to `end` were sampled by the weights named `version`. */
export interface VersionSpan {
  end: number;
  version: string;
}

/**
 * The weights a streamed reply's events name, as they arrive: its `versionSpans` once every event
 * that brought tokens named a version (llm/stream-reply.ts, llm/generate-stream.ts).
 */
export class VersionSpans {
  /** null once an event with tokens named no version: then nothing per token is known. */
  #spans: VersionSpan[] | null = [];

  /** `count` more tokens, sampled by the weights `version` names (null: unnamed). */
  add(count: number, version: string | null): void {
    if (count === 0 || this.#spans === null) return;
    if (version === null) {
      this.#spans = null;
      return;
    }
    const last = this.#spans.at(-1);
    if (last !== undefined && last.version === version) last.end += count;
    else this.#spans.push({ end: (last?.end ?? 0) + count, version });
  }

  /** A reply's `versionSpans` field (a copy) when the spans cover exactly its `tokens` tokens; else none. */
  field(tokens: number): { versionSpans?: VersionSpan[] } {
    const spans = this.#spans;
    return tokens > 0 && spans?.at(-1)?.end === tokens ? { versionSpans: spans.map((s) => ({ ...s })) } : {};
  }
}

/** What a chat reply is read for beyond the OpenAI fields: vLLM's routed experts (from position 0; routing-wire.ts). */
export interface ChatReplyWants {
  routedExperts: boolean;
}

export function parseChatReply(body: unknown, wants?: ChatReplyWants): ChatResult {
  if (!isObject(body)) throw bad('reply', body, 'a JSON object');
  const choices = body.choices;
  if (!Array.isArray(choices) || choices.length === 0) throw bad('choices', choices, 'a non-empty array');
  const choice = choices[0];
  if (!isObject(choice)) throw bad('choices[0]', choice, 'an object');
  const message = choice.message;
  if (!isObject(message)) throw bad('choices[0].message', message, 'an object');
  const content = message.content ?? '';
  if (typeof content !== 'string') throw bad('choices[0].message.content', content, 'a string or null');
  const finishReason = choice.finish_reason;
  if (typeof finishReason !== 'string' || finishReason === '')
    throw bad('choices[0].finish_reason', finishReason, 'a non-empty string');

  const ext = sglextIds(body.sglext);
  const promptIds =
    body.prompt_token_ids != null
      ? intArray(body.prompt_token_ids, 'prompt_token_ids')
      : choice.prompt_token_ids != null
        ? intArray(choice.prompt_token_ids, 'choices[0].prompt_token_ids')
        : ext.input !== null
          ? intArray(ext.input, 'sglext.input_ids')
          : null;
  const logprobs = parseLogprobs(choice.logprobs);
  const responseIds =
    choice.token_ids != null
      ? intArray(choice.token_ids, 'choices[0].token_ids')
      : ext.output !== null
        ? intArray(ext.output, 'sglext.output_ids[0]')
        : logprobIds(choice.logprobs);
  if (responseIds !== null && logprobs !== null && responseIds.length !== logprobs.length) {
    throw new LlmError(
      'ERR_LLM_BAD_REPLY',
      `choices[0].logprobs.content has ${logprobs.length} entries but choices[0].token_ids has ${responseIds.length}`,
    );
  }
  const usage = isObject(body.usage) ? body.usage : {};
  const toolCalls = parseToolCallsField(message.tool_calls);
  let routedExperts: RoutedExperts | undefined;
  if (wants?.routedExperts === true) {
    try {
      routedExperts = readVllmReplyRouted(body, choice, {
        start: 0,
        promptLength: promptIds?.length ?? (typeof usage.prompt_tokens === 'number' ? usage.prompt_tokens : null),
        completionLength: responseIds?.length ?? null,
      });
    } catch (err) {
      const why = (err as Error).message;
      throw new LlmError(
        'ERR_LLM_BAD_REPLY',
        `${REPLY}: ${why.startsWith('routed_experts') ? `choices[0].${why}` : why}`,
      );
    }
  }
  return {
    ...(toolCalls !== null ? { toolCalls } : {}),
    ...(routedExperts !== undefined ? { routedExperts } : {}),
    content,
    // Compared lower-case everywhere: a server answering "STOP" means stop (regression: it failed the rollout).
    finishReason: finishReason.toLowerCase(),
    promptIds,
    responseIds,
    logprobs,
    weightVersion: weightVersionOf(body),
    promptTokens: typeof usage.prompt_tokens === 'number' ? usage.prompt_tokens : null,
    completionTokens: typeof usage.completion_tokens === 'number' ? usage.completion_tokens : null,
  };
}

/**
 * SGLang's response-level extension (sgl-project/sglang#34488): `input_ids`, the prompt every choice
 * shares, and `output_ids`, one array per choice; the first choice's is the reply's. Unchecked here:
 * the caller reads them as token ids, naming the field.
 */
export function sglextIds(value: unknown, where = REPLY): { input: unknown; output: unknown } {
  if (value == null) return { input: null, output: null };
  if (!isObject(value)) throw bad('sglext', value, 'an object', where);
  const outputs = value.output_ids;
  if (outputs != null && !Array.isArray(outputs))
    throw bad('sglext.output_ids', outputs, 'an array with one array of token ids per choice', where);
  return { input: value.input_ids ?? null, output: outputs?.[0] ?? null };
}

/**
 * `message.tool_calls` (OpenAI; vLLM with `--enable-auto-tool-choice`): `[{id, type: "function",
 * function: {name, arguments}}]`, `arguments` a JSON string. An object there (some servers) is taken
 * as its JSON text. Null or empty: no calls. The arguments are not parsed here: bad JSON is the
 * model's mistake, shown to it as the call's result (worker/tools.ts), not a bad reply.
 */
export function parseToolCallsField(value: unknown, where = REPLY): ParsedToolCall[] | null {
  if (value == null) return null;
  if (!Array.isArray(value)) throw bad('choices[0].message.tool_calls', value, 'an array or null', where);
  if (value.length === 0) return null;
  return value.map((call, i) => {
    const field = `choices[0].message.tool_calls[${i}]`;
    if (!isObject(call) || !isObject(call.function))
      throw bad(`${field}.function`, isObject(call) ? call.function : call, 'an object', where);
    const { name, arguments: args } = call.function;
    if (typeof name !== 'string') throw bad(`${field}.function.name`, name, 'a string', where);
    if (typeof call.id !== 'string' || call.id === '') throw bad(`${field}.id`, call.id, 'a non-empty string', where);
    return { id: call.id, name, arguments: typeof args === 'string' ? args : JSON.stringify(args ?? {}) };
  });
}

function parseLogprobs(value: unknown): Float32Array | null {
  if (value == null) return null;
  const out = new Float32Array(logprobEntries(value).length);
  readLogprobs(value, (lp, i) => (out[i] = lp));
  return out;
}

/**
 * llama.cpp's `llama-server` sends no `token_ids`: each `logprobs.content[]` entry carries its token's
 * `id` instead (tools/server/server-task.cpp `completion_token_output::probs_vector_to_json`, in the
 * llama.cpp that node-llama-cpp 3.22.1 bundles). Ids only when every entry has one, so they stay
 * aligned with the logprobs.
 */
export function logprobIds(value: unknown, where = REPLY): Int32Array | null {
  if (value == null) return null;
  const entries = logprobEntries(value, where);
  if (entries.length === 0 || (entries[0] as { id?: unknown } | null)?.id === undefined) return null;
  const out = new Int32Array(entries.length);
  for (let i = 0; i < entries.length; i++) {
    const id = (entries[i] as { id?: unknown } | null)?.id;
    if (!Number.isInteger(id) || (id as number) < 0 || (id as number) > 0x7fffffff)
      throw bad(`choices[0].logprobs.content[${i}].id`, id, 'a non-negative integer token id', where);
    out[i] = id as number;
  }
  return out;
}

function logprobEntries(value: unknown, where = REPLY): unknown[] {
  if (!isObject(value) || !Array.isArray(value.content))
    throw bad('choices[0].logprobs.content', isObject(value) ? value.content : value, 'an array', where);
  return value.content;
}

/** A logprob may come out a hair above 0 from the server's float arithmetic; more is not a log-probability. */
const LOGPROB_ROUNDING = 1e-3;
const FLOAT32_MAX = 3.4028234663852886e38;

/** Each `logprobs.content[i].logprob`, checked, to `take`; returns how many. */
export function readLogprobs(value: unknown, take: (logprob: number, i: number) => void, where = REPLY): number {
  const entries = logprobEntries(value, where);
  for (let i = 0; i < entries.length; i++) {
    const lp = (entries[i] as { logprob?: unknown } | null)?.logprob;
    // Stored as float32: beyond its range a logprob would become -Infinity (null in JSON) in the batch.
    if (typeof lp !== 'number' || !(lp <= LOGPROB_ROUNDING) || lp < -FLOAT32_MAX) {
      throw bad(`choices[0].logprobs.content[${i}].logprob`, lp, 'a log-probability: a finite number ≤ 0', where);
    }
    take(lp, i);
  }
  return entries.length;
}

function intArray(value: unknown, field: string): Int32Array {
  if (!Array.isArray(value)) throw bad(field, value, 'an array of token ids');
  const out = new Int32Array(value.length);
  readTokenIds(value, field, (id, i) => (out[i] = id));
  return out;
}

/** Each token id of `value` (a JSON array), checked, to `take`; returns how many. */
export function readTokenIds(
  value: unknown,
  field: string,
  take: (id: number, i: number) => void,
  where = REPLY,
): number {
  if (!Array.isArray(value)) throw bad(field, value, 'an array of token ids', where);
  for (let i = 0; i < value.length; i++) {
    const id = value[i];
    if (!Number.isInteger(id) || id < 0 || id > 0x7fffffff)
      throw bad(`${field}[${i}]`, id, 'a non-negative integer token id', where);
    take(id, i);
  }
  return value.length;
}

/** Longest weight version kept: a name, not a payload. */
export const MAX_WEIGHT_VERSION_LENGTH = 256;

/**
 * Why `version` cannot name the weights a trainer announces, or null when it can. It is a name, kept
 * in shared memory, compared with what servers report and printed in logs and warnings: one line of
 * text, so control characters (NUL, newlines) are refused rather than carried into all of those.
 */
export function announcedVersionProblem(version: string): string | null {
  if (version === '' || version.length > MAX_WEIGHT_VERSION_LENGTH)
    return `must be a non-empty string of at most ${MAX_WEIGHT_VERSION_LENGTH} characters`;
  for (let i = 0; i < version.length; i++) {
    const code = version.charCodeAt(i);
    if (code < 0x20 || code === 0x7f) return 'must hold no control characters (NUL, newlines, tabs)';
  }
  return null;
}

/**
 * The server's weight version as text. Any string or integer is accepted — a rollout never fails over
 * a version's format; only a value that is no name at all (an object, a fraction, a huge string) is
 * a bad reply.
 */
export function weightVersionOf(body: Record<string, unknown>, where = REPLY): string | null {
  const candidates = [
    isObject(body.metadata) ? body.metadata.weight_version : undefined,
    isObject(body.meta_info) ? body.meta_info.weight_version : undefined,
    body.weight_version,
  ];
  for (const v of candidates) {
    if (v == null) continue;
    if (typeof v === 'string' && v.length <= MAX_WEIGHT_VERSION_LENGTH) return v;
    if (Number.isSafeInteger(v)) return String(v);
    throw bad(
      'metadata.weight_version',
      v,
      `a string of at most ${MAX_WEIGHT_VERSION_LENGTH} characters or an integer`,
      where,
    );
  }
  return null;
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Where a bad field was found, first in its error message: the reply, or one event of a streamed reply. */
const REPLY = 'inference reply';

/**
 * One streamed event's data read as JSON and handed to `take`; the error either raises, as an
 * ERR_LLM_BAD_REPLY naming the event (`where`), or null. A stream reader keeps the first and reads no further.
 */
export function takeEvent(data: string, where: string, take: (body: unknown, where: string) => void): LlmError | null {
  try {
    let body: unknown;
    try {
      body = JSON.parse(data);
    } catch {
      throw new LlmError('ERR_LLM_BAD_REPLY', `${where} is not JSON: ${preview(data)}`);
    }
    take(body, where);
    return null;
  } catch (err) {
    return err instanceof LlmError ? err : new LlmError('ERR_LLM_BAD_REPLY', `${where}: ${(err as Error).message}`);
  }
}

/** An event that is an object, and not the `{"error": {message}}` vLLM and SGLang send on a failure mid-stream. */
export function eventObject(body: unknown, where: string): Record<string, unknown> {
  if (!isObject(body)) throw bad('event', body, 'a JSON object', where);
  if (body.error !== undefined) {
    const message =
      isObject(body.error) && typeof body.error.message === 'string' ? body.error.message : preview(body.error);
    throw new LlmError('ERR_LLM_BAD_REPLY', `${where}: the server reported an error: ${message}`);
  }
  return body;
}

export function bad(field: string, value: unknown, expected: string, where = REPLY): LlmError {
  return new LlmError('ERR_LLM_BAD_REPLY', `${where}: ${field} must be ${expected} (got ${preview(value)})`);
}

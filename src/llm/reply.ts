/**
 * Parsing an OpenAI chat-completion reply into what the agent loop needs. A reply that cannot be used
 * becomes an LlmError naming the field and the value — the rollout fails with it, nothing crashes.
 */
import type { FinishReason } from '../protocol/rollout.ts';
import { LlmError } from './errors.ts';
import { preview } from '../protocol/errors.ts';

export interface ChatResult {
  content: string;
  finishReason: FinishReason;
  /** vLLM `prompt_token_ids` / `choices[0].token_ids` when the server returns them. */
  promptIds: Int32Array | null;
  responseIds: Int32Array | null;
  /** `choices[0].logprobs.content[].logprob`, aligned with responseIds when both are present. */
  logprobs: Float32Array | null;
  /** Weight version reported by the server (`metadata.weight_version`, SGLang `meta_info`, or top level). */
  weightVersion: number | null;
  promptTokens: number | null;
  completionTokens: number | null;
}

export function parseChatReply(body: unknown): ChatResult {
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
  if (typeof finishReason !== 'string' || finishReason === '') throw bad('choices[0].finish_reason', finishReason, 'a non-empty string');

  const promptIds = body.prompt_token_ids == null ? null : intArray(body.prompt_token_ids, 'prompt_token_ids');
  const responseIds = choice.token_ids == null ? null : intArray(choice.token_ids, 'choices[0].token_ids');
  const logprobs = parseLogprobs(choice.logprobs);
  if (responseIds !== null && logprobs !== null && responseIds.length !== logprobs.length) {
    throw new LlmError(
      'ERR_LLM_BAD_REPLY',
      `choices[0].logprobs.content has ${logprobs.length} entries but choices[0].token_ids has ${responseIds.length}`,
    );
  }
  const usage = isObject(body.usage) ? body.usage : {};
  return {
    content,
    finishReason,
    promptIds,
    responseIds,
    logprobs,
    weightVersion: weightVersionOf(body),
    promptTokens: typeof usage.prompt_tokens === 'number' ? usage.prompt_tokens : null,
    completionTokens: typeof usage.completion_tokens === 'number' ? usage.completion_tokens : null,
  };
}

function parseLogprobs(value: unknown): Float32Array | null {
  if (value == null) return null;
  const out = new Float32Array(logprobEntries(value).length);
  readLogprobs(value, (lp, i) => (out[i] = lp));
  return out;
}

function logprobEntries(value: unknown, where = REPLY): unknown[] {
  if (!isObject(value) || !Array.isArray(value.content)) throw bad('choices[0].logprobs.content', isObject(value) ? value.content : value, 'an array', where);
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
export function readTokenIds(value: unknown, field: string, take: (id: number, i: number) => void, where = REPLY): number {
  if (!Array.isArray(value)) throw bad(field, value, 'an array of token ids', where);
  for (let i = 0; i < value.length; i++) {
    const id = value[i];
    if (!Number.isInteger(id) || id < 0 || id > 0x7fffffff) throw bad(`${field}[${i}]`, id, 'a non-negative integer token id', where);
    take(id, i);
  }
  return value.length;
}

export function weightVersionOf(body: Record<string, unknown>, where = REPLY): number | null {
  const candidates = [
    isObject(body.metadata) ? body.metadata.weight_version : undefined,
    isObject(body.meta_info) ? body.meta_info.weight_version : undefined,
    body.weight_version,
  ];
  for (const v of candidates) {
    if (v == null) continue;
    const n = typeof v === 'string' && /^\d+$/.test(v) ? Number(v) : v;
    // Model steps are stored as int32 per token: a version outside that range is a bad reply, not a wrap.
    if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > 0x7fffffff) throw bad('metadata.weight_version', v, 'an integer in [0, 2147483647]', where);
    return n;
  }
  return null;
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Where a bad field was found, first in its error message: the reply, or one event of a streamed reply. */
const REPLY = 'inference reply';

export function bad(field: string, value: unknown, expected: string, where = REPLY): LlmError {
  return new LlmError('ERR_LLM_BAD_REPLY', `${where}: ${field} must be ${expected} (got ${preview(value)})`);
}

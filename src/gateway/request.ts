/**
 * Validation of `POST /v1/chat/completions` bodies. Strict where passing a value on would change the
 * tokens silently (n > 1, non-text content parts), lenient about fields the gateway does not need
 * (user, metadata, …). Every error names the field as `param` and shows the value.
 */
import { CHAT_ROLES, contentText } from './chat-content.ts';
import { preview } from '../errors.ts';
import { GatewayError } from './errors.ts';
import type { SamplingParams } from './backend.ts';
import type { ChatMessageInput } from '../chat-model/model.ts';

export interface ChatCompletionRequest extends SamplingParams {
  messages: ChatMessageInput[];
  model: string | null;
  /** Completion budget (max_completion_tokens, else max_tokens); null = the rest of the context. */
  maxTokens: number | null;
  stream: boolean;
  includeUsage: boolean;
  /** OpenAI `logprobs`: the reply carries logprobs (the trace always keeps them). */
  logprobs: boolean;
  topLogprobs: number;
  /** vLLM's `return_token_ids`: the reply carries prompt_token_ids and token_ids. */
  returnTokenIds: boolean;
  sessionId: string | null;
  tools: unknown[] | null;
}

const MAX_SESSION_ID_LENGTH = 256;

function bad(param: string, rule: string, value: unknown): never {
  throw new GatewayError('ERR_GATEWAY_BAD_REQUEST', `${param} ${rule} (got ${preview(value)})`, { param });
}

export function parseMessages(value: unknown, param = 'messages'): ChatMessageInput[] {
  if (!Array.isArray(value) || value.length === 0) bad(param, 'must be a non-empty array', value);
  return value.map((raw, i) => {
    const m = raw as Record<string, unknown> | null;
    if (typeof m !== 'object' || m === null || Array.isArray(m)) bad(`${param}[${i}]`, 'must be an object', m);
    if (typeof m.role !== 'string' || !CHAT_ROLES.has(m.role))
      bad(`${param}[${i}].role`, `must be one of ${[...CHAT_ROLES].join(', ')}`, m.role);
    const message: ChatMessageInput = {
      role: m.role,
      content: contentText(m.content, `${param}[${i}].content`, bad, 'the gateway renders text only'),
    };
    if (typeof m.name === 'string') message.name = m.name;
    if (Array.isArray(m.tool_calls)) message.tool_calls = m.tool_calls;
    if (typeof m.tool_call_id === 'string') message.tool_call_id = m.tool_call_id;
    return message;
  });
}

export function parseSessionId(value: unknown, param: string): string {
  if (typeof value !== 'string' || value.length === 0 || value.length > MAX_SESSION_ID_LENGTH) {
    bad(param, `must be a non-empty string of at most ${MAX_SESSION_ID_LENGTH} characters`, value);
  }
  return value;
}

function optional<T>(
  b: Record<string, unknown>,
  key: string,
  check: (v: unknown) => boolean,
  rule: string,
): T | undefined {
  const value = b[key];
  if (value === undefined || value === null) return undefined;
  if (!check(value)) bad(key, rule, value);
  return value as T;
}

const isBool = (v: unknown): boolean => typeof v === 'boolean';
const isNumber = (v: unknown): boolean => typeof v === 'number' && Number.isFinite(v);
const isPositiveInt = (v: unknown): boolean => typeof v === 'number' && Number.isSafeInteger(v) && v > 0;
const isInt = (v: unknown): boolean => typeof v === 'number' && Number.isInteger(v) && Math.abs(v) <= 2 ** 63;

export function parseJsonObject(raw: string): Record<string, unknown> {
  let body: unknown;
  try {
    body = JSON.parse(raw);
  } catch (err) {
    throw new GatewayError('ERR_GATEWAY_BAD_REQUEST', `request body is not valid JSON: ${(err as Error).message}`);
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw new GatewayError('ERR_GATEWAY_BAD_REQUEST', `request body must be a JSON object (got ${preview(body)})`);
  }
  return body as Record<string, unknown>;
}

export function parseChatCompletionRequest(b: Record<string, unknown>): ChatCompletionRequest {
  const messages = parseMessages(b.messages);
  const n = optional<number>(b, 'n', isPositiveInt, 'must be a positive integer');
  if (n !== undefined && n !== 1) bad('n', 'must be 1 (a session records one completion per call)', n);
  const streamOptions = optional<Record<string, unknown>>(
    b,
    'stream_options',
    (v) => typeof v === 'object' && !Array.isArray(v),
    'must be an object',
  );
  const stop = optional<string | string[]>(
    b,
    'stop',
    (v) => typeof v === 'string' || (Array.isArray(v) && v.every((s) => typeof s === 'string')),
    'must be a string or an array of strings',
  );
  const sessionId =
    b.session_id === undefined || b.session_id === null ? null : parseSessionId(b.session_id, 'session_id');
  const tools = optional<unknown[]>(b, 'tools', Array.isArray, 'must be an array');
  const request: ChatCompletionRequest = {
    messages,
    model: optional<string>(b, 'model', (v) => typeof v === 'string', 'must be a string') ?? null,
    maxTokens:
      optional<number>(b, 'max_completion_tokens', isPositiveInt, 'must be a positive integer') ??
      optional<number>(b, 'max_tokens', isPositiveInt, 'must be a positive integer') ??
      null,
    stream: optional<boolean>(b, 'stream', isBool, 'must be a boolean') === true,
    includeUsage: streamOptions?.include_usage === true,
    logprobs: optional<boolean>(b, 'logprobs', isBool, 'must be a boolean') === true,
    topLogprobs:
      optional<number>(
        b,
        'top_logprobs',
        (v) => Number.isInteger(v) && (v as number) >= 0 && (v as number) <= 20,
        'must be an integer in [0, 20]',
      ) ?? 0,
    returnTokenIds: optional<boolean>(b, 'return_token_ids', isBool, 'must be a boolean') === true,
    sessionId,
    tools: tools !== undefined && tools.length > 0 ? tools : null,
    temperature: optional<number>(b, 'temperature', isNumber, 'must be a number'),
    topP: optional<number>(b, 'top_p', isNumber, 'must be a number'),
    topK: optional<number>(b, 'top_k', isInt, 'must be an integer'),
    minP: optional<number>(b, 'min_p', isNumber, 'must be a number'),
    presencePenalty: optional<number>(b, 'presence_penalty', isNumber, 'must be a number'),
    frequencyPenalty: optional<number>(b, 'frequency_penalty', isNumber, 'must be a number'),
    repetitionPenalty: optional<number>(b, 'repetition_penalty', isNumber, 'must be a number'),
    seed: optional<number>(b, 'seed', isInt, 'must be a 64-bit integer'),
    stop: stop === undefined ? undefined : typeof stop === 'string' ? [stop] : stop,
  };
  if (request.topLogprobs > 0 && !request.logprobs) bad('top_logprobs', 'needs logprobs: true', request.topLogprobs);
  return request;
}

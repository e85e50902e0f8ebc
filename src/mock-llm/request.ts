/**
 * Validation of chat completion requests. The mock is strict where a real server would reject the
 * request (so engine bugs surface in tests) and lenient about fields it merely ignores (temperature,
 * stop, …), checking only their types. Every error names the field (as `param`) and the value.
 */
import { CHAT_ROLES, contentText } from '../gateway/chat-content.ts';
import { show } from '../env/synthetic/params.ts';
import type { PromptMessage } from './policy.ts';

export interface MockChatRequest {
  messages: PromptMessage[];
  /** Completion token budget (max_completion_tokens, else max_tokens); null = unlimited. */
  maxTokens: number | null;
  logprobs: boolean;
  returnTokenIds: boolean;
  /** OpenAI `seed`: when set, the completion depends on it and the conversation only (see policy.ts). */
  seed: number | undefined;
  /**
   * vLLM `continue_final_message`: the last message is an assistant message to continue, not a turn
   * to answer (partial rollouts resume an aborted generation this way).
   */
  continueFinalMessage: boolean;
  /** vLLM `add_generation_prompt` (default true): whether the prompt ends with an open assistant header. */
  addGenerationPrompt: boolean;
  /** `stream`: the answer comes as server-sent `chat.completion.chunk` events, ending with `data: [DONE]`. */
  stream: boolean;
  /** `stream_options.include_usage`: a last chunk with no choices carries the usage. */
  includeUsage: boolean;
  /** `model` as sent (the dialects check or echo it); undefined when absent. */
  model: string | undefined;
  /** SGLang's `return_prompt_token_ids` (the sglang dialect puts the ids on each choice). */
  returnPromptTokenIds: boolean;
  /**
   * SGLang's `return_input_ids_in_sglext` / `return_output_ids_in_sglext` (sgl-project/sglang#34488):
   * the prompt ids and each choice's ids in the response-level `sglext`, streamed or not.
   */
  sglextIds: { input: boolean; output: boolean };
  /** `top_logprobs`; null when absent (llama.cpp then returns 20 alternatives). */
  topLogprobs: number | null;
  /** The request offered tools (a non-empty `tools`): a reply that calls them comes as `tool_calls`. */
  tools: boolean;
  /** vLLM's and SGLang's `priority` (an integer); undefined when absent (capacity.scheduling reads it). */
  priority?: number;
}

export class RequestError extends Error {
  readonly param: string | null;
  constructor(message: string, param: string | null) {
    super(message);
    this.param = param;
  }
}

/** Refuses the request: `param` breaks `rule`, quoting the value it had. */
export function bad(param: string, rule: string, value: unknown): never {
  throw new RequestError(`${param} ${rule} (got ${show(value)})`, param);
}

/** The request body parsed as JSON, refused unless it is a JSON object. */
export function objectBody(raw: string): Record<string, unknown> {
  let body: unknown;
  try {
    body = JSON.parse(raw);
  } catch (error) {
    throw new RequestError(`request body is not valid JSON: ${(error as Error).message}`, null);
  }
  if (typeof body !== 'object' || body === null || Array.isArray(body))
    throw new RequestError(`request body must be a JSON object (got ${show(body)})`, null);
  return body as Record<string, unknown>;
}

function parseMessages(value: unknown): PromptMessage[] {
  if (!Array.isArray(value) || value.length === 0) bad('messages', 'must be a non-empty array', value);
  const messages: PromptMessage[] = new Array(value.length);
  for (let i = 0; i < value.length; i++) {
    const m = value[i] as { role?: unknown; content?: unknown } | null;
    if (typeof m !== 'object' || m === null || Array.isArray(m)) bad(`messages[${i}]`, 'must be an object', m);
    if (typeof m.role !== 'string' || !CHAT_ROLES.has(m.role)) {
      bad(`messages[${i}].role`, `must be one of ${[...CHAT_ROLES].join(', ')}`, m.role);
    }
    messages[i] = {
      role: m.role,
      content: contentText(m.content, `messages[${i}].content`, bad, 'the mock reads text only'),
    };
  }
  return messages;
}

function optional(body: Record<string, unknown>, key: string, check: (v: unknown) => boolean, rule: string): unknown {
  const value = body[key];
  if (value === undefined || value === null) return undefined;
  if (!check(value)) bad(key, rule, value);
  return value;
}

const isBool = (v: unknown): boolean => typeof v === 'boolean';
const isNumber = (v: unknown): boolean => typeof v === 'number' && Number.isFinite(v);
const isPositiveInt = (v: unknown): boolean => typeof v === 'number' && Number.isSafeInteger(v) && v > 0;
/** vLLM takes any int64 seed; beyond 2^53 JSON numbers are already rounded, so nearby huge seeds may coincide. */
export const isInt64 = (v: unknown): boolean => typeof v === 'number' && Number.isInteger(v) && Math.abs(v) <= 2 ** 63;

export function parseChatRequest(raw: string): MockChatRequest {
  const b = objectBody(raw);
  const messages = parseMessages(b.messages);
  const model = optional(b, 'model', (v) => typeof v === 'string', 'must be a string') as string | undefined;
  const stream = optional(b, 'stream', isBool, 'must be a boolean') === true;
  const streamOptions = optional(
    b,
    'stream_options',
    (v) => typeof v === 'object' && !Array.isArray(v),
    'must be an object',
  ) as Record<string, unknown> | undefined;
  if (streamOptions !== undefined && !stream)
    bad('stream_options', 'is only allowed with stream: true (as in vLLM)', streamOptions);
  const includeUsage = streamOptions?.include_usage;
  if (includeUsage != null && !isBool(includeUsage))
    bad('stream_options.include_usage', 'must be a boolean', includeUsage);
  const n = optional(b, 'n', isPositiveInt, 'must be a positive integer');
  if (n !== undefined && n !== 1) bad('n', 'must be 1 (the mock generates one choice)', n);
  const maxTokens = optional(b, 'max_tokens', isPositiveInt, 'must be a positive integer');
  const maxCompletion = optional(b, 'max_completion_tokens', isPositiveInt, 'must be a positive integer');
  const logprobs = optional(b, 'logprobs', isBool, 'must be a boolean');
  const topLogprobs = optional(
    b,
    'top_logprobs',
    (v) => typeof v === 'number' && Number.isInteger(v) && v >= 0 && v <= 20,
    'must be an integer in [0, 20]',
  ) as number | undefined;
  const returnTokenIds = optional(b, 'return_token_ids', isBool, 'must be a boolean');
  const returnPromptTokenIds = optional(b, 'return_prompt_token_ids', isBool, 'must be a boolean');
  const sglextInput = optional(b, 'return_input_ids_in_sglext', isBool, 'must be a boolean');
  const sglextOutput = optional(b, 'return_output_ids_in_sglext', isBool, 'must be a boolean');
  optional(b, 'temperature', isNumber, 'must be a number');
  optional(b, 'top_p', isNumber, 'must be a number');
  const seed = optional(b, 'seed', isInt64, 'must be a 64-bit integer') as number | undefined;
  const priority = optional(b, 'priority', isInt64, 'must be a 64-bit integer') as number | undefined;
  optional(
    b,
    'stop',
    (v) => typeof v === 'string' || (Array.isArray(v) && v.every((s) => typeof s === 'string')),
    'must be a string or an array of strings',
  );
  const tools = optional(b, 'tools', (v) => Array.isArray(v), 'must be an array of tools') as unknown[] | undefined;
  const continueFinal = optional(b, 'continue_final_message', isBool, 'must be a boolean') === true;
  const addGenerationPrompt = optional(b, 'add_generation_prompt', isBool, 'must be a boolean');
  if (continueFinal) {
    // vLLM rejects both flags true, and its add_generation_prompt defaults to true: an engine that
    // forgets to send false would fail against the real server, so it fails here too.
    if (addGenerationPrompt !== false) {
      bad(
        'add_generation_prompt',
        'must be false when continue_final_message is true (it defaults to true, as in vLLM)',
        b.add_generation_prompt,
      );
    }
    const last = messages[messages.length - 1];
    if (last.role !== 'assistant') {
      bad(
        'continue_final_message',
        `needs the last message to be an assistant message (messages[${messages.length - 1}].role)`,
        last.role,
      );
    }
  }
  return {
    messages,
    maxTokens: (maxCompletion ?? maxTokens ?? null) as number | null,
    logprobs: logprobs === true,
    returnTokenIds: returnTokenIds === true,
    seed,
    continueFinalMessage: continueFinal,
    addGenerationPrompt: addGenerationPrompt !== false,
    stream,
    includeUsage: includeUsage === true,
    model,
    returnPromptTokenIds: returnPromptTokenIds === true,
    sglextIds: { input: sglextInput === true, output: sglextOutput === true },
    topLogprobs: topLogprobs ?? null,
    tools: tools !== undefined && tools.length > 0,
    ...(priority !== undefined ? { priority } : {}),
  };
}

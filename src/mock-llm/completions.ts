/**
 * vLLM's token-in completions shape for the mock: `POST /v1/completions {prompt: number[] | string,
 * max_tokens, logprobs: k, return_token_ids, seed}` → `choices[0].token_ids` (ending in the end-of-turn
 * token when generation stopped on it, as a real chat model's ids do), `choices[0].logprobs`
 * (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`), `finish_reason`, `usage`,
 * `metadata.weight_version`. Validation errors name the field, as on the chat endpoint.
 */
import { createRng } from '../env/synthetic/rng.ts';
import { requestStreamSeed } from './policy.ts';
import { bad, isInt64, objectBody } from './request.ts';
import type { MockVocabulary } from './vocab.ts';
import { logprobText, type TokenDraws } from './response.ts';

export interface TokenCompletionRequest {
  /** Prompt ids; a string prompt is encoded with the server's vocabulary. */
  prompt: number[] | string;
  /** vLLM's default is 16 when the request names none. */
  maxTokens: number;
  /** Alternatives per token to return (vLLM `logprobs: k`); null = no logprobs. */
  logprobs: number | null;
  returnTokenIds: boolean;
  seed: number | undefined;
  /** `model` as sent (the vllm dialect checks it); undefined when absent. */
  model: string | undefined;
  /** vLLM `routed_experts_prompt_start`: prompt tokens whose routing is left out (0 = none). */
  routedExpertsPromptStart: number;
  /**
   * `prompt_logprobs`: alternatives per prompt position besides the prompt token itself (vLLM
   * CompletionRequest.prompt_logprobs); set = a scoring request (scoring.ts). null when absent.
   */
  promptLogprobs: number | null;
  /** vLLM's `priority`; undefined when absent. */
  priority?: number;
}

const VLLM_DEFAULT_MAX_TOKENS = 16;

export function parseTokenCompletionRequest(raw: string): TokenCompletionRequest {
  const b = objectBody(raw);
  const prompt = b.prompt;
  if (typeof prompt === 'string') {
    if (prompt.length === 0) bad('prompt', 'must not be empty', prompt);
  } else if (Array.isArray(prompt)) {
    if (prompt.length === 0) bad('prompt', 'must be a non-empty array of token ids', prompt);
    for (let i = 0; i < prompt.length; i++) {
      if (!Number.isSafeInteger(prompt[i]) || prompt[i] < 0)
        bad(`prompt[${i}]`, 'must be a token id (a non-negative integer; one prompt per request)', prompt[i]);
    }
  } else {
    bad('prompt', 'must be an array of token ids or a string', prompt);
  }
  const check = (key: string, ok: (v: unknown) => boolean, rule: string): unknown => {
    const v = b[key];
    if (v === undefined || v === null) return undefined;
    if (!ok(v)) bad(key, rule, v);
    return v;
  };
  const maxTokens = check(
    'max_tokens',
    (v) => Number.isSafeInteger(v) && (v as number) > 0,
    'must be a positive integer',
  ) as number | undefined;
  const logprobs = check(
    'logprobs',
    (v) => Number.isInteger(v) && (v as number) >= 0 && (v as number) <= 20,
    'must be an integer in [0, 20]',
  ) as number | undefined;
  const returnTokenIds = check('return_token_ids', (v) => typeof v === 'boolean', 'must be a boolean');
  const seed = check('seed', isInt64, 'must be a 64-bit integer') as number | undefined;
  const priority = check('priority', isInt64, 'must be a 64-bit integer') as number | undefined;
  const n = check('n', (v) => Number.isSafeInteger(v) && (v as number) > 0, 'must be a positive integer');
  if (n !== undefined && n !== 1) bad('n', 'must be 1 (the mock generates one choice)', n);
  if (check('stream', (v) => typeof v === 'boolean', 'must be a boolean') === true)
    bad('stream', 'is not supported by the mock (send stream: false)', true);
  if (check('echo', (v) => typeof v === 'boolean', 'must be a boolean') === true)
    bad('echo', 'is not supported by the mock', true);
  const model = check('model', (v) => typeof v === 'string', 'must be a string') as string | undefined;
  const promptLogprobs = check(
    'prompt_logprobs',
    (v) => Number.isInteger(v) && (v as number) >= -1,
    'must be an integer >= -1',
  ) as number | undefined;
  check('temperature', (v) => typeof v === 'number' && Number.isFinite(v), 'must be a number');
  check('top_p', (v) => typeof v === 'number' && Number.isFinite(v), 'must be a number');
  const routedStart = check(
    'routed_experts_prompt_start',
    (v) => Number.isSafeInteger(v) && (v as number) >= 0,
    'must be a non-negative integer',
  ) as number | undefined;
  return {
    routedExpertsPromptStart: routedStart ?? 0,
    prompt: prompt as number[] | string,
    maxTokens: maxTokens ?? VLLM_DEFAULT_MAX_TOKENS,
    logprobs: logprobs ?? null,
    returnTokenIds: returnTokenIds === true,
    seed,
    model,
    promptLogprobs: promptLogprobs ?? null,
    ...(priority !== undefined ? { priority } : {}),
  };
}

/** Sub-stream of the request's randomness for logprobs (the chat endpoint's tag): never perturbs the policy. */
const LOGPROB_STREAM = 0x10b;
export const LOGPROB_STREAM_TAG = LOGPROB_STREAM;

export interface TextCompletionBody {
  index: number;
  model: string;
  vocab: MockVocabulary;
  ids: readonly number[];
  promptIds: readonly number[];
  finishReason: string;
  /** null: no `metadata` at all (the vllm dialect: vLLM's CompletionResponse has none). */
  weightVersion: number | null;
  logprobs: number | null;
  returnTokenIds: boolean;
  seed: number;
  requestSeed: number | undefined;
  /** Position of ids[0] in the whole completion (tokens a continued assistant message already had). */
  offset: number;
  /** The mock's model's draws for the reply (scoring.ts); absent: the request's random ones. */
  draws?: () => TokenDraws;
}

/**
 * log(0.999 − 0.95·u³): mostly confident tokens, an occasional uncertain one; always < 0. The value of
 * the chat routes' table (response.ts logprobText), so a token scores the same on every route.
 */
export function logprobAt(u: number): number {
  return Number(logprobText(u));
}

function randomDraws(c: Pick<TextCompletionBody, 'seed' | 'index' | 'requestSeed' | 'offset'>): TokenDraws {
  const rng = createRng(requestStreamSeed(c.seed, c.index, c.requestSeed, LOGPROB_STREAM));
  for (let i = 0; i < c.offset; i++) rng.next();
  return rng;
}

export function textCompletionJson(c: TextCompletionBody): string {
  const stopped = c.ids.length > 0 && c.ids[c.ids.length - 1] === c.vocab.endOfTurnId && c.finishReason === 'stop';
  // As vLLM's skip_special_tokens: the text leaves the end-of-turn token out, the ids keep it.
  const text = c.vocab.decode(stopped ? c.ids.slice(0, -1) : c.ids);
  let logprobs: Record<string, unknown> | null = null;
  if (c.logprobs !== null) {
    const rng = c.draws?.() ?? randomDraws(c);
    const tokens: string[] = [];
    const values: number[] = [];
    const top: Record<string, number>[] = [];
    const offsets: number[] = [];
    let at = 0;
    for (const id of c.ids) {
      const token = c.vocab.tokenText(id);
      const lp = logprobAt(rng.next(id));
      tokens.push(token);
      values.push(lp);
      top.push(c.logprobs > 0 ? { [token]: lp } : {});
      offsets.push(at);
      at += token.length;
    }
    logprobs = { tokens, token_logprobs: values, top_logprobs: top, text_offset: offsets };
  }
  const choice: Record<string, unknown> = {
    index: 0,
    text,
    logprobs,
    finish_reason: c.finishReason,
    stop_reason: null,
  };
  if (c.returnTokenIds) {
    choice.token_ids = c.ids;
    choice.prompt_token_ids = c.promptIds;
  }
  const reply: Record<string, unknown> = {
    id: `cmpl-mock-${c.index}`,
    object: 'text_completion',
    created: Math.floor(Date.now() / 1000),
    model: c.model,
    choices: [choice],
    usage: {
      prompt_tokens: c.promptIds.length,
      completion_tokens: c.ids.length,
      total_tokens: c.promptIds.length + c.ids.length,
    },
  };
  if (c.weightVersion !== null) reply.metadata = { weight_version: c.weightVersion };
  return JSON.stringify(reply);
}

/**
 * Serialises a chat.completion by hand. With logprobs on, JSON.stringify of one small object per
 * token was ~90% of the mock's CPU per request (≈90 µs for 300 tokens); concatenating cached
 * fragments costs ≈4 µs, which keeps the mock from becoming the bottleneck of a load test.
 */
import { createRng } from '../env/synthetic/rng.ts';
import { requestStreamSeed } from './policy.ts';
import { tokenJson } from './tokens.ts';

/** Sub-stream of the request's randomness, so logprobs never perturb the policy's choices. */
const LOGPROB_STREAM = 0x10b;

/**
 * Precomputed logprobs and their JSON text: log(0.999 − 0.95·u³) over u ∈ (0, 1), i.e. mostly
 * confident tokens with an occasional uncertain one, always < 0, rounded to 4 decimals.
 */
const LOGPROBS = Array.from({ length: 1024 }, (_, i) => {
  const u = (i + 0.5) / 1024;
  return String(Math.round(Math.log(0.999 - 0.95 * u * u * u) * 1e4) / 1e4);
});

/** A logprob drawn from `u` ∈ [0, 1), as the JSON number text every reply shape of the mock uses. */
export function logprobText(u: number): string {
  return LOGPROBS[Math.floor(u * LOGPROBS.length)];
}

export interface CompletionBody {
  index: number;
  model: string;
  content: string;
  finishReason: string;
  ids: readonly number[];
  promptIds: readonly number[];
  weightVersion: number;
  logprobs: boolean;
  returnTokenIds: boolean;
  /**
   * Server seed: with `requestSeed` (else `index`) it fixes the logprobs, so an aborted prefix keeps
   * the same values, and so does a continuation under the same request seed.
   */
  seed: number;
  requestSeed: number | undefined;
  /**
   * Position of `ids[0]` in the whole completion (tokens a continued assistant message already had):
   * a continuation's logprobs are the ones the uninterrupted completion has at those positions.
   */
  offset: number;
  /**
   * The calls the reply makes, answered as vLLM's hermes parser does (tool_parsers/hermes_tool_parser.py
   * extract_tool_calls; protocol.py ToolCall): `content` is the text before the first block (null when
   * none), each call `{id: "chatcmpl-tool-…", type: "function", function: {name, arguments}}` with the
   * arguments as JSON text, and finish_reason "tool_calls".
   */
  toolCalls?: readonly { id: string; name: string; arguments: string }[];
  /** The logprob draws of the reply's ids (the mock's model, scoring.ts); absent: the request's random ones. */
  draws?: () => TokenDraws;
}

/** One draw per token, in order, given the token (the mock's model conditions on it: scoring.ts). */
export interface TokenDraws {
  next(id: number): number;
}

/** The logprob draws of a completion, advanced past the `offset` tokens a continued message already has. */
export function logprobDraws(c: Pick<CompletionBody, 'seed' | 'index' | 'requestSeed' | 'offset'>): { next(): number } {
  const rng = createRng(requestStreamSeed(c.seed, c.index, c.requestSeed, LOGPROB_STREAM));
  for (let i = 0; i < c.offset; i++) rng.next();
  return rng;
}

/** `logprobs.content` entries of `ids[from..to)`, comma-separated, drawing one value per token from `draws`. */
export function logprobEntries(ids: readonly number[], from: number, to: number, draws: TokenDraws): string {
  let json = '';
  for (let i = from; i < to; i++) {
    if (i > from) json += ',';
    json += `{"token":${tokenJson(ids[i])},"logprob":${LOGPROBS[Math.floor(draws.next(ids[i]) * LOGPROBS.length)]},"bytes":null,"top_logprobs":[]}`;
  }
  return json;
}

function logprobsJson(ids: readonly number[], c: CompletionBody): string {
  return `{"content":[${logprobEntries(ids, 0, ids.length, c.draws?.() ?? logprobDraws(c))}]}`;
}

/** OpenAI chat.completion plus the vLLM extras (`token_ids`, `prompt_token_ids`) and `metadata.weight_version`. */
export function completionJson(c: CompletionBody): string {
  const promptTokens = c.promptIds.length;
  const completionTokens = c.ids.length;
  let json =
    `{"id":"chatcmpl-mock-${c.index}","object":"chat.completion","created":${Math.floor(Date.now() / 1000)},` +
    `"model":${JSON.stringify(c.model)},"choices":[{"index":0,` +
    `"message":{"role":"assistant","content":${c.toolCalls !== undefined ? (c.content === '' ? 'null' : JSON.stringify(c.content)) : JSON.stringify(c.content)}${c.toolCalls !== undefined ? `,"tool_calls":${JSON.stringify(c.toolCalls.map((t) => ({ id: t.id, type: 'function', function: { name: t.name, arguments: t.arguments } })))}` : ''}},` +
    `"logprobs":${c.logprobs ? logprobsJson(c.ids, c) : 'null'},` +
    `"finish_reason":${JSON.stringify(c.toolCalls !== undefined ? 'tool_calls' : c.finishReason)}`;
  if (c.returnTokenIds) json += `,"token_ids":${JSON.stringify(c.ids)}`;
  json +=
    `}],"usage":{"prompt_tokens":${promptTokens},"completion_tokens":${completionTokens},"total_tokens":${promptTokens + completionTokens}},` +
    `"metadata":{"weight_version":${c.weightVersion}}`;
  if (c.returnTokenIds) json += `,"prompt_token_ids":${JSON.stringify(c.promptIds)}`;
  return `${json}}`;
}

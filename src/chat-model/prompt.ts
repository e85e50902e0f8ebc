/**
 * Delta tokenization with a prefix-stability check: the prompt ids of a session's next call.
 *
 * A session remembers the text its tokens stand for (`coveredText`: the last rendered prompt plus the
 * last completion as the client saw it). The next call re-renders the whole conversation; when the
 * render starts with `coveredText`, the prompt is the session's tokens + the ids of only the new text
 * after it. The model's own completion ids are kept as they were sampled — re-tokenizing them could
 * merge or split differently (BPE boundaries, partial UTF-8), and then the trained tokens would not
 * be the generated ones.
 *
 * A render equal to the last prompt is a retry of that call (`replay`). A render that does not start
 * with `coveredText` does not extend the session's conversation (an earlier message was edited, dropped
 * or reordered, the reply was changed, a side call, a template that rewrites history): it is a `side`
 * plan, its whole render tokenized fresh, and what to make of it is the caller's — the gateway's
 * side-call rule (gateway/prompt.ts), the token-in history modes (llm/token-chat.ts). `prefixDivergence`
 * says where the two part.
 */
import type { ChatModel } from './model.ts';

/** What a session knows about its last call, as far as prompt planning is concerned. */
export interface PromptBase {
  /** The last prompt's ids followed by the last completion's ids. */
  tokens: readonly number[];
  /** Text `tokens` stand for: the last render + the last completion text (+ its stop token's text). */
  coveredText: string;
  /** The last call's rendered prompt and its length in tokens (for the replay rule). */
  lastPromptText: string;
  lastPromptLength: number;
}

export interface PromptPlan {
  /**
   * `first`: a fresh session, the whole render tokenized; `extend`: base tokens + new-text ids;
   * `replay`: the client re-sent the previous call's conversation unchanged (its own retry, or a retry
   * after an aborted generation): the previous call is dropped and its prompt is generated from again;
   * `side`: the render does not extend the conversation, tokenized whole, and not a prompt the
   * session's tokens hold.
   */
  kind: 'first' | 'extend' | 'replay' | 'side';
  promptIds: number[];
  /** How many ids were tokenized for this call. */
  deltaLength: number;
}

/** Tokens of each side shown by prefixDivergence. */
const SPAN_TOKENS = 8;
/** Characters of the new render tokenized to show its side of a divergence. */
const SPAN_CHARS = 256;

export interface PlanOptions {
  /**
   * A render that does not extend `base` throws what this returns instead of becoming a `side` plan
   * (the gateway's `sideCalls: 'refuse'`); absent: a side plan.
   */
  refuse?: (base: PromptBase) => Error;
}

export function planPrompt(
  model: ChatModel,
  base: PromptBase | null,
  rendered: string,
  options: PlanOptions = {},
): PromptPlan {
  if (base === null) {
    const ids = model.encode(rendered);
    return { kind: 'first', promptIds: ids, deltaLength: ids.length };
  }
  // Checked first: after an abort with no token generated, the render also "extends" the covered
  // text (by nothing), and stacking a second call on an empty one would leave an empty action.
  if (rendered === base.lastPromptText) {
    return { kind: 'replay', promptIds: base.tokens.slice(0, base.lastPromptLength), deltaLength: 0 };
  }
  if (rendered.startsWith(base.coveredText)) {
    const delta = model.encode(rendered.slice(base.coveredText.length));
    const promptIds = base.tokens.slice();
    for (let i = 0; i < delta.length; i++) promptIds.push(delta[i]);
    return { kind: 'extend', promptIds, deltaLength: delta.length };
  }
  if (options.refuse !== undefined) throw options.refuse(base);
  const ids = model.encode(rendered);
  return { kind: 'side', promptIds: ids, deltaLength: ids.length };
}

function firstDifference(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a.charCodeAt(i) === b.charCodeAt(i)) i++;
  return i;
}

/**
 * Index of the session token that holds character `char` of `coveredText`: the largest k whose
 * decoded prefix `tokens[0, k)` is no longer than `char` characters. Decoding is monotone in k
 * (up to a partial UTF-8 character), so a binary search needs O(log n) decodes — only a render that
 * does not extend the session pays it.
 */
function tokenAt(model: ChatModel, tokens: readonly number[], char: number): { token: number; charStart: number } {
  let lo = 0;
  let hi = tokens.length;
  while (lo < hi) {
    const mid = (lo + hi + 1) >>> 1;
    if (model.decode(tokens.slice(0, mid)).length <= char) lo = mid;
    else hi = mid - 1;
  }
  return { token: lo, charStart: model.decode(tokens.slice(0, lo)).length };
}

/** Where a render stops extending what a session holds: the first differing token and character, and both sides from there. */
export interface PrefixDivergence {
  /** Index in the session's tokens of the token holding the first differing character. */
  token: number;
  /** First character of the render that differs from the session's covered text. */
  char: number;
  /** Up to SPAN_TOKENS of the session's tokens from `token`, and their text. */
  sessionTokens: number[];
  sessionText: string;
  /** The render's tokens from the same place, and their text. */
  renderTokens: number[];
  renderText: string;
}

/** Where `rendered` diverges from `base.coveredText` (O(log n) decodes: not on an extending call's path). */
export function prefixDivergence(model: ChatModel, base: PromptBase, rendered: string): PrefixDivergence {
  const char = firstDifference(base.coveredText, rendered);
  // A render shorter than what the session holds differs right where it ends.
  const { token, charStart } = tokenAt(model, base.tokens, char);
  const sessionTokens = base.tokens.slice(token, token + SPAN_TOKENS);
  const renderTokens = model.encode(rendered.slice(charStart, charStart + SPAN_CHARS)).slice(0, SPAN_TOKENS);
  return {
    token,
    char,
    sessionTokens,
    sessionText: model.decode(sessionTokens),
    renderTokens,
    renderText: model.decode(renderTokens),
  };
}

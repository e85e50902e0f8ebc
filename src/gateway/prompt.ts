/**
 * Delta tokenization with a prefix-stability check.
 *
 * A session remembers the text its tokens stand for (`coveredText`: the last rendered prompt plus the
 * last completion as the client saw it). The next call re-renders the whole conversation; when the
 * render starts with `coveredText`, the prompt is the session's tokens + the ids of only the new text
 * after it. The model's own completion ids are kept as they were sampled — re-tokenizing them could
 * merge or split differently (BPE boundaries, partial UTF-8), and then the trained tokens would not
 * be the generated ones.
 *
 * When the render does not start with `coveredText`, the call does not extend the session's
 * conversation: an earlier message was edited, dropped or reordered, the client changed the assistant
 * text it got back, or — most often in real agents — it is a side call (a summariser, a judge, a
 * planner prompt, a retry with an edited history). What happens then is the `sideCalls` mode:
 * - `record` (the gateway's default): the plan is a `side` call, its whole render tokenized fresh. The
 *   caller records it as a trace of its own and leaves the session's tokens and text as they were, so
 *   the agent's next main call still extends the main conversation.
 * - `refuse` (the old strictness, and this function's default): the call fails with
 *   ERR_GATEWAY_PREFIX_MISMATCH, the first differing position and both spans.
 *
 * The main line is the session's first conversation, and only ever grows by extension: a side call
 * never becomes it, even when the agent goes on from the side call's reply — each call of such a new
 * line is a side call again, tokenized whole. An agent that abandons its conversation for another
 * should open a new session for it.
 *
 * A render equal to the main line's last prompt is a retry of that call (`replay`), also after side
 * calls, since they leave the main state as it was. (Retrying a side call is the caller's rule: a side
 * call with the very prompt ids of the call just before it replaces that call.)
 */
import { GatewayError } from './errors.ts';
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

/** What a call that does not extend the session's conversation becomes (see the module header). */
export type SideCallMode = 'record' | 'refuse';

export interface PromptPlan {
  /**
   * `first`: a fresh session, the whole render tokenized; `extend`: base tokens + new-text ids;
   * `replay`: the client re-sent the previous call's conversation unchanged (its own retry, or a retry
   * after an aborted generation): the previous call is dropped and its prompt is generated from again;
   * `side`: the render does not extend the conversation (`sideCalls: 'record'`), tokenized whole, and
   * not a prompt the session's tokens hold.
   */
  kind: 'first' | 'extend' | 'replay' | 'side';
  promptIds: number[];
  /** How many ids were tokenized for this call. */
  deltaLength: number;
}

/** Tokens of each side shown in a mismatch error. */
const SPAN_TOKENS = 8;
/** Characters of the new render tokenized to show its side of the mismatch. */
const SPAN_CHARS = 256;

export interface PlanOptions {
  /** Default `refuse`: a caller that cannot keep a side call apart must not get one. */
  sideCalls?: SideCallMode;
  /**
   * Index of the message whose rendering holds character `char` of the render, for the mismatch error
   * (null when unknown).
   */
  messageAt?: (char: number) => number | null;
}

export function planPrompt(
  model: ChatModel,
  sessionId: string,
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
  if (options.sideCalls === 'record') {
    const ids = model.encode(rendered);
    return { kind: 'side', promptIds: ids, deltaLength: ids.length };
  }
  throw prefixMismatch(model, sessionId, base, rendered, options.messageAt);
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
 * (up to a partial UTF-8 character), so a binary search needs O(log n) decodes — this is the error
 * path only.
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

/** Where `rendered` diverges from `base.coveredText` (an error path: O(log n) decodes). */
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

function prefixMismatch(
  model: ChatModel,
  sessionId: string,
  base: PromptBase,
  rendered: string,
  messageAt: (char: number) => number | null = () => null,
): GatewayError {
  const {
    token,
    char,
    sessionTokens: sessionSpan,
    sessionText,
    renderTokens: renderSpan,
    renderText,
  } = prefixDivergence(model, base, rendered);
  const message = messageAt(char);
  return new GatewayError(
    'ERR_GATEWAY_PREFIX_MISMATCH',
    `session ${JSON.stringify(sessionId)}: the conversation no longer starts with what this session already sent — ` +
      `first difference at token ${token} (character ${char}${message !== null ? `, in messages[${message}]` : ''}): the session has ${JSON.stringify(sessionSpan)} ${JSON.stringify(sessionText)}, ` +
      `the re-rendered conversation has ${JSON.stringify(renderSpan)} ${JSON.stringify(renderText)}. ` +
      'An earlier message was edited, dropped or reordered, or an assistant message differs from the reply it got; ' +
      'send the conversation unchanged plus new messages, or use a new session id ' +
      "(or let the gateway record such calls as side calls: option sideCalls 'record').",
    {
      param: 'messages',
      details: {
        session_id: sessionId,
        token_position: token,
        char_position: char,
        message_index: message,
        session_tokens: sessionSpan,
        session_text: sessionText,
        request_tokens: renderSpan,
        request_text: renderText,
        session_length: base.tokens.length,
      },
    },
  );
}

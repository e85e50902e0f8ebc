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
 * When the render does not start with `coveredText`, an earlier message was edited, dropped or
 * reordered (or the client changed the assistant text it got back): the session's tokens no longer
 * describe this conversation, and the call fails with the first differing position and both spans.
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

export interface PromptPlan {
  /**
   * `first`: a fresh session, the whole render tokenized; `extend`: base tokens + new-text ids;
   * `replay`: the client re-sent the previous call's conversation unchanged (its own retry, or a retry
   * after an aborted generation): the previous call is dropped and its prompt is generated from again.
   */
  kind: 'first' | 'extend' | 'replay';
  promptIds: number[];
  /** How many ids were tokenized for this call. */
  deltaLength: number;
}

/** Tokens of each side shown in a mismatch error. */
const SPAN_TOKENS = 8;
/** Characters of the new render tokenized to show its side of the mismatch. */
const SPAN_CHARS = 256;

/**
 * `messageAt(char)`: index of the message whose rendering holds character `char` of the render, for
 * the mismatch error (null when unknown).
 */
export function planPrompt(model: ChatModel, sessionId: string, base: PromptBase | null, rendered: string, messageAt: (char: number) => number | null = () => null): PromptPlan {
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
  throw prefixMismatch(model, sessionId, base, rendered, messageAt);
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

function prefixMismatch(model: ChatModel, sessionId: string, base: PromptBase, rendered: string, messageAt: (char: number) => number | null = () => null): GatewayError {
  const char = firstDifference(base.coveredText, rendered);
  const message = messageAt(char);
  // A render shorter than what the session holds differs right where it ends.
  const { token, charStart } = tokenAt(model, base.tokens, char);
  const sessionSpan = base.tokens.slice(token, token + SPAN_TOKENS);
  const renderSpan = model.encode(rendered.slice(charStart, charStart + SPAN_CHARS)).slice(0, SPAN_TOKENS);
  const sessionText = model.decode(sessionSpan);
  const renderText = model.decode(renderSpan);
  return new GatewayError(
    'ERR_GATEWAY_PREFIX_MISMATCH',
    `session ${JSON.stringify(sessionId)}: the conversation no longer starts with what this session already sent — ` +
      `first difference at token ${token} (character ${char}${message !== null ? `, in messages[${message}]` : ''}): the session has ${JSON.stringify(sessionSpan)} ${JSON.stringify(sessionText)}, ` +
      `the re-rendered conversation has ${JSON.stringify(renderSpan)} ${JSON.stringify(renderText)}. ` +
      'An earlier message was edited, dropped or reordered, or an assistant message differs from the reply it got; ' +
      'send the conversation unchanged plus new messages, or use a new session id.',
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

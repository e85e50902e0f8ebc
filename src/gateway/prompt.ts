/**
 * The gateway's rule for a call that does not extend its session's conversation (the prompt ids
 * themselves are planned in chat-model/prompt.ts): an earlier message was edited, dropped or
 * reordered, the client changed the assistant text it got back, or — most often in real agents — it
 * is a side call (a summariser, a judge, a planner prompt, a retry with an edited history). What
 * happens then is the `sideCalls` mode:
 * - `record` (the default): the plan is a `side` call, its whole render tokenized fresh. The caller
 *   records it as a trace of its own and leaves the session's tokens and text as they were, so the
 *   agent's next main call still extends the main conversation.
 * - `refuse` (the old strictness): the call fails with ERR_GATEWAY_PREFIX_MISMATCH, the first
 *   differing position and both spans (`prefixMismatch`).
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
import type { ChatModel } from '../chat-model/model.ts';
import { prefixDivergence, type PromptBase } from '../chat-model/prompt.ts';
import { GatewayError } from './errors.ts';

/** What a call that does not extend the session's conversation becomes (see the module header). */
export type SideCallMode = 'record' | 'refuse';

/** `sideCalls: 'refuse'`'s answer to a render that does not extend `base`. */
export function prefixMismatch(
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

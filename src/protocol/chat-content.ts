/**
 * OpenAI chat message content, as both servers that accept chat requests read it (the token-trace
 * gateway and the mock inference server). Each words its own errors through `bad`.
 */

/** The message roles both accept (OpenAI's, with the legacy `function`). */
export const CHAT_ROLES: ReadonlySet<string> = new Set([
  'system',
  'developer',
  'user',
  'assistant',
  'tool',
  'function',
]);

/** Throws the caller's error: `param` breaks `rule` (the message shows `value`). */
export type BadField = (param: string, rule: string, value: unknown) => never;

/**
 * The text of a message's content: a string, null (an assistant turn with tool calls), or text parts
 * concatenated. Any other part (an image, audio) is refused, not dropped: dropping it would change the
 * prompt's tokens silently. `textOnly` says why, e.g. "the gateway renders text only".
 */
export function contentText(value: unknown, param: string, bad: BadField, textOnly: string): string {
  if (typeof value === 'string') return value;
  if (value === null || value === undefined) return '';
  if (!Array.isArray(value)) bad(param, 'must be a string or an array of text parts', value);
  let text = '';
  for (let j = 0; j < value.length; j++) {
    const part = value[j] as { type?: unknown; text?: unknown } | null;
    if (typeof part !== 'object' || part === null) bad(`${param}[${j}]`, 'must be an object', part);
    if (part.type !== 'text') bad(`${param}[${j}].type`, `must be "text" (${textOnly})`, part.type);
    if (typeof part.text !== 'string') bad(`${param}[${j}].text`, 'must be a string', part.text);
    text += part.text;
  }
  return text;
}

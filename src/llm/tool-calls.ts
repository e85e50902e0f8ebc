/**
 * Tool calls in a model's raw text (`llm.api: tokens`: the server returns text, not `tool_calls`), read
 * the way vLLM's tool parsers read them, so a policy trained here calls tools as it will when served:
 *
 * - `hermes` (Qwen2.5, Hermes; vLLM `--tool-call-parser hermes`): each call is a block
 *   `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`; the text before the first block is the
 *   reply's content.
 * - `llama3_json` (Llama 3.x; vLLM `llama3_json`): the reply is one JSON object
 *   `{"name": …, "parameters": {…}}` (or several joined by `;`), optionally after `<|python_tag|>`.
 *
 * A block that is not a JSON object with a string `name` is still a call — `invalid` says why — so
 * the model is shown its mistake as the call's result (a turn it got wrong), never an engine error.
 * A reply with no block is a plain answer.
 */
import { randomBytes } from 'node:crypto';

export type ToolParser = 'hermes' | 'llama3_json';
export const TOOL_PARSERS: readonly ToolParser[] = ['hermes', 'llama3_json'];

/** A call as parsed from a reply (chat: `tool_calls`; tokens: the text). */
export interface ParsedToolCall {
  id: string;
  name: string;
  /** JSON text of the arguments; the raw block when it did not parse. */
  arguments: string;
  /** Why the block is not a call (tokens mode only): shown to the model as the call's result. */
  invalid?: string;
}

/** vLLM's id for a call it parsed: `chatcmpl-tool-` + 32 hex digits (random_tool_call_id). */
export function toolCallId(): string {
  return `chatcmpl-tool-${randomBytes(16).toString('hex')}`;
}

const HERMES_BLOCK = /<tool_call>([\s\S]*?)(?:<\/tool_call>|$)/g;
const NAME_IN_TEXT = /"name"\s*:\s*"([^"\\]*)"/;

/** The calls in `text` and the content before them; no calls: `calls` is empty and `content` is the text. */
export function parseToolCalls(parser: ToolParser, text: string): { content: string; calls: ParsedToolCall[] } {
  return parser === 'hermes' ? parseHermes(text) : parseLlama3Json(text);
}

function parseHermes(text: string): { content: string; calls: ParsedToolCall[] } {
  const first = text.indexOf('<tool_call>');
  if (first < 0) return { content: text, calls: [] };
  const calls: ParsedToolCall[] = [];
  for (const match of text.slice(first).matchAll(HERMES_BLOCK)) calls.push(callOf(match[1].trim(), 'arguments'));
  return { content: text.slice(0, first).trimEnd(), calls };
}

const PYTHON_TAG = '<|python_tag|>';

function parseLlama3Json(text: string): { content: string; calls: ParsedToolCall[] } {
  let body = text.trim();
  if (body.startsWith(PYTHON_TAG)) body = body.slice(PYTHON_TAG.length).trim();
  // vLLM's llama3_json parser only takes a reply that starts with a JSON object.
  if (!body.startsWith('{')) return { content: text, calls: [] };
  return { content: '', calls: splitTopLevel(body).map((part) => callOf(part, 'parameters')) };
}

/** `{…}; {…}` split at the semicolons between top-level objects (not those inside strings). */
function splitTopLevel(body: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let inString = false;
  let start = 0;
  for (let i = 0; i < body.length; i++) {
    const c = body[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === '{') depth++;
    else if (c === '}') depth--;
    else if (c === ';' && depth === 0) {
      parts.push(body.slice(start, i).trim());
      start = i + 1;
    }
  }
  const last = body.slice(start).trim();
  if (last !== '') parts.push(last);
  return parts;
}

function callOf(block: string, argumentsKey: 'arguments' | 'parameters'): ParsedToolCall {
  const id = toolCallId();
  let value: unknown;
  try {
    value = JSON.parse(block);
  } catch (err) {
    return {
      id,
      name: NAME_IN_TEXT.exec(block)?.[1] ?? '',
      arguments: block,
      invalid: `the tool call is not valid JSON (${(err as Error).message})`,
    };
  }
  if (
    typeof value !== 'object' ||
    value === null ||
    Array.isArray(value) ||
    typeof (value as { name?: unknown }).name !== 'string'
  ) {
    return { id, name: '', arguments: block, invalid: 'a tool call must be a JSON object with a string "name"' };
  }
  const call = value as Record<string, unknown>;
  const args = call[argumentsKey] ?? call.arguments ?? {};
  return { id, name: call.name as string, arguments: typeof args === 'string' ? args : JSON.stringify(args) };
}

/** The text a parser reads back as exactly these calls (the mock writes replies with it; tests use it). */
export function formatToolCalls(parser: ToolParser, calls: readonly { name: string; arguments: unknown }[]): string {
  if (parser === 'hermes')
    return calls
      .map((c) => `<tool_call>\n${JSON.stringify({ name: c.name, arguments: c.arguments })}\n</tool_call>`)
      .join('\n');
  return calls.map((c) => JSON.stringify({ name: c.name, parameters: c.arguments })).join('; ');
}

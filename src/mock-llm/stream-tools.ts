/**
 * Tool calls in a streamed chat completion, as vLLM's hermes parser streams them
 * (vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py extract_tool_calls_streaming
 * @00854322d23051d43e752a81b3a72247d8604294): the text before the first `<tool_call>` goes out as
 * `delta.content`; once a block's name is generated, one `delta.tool_calls` entry
 * `{index, id: "chatcmpl-tool-…", type: "function", function: {name, arguments}}` opens the call, and
 * later events carry only `{index, function: {arguments}}` pieces. The block markup itself is never
 * sent as content.
 *
 * What the mock keeps simpler than vLLM, and why:
 * - The argument pieces are paced by how much of the block's text is generated and join to exactly
 *   the arguments of the whole reply (json.dumps of the parsed object); vLLM diffs partially parsed
 *   JSON, so its pieces can differ in whitespace from the whole reply's.
 * - A block whose JSON does not parse still streams as a call, with its arguments as written: the
 *   streaming parser only ever sees partial JSON and has no "the reply is text" fallback (the whole
 *   reply's extract_tool_calls has one). The client is the one to find the arguments bad.
 * - An event whose delta is empty is still sent when it carries token ids or logprobs: vLLM skips it
 *   (serving_chat.py chat_completion_stream_generator, `delta_message is None` → continue) and its
 *   token ids with it, which would leave a trainer a hole in the sampled sequence.
 */

/** One call of a reply: where its block lies in the reply's text, and what is streamed for it. */
interface PlannedCall {
  id: string;
  name: string;
  /** What the argument pieces join to. */
  arguments: string;
  /** Text offset where the block's arguments begin: the call opens once the text reaches it. */
  from: number;
  /** Text offset where they end: the arguments are all sent once the text reaches it. */
  to: number;
}

export class ToolCallDeltas {
  /** Text offset of the first `<tool_call>`: content is the text before it. */
  readonly #contentEnd: number;
  readonly #text: string;
  readonly #calls: PlannedCall[];
  /** Characters of content sent. */
  #content = 0;
  /** Per call, characters of its arguments sent; -1 while the call is not opened. */
  readonly #sent: number[];

  /**
   * `text` is the whole reply's, holding one Hermes block per call in order (policy.ts hermesText);
   * `id(i)` names the i-th call.
   */
  constructor(text: string, calls: readonly { name: string; arguments: string }[], id: (call: number) => string) {
    this.#text = text;
    this.#contentEnd = text.indexOf('<tool_call>');
    let at = this.#contentEnd;
    this.#calls = calls.map((c, i) => {
      const block = text.indexOf('<tool_call>', at);
      const from = text.indexOf('"arguments": ', block) + '"arguments": '.length;
      at = from + c.arguments.length;
      return { id: id(i), name: c.name, arguments: streamedArguments(c.arguments), from, to: at };
    });
    this.#sent = calls.map(() => -1);
  }

  /** Any call opened: a whole generation that stopped on its own then ends with finish_reason "tool_calls". */
  get called(): boolean {
    return this.#sent.some((n) => n >= 0);
  }

  /**
   * The fields of the delta for the reply's first `chars` characters generated (what was not sent
   * yet), as JSON members without braces; '' when there is nothing new.
   */
  advance(chars: number): string {
    let json = '';
    const contentTo = Math.min(chars, this.#contentEnd);
    if (contentTo > this.#content) {
      json = `"content":${JSON.stringify(this.#text.slice(this.#content, contentTo))}`;
      this.#content = contentTo;
    }
    let calls = '';
    for (let i = 0; i < this.#calls.length; i++) {
      const c = this.#calls[i];
      if (chars < c.from) break;
      const share = chars >= c.to ? 1 : (chars - c.from) / Math.max(1, c.to - c.from);
      const upTo = Math.floor(c.arguments.length * share);
      const sent = this.#sent[i];
      if (sent >= 0 && upTo <= sent) continue;
      const piece = JSON.stringify(c.arguments.slice(Math.max(0, sent), upTo));
      if (calls !== '') calls += ',';
      calls +=
        sent < 0
          ? `{"index":${i},"id":${JSON.stringify(c.id)},"type":"function","function":{"name":${JSON.stringify(c.name)},"arguments":${piece}}}`
          : `{"index":${i},"function":{"arguments":${piece}}}`;
      this.#sent[i] = upTo;
    }
    if (calls !== '') json += `${json === '' ? '' : ','}"tool_calls":[${calls}]`;
    return json;
  }
}

/** The arguments vLLM sends for a block: json.dumps of the parsed object, or the text as written when it does not parse. */
export function streamedArguments(written: string): string {
  try {
    return pythonJsonDumps(JSON.parse(written));
  } catch {
    return written;
  }
}

/** Python's `json.dumps(value, ensure_ascii=False)`: JSON with ", " and ": " between items. */
export function pythonJsonDumps(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(pythonJsonDumps).join(', ')}]`;
  if (value !== null && typeof value === 'object') {
    const items = Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${pythonJsonDumps(v)}`);
    return `{${items.join(', ')}}`;
  }
  return JSON.stringify(value);
}

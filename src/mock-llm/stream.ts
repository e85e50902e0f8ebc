/**
 * A streamed chat completion (`stream: true`), sent as vLLM sends it: server-sent events of
 * `chat.completion.chunk` — first the role (with `prompt_token_ids` when token ids were asked for),
 * then the tokens generated since the last event (text delta, `logprobs.content`, `token_ids`), then
 * the rest with `finish_reason` and `metadata.weight_version`, a usage chunk when
 * `stream_options.include_usage` asked for one, and `data: [DONE]`.
 *
 * The events' ids, logprobs and text concatenate to exactly the non-streamed reply of the same request;
 * a reply that calls tools streams them as vLLM does instead (stream-tools.ts), ending with
 * finish_reason "tool_calls".
 */
import type { ServerResponse } from 'node:http';
import { logprobDraws, logprobEntries, type TokenDraws } from './response.ts';
import type { ToolCallDeltas } from './stream-tools.ts';
import { decodeIds } from './tokens.ts';

export interface StreamHead {
  index: number;
  model: string;
  promptIds: readonly number[];
  weightVersion: number;
  logprobs: boolean;
  returnTokenIds: boolean;
  includeUsage: boolean;
  /** Logprob draws, as for the whole reply (response.ts). */
  seed: number;
  requestSeed: number | undefined;
  offset: number;
  /** The mock's model's draws for the reply (scoring.ts); absent: the request's random ones. */
  draws?: () => TokenDraws;
  /** The reply's tool calls when the request offered tools: its text then streams as calls. */
  tools?: ToolCallDeltas;
}

/** The two faults that spoil a generated reply: the last event is half JSON, or the connection is cut before it. */
export type StreamFault = 'malformed' | 'truncate';

export class CompletionStream {
  readonly #res: ServerResponse;
  readonly #head: StreamHead;
  /** Everything of a chunk before its choice's fields: the same for every event of the stream. */
  readonly #prefix: string;
  readonly #draws: TokenDraws;
  /** Ids sent so far (their token_ids and logprobs). */
  #sent = 0;
  /** Ids whose text is sent: behind `#sent` while the last ones end inside a UTF-8 character. */
  #textFrom = 0;
  /** Characters of content sent so far. */
  #chars = 0;

  constructor(res: ServerResponse, head: StreamHead) {
    this.#res = res;
    this.#head = head;
    this.#draws = head.draws?.() ?? logprobDraws(head);
    this.#prefix = `{"id":"chatcmpl-mock-${head.index}","object":"chat.completion.chunk","created":${Math.floor(Date.now() / 1000)},"model":${JSON.stringify(head.model)},"choices":[`;
  }

  /** The first `n` of `ids` are generated: send the new ones (the first call opens the stream). */
  progress(ids: readonly number[], n: number): void {
    if (!this.#open()) return;
    if (n <= this.#sent) return;
    const chunk = this.#tokens(ids, n, null, null);
    if (chunk !== null) this.#res.write(this.#event(chunk));
  }

  /**
   * The generation ended with `reason` after `out`: send the rest and close the stream. `content` is the
   * whole reply's text (what the non-streamed reply's message holds).
   */
  finish(reason: string, out: readonly number[], content: string, fault: StreamFault | null): void {
    if (!this.#open()) return;
    if (fault === 'truncate') {
      // Cut before the last event: the client has tokens but no finish reason and no [DONE].
      this.#res.destroy();
      return;
    }
    let last = this.#event(this.#tokens(out, out.length, reason, content)!);
    if (fault === 'malformed') last = `${last.slice(0, last.length >> 1)}\n\n`; // half a JSON object is never JSON
    const { promptIds } = this.#head;
    if (this.#head.includeUsage) {
      const usage = `{"prompt_tokens":${promptIds.length},"completion_tokens":${out.length},"total_tokens":${promptIds.length + out.length}}`;
      last += this.#event(`${this.#prefix}],"usage":${usage}}`);
    }
    this.#res.end(`${last}data: [DONE]\n\n`);
  }

  /** Sends the headers and the role event once; false when the client is gone. */
  #open(): boolean {
    const res = this.#res;
    if (res.destroyed || res.writableEnded) return false;
    if (res.headersSent) return true;
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
    let role = `${this.#prefix}{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`;
    if (this.#head.returnTokenIds) role += `,"prompt_token_ids":${JSON.stringify(this.#head.promptIds)}`;
    res.write(this.#event(`${role}}`));
    return true;
  }

  /**
   * A chunk with `ids[#sent..n)`; the last one (`reason` set) also carries the rest of `content`.
   * Null when a tool-calling reply has nothing to say for these ids and nothing else to carry.
   */
  #tokens(ids: readonly number[], n: number, reason: string | null, content: string | null): string | null {
    const from = Math.min(this.#sent, n);
    let text: string;
    if (content !== null) {
      text = content.slice(this.#chars);
    } else {
      text = decodeIds(ids.slice(this.#textFrom, n));
      // A token that ends inside a character decodes to U+FFFD: its text goes out with the next one.
      if (text.endsWith('\uFFFD')) text = '';
      else this.#textFrom = n;
    }
    this.#chars += text.length;
    this.#sent = n;
    const { logprobs, returnTokenIds, tools } = this.#head;
    let delta: string;
    if (tools === undefined) delta = `"content":${JSON.stringify(text)}`;
    else {
      // #chars counts the text generated, which the calls' deltas are paced by.
      delta = tools.advance(this.#chars);
      if (delta === '' && reason === null && !logprobs && !returnTokenIds) return null;
      // vLLM: "tool_calls" once the parser opened a call (serving_chat.py chat_completion_stream_generator
      // @99c5632fc2d252a6f25afa76347df392eb898c42, auto_tools_called). A cut generation keeps its reason
      // here: vLLM would say "tool_calls" over truncated arguments, and the abort of a pause must stay one.
      if (reason === 'stop' && tools.called) reason = 'tool_calls';
    }
    let json = `${this.#prefix}{"index":0,"delta":{${delta}},"logprobs":`;
    json += logprobs ? `{"content":[${logprobEntries(ids, from, n, this.#draws)}]}` : 'null';
    json += `,"finish_reason":${reason === null ? 'null' : JSON.stringify(reason)}`;
    if (returnTokenIds) json += `,"token_ids":${JSON.stringify(ids.slice(from, n))}`;
    json += '}]';
    if (reason !== null) json += `,"metadata":{"weight_version":${this.#head.weightVersion}}`;
    return `${json}}`;
  }

  #event(json: string): string {
    return `data: ${json}\n\n`;
  }
}

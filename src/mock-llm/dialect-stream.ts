/**
 * Streamed chat completions (`stream: true`) of the dialects: the same role / tokens / finish / usage /
 * [DONE] sequence as stream.ts, with each server's fields and gaps:
 *
 * - vllm: the role chunk carries `prompt_token_ids` (null unless return_token_ids), every token chunk
 *   `token_ids` (likewise), the finish chunk `stop_reason`; no weight version
 *   (vllm/entrypoints/openai/serving_chat.py chat_completion_stream_generator @99c5632fc2d252a6f25afa76347df392eb898c42,
 *   chunks dumped with exclude_unset, so fields set to None stay as null);
 * - sglang: no token ids and no weight version in any token chunk; a step whose text is empty sends
 *   no chunk, so its logprobs never reach the client — the end-of-turn token's logprob is missing from
 *   every stream; the finish reason comes in a chunk of its own with `matched_stop`
 *   (python/sglang/srt/entrypoints/openai/serving_chat.py _generate_chat_stream / _generate_stream_content
 *   @002897c23becbd522d88b8115a763a21765f978a); with the sglext flags of sgl-project/sglang#34488 the
 *   prompt and output ids come whole in one more chunk, `choices: []` and `sglext`, after the finish
 *   chunk and before the usage one;
 * - llamacpp: no token-id field; logprobs entries carry `id`; the end token sends an empty delta
 *   (field placement as server-task.cpp, chunk boundaries approximate).
 *
 * The mock sends the tokens generated since its last event (stream.ts): a real server's one-token
 * steps are modelled only where a gap depends on them (SGLang's end token).
 */
import type { ServerResponse } from 'node:http';
import type { Dialect } from './dialects.ts';
import { dialectLogprobEntries, LLAMACPP_BUILD_INFO, sglextJson } from './dialects.ts';
import type { MockChatRequest } from './request.ts';
import type { TokenDraws } from './response.ts';
import { decodeIds, END_OF_TURN_ID } from './tokens.ts';

export interface DialectStreamHead {
  dialect: Dialect;
  index: number;
  model: string;
  promptIds: readonly number[];
  /** Logprob draws of ids[0..]; null without logprobs. */
  draws: TokenDraws | null;
  withTop: boolean;
  returnTokenIds: boolean;
  includeUsage: boolean;
  /** SGLang: the request's sglext flags (dialects.ts sglextJson). */
  sglext?: MockChatRequest;
}

export class DialectStream {
  readonly #res: ServerResponse;
  readonly #h: DialectStreamHead;
  readonly #created = Math.floor(Date.now() / 1000);
  readonly #prefix: string;
  readonly #suffix: string;
  #sent = 0;
  #textFrom = 0;
  #chars = 0;

  constructor(res: ServerResponse, head: DialectStreamHead) {
    this.#res = res;
    this.#h = head;
    if (head.dialect === 'llamacpp') {
      this.#prefix = '{"choices":[';
      this.#suffix = `],"created":${this.#created},"id":"chatcmpl-mock-${head.index}","model":${JSON.stringify(head.model)},"system_fingerprint":"${LLAMACPP_BUILD_INFO}","object":"chat.completion.chunk"`;
    } else {
      this.#prefix = `{"id":"chatcmpl-mock-${head.index}","object":"chat.completion.chunk","created":${this.#created},"model":${JSON.stringify(head.model)},"choices":[`;
      this.#suffix = head.dialect === 'sglang' ? '],"usage":null' : ']';
    }
  }

  progress(ids: readonly number[], n: number): void {
    if (!this.#open()) return;
    if (n > this.#sent) {
      const chunk = this.#tokens(ids, n, null, null);
      if (chunk !== '') this.#res.write(chunk);
    }
  }

  finish(reason: string, out: readonly number[], content: string, matchedStop: number | null): void {
    if (!this.#open()) return;
    let tail = this.#tokens(out, out.length, reason, content);
    const { dialect, promptIds } = this.#h;
    if (dialect === 'sglang') {
      // The finish reason is a chunk of its own, after the content (serving_chat.py _generate_chat_stream).
      tail += this.#event(
        `${this.#prefix}{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":${JSON.stringify(reason)},"matched_stop":${matchedStop === null ? 'null' : matchedStop}}${this.#suffix}}`,
      );
      const r = this.#h.sglext;
      // Sent only once some output ids were collected (serving_chat.py: `if return_output_ids and output_ids`).
      if (r !== undefined && (r.sglextIds.input || r.sglextIds.output) && out.length > 0)
        tail += this.#event(`${this.#prefix}${this.#suffix},"sglext":${sglextJson(r, promptIds, out)}}`);
    }
    if (this.#h.includeUsage) {
      const p = promptIds.length;
      const usage =
        dialect === 'llamacpp'
          ? `{"completion_tokens":${out.length},"prompt_tokens":${p},"total_tokens":${p + out.length}}`
          : `{"prompt_tokens":${p},"completion_tokens":${out.length},"total_tokens":${p + out.length}}`;
      tail +=
        dialect === 'llamacpp'
          ? this.#event(`${this.#prefix}${this.#suffix},"usage":${usage}}`)
          : this.#event(`${this.#prefix}],"usage":${usage}}`);
    }
    this.#res.end(`${tail}data: [DONE]\n\n`);
  }

  #open(): boolean {
    const res = this.#res;
    if (res.destroyed || res.writableEnded) return false;
    if (res.headersSent) return true;
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' });
    const { dialect, returnTokenIds, promptIds } = this.#h;
    let role: string;
    if (dialect === 'vllm') {
      role = `${this.#prefix}{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":${returnTokenIds ? JSON.stringify(promptIds) : 'null'}}`;
    } else if (dialect === 'sglang') {
      role = `${this.#prefix}{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}${this.#suffix}}`;
    } else {
      role = `${this.#prefix}{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}${this.#suffix}}`;
    }
    res.write(this.#event(role));
    return true;
  }

  /** The chunk for ids[#sent..n) ('' when SGLang would send none); the last one (`reason` set) ends the choice. */
  #tokens(ids: readonly number[], n: number, reason: string | null, content: string | null): string {
    const { dialect, draws } = this.#h;
    const from = Math.min(this.#sent, n);
    let text: string;
    if (content !== null) {
      text = content.slice(this.#chars);
    } else {
      const end = n > 0 && ids[n - 1] === END_OF_TURN_ID ? n - 1 : n;
      text = end > this.#textFrom ? decodeIds(ids.slice(this.#textFrom, end)) : '';
      if (text.endsWith('\uFFFD')) text = '';
      else this.#textFrom = end;
    }
    this.#chars += text.length;
    this.#sent = n;
    // SGLang: the end-of-turn token is a decode step of its own whose text is empty, so its logprob is
    // never sent (serving_chat.py _generate_stream_content: `if delta:`); the mock drops it from its batch.
    let upTo = n;
    if (dialect === 'sglang' && n > from && ids[n - 1] === END_OF_TURN_ID) upTo = n - 1;
    let logprobs = 'null';
    if (draws !== null) {
      const entries = dialectLogprobEntries(dialect, ids, from, upTo, draws, this.#h.withTop);
      if (upTo < n) draws.next(ids[upTo]); // the dropped token still drew its value: later ones keep theirs
      logprobs = `{"content":[${entries}]}`;
    }
    if (dialect === 'sglang') {
      if (text === '') return '';
      return this.#event(
        `${this.#prefix}{"index":0,"delta":{"role":null,"content":${JSON.stringify(text)},"reasoning_content":null,"tool_calls":null},"logprobs":${logprobs},"finish_reason":null,"matched_stop":null}${this.#suffix}}`,
      );
    }
    if (dialect === 'llamacpp') {
      const lp = draws === null ? '' : `,"logprobs":${logprobs}`;
      return this.#event(
        `${this.#prefix}{"finish_reason":${reason === null ? 'null' : JSON.stringify(reason)},"index":0,"delta":{"content":${JSON.stringify(text)}}${lp}}${this.#suffix}}`,
      );
    }
    const tokenIds = this.#h.returnTokenIds ? JSON.stringify(ids.slice(from, n)) : 'null';
    const finish = reason === null ? 'null' : `${JSON.stringify(reason)},"stop_reason":null`;
    return this.#event(
      `${this.#prefix}{"index":0,"delta":{"content":${JSON.stringify(text)}},"logprobs":${logprobs},"finish_reason":${finish},"token_ids":${tokenIds}}]}`,
    );
  }

  #event(json: string): string {
    return `data: ${json}\n\n`;
  }
}

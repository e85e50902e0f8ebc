/**
 * Reading a streamed chat completion (`stream: true`): server-sent events of `chat.completion.chunk`,
 * parsed as they arrive, so a call holds every token it has been sent — what a pause returns at once
 * instead of waiting for the server's aborted answer (llm/client.ts, `holdOnPause`).
 *
 * The events add up to the same ChatResult a whole reply gives: text deltas joined, `token_ids` and
 * `logprobs.content` appended, `prompt_token_ids` from the first event, the finish reason and weight
 * version from the last, usage from the usage event. A bad event is an ERR_LLM_BAD_REPLY naming the
 * event's number and the field; nothing after it is read.
 */
import type { FinishReason } from '../protocol/rollout.ts';
import { preview } from '../protocol/errors.ts';
import { LlmError } from './errors.ts';
import { bad, isObject, readLogprobs, readTokenIds, weightVersionOf, type ChatResult } from './reply.ts';

export class ChatStream {
  readonly #wantIds: boolean;
  readonly #wantLogprobs: boolean;
  readonly #decoder = new TextDecoder();
  /** Text after the last complete line (an event's lines may arrive split across chunks). */
  #pending = '';
  /** `data:` lines of the event being read. */
  #data: string[] = [];
  #events = 0;
  #content = '';
  readonly #ids: number[] = [];
  readonly #logprobs: number[] = [];
  /** A chunk brought tokens without `token_ids` / `logprobs`: the server does not send them. */
  #idsMissing = false;
  #logprobsMissing = false;
  #promptIds: Int32Array | null = null;
  #finishReason: FinishReason | null = null;
  #weightVersion: number | null = null;
  #promptTokens: number | null = null;
  #completionTokens: number | null = null;
  #done = false;
  /** The first bad event's error; the stream is not read further. */
  #error: LlmError | null = null;

  constructor(options: { tokenIds: boolean; logprobs: boolean }) {
    this.#wantIds = options.tokenIds;
    this.#wantLogprobs = options.logprobs;
  }

  /** Bytes of the event stream as they arrive. */
  write(chunk: Uint8Array): void {
    if (this.#error !== null || this.#done) return;
    let text = this.#pending + this.#decoder.decode(chunk, { stream: true });
    // Lines end with \n, \r\n or \r; a \r at the very end may be the first half of a \r\n: kept for later.
    const splitCr = text.endsWith('\r');
    if (splitCr) text = text.slice(0, -1);
    if (text.includes('\r')) text = text.replace(/\r\n?/g, '\n');
    let start = 0;
    for (let end = text.indexOf('\n'); end !== -1 && this.#error === null && !this.#done; end = text.indexOf('\n', start)) {
      this.#line(text.slice(start, end));
      start = end + 1;
    }
    this.#pending = splitCr ? `${text.slice(start)}\r` : text.slice(start);
  }

  /** The whole reply, once the stream has ended: what it said, or why it cannot be used. */
  result(): ChatResult {
    if (this.#error !== null) throw this.#error;
    if (!this.#done) {
      // A last line without its line end, a last event without its blank line.
      if (this.#pending !== '') this.#line(this.#pending.replace(/\r$/, ''));
      this.#pending = '';
      if (this.#data.length > 0) this.#dispatch();
    }
    if (this.#error !== null) throw this.#error;
    if (this.#finishReason === null) {
      throw new LlmError('ERR_LLM_BAD_REPLY', `inference stream ended after ${this.#events} events without a finish_reason${this.#done ? ' (before data: [DONE])' : ''}`);
    }
    return this.#result(this.#finishReason);
  }

  /** What has arrived so far, as a generation aborted here (a pause holding the call). */
  held(): ChatResult {
    return this.#result(this.#finishReason ?? 'abort');
  }

  #result(finishReason: FinishReason): ChatResult {
    const ids = this.#idsMissing || (!this.#wantIds && this.#ids.length === 0) ? null : Int32Array.from(this.#ids);
    const logprobs = this.#logprobsMissing || (!this.#wantLogprobs && this.#logprobs.length === 0) ? null : Float32Array.from(this.#logprobs);
    if (ids !== null && logprobs !== null && ids.length !== logprobs.length) {
      throw new LlmError('ERR_LLM_BAD_REPLY', `inference stream: its events hold ${logprobs.length} logprobs but ${ids.length} token ids`);
    }
    return {
      content: this.#content,
      finishReason,
      promptIds: this.#promptIds,
      responseIds: ids,
      logprobs,
      weightVersion: this.#weightVersion,
      promptTokens: this.#promptTokens,
      completionTokens: this.#completionTokens,
    };
  }

  #line(line: string): void {
    if (line === '') {
      if (this.#data.length > 0) this.#dispatch();
      return;
    }
    // Comments (`: keep-alive`) and the other fields (event, id, retry) carry nothing for a completion.
    if (!line.startsWith('data:')) return;
    this.#data.push(line.charCodeAt(5) === 32 ? line.slice(6) : line.slice(5));
  }

  #dispatch(): void {
    const data = this.#data.length === 1 ? this.#data[0] : this.#data.join('\n');
    this.#data = [];
    this.#events++;
    if (data === '[DONE]') {
      this.#done = true;
      return;
    }
    const where = `inference stream event ${this.#events}`;
    try {
      let body: unknown;
      try {
        body = JSON.parse(data);
      } catch {
        throw new LlmError('ERR_LLM_BAD_REPLY', `${where} is not JSON: ${preview(data)}`);
      }
      this.#chunk(body, where);
    } catch (err) {
      this.#error = err instanceof LlmError ? err : new LlmError('ERR_LLM_BAD_REPLY', `${where}: ${(err as Error).message}`);
    }
  }

  #chunk(body: unknown, where: string): void {
    if (!isObject(body)) throw bad('event', body, 'a JSON object', where);
    if (body.error !== undefined) {
      // vLLM and SGLang report a failure mid-stream as an event with an `error` object.
      const message = isObject(body.error) && typeof body.error.message === 'string' ? body.error.message : preview(body.error);
      throw new LlmError('ERR_LLM_BAD_REPLY', `${where}: the server reported an error: ${message}`);
    }
    if (body.prompt_token_ids != null) {
      const ids: number[] = [];
      readTokenIds(body.prompt_token_ids, 'prompt_token_ids', (id) => ids.push(id), where);
      this.#promptIds = Int32Array.from(ids);
    }
    const version = weightVersionOf(body, where);
    if (version !== null) this.#weightVersion = version;
    if (isObject(body.usage)) {
      if (typeof body.usage.prompt_tokens === 'number') this.#promptTokens = body.usage.prompt_tokens;
      if (typeof body.usage.completion_tokens === 'number') this.#completionTokens = body.usage.completion_tokens;
    }
    const choices = body.choices;
    if (choices == null) return;
    if (!Array.isArray(choices)) throw bad('choices', choices, 'an array', where);
    if (choices.length === 0) return; // the usage event
    const choice = choices[0];
    if (!isObject(choice)) throw bad('choices[0]', choice, 'an object', where);
    const delta = choice.delta ?? {};
    if (!isObject(delta)) throw bad('choices[0].delta', delta, 'an object', where);
    const content = delta.content ?? '';
    if (typeof content !== 'string') throw bad('choices[0].delta.content', content, 'a string or null', where);
    this.#content += content;
    const ids = choice.token_ids == null ? 0 : readTokenIds(choice.token_ids, 'choices[0].token_ids', (id) => this.#ids.push(id), where);
    const logprobs = choice.logprobs == null ? 0 : readLogprobs(choice.logprobs, (lp) => this.#logprobs.push(lp), where);
    if (choice.token_ids != null && choice.logprobs != null && ids !== logprobs) {
      throw new LlmError('ERR_LLM_BAD_REPLY', `${where}: choices[0].logprobs.content has ${logprobs} entries but choices[0].token_ids has ${ids}`);
    }
    // Tokens arrived without ids (or logprobs): the server does not send them, and partial arrays would lie.
    if (choice.token_ids == null && (logprobs > 0 || content !== '')) this.#idsMissing = true;
    if (choice.logprobs == null && (ids > 0 || content !== '')) this.#logprobsMissing = true;
    const finishReason = choice.finish_reason;
    if (finishReason != null) {
      if (typeof finishReason !== 'string' || finishReason === '') throw bad('choices[0].finish_reason', finishReason, 'a non-empty string or null', where);
      this.#finishReason = finishReason;
    }
  }
}

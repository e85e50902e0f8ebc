/**
 * Reading a streamed chat completion (`stream: true`): server-sent events of `chat.completion.chunk`,
 * parsed as they arrive, so a call holds every token it has been sent — what a pause returns at once
 * instead of waiting for the server's aborted answer (llm/client.ts, `holdOnPause`).
 *
 * The events add up to the same ChatResult a whole reply gives: text deltas joined, `token_ids` and
 * `logprobs.content` appended, `prompt_token_ids` from the first event, the finish reason and weight
 * version from the last, usage from the usage event; SGLang's ids from the one `sglext` event after
 * the last token. A bad event is an ERR_LLM_BAD_REPLY naming the
 * event's number and the field: `write` then answers false (the exchange stops reading and cuts the
 * connection), and an event counts only once every field of it has been checked.
 */
import type { FinishReason } from '../domain/rollout.ts';
import { LlmError } from './errors.ts';
import {
  bad,
  eventObject,
  isObject,
  logprobIds,
  readLogprobs,
  readTokenIds,
  sglextIds,
  takeEvent,
  weightVersionOf,
  type ChatResult,
  VersionSpans,
} from './reply.ts';
import { SseFrames } from './sse.ts';

export class ChatStream {
  readonly #wantIds: boolean;
  readonly #wantLogprobs: boolean;
  readonly #frames = new SseFrames();
  /** Reads one event's data; answers whether to read on (bound once: no closure per chunk). */
  readonly #onEvent = (data: string): boolean => {
    this.#dispatch(data);
    return this.#error === null && !this.#done;
  };
  #events = 0;
  #content = '';
  readonly #ids: number[] = [];
  readonly #logprobs: number[] = [];
  /** A chunk brought tokens without `token_ids` / `logprobs`: the server does not send them. */
  #idsMissing = false;
  #logprobsMissing = false;
  #promptIds: Int32Array | null = null;
  /** The whole reply's ids, sent once after its last token (SGLang's sglext.output_ids); null until then. */
  #wholeIds: number[] | null = null;
  #finishReason: FinishReason | null = null;
  #weightVersion: string | null = null;
  readonly #spans = new VersionSpans();
  #promptTokens: number | null = null;
  #completionTokens: number | null = null;
  #done = false;
  /**
   * Tool calls by their `index`: vLLM streams a call's id and name in its first delta, then its
   * `arguments` in pieces (serving_chat.py chat_completion_stream_generator, DeltaToolCall).
   */
  readonly #toolCalls: { id: string; name: string; arguments: string }[] = [];
  /** The first bad event's error; the stream is not read further. */
  #error: LlmError | null = null;

  constructor(options: { tokenIds: boolean; logprobs: boolean }) {
    this.#wantIds = options.tokenIds;
    this.#wantLogprobs = options.logprobs;
  }

  /** Bytes of the event stream as they arrive; false once an event was bad (nothing more is read). */
  write(chunk: Uint8Array): boolean {
    if (this.#error !== null) return false;
    if (this.#done) return true; // after [DONE]: the rest is the server's business
    this.#frames.write(chunk, this.#onEvent);
    return this.#error === null;
  }

  /** The whole reply, once the stream has ended: what it said, or why it cannot be used. */
  result(): ChatResult {
    if (this.#error !== null) throw this.#error;
    if (!this.#done) this.#frames.end(this.#onEvent);
    if (this.#error !== null) throw this.#error;
    if (this.#finishReason === null) {
      throw new LlmError(
        'ERR_LLM_BAD_REPLY',
        `inference stream ended after ${this.#events} events without a finish_reason${this.#done ? ' (before data: [DONE])' : ''}`,
      );
    }
    return this.#result(this.#finishReason);
  }

  /** What has arrived so far, as a generation aborted here (a pause holding the call); a bad event's error if there was one. */
  held(): ChatResult {
    if (this.#error !== null) throw this.#error;
    return this.#result(this.#finishReason ?? 'abort');
  }

  #result(finishReason: FinishReason): ChatResult {
    let ids = this.#idsMissing || (!this.#wantIds && this.#ids.length === 0) ? null : Int32Array.from(this.#ids);
    let logprobs =
      this.#logprobsMissing || (!this.#wantLogprobs && this.#logprobs.length === 0)
        ? null
        : Float32Array.from(this.#logprobs);
    if (this.#wholeIds !== null) {
      ids = Int32Array.from(this.#wholeIds);
      // SGLang sends no chunk for a decode step whose text is empty (the end-of-turn token), so that
      // step's logprob never arrives and nothing says which token lost it: fewer logprobs than ids
      // cannot be aligned, and a misaligned logprob would be trained on.
      if (logprobs !== null && logprobs.length < ids.length) logprobs = null;
    }
    if (ids !== null && logprobs !== null && ids.length !== logprobs.length) {
      throw new LlmError(
        'ERR_LLM_BAD_REPLY',
        `inference stream: its events hold ${logprobs.length} logprobs but ${ids.length} token ids`,
      );
    }
    const toolCalls = this.#toolCalls.filter((c) => c !== undefined);
    return {
      ...(toolCalls.length > 0 ? { toolCalls: toolCalls.map((c) => ({ ...c })) } : {}),
      content: this.#content,
      finishReason,
      promptIds: this.#promptIds,
      responseIds: ids,
      logprobs,
      weightVersion: this.#weightVersion,
      promptTokens: this.#promptTokens,
      completionTokens: this.#completionTokens,
      ...this.#spans.field(ids?.length ?? 0),
    };
  }

  #dispatch(data: string): void {
    this.#events++;
    if (data === '[DONE]') {
      this.#done = true;
      return;
    }
    this.#error = takeEvent(data, `inference stream event ${this.#events}`, this.#chunk);
  }

  /** Checks every field of one event, then takes it in: a bad event leaves nothing of itself behind. */
  readonly #chunk = (event: unknown, where: string): void => {
    const body = eventObject(event, where);
    let promptIds: number[] | null = null;
    if (body.prompt_token_ids != null) {
      promptIds = [];
      readTokenIds(body.prompt_token_ids, 'prompt_token_ids', (id) => promptIds!.push(id), where);
    }
    const ext = sglextIds(body.sglext, where);
    let wholeIds: number[] | null = null;
    if (ext.output !== null) {
      wholeIds = [];
      readTokenIds(ext.output, 'sglext.output_ids[0]', (id) => wholeIds!.push(id), where);
    }
    if (ext.input !== null && promptIds === null) {
      promptIds = [];
      readTokenIds(ext.input, 'sglext.input_ids', (id) => promptIds!.push(id), where);
    }
    const version = weightVersionOf(body, where);
    const usage = isObject(body.usage) ? body.usage : null;
    const choices = body.choices ?? [];
    if (!Array.isArray(choices)) throw bad('choices', choices, 'an array', where);
    const choice: unknown = choices[0] ?? null; // none: the usage event
    let content = '';
    const ids: number[] = [];
    const logprobs: number[] = [];
    let finishReason: string | null = null;
    let toolDeltas: ToolDelta[] = [];
    if (choice !== null) {
      if (!isObject(choice)) throw bad('choices[0]', choice, 'an object', where);
      const delta = choice.delta ?? {};
      if (!isObject(delta)) throw bad('choices[0].delta', delta, 'an object', where);
      content = (delta.content ?? '') as string;
      if (typeof content !== 'string') throw bad('choices[0].delta.content', content, 'a string or null', where);
      if (delta.tool_calls != null) toolDeltas = readToolDeltas(delta.tool_calls, where);
      if (choice.token_ids != null) readTokenIds(choice.token_ids, 'choices[0].token_ids', (id) => ids.push(id), where);
      if (choice.logprobs != null) {
        readLogprobs(choice.logprobs, (lp) => logprobs.push(lp), where);
        // llama.cpp: the ids ride inside the logprobs entries (see logprobIds).
        if (choice.token_ids == null) for (const id of logprobIds(choice.logprobs, where) ?? []) ids.push(id);
      }
      if (choice.prompt_token_ids != null && promptIds === null) {
        promptIds = [];
        readTokenIds(choice.prompt_token_ids, 'choices[0].prompt_token_ids', (id) => promptIds!.push(id), where);
      }
      if (choice.token_ids != null && choice.logprobs != null && ids.length !== logprobs.length) {
        throw new LlmError(
          'ERR_LLM_BAD_REPLY',
          `${where}: choices[0].logprobs.content has ${logprobs.length} entries but choices[0].token_ids has ${ids.length}`,
        );
      }
      if (choice.finish_reason != null) {
        if (typeof choice.finish_reason !== 'string' || choice.finish_reason === '')
          throw bad('choices[0].finish_reason', choice.finish_reason, 'a non-empty string or null', where);
        finishReason = choice.finish_reason.toLowerCase(); // as reply.ts: "STOP" means stop
      }
      // Tokens arrived without ids (or logprobs): the server does not send them, and partial arrays would lie.
      if (choice.token_ids == null && ids.length === 0 && (logprobs.length > 0 || content !== ''))
        this.#idsMissing = true;
      if (choice.logprobs == null && (ids.length > 0 || content !== '')) this.#logprobsMissing = true;
    }
    if (promptIds !== null) this.#promptIds = Int32Array.from(promptIds);
    if (wholeIds !== null) this.#wholeIds = wholeIds;
    if (version !== null) this.#weightVersion = version;
    if (usage !== null) {
      if (typeof usage.prompt_tokens === 'number') this.#promptTokens = usage.prompt_tokens;
      if (typeof usage.completion_tokens === 'number') this.#completionTokens = usage.completion_tokens;
    }
    this.#content += content;
    for (const d of toolDeltas) {
      const call = (this.#toolCalls[d.index] ??= { id: '', name: '', arguments: '' });
      if (d.id !== undefined) call.id = d.id;
      if (d.name !== undefined) call.name += d.name;
      if (d.arguments !== undefined) call.arguments += d.arguments;
    }
    this.#spans.add(ids.length, version);
    for (const id of ids) this.#ids.push(id);
    for (const lp of logprobs) this.#logprobs.push(lp);
    if (finishReason !== null) this.#finishReason = finishReason;
  };
}

interface ToolDelta {
  index: number;
  id?: string;
  name?: string;
  arguments?: string;
}

/** One event's `delta.tool_calls`, checked whole before any of it is taken. */
function readToolDeltas(value: unknown, where: string): ToolDelta[] {
  if (!Array.isArray(value)) throw bad('choices[0].delta.tool_calls', value, 'an array', where);
  return value.map((d, i) => {
    const field = `choices[0].delta.tool_calls[${i}]`;
    if (!isObject(d)) throw bad(field, d, 'an object', where);
    const index = d.index ?? i;
    if (!Number.isInteger(index) || (index as number) < 0 || (index as number) > 1024)
      throw bad(`${field}.index`, index, 'an integer in [0, 1024]', where);
    const fn = d.function ?? {};
    if (!isObject(fn)) throw bad(`${field}.function`, fn, 'an object', where);
    const out: ToolDelta = { index: index as number };
    if (d.id != null) {
      if (typeof d.id !== 'string') throw bad(`${field}.id`, d.id, 'a string', where);
      out.id = d.id;
    }
    if (fn.name != null) {
      if (typeof fn.name !== 'string') throw bad(`${field}.function.name`, fn.name, 'a string', where);
      out.name = fn.name;
    }
    if (fn.arguments != null) {
      if (typeof fn.arguments !== 'string') throw bad(`${field}.function.arguments`, fn.arguments, 'a string', where);
      out.arguments = fn.arguments;
    }
    return out;
  });
}

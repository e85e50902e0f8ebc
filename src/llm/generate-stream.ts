/**
 * Reading SGLang's streamed `/generate` (`stream: true`, `llm.api: tokens` with `llm.stream`): one
 * server-sent event per step the server reports, `{text, output_ids, meta_info}`, then `data: [DONE]`;
 * a failure mid-stream is an event `{"error": {"message"}}` (python/sglang/srt/entrypoints/http_server.py
 * generate_request, stream_results @0025436eab0556737d615b36a4dd3e1e26e82f3d).
 *
 * By default each event holds everything generated so far — `output_ids` and
 * `meta_info.output_token_logprobs` cumulative — and with `--incremental-streaming-output` only the new
 * tokens (python/sglang/srt/managers/tokenizer_manager_components/output_processor.py
 * handle_batch_output @7a464c40fc21eda40b059c10fd0944ae28115a84). `meta_info.completion_tokens`
 * counts every token so far in both forms: that is how the two are told apart here.
 *
 * Why stream at all: each event's `meta_info.weight_version` names the weights of the server when
 * the event was made, so a generation kept across an in-place weight update says which tokens the
 * new weights sampled (`versionSpans`) instead of one version for the whole reply. SGLang stamps the
 * version as the tokenizer manager handles the step's output, a few milliseconds after sampling; the
 * reference policy server stamps it where it samples.
 */
import { LlmError } from './errors.ts';
import { bad, eventObject, isObject, takeEvent, VersionSpans, weightVersionOf } from './reply.ts';
import { SseFrames } from './sse.ts';
import type { GenerationResult } from './token-wire.ts';

export class GenerateStream {
  readonly #frames = new SseFrames();
  readonly #onEvent = (data: string): boolean => {
    this.#dispatch(data);
    return this.#error === null && !this.#done;
  };
  #events = 0;
  readonly #ids: number[] = [];
  readonly #logprobs: number[] = [];
  readonly #spans = new VersionSpans();
  #weightVersion: string | null = null;
  #finishReason: string | null = null;
  #done = false;
  #error: LlmError | null = null;

  /** Bytes of the event stream as they arrive; false once an event was bad (nothing more is read). */
  write(chunk: Uint8Array): boolean {
    if (this.#error !== null) return false;
    if (this.#done) return true;
    this.#frames.write(chunk, this.#onEvent);
    return this.#error === null;
  }

  /** The whole generation, once the stream has ended. */
  result(): GenerationResult {
    if (this.#error === null && !this.#done) this.#frames.end(this.#onEvent);
    if (this.#error !== null) throw this.#error;
    if (this.#finishReason === null)
      throw new LlmError(
        'ERR_LLM_BAD_REPLY',
        `SGLang /generate stream ended after ${this.#events} events without a meta_info.finish_reason`,
      );
    return this.#result(this.#finishReason);
  }

  /** What has arrived so far, as a generation aborted here (a pause holding the call). */
  held(): GenerationResult {
    if (this.#error !== null) throw this.#error;
    return this.#result(this.#finishReason ?? 'abort');
  }

  #result(finishReason: string): GenerationResult {
    const n = this.#ids.length;
    return {
      completionIds: this.#ids.slice(),
      logprobs: this.#logprobs.slice(),
      topLogprobs: null,
      finishReason,
      weightVersion: this.#weightVersion,
      ...this.#spans.field(n),
    };
  }

  #dispatch(data: string): void {
    this.#events++;
    if (data === '[DONE]') {
      this.#done = true;
      return;
    }
    this.#error = takeEvent(data, `SGLang /generate stream event ${this.#events}`, this.#event);
  }

  /** Checks every field of one event, then takes its new tokens in: a bad event leaves nothing behind. */
  readonly #event = (event: unknown, where: string): void => {
    const body = eventObject(event, where);
    const ids = body.output_ids;
    if (!Array.isArray(ids) || !ids.every((v) => Number.isSafeInteger(v) && (v as number) >= 0))
      throw bad('output_ids', ids, 'an array of token ids', where);
    const meta = body.meta_info;
    if (!isObject(meta)) throw bad('meta_info', meta, 'an object', where);
    const had = this.#ids.length;
    const total = meta.completion_tokens ?? ids.length;
    if (!Number.isSafeInteger(total) || (total as number) < had)
      throw bad('meta_info.completion_tokens', total, `a count of at least the ${had} tokens already streamed`, where);
    const fresh = (total as number) - had;
    // Cumulative (the default): the event repeats what came before. Incremental: only the new ones.
    const start = ids.length === total ? had : ids.length === fresh ? 0 : -1;
    if (start < 0)
      throw bad(
        'output_ids',
        `${ids.length} ids`,
        `all ${total as number} tokens so far or the ${fresh} new ones (meta_info.completion_tokens ${total as number})`,
        where,
      );
    const entries = meta.output_token_logprobs;
    if (!Array.isArray(entries) || (entries.length !== ids.length && entries.length !== fresh))
      throw bad(
        'meta_info.output_token_logprobs',
        Array.isArray(entries) ? `${entries.length} entries` : entries,
        `one [logprob, id, text] per token of output_ids (${ids.length}); send return_logprob: true`,
        where,
      );
    const logStart = entries.length === ids.length ? start : 0;
    const logprobs: number[] = [];
    for (let i = 0; i < fresh; i++) {
      const e = entries[logStart + i] as unknown;
      const id = ids[start + i] as number;
      if (!Array.isArray(e) || typeof e[0] !== 'number')
        throw bad(`meta_info.output_token_logprobs[${logStart + i}]`, e, '[logprob, id, text]', where);
      if (e[1] != null && e[1] !== id)
        throw bad(`meta_info.output_token_logprobs[${logStart + i}][1]`, e[1], `token ${id} of output_ids`, where);
      logprobs.push(e[0]);
    }
    const finish = meta.finish_reason as { type?: unknown } | string | null | undefined;
    const finishReason =
      finish == null ? null : typeof finish === 'string' ? finish : typeof finish.type === 'string' ? finish.type : '';
    if (finishReason === '') throw bad('meta_info.finish_reason', finish, 'null, a string or {type}', where);
    const version = weightVersionOf(body, where);
    this.#spans.add(fresh, version);
    for (let i = 0; i < fresh; i++) this.#ids.push(ids[start + i] as number);
    for (const lp of logprobs) this.#logprobs.push(lp);
    if (version !== null) this.#weightVersion = version;
    if (finishReason !== null) this.#finishReason = finishReason.toLowerCase();
  };
}

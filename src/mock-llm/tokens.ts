/**
 * Real BPE token ids (cl100k_base from gpt-tokenizer) for the mock server, with the repeated work
 * cached: in an RL run the same system prompt, task text and feedback lines recur in every request,
 * and a message's content is re-sent on every later turn of its episode.
 */
import { ImEnd, ImStart, decode, encode } from 'gpt-tokenizer/encoding/cl100k_base';

/** Treat special-token look-alikes in user text as plain text instead of throwing (and skip a regex scan). */
const PLAIN = { disallowedSpecial: new Set<string>() };

const IM_START = encode(ImStart, { allowedSpecial: new Set([ImStart]) })[0];
const IM_END = encode(ImEnd, { allowedSpecial: new Set([ImEnd]) })[0];
/** `<|im_end|>` in cl100k: the token a chat model samples last when it stops (the dialects return it). */
export const END_OF_TURN_ID = IM_END;
const NEWLINE = encode('\n');

/** A Map kept in recency order: re-inserting on a hit moves the key to the back, eviction takes the front. */
class LruCache<K, V> {
  readonly #max: number;
  readonly #map = new Map<K, V>();

  constructor(maxEntries: number) {
    this.#max = maxEntries;
  }

  get(key: K): V | undefined {
    const value = this.#map.get(key);
    if (value !== undefined) {
      this.#map.delete(key);
      this.#map.set(key, value);
    }
    return value;
  }

  set(key: K, value: V): void {
    this.#map.delete(key);
    this.#map.set(key, value);
    if (this.#map.size > this.#max) this.#map.delete(this.#map.keys().next().value as K);
  }

  get size(): number {
    return this.#map.size;
  }
}

/** Longer texts are encoded every time: caching them would let a few huge prompts pin lots of memory. */
const MAX_CACHED_CHARS = 64 * 1024;
const textCache = new LruCache<string, readonly number[]>(8192);

/** Token ids of a text. The returned array is shared with the cache: never mutate it. */
export function encodeText(text: string): readonly number[] {
  if (text.length > MAX_CACHED_CHARS) return encode(text, PLAIN);
  let ids = textCache.get(text);
  if (ids === undefined) {
    ids = encode(text, PLAIN);
    textCache.set(text, ids);
  }
  return ids;
}

/** Token ids of a one-off text (random filler): caching it would only evict texts that do recur. */
export function encodeUncached(text: string): number[] {
  return encode(text, PLAIN);
}

/**
 * Records ids the mock generated for a text, so the next turn's prompt (which re-sends this reply)
 * hits the cache. Only for ids that equal encode(text), i.e. canonical tokenisations.
 */
export function rememberEncoding(text: string, ids: readonly number[]): void {
  if (text.length <= MAX_CACHED_CHARS) textCache.set(text, ids);
}

const roleIds = new Map<string, readonly number[]>();

/**
 * How a prompt ends: `generation` opens an assistant turn (add_generation_prompt, the default);
 * `continue` leaves the last message open, without its end marker, so generation extends it
 * (continue_final_message); `closed` ends after the last message's end marker.
 */
export type PromptEnd = 'generation' | 'continue' | 'closed';

/**
 * Prompt ids under a ChatML-style template the mock defines:
 * `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then `<|im_start|>assistant\n`
 * (for `continue`: the last message is rendered as `<|im_start|>{role}\n{content}` and nothing follows).
 */
export function promptTokenIds(
  messages: readonly { role: string; content: string }[],
  end: PromptEnd = 'generation',
): number[] {
  const ids: number[] = [];
  const push = (part: readonly number[]): void => {
    for (let i = 0; i < part.length; i++) ids.push(part[i]);
  };
  const header = (role: string): void => {
    let rid = roleIds.get(role);
    if (rid === undefined) {
      rid = encode(`${role}\n`, PLAIN);
      if (roleIds.size < 64) roleIds.set(role, rid);
    }
    ids.push(IM_START);
    push(rid);
  };
  const open = end === 'continue' ? messages.length - 1 : messages.length;
  for (let i = 0; i < messages.length; i++) {
    header(messages[i].role);
    push(encodeText(messages[i].content));
    if (i === open) break;
    ids.push(IM_END);
    push(NEWLINE);
  }
  if (end === 'generation') header('assistant');
  return ids;
}

const tokenJsonCache = new Map<number, string>();

/** The text of one token as a JSON string literal, for logprobs entries. Bounded by the vocabulary size. */
export function tokenJson(id: number): string {
  let json = tokenJsonCache.get(id);
  if (json === undefined) {
    json = JSON.stringify(decode([id]));
    tokenJsonCache.set(id, json);
  }
  return json;
}

export function decodeIds(ids: readonly number[]): string {
  return decode(ids);
}

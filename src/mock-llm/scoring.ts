/**
 * The mock's "model" for logprobs, and what it answers when asked to score given tokens.
 *
 * A token's logprob is a function of the weights (the weight version's label), the whole context
 * before it and the token itself — as a real model's is — computed from a rolling hash: sampling a
 * reply and scoring the same ids afterwards give the same value, to the bit, on the clean path. That
 * is what lets the consistency audit (src/coordinator/audit.ts) read exactly 0 against the mock, and
 * what the faults below break, each the way its real cause breaks a server:
 *
 * - `stale-kv`: weights updated while the server kept its KV cache (vLLM /pause?mode=keep with
 *   clear_cache=false, SGLang pause in_place; vllm#57970): a prompt whose prefix the server served
 *   before the update reuses that prefix's KV, computed with the old weights, so every token sampled
 *   after it is conditioned on stale keys and values.
 * - `retokenized-prompt`: the server conditions on another tokenisation of the prompt's tail than the
 *   ids it reports (the prompt went through text and back, trl#5224): the last prompt token is read
 *   as two.
 * - `dropped-first-token`: a continuation (a prompt ending in an open assistant message, as a resume
 *   sends) samples a first token it does not report: later tokens are conditioned on it, the reply
 *   lacks it.
 * - `hidden-truncation`: the server truncates the distribution (a top-k/top-p the request did not
 *   ask for) and reports logprobs renormalised over the kept tokens: every token looks likelier than
 *   the model says.
 *
 * Scoring routes, each in its server's shape: SGLang `/generate` with `max_new_tokens: 0`,
 * `return_logprob` and `logprob_start_len` → `meta_info.input_token_logprobs`; vLLM
 * `/v1/completions` with `prompt_logprobs` → `choices[0].prompt_logprobs` (llm/score-wire.ts cites
 * the sources).
 */
import { logprobText } from './response.ts';

export const DRIFT_FAULTS = ['stale-kv', 'retokenized-prompt', 'dropped-first-token', 'hidden-truncation'] as const;
export type DriftFault = (typeof DRIFT_FAULTS)[number];

export function isDriftFault(value: unknown): value is DriftFault {
  return DRIFT_FAULTS.includes(value as DriftFault);
}

/** Served sequences remembered for `stale-kv` (only while it is on): their ends' token hashes → version. */
const SERVED_LIMIT = 20_000;

function mix(h: number, x: number): number {
  let k = Math.imul(x ^ (x >>> 16), 0x85ebca6b);
  k = Math.imul(k ^ (k >>> 13), 0xc2b2ae35);
  h = Math.imul(h ^ k ^ (k >>> 16), 0x27d4eb2f) + 0x165667b1;
  return (h ^ (h >>> 15)) | 0;
}

function labelHash(label: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < label.length; i++) h = Math.imul(h ^ label.charCodeAt(i), 0x01000193);
  return h | 0;
}

/** A value in [0, 1) for `token` after context hash `h` under weights `v`. */
function unit(h: number, token: number, v: number): number {
  return (mix(mix(h, token), v) >>> 0) / 2 ** 32;
}

/** The mock's logprob of a draw `u`: the JSON text's number, so every route and the scorer agree. */
export function logprobOfUnit(u: number): number {
  return Number(logprobText(u));
}

export interface ReplyContext {
  /** The weight version's label the reply is sampled with. */
  version: string;
  /** The prompt ids as the server reports them. */
  promptIds: readonly number[];
  /** Ids the reply holds before its first reported one (a continued assistant message already has them). */
  hidden?: readonly number[];
}

export class MockLogprobModel {
  readonly #seed: number;
  #faults = new Set<DriftFault>();
  /** Token-only hash of a served sequence's ids → the version that computed its KV. */
  readonly #served = new Map<number, string>();

  constructor(seed: number) {
    this.#seed = seed | 0;
  }

  get faults(): DriftFault[] {
    return [...this.#faults];
  }

  setFaults(faults: readonly DriftFault[]): void {
    for (const f of faults)
      if (!isDriftFault(f)) throw new TypeError(`drift fault: ${String(f)} is not one of ${DRIFT_FAULTS.join(', ')}`);
    this.#faults = new Set(faults);
    if (!this.#faults.has('stale-kv')) this.#served.clear();
  }

  has(fault: DriftFault): boolean {
    return this.#faults.has(fault);
  }

  /**
   * Draws for a reply sampled after `ctx` (one `next(id)` per reported token, in order; its value u
   * gives the logprob via logprobOfUnit). With `stale-kv` the served sequence is remembered once the
   * reply's ids are known (`remember`).
   */
  draws(ctx: ReplyContext): { next(id: number): number } {
    const v = labelHash(ctx.version);
    const prompt = ctx.promptIds;
    const staleUpTo = this.#faults.has('stale-kv') ? this.#staleLength(prompt, ctx.version) : null;
    let h = this.#seed;
    for (let i = 0; i < prompt.length; i++) {
      const kv = staleUpTo !== null && i < staleUpTo.length ? staleUpTo.version : v;
      h = mix(mix(h, prompt[i]), kv);
    }
    if (this.#faults.has('retokenized-prompt') && prompt.length > 0) h = mix(mix(h, prompt[prompt.length - 1]), v);
    for (const id of ctx.hidden ?? []) h = mix(mix(h, id), v);
    const truncated = this.#faults.has('hidden-truncation');
    return {
      next: (id: number) => {
        const u = unit(h, id, v);
        h = mix(mix(h, id), v);
        // Renormalised over a kept set: the token's probability rises, its draw moves toward 0.
        return truncated ? u * 0.6 : u;
      },
    };
  }

  /** A reply was served: with `stale-kv` on, its sequence's KV stays, tagged with `version`. */
  remember(version: string, promptIds: readonly number[], ids: readonly number[]): void {
    if (!this.#faults.has('stale-kv')) return;
    let t = this.#seed;
    for (const id of promptIds) t = mix(t, id);
    for (const id of ids) t = mix(t, id);
    if (this.#served.size >= SERVED_LIMIT) this.#served.clear();
    this.#served.set(t, version);
  }

  /** The longest prefix of `prompt` served under another version than `version` (its KV kept). */
  #staleLength(prompt: readonly number[], version: string): { length: number; version: number } | null {
    let t = this.#seed;
    let best: { length: number; version: number } | null = null;
    for (let i = 0; i < prompt.length; i++) {
      t = mix(t, prompt[i]);
      const served = this.#served.get(t);
      if (served !== undefined && served !== version) best = { length: i + 1, version: labelHash(served) };
    }
    return best;
  }

  /**
   * The clean model's logprobs of `ids[from..]`, each given everything before it, under `version`:
   * what a server's prompt scoring returns (the faults are of generation, never of scoring).
   */
  score(version: string, ids: readonly number[], from: number): number[] {
    const v = labelHash(version);
    let h = this.#seed;
    const out: number[] = [];
    for (let i = 0; i < ids.length; i++) {
      if (i >= from) out.push(logprobOfUnit(unit(h, ids[i], v)));
      h = mix(mix(h, ids[i]), v);
    }
    return out;
  }
}

/**
 * Routing replay and sampling masks: what a mixture-of-experts server says it did per token, kept
 * beside the token ids so that a trainer can replay it (docs/ROUTING-REPLAY.md).
 *
 * Routed experts are per sequence position, prompt tokens included: a trainer's forward pass routes
 * every position, and replaying only the response would leave the prompt's hidden states (which the
 * response attends to) routed otherwise. A server reports rows for the positions it forwarded: the
 * prompt and every sampled token but the last (not forwarded yet) — `[start, prompt + response − 1)`
 * when asked to start at `start`. A turn keeps exactly that: `start` names the sequence position
 * (`promptIds ++ responseIds`) of its first row.
 *
 * A turn whose prompt extends the previous turn's sequence asks only from where that sequence's rows
 * ended (its last position, never forwarded there): the turns of an episode then tile its sequence,
 * each row stored once, and an episode holds O(tokens) rows instead of O(turns × tokens).
 *
 * A sampling mask is per response token: the ids the sampler could have drawn that token from after
 * truncation (top-k / top-p / min-p), as SGLang's `return_sampling_mask` gives it. Stored as CSR.
 */

/** Expert ids of a run of consecutive sequence positions: `rows × layers × topK`, row-major. */
export interface RoutedExperts {
  /** Sequence position (in `promptIds ++ responseIds`) of the first row. */
  start: number;
  rows: number;
  layers: number;
  topK: number;
  /** Expert ids: one byte each while every id is below 256, else two. */
  ids: Uint8Array | Uint16Array;
}

/** Per response token, the token ids it could have been sampled from (its support), as CSR. */
export interface SamplingMask {
  /** `tokens + 1` offsets into `ids`: token i's support is `ids[offsets[i]..offsets[i+1])`. */
  offsets: Int32Array;
  ids: Int32Array;
  /** Per token, its logprob renormalised over its support (SGLang `output_token_sampling_logprobs`); absent when not sent. */
  logprobs?: Float32Array;
}

/** Ids narrowed to the smallest array that holds them; null when one is not an expert id (negative, fractional, ≥ 65536). */
export function narrowExpertIds(values: ArrayLike<number>): Uint8Array | Uint16Array | null {
  let max = 0;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (!Number.isInteger(v) || v < 0 || v > 0xffff) return null;
    if (v > max) max = v;
  }
  const out = max < 256 ? new Uint8Array(values.length) : new Uint16Array(values.length);
  out.set(values as ArrayLike<number>);
  return out;
}

function widen(ids: Uint8Array | Uint16Array, wide: boolean): Uint8Array | Uint16Array {
  return wide && ids instanceof Uint8Array ? Uint16Array.from(ids) : ids;
}

/**
 * `b` appended to `a` when `b` begins where `a` ends and has its shape; null otherwise (rows that do
 * not line up are dropped, never shifted onto other tokens).
 */
export function concatRouted(a: RoutedExperts, b: RoutedExperts): RoutedExperts | null {
  if (b.start !== a.start + a.rows || b.layers !== a.layers || b.topK !== a.topK) return null;
  const wide = a.ids instanceof Uint16Array || b.ids instanceof Uint16Array;
  const x = widen(a.ids, wide);
  const y = widen(b.ids, wide);
  const out = wide ? new Uint16Array(x.length + y.length) : new Uint8Array(x.length + y.length);
  out.set(x);
  out.set(y, x.length);
  return { start: a.start, rows: a.rows + b.rows, layers: a.layers, topK: a.topK, ids: out };
}

/** The rows of `r` from sequence position `from` on (a copy: the rest is let go); null when it holds none there. */
export function routedFrom(r: RoutedExperts, from: number): RoutedExperts | null {
  if (from <= r.start) return r;
  const skip = from - r.start;
  if (skip >= r.rows) return null;
  const width = r.layers * r.topK;
  return { ...r, start: from, rows: r.rows - skip, ids: r.ids.slice(skip * width) };
}

/** Why `r` cannot belong to a sequence of `length` tokens, or null: rows only for positions that were forwarded. */
export function routedProblem(r: RoutedExperts, length: number): string | null {
  if (!Number.isInteger(r.start) || r.start < 0) return `start ${r.start} is not a position`;
  if (r.ids.length !== r.rows * r.layers * r.topK)
    return `${r.ids.length} ids for ${r.rows} rows × ${r.layers} layers × ${r.topK}`;
  if (r.start + r.rows > Math.max(0, length - 1))
    return `rows ${r.start}..${r.start + r.rows} go past the ${length - 1} positions a ${length}-token sequence forwards`;
  return null;
}

/** `b`'s tokens after `a`'s. */
export function concatMasks(a: SamplingMask, b: SamplingMask): SamplingMask {
  const n = a.offsets.length - 1;
  const m = b.offsets.length - 1;
  const offsets = new Int32Array(n + m + 1);
  offsets.set(a.offsets);
  const base = a.offsets[n];
  for (let i = 1; i <= m; i++) offsets[n + i] = base + b.offsets[i];
  const ids = new Int32Array(a.ids.length + b.ids.length);
  ids.set(a.ids);
  ids.set(b.ids, a.ids.length);
  const out: SamplingMask = { offsets, ids };
  if (a.logprobs !== undefined && b.logprobs !== undefined) {
    const lp = new Float32Array(n + m);
    lp.set(a.logprobs);
    lp.set(b.logprobs, n);
    out.logprobs = lp;
  }
  return out;
}

/** Tokens a mask covers. */
export function maskTokens(mask: SamplingMask): number {
  return mask.offsets.length - 1;
}

/** A mask from one support list per token (checked: each holds its sampled token); null when they do not fit `tokens`. */
export function maskFromSupports(
  supports: readonly (readonly number[])[],
  tokens: ArrayLike<number>,
  logprobs?: readonly number[],
): SamplingMask | string {
  if (supports.length !== tokens.length) return `${supports.length} supports for ${tokens.length} tokens`;
  if (logprobs !== undefined && logprobs.length !== tokens.length)
    return `${logprobs.length} support logprobs for ${tokens.length} tokens`;
  const offsets = new Int32Array(tokens.length + 1);
  let total = 0;
  for (let i = 0; i < supports.length; i++) {
    const s = supports[i];
    if (!Array.isArray(s) || s.length === 0) return `support ${i} is empty`;
    total += s.length;
    offsets[i + 1] = total;
  }
  const ids = new Int32Array(total);
  for (let i = 0; i < supports.length; i++) {
    const s = supports[i];
    let holds = false;
    for (let j = 0; j < s.length; j++) {
      const id = s[j];
      if (!Number.isInteger(id) || id < 0 || id > 0x7fffffff) return `support ${i} holds ${String(id)}, not a token id`;
      if (id === tokens[i]) holds = true;
      ids[offsets[i] + j] = id;
    }
    if (!holds) return `support ${i} lacks its sampled token ${tokens[i]}`;
  }
  return logprobs === undefined ? { offsets, ids } : { offsets, ids, logprobs: Float32Array.from(logprobs) };
}

/**
 * Routed experts laid over a whole sequence (a black-box session's stitched observation): row `p` is
 * position `p` (`start` 0, `rows` the sequence's length), and every id of a position no server
 * reported is `fill` — 255 in a `Uint8Array` (every id below it), else 65535 in a `Uint16Array`.
 */
export interface SequenceRouting extends RoutedExperts {
  fill: number;
}

/** The fill of a sequence's rows, by the width of its ids. */
export const ROUTED_FILL_U8 = 0xff;
export const ROUTED_FILL_U16 = 0xffff;

/**
 * `runs` (each a call's rows, at the positions it was reported for) laid over a sequence of `length`
 * positions, a later run's report of a position winning; null when no run holds a row. A run that
 * does not fit (another shape than the first, rows past the sequence, an id equal to the 16-bit fill)
 * is a string saying why: the caller fails loudly rather than train on misplaced rows.
 */
export function routingOver(
  length: number,
  runs: readonly (RoutedExperts | undefined)[],
): SequenceRouting | string | null {
  const present = runs.filter((r): r is RoutedExperts => r !== undefined && r.rows > 0);
  if (present.length === 0) return null;
  const { layers, topK } = present[0];
  const width = layers * topK;
  let max = 0;
  for (const r of present) {
    if (r.layers !== layers || r.topK !== topK)
      return `rows of ${r.layers} layers × ${r.topK} beside rows of ${layers} × ${topK}`;
    if (r.start < 0 || r.start + r.rows > length)
      return `rows ${r.start}..${r.start + r.rows} go past the ${length} positions of the sequence`;
    for (let i = 0; i < r.ids.length; i++) if (r.ids[i] > max) max = r.ids[i];
  }
  if (max >= ROUTED_FILL_U16) return `expert id ${max} is the fill of 16-bit rows`;
  const narrow = max < ROUTED_FILL_U8;
  const fill = narrow ? ROUTED_FILL_U8 : ROUTED_FILL_U16;
  const ids = narrow ? new Uint8Array(length * width) : new Uint16Array(length * width);
  ids.fill(fill);
  for (const r of present) ids.set(r.ids, r.start * width);
  return { start: 0, rows: length, layers, topK, ids, fill };
}

/**
 * Sampling masks of calls laid over a sequence of `length` tokens (`pieces`: each mask at the
 * position of its call's first response token, none overlapping another and each inside the
 * sequence): a support for each token a mask covers, an empty one elsewhere; `logprobs` only when
 * every piece has them (0 outside). Null when there is no piece.
 */
export function masksOver(length: number, pieces: readonly { at: number; mask: SamplingMask }[]): SamplingMask | null {
  if (pieces.length === 0) return null;
  const counts = new Int32Array(length);
  for (const { at, mask } of pieces)
    for (let i = 0; i < maskTokens(mask); i++) counts[at + i] = mask.offsets[i + 1] - mask.offsets[i];
  const offsets = new Int32Array(length + 1);
  for (let p = 0; p < length; p++) offsets[p + 1] = offsets[p] + counts[p];
  const ids = new Int32Array(offsets[length]);
  const withLogprobs = pieces.every((p) => p.mask.logprobs !== undefined);
  const logprobs = withLogprobs ? new Float32Array(length) : undefined;
  for (const { at, mask } of pieces) {
    const tokens = maskTokens(mask);
    ids.set(mask.ids.subarray(mask.offsets[0], mask.offsets[tokens]), offsets[at]);
    if (logprobs !== undefined && mask.logprobs !== undefined) logprobs.set(mask.logprobs, at);
  }
  return logprobs === undefined ? { offsets, ids } : { offsets, ids, logprobs };
}

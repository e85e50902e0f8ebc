/**
 * Routed experts and sampling masks from the mock, in each server's encoding (llm/routing-wire.ts
 * names the sources). Every value is a function of the token and its position only, so a test can
 * check any stored row against `mockExpert` — a row shifted by one position, or put on another
 * token, no longer matches.
 */
import { npyBase64, sglangBase64 } from '../llm/routing-wire.ts';

/** The model shape the mock routes with: what `--enable-return-routed-experts` would capture. */
export interface MockRouting {
  layers: number;
  topK: number;
  /** Experts per layer (ids are below it): ≤ 256 gives uint8 storage, more uint16. */
  experts: number;
  /**
   * vllm dialect, the form of its reply (llm/routing-wire.ts): `npy` (the default) a base64 `.npy` on
   * each choice from `routed_experts_prompt_start` on, as vLLM after 0.21; `lists` vLLM 0.21's int16
   * lists, the prompt's rows in the response's `prompt_routed_experts` and the generated ones on the
   * choice, every position from 0 (the request's start is not read).
   */
  vllmWire?: 'npy' | 'lists';
  /**
   * sglang dialect, SGLANG_ROUTED_EXPERTS_DTYPE: the ids' width on the wire, named in
   * `meta_info.routed_experts_dtype` (int32 when an id does not fit); absent = int32 without that
   * field, as SGLang before it.
   */
  sglangDtype?: 'int32' | 'uint16' | 'uint8';
}

/** The expert the mock routes `token` at sequence `position` to, in `layer`, as its `k`-th choice. */
export function mockExpert(token: number, position: number, layer: number, k: number, experts: number): number {
  let h = Math.imul(token + 1, 0x9e3779b1) ^ Math.imul(position + 1, 0x85ebca6b) ^ Math.imul(layer + 1, 0xc2b2ae35);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  h ^= h >>> 12;
  return ((h >>> 0) + k * 7) % experts;
}

/** Rows for positions `[from, sequence.length − 1)`: every position forwarded, the last sampled token not yet. */
export function mockRows(sequence: readonly number[], from: number, r: MockRouting): number[] {
  const out: number[] = [];
  for (let p = Math.max(0, from); p < sequence.length - 1; p++)
    for (let l = 0; l < r.layers; l++)
      for (let k = 0; k < r.topK; k++) out.push(mockExpert(sequence[p], p, l, k, r.experts));
  return out;
}

/** vLLM's `routed_experts`: a base64 `.npy` (uint8 / uint16 as the ids need); null when no position was forwarded. */
export function vllmRoutedField(sequence: readonly number[], from: number, r: MockRouting): string | null {
  const values = mockRows(sequence, from, r);
  const rows = values.length / (r.layers * r.topK);
  if (sequence.length <= 1) return null;
  return npyBase64(values, [rows, r.layers, r.topK], r.experts <= 256 ? '|u1' : '<u2');
}

/** `[rows][layers][topK]` lists of the mock's rows for positions `[from, to)` of `sequence`. */
function nested(sequence: readonly number[], from: number, to: number, r: MockRouting): number[][][] {
  const out: number[][][] = [];
  for (let p = from; p < to; p++)
    out.push(
      Array.from({ length: r.layers }, (_, l) =>
        Array.from({ length: r.topK }, (_, k) => mockExpert(sequence[p], p, l, k, r.experts)),
      ),
    );
  return out;
}

/**
 * vLLM 0.21's fields for a reply of `ids` after `promptIds`: the response's `prompt_routed_experts`
 * (every prompt position) and the choice's `routed_experts` (the generated positions but the last,
 * never forwarded; null when there are none), both null when nothing was generated.
 */
export function vllmListFields(
  promptIds: readonly number[],
  ids: readonly number[],
  r: MockRouting,
): { prompt_routed_experts: number[][][] | null; routed_experts: number[][][] | null } {
  if (ids.length === 0) return { prompt_routed_experts: null, routed_experts: null };
  const sequence = [...promptIds, ...ids];
  const generated = nested(sequence, promptIds.length, sequence.length - 1, r);
  return {
    prompt_routed_experts: nested(sequence, 0, promptIds.length, r),
    routed_experts: generated.length > 0 ? generated : null,
  };
}

/**
 * SGLang's meta_info fields for routed experts: `routed_experts` in the configured wire dtype and,
 * when one is configured, `routed_experts_dtype` naming the one sent (int32 when an id does not fit).
 */
export function sglangRoutedFields(sequence: readonly number[], from: number, r: MockRouting): Record<string, string> {
  const values = mockRows(sequence, from, r);
  if (r.sglangDtype === undefined) return { routed_experts: sglangBase64(values, 'int32') };
  const most = r.sglangDtype === 'uint8' ? 0xff : r.sglangDtype === 'uint16' ? 0xffff : Number.MAX_SAFE_INTEGER;
  const dtype = values.every((v) => v <= most) ? r.sglangDtype : 'int32';
  return { routed_experts: sglangBase64(values, dtype), routed_experts_dtype: dtype };
}

/** The mock's support for `token` sampled at `position`: itself and one neighbour that depends on the position. */
export function mockSupport(token: number, position: number): number[] {
  return [token, token + 1 + (position % 5)];
}

/**
 * SGLang's sampling-mask fields for `ids` sampled after `promptLength` prompt tokens: the support
 * per token, its renormalised logprob, and the count.
 */
export function sglangMaskFields(ids: readonly number[], promptLength: number): Record<string, unknown> {
  return {
    output_token_sampling_mask: ids.map((id, i) => mockSupport(id, promptLength + i)),
    output_token_sampling_logprobs: ids.map(() => Math.log(0.5)),
    output_token_sampling_mask_length: ids.length,
  };
}

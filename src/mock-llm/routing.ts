/**
 * Routed experts and sampling masks from the mock, in each server's encoding (llm/routing-wire.ts
 * names the sources). Every value is a function of the token and its position only, so a test can
 * check any stored row against `mockExpert` — a row shifted by one position, or put on another
 * token, no longer matches.
 */
import { int32Base64, npyBase64 } from '../llm/routing-wire.ts';

/** The model shape the mock routes with: what `--enable-return-routed-experts` would capture. */
export interface MockRouting {
  layers: number;
  topK: number;
  /** Experts per layer (ids are below it): ≤ 256 gives uint8 storage, more uint16. */
  experts: number;
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

/** SGLang's `meta_info.routed_experts`: base64 int32, no shape. */
export function sglangRoutedField(sequence: readonly number[], from: number, r: MockRouting): string {
  return int32Base64(mockRows(sequence, from, r));
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

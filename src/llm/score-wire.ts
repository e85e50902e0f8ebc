/**
 * Prompt scoring on each inference server: the logprob of every given token after the ones before it,
 * in one prefill — what the consistency audit (coordinator/audit.ts) re-scores a rollout's exact ids
 * with. Each shape is read from the server's source:
 *
 * - SGLang `POST /generate {input_ids, sampling_params: {max_new_tokens: 0, temperature, …},
 *   return_logprob: true, logprob_start_len: L}` → `meta_info.input_token_logprobs`, one
 *   `[logprob, id, text]` per id from L on, the first padded with a null logprob
 *   (python/sglang/srt/managers/scheduler_output_processor_mixin.py _process_input_token_logprobs
 *   @5294b03c42e7f098131b9825a9a2b23e10f4ae35: `[None] + input_token_logprobs[:-1]`, ids
 *   `origin_input_ids[logprob_start_len:]`; GenerateReqInput.logprob_start_len in
 *   managers/io_struct.py @f11d231cea29f76f78aaa524783d6556267e3b58). They are scaled by the
 *   request's temperature and top-p-renormalised as the sampled ones are
 *   (layers/logits_processor.py compute_temp_top_p_normalized_logprobs
 *   @5993251f1c6c8930c561e46e385502f43838eb0b), so the request carries the turn's sampling settings.
 * - vLLM `POST /v1/completions {prompt: ids, max_tokens: 1, prompt_logprobs: 0}` →
 *   `choices[0].prompt_logprobs`, `[null, {"<id>": {logprob, rank, decoded_token}}, …]`: the first
 *   prompt token has none, and with 0 alternatives each dict holds the prompt token itself
 *   (vllm/entrypoints/openai/serving_completion.py request_output_to_completion_response
 *   @00463e627b4cbe549b5e9815a2bdb0100ae88ea9; -inf clamped to -9999, serving_engine.py
 *   clamp_prompt_logprobs). They are the raw model's (vllm/v1/worker/gpu_model_runner.py
 *   _get_prompt_logprobs_dict @4e1790651fc758c06c7a903dd4cd82364ac91b27: log_softmax of the logits, no
 *   temperature), as the sampled ones are under vLLM's default `--logprobs-mode raw_logprobs`.
 *   `max_tokens` 1: the non-echo path needs a token generated (0 is served only with `echo`).
 * - llama.cpp cannot: `llama-server` decodes a prompt with logits for its last token only and fills
 *   `completion_probabilities` (populate_token_probs) for sampled tokens only, so `n_probs` and
 *   `post_sampling_probs` never score a given token (tools/server/server-context.cpp
 *   @fb4026604c67c682f552337ec9b91eced0abd35a update_slots, populate_token_probs). One position could
 *   be scored per request (a 1-token generation over the prefix, its token looked up among the
 *   alternatives: llm/token-wire.ts llamacppRecomputeBody), a request per token: not a prompt score,
 *   and not what the audit does.
 * - The plain OpenAI API has no prompt scoring.
 */
import type { ServerKind } from './servers.ts';
import { samplingFields, type SamplingParams } from './token-wire.ts';

export interface ScoreRequest {
  /** The whole sequence: the turn's prompt ids then its response ids. */
  ids: readonly number[];
  /** Position of the first id to score (the first response token); ≥ 1. */
  from: number;
  /** The settings the turn was sampled with (SGLang's input logprobs are scaled by them). */
  sampling: SamplingParams;
}

export interface ScoreWire {
  path: '/generate' | '/v1/completions';
  body(request: ScoreRequest, model: string | null): Record<string, unknown>;
  /** The logprobs of ids[from..], or an error made by `fail` naming what is wrong. */
  parse(json: unknown, request: ScoreRequest, fail: (why: string) => Error): number[];
}

const SGLANG: ScoreWire = {
  path: '/generate',
  body: (r) => ({
    input_ids: Array.from(r.ids),
    sampling_params: samplingFields(
      'sglang',
      { ...r.sampling, stop: undefined, seed: undefined },
      { max_new_tokens: 0 },
    ),
    return_logprob: true,
    // The entry at L is padded with null: start one before the first token to score.
    logprob_start_len: r.from - 1,
  }),
  parse: (json, r, fail) => {
    const reply = (Array.isArray(json) ? json[0] : json) as { meta_info?: { input_token_logprobs?: unknown } } | null;
    const entries = reply?.meta_info?.input_token_logprobs;
    const want = r.ids.length - r.from + 1;
    if (!Array.isArray(entries) || entries.length !== want)
      throw fail(
        `meta_info.input_token_logprobs must hold ${want} [logprob, id, text] entries (ids from logprob_start_len ${r.from - 1}), got ${Array.isArray(entries) ? entries.length : typeof entries}`,
      );
    const out: number[] = [];
    for (let i = 1; i < entries.length; i++) {
      const e = entries[i] as unknown[];
      const at = r.from + i - 1;
      if (!Array.isArray(e) || typeof e[0] !== 'number')
        throw fail(`meta_info.input_token_logprobs[${i}] must be [logprob, id, text] (got ${JSON.stringify(e)})`);
      if (e[1] !== undefined && e[1] !== null && e[1] !== r.ids[at])
        throw fail(`meta_info.input_token_logprobs[${i}] is for token ${String(e[1])}, not ${r.ids[at]}`);
      out.push(e[0]);
    }
    return out;
  },
};

const VLLM: ScoreWire = {
  path: '/v1/completions',
  body: (r, model) => ({
    ...(model !== null ? { model } : {}),
    prompt: Array.from(r.ids),
    max_tokens: 1,
    prompt_logprobs: 0,
    temperature: r.sampling.temperature ?? 1,
  }),
  parse: (json, r, fail) => {
    const choice = (json as { choices?: { prompt_logprobs?: unknown }[] } | null)?.choices?.[0];
    const rows = choice?.prompt_logprobs;
    if (!Array.isArray(rows) || rows.length !== r.ids.length)
      throw fail(
        `choices[0].prompt_logprobs must hold one entry per prompt token (${r.ids.length}), got ${Array.isArray(rows) ? rows.length : typeof rows}: is prompt_logprobs supported?`,
      );
    const out: number[] = [];
    for (let i = r.from; i < rows.length; i++) {
      const row = rows[i] as Record<string, { logprob?: unknown }> | null;
      const hit = row?.[String(r.ids[i])]?.logprob;
      if (typeof hit !== 'number') throw fail(`choices[0].prompt_logprobs[${i}] has no logprob for token ${r.ids[i]}`);
      out.push(hit);
    }
    return out;
  },
};

/** Why a server kind cannot score, for the start-up line and docs/AUDIT.md. */
export const CANNOT_SCORE: Partial<Record<ServerKind, string>> = {
  llamacpp:
    "llama.cpp llama-server has no prompt logprobs: it computes logits for a prompt's last token only and reports probabilities of sampled tokens only (tools/server/server-context.cpp)",
  openai: 'the OpenAI API has no prompt scoring',
};

/** The scoring route of a server kind; null when it has none (CANNOT_SCORE says why). */
export function scoreWire(kind: ServerKind): ScoreWire | null {
  if (kind === 'sglang') return SGLANG;
  // The mock's default dialect (generic) answers vLLM's shape on /v1/completions.
  if (kind === 'vllm' || kind === 'generic') return VLLM;
  return null;
}

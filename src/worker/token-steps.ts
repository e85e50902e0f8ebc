/**
 * Which weights sampled each token of a reply — the model step a trainer recomputes a token's logprob
 * under, and whether that recomputation can match at all.
 *
 * A call normally starts and ends on one set of weights. An in-place pause (SGLang `in_place`, vLLM
 * `keep`) is the exception: the server keeps the call, its KV cache and all, while the trainer loads
 * new weights, and the call goes on under them. Then:
 * - a streamed reply whose events name their weights (`versionSpans`) says exactly which tokens
 *   each set sampled; the ones after the update were sampled on a KV cache the earlier weights
 *   computed, so no single set of weights gives their logprobs: they are marked (`staleKv`);
 * - a whole reply names only the weights that ended it: when those are not the ones the call began
 *   on, the split is unknown — every token is tagged with the older step, as before, and the turn
 *   says it spans several versions (`spansVersions`) instead of passing for one.
 *
 * The prompt's KV is taken to be the first token's weights': a request queued while paused is
 * prefilled after the update and starts on the new weights, one already running keeps its cache.
 * A server that re-prefills on resume (SGLang `retract`) would make the later tokens exact; the
 * engine never pauses that way.
 */
import type { ChatResult } from '../llm/reply.ts';

export interface TokenSteps {
  /** The oldest step among the tokens (the turn's step: staleness is never understated). */
  modelStep: number;
  /** Per token, where they differ; null = every token has `modelStep`. */
  modelSteps: Int32Array | null;
  /** Per token, 1 = sampled on KV from earlier weights than its own; null = none was. */
  staleKv: Uint8Array | null;
  /** The reply came from more than one set of weights, and which token from which is unknown. */
  spansVersions: boolean;
}

/**
 * `stepOf` maps a reported weight version to its model step (the pause gate's announcements);
 * `stepAtSend` is the step the engine served when the call went out.
 */
export function tokenSteps(
  reply: ChatResult,
  stepAtSend: number,
  stepOf: (version: string | null) => number,
): TokenSteps {
  const n = reply.responseIds?.length ?? 0;
  const spans = reply.versionSpans;
  if (spans !== undefined && n > 0 && spans.at(-1)?.end === n) {
    const steps = new Int32Array(n);
    let from = 0;
    for (const span of spans) {
      steps.fill(stepOf(span.version), from, span.end);
      from = span.end;
    }
    let oldest = steps[0];
    let mixed = false;
    let stale: Uint8Array | null = null;
    for (let i = 1; i < n; i++) {
      if (steps[i] < oldest) oldest = steps[i];
      if (steps[i] !== steps[0]) {
        mixed = true;
        (stale ??= new Uint8Array(n))[i] = 1;
      }
    }
    return { modelStep: oldest, modelSteps: mixed ? steps : null, staleKv: stale, spansVersions: false };
  }
  const atReply = stepOf(reply.weightVersion);
  return {
    modelStep: Math.min(atReply, stepAtSend),
    modelSteps: null,
    staleKv: null,
    spansVersions: n > 0 && atReply !== stepAtSend,
  };
}

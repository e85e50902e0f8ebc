/**
 * Continuing an ABORTED rollout where it stopped (partial rollouts on): its partial last turn is
 * continued by a new call, and the two are folded into one turn whose tokens, logprobs, model steps
 * and stale-KV marks are the partial's followed by the continuation's.
 */
import { modelStepsOf, type TurnRecord } from '../domain/rollout.ts';

/**
 * Fold the partial turn in front of its continuation: one turn whose tokens are the partial's (with
 * their old model steps) followed by the new ones (with the new step), and the original prompt ids.
 */
export function mergeContinuation(partial: TurnRecord, turn: TurnRecord): void {
  // First, while each part's ids still give its own length: the new tokens' steps are implicit.
  turn.modelSteps = concat(modelStepsOf(partial), modelStepsOf(turn), Int32Array);
  if (partial.staleKv !== undefined || turn.staleKv !== undefined) {
    const stale = concat(staleKvOf(partial), staleKvOf(turn), Uint8Array);
    if (stale !== null) turn.staleKv = stale;
  }
  if (partial.spansVersions === true) turn.spansVersions = true;
  if (partial.historyRewrite !== undefined) turn.historyRewrite = partial.historyRewrite;
  turn.response = partial.response + turn.response;
  turn.promptIds = partial.promptIds ?? turn.promptIds;
  turn.responseIds = concat(partial.responseIds, turn.responseIds, Int32Array);
  turn.logprobs = concat(partial.logprobs, turn.logprobs, Float32Array);
  turn.timings.inferenceMs += partial.timings.inferenceMs;
  turn.timings.totalMs += partial.timings.totalMs;
}

/** A turn's stale-KV marks with a 0 for every token when it has none (a continuation's part re-prefilled on one set of weights). */
function staleKvOf(turn: TurnRecord): Uint8Array | null {
  return turn.staleKv ?? (turn.responseIds === null ? null : new Uint8Array(turn.responseIds.length));
}

function concat<T extends Int32Array | Float32Array | Uint8Array>(
  a: T | null,
  b: T | null,
  Kind: { new (n: number): T },
): T | null {
  if (a === null || b === null) return null; // ids from only one part cannot be aligned
  const out = new Kind(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/**
 * Response lengths of the GPU-like mock: long-tailed, and correlated within a prompt, as an RL
 * rollout's are (a hard prompt makes every sample of its group long; one sample in many runs far
 * longer than the rest). A length is
 *
 *   median × exp(σ/√2 · z_prompt + σ/√2 · z_response)
 *
 * — log-normal with σ overall, half of its variance shared by every response to the same prompt
 * (z_prompt is drawn from the prompt's opening messages), half the response's own (z_response from
 * the request's random stream). With σ = 1 the p99 is ≈ 10× the median.
 *
 * Invariant: a length is a pure function of (server seed, prompt, the request's stream seed), so a
 * continuation sent with the same request seed draws the same length as the generation it continues.
 */
import { createRng, mixSeeds } from '../env/synthetic/rng.ts';
import { fmix32 } from '../hash.ts';

export interface LengthOptions {
  /** Median response length in tokens. */
  median: number;
  /** σ of log(length); 0 = every response is `median` long. */
  sigma: number;
}

/** The longest response drawn: a far tail beyond any context window is not a response. */
export const MAX_RESPONSE_TOKENS = 32_768;

/** Hash of the prompt's identity: its system and first user message (what a dataset line sets). */
export function promptKey(messages: readonly { role: string; content: string }[]): number {
  let h = 0x811c9dc5;
  let taken = 0;
  for (const m of messages) {
    if (m.role !== 'system' && m.role !== 'user') continue;
    for (let i = 0; i < m.content.length; i++) h = Math.imul(h ^ m.content.charCodeAt(i), 0x01000193);
    h = fmix32(h);
    if (m.role === 'user' || ++taken >= 2) break;
  }
  return h >>> 0;
}

/** A standard normal draw (Box–Muller) from a seeded stream. */
function gaussian(seed: number): number {
  const rng = createRng(seed);
  const u = Math.max(rng.next(), 1e-12);
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * rng.next());
}

/** The response length for a prompt (its `promptKey`) and a request's stream seed. */
export function drawLength(o: LengthOptions, serverSeed: number, prompt: number, streamSeed: number): number {
  if (o.sigma === 0) return Math.round(o.median);
  const half = o.sigma / Math.SQRT2;
  const z = half * gaussian(mixSeeds(serverSeed, 0x1e6, prompt)) + half * gaussian(streamSeed);
  return Math.max(1, Math.min(MAX_RESPONSE_TOKENS, Math.round(o.median * Math.exp(z))));
}

/**
 * Integer hashing shared by everything that derives seeds (the sampler's prompt seeds, the synthetic
 * environments' and the mock's randomness). Pure 32-bit math: the same input gives the same output on
 * every platform, so seeds derived from it reproduce a run.
 */

/** murmur3's 32-bit finaliser: spreads every input bit over the output, so nearby inputs diverge. */
export function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * The GPU-like mock's prefix cache (vLLM's automatic prefix caching, in miniature): prompts are cut
 * into blocks of BLOCK_TOKENS ids, each block named by a hash of every id up to its end (a chain), so
 * a block hits only when the whole prefix before it is the same. A session that comes back to the
 * server that served its last turn finds its conversation's blocks; on another server it prefills
 * them again.
 *
 * Invariant: at most `capacityTokens / BLOCK_TOKENS` blocks are held; inserting past that evicts the
 * least recently used (a lookup that hits counts as a use). Only whole blocks are cached, as in vLLM.
 */
import { fmix32 } from '../hash.ts';

/** vLLM's default KV-cache block size. */
export const BLOCK_TOKENS = 16;

/** The chained hash of each whole block of `ids` (a trailing partial block has none). */
export function blockHashes(ids: readonly number[]): number[] {
  const out: number[] = [];
  // Two independent 32-bit lanes folded into one 53-bit key: collisions are then negligible.
  let a = 0x9e3779b9;
  let b = 0x85ebca6b;
  const whole = ids.length - (ids.length % BLOCK_TOKENS);
  for (let i = 0; i < whole; i++) {
    a = fmix32(a ^ ids[i]);
    b = fmix32((b + ids[i] + 0x27d4eb2f) >>> 0);
    if ((i + 1) % BLOCK_TOKENS === 0) out.push(a * 2097152 + (b >>> 11));
  }
  return out;
}

export class PrefixCache {
  readonly #capacityBlocks: number;
  /** Insertion order of a Map is its LRU order: a use deletes and re-inserts the key. */
  readonly #blocks = new Map<number, true>();

  constructor(capacityTokens: number) {
    this.#capacityBlocks = Math.floor(capacityTokens / BLOCK_TOKENS);
  }

  get tokens(): number {
    return this.#blocks.size * BLOCK_TOKENS;
  }

  /** Tokens of the longest cached prefix of the blocks `hashes` names; the blocks hit become the most recent. */
  match(hashes: readonly number[]): number {
    let n = 0;
    for (const h of hashes) {
      if (!this.#blocks.has(h)) break;
      this.#blocks.delete(h);
      this.#blocks.set(h, true);
      n++;
    }
    return n * BLOCK_TOKENS;
  }

  /** Caches the blocks (most recent last), evicting the least recently used beyond the capacity. */
  insert(hashes: readonly number[]): void {
    if (this.#capacityBlocks === 0) return;
    for (const h of hashes) {
      this.#blocks.delete(h);
      this.#blocks.set(h, true);
    }
    for (const h of this.#blocks.keys()) {
      if (this.#blocks.size <= this.#capacityBlocks) break;
      this.#blocks.delete(h);
    }
  }

  /** New weights make every cached block wrong: a weight update empties the cache (vLLM's reset_prefix_cache). */
  clear(): void {
    this.#blocks.clear();
  }
}

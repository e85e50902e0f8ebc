/**
 * Seeded randomness and a CPU-cost knob for the synthetic environments and the mock inference server.
 *
 * Invariant: the same seed always gives the same sequence on every platform (pure 32-bit integer
 * math, no Math.random), so an episode is reproducible from its reset seed alone.
 */
import { fmix32 } from '../../hash.ts';

export interface Rng {
  /** Uniform in [0, 1). */
  next(): number;
  /** Uniform integer in [lo, hi], both ends inclusive. */
  int(lo: number, hi: number): number;
  /** True with probability p (p ≤ 0 never, p ≥ 1 always). */
  chance(p: number): boolean;
  /** A uniformly chosen element of a non-empty array. */
  pick<T>(items: readonly T[]): T;
}

/**
 * Folds any finite numbers (seeds, counters, stream tags) into one 32-bit seed. Both 32-bit halves of
 * each part count, so seeds above 2^32 (e.g. 64-bit-ish seeds from a trainer) do not collide.
 */
export function mixSeeds(...parts: number[]): number {
  let h = 0x9e3779b9;
  for (const part of parts) {
    if (!Number.isFinite(part)) throw new RangeError(`seed part must be a finite number (got ${part})`);
    const whole = Math.trunc(part);
    const lo = whole >>> 0;
    const hi = Math.floor(whole / 4294967296) >>> 0;
    h = fmix32(h ^ lo);
    h = fmix32((h + 0x9e3779b9) ^ hi);
  }
  return h;
}

/** mulberry32: tiny, fast, and good enough for games and load shaping (not for cryptography). */
export function createRng(seed: number): Rng {
  let state = mixSeeds(seed);
  const next = (): number => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int(lo, hi) {
      if (!Number.isSafeInteger(lo) || !Number.isSafeInteger(hi) || lo > hi) {
        throw new RangeError(`rng.int needs integers lo <= hi (got lo=${lo}, hi=${hi})`);
      }
      return lo + Math.floor(next() * (hi - lo + 1));
    },
    chance(p) {
      return next() < p;
    },
    pick(items) {
      if (items.length === 0) throw new RangeError('rng.pick needs a non-empty array');
      return items[Math.floor(next() * items.length)];
    },
  };
}

/** Written by burnCpu so the spin loop has an observable effect and cannot be optimised away. */
export let burnSink = 0;

/**
 * Busy-spins for `microseconds` on purpose: the "CPU cost per step" knob that lets load tests model
 * environments whose step is compute-bound (it blocks the event loop, exactly like such an env would).
 */
export function burnCpu(microseconds: number): void {
  if (!(microseconds > 0)) return;
  const end = performance.now() + microseconds / 1000;
  let x = burnSink | 1;
  do {
    for (let i = 0; i < 64; i++) x = (Math.imul(x, 1103515245) + 12345) | 0;
  } while (performance.now() < end);
  burnSink = x;
}

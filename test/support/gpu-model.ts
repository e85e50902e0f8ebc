/** Helpers for tests that drive the GPU-like mock's replica model (src/mock-llm/gpu-model.ts) by hand. */
import type { GpuModel, Sequence } from '../../src/mock-llm/gpu-model.ts';

/** `n` consecutive token ids from `from`. */
export const ids = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);

/** Runs the model until idle; returns the sequences in the order they finished. */
export function drain(model: GpuModel): Sequence[] {
  const done: Sequence[] = [];
  for (let guard = 0; model.nextEventAt !== null && guard < 100_000; guard++)
    done.push(...model.advanceTo(model.nextEventAt));
  return done;
}

import { RolloutEngineError } from '../errors.ts';

/**
 * Split a batch of `batchSize` groups across tasks by weight with the largest-remainder method:
 * each task gets the floor of its exact share, then the leftover groups go to the largest fractional
 * remainders, ties to the task listed first. The parts always sum to `batchSize`.
 *
 * Every share is computed as `(batchSize × weight) / Σ weights`, in that order, in plain doubles: the
 * same operations in the same order as the reference, so both give the same split bit for bit.
 *
 * Why the parts sum to `batchSize` for any finite input (test/batch-allocation.test.ts checks it over
 * weights from 5e-324 to 1e300, mixed): with m tasks of positive weight, Σ weights is off by at most
 * m ulps, so Σ exact is `batchSize` within batchSize × m × 2⁻⁵², far below 1 in the config's range.
 * Then `left` = batchSize − Σ floor(exact) is an integer from 0 to m, and the loop below hands out
 * one per positive-weight task at most: exactly `left`. A zero weight has exact share 0 and no
 * leftover. Inputs outside that (a weight that is negative or not finite, no positive weight, or a
 * batchSize × Σ weights that overflows to Infinity and makes every share Infinity or NaN) are
 * refused with an error instead: an infinite share made a strategy spawn groups for ever on the main
 * thread, and a NaN one made a batch of 0 groups (issue 28 item 4). The sum is checked again before
 * returning, so a split that does not fill the batch is an error, never a short batch.
 */
export function allocateBatch(
  batchSize: number,
  tasks: readonly { name: string; weight: number }[],
): Map<string, number> {
  if (!Number.isSafeInteger(batchSize) || batchSize < 0)
    throw invalid(`batchSize must be a non-negative integer (got ${batchSize})`);
  tasks.forEach((t, i) => {
    if (!Number.isFinite(t.weight) || t.weight < 0)
      throw invalid(`tasks[${i}].weight must be a finite number ≥ 0 (got ${t.weight})`);
  });
  const total = tasks.reduce((sum, t) => sum + t.weight, 0);
  if (batchSize > 0 && !(total > 0))
    throw invalid(
      `tasks: every weight is 0; at least one task needs a weight above 0 to share a batch of ${batchSize}`,
    );
  if (!Number.isFinite(batchSize * total))
    throw invalid(
      `tasks: batchSize (${batchSize}) × the sum of the weights (${total}) overflows a double; weights are ratios: use small numbers such as 1 and 3`,
    );
  if (batchSize === 0) return new Map(tasks.map((t) => [t.name, 0]));
  const shares = tasks.map((t, index) => {
    const exact = (batchSize * t.weight) / total;
    return { name: t.name, index, count: Math.floor(exact), remainder: exact - Math.floor(exact) };
  });
  let left = batchSize - shares.reduce((sum, s) => sum + s.count, 0);
  // Remainders are compared as the doubles they are, with no tolerance: 8/6 − 1 (0.33333333333333326)
  // loses to 2/6 (0.3333333333333333). A tolerance would make users who check a split against the
  // reference's plain IEEE arithmetic see other batch sizes; only exactly equal remainders are a tie.
  const byRemainder = [...shares].sort((a, b) =>
    a.remainder !== b.remainder ? b.remainder - a.remainder : a.index - b.index,
  );
  for (const share of byRemainder) {
    if (left <= 0) break;
    if (tasks[share.index].weight === 0) continue; // switched off: never handed a leftover
    share.count++;
    left--;
  }
  const sum = shares.reduce((s, share) => s + share.count, 0);
  if (sum !== batchSize || shares.some((s) => !Number.isSafeInteger(s.count) || s.count < 0))
    throw invalid(
      `batchSize: the split by weight gives ${shares.map((s) => s.count).join(' + ')} = ${sum} groups, not ${batchSize} (weights ${tasks.map((t) => t.weight).join(', ')})`,
    );
  return new Map(shares.map((s) => [s.name, s.count]));
}

function invalid(message: string): RolloutEngineError {
  return new RolloutEngineError('ERR_INVALID_ARGUMENT', `batch split: ${message}`);
}

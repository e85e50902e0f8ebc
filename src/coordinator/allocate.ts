/**
 * Split a batch of `batchSize` groups across tasks by weight with the largest-remainder method:
 * each task gets the floor of its exact share, then the leftover groups go to the largest fractional
 * remainders, ties to the task listed first. The parts always sum to `batchSize`.
 *
 * Every share is computed as `(batchSize × weight) / Σ weights`, in that order, in plain doubles: the
 * same operations in the same order as the reference, so both give the same split bit for bit.
 */
export function allocateBatch(
  batchSize: number,
  tasks: readonly { name: string; weight: number }[],
): Map<string, number> {
  const total = tasks.reduce((sum, t) => sum + t.weight, 0);
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
  return new Map(shares.map((s) => [s.name, s.count]));
}

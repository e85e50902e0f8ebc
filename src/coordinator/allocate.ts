/**
 * Split a batch of `batchSize` groups across tasks by weight with the largest-remainder method:
 * each task gets the floor of its exact share, then the leftover groups go to the largest fractional
 * remainders, ties to the task listed first. The parts always sum to `batchSize`.
 */
export function allocateBatch(batchSize: number, tasks: readonly { name: string; weight: number }[]): Map<string, number> {
  const total = tasks.reduce((sum, t) => sum + t.weight, 0);
  const shares = tasks.map((t, index) => {
    const exact = (batchSize * t.weight) / total;
    return { name: t.name, index, count: Math.floor(exact), remainder: exact - Math.floor(exact) };
  });
  let left = batchSize - shares.reduce((sum, s) => sum + s.count, 0);
  // Remainders are floats (8/6 − 1 ≠ 2/6 exactly): equal up to rounding counts as a tie, and ties go
  // to the task listed first.
  const byRemainder = [...shares].sort((a, b) => (Math.abs(b.remainder - a.remainder) > 1e-9 ? b.remainder - a.remainder : a.index - b.index));
  for (const share of byRemainder) {
    if (left <= 0) break;
    if (tasks[share.index].weight === 0) continue; // switched off: never handed a leftover
    share.count++;
    left--;
  }
  return new Map(shares.map((s) => [s.name, s.count]));
}

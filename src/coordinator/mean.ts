/**
 * Means kept without a sum. Rewards are any finite numbers, and finite numbers sum past
 * Number.MAX_VALUE: two rewards of 1e308 sum to Infinity where their mean is 1e308. A mean folded in
 * as the weighted average of two means stays within the range of the values it averages, so it is
 * finite whenever they are.
 */

/** The mean of `count` values of mean `mean` and `addedCount` values of mean `added`; 0 for no values. */
export function foldMean(mean: number, count: number, added: number, addedCount: number): number {
  const total = count + addedCount;
  if (addedCount === 0) return mean;
  if (count === 0) return added;
  const folded = mean * (count / total) + added * (addedCount / total);
  // Each weighted term is rounded: averaging values at ±MAX_VALUE can round just past it.
  if (!Number.isFinite(folded) && Number.isFinite(mean) && Number.isFinite(added))
    return Math.sign(folded) * Number.MAX_VALUE;
  return folded;
}

/** A mean taken one value at a time, for a loop that does not know how many values there are. */
export class RunningMean {
  mean = 0;
  count = 0;

  add(value: number): void {
    this.mean = foldMean(this.mean, this.count, value, 1);
    this.count++;
  }
}

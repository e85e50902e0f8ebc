/**
 * What a taken batch says about itself, and the token-level loss masks it carries: pure functions of
 * the groups taken and the train step, so each figure can be checked by hand (test/batch-stats.test.ts).
 */
import { rolloutStaleness, tokenLossMask } from '../buffer/staleness.ts';
import { historyRewriteCounts, inexactTokenCount, responseTokenCount, type RolloutGroup } from '../domain/rollout.ts';
import { RunningMean, foldMean } from './mean.ts';
import type { WindowStats } from './progress.ts';
import type { BatchStats } from '../domain/batch.ts';

export type { BatchStats } from '../domain/batch.ts';

/**
 * The stats of the batch `taken` (task → its groups) for `trainStep`: `maskedTokens` from
 * groupLossMasks, `window` what was produced since the previous batch (ProduceProgress.takeWindow),
 * `threshold` the stale threshold rollouts are counted against (Infinity: none is past it).
 */
export function batchStats(
  trainStep: number,
  taken: ReadonlyMap<string, readonly RolloutGroup[]>,
  maskedTokens: number,
  window: WindowStats,
  threshold: number,
): BatchStats {
  const byTask: BatchStats['byTask'] = {};
  let groups = 0;
  let rollouts = 0;
  let meanReward = 0;
  let turns = 0;
  let responseTokens = 0;
  let sMin = Infinity;
  let sMax = -Infinity;
  let sSum = 0;
  let past = 0;
  let inexact = 0;
  let rewrites = 0;
  let splits = 0;
  for (const [task, taskGroups] of taken) {
    const taskReward = new RunningMean();
    for (const g of taskGroups) {
      for (const r of g.rollouts) {
        taskReward.add(r.reward);
        turns += r.turns.length;
        responseTokens += responseTokenCount(r);
        inexact += inexactTokenCount(r);
        const rewritten = historyRewriteCounts(r);
        rewrites += rewritten.rewrites;
        splits += rewritten.splits;
        const s = rolloutStaleness(r, trainStep);
        sMin = Math.min(sMin, s);
        sMax = Math.max(sMax, s);
        sSum += s;
        if (s >= threshold) past++;
      }
    }
    byTask[task] = { groups: taskGroups.length, meanReward: taskReward.mean };
    groups += taskGroups.length;
    meanReward = foldMean(meanReward, rollouts, taskReward.mean, taskReward.count);
    rollouts += taskReward.count;
  }
  return {
    groups,
    rollouts,
    meanReward,
    turns,
    responseTokens,
    staleness:
      rollouts === 0
        ? { min: 0, max: 0, mean: 0, pastThreshold: 0 }
        : { min: sMin, max: sMax, mean: sSum / rollouts, pastThreshold: past },
    maskedTokens,
    inexactTokens: inexact,
    historyRewrites: rewrites,
    historySplits: splits,
    producedSamples: window.producedSamples,
    producedTokens: window.producedTokens,
    rawMeanReward: window.meanReward,
    failures: window.failures,
    produceMs: window.produceMs,
    byTask,
  };
}

export interface GroupLossMasks {
  /** By rollout, then by turn: the turn's loss mask, or null for a turn without per-token model steps (no mask). */
  masks: (Uint8Array | null)[][];
  /** Tokens the masks leave out of the loss. */
  masked: number;
}

/** The token-level loss masks of a group taken for `trainStep` (staleness.ts tokenLossMask per turn). */
export function groupLossMasks(group: RolloutGroup, trainStep: number, tokenThreshold: number): GroupLossMasks {
  let masked = 0;
  const masks = group.rollouts.map((rollout) =>
    rollout.turns.map((turn) => {
      const mask = tokenLossMask(turn, trainStep, tokenThreshold);
      if (mask !== null) for (let i = 0; i < mask.length; i++) masked += 1 - mask[i];
      return mask;
    }),
  );
  return { masks, masked };
}

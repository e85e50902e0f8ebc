/**
 * What a taken batch says about itself, and the token-level loss masks it carries: pure functions of
 * the groups taken and the train step, so each figure can be checked by hand (test/batch-stats.test.ts).
 */
import { rolloutStaleness, tokenLossMask } from '../buffer/staleness.ts';
import { historyRewriteCounts, inexactTokenCount, responseTokenCount, type RolloutGroup } from '../domain/rollout.ts';
import { RunningMean, foldMean } from './mean.ts';
import type { FailureKind } from '../domain/failure.ts';
import type { WindowStats } from './progress.ts';
import type { AuditStats } from './audit.ts';

export interface BatchStats {
  groups: number;
  rollouts: number;
  meanReward: number;
  /** Agent turns (inference calls) in the batch's rollouts. */
  turns: number;
  responseTokens: number;
  /**
   * Staleness of the batch's rollouts at this train step; `pastThreshold`: how many reached the stale
   * threshold (async with producer.staleRollouts keep hands such rollouts out; otherwise 0).
   */
  staleness: { min: number; max: number; mean: number; pastThreshold: number };
  /** Tokens masked out of the loss by the token-level staleness threshold. */
  maskedTokens: number;
  /**
   * Response tokens whose recorded logprob no single set of weights reproduces: sampled on a KV cache
   * from earlier weights (`TurnRecord.staleKv`), or in a turn spanning weight versions without a
   * per-token split (`spansVersions`) — generations kept across in-place weight updates.
   */
  inexactTokens: number;
  /**
   * `llm.api: tokens`: turns whose chat template re-rendered the history otherwise than it was sampled
   * (TurnRecord.historyRewrite, docs/TEMPLATES.md), and of those, the ones that began a new training
   * segment (`llm.historyMode: split`, or a keep-sampled turn that could not be kept): the batch's
   * samples number its rollouts' segments, rollouts + historySplits for single-agent ones.
   */
  historyRewrites: number;
  historySplits: number;
  /**
   * Since the previous batch: rollouts produced per task (every status, a retried group's rollouts
   * each time it lands) and the response tokens generated for them (each token once, in the dispatch
   * that made it).
   */
  producedSamples: Record<string, number>;
  producedTokens: Record<string, number>;
  /** Since the previous batch: mean reward of COMPLETED groups as generated (before filtering). */
  rawMeanReward: Record<string, number | null>;
  /**
   * Since the previous batch: episodes that failed, by kind (src/domain/failure.ts). Infrastructure
   * ones include episodes run again in their slot: none of them is in any batch.
   */
  failures: Record<FailureKind, number>;
  produceMs: number;
  byTask: Record<string, { groups: number; meanReward: number }>;
  /**
   * The consistency audit since the previous batch (coordinator/audit.ts: rollouts re-scored on the
   * server, |Δ logprob| by segment, what it cost); absent when `audit.fraction` is 0 and none was asked for.
   */
  audit?: AuditStats;
}

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

/**
 * A batch as the trainer takes it (Producer.getBatch, the control API, batch files) and what it says
 * about itself: data, below every layer that makes, sends or writes one (formats/, control/, cli/).
 * The figures are computed in coordinator/batch-stats.ts and coordinator/audit.ts.
 */
import type { FailureKind } from './failure.ts';
import type { RolloutGroup } from './rollout.ts';

/**
 * NORMAL: `groups` holds the batch. UPDATE_WEIGHT_AND_ABORT: a weight update is in progress — resume,
 * then ask again. EXPIRED_BATCH: the weights are too stale to produce this step — sync the weights
 * (pause, load, resume), then ask again. Both of the latter come with no groups.
 */
export type Batch =
  | { trainStep: number; status: 'NORMAL'; groups: RolloutGroup[]; stats: BatchStats }
  | { trainStep: number; status: 'UPDATE_WEIGHT_AND_ABORT' | 'EXPIRED_BATCH'; groups: []; stats: null };

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

/** What the audit found over a window (since the last batch) or the whole run. */
export interface AuditStats extends DeltaStats {
  /** Rollouts audited (at least one token compared). */
  rollouts: number;
  bySegment: Record<SegmentKind, DeltaStats>;
  /** Rollouts with a segment past the threshold. */
  flagged: number;
  /** The worst flagged rollouts (up to 10): id, segment, its mean |Δ|. */
  worst: { rolloutId: string; segment: string; meanAbsDelta: number }[];
  /** Tokens not compared, by reason (audit-segments.ts SKIP_REASONS). */
  skippedTokens: Record<SkipReason, number>;
  /**
   * What it cost the servers: tokens sent for scoring (prompt and response of each turn: one prefill
   * each) against the response tokens generated in the same span, and seconds of scoring calls.
   */
  cost: { scoredTokens: number; generatedTokens: number; tokenShare: number; seconds: number };
}

/** The consistency audit's segment kinds and skip reasons (coordinator/audit-segments.ts). */
export const SEGMENT_KINDS = ['turnStart', 'turnRest', 'beforeUpdate', 'afterUpdate'] as const;
export type SegmentKind = (typeof SEGMENT_KINDS)[number];

/** Why tokens of a rollout were not compared. */
export const SKIP_REASONS = [
  /** Sampled with a model step the servers no longer serve: re-scoring would measure the update. */
  'weightsMoved',
  /** The turn has no prompt ids, response ids or logprobs (chat without ids, text-only replies). */
  'noIds',
  /** The server kind has no prompt scoring (llama.cpp, the plain OpenAI API). */
  'cannotScore',
  /** Over the audit's token budget (audit.maxTokenShare). */
  'budget',
  /** A pause came while scoring (the weights may have changed under it), or the call failed. */
  'interrupted',
] as const;
export type SkipReason = (typeof SKIP_REASONS)[number];

export interface DeltaStats {
  tokens: number;
  /** Mean |recorded − re-scored| logprob over the tokens (0 when none). */
  meanAbsDelta: number;
  maxAbsDelta: number;
}

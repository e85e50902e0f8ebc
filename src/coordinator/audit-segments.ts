/**
 * The consistency audit's arithmetic (coordinator/audit.ts runs it): a rollout's recorded logprobs
 * against the same ids re-scored on the server, |Δ| per token, summed into segments. Pure: each
 * figure can be checked by hand (test/audit.test.ts).
 *
 * Segments of a rollout, each named for the warning that names it:
 * - `turn N` (with the agent in a multi-agent rollout): every scored token of that turn;
 * - `turn N start`: its first TURN_START_TOKENS tokens, where a re-tokenised prompt, a dropped first
 *   token or a prompt that is not what was sampled on shows first (kind `turnStart`; the others of
 *   the turn are `turnRest`);
 * - `step S`: in a rollout whose tokens come from more than one model step (continued across a weight
 *   update), the tokens of step S: kind `beforeUpdate` for its first step, `afterUpdate` for the later
 *   ones — where stale KV after an in-place update shows.
 */
import { SEGMENT_KINDS, SKIP_REASONS, type DeltaStats, type SegmentKind, type SkipReason } from '../domain/batch.ts';
import type { RolloutState, TurnRecord } from '../domain/rollout.ts';

export { SEGMENT_KINDS, SKIP_REASONS, type DeltaStats, type SegmentKind, type SkipReason };

/** Tokens at the start of each turn counted as its boundary. */
export const TURN_START_TOKENS = 4;

export interface SegmentReport extends DeltaStats {
  name: string;
  kind: 'turn' | 'step' | 'turnStart';
}

export interface RolloutAudit extends DeltaStats {
  rolloutId: string;
  groupId: string;
  taskName: string;
  /** The endpoint that re-scored it. */
  server: string;
  /** The model step its compared tokens were sampled with (the one served while it was scored). */
  modelStep: number;
  segments: SegmentReport[];
  /** Per kind, over this rollout's compared tokens. */
  bySegment: Record<SegmentKind, DeltaStats>;
  /** Segments whose mean |Δ| passed the threshold, worst first. */
  flagged: string[];
  /** Tokens not compared, by reason. */
  skipped: Record<SkipReason, number>;
}

/** One turn's re-scored logprobs: one per response token, NaN where it was not scored. */
export type TurnScores = (Float64Array | null)[];

export class DeltaSum {
  tokens = 0;
  sum = 0;
  max = 0;

  add(delta: number): void {
    this.tokens++;
    this.sum += delta;
    if (delta > this.max) this.max = delta;
  }

  merge(other: DeltaStats): void {
    this.sum += other.meanAbsDelta * other.tokens;
    this.tokens += other.tokens;
    if (other.maxAbsDelta > this.max) this.max = other.maxAbsDelta;
  }

  stats(): DeltaStats {
    return { tokens: this.tokens, meanAbsDelta: this.tokens === 0 ? 0 : this.sum / this.tokens, maxAbsDelta: this.max };
  }
}

export function emptySkips(): Record<SkipReason, number> {
  return { weightsMoved: 0, noIds: 0, cannotScore: 0, budget: 0, interrupted: 0 };
}

/** The model step of response token `i` of `turn`. */
export function tokenStep(turn: TurnRecord, i: number): number {
  return turn.modelSteps !== null && i < turn.modelSteps.length ? turn.modelSteps[i] : turn.modelStep;
}

/** Whether a turn can be re-scored: it has prompt ids, response ids and a logprob per response token. */
export function scorable(turn: TurnRecord): boolean {
  return (
    turn.promptIds !== null &&
    turn.promptIds.length > 0 &&
    turn.responseIds !== null &&
    turn.responseIds.length > 0 &&
    turn.logprobs !== null &&
    turn.logprobs.length === turn.responseIds.length
  );
}

/**
 * The audit of `rollout` from `scores` (by turn: the re-scored logprob of each response token, NaN
 * where not scored; null for a turn not scored) and the skips counted while scoring. The recorded
 * logprobs are float32 (TurnRecord.logprobs): the re-scored ones are rounded the same way first, so
 * the same number reads 0.
 */
export function auditRollout(
  rollout: RolloutState,
  scores: TurnScores,
  meta: { server: string; modelStep: number; threshold: number; skipped: Record<SkipReason, number> },
): RolloutAudit {
  const total = new DeltaSum();
  const kinds = Object.fromEntries(SEGMENT_KINDS.map((k) => [k, new DeltaSum()])) as Record<SegmentKind, DeltaSum>;
  const segments: SegmentReport[] = [];
  const steps = new Map<number, DeltaSum>();
  let firstStep = Infinity;
  let lastStep = -Infinity;
  for (const turn of rollout.turns) {
    const n = turn.responseIds?.length ?? 0;
    for (let i = 0; i < n; i++) {
      const s = tokenStep(turn, i);
      firstStep = Math.min(firstStep, s);
      lastStep = Math.max(lastStep, s);
    }
  }
  const spansUpdate = lastStep > firstStep;
  rollout.turns.forEach((turn, t) => {
    const scored = scores[t];
    if (scored === null || scored === undefined || turn.logprobs === null) return;
    const name = `turn ${turn.step}${turn.agentId !== null ? ` (${turn.agentId})` : ''}`;
    const whole = new DeltaSum();
    const start = new DeltaSum();
    for (let i = 0; i < scored.length; i++) {
      if (Number.isNaN(scored[i])) continue;
      const delta = Math.abs(turn.logprobs[i] - Math.fround(scored[i]));
      total.add(delta);
      whole.add(delta);
      if (i < TURN_START_TOKENS) {
        start.add(delta);
        kinds.turnStart.add(delta);
      } else kinds.turnRest.add(delta);
      if (spansUpdate) {
        const s = tokenStep(turn, i);
        kinds[s === firstStep ? 'beforeUpdate' : 'afterUpdate'].add(delta);
        let sum = steps.get(s);
        if (sum === undefined) steps.set(s, (sum = new DeltaSum()));
        sum.add(delta);
      }
    }
    if (whole.tokens === 0) return;
    segments.push({ name, kind: 'turn', ...whole.stats() });
    segments.push({ name: `${name} start`, kind: 'turnStart', ...start.stats() });
  });
  for (const [s, sum] of [...steps].sort((a, b) => a[0] - b[0]))
    segments.push({
      name: `step ${s}${s === firstStep ? ' (before update)' : ' (after update)'}`,
      kind: 'step',
      ...sum.stats(),
    });
  const flagged = segments
    .filter((s) => s.meanAbsDelta > meta.threshold)
    .sort((a, b) => b.meanAbsDelta - a.meanAbsDelta)
    .map((s) => s.name);
  return {
    rolloutId: rollout.id,
    groupId: rollout.groupId,
    taskName: rollout.taskName,
    server: meta.server,
    modelStep: meta.modelStep,
    ...total.stats(),
    segments,
    bySegment: Object.fromEntries(SEGMENT_KINDS.map((k) => [k, kinds[k].stats()])) as Record<SegmentKind, DeltaStats>,
    flagged,
    skipped: meta.skipped,
  };
}

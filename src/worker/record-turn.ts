/**
 * Recording a reply of the step in play in its rollout, and what comes with it: the turn is marked
 * unfinished until the environment steps on it (env-step.ts), its prompt ids are shared with the
 * agent's earlier turns (prompt-prefix.ts), and a split ends the segment before it (segments.ts).
 * Every reply a step goes on with is recorded here — a step's first replies (episode-steps.ts) and
 * each tool round's (tool-rounds.ts) — so none of the three is left out on one of the paths.
 */
import type { RolloutState, TurnRecord } from '../domain/rollout.ts';
import { markUnfinished } from './env-step.ts';
import { sharePromptPrefix } from './prompt-prefix.ts';
import { endSegmentBefore } from './segments.ts';

/** Appends `turn` to the rollout; `firstNewTurn` is the first turn this run of the episode added. */
export function recordTurn(rollout: RolloutState, turn: TurnRecord, firstNewTurn: number): void {
  const at = rollout.turns.push(turn) - 1;
  markUnfinished(turn);
  sharePromptPrefix(rollout.turns, firstNewTurn, at);
  endSegmentBefore(rollout, at);
}

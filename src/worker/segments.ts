/**
 * Training segments under `llm.historyMode: split`. A reply whose prompt re-renders the episode's
 * history (ChatResult.historyRewrite) begins a new segment; the agent's turn before it ends the
 * previous one and holds that segment's whole conversation, so it is trained on as the last turn of
 * an episode is.
 *
 * Marked when the split turn is recorded in the rollout, not when its reply arrives: a reply dropped
 * with its step (a multi-agent step one of whose calls failed, a tool round cut short) ends nothing.
 */
import type { RolloutState } from '../domain/rollout.ts';
import { flagTurn } from '../protocol/result-delta.ts';
import { isUnfinished } from './env-step.ts';

/** After `rollout.turns[index]` was recorded: if it is a split, the same agent's turn before it ends a segment. */
export function endSegmentBefore(rollout: RolloutState, index: number): void {
  const turn = rollout.turns[index];
  if (turn.historyRewrite !== 'split') return;
  for (let i = index - 1; i >= 0; i--) {
    const ended = rollout.turns[i];
    if (ended.agentId !== turn.agentId) continue;
    if (ended.trainable) return;
    // A turn of the step in play (a tool-calling reply) is this worker's own and is shared with the
    // step's other holders (its turn list, the unfinished marks): flagged in place. Any other may be
    // one the rollout arrived with, which is never changed in place (protocol/result-delta.ts).
    if (isUnfinished(ended)) ended.trainable = true;
    else flagTurn(rollout, i, { trainable: true });
    return;
  }
}

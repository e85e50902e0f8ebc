/**
 * Training segments of an episode split where the chat template re-renders its history
 * (ChatResult.historyRewrite `split`: `llm.historyMode: split`, or `keep-sampled` where the new
 * messages cannot be cut out of the render). A split turn begins a new segment; the agent's turn
 * before it ends the previous one and holds that segment's whole conversation, so it is trained on as
 * the last turn of an episode is.
 *
 * Marked when the split turn is recorded in the rollout, not when its reply arrives: a reply that is
 * never recorded (its multi-agent step interrupted, its tool round interrupted) ends nothing. One
 * recorded and then dropped with an interrupted step leaves the mark, which the step played again
 * sets again: whether a turn splits depends on the history before it, which the replay keeps.
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

/**
 * How an episode ends other than by its environment: on a reply that did not complete, on a
 * conversation past the server's context, out of steps or prompts, or expired by staleness.
 */
import { isOutageError } from '../llm/errors.ts';
import { NO_EXPIRY } from '../protocol/control-block.ts';
import { flagTurn, type TurnFlags } from '../protocol/result-delta.ts';
import {
  failRollout,
  rolloutMinModelStep,
  Status,
  statusForFinishReason,
  type RolloutState,
  type TurnRecord,
} from '../domain/rollout.ts';

/**
 * Whether what an episode threw interrupts it rather than fails it: cancelled by a pause (an inference
 * call, the wait for an actor, a pending environment call), or a call that met a possible outage. The
 * rollout comes back ABORTED and continues after the resume from its recorded steps.
 */
export function interrupts(err: unknown): boolean {
  const code = (err as { code?: unknown } | null | undefined)?.code;
  return (
    isOutageError(err) ||
    code === 'ERR_LLM_ABORTED' ||
    code === 'ERR_ACTOR_POOL_ABORTED' ||
    code === 'ERR_ENV_CANCELLED'
  );
}

/** Ends `rollout` on a turn that did not complete: ABORTED for `abort`, FAILED naming anything unknown. */
export function endInterrupted(rollout: RolloutState, finishReason: TurnRecord['finishReason']): void {
  const status = statusForFinishReason(finishReason);
  if (status === Status.FAILED)
    failRollout(rollout, `ERR_LLM_FINISH_REASON: unknown finish reason ${JSON.stringify(finishReason)}`, 'inference');
  else {
    rollout.status = status;
    rollout.error = null;
  }
}

/**
 * The conversation outgrew the server's context: the episode ends as truncated with every turn it has
 * (a partial last turn kept as it is), and its last step is trained on, as when a reply hits
 * max_tokens. With no turn yet, the very first prompt does not fit: nothing to train on, a failure.
 */
export function endTruncated(rollout: RolloutState, partial: TurnRecord | null, why: string): void {
  if (partial !== null) partial.finishReason = 'length';
  const last = rollout.turns.at(-1);
  if (last === undefined) {
    failRollout(
      rollout,
      `ERR_CONTEXT_EXCEEDED: the first prompt does not fit the inference server's context (${why})`,
      'environment',
    );
    return;
  }
  flagLastStep(rollout, { terminated: true, truncated: true, trainable: true });
  rollout.terminated = rollout.truncated = true;
  rollout.finishReason = 'length';
  rollout.status = Status.COMPLETED;
}

/**
 * Without trimming only a turn that ended the episode is trained on (it holds the whole
 * conversation). An episode the environment ended with an empty prompt, or that ran out of steps,
 * ended all the same: its last step is trained on, or the rollout would give the trainer nothing.
 */
export function trainOnLastStep(rollout: RolloutState): void {
  const last = rollout.turns.at(-1);
  if (last === undefined || last.trainable) return;
  flagLastStep(rollout, { trainable: true });
}

/** Whether the rollout holds a response token older than `oldestUseful` (NO_EXPIRY: never, without a scan). */
export function hasExpired(rollout: RolloutState, oldestUseful: number): boolean {
  if (oldestUseful === NO_EXPIRY) return false;
  const min = rolloutMinModelStep(rollout);
  return min !== null && min < oldestUseful;
}

/**
 * Sets `flags` on every turn of the rollout's last step. The last step may be one the rollout arrived
 * with (a continuation's first step outgrew the context, or found no prompt): flagged in place, the
 * result would leave those turns out as unchanged and the coordinator would put back its own unflagged
 * copies — an episode ended truncated with no turn trained on — so each is replaced by a copy.
 */
function flagLastStep(rollout: RolloutState, flags: TurnFlags): void {
  const step = rollout.turns.at(-1)?.step;
  for (let i = rollout.turns.length - 1; i >= 0 && rollout.turns[i].step === step; i--) flagTurn(rollout, i, flags);
}

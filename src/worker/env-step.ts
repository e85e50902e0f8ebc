/**
 * The environment's steps as a rollout records them: its turns grouped by step (several per step for
 * a multi-agent environment, or for a single agent that called tools), the action a step sends, and
 * what the step's outcome writes on its turns.
 */
import type { StepResult } from '../env/types.ts';
import type { RolloutState, TurnRecord } from '../domain/rollout.ts';

/**
 * Turns recorded in this worker whose step the environment has not finished: held from the moment a
 * step's replies are recorded (before its tool calls and its `step`) until its outcome is applied.
 * Invariant: a turn a rollout brought into this dispatch is never in it — every step it holds was
 * finished, bar a partial last reply (finish reason `abort`), which its continuation replays as such.
 * So after an infrastructure failure the turns in it are exactly the step to play again
 * (continuation.ts, `resumeAfterInfra`). Weak: a rollout that ends otherwise leaves nothing behind.
 */
const unfinished = new WeakSet<TurnRecord>();

/** A reply of a step is recorded; the environment has yet to step on it. */
export function markUnfinished(turn: TurnRecord): void {
  unfinished.add(turn);
}

/** Whether `turn`'s step was recorded in this worker and not finished by the environment. */
export function isUnfinished(turn: TurnRecord): boolean {
  return unfinished.has(turn);
}

/** Turns grouped by step (several per step in a multi-agent episode), in order. */
export function stepsOf(turns: readonly TurnRecord[]): TurnRecord[][] {
  const steps: TurnRecord[][] = [];
  for (const turn of turns) {
    const last = steps.at(-1);
    if (last !== undefined && last[0].step === turn.step) last.push(turn);
    else steps.push([turn]);
  }
  return steps;
}

/** The turns the environment stepped on: a single agent's last (those before it called tools), or every agent's. */
export function steppedTurns(turns: TurnRecord[]): TurnRecord[] {
  return turns[0]?.agentId === null ? turns.slice(-1) : turns;
}

/** What `step` is given for a step: a single agent's last reply, or each agent's by its id. */
export function actionOf(turns: readonly TurnRecord[]): string | Record<string, string> {
  if (turns[0]?.agentId === null) return turns[turns.length - 1].response;
  return Object.fromEntries(turns.map((t) => [t.agentId ?? '', t.response]));
}

/** A multi-agent environment may give one reward for all, or one per agent id (missing = 0). */
export function rewardFor(reward: StepResult['reward'], agentId: string | null): number {
  if (typeof reward === 'number') return reward;
  return agentId === null ? Object.values(reward).reduce((a, b) => a + b, 0) : (reward[agentId] ?? 0);
}

/**
 * The environment stepped on one step's `turns`: each turn records whether the episode ended, the
 * ones it stepped on also the reward and the step's time, and the rollout adds the rewards up.
 */
export function applyOutcome(
  rollout: RolloutState,
  turns: TurnRecord[],
  outcome: StepResult,
  step: { ms: number; messageCut: number },
): void {
  const stepped = steppedTurns(turns);
  for (const turn of turns) {
    unfinished.delete(turn);
    turn.terminated = outcome.terminated;
    turn.truncated = outcome.truncated;
    // With trimming every turn is a self-contained sample; without it only the last turn holds the
    // whole conversation, so only that one is trained on (reference Interactor semantics). A step's
    // tool-calling turns go with its final one.
    // A turn that ends a segment (a split after it: infer) stays trainable.
    turn.trainable = turn.trainable || step.messageCut > 0 || outcome.terminated || outcome.truncated;
    if (!stepped.includes(turn)) continue; // a tool-calling turn: the reward is the step's, on its final turn
    const reward = rewardFor(outcome.reward, turn.agentId);
    turn.reward = reward;
    turn.timings.envMs += step.ms;
    // += : a continued turn already carries its partial's time (mergeContinuation)
    turn.timings.totalMs += step.ms;
    rollout.reward += reward;
    if (turn.agentId !== null) {
      rollout.agentRewards ??= {};
      rollout.agentRewards[turn.agentId] = (rollout.agentRewards[turn.agentId] ?? 0) + reward;
    }
  }
}

/** The step of the rollout's last turn; 0 before its first. */
export function lastStep(rollout: RolloutState): number {
  return rollout.turns.at(-1)?.step ?? 0;
}

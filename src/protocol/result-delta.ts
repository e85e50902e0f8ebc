/**
 * A group's result carries only the turns the worker added.
 *
 * A group dispatched again (interrupted by a weight update, partial rollouts on) takes its earlier
 * turns to the worker, which replays them into a fresh environment and continues. Sending them back
 * unchanged would move every retried group's whole history through msgpack twice per pause — the
 * main thread still holds the group as it sent it. So the worker leaves out each rollout's leading
 * turns that are still the very objects it received (`keptTurns`), and the pool puts them back.
 *
 * Invariant (worker side): a received turn that stays in the rollout is never mutated. The agent
 * loop only appends new turn objects, pops a partial last turn (its continuation is a new object),
 * drops turns (a reset, a replay mismatch, a multi-agent step played again, the step a failure or a
 * pause cut short), or replaces a turn it flags with a copy (`flagTurn`: an ending,
 * worker/episode-end.ts; a split's segment end, worker/segments.ts) — all of which end the shared
 * prefix.
 */
import { ProtocolError } from '../errors.ts';
import type { RolloutGroup, RolloutState, TurnRecord } from '../domain/rollout.ts';

/** The flags set on a turn after it was recorded: by an ending, or by a split that ends a segment. */
export type TurnFlags = Partial<Pick<TurnRecord, 'terminated' | 'truncated' | 'trainable'>>;

/**
 * Worker side: sets `flags` on `rollout.turns[index]` as the invariant above allows, by putting a
 * flagged copy in its place, so that a turn the rollout arrived with travels back with its flags
 * instead of being left out as unchanged. The old object is flagged too, for whoever still holds it
 * (a step's `onTurn`).
 */
export function flagTurn(rollout: RolloutState, index: number, flags: TurnFlags): void {
  Object.assign(rollout.turns[index], flags);
  rollout.turns[index] = { ...rollout.turns[index] };
}

/** Worker side, before running: the turn objects each rollout arrived with. */
export function receivedTurns(group: RolloutGroup): TurnRecord[][] {
  return group.rollouts.map((r) => r.turns.slice());
}

/** Worker side, after running: drop each rollout's unchanged leading turns (in place); returns their counts. */
export function omitKeptTurns(group: RolloutGroup, received: TurnRecord[][]): number[] {
  return group.rollouts.map((rollout, i) => {
    const before = received[i] ?? [];
    let kept = 0;
    while (kept < before.length && kept < rollout.turns.length && rollout.turns[kept] === before[kept]) kept++;
    if (kept > 0) rollout.turns = rollout.turns.slice(kept);
    return kept;
  });
}

/** Coordinator side: put the kept turns back in front, from the group as it was sent (in place). */
export function restoreKeptTurns(result: RolloutGroup, sent: RolloutGroup, keptTurns: unknown): RolloutGroup {
  if (
    !Array.isArray(keptTurns) ||
    keptTurns.length !== result.rollouts.length ||
    result.rollouts.length !== sent.rollouts.length
  ) {
    throw new ProtocolError(
      `group-result.keptTurns must list one count per rollout (${sent.rollouts.length}), got ${JSON.stringify(keptTurns)?.slice(0, 80)}`,
    );
  }
  result.rollouts.forEach((rollout, i) => {
    const from = sent.rollouts[i];
    const kept = keptTurns[i] as unknown;
    if (rollout.id !== from.id)
      throw new ProtocolError(`group-result rollout ${i} is ${rollout.id}, the group sent ${from.id}`);
    if (!Number.isInteger(kept) || (kept as number) < 0 || (kept as number) > from.turns.length) {
      throw new ProtocolError(
        `group-result.keptTurns[${i}] must be an integer from 0 to ${from.turns.length} (the turns sent), got ${String(kept)}`,
      );
    }
    if ((kept as number) > 0) rollout.turns = from.turns.slice(0, kept as number).concat(rollout.turns);
  });
  return result;
}

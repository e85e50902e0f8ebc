/**
 * Running one group in a worker and answering its result. Invariant: `settleGroup` never rejects,
 * and answers only once every episode of the group has ended.
 *
 * That holds by construction, not by each caller's care: every step that can throw — making each
 * rollout's sample its own, noting the turns it arrived with, the task's set-up, each episode, the
 * worker's bookkeeping, the result's delta — runs inside a guard here, and whatever throws ends as
 * FAILED rollouts carrying the reason and a failure kind (domain/failure.ts). So one bad environment
 * cannot take the other groups sharing this worker down with it, and the coordinator always gets its
 * group back, accounted for. (What it trusts: a decoded group's `rollouts` is an array of rollout
 * objects, as protocol/codec.ts decodes every group message.)
 */
import { describeError } from '../errors.ts';
import { failureKindOf, type FailureKind } from '../domain/failure.ts';
import {
  failRollout,
  groupStatus,
  Status,
  type RolloutGroup,
  type RolloutState,
  type TurnRecord,
} from '../domain/rollout.ts';
import { PROTOCOL_VERSION, type GroupResultMessage, type RunGroupMessage } from '../protocol/messages.ts';
import { omitKeptTurns, receivedTurns } from '../protocol/result-delta.ts';

/** What running a group asks of its worker (made once per worker, not per group); any of it may throw. */
export interface GroupRun {
  /** Stamped on every rollout failed here (RolloutState.workerId). */
  workerId: number;
  /** The group is taken on, before anything of it runs: the worker's in-flight counts. */
  begin?(message: RunGroupMessage): void;
  /**
   * Plays every rollout of the group to a final status, each episode through `settleEpisode`. Throws
   * when the group cannot be played at all (an unknown task, a module that does not load): its
   * rollouts then fail with that reason, as the environment's.
   */
  play(message: RunGroupMessage): Promise<void>;
  /**
   * Every rollout is in its final status, before the result is made: the worker's counts. Called only
   * when `begin` returned.
   */
  end?(group: RolloutGroup): void;
  /** Something failed the group, or the bookkeeping around it, with `reason`: for the logs. */
  report?(group: RolloutGroup, reason: string): void;
}

/**
 * Runs `message`'s group with `run` and answers its result; never rejects (the module comment).
 * A group whose play threw is FAILED with `group.error` the reason; its rollouts kept COMPLETED from
 * an earlier run stay as they are.
 */
export async function settleGroup(message: RunGroupMessage, run: GroupRun): Promise<GroupResultMessage> {
  const { group } = message;
  let received: TurnRecord[][] = [];
  let begun = false;
  try {
    run.begin?.(message);
    begun = true;
    ownSamples(group);
    received = receivedTurns(group);
    await run.play(message);
    group.status = groupStatus(group.rollouts);
  } catch (err) {
    const reason = describeError(err);
    report(run, group, reason);
    // The task's own modules (an import, a factory): the environment's, not the machine's.
    failGroup(group, { reason, kind: 'environment', all: false }, run.workerId);
  }
  try {
    if (begun) run.end?.(group); // what begin counted, end takes back: not one without the other
  } catch (err) {
    report(run, group, `counting the group's end failed: ${describeError(err)}`);
  }
  return answer(group, received, run);
}

/**
 * Runs one episode of a group so that it cannot reject: a throw (a callback of the worker's, a bug)
 * fails that rollout with the reason and its kind instead, so the group still waits for its other
 * episodes — `Promise.all` over episodes that may reject would answer while siblings still play.
 */
export function settleEpisode(rollout: RolloutState, workerId: number, episode: () => Promise<void>): Promise<void> {
  let running: Promise<void>;
  try {
    running = episode();
  } catch (err) {
    running = Promise.reject(err);
  }
  return running.then(undefined, (err: unknown) => {
    failRollout(rollout, `the episode threw: ${describeError(err)}`, failureKindOf(err));
    rollout.workerId = workerId;
  });
}

/**
 * The wire keeps shared references (protocol/codec.ts), so a group's rollouts arrive sharing one
 * `sample`. Episodes hand parts of it to user code (an environment's reset params, a black-box
 * agent's prompt), which may change what it is given: each rollout gets its own.
 */
function ownSamples(group: RolloutGroup): void {
  for (const rollout of group.rollouts)
    if (rollout.sample === group.sample) rollout.sample = structuredClone(group.sample);
}

/** How a group fails: `all` fails its COMPLETED rollouts too, which are otherwise kept. */
interface GroupFailure {
  reason: string;
  kind: FailureKind;
  all: boolean;
}

/** The group FAILED with `failure.reason`, and each of its rollouts but those kept. */
function failGroup(group: RolloutGroup, failure: GroupFailure, workerId: number): void {
  const { reason, kind, all } = failure;
  for (const rollout of group.rollouts) {
    if (!all && rollout.status === Status.COMPLETED) continue;
    failRollout(rollout, reason, kind);
    rollout.workerId = workerId;
  }
  group.status = Status.FAILED;
  group.error = reason;
}

/** The answer to a run-group message: `received` is what the group held on arrival (receivedTurns). */
function answer(group: RolloutGroup, received: TurnRecord[][], run: GroupRun): GroupResultMessage {
  let keptTurns: number[];
  try {
    keptTurns = omitKeptTurns(group, received);
  } catch (err) {
    // It may have cut some rollouts' leading turns before it threw: none of them can be trusted, a
    // COMPLETED one included, and every turn they still hold is sent.
    const reason = `the group's result could not be made: ${describeError(err)}`;
    report(run, group, reason);
    failGroup(group, { reason, kind: failureKindOf(err), all: true }, run.workerId);
    keptTurns = group.rollouts.map(() => 0);
  }
  return { v: PROTOCOL_VERSION, type: 'group-result', keptTurns, group, workerId: run.workerId };
}

/** A logger that throws has nothing left to tell: the group's answer matters more. */
function report(run: GroupRun, group: RolloutGroup, reason: string): void {
  try {
    run.report?.(group, reason);
  } catch {}
}

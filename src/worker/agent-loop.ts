/**
 * The agent loop: one episode of one rollout, from an environment actor acquired to its release.
 * Runs inside worker threads (worker-runtime.ts runs a group's episodes side by side).
 *
 *   acquire actor → reset and replay the recorded steps (continuation.ts) → play the steps
 *   (episode-steps.ts) → done(actor)
 *
 * Every outcome is a status on the rollout — runEpisode never throws for an episode's failure: what a
 * step throws ends the rollout ABORTED when a pause (or a possible outage) cut it short, FAILED with
 * its kind (domain/failure.ts) otherwise. With partial rollouts off, or where a fresh MCP session
 * could not be brought to where it stopped (continuation.ts `canContinue`), an ABORTED rollout
 * restarts from its prompt.
 */
import { isOutageError, OUTAGE_CODE } from '../llm/errors.ts';
import { describeError } from '../errors.ts';
import { restartFromPrompt, Status, type RolloutState, type TurnRecord } from '../domain/rollout.ts';
import { failureKindOf } from '../domain/failure.ts';
import type { Episode, EpisodeContext } from './episode-context.ts';
import { acquireActor, callHook } from './env-calls.ts';
import { pace } from './inference-call.ts';
import { countToolCalls } from './tool-rounds.ts';
import { canContinue, dropUnfinishedStep, replaySteps, ReplayMismatch } from './continuation.ts';
import { playSteps } from './episode-steps.ts';
import { lastStep } from './env-step.ts';
import { hasExpired, interrupts } from './episode-end.ts';

/** Mutates `rollout` into a final status (COMPLETED, ABORTED or FAILED). COMPLETED ones are left as they are. */
export async function runEpisode(rollout: RolloutState, ctx: EpisodeContext, queueMs = 0): Promise<void> {
  if (rollout.status === Status.COMPLETED) return; // a sibling kept from an earlier run of its group
  if (ctx.gate.paused) {
    // Started (or given an episode slot) during a pause: nothing to do until the resume, not even a reset.
    handBack(rollout, ctx.workerId);
    return;
  }
  const { settings } = ctx;
  if (
    rollout.status === Status.ABORTED &&
    (!settings.partialRollout || !canContinue(rollout, settings.tools?.mcpSessions))
  )
    restartFromPrompt(rollout);
  if (hasExpired(rollout, ctx.gate.oldestUsefulStep)) {
    // Expired while it waited to continue: not worth an actor and the replay of its steps.
    handBack(rollout, ctx.workerId);
    return;
  }
  rollout.error = null;
  const timings = rollout.timings;
  timings.queueMs += queueMs;
  if (timings.startedAt === 0) timings.startedAt = Date.now();
  const start = performance.now();
  rollout.workerId = ctx.workerId;
  let episode: Episode | null = null;
  let actorFailed = false;
  try {
    episode = await acquire(rollout, ctx);
    let partial: TurnRecord | null;
    try {
      partial = await replaySteps(episode);
    } catch (err) {
      if (!(err instanceof ReplayMismatch)) throw err;
      ctx.onProblem?.(rollout, `${err.message}; restarting the rollout from its prompt`);
      restartFromPrompt(rollout);
      await ctx.actors.done(episode.env, false);
      episode = await acquire(rollout, ctx);
      partial = await replaySteps(episode);
    }
    await playSteps(episode, partial);
  } catch (err) {
    const code = (err as { code?: unknown } | null | undefined)?.code;
    // Cancelled by a pause (an inference call, the wait for an actor, a pending environment call): it
    // continues after the resume. A call that met a possible outage comes back the same way, its tokens
    // kept, marked so that the producer asks the servers whether they are down (coordinator/outage.ts)
    // before retrying it.
    const outage = isOutageError(err);
    rollout.status = interrupts(err) ? Status.ABORTED : Status.FAILED;
    // Interrupted in the middle of a step (a pause cancelled its environment call, a tool call, or
    // the wait for a prompt): the step goes, its replies counted thrown away, and is played again
    // whole after the resume. Left in, the replay would take it for a finished step.
    if (rollout.status === Status.ABORTED) dropUnfinishedStep(rollout);
    rollout.error = outage ? `${OUTAGE_CODE}: ${describeError(err)}` : describeError(err);
    if (rollout.status === Status.FAILED) rollout.failureKind = failureKindOf(err);
    // An environment error (not an inference one) means the actor is not to be trusted again.
    actorFailed = typeof code !== 'string' || !(code.startsWith('ERR_LLM_') || code.startsWith('ERR_ACTOR_POOL_'));
    if (rollout.status === Status.FAILED) ctx.onProblem?.(rollout, rollout.error); // an interruption is not a problem
  } finally {
    if (episode) {
      try {
        await ctx.actors.done(episode.env, actorFailed);
      } catch (err) {
        ctx.onProblem?.(rollout, `releasing the environment actor failed: ${describeError(err)}`);
      }
    }
    ctx.llm.endSession?.(rollout.id);
    countToolCalls(rollout);
    if (episode?.mcp)
      await ctx.mcp
        ?.release(episode.mcp)
        .catch((err: unknown) =>
          ctx.onProblem?.(rollout, `closing the episode's MCP sessions failed: ${describeError(err)}`),
        );
    timings.totalMs += performance.now() - start;
    timings.finishedAt = Date.now();
    if ((rollout.status as Status) === Status.COMPLETED && settings.priority === 'trajectory')
      pace.episodeEnded(rollout.taskName, lastStep(rollout), timings.finishedAt - timings.startedAt);
    if (rollout.status !== Status.ABORTED && ctx.hooks?.onEpisodeEnd !== undefined)
      await callHook(ctx, rollout, 'onEpisodeEnd', () =>
        ctx.hooks?.onEpisodeEnd?.({
          rolloutId: rollout.id,
          taskName: rollout.taskName,
          status: rollout.status,
          totalReward: rollout.reward,
          lastInfo: episode?.lastInfo ?? null,
          steps: lastStep(rollout),
        }),
      );
    ctx.onEpisodeEnd?.(rollout);
  }
}

async function acquire(rollout: RolloutState, ctx: EpisodeContext): Promise<Episode> {
  const env = await acquireActor(ctx.actors, ctx.gate.signal);
  return { rollout, ctx, env, lastInfo: null, firstCall: true, mcp: null };
}

/**
 * Hands a rollout back ABORTED without running it. Its `finishedAt` moves to now: the producer counts
 * the time from there to its next dispatch as paused (producer.ts `spawn`), and the wait before this
 * dispatch was counted already.
 */
export function handBack(rollout: RolloutState, workerId: number): void {
  rollout.status = Status.ABORTED;
  rollout.workerId = workerId;
  rollout.timings.finishedAt = Date.now();
}

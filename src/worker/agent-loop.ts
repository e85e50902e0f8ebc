/**
 * The agent loop: drives one episode of one rollout against an environment actor, and a group as its
 * k episodes side by side. Runs inside worker threads.
 *
 *   acquire actor → reset(seed, params) → [ getTaskPrompt → hook → trim → inference → step → record ]
 *   × ≤ maxSteps → done(actor)
 *
 * The episode ends on terminated / truncated, an empty prompt, or maxSteps. A `length` finish reason
 * ends it as truncated (as in the reference Interactor). Every outcome is a status on the rollout —
 * this module never throws for an episode's failure.
 *
 * Multi-agent environments prompt each agent id separately; every agent's reply is generated with its
 * own policy (llm/router.ts), the environment steps with one action per agent, and each agent's turn
 * is recorded with its reward.
 *
 * Pauses: before each inference call the episode checks the shared pause flag; when set, it stops
 * there and comes back ABORTED with its turns so far. A call the server aborts comes back with the
 * tokens it had, kept as a partial last turn (finish reason `abort`).
 *
 * Continuing an ABORTED rollout (partial rollouts on): a fresh actor is reset with the same seed and
 * the recorded actions are stepped again (environments are deterministic under seed and actions; a
 * replay that disagrees with the record restarts the rollout from its prompt instead). A partial last
 * turn is then continued with `continue_final_message`, `max_tokens` reduced by what it already has,
 * the same sampling seed, and the new tokens tagged with the current model step (a multi-agent step
 * that was interrupted is played again whole). With partial rollouts off, an ABORTED rollout restarts
 * from its prompt.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { isOutageError, OUTAGE_CODE } from '../llm/errors.ts';
import { checkAgentPrompts, checkStepResult, checkTaskPrompt } from '../env/replies.ts';
import { describeError } from '../errors.ts';
import {
  resetToPrompt,
  statusForFinishReason,
  Status,
  type ChatMessage,
  type RolloutState,
  type TurnRecord,
} from '../domain/rollout.ts';
import { failureKindOf } from '../domain/failure.ts';
import { sharePromptPrefix } from './prompt-prefix.ts';
import { trimMessages } from './trim.ts';
import { NO_TOOLS } from './tools.ts';
import type { Episode, EpisodeContext } from './episode-context.ts';
import { acquireActor, callHook, envCall } from './env-calls.ts';
import { ContextExceeded, infer, pace, pendingCalls } from './inference-call.ts';
import { countToolCalls, stepTools, toolRounds } from './tool-rounds.ts';
import { replaySteps, ReplayMismatch } from './continuation.ts';
import { actionOf, applyOutcome, lastStep } from './env-step.ts';
import { endInterrupted, endTruncated, hasExpired, trainOnLastStep } from './episode-end.ts';

/** Mutates `rollout` into a final status (COMPLETED, ABORTED or FAILED). COMPLETED ones are left as they are. */
export async function runEpisode(rollout: RolloutState, ctx: EpisodeContext, queueMs = 0): Promise<void> {
  if (rollout.status === Status.COMPLETED) return; // a sibling kept from an earlier run of its group
  if (ctx.gate.paused) {
    // Started (or given an episode slot) during a pause: nothing to do until the resume, not even a reset.
    rollout.status = Status.ABORTED;
    rollout.workerId = ctx.workerId;
    return;
  }
  const { settings } = ctx;
  if (rollout.status === Status.ABORTED && !settings.partialRollout) resetToPrompt(rollout, Status.INIT);
  if (hasExpired(rollout, ctx.gate.oldestUsefulStep)) {
    // Expired while it waited to continue: not worth an actor and the replay of its steps.
    rollout.status = Status.ABORTED;
    rollout.workerId = ctx.workerId;
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
      resetToPrompt(rollout, Status.INIT);
      await ctx.actors.done(episode.env, false);
      episode = await acquire(rollout, ctx);
      partial = await replaySteps(episode);
    }
    await play(episode, partial);
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    // Cancelled by a pause (an inference call, the wait for an actor, a pending environment call): it
    // continues after the resume. A call that met a possible outage comes back the same way, its tokens
    // kept, marked so that the producer asks the servers whether they are down (coordinator/outage.ts)
    // before retrying it.
    const outage = isOutageError(err);
    rollout.status =
      outage || code === 'ERR_LLM_ABORTED' || code === 'ERR_ACTOR_POOL_ABORTED' || code === 'ERR_ENV_CANCELLED'
        ? Status.ABORTED
        : Status.FAILED;
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

/** One agent's prompt for a step. */
interface AgentPrompt {
  agentId: string | null;
  /** As the environment gave it, or as the beforeInference hook rewrote it: what the rollout's conversation records. */
  messages: ChatMessage[];
  /** `messages` trimmed to `messageCut`: what the inference call is sent. */
  prompt: ChatMessage[];
}

async function play(episode: Episode, partial: TurnRecord | null): Promise<void> {
  const { rollout, ctx, env } = episode;
  const { settings, gate } = ctx;
  const timings = rollout.timings;
  const firstNewTurn = rollout.turns.length - (partial ? 1 : 0); // the partial turn is replaced, not kept
  for (let step = lastStep(rollout) + (partial ? 0 : 1); step <= settings.maxSteps; step++) {
    if (gate.paused) {
      rollout.status = Status.ABORTED; // stopped at a step boundary: continues from here after the resume
      return;
    }
    if (hasExpired(rollout, gate.oldestUsefulStep)) {
      // Its oldest token can no longer be taken: it is reset on landing whatever it generates next, so
      // its episode slot and the servers' time go to rollouts that can still be used.
      rollout.status = Status.ABORTED;
      return;
    }
    const turnStart = performance.now();
    const raw = checkAgentPrompts(await envCall(ctx, rollout, 'getTaskPrompt', () => env.getTaskPrompt()));
    const promptMs = performance.now() - turnStart;
    const agents: { agentId: string | null; messages: ChatMessage[] }[] = Array.isArray(raw)
      ? [{ agentId: null, messages: raw }]
      : Object.entries(raw).map(([agentId, messages]) => ({ agentId, messages }));
    const prompts: AgentPrompt[] = [];
    for (const { agentId, messages } of agents) {
      // Without the hook no closure or await per agent per step.
      const rewritten =
        ctx.hooks?.beforeInference === undefined
          ? undefined
          : await callHook(ctx, rollout, 'beforeInference', async () => {
              const out = await ctx.hooks?.beforeInference?.({
                rolloutId: rollout.id,
                taskName: rollout.taskName,
                step,
                agentId,
                messages,
              });
              return out === undefined ? undefined : checkTaskPrompt(out); // a malformed rewrite is reported and ignored
            });
      const hooked = rewritten ?? messages;
      const prompt = trimMessages(hooked, settings.messageCut);
      if (prompt.length > 0) prompts.push({ agentId, messages: hooked, prompt });
    }
    if (prompts.length === 0) {
      timings.envMs += promptMs;
      break;
    }
    const tools =
      prompts.length === 1 &&
      prompts[0].agentId === null &&
      (env.tools !== undefined || (ctx.settings.tools?.mcp.length ?? 0) > 0)
        ? await stepTools(episode)
        : NO_TOOLS;
    if (episode.firstCall) {
      episode.firstCall = false;
      const delay = ctx.startDelayMs?.() ?? 0;
      if (delay > 0) await sleep(delay);
    }
    const t = performance.now();
    // One agent (the usual case) awaits its call directly: a Promise.all, or a closure held across the
    // await, is one more thing per episode in flight.
    let turns: TurnRecord[];
    try {
      if (prompts.length === 1) {
        const { agentId, prompt } = prompts[0];
        const partialOf = agentId === null ? partial : null;
        turns = [await infer({ rollout, step, agentId, prompt, partial: partialOf, promptMs, turnStart, tools }, ctx)];
      } else {
        turns = await allOrFirstError(
          prompts.map(({ agentId, prompt }) =>
            infer(
              {
                rollout,
                step,
                agentId,
                prompt,
                partial: agentId === null ? partial : null,
                promptMs,
                turnStart,
                tools,
              },
              ctx,
            ),
          ),
        );
      }
    } catch (err) {
      if (!(err instanceof ContextExceeded)) throw err;
      timings.inferenceMs += performance.now() - t;
      endTruncated(rollout, partial, err.message);
      return;
    }
    timings.inferenceMs += performance.now() - t;
    if (partial) {
      rollout.turns.pop(); // the partial turn is folded into its continuation
      partial = null;
    }
    rollout.turns.push(...turns);
    for (let i = rollout.turns.length - turns.length; i < rollout.turns.length; i++)
      sharePromptPrefix(rollout.turns, firstNewTurn, i);
    const lastTurn = turns[turns.length - 1];
    rollout.finishReason = lastTurn.finishReason;
    if (turns.length === 1)
      rollout.messages = [...prompts[0].messages, { role: 'assistant', content: lastTurn.response }];

    const interrupted = turns.find((turn) => statusForFinishReason(turn.finishReason) !== Status.COMPLETED);
    if (interrupted) {
      // abort: the turn keeps its tokens and is continued after the resume; anything unknown: fail with it.
      endInterrupted(rollout, interrupted.finishReason);
      return;
    }
    let toolMessages: ChatMessage[] = [];
    if (pendingCalls.has(lastTurn) && lastTurn.finishReason !== 'length') {
      const rounds = await toolRounds(episode, { step, prompt: prompts[0].prompt, turns, tools, firstNewTurn });
      if (rounds === null) return; // the rollout's status is set
      toolMessages = rounds;
      const final = turns[turns.length - 1];
      rollout.messages = [...prompts[0].messages, ...toolMessages, { role: 'assistant', content: final.response }];
    }
    if (turns.some((turn) => turn.finishReason === 'length')) {
      for (const turn of turns) turn.terminated = turn.truncated = turn.trainable = true;
      rollout.terminated = rollout.truncated = true;
      ctx.onTurn?.(rollout, turns, null);
      break;
    }
    const stepStart = performance.now();
    const outcome = checkStepResult(
      await envCall(ctx, rollout, 'step', () => env.step(actionOf(turns), { toolMessages })),
    );
    const stepMs = performance.now() - stepStart;
    timings.envMs += promptMs + stepMs;
    episode.lastInfo = outcome.info ?? null;
    ctx.onStep?.();
    applyOutcome(rollout, turns, outcome, { ms: stepMs, messageCut: settings.messageCut });
    ctx.onTurn?.(rollout, turns, episode.lastInfo);
    if (outcome.terminated || outcome.truncated) {
      rollout.terminated = outcome.terminated;
      rollout.truncated = outcome.truncated;
      break;
    }
    if (step === settings.maxSteps) {
      // Out of steps: it did not finish on its own, but its last step holds the whole conversation.
      rollout.truncated = true;
      for (const turn of turns) turn.truncated = turn.trainable = true;
    }
  }
  trainOnLastStep(rollout);
  rollout.status = Status.COMPLETED;
}

/**
 * Every agent's call of a step, or the first failure once all of them have settled: a rollout is not
 * returned (ABORTED by a pause, say) while one of its calls is still generating on a server.
 */
async function allOrFirstError<T>(calls: Promise<T>[]): Promise<T[]> {
  const settled = await Promise.allSettled(calls);
  const failed = settled.find((s) => s.status === 'rejected');
  if (failed !== undefined) throw failed.reason;
  return settled.map((s) => (s as PromiseFulfilledResult<T>).value);
}

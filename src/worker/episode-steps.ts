/**
 * An episode's steps, played on an actor already at the rollout's last step (continuation.ts):
 *
 *   [ getTaskPrompt → beforeInference hook → trim → inference → (tool rounds) → step → record ]
 *   × ≤ maxSteps
 *
 * The episode ends on terminated / truncated, an empty prompt, or maxSteps. A `length` finish reason
 * ends it as truncated (as in the reference Interactor).
 *
 * Multi-agent environments prompt each agent id separately; every agent's reply is generated with its
 * own policy (llm/router.ts), the environment steps with one action per agent, and each agent's turn
 * is recorded with its reward.
 *
 * Pauses: before each step the episode checks the shared pause flag; when set, it stops there and
 * comes back ABORTED with its turns so far. A call the server aborts comes back with the tokens it
 * had, kept as a partial last turn (finish reason `abort`), continued after the resume.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { checkAgentPrompts, checkStepResult, checkTaskPrompt } from '../env/replies.ts';
import {
  dropTurnsFrom,
  Status,
  statusForFinishReason,
  type ChatMessage,
  type RolloutState,
  type TurnRecord,
} from '../domain/rollout.ts';
import type { Episode } from './episode-context.ts';
import { callHook, envCall } from './env-calls.ts';
import { actionOf, applyOutcome, lastStep, markUnfinished } from './env-step.ts';
import { endInterrupted, endTruncated, hasExpired, interrupts, trainOnLastStep } from './episode-end.ts';
import { ContextExceeded, infer, pendingCalls } from './inference-call.ts';
import { recordTurn } from './record-turn.ts';
import { stepTools, toolRounds } from './tool-rounds.ts';
import { NO_TOOLS } from './tools.ts';
import { trimMessages } from './trim.ts';

/** One agent's prompt for a step. */
interface AgentPrompt {
  agentId: string | null;
  /** As the environment gave it, or as the beforeInference hook rewrote it: what the rollout's conversation records. */
  messages: ChatMessage[];
  /** `messages` trimmed to `messageCut`: what the inference call is sent. */
  prompt: ChatMessage[];
}

/**
 * Plays `episode`'s steps from where its rollout stands (after `partial`, the turn to continue, when
 * there is one) until the episode ends, and sets the rollout's status: COMPLETED, or ABORTED / FAILED
 * when it stopped short. What its environment or an inference call throws is passed on: runEpisode
 * (agent-loop.ts) makes it the rollout's status.
 */
export async function playSteps(episode: Episode, partial: TurnRecord | null): Promise<void> {
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
          rollout,
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
    for (const turn of turns) recordTurn(rollout, turn, firstNewTurn);
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
 * returned (ABORTED by a pause, say) while one of its calls is still generating on a server. On a
 * failure the replies the other agents got, generated all the same, are recorded as a failed step's
 * are: kept with a rollout that fails (dropped with its group); where the rollout is interrupted, or
 * ends at the step before (the context is full), the step goes and they are counted thrown away.
 */
async function allOrFirstError(rollout: RolloutState, calls: Promise<TurnRecord>[]): Promise<TurnRecord[]> {
  const settled = await Promise.allSettled(calls);
  const failed = settled.find((s) => s.status === 'rejected');
  if (failed === undefined) return settled.map((s) => (s as PromiseFulfilledResult<TurnRecord>).value);
  const from = rollout.turns.length;
  for (const s of settled) {
    if (s.status !== 'fulfilled') continue;
    rollout.turns.push(s.value);
    markUnfinished(s.value);
  }
  if (interrupts(failed.reason) || failed.reason instanceof ContextExceeded) dropTurnsFrom(rollout, from);
  throw failed.reason;
}

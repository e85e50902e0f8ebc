/**
 * The black-box agent loop: the episode is driven by a user module that speaks only the OpenAI API
 * (any client, any agent framework). It runs inside a worker like any other agent loop; its inference
 * goes through the token-trace gateway, which records the exact tokens and logprobs of every call of
 * the session. Afterwards the session's main calls become the rollout's turns and the session is
 * stitched into one training sample (`rollout.stitched`).
 *
 * Side calls (calls that did not extend the session's conversation: a summariser, a judge, a retry
 * with an edited history; gateway/prompt.ts) are not turns: `turns[i]` stays the i-th main call and
 * `stitched.actionRanges[i]` its completion, the last turn carries the reward and the end of the
 * episode, as for every other agent loop. They come out in `stitched.sideCalls`, each with its own
 * prompt ids, completion ids, logprobs, finish reason and model step: samples a trainer may use or
 * not, with the reward it chooses (the rollout's is the natural one). An aborted side call interrupts
 * the episode like a main one.
 *
 *   user module({ baseURL: <gateway>/v1/sessions/<id>, sessionId, prompt, label, signal })
 *     → { reward?, info? } | number | void
 *
 * The prompt and label come from the task's environment (reset → getTaskPrompt; the reward, when the
 * module gives none, from stepping the environment with the agent's last reply) or, without an
 * environment, from the dataset line (`messages`, `label`). A black-box episode cannot be continued
 * mid-way after a weight update: an interrupted one comes back ABORTED and is played again whole.
 */
import { checkStepResult, checkTaskPrompt } from '../env/replies.ts';
import type { Environment } from '../env/types.ts';
import { fetchTraces, releaseSession, sessionBaseUrl, stitchSession } from '../llm/gateway-client.ts';
import { describeError, preview, RolloutEngineError } from '../errors.ts';
import { restartFromPrompt, Status, type ChatMessage, type RolloutState, type TurnRecord } from '../domain/rollout.ts';
import { failureKindOf } from '../domain/failure.ts';
import { rewardFor } from './env-step.ts';
import { acquireActor } from './env-calls.ts';
import type { ActorSource, EnvCallGuard, PauseView } from './episode-context.ts';
import { sessionIdOf } from '../records/step-records.ts';

export interface BlackBoxInput {
  /** OpenAI-compatible base URL for this session (give it to any OpenAI client as `baseURL`). */
  baseURL: string;
  sessionId: string;
  prompt: ChatMessage[];
  label: unknown;
  /** The drawn prompt's parameters (the dataset line, `{}` without a dataset) and the group's seed. */
  params: Record<string, unknown>;
  seed: number;
  /** Aborts when the engine cancels in-flight work for a weight update. */
  signal: AbortSignal;
}

export type BlackBoxResult =
  | { reward?: number | null; info?: Record<string, unknown>; truncated?: boolean }
  | number
  | null
  | undefined
  | undefined;
export type BlackBoxAgent = (input: BlackBoxInput) => Promise<BlackBoxResult> | BlackBoxResult;

export interface BlackBoxContext {
  agent: BlackBoxAgent;
  gatewayUrl: string;
  /** The task's environment, or null when prompts come from the dataset. */
  actors: ActorSource | null;
  /** Bounds and watches the environment's calls (worker/env-guard.ts); absent = unguarded. */
  guard?: EnvCallGuard;
  gate: PauseView;
  workerId: number;
  onProblem?: (rollout: RolloutState, reason: string) => void;
}

export async function runBlackBoxEpisode(rollout: RolloutState, ctx: BlackBoxContext, queueMs = 0): Promise<void> {
  if (rollout.status === Status.COMPLETED) return;
  if (rollout.status !== Status.INIT) restartFromPrompt(rollout); // never continued mid-way: played again whole
  const timings = rollout.timings;
  timings.queueMs += queueMs;
  if (timings.startedAt === 0) timings.startedAt = Date.now();
  const start = performance.now();
  rollout.workerId = ctx.workerId;
  const sessionId = sessionIdOf(rollout.id, rollout.attempt);
  let env: Environment | null = null;
  let envFailed = false;
  try {
    let prompt: ChatMessage[];
    let label: unknown = rollout.sample.envParams.label;
    if (ctx.actors !== null) {
      const actor = (env = await acquireActor(ctx.actors, ctx.gate.signal));
      const t = performance.now();
      const reset = await guarded(ctx, rollout, 'reset', () =>
        actor.reset({ seed: rollout.sample.seed, params: rollout.sample.envParams }),
      );
      prompt = checkTaskPrompt(await guarded(ctx, rollout, 'getTaskPrompt', () => actor.getTaskPrompt()));
      timings.envMs += performance.now() - t;
      label ??= reset.info?.label;
    } else {
      prompt = checkTaskPrompt(rollout.sample.envParams.messages ?? []);
    }
    if (ctx.gate.paused) {
      rollout.status = Status.ABORTED;
      return;
    }
    const t = performance.now();
    let result: BlackBoxResult;
    let agentError: unknown = null;
    try {
      result = await ctx.agent({
        baseURL: sessionBaseUrl(ctx.gatewayUrl, sessionId),
        sessionId,
        prompt,
        label,
        params: rollout.sample.envParams,
        seed: rollout.sample.seed,
        signal: ctx.gate.signal,
      });
    } catch (err) {
      agentError = err;
    }
    timings.inferenceMs += performance.now() - t;
    const calls = await fetchTraces(ctx.gatewayUrl, sessionId);
    rollout.turns = calls
      .filter((c) => c.kind === 'main')
      .map(
        (c, i): TurnRecord => ({
          step: i + 1,
          agentId: null,
          messages: [],
          response: '',
          finishReason: c.finishReason,
          promptIds: c.promptIds,
          responseIds: c.completionIds,
          logprobs: c.logprobs,
          modelSteps: null, // every token has `modelStep` (TurnRecord.modelSteps)
          seed: null,
          modelStep: c.modelStep,
          reward: 0,
          terminated: false,
          truncated: c.finishReason === 'length',
          trainable: true,
          timings: { inferenceMs: 0, envMs: 0, totalMs: 0 },
        }),
      );
    const interrupted = calls.some((c) => c.finishReason === 'abort') || (agentError !== null && ctx.gate.paused);
    if (interrupted) {
      await releaseSession(ctx.gatewayUrl, sessionId);
      rollout.status = Status.ABORTED;
      return;
    }
    if (agentError !== null) throw agentError;
    const returned: unknown = typeof result === 'number' ? result : (result?.reward ?? null);
    // NaN (a score over zero cases) or a string would reach the batch and the checkpoint as null.
    if (returned !== null && (typeof returned !== 'number' || !Number.isFinite(returned))) {
      throw new RolloutEngineError(
        'ERR_AGENT_BAD_REWARD',
        `the black-box agent returned reward ${preview(returned)}: a reward must be a finite number`,
      );
    }
    let reward = returned as number | null;
    if (reward === null && env !== null) {
      // The environment judges the agent's final answer.
      const actor = env;
      const outcome = checkStepResult(await guarded(ctx, rollout, 'step', () => actor.step(finalAnswer(result))));
      reward = rewardFor(outcome.reward, null);
    }
    // A sample without a reward teaches nothing: failed with the reason, not kept with a silent 0.
    if (reward === null) {
      throw new RolloutEngineError(
        'ERR_AGENT_NO_REWARD',
        'the black-box agent returned no reward, and its task has no environment to judge an answer (tasks[].env is null): return { reward }, e.g. computed from the label it is given',
      );
    }
    const sample = await stitchSession(ctx.gatewayUrl, sessionId, reward);
    const { reward: _reward, ...stitched } = sample;
    rollout.stitched = stitched;
    rollout.reward = reward;
    const lastTurn = rollout.turns.at(-1);
    if (lastTurn) {
      lastTurn.reward = rollout.reward;
      lastTurn.terminated = true;
    }
    // An agent that knows its episode was cut (a verifiers server's turn limit) says so beside the stitch's own.
    const cut = sample.truncated || (typeof result === 'object' && result?.truncated === true);
    rollout.truncated = cut;
    rollout.terminated = !cut;
    rollout.finishReason = lastTurn?.finishReason ?? null;
    rollout.status = Status.COMPLETED;
  } catch (err) {
    const code = (err as { code?: unknown } | null | undefined)?.code;
    rollout.status = code === 'ERR_ACTOR_POOL_ABORTED' || code === 'ERR_ENV_CANCELLED' ? Status.ABORTED : Status.FAILED;
    rollout.error = describeError(err);
    if (rollout.status === Status.FAILED) rollout.failureKind = failureKindOf(err);
    envFailed = typeof code === 'string' && code.startsWith('ERR_ENV_');
    ctx.onProblem?.(rollout, rollout.error);
    await releaseSession(ctx.gatewayUrl, sessionId);
  } finally {
    if (env !== null && ctx.actors !== null) await ctx.actors.done(env, envFailed).catch(() => undefined);
    timings.totalMs += performance.now() - start;
    timings.finishedAt = Date.now();
  }
}

function guarded<T>(
  ctx: BlackBoxContext,
  rollout: RolloutState,
  call: 'reset' | 'getTaskPrompt' | 'step',
  run: () => T | Promise<T>,
): T | Promise<T> {
  return ctx.guard === undefined ? run() : ctx.guard.call(rollout, call, run);
}

/** The answer the environment judges: what the module returned as `info.answer`. */
function finalAnswer(result: BlackBoxResult): string {
  const answer = typeof result === 'object' && result !== null ? result.info?.answer : undefined;
  if (typeof answer === 'string') return answer;
  throw new RolloutEngineError(
    'ERR_AGENT_NO_REWARD',
    'the black-box agent returned no reward and no info.answer for the environment to judge',
  );
}

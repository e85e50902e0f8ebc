/**
 * The agent loop: drives one episode of one rollout against an in-process environment, and a group
 * as its k episodes side by side. Runs inside worker threads.
 *
 *   reset(seed, params) → [ getTaskPrompt → trim → inference → step → record turn ] × ≤ maxSteps
 *
 * The episode ends on terminated / truncated, an empty prompt, or maxSteps. A `length` finish reason
 * ends it as truncated (the reference Interactor does the same). Every outcome is a status on the
 * rollout — this module never throws for an episode's failure.
 */
import type { ChatResult } from '../llm/reply.ts';
import type { ChatRequest } from '../llm/client.ts';
import { checkStepResult, checkTaskPrompt } from '../env/replies.ts';
import type { EnvironmentFactory, EnvParams } from '../env/types.ts';
import { describeError } from '../protocol/errors.ts';
import {
  groupStatus,
  statusForFinishReason,
  Status,
  type ChatMessage,
  type RolloutGroup,
  type RolloutState,
  type TurnRecord,
} from '../protocol/rollout.ts';
import { trimMessages } from './trim.ts';

export interface AgentSettings {
  maxSteps: number;
  messageCut: number;
  maxTokens: number;
  temperature: number;
}

export interface ChatClient {
  chat(request: ChatRequest, signal?: AbortSignal): Promise<ChatResult>;
}

export interface EpisodeContext {
  createEnv: EnvironmentFactory;
  /** Factory params from the task config (not the drawn prompt, which goes to reset). */
  envParams: EnvParams;
  llm: ChatClient;
  settings: AgentSettings;
  /** Model step to tag tokens with when the server does not report a weight version. */
  modelStep: number;
  workerId: number;
  /** Called once per environment step, for worker counters. */
  onStep?: () => void;
  /** Called when an episode ends badly, for logs (the reason is also on the rollout). */
  onProblem?: (rollout: RolloutState, reason: string) => void;
  signal?: AbortSignal;
}

export async function runGroup(group: RolloutGroup, ctx: EpisodeContext, queueMs: number): Promise<RolloutGroup> {
  await Promise.all(group.rollouts.map((rollout) => runEpisode(rollout, ctx, queueMs)));
  group.status = groupStatus(group.rollouts);
  return group;
}

/** Mutates `rollout` into a final status (COMPLETED, ABORTED or FAILED). */
export async function runEpisode(rollout: RolloutState, ctx: EpisodeContext, queueMs = 0): Promise<void> {
  const { settings, llm } = ctx;
  const timings = rollout.timings;
  timings.queueMs = queueMs;
  timings.startedAt = Date.now();
  const start = performance.now();
  rollout.workerId = ctx.workerId;
  let env: ReturnType<EnvironmentFactory> | undefined;
  try {
    env = ctx.createEnv(ctx.envParams);
    let t = performance.now();
    await env.reset({ seed: rollout.sample.seed, params: rollout.sample.envParams });
    timings.envMs += performance.now() - t;
    let ended = false;
    for (let step = 1; step <= settings.maxSteps && !ended; step++) {
      const turnStart = performance.now();
      const fullPrompt = checkTaskPrompt(await env.getTaskPrompt());
      const promptMs = performance.now() - turnStart;
      const prompt = trimMessages(fullPrompt, settings.messageCut);
      if (prompt.length === 0) {
        timings.envMs += promptMs;
        break;
      }
      t = performance.now();
      const reply = await llm.chat({ messages: prompt, maxTokens: settings.maxTokens, temperature: settings.temperature }, ctx.signal);
      const inferenceMs = performance.now() - t;
      timings.inferenceMs += inferenceMs;
      rollout.finishReason = reply.finishReason;
      rollout.messages = [...fullPrompt, { role: 'assistant', content: reply.content }];

      const replyStatus = statusForFinishReason(reply.finishReason);
      if (replyStatus !== Status.COMPLETED) {
        // abort: keep what was generated so it can continue later; anything unknown: fail with it.
        rollout.turns.push(turnRecord(step, prompt, reply, ctx, { reward: 0, terminated: false, truncated: false }, promptMs, inferenceMs, turnStart));
        rollout.status = replyStatus;
        rollout.error = replyStatus === Status.FAILED ? `ERR_LLM_FINISH_REASON: unknown finish reason ${JSON.stringify(reply.finishReason)}` : 'inference aborted';
        return;
      }
      if (reply.finishReason === 'length') {
        rollout.turns.push(turnRecord(step, prompt, reply, ctx, { reward: 0, terminated: true, truncated: true }, promptMs, inferenceMs, turnStart));
        rollout.terminated = true;
        rollout.truncated = true;
        break;
      }
      t = performance.now();
      const outcome = checkStepResult(await env.step(reply.content));
      const stepMs = performance.now() - t;
      timings.envMs += promptMs + stepMs;
      ctx.onStep?.();
      rollout.reward += outcome.reward;
      rollout.turns.push(turnRecord(step, prompt, reply, ctx, outcome, promptMs + stepMs, inferenceMs, turnStart));
      if (outcome.terminated || outcome.truncated) {
        rollout.terminated = outcome.terminated;
        rollout.truncated = outcome.truncated;
        ended = true;
      } else if (step === settings.maxSteps) {
        rollout.truncated = true; // out of steps: the episode did not finish on its own
      }
    }
    rollout.status = Status.COMPLETED;
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    rollout.status = code === 'ERR_LLM_ABORTED' ? Status.ABORTED : Status.FAILED;
    rollout.error = describeError(err);
    ctx.onProblem?.(rollout, rollout.error);
  } finally {
    if (env?.close) {
      try {
        await env.close();
      } catch (err) {
        ctx.onProblem?.(rollout, `env close failed: ${describeError(err)}`);
      }
    }
    timings.totalMs = performance.now() - start;
    timings.finishedAt = Date.now();
  }
}

function turnRecord(
  step: number,
  messages: ChatMessage[],
  reply: ChatResult,
  ctx: EpisodeContext,
  outcome: { reward: number; terminated: boolean; truncated: boolean },
  envMs: number,
  inferenceMs: number,
  turnStart: number,
): TurnRecord {
  const modelStep = reply.weightVersion ?? ctx.modelStep;
  const responseIds = reply.responseIds;
  return {
    step,
    messages,
    response: reply.content,
    finishReason: reply.finishReason,
    promptIds: reply.promptIds,
    responseIds,
    logprobs: reply.logprobs,
    modelSteps: responseIds === null ? null : new Int32Array(responseIds.length).fill(modelStep),
    modelStep,
    reward: outcome.reward,
    terminated: outcome.terminated,
    truncated: outcome.truncated,
    // With trimming every turn is a self-contained sample; without it only the last turn holds the
    // whole conversation, so only that one is trained on (reference Interactor semantics).
    trainable: ctx.settings.messageCut > 0 || outcome.terminated || outcome.truncated,
    timings: { inferenceMs, envMs, totalMs: performance.now() - turnStart },
  };
}

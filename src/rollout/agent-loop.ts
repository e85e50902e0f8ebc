/**
 * The agent loop: drives one episode of one rollout against an in-process environment, and a group
 * as its k episodes side by side. Runs inside worker threads.
 *
 *   reset(seed, params) → [ getTaskPrompt → trim → inference → step → record turn ] × ≤ maxSteps
 *
 * The episode ends on terminated / truncated, an empty prompt, or maxSteps. A `length` finish reason
 * ends it as truncated (as in the reference Interactor). Every outcome is a status on the rollout —
 * this module never throws for an episode's failure.
 *
 * Pauses: before each inference call the episode checks the shared pause flag; when set, it stops
 * there and comes back ABORTED with its turns so far. A call the server aborts comes back with the
 * tokens it had, kept as a partial last turn (finish reason `abort`).
 *
 * Continuing an ABORTED rollout (partial rollouts on): a fresh environment is reset with the same
 * seed and the recorded actions are stepped again (environments are deterministic under seed and
 * actions; a replay that disagrees with the record restarts the rollout from its prompt instead).
 * A partial last turn is then continued with `continue_final_message`, `max_tokens` reduced by what
 * it already has, and the new tokens tagged with the current model step. With partial rollouts off,
 * an ABORTED rollout restarts from its prompt.
 */
import type { ChatResult } from '../llm/reply.ts';
import type { ChatRequest } from '../llm/client.ts';
import { checkStepResult, checkTaskPrompt } from '../env/replies.ts';
import type { Environment, EnvironmentFactory, EnvParams } from '../env/types.ts';
import { describeError } from '../protocol/errors.ts';
import {
  groupStatus,
  resetToPrompt,
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
  /** Continue ABORTED rollouts where they stopped instead of restarting them. */
  partialRollout: boolean;
  /** Send a per-rollout, per-turn `seed` with every inference call. */
  sendSeed: boolean;
}

export interface ChatClient {
  chat(request: ChatRequest, signal?: AbortSignal): Promise<ChatResult>;
}

/** What the agent loop needs to know about pauses (rollout/pause-gate.ts in a worker). */
export interface PauseView {
  readonly paused: boolean;
  readonly modelStep: number;
  readonly signal: AbortSignal;
}

export interface EpisodeContext {
  createEnv: EnvironmentFactory;
  /** Factory params from the task config (not the drawn prompt, which goes to reset). */
  envParams: EnvParams;
  llm: ChatClient;
  settings: AgentSettings;
  gate: PauseView;
  workerId: number;
  /** Called once per environment step, for worker counters. */
  onStep?: () => void;
  /** Called when an episode ends badly or a continuation has to restart, for logs. */
  onProblem?: (rollout: RolloutState, reason: string) => void;
}

export async function runGroup(group: RolloutGroup, ctx: EpisodeContext, queueMs: number): Promise<RolloutGroup> {
  await Promise.all(group.rollouts.map((rollout) => runEpisode(rollout, ctx, queueMs)));
  group.status = groupStatus(group.rollouts);
  return group;
}

class ReplayMismatch extends Error {}

/** Mutates `rollout` into a final status (COMPLETED, ABORTED or FAILED). COMPLETED ones are left as they are. */
export async function runEpisode(rollout: RolloutState, ctx: EpisodeContext, queueMs = 0): Promise<void> {
  if (rollout.status === Status.COMPLETED) return; // a sibling kept from an earlier run of its group
  const { settings } = ctx;
  if (rollout.status === Status.ABORTED && !settings.partialRollout) resetToPrompt(rollout, Status.INIT);
  rollout.error = null;
  const timings = rollout.timings;
  timings.queueMs += queueMs;
  if (timings.startedAt === 0) timings.startedAt = Date.now();
  const start = performance.now();
  rollout.workerId = ctx.workerId;
  let env: Environment | undefined;
  try {
    env = ctx.createEnv(ctx.envParams);
    let partial: TurnRecord | null = null;
    try {
      partial = await prepare(env, rollout);
    } catch (err) {
      if (!(err instanceof ReplayMismatch)) throw err;
      ctx.onProblem?.(rollout, `${err.message}; restarting the rollout from its prompt`);
      resetToPrompt(rollout, Status.INIT);
      await closeEnv(env, rollout, ctx);
      env = ctx.createEnv(ctx.envParams);
      partial = await prepare(env, rollout);
    }
    await play(env, rollout, partial, ctx);
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    rollout.status = code === 'ERR_LLM_ABORTED' ? Status.ABORTED : Status.FAILED;
    rollout.error = describeError(err);
    ctx.onProblem?.(rollout, rollout.error);
  } finally {
    if (env) await closeEnv(env, rollout, ctx);
    timings.totalMs += performance.now() - start;
    timings.finishedAt = Date.now();
  }
}

/**
 * Reset the environment and bring it to where the rollout stopped: every recorded complete turn is
 * stepped again. Returns the partial last turn to continue, if any.
 */
async function prepare(env: Environment, rollout: RolloutState): Promise<TurnRecord | null> {
  const t = performance.now();
  await env.reset({ seed: rollout.sample.seed, params: rollout.sample.envParams });
  const last = rollout.turns.at(-1);
  const partial = last !== undefined && last.finishReason === 'abort' ? last : null;
  const complete = partial ? rollout.turns.length - 1 : rollout.turns.length;
  for (let i = 0; i < complete; i++) {
    const turn = rollout.turns[i];
    checkTaskPrompt(await env.getTaskPrompt());
    const outcome = checkStepResult(await env.step(turn.response));
    if (outcome.reward !== turn.reward || outcome.terminated !== turn.terminated || outcome.truncated !== turn.truncated) {
      throw new ReplayMismatch(
        `environment replay of step ${turn.step} disagrees with the record (reward ${outcome.reward} vs ${turn.reward}, terminated ${outcome.terminated} vs ${turn.terminated})`,
      );
    }
  }
  rollout.timings.envMs += performance.now() - t;
  return partial;
}

async function play(env: Environment, rollout: RolloutState, partial: TurnRecord | null, ctx: EpisodeContext): Promise<void> {
  const { settings, llm, gate } = ctx;
  const timings = rollout.timings;
  const firstStep = rollout.turns.length + (partial ? 0 : 1);
  for (let step = firstStep; step <= settings.maxSteps; step++) {
    if (gate.paused) {
      rollout.status = Status.ABORTED; // stopped at a turn boundary: continues from here after the resume
      return;
    }
    const turnStart = performance.now();
    const fullPrompt = checkTaskPrompt(await env.getTaskPrompt());
    const promptMs = performance.now() - turnStart;
    const prompt = trimMessages(fullPrompt, settings.messageCut);
    if (prompt.length === 0) {
      timings.envMs += promptMs;
      break;
    }
    const already = partial?.responseIds?.length ?? 0;
    const seed = settings.sendSeed ? turnSeed(rollout, step) : null;
    let t = performance.now();
    const reply = await llm.chat(
      {
        messages: prompt,
        maxTokens: Math.max(1, settings.maxTokens - already),
        temperature: settings.temperature,
        ...(seed !== null ? { seed } : {}),
        ...(partial ? { continueFrom: partial.response } : {}),
      },
      gate.signal,
    );
    const inferenceMs = performance.now() - t;
    timings.inferenceMs += inferenceMs;
    const modelStep = reply.weightVersion ?? gate.modelStep;
    const turn = turnRecord(step, prompt, reply, modelStep, seed, settings, promptMs, inferenceMs, turnStart);
    if (partial) {
      mergeContinuation(partial, turn);
      rollout.turns.pop();
      partial = null;
    }
    rollout.turns.push(turn);
    rollout.finishReason = turn.finishReason;
    rollout.messages = [...fullPrompt, { role: 'assistant', content: turn.response }];

    const replyStatus = statusForFinishReason(turn.finishReason);
    if (replyStatus !== Status.COMPLETED) {
      // abort: the turn keeps its tokens and is continued after the resume; anything unknown: fail with it.
      rollout.status = replyStatus;
      rollout.error = replyStatus === Status.FAILED ? `ERR_LLM_FINISH_REASON: unknown finish reason ${JSON.stringify(turn.finishReason)}` : null;
      return;
    }
    if (turn.finishReason === 'length') {
      turn.terminated = turn.truncated = turn.trainable = true;
      rollout.terminated = rollout.truncated = true;
      break;
    }
    t = performance.now();
    const outcome = checkStepResult(await env.step(turn.response));
    const stepMs = performance.now() - t;
    timings.envMs += promptMs + stepMs;
    ctx.onStep?.();
    turn.reward = outcome.reward;
    turn.terminated = outcome.terminated;
    turn.truncated = outcome.truncated;
    // With trimming every turn is a self-contained sample; without it only the last turn holds the
    // whole conversation, so only that one is trained on (reference Interactor semantics).
    turn.trainable = settings.messageCut > 0 || outcome.terminated || outcome.truncated;
    turn.timings.envMs += stepMs;
    turn.timings.totalMs = performance.now() - turnStart;
    rollout.reward += outcome.reward;
    if (outcome.terminated || outcome.truncated) {
      rollout.terminated = outcome.terminated;
      rollout.truncated = outcome.truncated;
      break;
    }
    if (step === settings.maxSteps) rollout.truncated = true; // out of steps: it did not finish on its own
  }
  rollout.status = Status.COMPLETED;
}

function turnRecord(
  step: number,
  messages: ChatMessage[],
  reply: ChatResult,
  modelStep: number,
  seed: number | null,
  settings: AgentSettings,
  envMs: number,
  inferenceMs: number,
  turnStart: number,
): TurnRecord {
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
    seed,
    modelStep,
    reward: 0,
    terminated: false,
    truncated: false,
    trainable: settings.messageCut > 0,
    timings: { inferenceMs, envMs, totalMs: performance.now() - turnStart },
  };
}

/**
 * Fold the partial turn in front of its continuation: one turn whose tokens are the partial's (with
 * their old model steps) followed by the new ones (with the new step), and the original prompt ids.
 */
function mergeContinuation(partial: TurnRecord, turn: TurnRecord): void {
  turn.response = partial.response + turn.response;
  turn.promptIds = partial.promptIds ?? turn.promptIds;
  turn.responseIds = concat(partial.responseIds, turn.responseIds, Int32Array);
  turn.logprobs = concat(partial.logprobs, turn.logprobs, Float32Array);
  turn.modelSteps = concat(partial.modelSteps, turn.modelSteps, Int32Array);
  turn.timings.inferenceMs += partial.timings.inferenceMs;
  turn.timings.totalMs += partial.timings.totalMs;
}

function concat<T extends Int32Array | Float32Array>(a: T | null, b: T | null, Kind: { new (n: number): T }): T | null {
  if (a === null || b === null) return null; // ids from only one part cannot be aligned
  const out = new Kind(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/** A seed per (prompt, rollout, step): a continuation samples with the seed of the turn it continues. */
function turnSeed(rollout: RolloutState, step: number): number {
  let h = Math.imul(rollout.sample.seed ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(rollout.index + 1, 0xc2b2ae35) ^ Math.imul(step, 0x27d4eb2f);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  h ^= h >>> 12;
  return h >>> 1;
}

async function closeEnv(env: Environment, rollout: RolloutState, ctx: EpisodeContext): Promise<void> {
  if (!env.close) return;
  try {
    await env.close();
  } catch (err) {
    ctx.onProblem?.(rollout, `env close failed: ${describeError(err)}`);
  }
}

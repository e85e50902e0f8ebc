/**
 * Continuing an ABORTED rollout where it stopped (partial rollouts on). A fresh actor is reset with
 * the same seed and the recorded steps are played again (environments are deterministic under seed
 * and actions; a replay that disagrees with the record throws ReplayMismatch, and the rollout
 * restarts from its prompt). Its partial last turn is then continued by a new call (inference-call.ts,
 * `continueFrom`: sent with `continue_final_message`, `max_tokens` reduced by what it already has,
 * the same sampling seed, the new tokens tagged with the current model step; a multi-agent step that
 * was interrupted is played again whole), and the two are folded into one turn whose tokens,
 * logprobs, model steps and stale-KV marks are the partial's followed by the continuation's.
 */
import { checkAgentPrompts, checkStepResult } from '../env/replies.ts';
import {
  dropTurnsFrom,
  modelStepsOf,
  restartFromPrompt,
  Status,
  type ChatMessage,
  type RolloutState,
  type TurnRecord,
} from '../domain/rollout.ts';
import type { McpSessions } from '../env/mcp.ts';
import type { Episode } from './episode-context.ts';
import { envCall } from './env-calls.ts';
import { actionOf, isUnfinished, rewardFor, steppedTurns, stepsOf } from './env-step.ts';
import { toolMessagesOf } from './tools.ts';

/** The environment, replaying a rollout's steps, did not give what the record says it gave. */
export class ReplayMismatch extends Error {}

/**
 * Reset the episode's actor and bring it to where the rollout stopped: every recorded complete step
 * is played again. Returns the partial last turn to continue, if any (single-agent only; an
 * interrupted multi-agent step is dropped and played again whole).
 */
export async function replaySteps(episode: Episode): Promise<TurnRecord | null> {
  const t = performance.now();
  const { env, rollout, ctx } = episode;
  await envCall(ctx, rollout, 'reset', () =>
    env.reset({ seed: rollout.sample.seed, params: rollout.sample.envParams }),
  );
  const steps = stepsOf(rollout.turns);
  let partial: TurnRecord | null = null;
  const last = steps.at(-1);
  if (last?.some((turn) => turn.finishReason === 'abort')) {
    steps.pop();
    if (last.length === 1 && last[0].agentId === null) partial = last[0];
    else dropTurnsFrom(rollout, rollout.turns.length - last.length); // multi-agent: redo the step whole
  }
  for (const turns of steps) {
    checkAgentPrompts(await envCall(ctx, rollout, 'getTaskPrompt', () => env.getTaskPrompt()));
    // The environment's tools ran again, in order, so its state is what the record saw (results as recorded; MCP servers are not called twice).
    const toolMessages: ChatMessage[] = [];
    for (const turn of turns) {
      if (turn.toolCalls === undefined) continue;
      for (const call of turn.toolCalls) {
        if (call.source !== 'env' || env.callTool === undefined) continue;
        const request = {
          id: call.id,
          name: call.name,
          arguments: JSON.parse(call.arguments) as Record<string, unknown>,
        };
        await envCall(ctx, rollout, 'callTool', () => env.callTool!(request, ctx.gate.signal));
      }
      toolMessages.push(...toolMessagesOf(turn.response, turn.toolCalls));
    }
    const outcome = checkStepResult(
      await envCall(ctx, rollout, 'step', () => env.step(actionOf(turns), { toolMessages })),
    );
    episode.lastInfo = outcome.info ?? null;
    for (const turn of steppedTurns(turns)) {
      const reward = rewardFor(outcome.reward, turn.agentId);
      if (reward !== turn.reward || outcome.terminated !== turn.terminated || outcome.truncated !== turn.truncated) {
        throw new ReplayMismatch(
          `environment replay of step ${turn.step} disagrees with the record (reward ${reward} vs ${turn.reward}, terminated ${outcome.terminated} vs ${turn.terminated})`,
        );
      }
    }
  }
  rollout.timings.envMs += performance.now() - t;
  return partial;
}

/**
 * Readies a rollout whose episode failed by infrastructure to be played on from its last finished
 * step: the steps the environment finished are kept, to be replayed on a fresh actor as a continued
 * rollout's are (a replay that disagrees restarts it from its prompt: runEpisode), and the step it
 * did not finish — its replies, recorded before its tool calls or its `step` failed — is dropped and
 * played again whole. What the failed sandbox, session or judge did is not in the record, so nothing
 * of it is trained; what the model generated before it is, with the model steps that sampled it.
 * A rollout with nothing finished to keep starts again from its prompt.
 */
export function resumeAfterInfra(rollout: RolloutState): void {
  const firstUnfinished = rollout.turns.findIndex(isUnfinished);
  const keep = firstUnfinished === -1 ? rollout.turns.length : firstUnfinished;
  if (keep === 0 || calledMcp(rollout.turns.slice(0, keep))) {
    restartFromPrompt(rollout);
    return;
  }
  dropUnfinishedStep(rollout);
  rollout.status = Status.INIT;
  rollout.error = null;
  delete rollout.failureKind;
}

/**
 * Drops the step the environment has not finished (its turns, marked unfinished by the worker that
 * recorded them: env-step.ts), counted thrown away: a rollout goes on only from steps the
 * environment finished, which a replay plays again exactly. The conversation and finish reason were
 * the dropped step's: back to the last kept turn's, in case the episode ends before it records
 * another (an empty prompt).
 */
export function dropUnfinishedStep(rollout: RolloutState): void {
  const first = rollout.turns.findIndex(isUnfinished);
  if (first === -1) return;
  dropTurnsFrom(rollout, first);
  const last = rollout.turns.at(-1);
  if (last === undefined) return;
  rollout.messages = [...last.messages, { role: 'assistant', content: last.response }];
  rollout.finishReason = last.finishReason;
}

/**
 * Whether an ABORTED rollout can go on from where it stopped on a fresh actor. Not where the task keeps
 * an MCP session per episode (`tools.mcpSessions: episode`, for servers that keep per-session state)
 * and a step it keeps called one of them: a replay does not call MCP servers again (replaySteps), so
 * the fresh session would lack what those calls did, while the record says the model saw it. An
 * interrupted step keeps none of its turns (tool-rounds.ts), so every call recorded counts.
 */
export function canContinue(rollout: RolloutState, mcpSessions: McpSessions | undefined): boolean {
  return mcpSessions !== 'episode' || !calledMcp(rollout.turns);
}

/** Whether any of `turns` called a tool of an MCP server (a source other than the environment). */
function calledMcp(turns: readonly TurnRecord[]): boolean {
  return turns.some((t) => t.toolCalls?.some((c) => c.source !== null && c.source !== 'env'));
}

/**
 * Fold the partial turn in front of its continuation: one turn whose tokens are the partial's (with
 * their old model steps) followed by the new ones (with the new step), and the original prompt ids.
 */
export function mergeContinuation(partial: TurnRecord, turn: TurnRecord): void {
  // First, while each part's ids still give its own length: the new tokens' steps are implicit.
  turn.modelSteps = concat(modelStepsOf(partial), modelStepsOf(turn), Int32Array);
  if (partial.staleKv !== undefined || turn.staleKv !== undefined) {
    const stale = concat(staleKvOf(partial), staleKvOf(turn), Uint8Array);
    if (stale !== null) turn.staleKv = stale;
  }
  if (partial.spansVersions === true) turn.spansVersions = true;
  if (partial.historyRewrite !== undefined) turn.historyRewrite = partial.historyRewrite;
  turn.response = partial.response + turn.response;
  turn.promptIds = partial.promptIds ?? turn.promptIds;
  turn.responseIds = concat(partial.responseIds, turn.responseIds, Int32Array);
  turn.logprobs = concat(partial.logprobs, turn.logprobs, Float32Array);
  turn.timings.inferenceMs += partial.timings.inferenceMs;
  turn.timings.totalMs += partial.timings.totalMs;
}

/** A turn's stale-KV marks with a 0 for every token when it has none (a continuation's part re-prefilled on one set of weights). */
function staleKvOf(turn: TurnRecord): Uint8Array | null {
  return turn.staleKv ?? (turn.responseIds === null ? null : new Uint8Array(turn.responseIds.length));
}

function concat<T extends Int32Array | Float32Array | Uint8Array>(
  a: T | null,
  b: T | null,
  Kind: { new (n: number): T },
): T | null {
  if (a === null || b === null) return null; // ids from only one part cannot be aligned
  const out = new Kind(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

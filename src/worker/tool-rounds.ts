/**
 * A single agent's step with tools: the tools it is offered (the environment's, then its MCP
 * servers'), and the rounds of calling them while its replies call tools, each round a turn of the
 * step (tools.ts runs one reply's calls). The environment steps once, on the step's last reply.
 */
import type { Environment } from '../env/types.ts';
import type { McpConnection } from '../env/mcp.ts';
import { RolloutEngineError } from '../errors.ts';
import {
  Status,
  statusForFinishReason,
  type ChatMessage,
  type RolloutState,
  type TurnRecord,
} from '../domain/rollout.ts';
import { DEFAULT_TOOL_SETTINGS, type Episode } from './episode-context.ts';
import { envCall } from './env-calls.ts';
import { dropUnfinishedStep } from './continuation.ts';
import { endInterrupted, endTruncated } from './episode-end.ts';
import { ContextExceeded, infer, pendingCalls } from './inference-call.ts';
import { recordTurn } from './record-turn.ts';
import { runToolCalls, toolMessagesOf, type StepTools } from './tools.ts';

/** A single agent's step whose reply called tools: what each of its rounds builds on. */
export interface ToolStep {
  step: number;
  /** The step's prompt as sent (trimmed): each round sends it followed by the exchange so far. */
  prompt: ChatMessage[];
  /** The step's turns, also the rollout's last ones: each round's turn joins both. */
  turns: TurnRecord[];
  tools: StepTools;
  /** The first turn this run of the episode added: prompts are shared from there on (prompt-prefix.ts). */
  firstNewTurn: number;
}

/**
 * The tools of one step: the environment's (`tools()`) then its MCP servers' (env/types.ts, "Tools").
 * An MCP server that cannot be reached lists none this step (the model is not offered them; said in
 * the logs), rather than failing the episode.
 */
export async function stepTools(episode: Episode): Promise<StepTools> {
  const { env, rollout, ctx } = episode;
  const own = env.tools === undefined ? [] : await envCall(ctx, rollout, 'tools', () => env.tools!());
  if (!Array.isArray(own))
    throw new RolloutEngineError(
      'ERR_ENV_BAD_REPLY',
      `environment tools() must return an array of OpenAI function tools (got ${typeof own})`,
    );
  const names = new Set(own.map((t) => t?.function?.name));
  if (ctx.mcp === undefined || (ctx.settings.tools?.mcp.length ?? 0) === 0)
    return { schemas: own, env: names, mcp: new Map() };
  episode.mcp ??= ctx.mcp.acquire();
  const listed = await episode.mcp.list();
  for (const problem of listed.problems) ctx.onProblem?.(rollout, `${problem}: its tools are not offered this step`);
  const schemas = own.slice();
  const mcp = new Map<string, McpConnection>();
  for (const schema of listed.schemas) {
    if (names.has(schema.function.name)) continue; // the environment's own tool of that name wins
    schemas.push(schema);
    mcp.set(schema.function.name, listed.owners.get(schema.function.name)!);
  }
  return { schemas, env: names, mcp };
}

/**
 * While the step's last reply called tools: run its calls, add the exchange to the conversation, and
 * ask the model again (a turn each). Returns the step's tool messages, for the environment's `step`;
 * null when the rollout ended here (its status set). A step interrupted (a pause between rounds or
 * during a call, an aborted reply) leaves none of its turns behind: an ABORTED rollout holds only
 * steps the environment stepped on, so a continuation replays them exactly and plays this one again
 * whole. A step that failed keeps its turns, as a step outside a tool round does.
 */
export async function toolRounds(episode: Episode, at: ToolStep): Promise<ChatMessage[] | null> {
  const { rollout, ctx } = episode;
  const { step, prompt, turns, tools, firstNewTurn } = at;
  const settings = ctx.settings.tools ?? DEFAULT_TOOL_SETTINGS;
  const { env } = episode;
  const callEnv =
    env.callTool === undefined
      ? null
      : (call: Parameters<NonNullable<Environment['callTool']>>[0], signal: AbortSignal) =>
          envCall(ctx, rollout, 'callTool', () => env.callTool!(call, signal));
  const toolMessages: ChatMessage[] = [];
  let used = 0;
  // What throws here goes on to the agent loop, which drops the step if it was interrupted
  // (dropUnfinishedStep) and keeps it with a rollout that failed.
  for (
    let last = turns[turns.length - 1], calls = pendingCalls.get(last);
    calls !== undefined;
    calls = pendingCalls.get(last)
  ) {
    pendingCalls.delete(last);
    const { records, ms } = await runToolCalls(calls, {
      tools,
      budget: settings.maxCallsPerTurn - used,
      callEnv,
      timeoutMs: settings.timeoutMs,
      cancel: ctx.gate.signal,
    });
    used += calls.length;
    last.toolCalls = records;
    last.timings.toolMs = ms;
    last.timings.totalMs += ms;
    rollout.timings.toolMs = (rollout.timings.toolMs ?? 0) + ms;
    toolMessages.push(...toolMessagesOf(last.response, records));
    if (used >= settings.maxCallsPerTurn) break; // out of calls: the environment steps on this reply
    if (ctx.gate.paused) {
      dropUnfinishedStep(rollout);
      rollout.status = Status.ABORTED;
      return null;
    }
    const t = performance.now();
    let next: TurnRecord;
    try {
      next = await infer(
        {
          rollout,
          step,
          agentId: null,
          prompt: [...prompt, ...toolMessages],
          partial: null,
          promptMs: 0,
          turnStart: t,
          tools,
        },
        ctx,
      );
    } catch (err) {
      if (!(err instanceof ContextExceeded)) throw err;
      rollout.timings.inferenceMs += performance.now() - t;
      endTruncated(rollout, null, err.message);
      ctx.onTurn?.(rollout, turns, null);
      return null;
    }
    rollout.timings.inferenceMs += performance.now() - t;
    recordTurn(rollout, next, firstNewTurn);
    turns.push(next);
    rollout.finishReason = next.finishReason;
    if (statusForFinishReason(next.finishReason) !== Status.COMPLETED) {
      // Aborted, the step goes, counted thrown away; any other ending fails the rollout with it.
      endInterrupted(rollout, next.finishReason);
      if ((rollout.status as Status) === Status.ABORTED) dropUnfinishedStep(rollout);
      return null;
    }
    last = next;
    if (next.finishReason === 'length') break; // its calls, if any, are cut: the episode ends truncated
  }
  return toolMessages;
}

/** `rollout.tools` from the turns it holds (absent when none called a tool). */
export function countToolCalls(rollout: RolloutState): void {
  let calls = 0;
  let errors = 0;
  for (const turn of rollout.turns) {
    if (turn.toolCalls === undefined) continue;
    calls += turn.toolCalls.length;
    for (const call of turn.toolCalls) if (call.error !== null) errors++;
  }
  if (calls > 0) rollout.tools = { calls, errors };
  else delete rollout.tools;
}

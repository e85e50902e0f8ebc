/**
 * Running the tool calls of one reply (the design: env/types.ts, "Tools"). Every call ends as a
 * ToolCallRecord whose `result` is what the model is shown: the tool's text, or `error: …` naming
 * what went wrong (ToolErrorKind). Nothing here fails the rollout. A cancellation for a weight update
 * is not the model's doing either: whatever the call threw, it is passed on as ERR_ENV_CANCELLED, and
 * the rollout comes back ABORTED to go on after the resume.
 *
 * The calls of one reply run concurrently, each bounded by `tasks[].tools.timeoutMs` (its signal
 * aborts then); calls past the turn's budget (`maxCallsPerTurn`) are not run.
 */
import { settleWithin } from '../env/bounded.ts';
import { EnvError } from '../env/errors.ts';
import type { McpConnection, McpServerSpec, McpSessions } from '../env/mcp.ts';
import type { ToolCallRequest, ToolOutput, ToolSchema } from '../env/types.ts';
import type { ToolChoice } from '../llm/request.ts';
import type { ParsedToolCall } from '../llm/tool-calls.ts';
import type { ChatMessage, ToolCallRecord, ToolErrorKind } from '../domain/rollout.ts';

/** `tasks[].tools` as a worker gets it (config.ts documents each field). */
export interface ToolSettings {
  maxCallsPerTurn: number;
  timeoutMs: number;
  toolChoice: ToolChoice;
  mcp: McpServerSpec[];
  mcpSessions: McpSessions;
}

/** Where the tools of one step come from, and which name each serves. */
export interface StepTools {
  schemas: ToolSchema[];
  /** Names the environment serves (`callTool`). */
  env: ReadonlySet<string>;
  /** Names an MCP server serves. */
  mcp: ReadonlyMap<string, McpConnection>;
}

export const NO_TOOLS: StepTools = { schemas: [], env: new Set(), mcp: new Map() };

/** How one call reaches the environment: through the task's guard (worker/env-guard.ts). */
export type EnvToolCall = (call: ToolCallRequest, signal: AbortSignal) => ToolOutput | Promise<ToolOutput>;

class ToolTimeout extends Error {}

/** How one reply's calls run. */
export interface ToolRun {
  tools: StepTools;
  /** Calls the turn may still make: those past it are not run. */
  budget: number;
  /** Null when the environment serves no tools. */
  callEnv: EnvToolCall | null;
  /** Each call's bound (`tasks[].tools.timeoutMs`). */
  timeoutMs: number;
  /** A weight update's cancel: it fails the step, not just the call. */
  cancel: AbortSignal;
}

/**
 * Runs `calls` (those past `run.budget` are answered `limit` without running) and returns their records
 * in order, with the wall time of the batch (parallel calls counted once).
 */
export async function runToolCalls(
  calls: readonly ParsedToolCall[],
  run: ToolRun,
): Promise<{ records: ToolCallRecord[]; ms: number }> {
  const t = performance.now();
  const settled = await Promise.allSettled(
    calls.map((call, i) =>
      i < run.budget
        ? runOne(call, run)
        : Promise.resolve(
            failed(call, 'limit', `not run: the turn reached its limit of tool calls (tasks[].tools.maxCallsPerTurn)`),
          ),
    ),
  );
  const cancelled = settled.find((s) => s.status === 'rejected');
  if (cancelled !== undefined) throw cancelled.reason;
  return {
    records: settled.map((s) => (s as PromiseFulfilledResult<ToolCallRecord>).value),
    ms: performance.now() - t,
  };
}

async function runOne(call: ParsedToolCall, run: ToolRun): Promise<ToolCallRecord> {
  const { tools, callEnv, timeoutMs, cancel } = run;
  if (call.invalid !== undefined) return failed(call, 'unparsed', call.invalid);
  let args: unknown;
  try {
    args = JSON.parse(call.arguments);
  } catch (err) {
    return failed(
      call,
      'bad_arguments',
      `the arguments of ${call.name} are not valid JSON (${(err as Error).message})`,
    );
  }
  if (typeof args !== 'object' || args === null || Array.isArray(args))
    return failed(call, 'bad_arguments', `the arguments of ${call.name} must be a JSON object`);
  const mcp = tools.mcp.get(call.name);
  const source = tools.env.has(call.name) && callEnv !== null ? 'env' : mcp !== undefined ? `mcp:${mcp.label}` : null;
  if (source === null) {
    const known = tools.schemas.map((s) => s.function.name);
    return failed(
      call,
      'unknown_tool',
      `unknown tool ${JSON.stringify(call.name)} (tools: ${known.length > 0 ? known.join(', ') : 'none'})`,
    );
  }
  const request: ToolCallRequest = { id: call.id, name: call.name, arguments: args as Record<string, unknown> };
  const controller = new AbortController();
  const onCancel = (): void => controller.abort(cancel.reason);
  cancel.addEventListener('abort', onCancel, { once: true });
  const start = performance.now();
  try {
    const running =
      source === 'env'
        ? Promise.resolve().then(() => callEnv!(request, controller.signal))
        : mcp!.call(call.name, request.arguments, controller.signal, timeoutMs);
    const output = await settleWithin(running, {
      timeoutMs,
      // Time is up: the call's signal aborts too, so a tool that listens stops.
      timedOut: () => {
        controller.abort(new ToolTimeout());
        return new ToolTimeout();
      },
      // The pause's cancel ends the wait even for a tool that does not listen (or has not yet: an MCP
      // call still connecting), and one that was already given before the call began.
      signal: cancel,
      cancelled: () => cancelledCall(call.name, source, cancel.reason),
    });
    const { content, isError } =
      typeof output === 'string' ? { content: output, isError: false } : checkOutput(output, call.name);
    return isError
      ? failed(call, 'tool_error', content, { source, ms: performance.now() - start })
      : { ...base(call), result: content, error: null, source, ms: performance.now() - start };
  } catch (err) {
    const ms = performance.now() - start;
    if (err instanceof ToolTimeout)
      return failed(call, 'timeout', `tool ${call.name} timed out after ${timeoutMs} ms (tasks[].tools.timeoutMs)`, {
        source,
        ms,
      });
    // A weight update cancelled what was in flight: the rollout comes back ABORTED, not the model's
    // mistake. Said as ERR_ENV_CANCELLED whatever the tool threw: the MCP SDK rejects an aborted call
    // with its own McpError (a numeric code), which the agent loop would take for a failure.
    if ((err as { code?: unknown } | null)?.code === 'ERR_ENV_CANCELLED') throw err;
    if (cancel.aborted) throw cancelledCall(call.name, source, err);
    return failed(call, 'tool_error', `tool ${call.name} failed: ${(err as Error)?.message ?? String(err)}`, {
      source,
      ms,
    });
  } finally {
    cancel.removeEventListener('abort', onCancel);
  }
}

function checkOutput(output: unknown, name: string): { content: string; isError: boolean } {
  const o = output as { content?: unknown; isError?: unknown } | null;
  if (typeof o !== 'object' || o === null || typeof o.content !== 'string') {
    return {
      content: `tool ${name} returned neither a string nor { content: string } (an environment bug)`,
      isError: true,
    };
  }
  return { content: o.content, isError: o.isError === true };
}

function base(call: ParsedToolCall): Pick<ToolCallRecord, 'id' | 'name' | 'arguments'> {
  return { id: call.id, name: call.name, arguments: call.arguments };
}

/** Where a call ran and for how long; one that never ran has neither. */
const NOT_RUN = { source: null, ms: 0 };

function failed(
  call: ParsedToolCall,
  error: ToolErrorKind,
  why: string,
  ran: { source: string | null; ms: number } = NOT_RUN,
): ToolCallRecord {
  return { ...base(call), result: `error: ${why}`, error, source: ran.source, ms: ran.ms };
}

/** The messages a turn's calls add to the conversation: the assistant's message with its calls, then one `tool` message per call. */
export function toolMessagesOf(content: string, records: readonly ToolCallRecord[]): ChatMessage[] {
  return [
    {
      role: 'assistant',
      content,
      tool_calls: records.map((r) => ({
        id: r.id,
        type: 'function' as const,
        function: { name: r.name, arguments: r.arguments },
      })),
    },
    ...records.map((r): ChatMessage => ({ role: 'tool', content: r.result, tool_call_id: r.id })),
  ];
}

/** A tool call a weight update cancelled: the rollout comes back ABORTED (worker/episode-end.ts `interrupts`). */
function cancelledCall(name: string, source: string, cause: unknown): EnvError {
  return new EnvError('ERR_ENV_CANCELLED', `tool ${name} (${source}) was cancelled for a weight update`, { cause });
}

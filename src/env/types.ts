/**
 * The in-process environment interface. Environments are loaded inside worker threads from a module
 * path + export name (see env/loader.ts); the export is a factory called once per episode.
 *
 * The shape follows the env-server protocol in docs/ARCHITECTURE.md ("Environments over HTTP"), so an in-process
 * environment and one behind HTTP are interchangeable: reset → get_task_prompt → step … → close.
 */
import type { ChatMessage } from '../domain/rollout.ts';
import type { ToolSchema } from '../llm/request.ts';

export type { ToolSchema } from '../llm/request.ts';

export type EnvParams = Record<string, unknown>;

export interface ResetOptions {
  /** Same for every rollout of a group, so the k members see the same task. */
  seed: number;
  /** The drawn prompt's parameters (a dataset line, or `{}` for a generator-driven environment). */
  params: EnvParams;
}

export interface ResetResult {
  observation: unknown;
  info?: Record<string, unknown>;
}

/** A multi-agent environment prompts each agent separately: agent id → its conversation. */
export type AgentPrompts = Record<string, ChatMessage[]>;
/** …and takes one action per agent id. */
export type AgentActions = Record<string, string>;

export interface StepResult {
  observation: unknown;
  /** One reward, or one per agent id in a multi-agent environment. */
  reward: number | Record<string, number>;
  terminated: boolean;
  truncated: boolean;
  info?: Record<string, unknown>;
}

type MaybePromise<T> = T | Promise<T>;

/**
 * Tools — the design. An environment that offers tools declares them with `tools()` (OpenAI function
 * schemas), asked once per step after `getTaskPrompt`: the same list every step is a tool set for the
 * episode, a different one a tool set per turn. Tools from the task's MCP servers
 * (`tasks[].tools.mcp`) are added after them (a name the environment already has stays its own).
 *
 * Within one step the agent loop sends the tools, and while the model's reply calls tools it runs the
 * calls — those of one reply concurrently — through `callTool` (or the MCP server owning the name),
 * appends the assistant message with its `tool_calls` and one `tool` message per call (its
 * `tool_call_id`), and asks the model again. The step ends when the model answers without a call, or
 * after `tasks[].tools.maxCallsPerTurn` calls; then `step` receives the last reply's text as the
 * action, and the tool exchange in `turn.toolMessages` — an environment that builds the conversation
 * itself appends them before its own next message, so the model sees its calls in later steps. The
 * environment ends the episode in `step`, as always.
 *
 * A call that cannot run or fails — arguments that are not a JSON object, an unknown tool, a
 * `callTool` that throws or takes longer than `tasks[].tools.timeoutMs` — is answered with an
 * `error: …` tool message the model sees, recorded on the turn (TurnRecord.toolCalls) and counted on
 * the rollout (`tools.errors`); it never fails the rollout. Each inference call of a step is a turn
 * of its own: tool results are in the next turn's prompt, never in a response the loss covers.
 */
export interface ToolCallRequest {
  /** The call's id (the server's, or the engine's in tokens mode): the `tool_call_id` of its result. */
  id: string;
  name: string;
  /** The arguments, parsed: always a JSON object (anything else never reaches the environment). */
  arguments: Record<string, unknown>;
}

/** A tool's result: its text, or the text and whether it is an error (shown the same; counted as an error). */
export type ToolOutput = string | { content: string; isError?: boolean };

/** What `step` is told of the step besides the action. */
export interface StepContext {
  /** The step's tool exchange, in order: each assistant message with `tool_calls`, then its `tool` messages. Empty without calls. */
  toolMessages: ChatMessage[];
}

export interface Environment {
  reset(options: ResetOptions): MaybePromise<ResetResult>;
  /**
   * The conversation so far as OpenAI chat messages; an empty array ends the episode. A multi-agent
   * environment returns one conversation per agent id (an empty object, or all empty, ends it).
   */
  getTaskPrompt(): MaybePromise<ChatMessage[] | AgentPrompts>;
  /** The model's reply; a multi-agent environment receives one reply per agent id it prompted. */
  step(action: string | AgentActions, turn?: StepContext): MaybePromise<StepResult>;
  close?(): MaybePromise<void>;
  /** Optional: the tools the model may call this step (see "Tools" above); single-agent environments only. */
  tools?(): MaybePromise<ToolSchema[]>;
  /**
   * Runs one tool call of the model's. `signal` aborts when the call timed out or the rollout was
   * cancelled: a long call should stop then. Calls of one reply run concurrently.
   */
  callTool?(call: ToolCallRequest, signal: AbortSignal): MaybePromise<ToolOutput>;
  /**
   * Optional: checks one drawn prompt's params (a dataset line, `seed` removed) as `reset` would read
   * them, and throws an Error naming the field and the value when `reset` would refuse them or silently
   * ignore one (a misspelt field). The engine calls it at start, on an instance made for the check
   * with the task's `env.params`, for every line of the task's dataset, and refuses to start naming
   * the first bad line (`task t dataset d.jsonl:3: …`) — instead of failing those groups, or training
   * on random tasks, hours later. Synchronous and without side effects; the built-in environments
   * implement it (their fields: guess-number `min`, `max`, `target`; arithmetic `expression`).
   */
  checkResetParams?(params: EnvParams): void;
}

/**
 * What an environment module exports: called with the task's configured `env.params` (not the drawn
 * prompt — that arrives in `reset`). One call per episode, so instances never share state.
 */
export type EnvironmentFactory = (params: EnvParams) => Environment;

/**
 * The in-process environment interface. Environments are loaded inside worker threads from a module
 * path + export name (see env/loader.ts); the export is a factory called once per episode.
 *
 * The shape follows the env-server protocol in docs/ARCHITECTURE.md ("Environments over HTTP"), so an in-process
 * environment and one behind HTTP are interchangeable: reset → get_task_prompt → step … → close.
 */
import type { ChatMessage } from '../domain/rollout.ts';

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

export interface Environment {
  reset(options: ResetOptions): MaybePromise<ResetResult>;
  /**
   * The conversation so far as OpenAI chat messages; an empty array ends the episode. A multi-agent
   * environment returns one conversation per agent id (an empty object, or all empty, ends it).
   */
  getTaskPrompt(): MaybePromise<ChatMessage[] | AgentPrompts>;
  /** The model's reply; a multi-agent environment receives one reply per agent id it prompted. */
  step(action: string | AgentActions): MaybePromise<StepResult>;
  close?(): MaybePromise<void>;
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

/**
 * The protocols an environment server may speak, and the options each cannot honour. env/http-env.ts
 * speaks `rollout` and `safactory` side by side (`auto` tells them apart); env/openenv.ts OpenEnv's
 * WebSocket sessions; env/nemo-gym.ts NeMo Gym's resources servers; env/gym-http.ts `gym-http`
 * (openai/gym-http-api's REST routes); env/verifiers.ts `verifiers` (env-serve v1 over ZMQ, `tcp://`
 * URLs: the server runs whole episodes). Shared by the config check, for a configured protocol, and by
 * the clients: kept apart from them so that validating a config does not load undici.
 */
import { preview } from '../errors.ts';
import type { EnvParams } from './types.ts';

export const ENV_PROTOCOLS = ['auto', 'rollout', 'safactory', 'openenv', 'nemo-gym', 'gym-http', 'verifiers'] as const;
export type EnvProtocolSetting = (typeof ENV_PROTOCOLS)[number];
export type EnvProtocol = Exclude<EnvProtocolSetting, 'auto'>;

/**
 * How the model's reply becomes a gym-http action (`env.gym.action`): `text`, the reply as it
 * is (a JSON string); `integer`, the last integer in it (a Discrete action); `json`, the reply parsed
 * as JSON (a Box action as a list, or any value the server takes).
 */
export const GYM_ACTIONS = ['text', 'integer', 'json'] as const;
export type GymAction = (typeof GYM_ACTIONS)[number];

/** `env.gym`: what a gym-http episode needs besides the routes (env/gym-http.ts). */
export interface GymHttpSettings {
  action: GymAction;
  /** A system message put before the first observation; null: none. */
  system: string | null;
}

export interface ProtocolConflict {
  /** The option, as HttpEnvOptions names it (`params` is the task's `env.params`). */
  option: 'dedupeSteps' | 'params' | 'params.dataset';
  why: string;
  value: unknown;
}

/** Protocols whose servers apply every step they receive: a step cannot be deduplicated, so never retried. */
const NO_STEP_INDEX: Partial<Record<EnvProtocol, string>> = {
  safactory:
    'a Safactory server applies every step it receives (its step route takes no step index), so it cannot deduplicate steps',
  openenv:
    'an OpenEnv server applies every step it receives (a step message carries no index), so it cannot deduplicate steps',
  'nemo-gym':
    "a NeMo Gym resources server has no step index to deduplicate by (its tool routes take the call's arguments alone)",
  'gym-http':
    'a gym-http server applies every step it receives (its step route takes no step index), so it cannot deduplicate steps',
  verifiers: 'a verifiers server runs whole episodes: there are no steps to deduplicate',
};

/** Protocols whose servers take no `env.params`: sending them anyway would be silently ignored. */
const NO_PARAMS: Partial<Record<EnvProtocol, string>> = {
  rollout:
    'a rollout env-server takes no params from the engine (its environments get theirs from the server: rollout env-server --params)',
  'nemo-gym':
    'a NeMo Gym resources server takes its task from the dataset row alone (POST /seed_session and /verify get the row as it is)',
  'gym-http':
    'a gym-http server makes an instance from its env_id and seed alone (POST /v1/envs/), so params would go unsent',
  verifiers:
    "a verifiers server's run takes the dataset line as task_data and builds its environment from its own config, so params would go unsent",
};

export function protocolConflicts(
  protocol: EnvProtocol,
  options: { dedupeSteps?: boolean; params?: EnvParams },
): ProtocolConflict[] {
  const conflicts: ProtocolConflict[] = [];
  const params = options.params ?? {};
  const noStepIndex = NO_STEP_INDEX[protocol];
  if (noStepIndex !== undefined && options.dedupeSteps === true)
    conflicts.push({ option: 'dedupeSteps', value: true, why: noStepIndex });
  const noParams = NO_PARAMS[protocol];
  if (noParams !== undefined && Object.keys(params).length > 0)
    conflicts.push({ option: 'params', value: params, why: noParams });
  if (protocol === 'safactory' && Object.hasOwn(params, 'dataset'))
    conflicts.push({
      option: 'params.dataset',
      value: params.dataset,
      why: 'Safactory\'s env_param carries the dataset line under "dataset", which would replace this one',
    });
  return conflicts;
}

/** `option: [context] why (got value)`, the form of every config problem. */
export function formatConflict(conflict: ProtocolConflict, context = ''): string {
  return `${conflict.option}: ${context}${conflict.why} (got ${preview(conflict.value)})`;
}

/**
 * How an OpenEnv environment's observations and actions meet the engine's conversation (`env.openenv`;
 * env/openenv.ts reads them). Field names of the server's own Observation and Action models.
 */
export interface OpenEnvSettings {
  /** The step's action is `{[actionField]: the model's reply}` (echo's, TextArena's `message`). */
  actionField: string;
  /**
   * The observation field holding the prompt: chat messages (`[{role, content}]`, the whole
   * conversation, kept by the environment: chat_env's `messages`), or a string (one user message; the
   * engine keeps the conversation: that text, the reply, the next text, …).
   */
  promptField: string;
  /**
   * OpenEnv has no truncation flag (`done` only): an observation field (a boolean) whose true value
   * makes a `done` episode truncated rather than terminated; null: every `done` is terminated.
   */
  truncatedField: string | null;
  /** Offer the environment's MCP tools (tools/list, tools/call on the episode's session) to the model. */
  tools: boolean;
}

export const OPENENV_DEFAULTS: OpenEnvSettings = {
  actionField: 'message',
  promptField: 'messages',
  truncatedField: null,
  tools: false,
};

/**
 * Checks on what an environment returns. Environments are user code (or a remote server): a reply of
 * the wrong shape fails the rollout with the field and the value, instead of corrupting the record.
 */
import type { ChatMessage } from '../protocol/rollout.ts';
import { preview, RolloutEngineError } from '../protocol/errors.ts';
import type { StepResult } from './types.ts';

const ROLES = new Set(['system', 'user', 'assistant', 'tool']);

export class EnvReplyError extends RolloutEngineError {
  constructor(message: string) {
    super('ERR_ENV_BAD_REPLY', message);
    this.name = 'EnvReplyError';
  }
}

export function checkTaskPrompt(value: unknown): ChatMessage[] {
  return checkMessages(value, 'getTaskPrompt()');
}

/** A single conversation, or (multi-agent) an object of agent id → conversation. */
export function checkAgentPrompts(value: unknown): ChatMessage[] | Record<string, ChatMessage[]> {
  if (Array.isArray(value)) return checkMessages(value, 'getTaskPrompt()');
  if (typeof value !== 'object' || value === null)
    throw bad('getTaskPrompt()', value, 'an array of chat messages or an object of agent id → messages');
  for (const [agent, messages] of Object.entries(value)) checkMessages(messages, `getTaskPrompt().${agent}`);
  return value as Record<string, ChatMessage[]>;
}

function checkMessages(value: unknown, field: string): ChatMessage[] {
  if (!Array.isArray(value)) throw bad(field, value, 'an array of chat messages');
  for (let i = 0; i < value.length; i++) {
    const m = value[i] as { role?: unknown; content?: unknown } | null;
    if (typeof m !== 'object' || m === null) throw bad(`${field}[${i}]`, m, 'a chat message object');
    if (typeof m.role !== 'string' || !ROLES.has(m.role))
      throw bad(`${field}[${i}].role`, m.role, 'one of system, user, assistant, tool');
    if (typeof m.content !== 'string') throw bad(`${field}[${i}].content`, m.content, 'a string');
  }
  return value as ChatMessage[];
}

/** Missing reward / flags default like the reference (0 / false); present ones must have the right type. */
export function checkStepResult(value: unknown): StepResult {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw bad('step()', value, 'an object');
  const out = value as Record<string, unknown>;
  const reward = out.reward ?? 0;
  if (typeof reward === 'object' && reward !== null && !Array.isArray(reward)) {
    for (const [agent, r] of Object.entries(reward))
      if (typeof r !== 'number' || !Number.isFinite(r)) throw bad(`step().reward.${agent}`, r, 'a finite number');
  } else if (typeof reward !== 'number' || !Number.isFinite(reward))
    throw bad('step().reward', out.reward, 'a finite number or an object of agent id → number');
  const terminated = out.terminated ?? false;
  if (typeof terminated !== 'boolean') throw bad('step().terminated', out.terminated, 'a boolean');
  const truncated = out.truncated ?? false;
  if (typeof truncated !== 'boolean') throw bad('step().truncated', out.truncated, 'a boolean');
  const info = out.info;
  if (info !== undefined && info !== null && (typeof info !== 'object' || Array.isArray(info)))
    throw bad('step().info', info, 'an object');
  return {
    observation: out.observation,
    reward: reward as StepResult['reward'],
    terminated,
    truncated,
    info: (info ?? undefined) as StepResult['info'],
  };
}

function bad(field: string, value: unknown, expected: string): EnvReplyError {
  return new EnvReplyError(`environment ${field} must be ${expected} (got ${preview(value)})`);
}

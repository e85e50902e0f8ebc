/**
 * guess-number: a multi-turn game with feedback. The agent guesses an integer in [min, max]; each
 * guess is answered "Too low." / "Too high." / "Correct! …". Binary search wins in ⌈log2(range)⌉
 * turns, so with the defaults (1..100, 8 turns) a perfect player always wins and an imperfect one
 * sometimes runs out: rewards vary across a group.
 *
 * Deterministic: the target is drawn from the reset seed only (unless reset params give it).
 */
import type { ChatMessage } from '../../domain/rollout.ts';
import type { Environment, EnvironmentFactory, EnvParams, ResetOptions, ResetResult, StepResult } from '../types.ts';
import { ParamReader, lastInteger } from './params.ts';
import { burnCpu, createRng } from './rng.ts';

const ENV = 'guess-number';
const FACTORY_PARAMS = ['min', 'max', 'maxTurns', 'cpuCostUs'] as const;
/** What a dataset line (reset params) may give: a misspelt field would silently play a random game. */
const RESET_PARAMS = ['min', 'max', 'target'] as const;

export interface GuessNumberParams {
  min?: number;
  max?: number;
  maxTurns?: number;
  cpuCostUs?: number;
}

export const GUESS_NUMBER_DEFAULTS = { min: 1, max: 100, maxTurns: 8, cpuCostUs: 0 } as const;

/** Reward for a reply without any integer: small and negative so "say nothing useful" is not neutral. */
export const NO_INTEGER_REWARD = -0.1;

export const GUESS_NUMBER_SYSTEM_PROMPT =
  'You are playing a number guessing game. Think briefly if you like, then end your reply with your guess as a single integer.';

export const FIRST_GUESS_PROMPT = 'Make your first guess.';

/** The mock policy recognises the game by this sentence; keep them in sync (mock-llm/policy.ts). */
export function guessNumberTaskText(min: number, max: number, maxTurns: number): string {
  return (
    `Let's play a number guessing game. I have picked an integer between ${min} and ${max} (inclusive). ` +
    `You have ${maxTurns} guesses; after each one I will tell you whether it is too low or too high. ` +
    'Reply with a single integer.'
  );
}

/** One system prompt string per task text: thousands of episodes in flight share it instead of each building its own. */
const systemPrompts = new Map<string, string>();
function systemPrompt(task: string): string {
  let prompt = systemPrompts.get(task);
  if (prompt === undefined) {
    if (systemPrompts.size >= 1024) systemPrompts.clear(); // ranges drawn per prompt: keep it bounded
    systemPrompts.set(task, (prompt = `${GUESS_NUMBER_SYSTEM_PROMPT} ${task}`));
  }
  return prompt;
}

export const FEEDBACK = {
  tooLow: 'Too low.',
  tooHigh: 'Too high.',
  noInteger: 'I could not find an integer in your reply. Reply with a single integer.',
} as const;

/** 1 for a first-turn win, 0.05 less per extra turn, never below 0.5 (a win always beats a loss). */
export function winReward(turns: number): number {
  return Math.max(0.5, Math.round((1 - 0.05 * (turns - 1)) * 1000) / 1000);
}

export interface GuessNumberEnvironment extends Environment {
  reset(options: ResetOptions): ResetResult;
  checkResetParams(params: EnvParams): void;
  getTaskPrompt(): ChatMessage[];
  step(action: string): StepResult;
  close(): void;
}

export function createEnv(params: EnvParams = {}): GuessNumberEnvironment {
  const reader = new ParamReader(ENV, 'params', params);
  reader.rejectUnknown(FACTORY_PARAMS);
  const baseMin = reader.int('min', GUESS_NUMBER_DEFAULTS.min);
  const baseMax = reader.int('max', GUESS_NUMBER_DEFAULTS.max);
  if (baseMin > baseMax)
    throw new Error(`${ENV}: params.min must be <= params.max (got min=${baseMin}, max=${baseMax})`);
  const maxTurns = reader.int('maxTurns', GUESS_NUMBER_DEFAULTS.maxTurns, 1, 10_000);
  const cpuCostUs = reader.number('cpuCostUs', GUESS_NUMBER_DEFAULTS.cpuCostUs, 0, 60_000_000);

  let messages: ChatMessage[] = [];
  let min = baseMin;
  let max = baseMax;
  let target = 0;
  let turns = 0;
  // 'idle' before the first reset: stepping then is a caller bug, not an episode end.
  let phase: 'idle' | 'running' | 'done' = 'idle';

  return {
    reset({ seed, params: resetParams }) {
      const reset = readReset(resetParams, baseMin, baseMax);
      min = reset.min;
      max = reset.max;
      target = reset.target ?? createRng(seed).int(min, max);
      turns = 0;
      phase = 'running';
      const task = guessNumberTaskText(min, max, maxTurns);
      // The rules go in the system message: message trimming (messageCut) always keeps it, so the
      // agent still knows the range after the first user turn has been cut away.
      messages = [
        { role: 'system', content: systemPrompt(task) },
        { role: 'user', content: FIRST_GUESS_PROMPT },
      ];
      return { observation: task, info: { min, max, maxTurns } };
    },

    checkResetParams(params) {
      readReset(params, baseMin, baseMax);
    },

    getTaskPrompt() {
      // A copy: the agent loop may append to what it gets without corrupting the episode.
      return phase === 'running' ? messages.slice() : [];
    },

    step(action) {
      if (phase !== 'running') {
        throw new Error(`${ENV}: step called ${phase === 'idle' ? 'before reset' : 'after the episode ended'}`);
      }
      if (cpuCostUs > 0) burnCpu(cpuCostUs);
      turns += 1;
      const guess = lastInteger(action);
      let reward = 0;
      let terminated = false;
      let feedback: string;
      if (guess === null) {
        reward = NO_INTEGER_REWARD;
        feedback = FEEDBACK.noInteger;
      } else if (guess < target) {
        feedback = FEEDBACK.tooLow;
      } else if (guess > target) {
        feedback = FEEDBACK.tooHigh;
      } else {
        terminated = true;
        reward = winReward(turns);
        feedback = `Correct! The number was ${target}; you found it in ${turns} ${turns === 1 ? 'guess' : 'guesses'}.`;
      }
      const truncated = !terminated && turns >= maxTurns;
      if (truncated) feedback += ` Out of guesses: the number was ${target}.`;
      messages.push({ role: 'assistant', content: action }, { role: 'user', content: feedback });
      if (terminated || truncated) phase = 'done';
      return { observation: feedback, reward, terminated, truncated, info: { target, turns, guess, min, max } };
    },

    close() {
      messages = [];
      phase = 'done';
    },
  };
}

/** A drawn prompt's range and target (null: drawn from the seed), the factory's range by default. */
function readReset(
  params: EnvParams,
  baseMin: number,
  baseMax: number,
): { min: number; max: number; target: number | null } {
  const reset = new ParamReader(ENV, 'reset params', params);
  reset.rejectUnknown(RESET_PARAMS);
  const min = reset.int('min', baseMin);
  const max = reset.int('max', baseMax);
  if (min > max) throw new Error(`${ENV}: reset params.min must be <= max (got min=${min}, max=${max})`);
  return { min, max, target: reset.has('target') ? reset.int('target', 0, min, max) : null };
}

createEnv satisfies EnvironmentFactory;

export default createEnv;

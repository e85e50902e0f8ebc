/**
 * echo-digit: a multi-turn task a tiny, randomly initialised character-level policy can learn by RL in
 * minutes on a CPU (examples/grpo_learn.py, docs/LEARNING.md). Each turn the environment shows one
 * digit of `alphabet` (default "012"), written `repeat` times ("22222222"). The turn scores 1 when the
 * reply's first digit character is that digit, `wrongDigit` when it is another digit, 0 without one;
 * the episode's reward is the mean over its `turns` turns, in [0, 1].
 *
 * Why the digit is written several times: a freshly initialised transformer attends almost uniformly,
 * so a digit that fills most of the new message dominates what the reply position reads from the
 * first updates on, instead of waiting for attention to find one character.
 *
 * Why a wrong digit earns nothing by default (`wrongDigit: 0`): credit for any digit is a trap. A policy
 * that answers "1" to a shown 2 earns that credit in every rollout of the group, and a form the whole
 * group shares carries no GRPO signal; the right digit is then sampled too rarely to be found, and the
 * curve stalls at two of three digits (reward 0.73) for a hundred steps and more. Without it, only the
 * right digit is ever reinforced, and the policy learns the short form and the copy together.
 *
 * Why three digits by default: copying is learned from the turns that happen to be right, and one in
 * three is right by chance where one in ten would be with all ten digits (`alphabet: "0123456789"`,
 * the slower task).
 *
 * Every turn's prompt is the whole conversation (run it with `messageCut: 0`), so later turns extend
 * earlier ones: a rollout is one token sequence across its turns.
 *
 * Deterministic: the digits are drawn from the reset seed only (unless reset params give them), so the
 * k rollouts of a group see the same digits.
 */
import type { ChatMessage } from '../../domain/rollout.ts';
import type { Environment, EnvironmentFactory, EnvParams, ResetOptions, ResetResult, StepResult } from '../types.ts';
import { ParamReader } from './params.ts';
import { createRng } from './rng.ts';

const ENV = 'echo-digit';
const FACTORY_PARAMS = ['turns', 'repeat', 'wrongDigit', 'alphabet'] as const;
/** What a dataset line (reset params) may give: a misspelt field would silently draw random digits. */
const RESET_PARAMS = ['digits'] as const;

export interface EchoDigitParams {
  turns?: number;
  repeat?: number;
  wrongDigit?: number;
  alphabet?: string;
}

export const ECHO_DIGIT_DEFAULTS = { turns: 3, repeat: 8, wrongDigit: 0, alphabet: '012' } as const;

/** Bounds that keep one episode's text a few hundred characters at most. */
const MAX_TURNS = 32;
const MAX_REPEAT = 64;

/** The first digit character of `text`, or null. Only ASCII digits count: the task is printable ASCII. */
export function firstDigit(text: string): number | null {
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code >= 48 && code <= 57) return code - 48;
  }
  return null;
}

export interface EchoDigitEnvironment extends Environment {
  reset(options: ResetOptions): ResetResult;
  checkResetParams(params: EnvParams): void;
  getTaskPrompt(): ChatMessage[];
  step(action: string): StepResult;
  close(): void;
}

export function createEnv(params: EnvParams = {}): EchoDigitEnvironment {
  const reader = new ParamReader(ENV, 'params', params);
  reader.rejectUnknown(FACTORY_PARAMS);
  const turns = reader.int('turns', ECHO_DIGIT_DEFAULTS.turns, 1, MAX_TURNS);
  const repeat = reader.int('repeat', ECHO_DIGIT_DEFAULTS.repeat, 1, MAX_REPEAT);
  const wrongDigit = reader.number('wrongDigit', ECHO_DIGIT_DEFAULTS.wrongDigit, 0, 1);
  const alphabet = reader.string('alphabet') ?? ECHO_DIGIT_DEFAULTS.alphabet;
  if (!/^[0-9]+$/.test(alphabet) || new Set(alphabet).size !== alphabet.length)
    reader.fail('alphabet', 'must be distinct digits, e.g. "012"');

  let messages: ChatMessage[] = [];
  let digits: number[] = [];
  let turn = 0;
  let phase: 'idle' | 'running' | 'done' = 'idle';
  const shown = (digit: number): string => String(digit).repeat(repeat);

  return {
    reset({ seed, params: resetParams }) {
      const given = readResetDigits(resetParams, turns);
      if (given !== null) digits = given;
      else {
        const rng = createRng(seed);
        digits = Array.from({ length: turns }, () => alphabet.charCodeAt(rng.int(0, alphabet.length - 1)) - 48);
      }
      turn = 0;
      phase = 'running';
      messages = [{ role: 'user', content: shown(digits[0]) }];
      return { observation: messages[0].content, info: { digits: digits.join(''), turns, repeat } };
    },

    checkResetParams(params) {
      readResetDigits(params, turns);
    },

    getTaskPrompt() {
      // A copy: the agent loop may append to what it gets without corrupting the episode.
      return phase === 'running' ? messages.slice() : [];
    },

    step(action) {
      if (phase !== 'running') {
        throw new Error(`${ENV}: step called ${phase === 'idle' ? 'before reset' : 'after the episode ended'}`);
      }
      const expected = digits[turn];
      const answer = firstDigit(action);
      const correct = answer === expected;
      turn += 1;
      const terminated = turn >= turns;
      // The next digit is the observation; the last step's says the episode is over (it is never sent).
      const observation = terminated ? 'Done.' : shown(digits[turn]);
      messages.push({ role: 'assistant', content: action });
      if (terminated) phase = 'done';
      else messages.push({ role: 'user', content: observation });
      return {
        observation,
        reward: (correct ? 1 : answer === null ? 0 : wrongDigit) / turns,
        terminated,
        truncated: false,
        info: { turn, expected, answer, correct },
      };
    },

    close() {
      messages = [];
      phase = 'done';
    },
  };
}

/** A drawn prompt's own digits (one per turn, e.g. "385", any digits); null when the seed draws them. */
function readResetDigits(params: EnvParams, turns: number): number[] | null {
  const reset = new ParamReader(ENV, 'reset params', params);
  reset.rejectUnknown(RESET_PARAMS);
  const given = reset.string('digits');
  if (given === undefined) return null;
  if (given.length !== turns || !/^[0-9]+$/.test(given))
    reset.fail('digits', `must be ${turns} digit${turns === 1 ? '' : 's'}, one per turn`);
  return Array.from(given, (c) => c.charCodeAt(0) - 48);
}

createEnv satisfies EnvironmentFactory;

export default createEnv;

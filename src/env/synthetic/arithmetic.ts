/**
 * arithmetic: a single-turn task with a verifiable reward. The agent computes an integer expression
 * such as `37 + 45 * 2 - 8` (usual precedence: * before + and -, no parentheses); reward 1 for the
 * exact value, else 0, and the episode ends after one step.
 *
 * Deterministic: the expression is drawn from the reset seed only (unless reset params give it).
 */
import type { ChatMessage } from '../../domain/rollout.ts';
import type { Environment, EnvironmentFactory, EnvParams, ResetOptions, ResetResult, StepResult } from '../types.ts';
import { ParamReader, lastInteger, show } from './params.ts';
import { burnCpu, createRng } from './rng.ts';
import type { Rng } from './rng.ts';

const ENV = 'arithmetic';
const FACTORY_PARAMS = ['terms', 'maxOperand', 'cpuCostUs'] as const;
/** What a dataset line (reset params) may give: a misspelt field would silently draw a random sum. */
const RESET_PARAMS = ['expression'] as const;

export interface ArithmeticParams {
  terms?: number;
  maxOperand?: number;
  cpuCostUs?: number;
}

export const ARITHMETIC_DEFAULTS = { terms: 3, maxOperand: 50, cpuCostUs: 0 } as const;

/** Bounds that keep every generated value a safe integer: |value| ≤ 10^6 · 9^9 < 2^53. */
const MAX_TERMS = 10;
const MAX_OPERAND = 1_000_000;
/** Multipliers stay small, like the `45 * 2` in a hand-written exercise, so values stay readable. */
const MAX_MULTIPLIER = 9;

const ARITHMETIC_SYSTEM_PROMPT = 'You are a careful calculator.';

/** The mock policy recognises the task by this sentence; keep them in sync (mock-llm/policy.ts). */
function arithmeticTaskText(expression: string): string {
  return `Compute ${expression}. Answer with the number only.`;
}

/** `a op b op c …` with integer operands (a leading minus allowed) and operators + - *. */
const EXPRESSION = /^\s*-?\d+(?:\s*[-+*]\s*-?\d+)*\s*$/;
const TAIL = /([-+*])\s*(-?\d+)/g;

/**
 * Value of an expression with * before + and -. Throws (naming the expression) on anything else or
 * on a value that is not a safe integer, so a dataset line can never produce a wrong "correct" answer.
 */
export function evaluateExpression(expression: string): number {
  if (!EXPRESSION.test(expression)) {
    throw new Error(`${ENV}: expression must look like "37 + 45 * 2 - 8" (got ${show(expression)})`);
  }
  const head = /^\s*(-?\d+)/.exec(expression)!;
  let sum = 0;
  let term = Number(head[1]);
  for (const [, op, operand] of expression.slice(head[0].length).matchAll(TAIL)) {
    const value = Number(operand);
    if (op === '*') {
      term *= value;
    } else {
      sum += term;
      term = op === '+' ? value : -value;
    }
    if (!Number.isSafeInteger(term) || !Number.isSafeInteger(sum)) {
      throw new Error(`${ENV}: expression value exceeds 2^53 (got ${show(expression)})`);
    }
  }
  const result = sum + term;
  if (!Number.isSafeInteger(result)) throw new Error(`${ENV}: expression value exceeds 2^53 (got ${show(expression)})`);
  return result === 0 ? 0 : result; // normalise -0
}

function drawExpression(rng: Rng, terms: number, maxOperand: number): string {
  let expression = String(rng.int(1, maxOperand));
  for (let i = 1; i < terms; i++) {
    const op = rng.pick(['+', '-', '*'] as const);
    const operand =
      op === '*' ? rng.int(Math.min(2, maxOperand), Math.min(MAX_MULTIPLIER, maxOperand)) : rng.int(1, maxOperand);
    expression += ` ${op} ${operand}`;
  }
  return expression;
}

export interface ArithmeticEnvironment extends Environment {
  reset(options: ResetOptions): ResetResult;
  checkResetParams(params: EnvParams): void;
  getTaskPrompt(): ChatMessage[];
  step(action: string): StepResult;
  close(): void;
}

export function createEnv(params: EnvParams = {}): ArithmeticEnvironment {
  const reader = new ParamReader(ENV, 'params', params);
  reader.rejectUnknown(FACTORY_PARAMS);
  const terms = reader.int('terms', ARITHMETIC_DEFAULTS.terms, 2, MAX_TERMS);
  const maxOperand = reader.int('maxOperand', ARITHMETIC_DEFAULTS.maxOperand, 1, MAX_OPERAND);
  const cpuCostUs = reader.number('cpuCostUs', ARITHMETIC_DEFAULTS.cpuCostUs, 0, 60_000_000);

  let messages: ChatMessage[] = [];
  let expression = '';
  let expected = 0;
  let phase: 'idle' | 'running' | 'done' = 'idle';

  return {
    reset({ seed, params: resetParams }) {
      expression = readResetExpression(resetParams) ?? drawExpression(createRng(seed), terms, maxOperand);
      expected = evaluateExpression(expression);
      phase = 'running';
      const task = arithmeticTaskText(expression);
      messages = [
        { role: 'system', content: ARITHMETIC_SYSTEM_PROMPT },
        { role: 'user', content: task },
      ];
      return { observation: task, info: { expression } };
    },

    checkResetParams(params) {
      const given = readResetExpression(params);
      if (given !== null) evaluateExpression(given);
    },

    getTaskPrompt() {
      return phase === 'running' ? messages.slice() : [];
    },

    step(action) {
      if (phase !== 'running') {
        throw new Error(`${ENV}: step called ${phase === 'idle' ? 'before reset' : 'after the episode ended'}`);
      }
      if (cpuCostUs > 0) burnCpu(cpuCostUs);
      const answer = lastInteger(action);
      const correct = answer === expected;
      phase = 'done';
      return {
        observation: correct ? 'Correct.' : `Incorrect: ${expression} = ${expected}.`,
        reward: correct ? 1 : 0,
        terminated: true,
        truncated: false,
        info: { expression, expected, answer, correct },
      };
    },

    close() {
      messages = [];
      phase = 'done';
    },
  };
}

/** A drawn prompt's own expression, trimmed; null when the seed draws one. */
function readResetExpression(params: EnvParams): string | null {
  const reset = new ParamReader(ENV, 'reset params', params);
  reset.rejectUnknown(RESET_PARAMS);
  const given = reset.string('expression');
  if (given === undefined) return null;
  if (!EXPRESSION.test(given)) reset.fail('expression', 'must look like "37 + 45 * 2 - 8"');
  return given.trim();
}

createEnv satisfies EnvironmentFactory;

export default createEnv;

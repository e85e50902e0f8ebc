/**
 * Built-in synthetic environments: shipped for load tests and the default demo run, deterministic
 * under the reset seed, and recognised by the mock inference server's policy (testing/mock-llm).
 */
export { createEnv as createGuessNumberEnv, GUESS_NUMBER_DEFAULTS } from './guess-number.ts';
export type { GuessNumberEnvironment, GuessNumberParams } from './guess-number.ts';
export { createEnv as createArithmeticEnv, ARITHMETIC_DEFAULTS, evaluateExpression } from './arithmetic.ts';
export type { ArithmeticEnvironment, ArithmeticParams } from './arithmetic.ts';
export { burnCpu, createRng, mixSeeds } from './rng.ts';
export type { Rng } from './rng.ts';
export { lastInteger } from './params.ts';

/**
 * Builtin name → module file basename in this folder. Each module exports its factory as `createEnv`
 * and as `default`. A name, not an import, so workers load only the environment they run.
 */
export const SYNTHETIC_ENVS = {
  'guess-number': 'guess-number',
  arithmetic: 'arithmetic',
} as const;
export type SyntheticEnvName = keyof typeof SYNTHETIC_ENVS;

export function isSyntheticEnvName(name: string): name is SyntheticEnvName {
  return Object.hasOwn(SYNTHETIC_ENVS, name);
}

/**
 * URL of a builtin's module, with the extension this file was loaded with: `.ts` under tsx in the
 * repo, `.js` from the compiled `dist/` a library consumer runs.
 */
export function syntheticEnvModuleUrl(name: SyntheticEnvName): URL {
  const ext = import.meta.url.endsWith('.ts') ? '.ts' : '.js';
  return new URL(`./${SYNTHETIC_ENVS[name]}${ext}`, import.meta.url);
}

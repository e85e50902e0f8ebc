/**
 * Built-in synthetic environments: shipped for load tests and the default demo run, deterministic
 * under the reset seed, and recognised by the mock inference server's policy (mock-llm).
 * Configs name them `builtin:<name>`; the name → module map is `BUILTIN_ENVS` in src/config.ts.
 */
export { createEnv as createGuessNumberEnv, GUESS_NUMBER_DEFAULTS } from './guess-number.ts';
export type { GuessNumberEnvironment, GuessNumberParams } from './guess-number.ts';
export { createEnv as createArithmeticEnv, ARITHMETIC_DEFAULTS, evaluateExpression } from './arithmetic.ts';
export type { ArithmeticEnvironment, ArithmeticParams } from './arithmetic.ts';
export { createEnv as createEchoDigitEnv, ECHO_DIGIT_DEFAULTS, firstDigit } from './echo-digit.ts';
export type { EchoDigitEnvironment, EchoDigitParams } from './echo-digit.ts';
export { burnCpu, createRng, mixSeeds } from './rng.ts';
export type { Rng } from './rng.ts';
export { lastInteger } from './params.ts';

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createEnv as createArithmetic, evaluateExpression } from '../src/env/synthetic/arithmetic.ts';
import { createEnv as createGuessNumber, NO_INTEGER_REWARD, winReward } from '../src/env/synthetic/guess-number.ts';
import { resolveConfig, BUILTIN_ENVS } from '../src/config.ts';
import { lastInteger } from '../src/env/synthetic/params.ts';
import { createRng } from '../src/env/synthetic/rng.ts';

/** The target of a guess-number episode, read back through the public step info. */
function targetOf(seed: number, params: Record<string, unknown> = {}): number {
  const env = createGuessNumber(params);
  env.reset({ seed, params: {} });
  return env.step('no idea').info!.target as number;
}

describe('seeded rng', () => {
  it('repeats the same sequence for the same seed and stays within int bounds', () => {
    const a = createRng(123);
    const b = createRng(123);
    const c = createRng(124);
    const seqA = Array.from({ length: 20 }, () => a.int(-5, 5));
    assert.deepEqual(
      seqA,
      Array.from({ length: 20 }, () => b.int(-5, 5)),
    );
    assert.notDeepEqual(
      seqA,
      Array.from({ length: 20 }, () => c.int(-5, 5)),
    );
    assert.ok(seqA.every((x) => x >= -5 && x <= 5));
  });
});

describe('guess-number', () => {
  it('draws the same target for the same seed and different targets across seeds', () => {
    assert.equal(targetOf(7), targetOf(7));
    const targets = new Set(Array.from({ length: 30 }, (_, seed) => targetOf(seed)));
    assert.ok(targets.size > 10, `only ${targets.size} distinct targets over 30 seeds`);
    for (const t of targets) assert.ok(t >= 1 && t <= 100);
  });

  it('states the range and turn budget in the system message, which message trimming always keeps', () => {
    const env = createGuessNumber({ min: 3, max: 9, maxTurns: 4 });
    env.reset({ seed: 1, params: {} });
    const prompt = env.getTaskPrompt();
    assert.deepEqual(
      prompt.map((m) => m.role),
      ['system', 'user'],
    );
    assert.match(prompt[0].content, /between 3 and 9/);
    assert.match(prompt[0].content, /4 guesses/);
  });

  it('terminates with reward 1 on a correct first guess, reading the last integer of the reply', () => {
    const env = createGuessNumber();
    env.reset({ seed: 0, params: { target: 42 } });
    const result = env.step('Between 1 and 100 I pick 42');
    assert.equal(result.terminated, true);
    assert.equal(result.truncated, false);
    assert.equal(result.reward, 1);
    assert.deepEqual({ ...result.info }, { target: 42, turns: 1, guess: 42, min: 1, max: 100 });
    assert.match(String(result.observation), /^Correct!/);
    assert.deepEqual(env.getTaskPrompt(), []);
  });

  it('appends the action and Too low / Too high feedback to the conversation', () => {
    const env = createGuessNumber();
    env.reset({ seed: 0, params: { target: 50 } });
    assert.equal(env.step('10').observation, 'Too low.');
    assert.equal(env.step('90').observation, 'Too high.');
    const prompt = env.getTaskPrompt();
    assert.deepEqual(
      prompt.slice(2).map((m) => [m.role, m.content]),
      [
        ['assistant', '10'],
        ['user', 'Too low.'],
        ['assistant', '90'],
        ['user', 'Too high.'],
      ],
    );
  });

  it('decays the win reward with the number of turns but keeps a win above zero', () => {
    const env = createGuessNumber();
    env.reset({ seed: 0, params: { target: 5 } });
    env.step('1');
    env.step('9');
    const win = env.step('5');
    assert.equal(win.reward, winReward(3));
    assert.ok(win.reward < 1 && win.reward > 0);
    assert.equal(winReward(1000), 0.5);
  });

  it('truncates after maxTurns wrong guesses and then returns an empty prompt', () => {
    const env = createGuessNumber({ maxTurns: 3 });
    env.reset({ seed: 0, params: { target: 77 } });
    assert.equal(env.step('1').truncated, false);
    assert.equal(env.step('2').truncated, false);
    const last = env.step('3');
    assert.equal(last.truncated, true);
    assert.equal(last.terminated, false);
    assert.equal(last.reward, 0);
    assert.deepEqual(env.getTaskPrompt(), []);
    assert.throws(() => env.step('77'), /guess-number: step called after the episode ended/);
  });

  it('gives a small negative reward and says so when the reply has no integer', () => {
    const env = createGuessNumber();
    env.reset({ seed: 0, params: { target: 3 } });
    const result = env.step('I am not sure.');
    assert.equal(result.reward, NO_INTEGER_REWARD);
    assert.ok(result.reward < 0);
    assert.equal(result.info!.guess, null);
    assert.match(String(result.observation), /could not find an integer/);
  });

  it('lets reset params override the range and the target', () => {
    const env = createGuessNumber();
    env.reset({ seed: 0, params: { min: -10, max: -1 } });
    const target = env.step('x').info!.target as number;
    assert.ok(target >= -10 && target <= -1);
    assert.throws(
      () => env.reset({ seed: 0, params: { target: 500 } }),
      /reset params\.target must be in \[1, 100\] \(got 500\)/,
    );
  });

  it('burns at least cpuCostUs of CPU per step', () => {
    const env = createGuessNumber({ cpuCostUs: 20_000 });
    env.reset({ seed: 0, params: { target: 1 } });
    const start = performance.now();
    env.step('2');
    assert.ok(performance.now() - start >= 19.9);
  });
});

describe('arithmetic', () => {
  it('draws the same expression for the same seed and different ones across seeds', () => {
    const taskFor = (seed: number): string => {
      const env = createArithmetic();
      env.reset({ seed, params: {} });
      return env.getTaskPrompt()[1].content;
    };
    assert.equal(taskFor(5), taskFor(5));
    assert.ok(new Set(Array.from({ length: 20 }, (_, s) => taskFor(s))).size > 15);
    assert.match(taskFor(5), /^Compute -?\d+( [-+*] \d+){2}\. Answer with the number only\.$/);
  });

  it('evaluates with * before + and -', () => {
    assert.equal(evaluateExpression('37 + 45 * 2 - 8'), 119);
    assert.equal(evaluateExpression('2 - 3 * 4 * 5 + 1'), -57);
    assert.equal(evaluateExpression('3 - -2'), 5);
  });

  it('gives reward 1 for the correct value (negative allowed) and 0 otherwise, ending after one step', () => {
    const env = createArithmetic();
    env.reset({ seed: 0, params: { expression: '3 - 10' } });
    assert.equal(env.getTaskPrompt()[1].content, 'Compute 3 - 10. Answer with the number only.');
    const right = env.step('3 minus 10 is -7');
    assert.deepEqual([right.reward, right.terminated, right.truncated], [1, true, false]);
    assert.deepEqual(env.getTaskPrompt(), []);

    env.reset({ seed: 0, params: { expression: '37 + 45 * 2 - 8' } });
    const wrong = env.step('120');
    assert.deepEqual([wrong.reward, wrong.terminated], [0, true]);
    assert.deepEqual({ ...wrong.info }, { expression: '37 + 45 * 2 - 8', expected: 119, answer: 120, correct: false });
  });

  it('rejects a malformed expression in reset params, naming it', () => {
    const env = createArithmetic();
    assert.throws(
      () => env.reset({ seed: 0, params: { expression: '2 + (3)' } }),
      /arithmetic: reset params\.expression must look like .* \(got "2 \+ \(3\)"\)/,
    );
  });
});

describe('parameter validation and registry', () => {
  it('names the param and the value in factory errors', () => {
    assert.throws(() => createGuessNumber({ min: 10, max: 5 }), {
      message: 'guess-number: params.min must be <= params.max (got min=10, max=5)',
    });
    assert.throws(() => createGuessNumber({ max: 'ten' }), {
      message: 'guess-number: params.max must be an integer (got "ten")',
    });
    assert.throws(() => createGuessNumber({ maxTurns: 0 }), /params\.maxTurns must be in \[1, 10000\] \(got 0\)/);
    assert.throws(
      () => createGuessNumber({ maxTurn: 3 }),
      /unknown params\.maxTurn \(known: min, max, maxTurns, cpuCostUs\)/,
    );
    assert.throws(() => createArithmetic({ terms: 1 }), {
      message: 'arithmetic: params.terms must be in [2, 10] (got 1)',
    });
    assert.throws(
      () => createArithmetic({ cpuCostUs: -1 }),
      /arithmetic: params\.cpuCostUs must be in \[0, 60000000\] \(got -1\)/,
    );
  });

  it('finds the last integer, not a range end glued to a digit', () => {
    assert.equal(lastInteger('range 10-20'), 20);
    assert.equal(lastInteger('it is -5.'), -5);
    assert.equal(lastInteger('no digits'), null);
  });

  it('maps every builtin name to a module exporting createEnv and default as the same factory', async () => {
    for (const name of Object.keys(BUILTIN_ENVS)) {
      const [task] = resolveConfig({ tasks: [{ name: 't', env: { module: `builtin:${name}` } }] }).tasks;
      const mod = (await import(task.env!.moduleUrl!)) as Record<string, unknown>;
      assert.equal(typeof mod.createEnv, 'function', name);
      assert.equal(mod.default, mod.createEnv, name);
    }
  });
});

/**
 * builtin:echo-digit (src/env/synthetic/echo-digit.ts), the task examples/grpo_learn.py trains the
 * reference policy on: its digits, its reward, its conversation, and the errors of its params.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { resolveConfig } from '../src/config.ts';
import { createEnv, ECHO_DIGIT_DEFAULTS, firstDigit } from '../src/env/synthetic/echo-digit.ts';

/** The digits an episode of `seed` shows, read back through the reset info. */
function digitsOf(seed: number, params: Record<string, unknown> = {}): string {
  const env = createEnv(params);
  return env.reset({ seed, params: {} }).info!.digits as string;
}

describe('echo-digit', () => {
  it('draws the same digits for the same seed, one per turn, and other digits for other seeds', () => {
    assert.equal(digitsOf(7), digitsOf(7));
    assert.equal(digitsOf(7).length, ECHO_DIGIT_DEFAULTS.turns);
    assert.deepEqual(ECHO_DIGIT_DEFAULTS, { turns: 3, repeat: 8, wrongDigit: 0, alphabet: '012' });
    assert.equal(digitsOf(7, { turns: 5 }).length, 5);
    const seen = new Set(Array.from({ length: 40 }, (_, seed) => digitsOf(seed)));
    assert.ok(seen.size > 15, `only ${seen.size} of the 27 digit strings over 40 seeds`);
    assert.deepEqual(new Set([...seen].join('')), new Set('012'), 'the default alphabet, every digit of it');
    const wide = Array.from({ length: 40 }, (_, seed) => digitsOf(seed, { alphabet: '0123456789' })).join('');
    assert.equal(new Set(wide).size, 10);
  });

  it('shows the digit written `repeat` times as the only message of the first prompt', () => {
    const env = createEnv({ repeat: 5 });
    const reset = env.reset({ seed: 0, params: { digits: '384' } });
    assert.equal(reset.observation, '33333');
    assert.deepEqual(env.getTaskPrompt(), [{ role: 'user', content: '33333' }]);
  });

  it('scores a turn 1/turns for the shown digit first, wrongDigit/turns for another digit, 0 without one, and ends after the last turn', () => {
    const env = createEnv({ turns: 3, wrongDigit: 0.25 });
    env.reset({ seed: 0, params: { digits: '384' } });
    const first = env.step('x3y7'); // the first digit counts, wherever it is
    assert.equal(first.reward, 1 / 3);
    assert.equal(first.terminated, false);
    assert.deepEqual(first.info, { turn: 1, expected: 3, answer: 3, correct: true });
    const second = env.step('4 then 8'); // 8 was shown: the first digit, 4, is wrong
    assert.equal(second.reward, 0.25 / 3);
    assert.equal(second.info!.answer, 4);
    const third = env.step('no digit');
    assert.equal(third.reward, 0);
    assert.equal(third.info!.answer, null);
    assert.equal(third.terminated, true);
    assert.equal(third.truncated, false);
    assert.deepEqual(env.getTaskPrompt(), [], 'nothing to prompt once the episode ended');
  });

  it('extends one conversation: each prompt is the previous one plus the reply and the next digit', () => {
    const env = createEnv({ turns: 3, repeat: 2 });
    env.reset({ seed: 0, params: { digits: '105' } });
    const first = env.getTaskPrompt();
    env.step('1');
    const second = env.getTaskPrompt();
    assert.deepEqual(second.slice(0, first.length), first);
    assert.deepEqual(second.slice(first.length), [
      { role: 'assistant', content: '1' },
      { role: 'user', content: '00' },
    ]);
    env.step('7');
    assert.deepEqual(env.getTaskPrompt().slice(second.length), [
      { role: 'assistant', content: '7' },
      { role: 'user', content: '55' },
    ]);
  });

  it('writes only printable ASCII (the reference policy has no other characters)', () => {
    const env = createEnv({ turns: 4 });
    env.reset({ seed: 3, params: {} });
    for (let i = 0; i < 3; i++) env.step(`${i}`);
    for (const m of env.getTaskPrompt()) assert.match(m.content, /^[\x20-\x7e]*$/);
  });

  it('reads only ASCII digits as the answer', () => {
    assert.equal(firstDigit('abc 42'), 4);
    assert.equal(firstDigit('٣ then 7'), 7); // an Arabic-Indic three is not a digit of the task
    assert.equal(firstDigit(''), null);
  });

  it('refuses bad params and reset params, naming the field and the value', () => {
    assert.throws(() => createEnv({ turns: 0 }), { message: 'echo-digit: params.turns must be in [1, 32] (got 0)' });
    assert.throws(() => createEnv({ repeat: 'many' }), {
      message: 'echo-digit: params.repeat must be an integer (got "many")',
    });
    assert.throws(() => createEnv({ turn: 3 }), {
      message: 'echo-digit: unknown params.turn (known: turns, repeat, wrongDigit, alphabet)',
    });
    assert.throws(() => createEnv({ alphabet: '011' }), {
      message: 'echo-digit: params.alphabet must be distinct digits, e.g. "012" (got "011")',
    });
    assert.throws(() => createEnv({ alphabet: '' }), /params\.alphabet must be distinct digits/);
    assert.throws(() => createEnv({ wrongDigit: 2 }), {
      message: 'echo-digit: params.wrongDigit must be in [0, 1] (got 2)',
    });
    const env = createEnv({ turns: 2 });
    assert.throws(() => env.checkResetParams({ digits: '123' }), {
      message: 'echo-digit: reset params.digits must be 2 digits, one per turn (got "123")',
    });
    assert.throws(() => env.checkResetParams({ digits: '1a' }), /reset params\.digits must be 2 digits/);
    assert.throws(() => env.checkResetParams({ digit: '12' }), /unknown reset params\.digit \(known: digits\)/);
    env.checkResetParams({ digits: '09' });
  });

  it('refuses a step before reset and after the end', () => {
    const env = createEnv({ turns: 1 });
    assert.throws(() => env.step('1'), { message: 'echo-digit: step called before reset' });
    env.reset({ seed: 0, params: {} });
    env.step('1');
    assert.throws(() => env.step('1'), { message: 'echo-digit: step called after the episode ended' });
  });

  it('is a built-in environment: builtin:echo-digit resolves to this module', async () => {
    const [task] = resolveConfig({ tasks: [{ name: 't', env: { module: 'builtin:echo-digit' } }] }).tasks;
    const mod = (await import(task.env!.moduleUrl!)) as Record<string, unknown>;
    assert.equal(mod.default, createEnv);
  });
});

/**
 * Parameter checking shared by the synthetic environments. Every error names the environment, the
 * parameter and the offending value, because these errors surface far from where the config was written
 * (inside a worker thread, in a FAILED rollout's error string).
 */
import type { EnvParams } from '../types.ts';

/** Short, unambiguous rendering of a bad value for an error message (strings quoted, long ones cut). */
export function show(value: unknown): string {
  let text: string;
  if (typeof value === 'string') text = JSON.stringify(value);
  else if (typeof value === 'number' || typeof value === 'boolean' || value == null) text = String(value);
  else if (Array.isArray(value)) text = value.length === 0 ? 'an empty array' : `an array of ${value.length}`;
  else if (typeof value === 'object') text = 'an object';
  else text = typeof value;
  return text.length > 60 ? `${text.slice(0, 57)}...` : text;
}

export class ParamReader {
  readonly env: string;
  /** "params" for factory params, "reset params" for the drawn prompt's params. */
  readonly where: string;
  readonly params: EnvParams;

  constructor(env: string, where: string, params: unknown) {
    this.env = env;
    this.where = where;
    if (params === undefined || params === null) params = {};
    if (typeof params !== 'object' || Array.isArray(params)) {
      throw new Error(`${env}: ${where} must be an object (got ${show(params)})`);
    }
    this.params = params as EnvParams;
  }

  fail(key: string, rule: string): never {
    throw new Error(`${this.env}: ${this.where}.${key} ${rule} (got ${show(this.params[key])})`);
  }

  /** Factory params are a written config, so a typo ("maxTurn") should fail loudly, not be ignored. */
  rejectUnknown(known: readonly string[]): void {
    for (const key of Object.keys(this.params)) {
      if (!known.includes(key)) {
        throw new Error(`${this.env}: unknown ${this.where}.${key} (known: ${known.join(', ')})`);
      }
    }
  }

  has(key: string): boolean {
    return this.params[key] !== undefined;
  }

  int(key: string, fallback: number, min = Number.MIN_SAFE_INTEGER, max = Number.MAX_SAFE_INTEGER): number {
    const value = this.params[key];
    if (value === undefined) return fallback;
    if (typeof value !== 'number' || !Number.isSafeInteger(value)) this.fail(key, 'must be an integer');
    if (value < min || value > max) this.fail(key, `must be in [${min}, ${max}]`);
    return value;
  }

  number(key: string, fallback: number, min: number, max: number): number {
    const value = this.params[key];
    if (value === undefined) return fallback;
    if (typeof value !== 'number' || !Number.isFinite(value)) this.fail(key, 'must be a finite number');
    if (value < min || value > max) this.fail(key, `must be in [${min}, ${max}]`);
    return value;
  }

  string(key: string): string | undefined {
    const value = this.params[key];
    if (value === undefined) return undefined;
    if (typeof value !== 'string') this.fail(key, 'must be a string');
    return value;
  }
}

/** An integer not glued to a preceding digit, so "10-20" yields 20 (a range), not -20. */
const INTEGER = /(?<!\d)-?\d+/g;

/**
 * The last integer in a model reply, or null. The last one, because replies reason first and answer
 * last ("between 1 and 100 ... I'll guess 50"). Decimals yield their fractional digits' integer; values
 * beyond 2^53 are treated as no answer rather than silently rounded.
 */
export function lastInteger(text: string): number | null {
  let last: string | null = null;
  for (const match of text.matchAll(INTEGER)) last = match[0];
  if (last === null) return null;
  const value = Number(last);
  return Number.isSafeInteger(value) ? (Object.is(value, -0) ? 0 : value) : null;
}

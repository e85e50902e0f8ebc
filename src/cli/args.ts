/** Small helpers for turning CLI strings into checked values; errors name the flag and the value. */
import { RolloutEngineError } from '../protocol/errors.ts';

export class UsageError extends RolloutEngineError {
  constructor(message: string) {
    super('ERR_USAGE', message);
    this.name = 'UsageError';
  }
}

/** Resolves on the first SIGINT or SIGTERM: a server command's "run until told to stop". */
export function untilSignal(): Promise<void> {
  return new Promise((resolve) => {
    process.once('SIGINT', () => resolve());
    process.once('SIGTERM', () => resolve());
  });
}

export function intFlag(name: string, value: string | undefined, { min = 0, max = Infinity } = {}): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max) {
    throw new UsageError(
      `--${name} must be an integer ${max === Infinity ? `>= ${min}` : `in [${min}, ${max}]`} (got ${JSON.stringify(value)})`,
    );
  }
  return n;
}

/** A TCP port to listen on (0: any free one). */
export function portFlag(value: string | undefined): number | undefined {
  return intFlag('port', value, { max: 65_535 });
}

export function numberFlag(
  name: string,
  value: string | undefined,
  { min = 0, max = Infinity } = {},
): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isFinite(n) || n < min || n > max)
    throw new UsageError(`--${name} must be a number in [${min}, ${max}] (got ${JSON.stringify(value)})`);
  return n;
}

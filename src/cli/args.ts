/** Small helpers for turning CLI strings into checked values; errors name the flag and the value. */
import { RolloutEngineError } from '../errors.ts';

export class UsageError extends RolloutEngineError {
  constructor(message: string) {
    super('ERR_USAGE', message);
    this.name = 'UsageError';
  }
}

/**
 * Resolves on the first SIGINT or SIGTERM: a server command's "run until told to stop". With
 * `stdinEnd`, also when standard input ends: a parent that holds the other end of a pipe stops its
 * child by closing it, or by dying in any way (SIGKILL included: the kernel closes the pipe).
 */
export function untilSignal({ stdinEnd = false }: { stdinEnd?: boolean } = {}): Promise<void> {
  return new Promise((resolve) => {
    const done = (): void => {
      // A stdin still read would keep the process alive after the command's own shutdown.
      if (stdinEnd) process.stdin.destroy();
      resolve();
    };
    process.once('SIGINT', done);
    process.once('SIGTERM', done);
    if (stdinEnd) {
      process.stdin.once('end', done);
      process.stdin.once('error', done);
      process.stdin.resume();
    }
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

/**
 * Where each server listens when no --port is given: one port per kind, so the engine's control API,
 * a gateway, an env-server and a mock inference server started on one machine with their defaults
 * do not collide (8000 is where vLLM listens by default, which the mock stands in for).
 */
export const DEFAULT_PORTS = { serve: 8100, gateway: 8200, 'env-server': 8300, 'mock-llm': 8000 } as const;

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

/**
 * Engine errors carry a stable `code` (like undici's), so callers branch on codes, not messages.
 */
export class RolloutEngineError extends Error {
  readonly code: string;
  constructor(code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'RolloutEngineError';
    this.code = code;
  }
}

export class ProtocolError extends RolloutEngineError {
  constructor(message: string) {
    super('ERR_PROTOCOL', message);
    this.name = 'ProtocolError';
  }
}

export class ConfigError extends RolloutEngineError {
  /** Each problem as `path: message`, e.g. `tasks[0].groupSize: must be a positive integer (got 0)`. */
  readonly issues: string[];
  constructor(issues: string[]) {
    super('ERR_INVALID_CONFIG', `invalid config:\n  - ${issues.join('\n  - ')}`);
    this.name = 'ConfigError';
    this.issues = issues;
  }
}

/** A value as it appears in an error message: JSON, cut to 80 characters. */
export function preview(value: unknown): string {
  let text: string;
  try {
    text = value === undefined ? 'undefined' : typeof value === 'bigint' ? `${value}n` : (JSON.stringify(value) ?? String(value));
  } catch {
    // BigInts inside objects, cycles, objects without a usable toString: still a message, never a throw.
    try {
      text = String(value);
    } catch {
      text = `[unprintable ${typeof value}]`;
    }
  }
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

/** `code: message` for logs and rollout.error, whatever was thrown. */
export function describeError(err: unknown): string {
  if (err instanceof Error) {
    const code = (err as { code?: unknown }).code;
    return typeof code === 'string' ? `${code}: ${err.message}` : err.message;
  }
  return String(err);
}

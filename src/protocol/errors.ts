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

/** What a failed bind means, in words, by errno: the part of the message a user acts on. */
const LISTEN_CAUSES: Record<string, string> = {
  EADDRINUSE: 'address in use',
  EACCES: 'permission denied',
  EADDRNOTAVAIL: 'address not available on this machine',
  ENOTFOUND: 'host not found',
  EAI_AGAIN: 'host lookup failed',
};

/**
 * A server the engine ships (control API, gateway, env server, mock inference server) could not bind.
 * One message for all of them, `cannot listen on 127.0.0.1:8000: address in use (EADDRINUSE)`, so a
 * port in use reads the same whichever command hit it; `server` says which one it was.
 */
export class ListenError extends RolloutEngineError {
  readonly server: string;
  readonly host: string;
  readonly port: number;
  /** The system's code (EADDRINUSE, EACCES…), or null when the cause carried none. */
  readonly errno: string | null;
  constructor(server: string, host: string, port: number, cause: Error) {
    const errno =
      typeof (cause as NodeJS.ErrnoException).code === 'string' ? (cause as NodeJS.ErrnoException).code! : null;
    const why = errno === null ? cause.message : `${LISTEN_CAUSES[errno] ?? cause.message} (${errno})`;
    super('ERR_LISTEN', `cannot listen on ${host.includes(':') ? `[${host}]` : host}:${port}: ${why}`, { cause });
    this.name = 'ListenError';
    this.server = server;
    this.host = host;
    this.port = port;
    this.errno = errno;
  }
}

/** A value as it appears in an error message: JSON, cut to 80 characters. */
export function preview(value: unknown): string {
  let text: string;
  try {
    // NaN and ±Infinity as themselves: JSON would show them as null, the very value they are not.
    text =
      value === undefined
        ? 'undefined'
        : typeof value === 'bigint'
          ? `${value}n`
          : typeof value === 'number'
            ? String(value)
            : (JSON.stringify(value) ?? String(value));
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

/**
 * The message in an HTTP error body — OpenAI's `{error: {message}}` or `{error: "…"}`, FastAPI's
 * `{detail}`, or a bare `{message}` — else the body's text, cut to `maxLength` characters.
 */
export function serverMessage(text: string, maxLength = 200): string {
  try {
    const parsed = JSON.parse(text) as Record<string, unknown> | null;
    const err = parsed?.error;
    const msg =
      typeof err === 'string'
        ? err
        : ((err as { message?: unknown } | undefined)?.message ?? parsed?.message ?? parsed?.detail);
    if (typeof msg === 'string') return msg;
    if (msg !== undefined) return JSON.stringify(msg);
  } catch {
    // not JSON: the raw text below
  }
  const trimmed = text.trim();
  return trimmed.length > maxLength ? `${trimmed.slice(0, maxLength - 3)}...` : trimmed || '(empty body)';
}

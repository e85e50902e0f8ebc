/**
 * pino loggers. Logs go to stderr so stdout stays for results (summaries, reports) a script can read.
 * Each worker makes one logger with `{ worker }` bound; episodes bind `{ rollout }` only when they log,
 * so the hot path pays nothing at the default level.
 *
 * Format: readable lines (pino-pretty, in-process and synchronous — no transport thread) when stderr is
 * a terminal, JSON lines otherwise; `LOG_FORMAT=json|pretty` overrides. Workers are told the choice,
 * since their own stderr is never a terminal.
 */
import { pino, type Logger } from 'pino';
import { PinoPretty } from 'pino-pretty';

export type { Logger };

/** Whether this process should log readable lines (decided on the main thread). */
export function wantsPrettyLogs(): boolean {
  const format = process.env.LOG_FORMAT;
  if (format === 'json') return false;
  if (format === 'pretty') return true;
  return process.stderr.isTTY === true;
}

export function createLogger(
  level: string = process.env.LOG_LEVEL ?? 'info',
  bindings: Record<string, unknown> = {},
  pretty = wantsPrettyLogs(),
): Logger {
  const destination = pretty
    ? PinoPretty({
        destination: 2,
        sync: true,
        colorize: process.stderr.isTTY === true || process.env.FORCE_COLOR !== undefined,
        ignore: 'pid,hostname',
        translateTime: 'HH:MM:ss.l',
      })
    : pino.destination({ dest: 2, sync: true });
  return pino({ level, base: { pid: process.pid, ...bindings } }, destination);
}

/**
 * pino loggers. Logs go to stderr so stdout stays for results (summaries, reports) a script can read.
 * Each worker makes one logger with `{ worker }` bound; episodes bind `{ rollout }` on a child only when
 * they log, so the hot path pays nothing at the default level.
 */
import { pino, type Logger } from 'pino';

export type { Logger };

export function createLogger(level: string = process.env.LOG_LEVEL ?? 'info', bindings: Record<string, unknown> = {}): Logger {
  return pino({ level, base: { pid: process.pid, ...bindings } }, pino.destination({ dest: 2, sync: true }));
}

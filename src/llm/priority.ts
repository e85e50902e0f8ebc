/**
 * Trajectory-aware scheduling (`llm.priority: trajectory`, docs/SCHEDULING.md): each inference call
 * carries an urgency computed from its trajectory, sent in the server's own `priority` field, so a
 * server with priority scheduling on serves first the calls whose trajectories most need to finish.
 *
 * Urgency is an integer in [0, URGENCY_LEVELS], higher = sooner:
 *
 *   urgency = round(URGENCY_LEVELS × (0.5 × stale + 0.3 × progress + 0.2 × age))
 *
 *   stale    = staleness ÷ bound: how far the oldest token it holds is towards the staleness bound
 *              (0 without a bound, or before its first token), capped at 1 — older first, so a
 *              rollout finishes inside the bound instead of being thrown away past it;
 *   progress = turns done ÷ (turns done + predicted remaining turns), the remaining turns predicted
 *              from the task's running mean of turns per episode (by maxSteps until one has ended),
 *              at least one — the nearly finished first, which also completes groups sooner;
 *   age      = time since the trajectory started ÷ the task's mean episode time (capped at 1): the
 *              tie-breaker between fresh trajectories, older first.
 *
 * Each server reads the field its own way (ServerDialect.priority): vLLM lower first (it gets
 * URGENCY_LEVELS − urgency), SGLang higher first by default (it gets the urgency); llama.cpp's server
 * and OpenAI's API have no such field, and nothing is sent to them.
 */
import type { ServerDialect } from './servers.ts';

export const URGENCY_LEVELS = 100;

export type PriorityMode = 'off' | 'trajectory';

/** What one inference call knows about its trajectory. */
export interface TrajectoryView {
  /** Turns the trajectory has completed before this call. */
  turnsDone: number;
  maxSteps: number;
  /** The task's mean turns per finished episode on this worker; null until one has finished. */
  meanTurns: number | null;
  /** Milliseconds since the trajectory started. */
  ageMs: number;
  /** The task's mean episode time on this worker, ms; null until one has finished. */
  meanEpisodeMs: number | null;
  /** Weight syncs since the oldest token it holds was sampled (0 without tokens). */
  staleness: number;
  /** Syncs a token may age before its rollout expires; null = no bound. */
  staleBound: number | null;
}

const clamp01 = (x: number): number => (x > 1 ? 1 : Math.max(x, 0));

/** The call's urgency, an integer in [0, URGENCY_LEVELS]; higher = to be served sooner. */
export function trajectoryUrgency(t: TrajectoryView): number {
  const stale = t.staleBound === null || t.staleBound <= 0 ? 0 : clamp01(t.staleness / t.staleBound);
  const expected = Math.min(t.maxSteps, Math.max(1, t.meanTurns ?? t.maxSteps));
  const remaining = Math.max(1, Math.min(t.maxSteps - t.turnsDone, expected - t.turnsDone));
  const progress = t.turnsDone / (t.turnsDone + remaining);
  const age = t.meanEpisodeMs === null || t.meanEpisodeMs <= 0 ? 0 : clamp01(t.ageMs / t.meanEpisodeMs);
  return Math.round(URGENCY_LEVELS * (0.5 * stale + 0.3 * progress + 0.2 * age));
}

/** The request field carrying `urgency` in `dialect`'s own reading; empty where the server has none. */
export function priorityFields(dialect: Pick<ServerDialect, 'priority'>, urgency: number | undefined): object {
  if (urgency === undefined || dialect.priority === null) return {};
  return { priority: dialect.priority === 'lower-first' ? URGENCY_LEVELS - urgency : urgency };
}

/**
 * Per task, on one worker: running means of turns and time per finished episode, for the prediction
 * of remaining work. Exponentially weighted (1/16), so it follows a policy whose episodes change.
 */
export class TaskPace {
  readonly #turns = new Map<string, number>();
  readonly #ms = new Map<string, number>();

  episodeEnded(task: string, turns: number, ms: number): void {
    this.#turns.set(task, ewma(this.#turns.get(task), turns));
    if (ms > 0) this.#ms.set(task, ewma(this.#ms.get(task), ms));
  }

  meanTurns(task: string): number | null {
    return this.#turns.get(task) ?? null;
  }

  meanEpisodeMs(task: string): number | null {
    return this.#ms.get(task) ?? null;
  }
}

const ewma = (mean: number | undefined, x: number): number => (mean === undefined ? x : mean + (x - mean) / 16);

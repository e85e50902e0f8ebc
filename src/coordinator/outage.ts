/**
 * Inference outages, seen from the main thread: whether the inference servers are down, how long for,
 * and what becomes of a group whose calls met it.
 *
 * A worker cannot tell an outage from one bad call: a call that fails in a way a down server fails
 * (refused, reset, timed out, 5xx after the client's retries; llm/errors.ts `isOutageError`) comes
 * back ABORTED, its tokens kept, its error marked `ERR_LLM_OUTAGE`. The producer hands such a group
 * here before it lands, and this module asks the servers — a GET of `/v1/models` on every endpoint:
 *
 * - some endpoint answers (any status below 500) and no outage touched the group since its dispatch:
 *   the servers are up, the call was bad on its own, and the group lands FAILED with its reason, as
 *   any failed call does (so a request that always hangs cannot loop for ever);
 * - no endpoint answers: an outage begins (one warn line). The group lands ABORTED and is retried;
 *   new dispatches are held while the endpoints are probed with exponential backoff
 *   (PROBE_BACKOFF_MS up to MAX_PROBE_BACKOFF_MS); the first answer ends it (one info line, with its
 *   duration) and production resumes by itself;
 * - the outage outlasts `llm.outageBudgetMs`: groups that meet it land FAILED naming the option, and
 *   `spentError` is set until getBatch has reported it (then a fresh budget starts).
 *
 * Invariant: every `suspect()` promise settles — when the check or the outage it joined settles, or
 * at close() — so a group handed here always lands and the producer's counts add up.
 */
import { Pool } from 'undici';
import { delay } from '../cancel.ts';
import type { Logger } from '../log.ts';
import { OUTAGE_CODE } from '../llm/errors.ts';
import { RolloutEngineError } from '../errors.ts';
import { failRollout, groupStatus, Status, type RolloutGroup } from '../domain/rollout.ts';
import { serverRoot } from '../llm/servers.ts';

/** First wait between probes of an outage; doubled after each unanswered round. */
export const PROBE_BACKOFF_MS = 500;
/** Probes never wait longer than this apart: a server back is noticed within it. */
export const MAX_PROBE_BACKOFF_MS = 10_000;
/** One probe round gives up on an endpoint after this (an endpoint that does not answer is down). */
const PROBE_TIMEOUT_MS = 5_000;

/**
 * What becomes of a group whose calls met a possible outage. `outage`: it lands ABORTED and is retried;
 * `answering`: the servers answer, so it lands FAILED with its own reason; `spent`: it lands FAILED,
 * the outage having outlasted `llm.outageBudgetMs`.
 */
export type OutageVerdict = 'outage' | 'answering' | 'spent';

export interface OutageStats {
  /** `up`; `checking`: asking the servers after a failed call (dispatches held); `down`: an outage. */
  state: 'up' | 'checking' | 'down';
  /** Milliseconds the current outage has lasted; null when there is none. */
  currentMs: number | null;
  /** Outages since the start, the current one included. */
  outages: number;
  /** Milliseconds spent in outages, the current one included. */
  totalMs: number;
  /** Groups that met an outage and came back ABORTED to be retried (not counted as failures). */
  groupsAborted: number;
  budgetMs: number;
}

/** Told when an outage begins and ends, and of each group it aborted (metrics). */
export interface OutageObserver {
  outageBegan?(): void;
  outageEnded?(durationMs: number): void;
  outageAborted?(group: RolloutGroup): void;
}

export interface OutageMonitorOptions {
  /** Every inference endpoint; an outage is when none answers. */
  endpoints: readonly string[];
  /** `llm.outageBudgetMs`. */
  budgetMs: number;
  log: Logger;
  apiKey?: string | null;
  /** Whether `url` answers (tests); default: GET `/v1/models`, any status below 500. */
  probe?: (url: string) => Promise<boolean>;
  /** Waits between probe rounds (tests); default: a timer, cut short by close(). */
  wait?: (ms: number, signal: AbortSignal) => Promise<void>;
  now?: () => number;
  /** Dispatches were held or released, or the budget was spent: whoever waits on either re-checks. */
  onChange?: () => void;
  observer?: OutageObserver;
}

function isOutageAbort(r: RolloutGroup['rollouts'][number]): boolean {
  return r.status === Status.ABORTED && r.error !== null && r.error.startsWith(OUTAGE_CODE);
}

export class OutageMonitor {
  readonly #options: OutageMonitorOptions;
  readonly #now: () => number;
  readonly #probe: (url: string) => Promise<boolean>;
  readonly #closing = new AbortController();
  /** Every inference endpoint now (setEndpoints changes it while the engine runs). */
  #endpoints: readonly string[];
  /** One connection per endpoint for the default probe, opened on first use. */
  readonly #pools = new Map<string, Pool>();
  #state: OutageStats['state'] = 'up';
  /** Groups waiting for the check in progress, with when each was dispatched. */
  #waiting: { dispatchedAt: number; resolve: (verdict: OutageVerdict) => void }[] = [];
  /** When the current outage began (the failed call that started its check); null when up. */
  #since: number | null = null;
  /** When the last outage ended: a group dispatched before then met it, whatever the servers say now. */
  #lastEnded = -Infinity;
  /** Start of the budget now running: the outage's start, or when getBatch last reported it spent. */
  #budgetFrom = 0;
  #spent: RolloutEngineError | null = null;
  #lastReason = '';
  #outages = 0;
  #endedMs = 0;
  #groupsAborted = 0;

  constructor(options: OutageMonitorOptions) {
    this.#options = options;
    this.#now = options.now ?? (() => performance.now());
    this.#probe = options.probe ?? ((url) => this.#get(url));
    this.#endpoints = options.endpoints;
  }

  /** The endpoints changed (one joined or left the fleet): the next probe asks these. */
  setEndpoints(endpoints: readonly string[]): void {
    this.#endpoints = endpoints;
  }

  /** New dispatches wait: the servers are being checked, or are down. */
  get holding(): boolean {
    return this.#state !== 'up';
  }

  /** Set while the current outage has outlasted `llm.outageBudgetMs` and getBatch has not reported it. */
  get spentError(): RolloutEngineError | null {
    return this.#spent;
  }

  /** getBatch reported the spent budget: the outage (if it goes on) gets a fresh one from now. */
  renewBudget(): void {
    if (this.#spent === null) return;
    this.#spent = null;
    this.#budgetFrom = this.#now();
    this.#options.onChange?.();
  }

  now(): number {
    return this.#now();
  }

  stats(): OutageStats {
    const current = this.#since === null ? null : this.#now() - this.#since;
    return {
      state: this.#state,
      currentMs: current,
      outages: this.#outages,
      totalMs: this.#endedMs + (current ?? 0),
      groupsAborted: this.#groupsAborted,
      budgetMs: this.#options.budgetMs,
    };
  }

  /**
   * A group is back from the workers. Null when it may land now; else it came back ABORTED because a
   * call met a possible outage, and the promise settles once the servers have been asked and its
   * members' statuses say what it lands as. `dispatchedAt`: `now()` at its dispatch.
   */
  arrived(group: RolloutGroup, dispatchedAt: number): Promise<void> | null {
    if (!group.rollouts.some(isOutageAbort)) return null;
    if (groupStatus(group.rollouts) === Status.ABORTED) return this.#settle(group, dispatchedAt);
    // A member failed on its own, so the group fails whole anyway: its marked members read as the
    // calls' own errors, not as an outage that was never confirmed.
    for (const r of group.rollouts) if (isOutageAbort(r)) r.error = r.error!.slice(OUTAGE_CODE.length + 2);
    return null;
  }

  async #settle(group: RolloutGroup, dispatchedAt: number): Promise<void> {
    const reason = group.rollouts.find(isOutageAbort)?.error ?? OUTAGE_CODE;
    this.#lastReason = reason;
    const verdict = await this.#suspect(dispatchedAt);
    if (verdict === 'outage') {
      this.#groupsAborted++;
      this.#options.observer?.outageAborted?.(group);
      return;
    }
    const own = reason.slice(OUTAGE_CODE.length + 2); // the call's own error, as it would have failed before
    for (const r of group.rollouts) {
      if (!isOutageAbort(r)) continue;
      failRollout(r, verdict === 'spent' ? this.#spentMessage(own) : own, 'inference');
    }
    group.status = groupStatus(group.rollouts);
  }

  #suspect(dispatchedAt: number): Promise<OutageVerdict> {
    if (this.#closing.signal.aborted) return Promise.resolve('outage'); // closing: it lands ABORTED, as a cancelled call does
    if (this.#state === 'down')
      return Promise.resolve(this.#spent !== null || this.#budgetLeft() <= 0 ? 'spent' : 'outage');
    if (this.#state === 'up' && dispatchedAt <= this.#lastEnded) return Promise.resolve('outage');
    const verdict = new Promise<OutageVerdict>((resolve) => this.#waiting.push({ dispatchedAt, resolve }));
    if (this.#state === 'up') void this.#check();
    return verdict;
  }

  /** Ask every endpoint once; none answering starts an outage, probed until one does. */
  async #check(): Promise<void> {
    const start = this.#now();
    this.#state = 'checking';
    this.#options.onChange?.();
    if (await this.#anyAnswers()) return this.#up(null);
    if (this.#closing.signal.aborted) return this.#up(null);
    this.#state = 'down';
    this.#since = start;
    this.#budgetFrom = start;
    this.#outages++;
    const { budgetMs } = this.#options;
    this.#options.log.warn(
      { endpoints: this.#endpoints, outageBudgetMs: budgetMs, reason: this.#lastReasonOf() },
      'inference outage: no endpoint answers; new groups are held and the endpoints probed until one does',
    );
    this.#options.observer?.outageBegan?.();
    this.#release(() => (this.#budgetLeft() <= 0 ? 'spent' : 'outage'));
    this.#checkBudget();
    for (let backoff = PROBE_BACKOFF_MS; ; backoff = Math.min(backoff * 2, MAX_PROBE_BACKOFF_MS)) {
      const left = this.#spent === null ? this.#budgetLeft() : Infinity;
      try {
        await (this.#options.wait ?? waitFor)(Math.max(0, Math.min(backoff, left)), this.#closing.signal);
      } catch {
        return this.#up(null); // closing
      }
      if (await this.#anyAnswers()) return this.#up(this.#since);
      if (this.#closing.signal.aborted) return this.#up(null);
      this.#checkBudget();
    }
  }

  #up(outageStart: number | null): void {
    if (outageStart !== null) {
      const ms = this.#now() - outageStart;
      this.#endedMs += ms;
      this.#lastEnded = this.#now();
      this.#options.log.info(
        { durationMs: Math.round(ms), groupsAborted: this.#groupsAborted },
        'inference outage over: an endpoint answers again; production resumes',
      );
      this.#options.observer?.outageEnded?.(ms);
    }
    this.#state = 'up';
    this.#since = null;
    this.#spent = null;
    this.#release((dispatchedAt) => (dispatchedAt <= this.#lastEnded ? 'outage' : 'answering'));
    this.#options.onChange?.();
  }

  #release(verdictFor: (dispatchedAt: number) => OutageVerdict): void {
    const waiting = this.#waiting;
    this.#waiting = [];
    for (const w of waiting) w.resolve(verdictFor(w.dispatchedAt));
  }

  #budgetLeft(): number {
    return this.#options.budgetMs - (this.#now() - this.#budgetFrom);
  }

  #checkBudget(): void {
    if (this.#spent !== null || this.#budgetLeft() > 0) return;
    this.#spent = new RolloutEngineError(OUTAGE_CODE, this.#spentMessage(this.#lastReasonOf()));
    this.#options.log.error({ outageBudgetMs: this.#options.budgetMs }, this.#spent.message);
    this.#options.onChange?.();
  }

  #spentMessage(last: string): string {
    const seconds = Math.round((this.#now() - (this.#since ?? this.#now())) / 1000);
    return `${OUTAGE_CODE}: no inference endpoint has answered for ${seconds} s, more than llm.outageBudgetMs = ${this.#options.budgetMs} allows; last error: ${last}`;
  }

  #lastReasonOf(): string {
    return this.#lastReason.startsWith(OUTAGE_CODE)
      ? this.#lastReason.slice(OUTAGE_CODE.length + 2)
      : this.#lastReason || '(none yet)';
  }

  async #anyAnswers(): Promise<boolean> {
    const answers = await Promise.all(this.#endpoints.map((url) => this.#probe(url).catch(() => false)));
    return answers.includes(true);
  }

  /** Any answer below 500 is a server up: even a 404 or a 401 says it is there to take requests. */
  async #get(url: string): Promise<boolean> {
    if (this.#closing.signal.aborted) return false; // no pool opened after close() closed them
    const base = new URL(url);
    const prefix = serverRoot(base);
    let pool = this.#pools.get(base.origin);
    if (pool === undefined) this.#pools.set(base.origin, (pool = new Pool(base.origin, { connections: 1 })));
    const apiKey = this.#options.apiKey;
    const signal = AbortSignal.any([AbortSignal.timeout(PROBE_TIMEOUT_MS), this.#closing.signal]);
    const response = await pool.request({
      method: 'GET',
      path: `${prefix}/v1/models`,
      headers: apiKey ? { authorization: `Bearer ${apiKey}` } : {},
      signal,
    });
    await response.body.dump();
    return response.statusCode < 500;
  }

  /** Stops probing; groups waiting for a check land ABORTED (to be retried by a later run). */
  async close(): Promise<void> {
    this.#closing.abort();
    this.#release(() => 'outage');
    const pools = [...this.#pools.values()];
    this.#pools.clear();
    await Promise.all(pools.map((p) => p.close()));
  }
}

function waitFor(ms: number, signal: AbortSignal): Promise<void> {
  return delay(ms, signal);
}

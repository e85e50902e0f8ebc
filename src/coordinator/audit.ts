/**
 * The consistency audit: a fraction of the finished rollouts (`audit.fraction`), and any the trainer
 * asks for (`POST /audit`), re-scored on the inference server — the exact prompt and response ids of
 * each turn, in one prefill (llm/score-wire.ts) — and compared with the logprobs recorded when they
 * were sampled. On a consistent path the two agree up to the server's numerical noise; a token sampled
 * on stale KV, a prompt that is not what was sampled on, a dropped token, hidden truncation all show
 * as drift in the segment they hit (audit-segments.ts). docs/AUDIT.md says how to read it.
 *
 * Only tokens of the model step the servers serve now are compared (re-scoring older ones would
 * measure the weight update, not an inconsistency), so rollouts are audited as they land; a pause
 * voids the scoring in flight. Cost is bounded three ways: the fraction, `audit.concurrency` scoring
 * calls at a time, and `audit.maxTokenShare` — the tokens sent for scoring stay under that share of
 * the response tokens generated. The stats report the share and the seconds spent.
 */
import { request } from 'undici';
import type { AuditStats } from '../domain/batch.ts';
import type { RolloutGroup, RolloutState, TurnRecord } from '../domain/rollout.ts';
import { Status, responseTokenCount } from '../domain/rollout.ts';
import { scoreWire, type ScoreRequest } from '../llm/score-wire.ts';
import { serverRoot, type ServerKind } from '../llm/servers.ts';
import type { SamplingParams } from '../llm/token-wire.ts';
import type { Logger } from '../log.ts';
import { Slots } from '../slots.ts';
import {
  auditRollout,
  DeltaSum,
  emptySkips,
  scorable,
  SEGMENT_KINDS,
  SKIP_REASONS,
  tokenStep,
  type DeltaStats,
  type RolloutAudit,
  type SegmentKind,
  type SkipReason,
  type TurnScores,
} from './audit-segments.ts';

export interface AuditSettings {
  /** Share of finished (COMPLETED) rollouts audited as they land; 0 = only on demand. */
  fraction: number;
  /** A segment whose mean |Δ logprob| passes this is flagged and warned of. */
  threshold: number;
  /** Scoring calls in flight at most. */
  concurrency: number;
  /** Tokens sent for scoring stay under this share of the response tokens generated. */
  maxTokenShare: number;
}

export type { AuditStats } from '../domain/batch.ts';

/** Told about each rollout audited (metrics). */
export interface AuditObserver {
  audited?(report: RolloutAudit, cost: { scoredTokens: number; seconds: number }): void;
  auditSkipped?(reason: SkipReason, tokens: number): void;
}

export interface AuditorOptions {
  settings: AuditSettings;
  /** The endpoint that served a turn of a rollout, and its kind. */
  serverFor(rollout: RolloutState, turn: TurnRecord): { url: string; kind: ServerKind; model: string | null };
  /** The model step the servers serve now, and whether production is paused (weights may be changing). */
  serving(): { modelStep: number; paused: boolean };
  apiKey?: string | null;
  timeoutMs?: number;
  log: Logger;
  observer?: AuditObserver;
}

const WORST = 10;
/** Rollouts waiting for a scoring slot at most: more are skipped (budget), not queued without bound. */
const MAX_QUEUED = 256;

class Window {
  readonly total = new DeltaSum();
  readonly kinds = Object.fromEntries(SEGMENT_KINDS.map((k) => [k, new DeltaSum()])) as Record<SegmentKind, DeltaSum>;
  rollouts = 0;
  flagged = 0;
  worst: AuditStats['worst'] = [];
  skipped = emptySkips();
  scoredTokens = 0;
  generatedTokens = 0;
  seconds = 0;

  add(report: RolloutAudit, scoredTokens: number, seconds: number): void {
    this.scoredTokens += scoredTokens;
    this.seconds += seconds;
    for (const reason of SKIP_REASONS) this.skipped[reason] += report.skipped[reason];
    if (report.tokens === 0) return;
    this.rollouts++;
    this.total.merge(report);
    for (const k of SEGMENT_KINDS) this.kinds[k].merge(report.bySegment[k]);
    if (report.flagged.length > 0) {
      this.flagged++;
      const segment = report.segments.find((s) => s.name === report.flagged[0]);
      this.worst.push({
        rolloutId: report.rolloutId,
        segment: report.flagged[0],
        meanAbsDelta: segment?.meanAbsDelta ?? 0,
      });
      this.worst.sort((a, b) => b.meanAbsDelta - a.meanAbsDelta);
      this.worst.length = Math.min(this.worst.length, WORST);
    }
  }

  stats(): AuditStats {
    return {
      rollouts: this.rollouts,
      ...this.total.stats(),
      bySegment: Object.fromEntries(SEGMENT_KINDS.map((k) => [k, this.kinds[k].stats()])) as Record<
        SegmentKind,
        DeltaStats
      >,
      flagged: this.flagged,
      worst: this.worst.slice(),
      skippedTokens: { ...this.skipped },
      cost: {
        scoredTokens: this.scoredTokens,
        generatedTokens: this.generatedTokens,
        tokenShare: this.generatedTokens === 0 ? 0 : this.scoredTokens / this.generatedTokens,
        seconds: this.seconds,
      },
    };
  }
}

/** Whether rollout `id` is among `fraction` of all: a hash of the id, so the same rollouts on every run. */
export function auditSelects(id: string, fraction: number): boolean {
  if (fraction >= 1) return true;
  if (fraction <= 0) return false;
  let h = 0x811c9dc5;
  for (let i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 0x01000193);
  return (h >>> 0) / 2 ** 32 < fraction;
}

export class Auditor {
  readonly settings: AuditSettings;
  readonly #options: AuditorOptions;
  readonly #slots: Slots;
  #window = new Window();
  readonly #run = new Window();
  /** Bumped by each pause: scoring begun before it is void. */
  #epoch = 0;
  #queued = 0;
  readonly #pending = new Set<Promise<unknown>>();
  #closed = false;

  constructor(options: AuditorOptions) {
    this.settings = options.settings;
    this.#options = options;
    this.#slots = new Slots(options.settings.concurrency);
  }

  /** A group landed: its response tokens count toward the budget, and `fraction` of its finished rollouts are audited. */
  landed(group: RolloutGroup): void {
    let tokens = 0;
    for (const r of group.rollouts) tokens += responseTokenCount(r);
    this.#window.generatedTokens += tokens;
    this.#run.generatedTokens += tokens;
    if (this.#closed || this.settings.fraction <= 0) return;
    for (const rollout of group.rollouts) {
      if (rollout.status !== Status.COMPLETED || !auditSelects(rollout.id, this.settings.fraction)) continue;
      const cost = scoredTokenCount(rollout);
      if (
        this.#queued >= MAX_QUEUED ||
        this.#run.scoredTokens + cost > this.settings.maxTokenShare * this.#run.generatedTokens
      ) {
        this.#skip('budget', responseTokenCount(rollout));
        continue;
      }
      this.#track(this.#audit(group, rollout));
    }
  }

  /** Production pauses for a weight update: scoring in flight is void. */
  pausing(): void {
    this.#epoch++;
  }

  /**
   * Audits these rollouts now (the control API's `POST /audit`): the fraction and the token budget do
   * not apply, the concurrency cap does. Their findings count in the stats like the sampled ones.
   */
  async auditNow(items: readonly { group: RolloutGroup; rollout: RolloutState }[]): Promise<RolloutAudit[]> {
    const work = items.map(({ group, rollout }) => this.#audit(group, rollout));
    for (const w of work) this.#track(w);
    return Promise.all(work);
  }

  /** What was found since the last call (a batch's `stats.audit`). */
  takeWindow(): AuditStats {
    const stats = this.#window.stats();
    this.#window = new Window();
    return stats;
  }

  /** Everything since the start. */
  totals(): AuditStats {
    return this.#run.stats();
  }

  /** Resolves once no audit is in flight (close). */
  async idle(): Promise<void> {
    while (this.#pending.size > 0) await Promise.allSettled([...this.#pending]);
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#epoch++;
    await this.idle();
  }

  #track(work: Promise<unknown>): void {
    this.#queued++;
    const done = work.then(
      () => undefined,
      () => undefined,
    );
    this.#pending.add(done);
    void done.finally(() => {
      this.#queued--;
      this.#pending.delete(done);
    });
  }

  #skip(reason: SkipReason, tokens: number): void {
    this.#window.skipped[reason] += tokens;
    this.#run.skipped[reason] += tokens;
    this.#options.observer?.auditSkipped?.(reason, tokens);
  }

  async #audit(group: RolloutGroup, rollout: RolloutState): Promise<RolloutAudit> {
    const skipped = emptySkips();
    const scores: TurnScores = rollout.turns.map(() => null);
    let scoredTokens = 0;
    let seconds = 0;
    let server = '';
    const epoch = this.#epoch;
    const { modelStep } = this.#options.serving();
    await Promise.all(
      rollout.turns.map(async (turn, t) => {
        const n = turn.responseIds?.length ?? 0;
        if (!scorable(turn)) {
          skipped.noIds += n;
          return;
        }
        const current: number[] = [];
        for (let i = 0; i < n; i++) if (tokenStep(turn, i) === modelStep) current.push(i);
        skipped.weightsMoved += n - current.length;
        if (current.length === 0) return;
        const target = this.#options.serverFor(rollout, turn);
        server = target.url;
        const wire = scoreWire(target.kind);
        if (wire === null) {
          skipped.cannotScore += current.length;
          return;
        }
        const prompt = turn.promptIds as Int32Array;
        const response = turn.responseIds as Int32Array;
        const ids = new Array<number>(prompt.length + response.length);
        for (let i = 0; i < prompt.length; i++) ids[i] = prompt[i];
        for (let i = 0; i < response.length; i++) ids[prompt.length + i] = response[i];
        const req: ScoreRequest = { ids, from: prompt.length, sampling: samplingOf(group, turn) };
        await this.#slots.acquire();
        const started = performance.now();
        try {
          if (this.#epoch !== epoch || this.#options.serving().paused) {
            skipped.interrupted += current.length;
            return;
          }
          const values = await this.#post(target.url, wire.path, wire.body(req, target.model), (json) =>
            wire.parse(json, req, (why) => new Error(`${wire.path} at ${target.url}: ${why}`)),
          );
          scoredTokens += ids.length;
          if (this.#epoch !== epoch || this.#options.serving().modelStep !== modelStep) {
            skipped.interrupted += current.length;
            return;
          }
          const row = new Float64Array(n).fill(Number.NaN);
          for (const i of current) row[i] = values[i];
          scores[t] = row;
        } catch (err) {
          skipped.interrupted += current.length;
          this.#options.log.debug(
            { rollout: rollout.id, turn: turn.step, err: (err as Error).message },
            'audit: scoring failed',
          );
        } finally {
          seconds += (performance.now() - started) / 1000;
          this.#slots.release();
        }
      }),
    );
    const report = auditRollout(rollout, scores, { server, modelStep, threshold: this.settings.threshold, skipped });
    for (const w of [this.#window, this.#run]) w.add(report, scoredTokens, seconds);
    for (const reason of SKIP_REASONS)
      if (skipped[reason] > 0) this.#options.observer?.auditSkipped?.(reason, skipped[reason]);
    this.#options.observer?.audited?.(report, { scoredTokens, seconds });
    if (report.flagged.length > 0) {
      const worst = report.segments.find((s) => s.name === report.flagged[0]);
      this.#options.log.warn(
        {
          rollout: report.rolloutId,
          segment: report.flagged[0],
          flagged: report.flagged,
          meanAbsDelta: worst?.meanAbsDelta,
          maxAbsDelta: worst?.maxAbsDelta,
          server: report.server,
        },
        `audit: rollout ${report.rolloutId} drifts in ${report.flagged[0]}: mean |Δ logprob| ${worst?.meanAbsDelta.toFixed(4)} > audit.threshold ${this.settings.threshold} (re-scored on ${report.server}; docs/AUDIT.md)`,
      );
    }
    return report;
  }

  async #post<T>(url: string, path: string, body: Record<string, unknown>, parse: (json: unknown) => T): Promise<T> {
    const base = new URL(url);
    const prefix = serverRoot(base);
    const apiKey = this.#options.apiKey;
    const response = await request(`${base.origin}${prefix}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(this.#options.timeoutMs ?? 120_000),
    });
    const text = await response.body.text();
    if (response.statusCode !== 200) throw new Error(`${path} answered ${response.statusCode}: ${text.slice(0, 300)}`);
    return parse(JSON.parse(text));
  }
}

/** Tokens a rollout's audit sends: each turn's prompt and response. */
export function scoredTokenCount(rollout: RolloutState): number {
  let n = 0;
  for (const t of rollout.turns) if (scorable(t)) n += (t.promptIds?.length ?? 0) + (t.responseIds?.length ?? 0);
  return n;
}

/** The settings a turn was sampled with (its group's record; an agent's own where its policy differs). */
function samplingOf(group: RolloutGroup, turn: TurnRecord): SamplingParams {
  const record = group.sampling;
  if (record === undefined) return { temperature: 1 };
  const shape = (turn.agentId !== null ? record.agents?.[turn.agentId] : undefined) ?? record;
  const { agents: _agents, ...settings } = shape as typeof record;
  return settings;
}

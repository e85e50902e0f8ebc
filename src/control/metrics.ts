/**
 * Prometheus metrics (prom-client) for one engine, on a registry of its own so several engines in one
 * process do not collide. Events arrive through the producer's observer (cheap, synchronous); gauges
 * that need the workers are read at scrape time.
 */
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import type { DropReason } from '../buffer/replay-buffer.ts';
import { rolloutStaleness } from '../buffer/staleness.ts';
import type { DiscardCause, PauseReport, ProducerObserver } from '../coordinator/producer.ts';
import type { EngineStats } from '../coordinator/engine-core.ts';
import { dispatchTokenCount, type RolloutGroup } from '../domain/rollout.ts';
import type { AuditObserver } from '../coordinator/audit.ts';
import type { RolloutAudit, SkipReason } from '../coordinator/audit-segments.ts';

const SECONDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];
const PAUSE_SECONDS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30];

export class EngineMetrics implements ProducerObserver, AuditObserver {
  readonly registry = new Registry();
  readonly #groups = new Counter({
    name: 'rollout_engine_groups_landed_total',
    help: 'Groups back from the workers, by status',
    labelNames: ['status'],
    registers: [this.registry],
  });
  readonly #dropped = new Counter({
    name: 'rollout_engine_groups_dropped_total',
    help: 'Groups counted and let go (FAILED, FILTERED, EXPIRED)',
    labelNames: ['reason'],
    registers: [this.registry],
  });
  readonly #taken = new Counter({
    name: 'rollout_engine_groups_taken_total',
    help: 'Groups handed to the trainer',
    registers: [this.registry],
  });
  readonly #turns = new Counter({
    name: 'rollout_engine_turns_total',
    help: 'Agent turns (inference calls) completed',
    registers: [this.registry],
  });
  readonly #tokens = new Counter({
    name: 'rollout_engine_tokens_total',
    help: 'Response tokens: produced, and wasted (generated then discarded)',
    labelNames: ['kind'],
    registers: [this.registry],
  });
  readonly #wasted = new Counter({
    name: 'rollout_engine_wasted_tokens_total',
    help: 'Response tokens generated then thrown away, by cause: expired (past the staleness bound: reset or dropped), restarted (generated again in the worker: from the prompt, or a step a failure or a pause cut short), dropped (the group failed or was filtered)',
    labelNames: ['cause'],
    registers: [this.registry],
  });
  readonly #latency = new Histogram({
    name: 'rollout_engine_rollout_seconds',
    help: 'Per-rollout time by phase (queue, inference, env, paused, total)',
    labelNames: ['phase'],
    buckets: SECONDS,
    registers: [this.registry],
  });
  readonly #staleness = new Histogram({
    name: 'rollout_engine_sample_staleness',
    help: 'Staleness of rollouts handed to the trainer (train step − oldest token model step − 1)',
    buckets: [-1, 0, 1, 2, 3, 4, 6, 8, 12, 16],
    registers: [this.registry],
  });
  readonly #outages = new Counter({
    name: 'rollout_engine_inference_outages_total',
    help: 'Inference outages: times no endpoint answered (new groups held until one did)',
    registers: [this.registry],
  });
  readonly #outageSeconds = new Counter({
    name: 'rollout_engine_inference_outage_seconds_total',
    help: 'Time spent in inference outages that have ended',
    registers: [this.registry],
  });
  readonly #outageAborted = new Counter({
    name: 'rollout_engine_groups_outage_aborted_total',
    help: 'Groups that met an inference outage and came back ABORTED to be retried (not failures)',
    registers: [this.registry],
  });
  readonly #auditDelta = new Histogram({
    name: 'rollout_engine_audit_abs_delta_logprob',
    help: 'Consistency audit: mean |recorded − re-scored logprob| of each audited segment, by kind (turnStart, turnRest, beforeUpdate, afterUpdate)',
    labelNames: ['segment'],
    buckets: [1e-6, 1e-5, 1e-4, 1e-3, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5],
    registers: [this.registry],
  });
  readonly #auditRollouts = new Counter({
    name: 'rollout_engine_audit_rollouts_total',
    help: 'Consistency audit: rollouts re-scored, and those flagged (a segment past audit.threshold)',
    labelNames: ['result'],
    registers: [this.registry],
  });
  readonly #auditTokens = new Counter({
    name: 'rollout_engine_audit_tokens_total',
    help: 'Consistency audit: response tokens compared, tokens sent for scoring (its cost), and tokens skipped by reason',
    labelNames: ['kind'],
    registers: [this.registry],
  });
  readonly #auditSeconds = new Counter({
    name: 'rollout_engine_audit_seconds_total',
    help: 'Consistency audit: time spent in scoring calls on the inference servers',
    registers: [this.registry],
  });
  readonly #auditMax = new Gauge({
    name: 'rollout_engine_audit_last_max_abs_delta_logprob',
    help: 'Consistency audit: largest |Δ logprob| of the last rollout audited',
    registers: [this.registry],
  });
  readonly #pause = new Histogram({
    name: 'rollout_engine_pause_seconds',
    help: 'Weight-update pauses: until every worker stopped, until every group was back',
    labelNames: ['phase'],
    buckets: PAUSE_SECONDS,
    registers: [this.registry],
  });

  /** Scrape-time gauges read the engine's live state through this. */
  constructor(stats: () => Promise<EngineStats>) {
    const registers = [this.registry];
    let snapshot: Promise<EngineStats> | null = null;
    // One stats() per scrape, shared by every gauge's collect().
    const current = () => (snapshot ??= stats().finally(() => setImmediate(() => (snapshot = null))));
    new Gauge({
      name: 'rollout_engine_state',
      help: 'model_step, next_train_step, producer_future_step, paused (1/0), groups_in_flight, inference_outage (1/0), inference_outage_seconds (the current one)',
      labelNames: ['field'],
      registers,
      async collect() {
        const s = await current();
        this.set({ field: 'model_step' }, s.modelStep);
        this.set({ field: 'next_train_step' }, s.nextTrainStep);
        this.set({ field: 'producer_future_step' }, s.producerFutureStep);
        this.set({ field: 'paused' }, s.paused ? 1 : 0);
        this.set({ field: 'groups_in_flight' }, s.groups.inFlight);
        this.set({ field: 'inference_outage' }, s.outage.state === 'down' ? 1 : 0);
        this.set({ field: 'inference_outage_seconds' }, (s.outage.currentMs ?? 0) / 1000);
      },
    });
    new Gauge({
      name: 'rollout_engine_episode_failures',
      help: 'Episodes that failed since the start, by kind (environment, infrastructure, inference, timeout, parse, policy); infrastructure ones include those run again in their slot, never trained',
      labelNames: ['kind'],
      registers,
      async collect() {
        for (const [kind, n] of Object.entries((await current()).failures)) this.set({ kind }, n);
      },
    });
    new Gauge({
      name: 'rollout_engine_buffer_groups',
      help: 'Groups stored in the replay buffer, by status',
      labelNames: ['status'],
      registers,
      async collect() {
        const s = await current();
        this.set({ status: 'COMPLETED' }, s.buffer.completed);
        this.set({ status: 'ABORTED' }, s.buffer.aborted);
        this.set({ status: 'EXPIRED' }, s.buffer.expired);
      },
    });
    new Gauge({
      name: 'rollout_engine_worker_rollouts_in_flight',
      help: 'Rollouts of the groups each worker thread holds (running, waiting for an episode slot, or done and waiting for their group)',
      labelNames: ['worker'],
      registers,
      async collect() {
        this.reset();
        for (const w of (await current()).workers) this.set({ worker: String(w.workerId) }, w.inFlightRollouts);
      },
    });
    new Gauge({
      name: 'rollout_engine_worker_episodes_running',
      help: 'Episodes each worker thread is playing (holding an episode slot, workers.rolloutsPerWorker)',
      labelNames: ['worker'],
      registers,
      async collect() {
        this.reset();
        for (const w of (await current()).workers) this.set({ worker: String(w.workerId) }, w.episodesRunning);
      },
    });
    new Gauge({
      name: 'rollout_engine_weight_version_mismatches',
      help: 'Inference replies whose weight version is none the trainer announced (resume weightVersion), or older, and servers a resume found serving other weights: a server not serving the weights it was said to load. worker="main": the gateway\'s replies and the resume checks',
      labelNames: ['worker'],
      registers,
      async collect() {
        this.reset();
        const s = await current();
        let workers = 0;
        for (const w of s.workers) {
          this.set({ worker: String(w.workerId) }, w.weightVersionMismatches);
          workers += w.weightVersionMismatches;
        }
        this.set({ worker: 'main' }, s.weightVersionMismatches - workers);
      },
    });
    new Gauge({
      name: 'rollout_engine_worker_event_loop_delay_seconds',
      help: 'Event-loop delay of each worker thread since the previous scrape (p99)',
      labelNames: ['worker'],
      registers,
      async collect() {
        this.reset();
        for (const w of (await current()).workers)
          this.set({ worker: String(w.workerId) }, w.eventLoopDelayP99Ms / 1000);
      },
    });
  }

  landed(group: RolloutGroup, sent: RolloutGroup): void {
    this.#groups.inc({ status: group.status });
    let produced = 0;
    for (let i = 0; i < group.rollouts.length; i++) {
      const r = group.rollouts[i];
      const before = sent.rollouts[i];
      produced += dispatchTokenCount(before, r);
      this.#turns.inc(Math.max(0, r.turns.length - (before && r.attempt === before.attempt ? before.turns.length : 0)));
      if (r.status === 'COMPLETED' || r.status === 'FAILED') {
        const t = r.timings;
        this.#latency.observe({ phase: 'queue' }, t.queueMs / 1000);
        this.#latency.observe({ phase: 'inference' }, t.inferenceMs / 1000);
        this.#latency.observe({ phase: 'env' }, t.envMs / 1000);
        this.#latency.observe({ phase: 'paused' }, t.pausedMs / 1000);
        this.#latency.observe({ phase: 'total' }, t.totalMs / 1000);
      }
    }
    if (produced > 0) this.#tokens.inc({ kind: 'produced' }, produced);
  }

  taken(groups: readonly RolloutGroup[], trainStep: number): void {
    this.#taken.inc(groups.length);
    for (const g of groups) for (const r of g.rollouts) this.#staleness.observe(rolloutStaleness(r, trainStep));
  }

  dropped(_group: RolloutGroup, reason: DropReason): void {
    this.#dropped.inc({ reason });
  }

  /**
   * Tokens thrown away, as the producer reports them: members restarted or reset to their prompt (in
   * the worker too: a run from the prompt, a step played again), groups dropped. The total stays
   * under `tokens_total{kind="wasted"}`; the cause tells the bound's share (expired) from the
   * environment's and the pause's (restarted).
   */
  discarded(tokens: number, cause: DiscardCause): void {
    if (tokens <= 0) return;
    this.#tokens.inc({ kind: 'wasted' }, tokens);
    this.#wasted.inc({ cause }, tokens);
  }

  outageBegan(): void {
    this.#outages.inc();
  }

  outageEnded(durationMs: number): void {
    this.#outageSeconds.inc(durationMs / 1000);
  }

  outageAborted(): void {
    this.#outageAborted.inc();
  }

  paused(report: PauseReport): void {
    if (report.workersStoppedMs !== null)
      this.#pause.observe({ phase: 'workers_stopped' }, report.workersStoppedMs / 1000);
    if (report.workersAckedMs !== null) this.#pause.observe({ phase: 'workers_acked' }, report.workersAckedMs / 1000);
    this.#pause.observe({ phase: 'all_back' }, report.allBackMs / 1000);
  }

  audited(report: RolloutAudit, cost: { scoredTokens: number; seconds: number }): void {
    this.#auditTokens.inc({ kind: 'sent' }, cost.scoredTokens);
    this.#auditSeconds.inc(cost.seconds);
    if (report.tokens === 0) return;
    this.#auditRollouts.inc({ result: report.flagged.length > 0 ? 'flagged' : 'clean' });
    this.#auditTokens.inc({ kind: 'compared' }, report.tokens);
    this.#auditMax.set(report.maxAbsDelta);
    for (const [kind, s] of Object.entries(report.bySegment))
      if (s.tokens > 0) this.#auditDelta.observe({ segment: kind }, s.meanAbsDelta);
  }

  auditSkipped(reason: SkipReason, tokens: number): void {
    this.#auditTokens.inc({ kind: `skipped_${reason}` }, tokens);
  }

  text(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}

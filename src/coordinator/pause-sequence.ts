/**
 * The pause sequence of a weight update, from the shared flag to the report (docs/ARCHITECTURE.md,
 * "Where a pause travels"):
 *
 *   signal the workers (shared flag) ─► abort on the servers (abort mode, groups out; not waiting for
 *   acks) ─► cancel client-side when not every endpoint could be aborted ─► wait for the groups,
 *   re-signalling every resignalIntervalMs and aborting again every SERVER_ABORT_REPEAT_MS ─► at
 *   pause.timeoutMs cancel what is left, wait one more interval ─► flush step records ─► report.
 *
 * In-place mode instead: signal the workers (no new calls; those in flight left alone) ─► every
 * endpoint pauses generation in place ─► flush step records ─► report, the groups still out; the
 * resume continues the servers before the workers. An endpoint without the routes, or one that
 * refuses, turns the pause into an abort-mode one (from the abort on): nothing is lost either way.
 *
 * It owns the server aborter; the producer owns the state (./producer-state.ts) and tells the sequence,
 * through `stillPausing`, when a resume or close has ended it: from then on no abort or cancel may cut
 * short the calls that run on the new weights.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { ResolvedConfig } from '../config.ts';
import { answeredOk, ServerControlClient, type ServerRouteTarget } from '../llm/client.ts';
import type { InPlaceRoutes } from '../llm/servers.ts';
import type { Logger } from '../log.ts';
import { wallClockUs } from '../protocol/control-block.ts';
import type { PauseControl } from './pause-control.ts';
import type { WorkerPool } from './worker-pool.ts';

/** While groups are still out after a server-side abort, it is sent again this often. */
export const SERVER_ABORT_REPEAT_MS = 50;

/** An endpoint that can pause generation in place, and its routes (llm/servers.ts). */
export interface InPlaceTarget {
  url: string;
  routes: InPlaceRoutes;
}

/** A continue after an in-place pause is tried this many times, this far apart, before it is reported. */
const CONTINUE_ATTEMPTS = 3;
const CONTINUE_RETRY_MS = 200;

export interface PauseReport {
  /**
   * From the request until every worker stopped issuing inference calls: the time of the last call any
   * worker sent after the request (0 when none was). Null when the workers did not acknowledge in time.
   */
  workersStoppedMs: number | null;
  /** From the request until every worker's event loop had run its pause watcher (a busy loop delays this). */
  workersAckedMs: number | null;
  /** From the request until every group in flight was back on the main thread. */
  allBackMs: number;
  groupsBack: number;
  serverAbort: boolean;
  /** In-flight calls were cancelled client-side (abort mode without a server abort, or the timeout). */
  cancelled: boolean;
  /**
   * Groups still running when the pause returned: an in-place pause leaves them all to the servers,
   * another one gave up waiting for them (they land later; none is lost).
   */
  stillInFlight: number;
  /** Every endpoint paused generation in place (pause.mode in-place): the calls in flight go on after the resume. */
  inPlace: boolean;
}

/** What one run of the sequence reads of the producer. */
export interface PauseWatch {
  /** Groups in flight now. */
  inFlight(): number;
  /** A group landed, or `ms` passed. */
  landedWithin(ms: number): Promise<void>;
  /** False once a resume or close has ended this pause. */
  stillPausing(): boolean;
}

export class PauseSequence {
  readonly #config: ResolvedConfig;
  readonly #control: PauseControl;
  readonly #pool: WorkerPool;
  readonly #log: Logger;
  /**
   * Every inference endpoint with an abort-all route, deduplicated: what a pause aborts. Endpoints
   * without one are cancelled client-side, so a server abort counts only when none lacks it.
   */
  #abortTargets: readonly ServerRouteTarget[];
  /** Every endpoint with in-place pause routes; in-place pauses need all of them to have them. */
  #inPlaceTargets: readonly InPlaceTarget[];
  #endpointCount: number;
  /** Created on the first request to a server; keeps its connections for the next pauses. Null again once closed. */
  #servers: ServerControlClient | null = null;
  /**
   * The endpoints that may be paused in place: asked since the last resume, less those that answered
   * no. The resume continues them and only them (another server was never paused).
   */
  #pausedInPlace: readonly InPlaceTarget[] = [];
  /** In-place pauses are not possible here (an endpoint without the routes, or one refused): abort instead, without a warning per pause. */
  #noInPlace = false;
  #closed = false;

  constructor(options: {
    config: ResolvedConfig;
    control: PauseControl;
    pool: WorkerPool;
    log: Logger;
    abortTargets: readonly ServerRouteTarget[];
    inPlaceTargets?: readonly InPlaceTarget[];
    endpointCount: number;
  }) {
    this.#config = options.config;
    this.#control = options.control;
    this.#pool = options.pool;
    this.#log = options.log;
    this.#abortTargets = options.abortTargets;
    this.#inPlaceTargets = options.inPlaceTargets ?? [];
    this.#endpointCount = options.endpointCount;
  }

  /** The endpoints changed (one joined or left the fleet): later pauses abort or pause these. */
  setTargets(targets: {
    abortTargets: readonly ServerRouteTarget[];
    inPlaceTargets: readonly InPlaceTarget[];
    endpointCount: number;
  }): void {
    this.#abortTargets = targets.abortTargets;
    this.#inPlaceTargets = targets.inPlaceTargets;
    this.#endpointCount = targets.endpointCount;
    this.#noInPlace = false;
  }

  /**
   * Signal, abort, wait, escalate, flush. The shared flag is written before the first await, so from
   * the caller's return on no worker sends an inference call.
   */
  async run(watch: PauseWatch): Promise<PauseReport> {
    const { resignalIntervalMs, timeoutMs } = this.#config.pause;
    let mode = this.#config.pause.mode;
    const requestedUs = wallClockUs();
    const start = performance.now();
    if (mode === 'in-place') {
      const report = await this.#pauseInPlace(watch, requestedUs, start);
      if (report !== null) return report;
      mode = 'abort';
      // A resume or close during the in-place attempt ended this pause: the flag must stay RUNNING.
      if (!watch.stillPausing()) return this.#emptyReport(start, watch, false);
    }
    this.#control.pause();
    const groupsBefore = watch.inFlight();
    // The server abort does not wait for the workers' acks: from the store above no worker can send a
    // call (the send path reads the flag in the same tick), so the acks only measure, they gate nothing.
    const serverAborting =
      mode === 'abort' && groupsBefore > 0 && this.#abortTargets.length > 0 ? this.#abortOnServers() : null;
    const { workersAckedMs, workersStoppedMs } = await this.#workersStopped(start, requestedUs);
    const serverAbort = serverAborting !== null && (await serverAborting);
    let cancelled = false;
    // Streamed calls held by the pause may have landed already, but their answers are still being read:
    // without a server-side abort to end them, they are cut client-side all the same.
    const heldStreams = this.#config.llm.stream && groupsBefore > 0;
    if (mode === 'abort' && (watch.inFlight() > 0 || heldStreams) && !serverAbort && watch.stillPausing()) {
      this.#control.cancel();
      cancelled = true;
    }
    let deadline = start + timeoutMs;
    let nextSignal = start + resignalIntervalMs;
    // A call sent just before the pause can reach its server after the abort did, and then generates
    // to the end. Abort again now that every worker is past its send path, and every
    // SERVER_ABORT_REPEAT_MS while groups are out: aborts are idempotent and cost one small request.
    let nextAbort = serverAbort ? performance.now() : Infinity;
    const repeatedAborts: Promise<boolean>[] = [];
    while (watch.inFlight() > 0 && watch.stillPausing()) {
      const wakeAt = Math.min(deadline, nextSignal, nextAbort);
      await watch.landedWithin(wakeAt - performance.now());
      const now = performance.now();
      if (watch.inFlight() === 0 || !watch.stillPausing()) break;
      if (now >= nextAbort && now < deadline) {
        repeatedAborts.push(this.#abortOnServers());
        nextAbort = now + SERVER_ABORT_REPEAT_MS;
      }
      if (now >= deadline) {
        if (cancelled) break; // cancelled and waited another interval: report what is left, it lands later
        this.#log.warn(
          { inFlight: watch.inFlight(), timeoutMs },
          'pause timed out: cancelling in-flight inference client-side',
        );
        this.#control.cancel();
        cancelled = true;
        deadline = now + resignalIntervalMs;
      } else if (now >= nextSignal) {
        this.#control.resignal();
        nextSignal = now + resignalIntervalMs;
      }
    }
    const allBackMs = performance.now() - start;
    // An abort still on its way must not land after the resume and cut the next calls short.
    await Promise.all(repeatedAborts);
    await this.#pool.flush(); // step records of the interrupted episodes reach the disk before the weights change
    const stillInFlight = watch.inFlight();
    return {
      workersStoppedMs,
      workersAckedMs,
      allBackMs,
      groupsBack: groupsBefore - stillInFlight,
      serverAbort,
      cancelled,
      stillInFlight,
      inPlace: false,
    };
  }

  /**
   * Before the workers run again after an in-place pause: every endpoint that may be paused continues
   * (a call left paused on a server would wait there until llm.timeoutMs).
   */
  async continueServers(): Promise<void> {
    if (this.#pausedInPlace.length === 0 || this.#closed) return;
    const paused = this.#pausedInPlace;
    const targets = paused.map(({ url, routes }) => ({ url, route: routes.resume }));
    // Continuing is idempotent; a server left paused holds every call sent to it, so try a few times.
    for (let attempt = 0; attempt < CONTINUE_ATTEMPTS; attempt++) {
      if (attempt > 0) await sleep(CONTINUE_RETRY_MS);
      if (await this.#client().postAll(targets)) {
        this.#pausedInPlace = [];
        return;
      }
    }
    // Left set: the next resume, and close(), try again.
    this.#log.error(
      { endpoints: paused.map((t) => t.url) },
      'an inference server did not continue generation after an in-place pause: calls sent to it wait until llm.timeoutMs',
    );
  }

  /** The in-place pause; null when it cannot be one (then the caller aborts, from the shared flag on). */
  async #pauseInPlace(watch: PauseWatch, requestedUs: bigint, start: number): Promise<PauseReport | null> {
    if (this.#noInPlace) return null;
    if (this.#inPlaceTargets.length < this.#endpointCount) {
      this.#noInPlace = true;
      this.#log.warn(
        { withRoutes: this.#inPlaceTargets.map((t) => t.url), endpoints: this.#endpointCount },
        'pause.mode in-place: not every inference server can pause generation in place (SGLang /pause_generation, vLLM /pause in dev mode); pausing by abort from now on',
      );
      return null;
    }
    this.#control.pauseInPlace();
    // Still paused from an earlier pause whose continue failed: listed whatever this one answers.
    const leftPaused = this.#pausedInPlace;
    // Set before asking: a close() meanwhile continues them all.
    this.#pausedInPlace = this.#inPlaceTargets;
    const statuses = await this.#client().postEach(
      this.#inPlaceTargets.map(({ url, routes }) => ({ url, route: routes.pause })),
    );
    // A server that did not answer may have paused all the same: it is continued too.
    this.#pausedInPlace = this.#inPlaceTargets.filter(
      (t, i) => statuses[i] === null || answeredOk(statuses[i]) || leftPaused.includes(t),
    );
    if (!statuses.every(answeredOk)) {
      this.#noInPlace = true;
      this.#log.warn(
        { answers: Object.fromEntries(this.#inPlaceTargets.map((t, i) => [t.url, statuses[i]])) },
        'an inference server refused to pause generation in place, or did not answer: pausing by abort from now on',
      );
      // Those that did pause go on first: SGLang finishes an aborted running request only at its next
      // decode step, which a paused scheduler never runs.
      await this.continueServers();
      return null;
    }
    const stopped = await this.#workersStopped(start, requestedUs);
    await this.#pool.flush();
    return { ...this.#emptyReport(start, watch, true), ...stopped };
  }

  /** When every worker has seen the flag (at most 1 s of waiting: it only measures) and sent its last call. */
  async #workersStopped(
    start: number,
    requestedUs: bigint,
  ): Promise<Pick<PauseReport, 'workersAckedMs' | 'workersStoppedMs'>> {
    const timeoutMs = Math.min(this.#config.pause.timeoutMs, 1_000);
    const workersAckedMs = await this.#control.waitForAcks(this.#pool.liveWorkers, timeoutMs, start);
    return {
      workersAckedMs,
      workersStoppedMs: workersAckedMs === null ? null : this.#control.lastSendAfterMs(requestedUs),
    };
  }

  /** A report with nothing measured or brought back: a pause in place, or one a resume or close ended first. */
  #emptyReport(start: number, watch: PauseWatch, inPlace: boolean): PauseReport {
    return {
      workersStoppedMs: null,
      workersAckedMs: null,
      allBackMs: performance.now() - start,
      groupsBack: 0,
      serverAbort: false,
      cancelled: false,
      stillInFlight: watch.inFlight(),
      inPlace,
    };
  }

  /**
   * Close the servers' connections; a sequence still running asks nothing more of them. Servers left
   * paused in place are continued first: they are shared, and would hold every other client's calls.
   */
  async close(): Promise<void> {
    await this.continueServers();
    this.#closed = true;
    await this.#servers?.close();
  }

  #client(): ServerControlClient {
    this.#servers ??= new ServerControlClient({ apiKey: this.#config.llm.apiKey });
    return this.#servers;
  }

  /**
   * Ask every inference endpoint to abort what it is generating; true when all of them could (an
   * endpoint without an abort route cannot: its calls are then cancelled client-side).
   */
  async #abortOnServers(): Promise<boolean> {
    if (this.#closed) return false; // close() has closed the connections
    const all = await this.#client().postAll(this.#abortTargets);
    return all && this.#abortTargets.length === this.#endpointCount;
  }
}

/**
 * The pause sequence of a weight update, from the shared flag to the report (docs/ARCHITECTURE.md,
 * "Where a pause travels"):
 *
 *   signal the workers (shared flag) ─► abort on the servers (abort mode, groups out; not waiting for
 *   acks) ─► cancel client-side when not every endpoint could be aborted ─► wait for the groups,
 *   re-signalling every resignalIntervalMs and aborting again every SERVER_ABORT_REPEAT_MS ─► at
 *   pause.timeoutMs cancel what is left, wait one more interval ─► flush step records ─► report.
 *
 * It owns the server aborter; the producer owns the state (./producer-state.ts) and tells the sequence,
 * through `stillPausing`, when a resume or close has ended it: from then on no abort or cancel may cut
 * short the calls that run on the new weights.
 */
import type { ResolvedConfig } from '../config.ts';
import { InferenceAborter, type AbortTarget } from '../llm/client.ts';
import type { Logger } from '../log.ts';
import { wallClockUs } from '../protocol/control-block.ts';
import type { PauseControl } from './pause-control.ts';
import type { WorkerPool } from './worker-pool.ts';

/** While groups are still out after a server-side abort, it is sent again this often. */
export const SERVER_ABORT_REPEAT_MS = 50;

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
  /** Groups still running when the pause gave up waiting (they land later; none is lost). */
  stillInFlight: number;
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
  readonly #abortTargets: readonly AbortTarget[];
  readonly #endpointCount: number;
  /** Created on the first server-side abort; keeps its connections for the next pauses. Null again once closed. */
  #aborter: InferenceAborter | null = null;
  #closed = false;

  constructor(options: {
    config: ResolvedConfig;
    control: PauseControl;
    pool: WorkerPool;
    log: Logger;
    abortTargets: readonly AbortTarget[];
    endpointCount: number;
  }) {
    this.#config = options.config;
    this.#control = options.control;
    this.#pool = options.pool;
    this.#log = options.log;
    this.#abortTargets = options.abortTargets;
    this.#endpointCount = options.endpointCount;
  }

  /**
   * Signal, abort, wait, escalate, flush. The shared flag is written before the first await, so from
   * the caller's return on no worker sends an inference call.
   */
  async run(watch: PauseWatch): Promise<PauseReport> {
    const { mode, resignalIntervalMs, timeoutMs } = this.#config.pause;
    const requestedUs = wallClockUs();
    const start = performance.now();
    this.#control.pause();
    const groupsBefore = watch.inFlight();
    // The server abort does not wait for the workers' acks: from the store above no worker can send a
    // call (the send path reads the flag in the same tick), so the acks only measure, they gate nothing.
    const serverAborting =
      mode === 'abort' && groupsBefore > 0 && this.#abortTargets.length > 0 ? this.#abortOnServers() : null;
    const workersAckedMs = await this.#control.waitForAcks(this.#pool.liveWorkers, Math.min(timeoutMs, 1_000), start);
    const workersStoppedMs = workersAckedMs === null ? null : this.#control.lastSendAfterMs(requestedUs);
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
    };
  }

  /** Close the aborter's connections; a sequence still running aborts nothing more. */
  async close(): Promise<void> {
    this.#closed = true;
    await this.#aborter?.close();
  }

  /**
   * Ask every inference endpoint to abort what it is generating; true when all of them could (an
   * endpoint without an abort route cannot: its calls are then cancelled client-side).
   */
  async #abortOnServers(): Promise<boolean> {
    if (this.#closed) return false; // close() has closed the aborter's connections
    this.#aborter ??= new InferenceAborter({ apiKey: this.#config.llm.apiKey });
    const all = await this.#aborter.abortAll(this.#abortTargets);
    return all && this.#abortTargets.length === this.#endpointCount;
  }
}

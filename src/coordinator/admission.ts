/**
 * Deadline admission (`producer.admission: deadline`, docs/SCHEDULING.md, "Strict staleness at
 * speed"): the async producer starts a group only when it is predicted to be taken by the trainer
 * before it passes the staleness bound.
 *
 * A group whose first token is sampled with weights `m` expires at train step `m + threshold + 1`
 * (staleness = trainStep − m − 1 ≥ threshold, buffer/staleness.ts), so its last useful step is
 *
 *   deadline step D = m + threshold
 *
 * and it is admitted when
 *
 *   now + predicted lifetime ≤ predicted time the trainer takes step D
 *   predicted lifetime        = the `quantile` of recent groups' dispatch → landing times
 *   take time of step D       = time the last batch was taken + (D − its step) × mean step time
 *
 * The measure is the one the buffer expires by: the oldest token's model step. `m` is the weights
 * served now; a group held back is started later with newer weights, which moves its deadline out.
 *
 * Until both figures are known (a few groups landed, two batches taken) every group is admitted, and
 * the strategy always admits what the trainer's next batch needs (strategies.ts): pacing only ever
 * holds back groups beyond it, so it cannot stall production.
 */

/** Recent group lifetimes kept for the quantile. */
const WINDOW = 64;
/** Landings needed before the lifetime is predicted. */
const MIN_SAMPLES = 8;

/** What `EngineStats.admission` reports with `producer.admission: deadline`. */
export interface AdmissionStats {
  quantile: number;
  /** Produce rounds that stopped starting groups because the next one would not land in time. */
  held: number;
  /** The lifetime a new group is predicted to take, ms (null before eight landings). */
  predictedLifetimeMs: number | null;
  /** The trainer's mean time between two batches, ms (null before two). */
  stepMs: number | null;
}

export interface AdmissionDecision {
  admit: boolean;
  /** Predicted landing − the predicted take time of the deadline step, ms (negative: time to spare); null before the figures are known. */
  slackMs: number | null;
}

export class DeadlineAdmission {
  readonly #quantile: number;
  readonly #lifetimes: number[] = [];
  #next = 0;
  /** predictedLifetimeMs() as of the last landing; undefined: not computed since. */
  #predicted: number | null | undefined;
  /** Mean ms between two batches taken (exponentially weighted, 1/4); null before the second batch. */
  #stepMs: number | null = null;
  #lastTake: { step: number; at: number } | null = null;
  constructor(quantile: number) {
    if (!(quantile > 0 && quantile <= 1)) throw new RangeError(`quantile must be in (0, 1] (got ${quantile})`);
    this.#quantile = quantile;
  }

  /** A group landed `ms` after it was dispatched (whatever its status: an expired one is a lower bound). */
  landed(ms: number): void {
    if (!(ms >= 0) || !Number.isFinite(ms)) return;
    if (this.#lifetimes.length < WINDOW) this.#lifetimes.push(ms);
    else this.#lifetimes[this.#next] = ms;
    this.#next = (this.#next + 1) % WINDOW;
    this.#predicted = undefined;
  }

  /** The trainer took the batch of `step` at `at` (ms). */
  taken(step: number, at: number): void {
    const last = this.#lastTake;
    if (last !== null && step > last.step) {
      const per = (at - last.at) / (step - last.step);
      this.#stepMs = this.#stepMs === null ? per : this.#stepMs + (per - this.#stepMs) / 4;
    }
    this.#lastTake = { step, at };
  }

  /**
   * The lifetime quantile of the recent landings, ms; null with fewer than MIN_SAMPLES. Sorted once
   * per landing, not per call: the producer asks before every group it would start.
   */
  predictedLifetimeMs(): number | null {
    if (this.#predicted !== undefined) return this.#predicted;
    const n = this.#lifetimes.length;
    const sorted = n < MIN_SAMPLES ? null : [...this.#lifetimes].sort((a, b) => a - b);
    this.#predicted = sorted === null ? null : sorted[Math.min(n - 1, Math.ceil(this.#quantile * n) - 1)];
    return this.#predicted;
  }

  get stepMs(): number | null {
    return this.#stepMs;
  }

  get quantile(): number {
    return this.#quantile;
  }

  /** When the trainer is predicted to take `step`, ms; null before two batches were taken. */
  takeTimeOf(step: number): number | null {
    if (this.#lastTake === null || this.#stepMs === null) return null;
    return this.#lastTake.at + (step - this.#lastTake.step) * this.#stepMs;
  }

  /**
   * Whether a group dispatched at `now` with weights `modelStep` is predicted to be taken before it
   * passes the bound (`threshold` = (maxStaleness + 1) × syncWeightsInterval).
   */
  decide(now: number, modelStep: number, threshold: number): AdmissionDecision {
    if (!Number.isFinite(threshold)) return { admit: true, slackMs: null };
    const lifetime = this.predictedLifetimeMs();
    const takeAt = this.takeTimeOf(modelStep + threshold);
    if (lifetime === null || takeAt === null) return { admit: true, slackMs: null };
    const slackMs = now + lifetime - takeAt;
    return { admit: slackMs <= 0, slackMs };
  }
}

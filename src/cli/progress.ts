/**
 * A live progress line for long runs on a terminal (stderr, redrawn in place): batches, groups/s,
 * groups in flight, paused or not, mean reward of the last batch. Off a terminal it stays silent —
 * the log lines ("batch ready") carry the same facts for files and CI.
 */
import type { Engine } from '../index.ts';

export class ProgressLine {
  readonly #engine: Engine;
  readonly #total: number;
  readonly #stream: NodeJS.WriteStream;
  readonly #started = performance.now();
  #timer: NodeJS.Timeout | null = null;
  /** The whole run's, earlier processes' included. */
  #batches = 0;
  /** This process's: the rate is of what it produced in its own time. */
  #groups = 0;
  #meanReward: number | null = null;
  #busy = false;

  /** `earlier.batches`: the run's batches written before this process (a resumed run counts them too). */
  constructor(
    engine: Engine,
    totalBatches: number,
    earlier: { batches: number } = { batches: 0 },
    stream: NodeJS.WriteStream = process.stderr,
  ) {
    this.#engine = engine;
    this.#total = totalBatches;
    this.#batches = earlier.batches;
    this.#stream = stream;
  }

  /** Whether a live line will be drawn (a terminal); callers quiet their info logs when it is. */
  get live(): boolean {
    return this.#stream.isTTY === true;
  }

  start(): void {
    if (!this.live) return;
    this.#timer = setInterval(() => void this.#draw(), 250);
    this.#timer.unref();
  }

  batch(groups: number, meanReward: number): void {
    this.#batches++;
    this.#groups += groups;
    this.#meanReward = meanReward;
  }

  stop(): void {
    if (this.#timer === null) return;
    clearInterval(this.#timer);
    this.#timer = null;
    this.#stream.write('\r\x1b[2K');
  }

  async #draw(): Promise<void> {
    if (this.#busy) return; // a slow stats() (workers busy) must not pile up redraws
    this.#busy = true;
    try {
      const stats = await this.#engine.stats();
      const seconds = (performance.now() - this.#started) / 1000;
      const parts = [
        `batch ${this.#batches}/${this.#total}`,
        `${(this.#groups / Math.max(seconds, 1e-3)).toFixed(1)} groups/s`,
        `${stats.groups.inFlight} in flight`,
        stats.paused ? 'PAUSED' : 'running',
        `mean reward ${this.#meanReward === null ? '–' : this.#meanReward.toFixed(3)}`,
        `${seconds.toFixed(1)} s`,
      ];
      if (this.#timer !== null) this.#stream.write(`\r\x1b[2K${parts.join(' │ ')}`);
    } catch {
      // the engine is closing: nothing to draw
    } finally {
      this.#busy = false;
    }
  }
}

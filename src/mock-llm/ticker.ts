/**
 * The one timer that sends every streamed completion its new tokens, each `intervalMs`: a timer per
 * stream costs the mock more than the events it sends.
 *
 * Invariant: the timer runs while a stream is registered, and stops at the first tick that finds none
 * (or at stop()), so an idle mock holds no timer.
 */
export interface Ticking {
  /** Sends the tokens generated since the last tick. */
  tick(): void;
}

export class StreamTicker {
  readonly #intervalMs: number;
  readonly #streams = new Set<Ticking>();
  #timer: NodeJS.Timeout | null = null;

  constructor(intervalMs: number) {
    this.#intervalMs = intervalMs;
  }

  add(stream: Ticking): void {
    this.#streams.add(stream);
    this.#timer ??= setInterval(() => {
      if (this.#streams.size === 0) {
        this.stop();
        return;
      }
      for (const s of this.#streams) s.tick();
    }, this.#intervalMs);
  }

  /** The stream has ended (answered, aborted, or its client gone): no tick reaches it any more. */
  delete(stream: Ticking): void {
    this.#streams.delete(stream);
  }

  stop(): void {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
  }
}

/**
 * The producer's lifecycle: one named state and the resume epoch, changed only through the methods
 * below, each of which checks the state it leaves (the diagram is at the top of ./producer.ts).
 *
 * Invariants:
 * - `epoch` only grows, by one per resume: a group dispatched under an older epoch ran (at least
 *   partly) on weights older than the ones served now, and a pause sequence started under an older
 *   epoch must not cut short the calls of the new weights;
 * - the state is `pausing` exactly while at least one pause sequence runs (`#sequences` > 0) and no
 *   resume or close has ended it: a trainer may ask for a pause again while one is in progress;
 * - `closing` and `closed` are final: no transition leaves them but closing → closed.
 */
import { RolloutEngineError } from '../errors.ts';

/**
 * - `idle`: built, maybe restored from a checkpoint, not started: nothing is produced or served;
 * - `running`: producing (the async strategy in the background, sync inside getBatch) and serving;
 * - `pausing`: a weight-update pause is bringing the groups in flight back; nothing is dispatched;
 * - `paused`: every pause sequence has returned; nothing is dispatched until a resume;
 * - `closing`: close() is cancelling what is in flight and waiting (bounded) for it to land;
 * - `closed`: done.
 */
export type ProducerState = 'idle' | 'running' | 'pausing' | 'paused' | 'closing' | 'closed';

export class ProducerLifecycle {
  #state: ProducerState = 'idle';
  #epoch = 0;
  /** Pause sequences in progress; the state is `pausing` only while this is above 0. */
  #sequences = 0;

  get state(): ProducerState {
    return this.#state;
  }

  /** Resumes so far; a group or a pause sequence remembers the epoch it began in. */
  get epoch(): number {
    return this.#epoch;
  }

  /** A weight-update pause is in progress or done, and no resume came yet. */
  get paused(): boolean {
    return this.#state === 'pausing' || this.#state === 'paused';
  }

  /** closing or closed: nothing may start any more. */
  get closed(): boolean {
    return this.#state === 'closing' || this.#state === 'closed';
  }

  /** idle → running. */
  start(): void {
    this.expect('start', ['idle']);
    this.#state = 'running';
  }

  /**
   * running | pausing | paused → pausing; returns the epoch the sequence belongs to. Pausing again while
   * paused (a trainer whose /pause timed out asks again) brings back what is still out.
   */
  beginPause(): number {
    this.expect('pause', ['running', 'pausing', 'paused']);
    this.#state = 'pausing';
    this.#sequences++;
    return this.#epoch;
  }

  /** Whether the pause sequence of `epoch` may still act: neither a resume nor a close has ended it. */
  stillPausing(epoch: number): boolean {
    return this.#state === 'pausing' && this.#epoch === epoch;
  }

  /** A pause sequence returned: pausing → paused once the last one has (a resume or close already moved on). */
  endPause(): void {
    this.#sequences--;
    if (this.#sequences === 0 && this.#state === 'pausing') this.#state = 'paused';
  }

  /**
   * running | pausing | paused → running, with a new epoch. From running it is a resume without a
   * pause: the trainer announces weights it loaded without pausing.
   */
  resume(): number {
    this.expect('resume', ['running', 'pausing', 'paused']);
    this.#state = 'running';
    return ++this.#epoch;
  }

  /** Any state → closing; false when close() was already called (the caller then waits for that one). */
  beginClose(): boolean {
    if (this.closed) return false;
    this.#state = 'closing';
    return true;
  }

  /** closing → closed. */
  endClose(): void {
    this.expect('finish closing', ['closing']);
    this.#state = 'closed';
  }

  /** Throws ERR_ENGINE_STATE unless the state is one of `from`. */
  expect(action: string, from: readonly ProducerState[]): void {
    if (!from.includes(this.#state)) {
      throw new RolloutEngineError(
        'ERR_ENGINE_STATE',
        `the producer cannot ${action} while it is ${this.#state} (only while ${from.join(' or ')})`,
      );
    }
  }
}

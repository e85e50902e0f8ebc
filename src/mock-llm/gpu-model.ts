/**
 * The GPU-like mock's model of one inference replica, on a clock of its own (milliseconds of model
 * time; gpu.ts drives it from the wall clock). What it models is what makes a real server's
 * throughput depend on how it is fed:
 *
 * - a fixed number of sequence slots (vLLM's max_num_seqs): requests beyond them queue (FIFO, or
 *   by rank under priority scheduling, preempting as SGLang does: admission.ts);
 * - continuous batching: the replica runs steps back to back while any slot is taken; a step decodes
 *   one token of every sequence in a slot and prefills up to `prefillChunkTokens` prompt tokens of the
 *   ones just admitted (chunked prefill), and lasts
 *       decodeMs + decodeMsPerSeq × decoding sequences + decodeMsPerKvToken × their KV tokens
 *         + prefill tokens ÷ prefillTokensPerSecond,
 *   a decoding sequence's KV tokens being its prompt and the tokens it generated so far (the fit to a
 *   measured H200, docs/MOCK-CALIBRATION.md: the weights are read once a step, each sequence's KV
 *   every step);
 *   a request that arrives mid-step is admitted at the step's end;
 * - the step that ends a sequence's prefill also yields its first token (as vLLM's last chunk does);
 * - prefix caching (prefix-cache.ts): an admitted prompt prefills only what the cache does not hold
 *   (at least one token); a sequence's prompt and its tokens are cached when it leaves a slot.
 *
 * - a pause (SGLang's pause_generation, gpu.ts): the step under way ends, then no step starts and
 *   nothing is admitted until resume; `in_place` keeps the running sequences in their slots with
 *   their KV, `retract` sends them back to the head of the queue to prefill again what they had.
 *
 * Invariants: a sequence is in exactly one of queue, slots (prefilling or decoding) or gone; slots
 * taken ≤ `slots`; the metrics' integrals cover every millisecond from 0 to `now` exactly once
 * (`#account` before every change of what they integrate).
 */
import { nextIndex, preemptionVictim } from './priority-scheduling.ts';
import type { PauseMode } from './pause-routes.ts';
import { blockHashes, PrefixCache } from './prefix-cache.ts';

export interface GpuModelOptions {
  slots: number;
  decodeMs: number;
  decodeMsPerSeq: number;
  /** ms per KV token held by the decoding sequences; 0 = a sequence's cost ignores its context. */
  decodeMsPerKvToken: number;
  prefillTokensPerSecond: number;
  prefillChunkTokens: number;
  prefixCacheTokens: number;
  /**
   * Priority scheduling (admission.ts): the queue is served by rank, and a waiting sequence preempts
   * a running one ranked worse by more than `preemptThreshold` (null: never); absent = FIFO.
   */
  priority?: { preemptThreshold: number | null } | null;
}

export interface SequenceInput {
  promptIds: readonly number[];
  /** The ids the sequence will generate (its length is the work; the ids are cached when it leaves). */
  outputIds: readonly number[];
  /** Under priority scheduling: lower = admitted sooner (admission.ts rankOf); default 0. */
  rank?: number;
}

export type SequenceState = 'queued' | 'prefill' | 'decode' | 'done';

export class Sequence {
  readonly id: number;
  readonly input: SequenceInput;
  readonly submittedAt: number;
  state: SequenceState = 'queued';
  /** Prompt tokens still to prefill once admitted. */
  prefillLeft = 0;
  /** Prompt tokens the prefix cache held at admission. */
  cachedTokens = 0;
  generated = 0;
  /** Retracted by a pause: its KV is gone, and admission prefills its prompt and the tokens it had. */
  retracted = false;
  admittedAt: number | null = null;
  firstTokenAt: number | null = null;
  doneAt: number | null = null;

  constructor(id: number, input: SequenceInput, submittedAt: number) {
    this.id = id;
    this.input = input;
    this.submittedAt = submittedAt;
  }

  get target(): number {
    return this.input.outputIds.length;
  }

  get rank(): number {
    return this.input.rank ?? 0;
  }

  /** The KV cache it holds while decoding: its prompt and the tokens generated so far. */
  get kvTokens(): number {
    return this.input.promptIds.length + this.generated;
  }
}

/** Cumulative figures since the model started; read two and subtract for a window (gpu.ts `gpuWindow`). */
export interface GpuCounters {
  /** Model time since the start, ms. */
  timeMs: number;
  /** Time inside a step. */
  busyMs: number;
  /** ∫ slots taken dt (prefilling and decoding sequences), slot·ms. */
  slotMs: number;
  /** ∫ queue length dt, request·ms. */
  queueMs: number;
  steps: number;
  submitted: number;
  admitted: number;
  completed: number;
  /** Sequences removed before their end (abort, client gone). */
  cancelled: number;
  /** Running sequences sent back to the queue for a waiting one of higher priority (admission.ts). */
  preempted: number;
  generatedTokens: number;
  promptTokens: number;
  /** Prompt tokens found in the prefix cache at admission. */
  cachedTokens: number;
  /** Prompt tokens actually prefilled. */
  prefilledTokens: number;
  /**
   * Of busyMs, the time spent prefilling (each step's prefill tokens ÷ prefillTokensPerSecond), added
   * when the step ends: a reading taken mid-step holds its busy time but not yet its prefill.
   */
  prefillMs: number;
  /** Σ over steps of the sequences decoding (each gets one token at the step's end). */
  decodeSequences: number;
  /** Σ over steps of the KV tokens those sequences held: ÷ decodeSequences = the mean context decoded at. */
  decodeKvTokens: number;
  /** Of busyMs, the time spent reading the decoding sequences' KV (decodeMsPerKvToken × decodeKvTokens), added when the step ends. */
  kvReadMs: number;
  cacheFlushes: number;
}

export interface GpuState {
  running: number;
  queued: number;
  cacheTokens: number;
}

interface Step {
  start: number;
  end: number;
  /** Decoding sequences at the step's start: each gets one token at its end. */
  decode: Sequence[];
  /** Prompt tokens each prefilling sequence gets through in this step. */
  prefill: [Sequence, number][];
  prefillMs: number;
  kvTokens: number;
}

export class GpuModel {
  readonly #o: GpuModelOptions;
  readonly #cache: PrefixCache;
  readonly #queue: Sequence[] = [];
  /** In a slot, in admission order: the prefilling ones are served FIFO within a step's chunk. */
  readonly #slots = new Set<Sequence>();
  #step: Step | null = null;
  /** Between pause() and resume(): no step starts, nothing is admitted. */
  #paused: Exclude<PauseMode, 'abort'> | null = null;
  #now = 0;
  #nextId = 0;
  readonly #c: GpuCounters = {
    timeMs: 0,
    busyMs: 0,
    slotMs: 0,
    queueMs: 0,
    steps: 0,
    submitted: 0,
    admitted: 0,
    completed: 0,
    cancelled: 0,
    preempted: 0,
    generatedTokens: 0,
    promptTokens: 0,
    cachedTokens: 0,
    prefilledTokens: 0,
    prefillMs: 0,
    decodeSequences: 0,
    decodeKvTokens: 0,
    kvReadMs: 0,
    cacheFlushes: 0,
  };

  constructor(options: GpuModelOptions) {
    this.#o = options;
    this.#cache = new PrefixCache(options.prefixCacheTokens);
  }

  get now(): number {
    return this.#now;
  }

  /** When the step under way ends (the next moment anything changes by itself), or null when idle. */
  get nextEventAt(): number | null {
    return this.#step?.end ?? null;
  }

  counters(): GpuCounters {
    return { ...this.#c };
  }

  state(): GpuState {
    return { running: this.#slots.size, queued: this.#queue.length, cacheTokens: this.#cache.tokens };
  }

  /** Runs every step that ends by `t`; returns the sequences that finished, in order. */
  advanceTo(t: number): Sequence[] {
    const done: Sequence[] = [];
    while (this.#step !== null && this.#step.end <= t) this.#endStep(done);
    this.#account(Math.max(t, this.#now));
    return done;
  }

  /**
   * Paused at `t`: the step under way still ends (SGLang finishes the batch it is running), then the
   * replica idles with its slots as they are (`in_place`), or with every running sequence sent back
   * to the head of the queue (`retract`: done at that step's end, or now when idle).
   */
  pause(t: number, mode: Exclude<PauseMode, 'abort'>): Sequence[] {
    const done = this.advanceTo(t);
    this.#paused = mode;
    if (mode === 'retract' && this.#step === null) this.#retract();
    return done;
  }

  /** Resumed at `t`: admission and steps start again. */
  resume(t: number): Sequence[] {
    const done = this.advanceTo(t);
    this.#paused = null;
    if (this.#step === null) {
      this.#admit();
      this.#startStep(this.#now);
    }
    return done;
  }

  /** A request arrives at `t` (≥ now); returns the sequences that finished up to `t` too. */
  submit(t: number, input: SequenceInput): { seq: Sequence; done: Sequence[] } {
    const done = this.advanceTo(t);
    const seq = new Sequence(this.#nextId++, input, this.#now);
    this.#c.submitted++;
    this.#queue.push(seq);
    // An idle replica starts at once; a busy one admits at its step's end (continuous batching),
    // unless the step starts this very moment: requests arriving together are batched together.
    if (this.#paused === null && (this.#step === null || this.#step.start === this.#now)) {
      this.#admit();
      this.#startStep(this.#now);
    }
    return { seq, done };
  }

  /** Removes a sequence before its end (abort, client gone) at `t`; the tokens it has are cached. */
  cancel(t: number, seq: Sequence): Sequence[] {
    const done = this.advanceTo(t);
    if (seq.state === 'done') return done;
    if (seq.state === 'queued') this.#queue.splice(this.#queue.indexOf(seq), 1);
    else this.#leave(seq);
    seq.state = 'done';
    seq.doneAt = this.#now;
    this.#c.cancelled++;
    return done;
  }

  /** New weights: nothing cached is valid any more. */
  flushCache(): void {
    this.#cache.clear();
    this.#c.cacheFlushes++;
  }

  #account(t: number): void {
    const dt = t - this.#now;
    if (dt <= 0) return;
    this.#c.timeMs += dt;
    if (this.#step !== null) this.#c.busyMs += dt;
    this.#c.slotMs += dt * this.#slots.size;
    this.#c.queueMs += dt * this.#queue.length;
    this.#now = t;
  }

  /** The next queued sequence to admit, taken off the queue: the head (FIFO) or the best ranked. */
  #takeNext(): Sequence {
    if (!this.#o.priority) return this.#queue.shift()!;
    return this.#queue.splice(nextIndex(this.#queue), 1)[0];
  }

  /** With the slots full, frees one for the best-ranked waiting sequence if it may preempt (admission.ts). */
  #preempt(): boolean {
    const threshold = this.#o.priority?.preemptThreshold;
    if (threshold == null || this.#queue.length === 0) return false;
    const victim = preemptionVictim(this.#slots, this.#queue[nextIndex(this.#queue)], threshold);
    if (victim === null) return false;
    // As SGLang's release_req: its KV is freed, and it prefills its prompt and tokens again.
    this.#slots.delete(victim);
    victim.state = 'queued';
    victim.prefillLeft = 0;
    victim.retracted = true;
    this.#queue.push(victim);
    this.#c.preempted++;
    return true;
  }

  #admit(): void {
    if (this.#paused !== null) return;
    while (this.#queue.length > 0 && (this.#slots.size < this.#o.slots || this.#preempt())) {
      const seq = this.#takeNext();
      // A retracted sequence recomputes what it had: its prompt and the tokens generated so far.
      const prompt = seq.retracted
        ? [...seq.input.promptIds, ...seq.input.outputIds.slice(0, seq.generated)]
        : seq.input.promptIds;
      seq.retracted = false;
      const cached = Math.min(this.#cache.match(blockHashes(prompt)), Math.max(0, prompt.length - 1));
      seq.cachedTokens = cached;
      seq.prefillLeft = Math.max(1, prompt.length - cached);
      seq.state = 'prefill';
      seq.admittedAt = this.#now;
      this.#slots.add(seq);
      this.#c.admitted++;
      this.#c.promptTokens += prompt.length;
      this.#c.cachedTokens += cached;
    }
  }

  #startStep(start: number): void {
    if (this.#slots.size === 0 || this.#paused !== null) {
      this.#step = null;
      return;
    }
    const decode: Sequence[] = [];
    const prefill: [Sequence, number][] = [];
    let kvTokens = 0;
    for (const seq of this.#slots) {
      if (seq.state !== 'decode') continue;
      decode.push(seq);
      kvTokens += seq.kvTokens;
    }
    let budget = Math.max(1, this.#o.prefillChunkTokens - decode.length);
    let prefillTokens = 0;
    for (const seq of this.#slots) {
      if (budget === 0) break;
      if (seq.state !== 'prefill') continue;
      const take = Math.min(seq.prefillLeft, budget);
      prefill.push([seq, take]);
      budget -= take;
      prefillTokens += take;
    }
    const prefillMs = (prefillTokens * 1000) / this.#o.prefillTokensPerSecond;
    const ms =
      this.#o.decodeMs + this.#o.decodeMsPerSeq * decode.length + this.#o.decodeMsPerKvToken * kvTokens + prefillMs;
    this.#step = { start, end: start + ms, decode, prefill, prefillMs, kvTokens };
  }

  #endStep(done: Sequence[]): void {
    const step = this.#step!;
    this.#account(step.end);
    this.#c.steps++;
    this.#c.prefillMs += step.prefillMs;
    this.#c.decodeSequences += step.decode.length;
    this.#c.decodeKvTokens += step.kvTokens;
    this.#c.kvReadMs += this.#o.decodeMsPerKvToken * step.kvTokens;
    for (const seq of step.decode) {
      if (seq.state !== 'decode') continue; // cancelled mid-step
      seq.generated++;
      this.#c.generatedTokens++;
      if (seq.generated >= seq.target) this.#finish(seq, done);
    }
    for (const [seq, take] of step.prefill) {
      if (seq.state !== 'prefill') continue;
      seq.prefillLeft -= take;
      this.#c.prefilledTokens += take;
      if (seq.prefillLeft > 0) continue;
      seq.state = 'decode';
      // The last chunk yields the next token: the first, or (retracted) the one after those it had.
      if (seq.target > seq.generated) {
        seq.generated++;
        seq.firstTokenAt ??= this.#now;
        this.#c.generatedTokens++;
      }
      if (seq.generated >= seq.target) this.#finish(seq, done);
    }
    if (this.#paused === 'retract') this.#retract();
    this.#admit();
    this.#startStep(this.#now);
  }

  /** Every running sequence back to the head of the queue, in admission order, its KV dropped. */
  #retract(): void {
    const back = [...this.#slots];
    for (const seq of back) {
      this.#slots.delete(seq);
      seq.state = 'queued';
      seq.prefillLeft = 0;
      seq.retracted = true;
    }
    this.#queue.unshift(...back);
  }

  #finish(seq: Sequence, done: Sequence[]): void {
    this.#leave(seq);
    seq.state = 'done';
    seq.doneAt = this.#now;
    this.#c.completed++;
    done.push(seq);
  }

  /** Frees the slot and caches what the sequence computed: its prompt and the tokens it generated. */
  #leave(seq: Sequence): void {
    this.#slots.delete(seq);
    if (seq.state === 'prefill' && seq.prefillLeft > 0) return; // its prompt was never whole in the KV cache
    const { promptIds, outputIds } = seq.input;
    this.#cache.insert(
      blockHashes(seq.generated === 0 ? promptIds : [...promptIds, ...outputIds.slice(0, seq.generated)]),
    );
  }
}

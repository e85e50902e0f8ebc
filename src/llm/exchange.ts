/**
 * One HTTP exchange — undici's own primitive, `dispatch` with a handler, instead of `request()`. An
 * inference reply is read once, whole, and parsed: `request()` builds a Readable body stream per
 * response and, given a signal, adds and removes an 'abort' listener on it per call. With hundreds of
 * calls in flight on one worker all listening on the pause gate's one signal, Node's EventTarget walks
 * that list on every add and remove; here one listener per signal cancels every call registered under
 * it (`Exchanges`), and a response is a list of chunks decoded once at its end — or, for a streamed
 * reply, handed chunk by chunk to a sink, so that a pause can hold the call with what it has.
 */
import type { Dispatcher } from 'undici';
import type { CancelSignal } from '../cancel.ts';
import { LlmError } from './errors.ts';

export interface ExchangeRequest {
  method: 'GET' | 'POST';
  path: string;
  headers: Record<string, string>;
  body?: Uint8Array | string | null;
  /**
   * Takes the body of a 200 `text/event-stream` answer chunk by chunk as it arrives, instead of it
   * being collected (a streamed completion). Any other answer is collected as usual.
   */
  events?: BodySink;
}

export interface BodySink {
  /** One chunk of the body; false when the body is unusable from here on (the exchange stops reading and cuts its connection). */
  write(chunk: Uint8Array): boolean;
}

/**
 * A streamed answer read as it arrives (llm/stream-reply.ts, llm/generate-stream.ts): the exchange
 * writes the body into it, then it makes the reply — whole, or what arrived before a pause held the call.
 */
export interface StreamSink<T> extends BodySink {
  result(): T;
  held(): T;
}

export interface ExchangeResult {
  statusCode: number;
  headers: Record<string, string | string[] | undefined>;
  /** The whole body as UTF-8 text; empty when it went to the request's `events` sink. */
  text: string;
  /** The body went to the `events` sink. */
  streamed: boolean;
  /**
   * Settled by a hold before the answer ended. The rest is read and dropped (not handed to the sink),
   * so the connection is reused when the server ends the answer (its abort); one the server has not
   * ended `holdDrainMs` after the hold is cut (vLLM and SGLang stop generating for a client that hangs up).
   */
  held: boolean;
}

/**
 * What one answer may cost. undici's `bodyTimeout` bounds only the gap between chunks, so a server that
 * keeps sending (an endless or trickling body) is bounded here: by size always, and a whole body (not
 * an event stream, which lasts as long as its generation) by time since the request was sent.
 */
export interface ExchangeLimits {
  /** `llm.maxReplyBytes` */
  maxBodyBytes: number;
  /** `llm.timeoutMs`: milliseconds from the request's send to the end of a whole body. */
  wholeBodyMs: number;
}

const NO_LIMITS: ExchangeLimits = { maxBodyBytes: Infinity, wholeBodyMs: Infinity };

/**
 * The exchanges in flight on one client, by the signal that cancels them and the one that holds them.
 * Invariant: a call is in a signal's set from dispatch until undici is done with it or the signal
 * aborts (the abort acts on every call in the set and empties it), and each signal carries at most one
 * listener from here.
 */
export class Exchanges {
  readonly #cancelling = new WeakMap<CancelSignal, Set<Exchange>>();
  readonly #holding = new WeakMap<CancelSignal, Set<Exchange>>();
  readonly #holdDrainMs: number;
  readonly #limits: ExchangeLimits;

  /**
   * `holdDrainMs`: how long a held exchange may go on reading before it is cut. Long enough for a
   * server's abort to end it (a kept connection is cheaper than a new one); short enough that a server
   * without an abort, or an abort that missed a call still in transit, does not keep a connection busy
   * and generating into the next round.
   */
  constructor({ holdDrainMs = 1_000, limits = NO_LIMITS }: { holdDrainMs?: number; limits?: ExchangeLimits } = {}) {
    this.#holdDrainMs = holdDrainMs;
    this.#limits = limits;
  }

  /**
   * Sends `request` and reads the whole answer. Rejects with undici's error (timeouts, transport), or
   * with `signal`'s reason once it aborts. `hold` aborting settles the call at once with what it has
   * (`held`), however far the answer got.
   */
  run(
    dispatcher: Dispatcher,
    origin: string,
    request: ExchangeRequest,
    signal?: CancelSignal,
    hold?: CancelSignal,
  ): Promise<ExchangeResult> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    // Already held: nothing is sent, so there is nothing to wait for (the client does not send while
    // paused; this keeps a caller that does not check from sending during a pause).
    if (hold?.aborted) return Promise.resolve({ statusCode: 0, headers: {}, text: '', streamed: false, held: true });
    return new Promise<ExchangeResult>((resolve, reject) => {
      const exchange = new Exchange(resolve, reject, request.events ?? null, this.#limits);
      if (signal !== undefined)
        exchange.track(
          callsOf(this.#cancelling, signal, (calls, reason) => calls.forEach((call) => call.cancel(reason))),
        );
      if (hold !== undefined) exchange.track(callsOf(this.#holding, hold, (calls) => this.#holdAll(calls)));
      dispatcher.dispatch(
        { origin, method: request.method, path: request.path, headers: request.headers, body: request.body ?? null },
        exchange,
      );
    });
  }

  #holdAll(calls: Exchange[]): void {
    for (const call of calls) call.hold();
    const drained = setTimeout(() => {
      for (const call of calls)
        call.cancel(
          new Error(
            `a held answer was not ended by the server within ${this.#holdDrainMs} ms (llm/exchange.ts holdDrainMs)`,
          ),
        );
    }, this.#holdDrainMs);
    drained.unref();
  }
}

function callsOf(
  bySignal: WeakMap<CancelSignal, Set<Exchange>>,
  signal: CancelSignal,
  act: (calls: Exchange[], reason: unknown) => void,
): Set<Exchange> {
  let calls = bySignal.get(signal);
  if (calls === undefined) {
    const set = new Set<Exchange>();
    signal.addEventListener(
      'abort',
      () => {
        const now = [...set];
        set.clear();
        act(now, signal.reason);
      },
      { once: true },
    );
    bySignal.set(signal, set);
    calls = set;
  }
  return calls;
}

/**
 * undici's handler for one exchange; settles its promise exactly once. A hold settles it early, and it
 * stays registered (cancellable) until undici is done with it.
 */
class Exchange implements Dispatcher.DispatchHandler {
  readonly #resolve: (result: ExchangeResult) => void;
  readonly #reject: (err: unknown) => void;
  readonly #events: BodySink | null;
  readonly #limits: ExchangeLimits;
  /** When undici wrote the request (a call queued for a connection has not started its budget). */
  #sentAt = 0;
  #bytes = 0;
  /** The sets this call is registered in (by its cancel and hold signals). */
  #sets: Set<Exchange>[] | null = null;
  #controller: Dispatcher.DispatchController | null = null;
  /** Set when cancelled before undici handed over its controller: it aborts as soon as it does. */
  #cancelReason: unknown = undefined;
  #statusCode = 0;
  #headers: ExchangeResult['headers'] = {};
  #chunks: Buffer[] = [];
  /** The body goes to `#events` (a 200 event stream), not to `#chunks`. */
  #streamed = false;
  #settled = false;
  #done = false;

  constructor(
    resolve: (result: ExchangeResult) => void,
    reject: (err: unknown) => void,
    events: BodySink | null,
    limits: ExchangeLimits,
  ) {
    this.#resolve = resolve;
    this.#reject = reject;
    this.#events = events;
    this.#limits = limits;
  }

  track(calls: Set<Exchange>): void {
    calls.add(this);
    (this.#sets ??= []).push(calls);
  }

  cancel(reason: unknown): void {
    if (this.#done) return;
    const error = reason ?? new Error('aborted');
    if (this.#controller !== null) this.#controller.abort(error as Error);
    else this.#cancelReason = error;
  }

  /** Settle now with what has arrived; a call not yet sent is cancelled instead (the server never saw it). */
  hold(): void {
    if (this.#settled) return;
    if (this.#controller === null) this.#cancelReason = new Error('held by a pause before it was sent');
    this.#answer('', true);
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller;
    this.#sentAt = performance.now();
    if (this.#cancelReason !== undefined) controller.abort(this.#cancelReason as Error);
  }

  onResponseStart(
    _controller: Dispatcher.DispatchController,
    statusCode: number,
    headers: ExchangeResult['headers'],
  ): void {
    this.#statusCode = statusCode;
    this.#headers = headers;
    const type = headers['content-type'];
    this.#streamed =
      this.#events !== null && statusCode === 200 && typeof type === 'string' && type.startsWith('text/event-stream');
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.#settled) return; // held: the rest is dropped
    this.#bytes += chunk.length;
    const limits = this.#limits;
    if (this.#bytes > limits.maxBodyBytes) {
      this.#fail(
        controller,
        new LlmError(
          'ERR_LLM_BAD_REPLY',
          `inference reply is larger than llm.maxReplyBytes = ${limits.maxBodyBytes} bytes; cut at ${this.#bytes}`,
        ),
      );
      return;
    }
    if (!this.#streamed) {
      const ms = performance.now() - this.#sentAt;
      if (ms > limits.wholeBodyMs) {
        this.#fail(
          controller,
          new LlmError(
            'ERR_LLM_TIMEOUT',
            `inference reply still arriving after ${Math.round(ms)} ms (llm.timeoutMs = ${limits.wholeBodyMs}); cut at ${this.#bytes} bytes`,
          ),
        );
        return;
      }
      this.#chunks.push(chunk);
      return;
    }
    if (this.#events!.write(chunk)) return;
    // The sink cannot use the rest (a bad event): answer now with what it has, and stop reading.
    this.#answer('', false);
    controller.abort(new Error('the event stream is unusable from here on'));
  }

  onResponseEnd(): void {
    this.#finish();
    if (this.#settled) return;
    const chunks = this.#chunks;
    const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
    // A UTF-8 byte order mark is not part of the text (as undici's own body.text() reads it).
    this.#answer(body.toString('utf8', hasBom(body) ? 3 : 0), false);
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.#finish();
    if (this.#settled) return;
    this.#settle();
    this.#reject(error);
  }

  /** Reject with `error` and stop reading: the connection is cut (its answer is unusable). */
  #fail(controller: Dispatcher.DispatchController, error: LlmError): void {
    this.#settle();
    this.#reject(error);
    controller.abort(error);
  }

  /** Settle with the answer so far: its status and headers, `text` (empty when streamed or held). */
  #answer(text: string, held: boolean): void {
    this.#settle();
    this.#resolve({ statusCode: this.#statusCode, headers: this.#headers, text, streamed: this.#streamed, held });
  }

  #settle(): void {
    this.#settled = true;
    this.#chunks = [];
  }

  /** undici is done with the exchange: nothing can cancel or hold it any more. */
  #finish(): void {
    this.#done = true;
    if (this.#sets !== null) for (const calls of this.#sets) calls.delete(this);
    this.#sets = null;
  }
}

function hasBom(bytes: Buffer): boolean {
  return bytes.length >= 3 && bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf;
}

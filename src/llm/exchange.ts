/**
 * One HTTP exchange read whole — undici's own primitive, `dispatch` with a handler, instead of
 * `request()`. An inference reply is read once, whole, and parsed: `request()` builds a Readable body
 * stream per response and, given a signal, adds and removes an 'abort' listener on it per call. With
 * hundreds of calls in flight on one worker all listening on the pause gate's one signal, Node's
 * EventTarget walks that list on every add and remove; here one listener per signal cancels every call
 * registered under it (`Exchanges`), and a response is a list of chunks decoded once at its end.
 */
import type { Dispatcher } from 'undici';
import type { CancelSignal } from '../cancel.ts';

export interface ExchangeRequest {
  method: 'GET' | 'POST';
  path: string;
  headers: Record<string, string>;
  body?: Uint8Array | string | null;
}

export interface ExchangeResult {
  statusCode: number;
  headers: Record<string, string | string[] | undefined>;
  /** The whole body as UTF-8 text. */
  text: string;
}

/**
 * The exchanges in flight on one client, by the signal that cancels them. Invariant: a call is in its
 * signal's set from dispatch until it settles or the signal aborts (the abort cancels every call in
 * the set and empties it), and each signal carries at most one listener from here.
 */
export class Exchanges {
  readonly #bySignal = new WeakMap<CancelSignal, Set<Exchange>>();

  /**
   * Sends `request` and reads the whole answer. Rejects with undici's error (timeouts, transport), or
   * with the signal's reason once it aborts.
   */
  run(dispatcher: Dispatcher, origin: string, request: ExchangeRequest, signal?: CancelSignal): Promise<ExchangeResult> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise<ExchangeResult>((resolve, reject) => {
      const calls = signal === undefined ? null : this.#callsOf(signal);
      const exchange = new Exchange(resolve, reject, calls);
      calls?.add(exchange);
      dispatcher.dispatch({ origin, method: request.method, path: request.path, headers: request.headers, body: request.body ?? null }, exchange);
    });
  }

  #callsOf(signal: CancelSignal): Set<Exchange> {
    let calls = this.#bySignal.get(signal);
    if (calls === undefined) {
      const set = new Set<Exchange>();
      signal.addEventListener('abort', () => {
        for (const call of set) call.cancel(signal.reason);
        set.clear();
      }, { once: true });
      this.#bySignal.set(signal, set);
      calls = set;
    }
    return calls;
  }
}

/** undici's handler for one exchange; settles its promise exactly once. */
class Exchange implements Dispatcher.DispatchHandler {
  readonly #resolve: (result: ExchangeResult) => void;
  readonly #reject: (err: unknown) => void;
  readonly #calls: Set<Exchange> | null;
  #controller: Dispatcher.DispatchController | null = null;
  /** Set when cancelled before undici handed over its controller: it aborts as soon as it does. */
  #cancelReason: unknown = undefined;
  #statusCode = 0;
  #headers: ExchangeResult['headers'] = {};
  #chunks: Buffer[] = [];
  #settled = false;

  constructor(resolve: (result: ExchangeResult) => void, reject: (err: unknown) => void, calls: Set<Exchange> | null) {
    this.#resolve = resolve;
    this.#reject = reject;
    this.#calls = calls;
  }

  cancel(reason: unknown): void {
    if (this.#settled) return;
    const error = reason ?? new Error('aborted');
    if (this.#controller !== null) this.#controller.abort(error as Error);
    else this.#cancelReason = error;
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.#controller = controller;
    if (this.#cancelReason !== undefined) controller.abort(this.#cancelReason as Error);
  }

  onResponseStart(_controller: Dispatcher.DispatchController, statusCode: number, headers: ExchangeResult['headers']): void {
    this.#statusCode = statusCode;
    this.#headers = headers;
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    this.#chunks.push(chunk);
  }

  onResponseEnd(): void {
    const chunks = this.#chunks;
    const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
    // A UTF-8 byte order mark is not part of the text (as undici's own body.text() reads it).
    const text = body.toString('utf8', hasBom(body) ? 3 : 0);
    this.#settle();
    this.#resolve({ statusCode: this.#statusCode, headers: this.#headers, text });
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.#settle();
    this.#reject(error);
  }

  #settle(): void {
    this.#settled = true;
    this.#chunks = [];
    this.#calls?.delete(this);
  }
}

function hasBom(bytes: Buffer): boolean {
  return bytes.length >= 3 && bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf;
}

/**
 * Fault injection for reliability tests (options.ts): per-request rates of 500s, 429s with
 * `Retry-After: 0`, connection resets, hangs, non-JSON bodies and bodies cut short.
 *
 * Invariant: the fault a request draws depends on the server seed and the request's index only (one
 * die, on a sub-stream of the seed that the policy never reads), so a sequential client sees the same
 * faults on every run, and turning faults on never changes the replies of the requests that draw none.
 */
import type { ServerResponse } from 'node:http';
import { createRng, mixSeeds } from '../env/synthetic/rng.ts';
import { errorBody, sendJson, sendText } from './http-replies.ts';
import { MOCK_FAULTS, type MockFaultOption, type ResolvedMockLlmOptions } from './options.ts';

/** The kinds of injected faults, one per rate option. */
export type MockFault = 'error' | 'rateLimit' | 'reset' | 'hang' | 'malformed' | 'truncate';
const FAULT_OF: Record<MockFaultOption, MockFault> = {
  errorRate: 'error',
  rateLimitRate: 'rateLimit',
  resetRate: 'reset',
  hangRate: 'hang',
  malformedRate: 'malformed',
  truncateRate: 'truncate',
};
/** Faults that spoil the generated reply (after the usual generation time) instead of answering at once. */
export type ReplyFault = 'malformed' | 'truncate';

/** Sub-stream of the server seed, so fault injection never perturbs the policy's choices. */
const ERROR_STREAM = 0xe7707;

export class FaultInjector {
  readonly #options: ResolvedMockLlmOptions;
  readonly #anyFault: boolean;
  /** Requests that drew each fault (stats().faults). */
  readonly #counts: Record<MockFault, number> = {
    error: 0,
    rateLimit: 0,
    reset: 0,
    hang: 0,
    malformed: 0,
    truncate: 0,
  };
  /** Requests held by `hangRate`: released only by the client hanging up or close(). */
  readonly #hung = new Set<ServerResponse>();

  /** Called after a request is held or released (waitForStats). */
  readonly #onChange: () => void;

  constructor(options: ResolvedMockLlmOptions, onChange: () => void = () => {}) {
    this.#options = options;
    this.#onChange = onChange;
    this.#anyFault = MOCK_FAULTS.some((name) => options[name] > 0);
  }

  get counts(): Record<MockFault, number> {
    return { ...this.#counts };
  }

  /** Requests held unanswered right now. */
  get hanging(): number {
    return this.#hung.size;
  }

  /**
   * Applies the faults that replace the answer: 'answered' when the request is dealt with (answered,
   * reset or held). A reply fault is returned for deliver() to apply to the generated reply; null = none.
   */
  inject(res: ServerResponse, index: number): 'answered' | ReplyFault | null {
    const fault = this.#draw(index);
    if (fault === null) return null;
    this.#counts[fault] += 1;
    switch (fault) {
      case 'error':
        sendJson(res, 500, errorBody(`injected error (errorRate=${this.#options.errorRate})`, 'server_error'));
        return 'answered';
      case 'rateLimit':
        sendJson(
          res,
          429,
          errorBody(`injected rate limit (rateLimitRate=${this.#options.rateLimitRate})`, 'rate_limit_error'),
          { 'retry-after': '0' },
        );
        return 'answered';
      case 'reset': {
        // RST rather than FIN: what a crashed proxy or a killed server process looks like to the client.
        const socket = res.socket;
        if (socket !== null && typeof socket.resetAndDestroy === 'function') socket.resetAndDestroy();
        else res.destroy();
        return 'answered';
      }
      case 'hang':
        this.#hung.add(res);
        res.once('close', () => {
          this.#hung.delete(res);
          this.#onChange();
        });
        this.#onChange();
        return 'answered';
      default:
        return fault;
    }
  }

  /** On close: held requests are never answered, so cut them rather than wait for the clients' timeouts. */
  releaseHung(): void {
    for (const res of this.#hung) res.destroy();
  }

  /**
   * The fault request `index` draws, if any: one die from (seed, index), the rates laid out as bands in
   * MOCK_FAULTS order (errorRate first, so runs that only set it fault exactly the requests they did
   * before the other knobs existed). Faults follow the request counter even for seeded requests: a
   * retry with the same seed must be able to succeed.
   */
  #draw(index: number): MockFault | null {
    if (!this.#anyFault) return null;
    const u = createRng(mixSeeds(this.#options.seed, index, ERROR_STREAM)).next();
    let edge = 0;
    for (const name of MOCK_FAULTS) {
      edge += this.#options[name];
      if (u < edge) return FAULT_OF[name];
    }
    return null;
  }
}

/** Sends a generated reply, spoilt by the request's reply fault if it drew one. */
export function deliver(res: ServerResponse, text: string, fault: ReplyFault | null): void {
  if (fault === null || res.headersSent || res.destroyed) {
    sendText(res, 200, text);
    return;
  }
  // Half of the completion's JSON: a prefix of a JSON object is never JSON (its closing brace is the last byte).
  const body = Buffer.from(text, 'utf8');
  const cut = body.subarray(0, Math.max(1, body.length >> 1));
  if (fault === 'malformed') {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': cut.length }).end(cut);
    return;
  }
  // truncate: promise the whole body, send half of it, then cut the connection once that half is flushed.
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
  res.write(cut, () => res.destroy());
}

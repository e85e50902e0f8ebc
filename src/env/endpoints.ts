/**
 * What every env-server client (http-env.ts, gym-http.ts, nemo-gym.ts, openenv.ts) knows about
 * reaching its servers over undici: how long connections live, which failures prove a request never
 * left this process, and how new episodes are spread over the servers.
 */

/** undici's own default, kept explicit: it must stay below servers' keep-alive timeouts (Node: 5 s, uvicorn as NeMo Gym runs it: 30 s). */
export const KEEP_ALIVE_TIMEOUT_MS = 4_000;
export const MAX_CONNECT_TIMEOUT_MS = 10_000;

/**
 * Failures that happen before a single byte of the request is written: the connection was never
 * established, so the server cannot have seen the call. Only these make a call that is not idempotent
 * (a step, a tool call) safe to retry. (ECONNRESET / "other side closed" are NOT here: on a reused
 * keep-alive connection they can happen after the server read the request.)
 */
export const NOT_SENT_CODES: ReadonlySet<string> = new Set([
  'ECONNREFUSED',
  'UND_ERR_CONNECT_TIMEOUT',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EADDRNOTAVAIL',
]);
export const TIMEOUT_CODES: ReadonlySet<string> = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT']);

/**
 * Picks the server for a new episode: the one with the fewest live episodes, ties going to the next
 * after the last one picked, so equal servers take turns.
 */
export class LeastBusy<T extends { live: number }> {
  readonly #items: readonly T[];
  #cursor = 0;

  constructor(items: readonly T[]) {
    this.#items = items;
  }

  pick(): T {
    const items = this.#items;
    const n = items.length;
    let best = this.#cursor % n;
    for (let k = 1; k < n; k++) {
      const i = (this.#cursor + k) % n;
      if (items[i].live < items[best].live) best = i;
    }
    this.#cursor = best + 1;
    return items[best];
  }
}

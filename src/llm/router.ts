/**
 * Routes a worker's inference calls across endpoints and policies.
 *
 * - Session affinity (`llm.routing: session`, the default): a session (one rollout, or one agent of it)
 *   stays on the endpoint it started on, so the server's prefix cache holds its conversation; new
 *   sessions go to the endpoint with the fewest requests outstanding from this worker (ties:
 *   round-robin). `round-robin` sends each call to the next endpoint in turn, whatever its session:
 *   no affinity, the baseline session routing is measured against (docs/FLEET.md).
 * - The default policy's endpoints may change at run time (`setEndpoints`, from the control API's
 *   `POST /endpoints`): a new endpoint has nothing outstanding, so the next new sessions go to it; a
 *   session whose endpoint was removed moves at its next call, and the removed endpoint's connections
 *   close once its calls in flight are done.
 * - Policies: in a multi-agent environment each agent id may have its own endpoints, model,
 *   temperature and max tokens (`llm.policies`); agents without one use the default policy.
 * - A per-worker concurrency limit (`llm.maxConcurrency`) caps calls in flight, as the reference's
 *   LLM semaphore does.
 * - Failover: a call that fails the way a down server fails (llm/errors.ts `isOutageError`) is sent
 *   again to another endpoint of its policy, and its session moves there; the endpoint that failed
 *   gets no new session for ENDPOINT_REST_MS, doubled at each failure in a row up to MAX_REST_MS
 *   (a dead server is not handed a wave of sessions every few seconds), unless every endpoint is
 *   resting; a call it answers ends its rest. Only when every
 *   endpoint has failed the call does it reach the agent loop — an outage is when no endpoint answers.
 */
import type { ChatResult } from './reply.ts';
import type { CancelSignal } from '../cancel.ts';
import { Slots } from '../slots.ts';
import { LlmClient, type LlmClientOptions } from './client.ts';
import type { ChatRequest } from './request.ts';
import type { SamplingSettings } from './token-wire.ts';
import { isOutageError, LlmError } from './errors.ts';
import type { ServerKind } from './servers.ts';
import type { ChatModel } from '../chat-model/model.ts';

export interface PolicySettings {
  urls: string[];
  model: string;
  temperature: number | null;
  /** Truncation and penalties this agent samples with in place of the task's, setting by setting; absent or null = the task's. */
  sampling?: SamplingSettings | null;
  maxTokens: number | null;
}

export interface RouterOptions {
  /** Client settings shared by every endpoint (model, url and server are per endpoint). */
  client: Omit<LlmClientOptions, 'url' | 'model' | 'server' | 'chatModel'>;
  /** Each endpoint's dialect and context length, as probed at start (llm/servers.ts). */
  servers?: Record<string, { kind: ServerKind; contextLength: number | null }>;
  /** For an endpoint not probed (a test's own pool): `llm.server`, or generic under `auto`. */
  fallbackServer?: { kind: ServerKind; contextLength: number | null };
  /** The policy's tokenizer for `api: tokens` (`llm.tokenizer`); null in chat mode. */
  tokenizer?: string | null;
  default: PolicySettings;
  policies: Record<string, PolicySettings>;
  maxConcurrency: number | null;
  /** `llm.routing`: `session` (affinity, the default) or `round-robin` (each call to the next endpoint). */
  routing?: Routing;
}

/** `llm.routing` (config.ts). */
export type Routing = 'session' | 'round-robin';

/** What the start-up probe (or a join's) learnt of an endpoint: its dialect and context length. */
export type EndpointServer = { kind: ServerKind; contextLength: number | null };

export interface Route {
  /** Session id for affinity (and the session path): the rollout id. */
  session: string;
  /** Agent id in a multi-agent environment; undefined = the default policy. */
  agent?: string;
}

interface Endpoint {
  /** As configured (`llm.url`, or as joined). */
  url: string;
  client: LlmClient;
  outstanding: number;
  /** `outstanding--`, made once per endpoint: a closure made per call lives as long as the call. */
  settled: () => void;
  /** performance.now() until which new sessions avoid it: it just failed a call as a down server does. */
  restingUntil: number;
  /** Calls failed as a down server fails since it last answered one: the rest doubles with each. */
  failures: number;
  /** Taken out of the policy (setEndpoints): its sessions move at their next call. */
  removed: boolean;
  /** Set on removal: closes the client once nothing is outstanding on it. */
  drained: (() => void) | null;
}

/** How long an endpoint that failed a call as a down server does gets no new session (if another can take it). */
const ENDPOINT_REST_MS = 5_000;
/** The longest rest: a server back is given sessions again within this. */
const MAX_REST_MS = 60_000;

function endpointOf(url: string, client: LlmClient): Endpoint {
  const endpoint: Endpoint = {
    url,
    client,
    outstanding: 0,
    settled: () => {
      if (--endpoint.outstanding === 0) endpoint.drained?.();
    },
    restingUntil: 0,
    failures: 0,
    removed: false,
    drained: null,
  };
  return endpoint;
}

interface Policy {
  settings: PolicySettings;
  endpoints: Endpoint[];
  next: number;
}

export class LlmRouter {
  readonly #policies = new Map<string, Policy>();
  readonly #default: Policy;
  /** session key → endpoint; entries live from a session's first call to endSession(). */
  readonly #affinity = new Map<string, Endpoint>();
  /** Calls in flight on this worker (`llm.maxConcurrency`). */
  readonly #calls: Slots;
  /** session → its per-agent affinity keys (multi-agent sessions only), so endSession does not scan every key. */
  readonly #agentKeys = new Map<string, string[]>();
  readonly #roundRobin: boolean;
  /** One client per distinct (url, model): policies sharing a server share its connection pool. */
  readonly #clients = new Map<string, LlmClient>();
  /** Makes the client of (url, model), or finds the one there is. */
  readonly #clientOf: (url: string, model: string, server?: EndpointServer) => LlmClient;

  constructor(options: RouterOptions, hooks: Pick<LlmClientOptions, 'paused' | 'onSend' | 'hold' | 'warn'> = {}) {
    const tokenizer = options.tokenizer ?? null;
    // Loaded on the first token-in call, once per worker (a multi-megabyte JSON), shared by every client.
    let model: Promise<ChatModel> | null = null;
    const chatModel =
      tokenizer === null
        ? undefined
        : () => (model ??= import('../chat-model/model.ts').then((m) => m.loadChatModel(tokenizer)));
    this.#clientOf = (url, modelName, probed) => {
      const key = `${url}\u0000${modelName}`;
      let client = this.#clients.get(key);
      const server = probed ?? options.servers?.[url] ?? options.fallbackServer;
      if (!client)
        this.#clients.set(
          key,
          (client = new LlmClient({ ...options.client, ...hooks, url, model: modelName, server, chatModel })),
        );
      return client;
    };
    const build = (settings: PolicySettings): Policy => ({
      settings,
      next: 0,
      endpoints: settings.urls.map((url) => endpointOf(url, this.#clientOf(url, settings.model))),
    });
    this.#default = build(options.default);
    for (const [agent, settings] of Object.entries(options.policies)) this.#policies.set(agent, build(settings));
    this.#calls = new Slots(options.maxConcurrency ?? Infinity);
    this.#roundRobin = options.routing === 'round-robin';
  }

  /**
   * The default policy's endpoints are now `urls` (`llm.url` changed at run time): endpoints kept keep
   * their sessions and counts, new ones get the next new sessions (they have nothing outstanding), and
   * removed ones take no new call — their sessions move at their next call — and close their
   * connections once their calls in flight are done. `servers`: what was probed of the new ones.
   */
  setEndpoints(urls: readonly string[], servers: Record<string, EndpointServer> = {}): void {
    if (urls.length === 0) throw new Error('setEndpoints: at least one endpoint');
    const policy = this.#default;
    const model = policy.settings.model;
    const byUrl = new Map(policy.endpoints.map((e) => [e.url, e]));
    const next = [...new Set(urls)].map((url) => {
      const kept = byUrl.get(url);
      if (kept !== undefined) {
        byUrl.delete(url);
        return kept;
      }
      return endpointOf(url, this.#clientOf(url, model, servers[url]));
    });
    policy.endpoints = next;
    policy.settings = { ...policy.settings, urls: next.map((e) => e.url) };
    policy.next = 0;
    for (const gone of byUrl.values()) {
      gone.removed = true;
      const client = gone.client;
      gone.drained = () => {
        const stillUsed = [this.#default, ...this.#policies.values()].some((p) =>
          p.endpoints.some((e) => e.client === client),
        );
        if (stillUsed) return;
        this.#clients.delete(`${gone.url}\u0000${model}`);
        void client.close().catch(() => undefined);
      };
      if (gone.outstanding === 0) gone.drained();
    }
  }

  /** The default policy's endpoint URLs now. */
  get endpoints(): string[] {
    return this.#default.endpoints.map((e) => e.url);
  }

  chat(request: ChatRequest, signal: CancelSignal | undefined, route: Route): Promise<ChatResult> {
    const policy = (route.agent !== undefined ? this.#policies.get(route.agent) : undefined) ?? this.#default;
    const key = route.agent === undefined ? route.session : `${route.session}\u0000${route.agent}`;
    let endpoint = this.#roundRobin ? pickNext(policy) : this.#affinity.get(key);
    if (endpoint?.removed) {
      // Its endpoint left the fleet: the session moves (a new server prefills its conversation once).
      endpoint.client.endSession(key);
      this.#affinity.delete(key);
      endpoint = undefined;
    }
    if (endpoint === undefined) {
      endpoint = pickLeastOutstanding(policy)!;
      this.#affinity.set(key, endpoint);
    }
    // Under round-robin too: endSession forgets each agent's conversation wherever it is kept.
    if (route.agent !== undefined) {
      const keys = this.#agentKeys.get(route.session);
      if (keys === undefined) this.#agentKeys.set(route.session, [key]);
      else if (!keys.includes(key)) keys.push(key);
    }
    const { temperature, sampling = null, maxTokens } = policy.settings;
    // As the group's record says (config.ts samplingRecord): the policy's settings replace the task's one by one.
    const effective: ChatRequest =
      temperature === null && sampling === null && maxTokens === null
        ? request
        : {
            ...request,
            temperature: temperature ?? request.temperature,
            ...(sampling !== null ? { sampling: { ...request.sampling, ...sampling } } : {}),
            maxTokens: maxTokens !== null ? Math.min(maxTokens, request.maxTokens) : request.maxTokens,
          };
    // Several endpoints: one suspended frame more per call in flight, the price of failing over.
    if (policy.endpoints.length > 1)
      return this.#chatFailingOver(policy, endpoint, effective, signal, route.session, key);
    return this.#send(endpoint, effective, signal, route.session, key);
  }

  #send(
    endpoint: Endpoint,
    request: ChatRequest,
    signal: CancelSignal | undefined,
    session: string,
    key: string,
  ): Promise<ChatResult> {
    if (this.#calls.size !== Infinity) return this.#chatInSlot(endpoint, request, signal, session, key);
    // No call limit: no suspended frame or closure of ours per call in flight (memory per episode), just the count.
    endpoint.outstanding++;
    const call = endpoint.client.chat(request, signal, session, key);
    call.then(endpoint.settled, endpoint.settled);
    return call;
  }

  /** The call on `endpoint`, then on each other endpoint of the policy in turn while they fail as down servers do. */
  async #chatFailingOver(
    policy: Policy,
    first: Endpoint,
    request: ChatRequest,
    signal: CancelSignal | undefined,
    session: string,
    key: string,
  ): Promise<ChatResult> {
    const tried = new Set<Endpoint>();
    for (let endpoint = first; ; ) {
      try {
        const result = await this.#send(endpoint, request, signal, session, key);
        endpoint.failures = 0;
        endpoint.restingUntil = 0;
        return result;
      } catch (err) {
        if (!isOutageError(err) || signal?.aborted) throw err;
        endpoint.failures++;
        endpoint.restingUntil =
          performance.now() + Math.min(MAX_REST_MS, ENDPOINT_REST_MS * 2 ** Math.min(endpoint.failures - 1, 16));
        tried.add(endpoint);
        const next = pickLeastOutstanding(policy, tried);
        if (next === null) throw err;
        endpoint.client.endSession(key);
        if (!this.#roundRobin) this.#affinity.set(key, next);
        endpoint = next;
      }
    }
  }

  async #chatInSlot(
    endpoint: Endpoint,
    request: ChatRequest,
    signal: CancelSignal | undefined,
    session: string,
    conversation: string,
  ): Promise<ChatResult> {
    try {
      await this.#calls.acquire(signal);
    } catch (reason) {
      throw new LlmError(
        'ERR_LLM_ABORTED',
        `inference call cancelled while waiting for a slot (llm.maxConcurrency): ${reason instanceof Error ? reason.message : String(reason)}`,
      );
    }
    endpoint.outstanding++;
    try {
      return await endpoint.client.chat(request, signal, session, conversation);
    } finally {
      endpoint.settled();
      this.#calls.release();
    }
  }

  /** Forget a session's endpoints (its episode ended), and what their clients held of it. */
  endSession(session: string): void {
    const keys = this.#agentKeys.get(session);
    this.#agentKeys.delete(session);
    if (this.#roundRobin) {
      // Any client may hold some of it, an agent's policy's as well as the default's: api: tokens keeps
      // each conversation's whole sequence, up to SESSIONS_KEPT of them a client (regression: only the
      // default policy's clients forgot the session, and none an agent's conversation).
      for (const client of this.#clients.values()) {
        client.endSession(session);
        if (keys !== undefined) for (const key of keys) client.endSession(key);
      }
    }
    this.#affinity.get(session)?.client.endSession(session);
    this.#affinity.delete(session);
    if (keys === undefined) return;
    for (const key of keys) {
      this.#affinity.get(key)?.client.endSession(key);
      this.#affinity.delete(key);
    }
  }

  /** `api: tokens`: conversations the clients keep for their next turn, every client together. */
  conversationsHeld(): number {
    let n = 0;
    for (const client of this.#clients.values()) n += client.conversationsHeld;
    return n;
  }

  /** Requests outstanding per endpoint URL of the default policy (for tests and stats). */
  outstanding(): number[] {
    return this.#default.endpoints.map((e) => e.outstanding);
  }

  async close(): Promise<void> {
    await Promise.all([...this.#clients.values()].map((c) => c.close()));
  }
}

/** Round-robin: the next endpoint in turn, skipping resting ones while any is not resting. */
function pickNext(policy: Policy): Endpoint {
  const n = policy.endpoints.length;
  const now = n > 1 ? performance.now() : 0;
  let pick = policy.endpoints[policy.next % n];
  for (let i = 0; i < n; i++) {
    const e = policy.endpoints[(policy.next + i) % n];
    if (e.restingUntil <= now) {
      pick = e;
      break;
    }
  }
  policy.next = (policy.next + 1) % n;
  return pick;
}

/**
 * The endpoint with the fewest requests outstanding (ties: round-robin), among those not resting when
 * there are any; never one in `skip`. Null when every endpoint is skipped.
 */
function pickLeastOutstanding(policy: Policy, skip?: ReadonlySet<Endpoint>): Endpoint | null {
  const n = policy.endpoints.length;
  const now = n > 1 ? performance.now() : 0;
  let best: Endpoint | null = null;
  for (let i = 0; i < n; i++) {
    const e = policy.endpoints[(policy.next + i) % n];
    if (skip?.has(e)) continue;
    if (best === null) best = e;
    else {
      const resting = e.restingUntil > now;
      const bestResting = best.restingUntil > now;
      if (resting === bestResting ? e.outstanding < best.outstanding : bestResting) best = e;
    }
  }
  policy.next = (policy.next + 1) % n;
  return best;
}

/**
 * Environments behind an env server, as ordinary `Environment`s: the agent loop cannot tell an HTTP
 * actor from an in-process one. Two protocols of the same five calls are spoken:
 *
 *   `rollout`: rollout env-server's protocol (docs/ARCHITECTURE.md, "Environments over HTTP")
 *   reset           POST   /{name}/{id}/reset            {"env_param": line, "seed": seed}      → {observation, info}
 *   getTaskPrompt   GET    /{name}/{id}/get_task_prompt  → [chat message, …]
 *   step            POST   /{name}/{id}/step             {"action": action, "step": n}          → {observation, reward, terminated, truncated, info}
 *   close           DELETE /{name}/{id}                  (200 even for an unknown id)
 *   prewarm         GET    /envs                         → {"envs": [name, …]} (or a bare array)
 *
 *   `safactory`: Safactory's env service (env/app.py of github.com/AI45Lab/SAfactory, read at
 *   4fbd77abcb7bc23b370e99ad2c98c03d54822bbd)
 *   reset           {"env_param": {...env.params, "dataset": line}, "seed": seed}: on an id's first
 *                   reset env_param becomes the environment's constructor kwargs (Safactory's own
 *                   launcher builds it so: core/data_manager/load_yaml.py); a later reset of the
 *                   same id reuses that instance and ignores env_param
 *   step            {"action": action}: no step index, and every step received is applied
 *   prewarm         GET /envs → {"envs": [{"envname", "id", "state": "ready" | "pending"}, …]}: the
 *                   live instances of every client, not the environments served
 *
 * `auto` (the config's default) tells them apart by each server's GET /envs, once per server and client.
 *
 * One undici Pool per server URL, shared by every actor of this client (so a worker keeps a handful
 * of keep-alive connections per server, not one per episode).
 *
 * Retries: 5xx, timeouts and transport errors are retried with exponential backoff; a 4xx is not (it is
 * the caller's mistake or an unknown id, and asking again gives the same answer). `step` is the
 * exception: it is not idempotent, so it is retried only when the request provably never left this
 * process (connect errors), or when the server deduplicates by the step index we send (`dedupeSteps`,
 * which a Safactory server cannot: it gets no index).
 */
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { threadId } from 'node:worker_threads';
import { Pool } from 'undici';
import { createLogger } from '../log.ts';
import { ConfigError, preview, serverMessage } from '../errors.ts';
import {
  protocolConflicts,
  formatConflict,
  type EnvProtocol,
  type EnvProtocolSetting,
  type GymHttpSettings,
  type OpenEnvSettings,
} from './protocol.ts';
import {
  LeastBusy,
  KEEP_ALIVE_TIMEOUT_MS,
  MAX_CONNECT_TIMEOUT_MS,
  NOT_SENT_CODES,
  TIMEOUT_CODES,
} from './endpoints.ts';
import { EnvError } from './errors.ts';
import { checkAgentPrompts, checkStepResult, EnvReplyError } from './replies.ts';
import type {
  AgentActions,
  AgentPrompts,
  Environment,
  EnvParams,
  ResetOptions,
  ResetResult,
  StepResult,
} from './types.ts';
import type { ChatMessage } from '../domain/rollout.ts';

export interface HttpEnvOptions {
  /** Env servers serving `name`; new actors are spread over them (least busy first, then round-robin). */
  urls: string[];
  /** The environment's name on the servers: the first path segment of every call. */
  name: string;
  /** Budget of one HTTP attempt (connect + headers + body), not of the retried call. */
  timeoutMs: number;
  /** Extra attempts after the first, for the failures that may be retried (see the module comment). */
  retries: number;
  /** Wait before retry k (1-based) is `retryBackoffMs × 2^(k−1)`. */
  retryBackoffMs: number;
  /** Replies larger than this fail with ERR_ENV_TOO_LARGE (bytes are counted while reading). */
  maxResponseBytes: number;
  /** The servers return the cached reply for a repeated step index: `step` may then be retried like any call. */
  dedupeSteps: boolean;
  /**
   * Which protocol the servers speak (see the module comment); `auto`: told by each server's GET /envs,
   * asked before the first reset. Omitted: `rollout`, so code written before there were protocols makes
   * exactly the calls it made (the config's default is `auto`).
   */
  protocol?: EnvProtocolSetting;
  /**
   * The task's `env.params`. A Safactory server gets them in every reset's env_param, beside the
   * dataset line; a rollout env-server takes none (its environments get theirs from the server).
   */
  params?: EnvParams;
  /** Protocol `gym-http` only: how replies become actions, and the system message (env/gym-http.ts). */
  gym?: GymHttpSettings;
  /** `protocol: "openenv"` only (env/openenv.ts): which observation and action fields make the conversation. */
  openenv?: OpenEnvSettings;
  /** Connections per server URL (default 64). */
  connections?: number;
  /** Where a failed DELETE is reported (it never fails the episode); default: a pino logger on stderr. */
  logger?: EnvWarningLogger;
}

export interface EnvWarningLogger {
  warn(details: object, message: string): void;
}

/** One actor: an `Environment` bound to one env id on one server. */
export interface HttpEnvironment extends Environment {
  /** The env id on the server (unique across threads, processes and hosts). */
  readonly id: string;
  /** The server URL this actor lives on. */
  readonly url: string;
  reset(options: ResetOptions): Promise<ResetResult>;
  getTaskPrompt(): Promise<ChatMessage[] | AgentPrompts>;
  step(action: string | AgentActions): Promise<StepResult>;
  close(): Promise<void>;
}

export interface HttpEnvironments {
  /** A fresh actor with a new env id; nothing is sent until its `reset`. */
  create(): HttpEnvironment;
  /** Checks every server is up and serves `name` (a clear error naming the URL otherwise) and opens connections. */
  prewarm(): Promise<void>;
  /** Environment names served by every URL (in the first server's order); a Safactory server lists none, so it fails. */
  listEnvs(): Promise<string[]>;
  /** Waits for pending DELETEs (bounded by the timeout), then cancels what is left (ERR_ENV_CLOSED) and closes the pools. */
  close(): Promise<void>;
}

/** The protocols this client speaks. */
const HTTP_ENV_PROTOCOLS = ['auto', 'rollout', 'safactory'] as const;

const DEFAULT_CONNECTIONS = 64;
/** Connections opened per server by prewarm (never more than `connections`). */
const PREWARM_CONNECTIONS = 4;

interface Endpoint {
  /** As configured, without a trailing slash: used in messages. */
  readonly url: string;
  /** Path prefix of the URL (`http://h:1/api` → `/api`), prepended to every route. */
  readonly prefix: string;
  readonly pool: Pool;
  /** Actors created on this server and not closed yet: the "busy" measure for spreading new actors. */
  live: number;
  /** The protocol it speaks, once known (asked once per client; a failed ask is not kept). */
  protocol: Promise<EnvProtocol> | null;
}

/** One live instance in a Safactory server's GET /envs (any client's). */
interface SafactoryInstance {
  envname: string;
  id: string;
  state: string;
}

/**
 * A GET /envs reply: names (rollout), live instances (Safactory), or an empty list, which either
 * could send: a Safactory server before its first reset, or a rollout server serving nothing.
 */
type EnvListing =
  | { kind: 'names'; names: string[]; dedupesSteps: boolean }
  | { kind: 'instances'; instances: SafactoryInstance[] }
  | { kind: 'empty' };

/**
 * How an attempt failed decides what may happen next:
 * - `not-sent`: the server never saw it: every call may be retried, step included;
 * - `maybe-applied`: 5xx, timeout, connection lost mid-call: retried unless it is a non-deduplicated step;
 * - `final`: 4xx, a bad or oversized reply, the client closed: asking again cannot help.
 */
type Failure = { error: EnvError; kind: 'not-sent' | 'maybe-applied' | 'final' };
type Attempt = { ok: true; body: string } | ({ ok: false } & Failure);

interface CallSpec {
  method: 'GET' | 'POST' | 'DELETE';
  /** Route under the URL's prefix, e.g. `/guess-number/abc/reset`. */
  path: string;
  body?: string;
  /** For messages: what the call was, e.g. `step 3 of env "abc"`. */
  what: string;
  /** Whether a repeat could apply the call twice (step without server-side dedupe). */
  idempotent: boolean;
}

export function createHttpEnvironments(options: HttpEnvOptions): HttpEnvironments {
  return new HttpEnvClient(options);
}

class HttpEnvClient implements HttpEnvironments {
  readonly #options: HttpEnvOptions;
  readonly #endpoints: Endpoint[];
  /** Aborted by close(): cancels in-flight attempts and backoff waits. */
  readonly #closing = new AbortController();
  /** DELETEs in flight: close() lets them finish so shutdown does not leak env instances on the servers. */
  readonly #pendingDeletes = new Set<Promise<void>>();
  readonly #idPrefix: string;
  #counter = 0;
  /** New episodes go to the least busy server (endpoints.ts). */
  readonly #spread: LeastBusy<Endpoint>;
  #logger: EnvWarningLogger | undefined;
  #closed: Promise<void> | null = null;

  constructor(options: HttpEnvOptions) {
    checkOptions(options);
    this.#options = options;
    this.#logger = options.logger;
    // thread + process + random: ids stay unique when many workers on many hosts share one server.
    this.#idPrefix = `${threadId}-${process.pid}-${randomBytes(4).toString('hex')}`;
    const connections = options.connections ?? DEFAULT_CONNECTIONS;
    this.#endpoints = options.urls.map((raw) => {
      const url = new URL(raw);
      return {
        url: `${url.origin}${url.pathname.replace(/\/+$/, '')}`,
        prefix: url.pathname.replace(/\/+$/, ''),
        live: 0,
        protocol: null,
        pool: new Pool(url.origin, {
          connections,
          // The AbortSignal of each attempt is the real bound; these make undici agree with it.
          headersTimeout: options.timeoutMs,
          bodyTimeout: options.timeoutMs,
          connectTimeout: Math.min(options.timeoutMs, MAX_CONNECT_TIMEOUT_MS),
          keepAliveTimeout: KEEP_ALIVE_TIMEOUT_MS,
        }),
      };
    });
    this.#spread = new LeastBusy(this.#endpoints);
  }

  create(): HttpEnvironment {
    if (this.#closing.signal.aborted)
      throw new EnvError(
        'ERR_ENV_CLOSED',
        `environment client for ${JSON.stringify(this.#options.name)} is closed: no new actors`,
      );
    const endpoint = this.#spread.pick();
    endpoint.live += 1;
    const id = `${this.#idPrefix}-${++this.#counter}`;
    return new HttpActor(this, endpoint, id);
  }

  async prewarm(): Promise<void> {
    const name = this.#options.name;
    const warm = Math.max(1, Math.min(PREWARM_CONNECTIONS, this.#options.connections ?? DEFAULT_CONNECTIONS));
    await Promise.all(
      this.#endpoints.map(async (endpoint) => {
        // Concurrent requests make the pool open `warm` connections now rather than during the first wave of episodes.
        const listings = await Promise.all(Array.from({ length: warm }, () => this.#listOn(endpoint)));
        const listing = listings[0];
        const protocol = this.#protocolFor(endpoint, listing);
        if (protocol === 'safactory') {
          await this.#probeName(endpoint);
        } else {
          const served = listing.kind === 'names' ? listing.names : [];
          if (!served.includes(name)) {
            throw new EnvError(
              'ERR_ENV_HTTP',
              `env server ${endpoint.url} does not serve environment ${JSON.stringify(name)} (GET /envs lists: ${served.map((n) => JSON.stringify(n)).join(', ') || 'nothing'})`,
              { status: 404 },
            );
          }
          if (this.#options.dedupeSteps && !(listing.kind === 'names' && listing.dedupesSteps)) {
            throw new EnvError(
              'ERR_ENV_HTTP',
              `env.http.dedupeSteps is true, but env server ${endpoint.url} does not say it deduplicates steps (its GET /envs has no "dedupes_steps": true): a step retried there could be applied twice`,
            );
          }
        }
        endpoint.protocol ??= Promise.resolve(protocol);
      }),
    );
  }

  async listEnvs(): Promise<string[]> {
    const lists = await Promise.all(
      this.#endpoints.map(async (endpoint) => {
        const listing = await this.#listOn(endpoint);
        if (this.#protocolFor(endpoint, listing) === 'safactory') {
          throw new EnvError(
            'ERR_ENV_HTTP',
            `env server ${endpoint.url} speaks Safactory's protocol: its GET /envs lists live instances, not the environments it serves`,
          );
        }
        return listing.kind === 'names' ? listing.names : [];
      }),
    );
    return lists[0].filter((name) => lists.every((list) => list.includes(name)));
  }

  close(): Promise<void> {
    this.#closed ??= (async () => {
      // No new actors from here on; DELETEs already running are bounded by their own timeout and retries.
      this.#closing.abort(new Error('environment client closed'));
      await Promise.allSettled([...this.#pendingDeletes]);
      await Promise.all(this.#endpoints.map((e) => e.pool.destroy()));
    })();
    return this.#closed;
  }

  // ---- used by HttpActor ----

  get options(): HttpEnvOptions {
    return this.#options;
  }

  /** The protocol `endpoint` speaks: the configured one, or (auto) what its GET /envs says. */
  protocolOf(endpoint: Endpoint): Promise<EnvProtocol> {
    const configured = this.#options.protocol ?? 'rollout';
    if (configured !== 'auto') return Promise.resolve(configured);
    if (endpoint.protocol === null) {
      const asked = this.#listOn(endpoint).then((listing) => this.#protocolFor(endpoint, listing));
      endpoint.protocol = asked;
      asked.catch(() => {
        if (endpoint.protocol === asked) endpoint.protocol = null;
      });
    }
    return endpoint.protocol;
  }

  released(endpoint: Endpoint): void {
    endpoint.live -= 1;
  }

  trackDelete(p: Promise<void>): void {
    this.#pendingDeletes.add(p);
    void p.finally(() => this.#pendingDeletes.delete(p));
  }

  warn(details: object, message: string): void {
    this.#logger ??= createLogger(process.env.LOG_LEVEL ?? 'info', { component: 'http-env' });
    this.#logger.warn(details, message);
  }

  /**
   * One protocol call with the retry policy; resolves to the reply text of a 2xx.
   * DELETE is the one call allowed to start after close() began (pending episodes release their ids).
   */
  async call(endpoint: Endpoint, spec: CallSpec): Promise<string> {
    const { retries, retryBackoffMs, dedupeSteps } = this.#options;
    const attempts = retries + 1;
    for (let attempt = 1; ; attempt++) {
      const outcome = await this.#attempt(endpoint, spec);
      if (outcome.ok) return outcome.body;
      const { error, kind } = outcome;
      if (kind === 'final') throw error;
      if (kind === 'maybe-applied' && !spec.idempotent && !dedupeSteps) {
        throw new EnvError(
          'ERR_ENV_STEP_UNCERTAIN',
          `${spec.what} may have been applied by the environment, so it is not retried (the server is not known to deduplicate steps; set dedupeSteps if it does): ${error.message}`,
          { status: error.status, cause: error },
        );
      }
      if (attempt >= attempts) {
        if (attempts === 1) throw error;
        throw new EnvError(error.code, `${error.message} (gave up after ${attempts} attempts)`, {
          status: error.status,
          cause: error.cause ?? error,
        });
      }
      try {
        await sleep(retryBackoffMs * 2 ** (attempt - 1), undefined, {
          signal: spec.method === 'DELETE' ? undefined : this.#closing.signal,
        });
      } catch {
        throw this.#closedError(endpoint, spec);
      }
    }
  }

  async #attempt(endpoint: Endpoint, spec: CallSpec): Promise<Attempt> {
    const url = `${endpoint.url}${spec.path}`;
    const label = `${spec.method} ${url}`;
    // A DELETE may run while close() waits for it; everything else stops at close().
    if (this.#closing.signal.aborted && spec.method !== 'DELETE')
      return { ok: false, kind: 'final', error: this.#closedError(endpoint, spec) };
    const timeout = AbortSignal.timeout(this.#options.timeoutMs);
    const signal = spec.method === 'DELETE' ? timeout : AbortSignal.any([timeout, this.#closing.signal]);
    const failed = (err: unknown): Attempt => {
      if (this.#closing.signal.aborted && spec.method !== 'DELETE')
        return { ok: false, kind: 'final', error: this.#closedError(endpoint, spec, err) };
      if (err instanceof EnvError) return { ok: false, kind: 'final', error: err };
      const code = (err as { code?: unknown }).code;
      // The pool was destroyed under us (a DELETE started after close() finished): nothing left to retry on.
      if (code === 'UND_ERR_DESTROYED' || code === 'UND_ERR_CLOSED')
        return { ok: false, kind: 'final', error: this.#closedError(endpoint, spec, err) };
      if (timeout.aborted || (typeof code === 'string' && TIMEOUT_CODES.has(code))) {
        return {
          ok: false,
          kind: 'maybe-applied',
          error: new EnvError(
            'ERR_ENV_TIMEOUT',
            `${label} (${spec.what}) timed out after ${this.#options.timeoutMs} ms`,
            { cause: err },
          ),
        };
      }
      const detail = `${typeof code === 'string' ? `${code} ` : ''}${(err as Error)?.message ?? String(err)}`;
      const notSent = typeof code === 'string' && NOT_SENT_CODES.has(code);
      return {
        ok: false,
        kind: notSent ? 'not-sent' : 'maybe-applied',
        error: new EnvError(
          'ERR_ENV_UNREACHABLE',
          `${label} (${spec.what}) failed: env server ${endpoint.url} unreachable: ${detail}`,
          { cause: err },
        ),
      };
    };

    let statusCode: number;
    let text: string;
    try {
      const response = await endpoint.pool.request({
        method: spec.method,
        path: `${endpoint.prefix}${spec.path}`,
        headers: spec.body === undefined ? {} : { 'content-type': 'application/json' },
        body: spec.body,
        signal,
      });
      statusCode = response.statusCode;
      text = await readLimited(
        response.body,
        response.headers['content-length'],
        this.#options.maxResponseBytes,
        `${label} (${spec.what})`,
      );
    } catch (err) {
      return failed(err);
    }
    if (statusCode >= 200 && statusCode < 300) return { ok: true, body: text };
    const error = new EnvError(
      'ERR_ENV_HTTP',
      `${label} (${spec.what}) answered ${statusCode}: ${serverMessage(text, 300)}`,
      { status: statusCode },
    );
    return { ok: false, kind: statusCode >= 500 ? 'maybe-applied' : 'final', error };
  }

  async #listOn(endpoint: Endpoint): Promise<EnvListing> {
    const label = `GET ${endpoint.url}/envs`;
    const text = await this.call(endpoint, {
      method: 'GET',
      path: '/envs',
      what: 'list environments',
      idempotent: true,
    });
    const json = parseJson(text, label);
    const list = Array.isArray(json) ? json : (json as { envs?: unknown } | null)?.envs;
    if (!Array.isArray(list)) throw badReply(label, 'reply', json, 'an array of names or {"envs": [...]}');
    if (list.length === 0) return { kind: 'empty' };
    // Safactory's entries are instances ({envname, id, state}); rollout's are names. One kind per reply.
    if (typeof list[0] === 'object' && list[0] !== null && 'envname' in list[0]) {
      return {
        kind: 'instances',
        instances: list.map((entry, i) => {
          const { envname, id, state } = (entry ?? {}) as Record<string, unknown>;
          const expected = 'a Safactory instance {"envname": string, "id": string, "state": string}';
          if (typeof entry !== 'object' || entry === null || Array.isArray(entry))
            throw badReply(label, `envs[${i}]`, entry, expected);
          if (typeof envname !== 'string') throw badReply(label, `envs[${i}].envname`, envname, 'a string');
          if (typeof id !== 'string') throw badReply(label, `envs[${i}].id`, id, 'a string');
          if (typeof state !== 'string') throw badReply(label, `envs[${i}].state`, state, 'a string');
          return { envname, id, state };
        }),
      };
    }
    return {
      kind: 'names',
      // A server that applies a repeated step index once says so (rollout env-server does), so that
      // dedupeSteps is never trusted on a server that would apply a retried step twice.
      dedupesSteps: (json as { dedupes_steps?: unknown } | null)?.dedupes_steps === true,
      names: list.map((entry, i) => {
        const name = typeof entry === 'string' ? entry : (entry as { name?: unknown } | null)?.name;
        if (typeof name !== 'string')
          throw badReply(label, `envs[${i}]`, entry, 'a name (string) or {"name": string}, like the entries before it');
        return name;
      }),
    };
  }

  /**
   * The protocol `listing` shows, checked against the configuration: a configured protocol must be the
   * server's, and options the server's protocol cannot honour are refused (ConfigError).
   */
  #protocolFor(endpoint: Endpoint, listing: EnvListing): EnvProtocol {
    const configured = this.#options.protocol ?? 'rollout';
    // An empty list is a rollout server's only when one was configured: a rollout server that serves
    // nothing cannot serve the environment either, while a fresh Safactory server always lists nothing.
    const shown: EnvProtocol =
      listing.kind === 'names' || (listing.kind === 'empty' && configured === 'rollout') ? 'rollout' : 'safactory';
    if (configured !== 'auto' && configured !== shown) {
      const what =
        shown === 'rollout'
          ? "environment names (rollout env-server's protocol)"
          : "live instances (Safactory's protocol)";
      throw new ConfigError([
        `http env: protocol: env server ${endpoint.url} lists ${what} on GET /envs, so it does not speak ${JSON.stringify(configured)}; set "${shown}" or "auto" (got ${JSON.stringify(configured)})`,
      ]);
    }
    const told = `env server ${endpoint.url} lists ${shown === 'rollout' ? "environment names on GET /envs (rollout env-server's protocol)" : "live instances on GET /envs (Safactory's protocol)"}; `;
    const conflicts = protocolConflicts(shown, this.#options);
    if (conflicts.length > 0) throw new ConfigError(conflicts.map((c) => `http env: ${formatConflict(c, told)}`));
    return shown;
  }

  /**
   * Safactory's GET /envs names no environments, so whether a server serves `name` is asked of its
   * reset route, with an env_param that is not an object: env/app.py checks the name first (400
   * "Unknown envname …" naming the served ones), then refuses that env_param (400) before it
   * creates an instance. A server that creates one anyway gets it deleted.
   */
  async #probeName(endpoint: Endpoint): Promise<void> {
    const name = this.#options.name;
    const base = `/${encodeURIComponent(name)}/${encodeURIComponent(`${this.#idPrefix}-probe`)}`;
    try {
      await this.call(endpoint, {
        method: 'POST',
        path: `${base}/reset`,
        body: JSON.stringify({ env_param: [] }),
        what: `check that environment ${JSON.stringify(name)} is served`,
        idempotent: true,
      });
    } catch (err) {
      if (!(err instanceof EnvError) || err.status === null || err.status >= 500) throw err;
      if (err.status === 404 || (err.status === 400 && /Unknown envname/i.test(err.message))) {
        throw new EnvError(
          'ERR_ENV_HTTP',
          `env server ${endpoint.url} does not serve environment ${JSON.stringify(name)} (${err.message})`,
          { status: err.status, cause: err },
        );
      }
      return;
    }
    await this.call(endpoint, {
      method: 'DELETE',
      path: base,
      what: `delete of the probe for ${JSON.stringify(name)}`,
      idempotent: true,
    });
  }

  #closedError(endpoint: Endpoint, spec: CallSpec, cause?: unknown): EnvError {
    return new EnvError(
      'ERR_ENV_CLOSED',
      `${spec.method} ${endpoint.url}${spec.path} (${spec.what}) cancelled: the environment client was closed`,
      { cause },
    );
  }
}

/**
 * One env id on one server. Invariants: the step index sent is 1 + the number of steps that succeeded
 * since the last reset, so a retried step repeats its index (what lets a server deduplicate it); `close`
 * sends at most one DELETE and releases the endpoint's busy count exactly once; on a Safactory server a
 * reset with another env_param than the id's last one starts a new instance (see `reset`).
 */
class HttpActor implements HttpEnvironment {
  readonly id: string;
  readonly #client: HttpEnvClient;
  readonly #endpoint: Endpoint;
  readonly #base: string;
  #stepsDone = 0;
  /** Safactory: the env_param of the last reset sent (serialized), that the server's instance may have been made from. */
  #lastEnvParam: string | null = null;
  #closed: Promise<void> | null = null;

  constructor(client: HttpEnvClient, endpoint: Endpoint, id: string) {
    this.#client = client;
    this.#endpoint = endpoint;
    this.id = id;
    this.#base = `/${encodeURIComponent(client.options.name)}/${encodeURIComponent(id)}`;
  }

  get url(): string {
    return this.#endpoint.url;
  }

  async reset({ seed, params }: ResetOptions): Promise<ResetResult> {
    const protocol = await this.#client.protocolOf(this.#endpoint);
    this.#stepsDone = 0;
    const label = `POST ${this.#endpoint.url}${this.#base}/reset`;
    // Safactory's launcher gives an environment its configured params with the dataset line under "dataset".
    const envParam = protocol === 'safactory' ? { ...this.#client.options.params, dataset: params } : params;
    if (protocol === 'safactory') {
      const serialized = JSON.stringify(envParam);
      if (this.#lastEnvParam !== null && this.#lastEnvParam !== serialized) {
        // Safactory would reset the instance made from the old env_param and ignore the new one: make it anew.
        await this.#client.call(this.#endpoint, {
          method: 'DELETE',
          path: this.#base,
          what: `delete of env ${JSON.stringify(this.id)} before a reset with other params`,
          idempotent: true,
        });
      }
      this.#lastEnvParam = serialized;
    }
    const text = await this.#client.call(this.#endpoint, {
      method: 'POST',
      path: `${this.#base}/reset`,
      body: JSON.stringify({ env_param: envParam, seed }),
      what: `reset of env ${JSON.stringify(this.id)}`,
      // A repeated reset starts the same episode again from the same seed: harmless.
      idempotent: true,
    });
    const json = parseJson(text, label);
    if (typeof json !== 'object' || json === null || Array.isArray(json))
      throw badReply(label, 'reset()', json, 'an object {observation, info}');
    const { observation, info } = json as { observation?: unknown; info?: unknown };
    if (info !== undefined && info !== null && (typeof info !== 'object' || Array.isArray(info)))
      throw badReply(label, 'reset().info', info, 'an object');
    return { observation, info: (info ?? undefined) as ResetResult['info'] };
  }

  async getTaskPrompt(): Promise<ChatMessage[] | AgentPrompts> {
    const label = `GET ${this.#endpoint.url}${this.#base}/get_task_prompt`;
    const text = await this.#client.call(this.#endpoint, {
      method: 'GET',
      path: `${this.#base}/get_task_prompt`,
      what: `get_task_prompt of env ${JSON.stringify(this.id)}`,
      idempotent: true,
    });
    return withLabel(label, () => checkAgentPrompts(parseJson(text, label)));
  }

  async step(action: string | AgentActions): Promise<StepResult> {
    const protocol = await this.#client.protocolOf(this.#endpoint);
    const n = this.#stepsDone + 1;
    const label = `POST ${this.#endpoint.url}${this.#base}/step`;
    const text = await this.#client.call(this.#endpoint, {
      method: 'POST',
      path: `${this.#base}/step`,
      // Safactory's step takes the action alone: an index it ignores would only suggest it deduplicates.
      body: JSON.stringify(protocol === 'safactory' ? { action } : { action, step: n }),
      what: `step ${n} of env ${JSON.stringify(this.id)}`,
      idempotent: false,
    });
    // Counted once the server answered: from here on it has applied step n, whatever the reply's shape.
    this.#stepsDone = n;
    return withLabel(label, () => checkStepResult(parseJson(text, label)));
  }

  close(): Promise<void> {
    this.#closed ??= this.#delete();
    return this.#closed;
  }

  async #delete(): Promise<void> {
    const done = this.#client
      .call(this.#endpoint, {
        method: 'DELETE',
        path: this.#base,
        what: `delete of env ${JSON.stringify(this.id)}`,
        idempotent: true,
      })
      .then(
        () => undefined,
        // The episode's outcome is already decided: a failed delete only leaks an instance on the server.
        (err: unknown) =>
          this.#client.warn(
            { env: this.#client.options.name, id: this.id, url: this.#endpoint.url, err: (err as Error).message },
            'env DELETE failed (ignored)',
          ),
      )
      .finally(() => this.#client.released(this.#endpoint));
    this.#client.trackDelete(done);
    return done;
  }
}

/** Reads a body, counting bytes as they arrive, and stops (destroying the stream) past `limit`. */
export async function readLimited(
  body: AsyncIterable<Buffer> & { destroy(err?: Error): unknown; once(event: 'error', fn: () => void): unknown },
  contentLength: string | string[] | undefined,
  limit: number,
  label: string,
): Promise<string> {
  const tooLarge = (size: string) =>
    new EnvError('ERR_ENV_TOO_LARGE', `${label}: reply is larger than maxResponseBytes = ${limit} bytes (${size})`);
  const declared = Number(Array.isArray(contentLength) ? contentLength[0] : contentLength);
  if (Number.isFinite(declared) && declared > limit) {
    // Not read at all: destroying aborts the request (undici then drops the connection); the abort
    // error it emits is ours to ignore.
    body.once('error', () => {});
    body.destroy();
    throw tooLarge(`content-length ${declared}`);
  }
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.length;
    // Leaving the loop by a throw destroys the stream (the iterator's return), so nothing more is buffered.
    if (size > limit) throw tooLarge(`more than ${limit} bytes received`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, size).toString('utf8');
}

export function parseJson(text: string, label: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new EnvError(
      'ERR_ENV_BAD_REPLY',
      `${label}: reply is not JSON (got ${JSON.stringify(text.length > 80 ? `${text.slice(0, 77)}...` : text)})`,
    );
  }
}

/** The shared checkers (env/replies.ts) name the field; this adds which server said it. */
function withLabel<T>(label: string, check: () => T): T {
  try {
    return check();
  } catch (err) {
    if (err instanceof EnvReplyError)
      throw new EnvError('ERR_ENV_BAD_REPLY', `${label}: ${err.message}`, { cause: err });
    throw err;
  }
}

function badReply(label: string, field: string, value: unknown, expected: string): EnvError {
  return new EnvError('ERR_ENV_BAD_REPLY', `${label}: ${field} must be ${expected} (got ${preview(value)})`);
}

function checkOptions(options: HttpEnvOptions): void {
  const problems: string[] = [];
  if (!Array.isArray(options.urls) || options.urls.length === 0)
    problems.push(`urls: must list at least one env server URL (got ${preview(options.urls)})`);
  else {
    options.urls.forEach((raw, i) => {
      let url: URL | null = null;
      try {
        url = new URL(raw);
      } catch {
        // reported below
      }
      if (url === null || (url.protocol !== 'http:' && url.protocol !== 'https:'))
        problems.push(`urls[${i}]: must be an http(s) URL (got ${preview(raw)})`);
      else if (url.search || url.hash)
        problems.push(`urls[${i}]: must not have a query or fragment (got ${preview(raw)})`);
    });
  }
  if (typeof options.name !== 'string' || options.name === '' || options.name.includes('/'))
    problems.push(`name: must be a non-empty environment name without "/" (got ${preview(options.name)})`);
  const positive = (field: string, v: unknown) => {
    if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0)
      problems.push(`${field}: must be a positive number (got ${preview(v)})`);
  };
  const nonNegativeInt = (field: string, v: unknown) => {
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0)
      problems.push(`${field}: must be an integer >= 0 (got ${preview(v)})`);
  };
  positive('timeoutMs', options.timeoutMs);
  nonNegativeInt('retries', options.retries);
  if (
    typeof options.retryBackoffMs !== 'number' ||
    !Number.isFinite(options.retryBackoffMs) ||
    options.retryBackoffMs < 0
  )
    problems.push(`retryBackoffMs: must be a number >= 0 (got ${preview(options.retryBackoffMs)})`);
  positive('maxResponseBytes', options.maxResponseBytes);
  if (typeof options.dedupeSteps !== 'boolean')
    problems.push(`dedupeSteps: must be a boolean (got ${preview(options.dedupeSteps)})`);
  if (options.connections !== undefined && (!Number.isInteger(options.connections) || options.connections < 1))
    problems.push(`connections: must be a positive integer (got ${preview(options.connections)})`);
  const protocol = options.protocol ?? 'rollout';
  // The other protocols have clients of their own (env/remote.ts picks them): spoken here, their
  // servers would get rollout env-server calls.
  if (!(HTTP_ENV_PROTOCOLS as readonly unknown[]).includes(protocol))
    problems.push(
      `protocol: must be "auto", "rollout" or "safactory" (got ${preview(options.protocol)}); createRemoteEnvironments speaks the others`,
    );
  else if (
    options.params !== undefined &&
    (typeof options.params !== 'object' || options.params === null || Array.isArray(options.params))
  )
    problems.push(`params: must be an object (got ${preview(options.params)})`);
  else if (protocol !== 'auto') problems.push(...protocolConflicts(protocol, options).map((c) => formatConflict(c)));
  if (problems.length > 0) throw new ConfigError(problems.map((p) => `http env: ${p}`));
}

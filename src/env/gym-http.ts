/**
 * Environments behind a gym-http-api server (`env.protocol: "gym-http"`), as ordinary `Environment`s.
 * The routes and shapes are openai/gym-http-api's gym_http_server.py at
 * 15b68c3921fb8cd29366b50771cd5b0121c55872 (line numbers below are that file's):
 *
 *   reset   POST /v1/envs/                 {"env_id": name, "seed": seed}  → {"instance_id"}    (190-207; create 44-54)
 *           POST /v1/envs/{id}/reset/      {"seed": seed}                  → {"observation"}    (222-237; the body is not read)
 *   step    POST /v1/envs/{id}/step/       {"action": action}              → {observation, reward, done, info} (239-260)
 *   close   POST /v1/envs/{id}/close/                                      → 204                (378-388)
 *   prewarm POST /v1/envs/ then close: an env_id the server cannot make is a 400 (create 49-50)
 *
 * The seed travels at create, where that server applies it (only when truthy: a seed of 0 is not
 * applied there, create 47-48), and again in the reset body, where Gymnasium-era forks read it.
 *
 * `done` → terminated / truncated as gym's own converter does (gym/utils/step_api_compatibility.py at
 * bc212954, convert_to_terminated_truncated_step_api): truncated = done and info["TimeLimit.truncated"],
 * terminated = done and not truncated, the key taken out of info. A reply that already has boolean
 * `terminated` and `truncated` (Gymnasium-era forks) is taken as it is.
 *
 * Text in and out: an observation becomes the next user message (a string as it is, a list of chat
 * messages as those messages, anything else as its JSON); the model's reply becomes the action as
 * `env.gym.action` says (protocol.ts GYM_ACTIONS), and joins the conversation as the assistant's
 * message. A reply that cannot be made into the action fails the rollout as the policy's
 * (ERR_ENV_BAD_ACTION).
 *
 * Errors: a 400 {"message"} (the server's InvalidUsage, 149-187) is ERR_ENV_HTTP with that message,
 * never retried; a 5xx (an exception inside the environment: Flask's HTML page) is retried for
 * create, reset and close, then ERR_ENV_HTTP with its status (an infrastructure failure,
 * domain/failure.ts); a step is never sent twice (the server applies every step it gets), so its 5xx,
 * timeout or lost connection fails at once. A call that hangs is cut at `timeoutMs` (ERR_ENV_TIMEOUT);
 * a reply of the wrong shape is ERR_ENV_BAD_REPLY naming the field. Every instance created is closed:
 * at the episode's end, after a failure, when the actor is closed mid-call (its calls are cancelled,
 * ERR_ENV_CANCELLED), and by the client's close.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { Pool } from 'undici';
import type { ChatMessage } from '../domain/rollout.ts';
import { ConfigError, preview, serverMessage } from '../errors.ts';
import { createLogger } from '../log.ts';
import { LeastBusy, MAX_CONNECT_TIMEOUT_MS, NOT_SENT_CODES, TIMEOUT_CODES } from './endpoints.ts';
import { EnvError } from './errors.ts';
import type { EnvWarningLogger, HttpEnvOptions } from './http-env.ts';
import type { GymHttpSettings } from './protocol.ts';
import { lastInteger } from './synthetic/params.ts';
import type { AgentActions, Environment, ResetOptions, ResetResult, StepResult } from './types.ts';

const DEFAULT_CONNECTIONS = 64;
const MAX_BODY_PREVIEW = 300;
const ROLES = new Set(['system', 'user', 'assistant', 'tool']);

export const DEFAULT_GYM_SETTINGS: GymHttpSettings = { action: 'text', system: null };

interface Endpoint {
  readonly url: string;
  readonly prefix: string;
  readonly pool: Pool;
  live: number;
}

interface CallSpec {
  method: 'GET' | 'POST';
  path: string;
  body?: unknown;
  what: string;
  /** May be sent again after a 5xx or a timeout (everything but step). */
  retry: boolean;
  /** Aborted when the actor is closed: its calls stop (close's own call has none). */
  signal?: AbortSignal;
}

type Attempt = { ok: true; status: number; text: string } | { ok: false; error: EnvError; retry: boolean };

/** What env/remote.ts hands out for a gym-http task (its RemoteEnvironments). */
export interface GymHttpEnvironments {
  create(): Environment;
  prewarm(): Promise<void>;
  close(): Promise<void>;
}

export function createGymHttpEnvironments(options: HttpEnvOptions): GymHttpEnvironments {
  return new GymHttpClient(options);
}

class GymHttpClient implements GymHttpEnvironments {
  readonly options: HttpEnvOptions;
  readonly gym: GymHttpSettings;
  readonly #endpoints: Endpoint[];
  readonly #closing = new AbortController();
  /** Instance closes in flight: the client's close waits for them, so no instance is left behind. */
  readonly #pendingCloses = new Set<Promise<void>>();
  /** New episodes go to the least busy server (endpoints.ts). */
  readonly #spread: LeastBusy<Endpoint>;
  #logger: EnvWarningLogger | undefined;
  #closed: Promise<void> | null = null;

  constructor(options: HttpEnvOptions) {
    checkOptions(options);
    this.options = options;
    this.gym = options.gym ?? DEFAULT_GYM_SETTINGS;
    this.#logger = options.logger;
    this.#endpoints = options.urls.map((raw) => {
      const url = new URL(raw);
      const prefix = url.pathname.replace(/\/+$/, '');
      return {
        url: `${url.origin}${prefix}`,
        prefix,
        live: 0,
        pool: new Pool(url.origin, {
          connections: options.connections ?? DEFAULT_CONNECTIONS,
          headersTimeout: options.timeoutMs,
          bodyTimeout: options.timeoutMs,
          connectTimeout: Math.min(options.timeoutMs, MAX_CONNECT_TIMEOUT_MS),
        }),
      };
    });
    this.#spread = new LeastBusy(this.#endpoints);
  }

  create(): Environment {
    if (this.#closing.signal.aborted)
      throw new EnvError('ERR_ENV_CLOSED', `gym-http client for ${JSON.stringify(this.options.name)} is closed`);
    const endpoint = this.#spread.pick();
    endpoint.live += 1;
    return new GymHttpActor(this, endpoint);
  }

  /** Every server can make the env_id: one instance created and closed on each. */
  async prewarm(): Promise<void> {
    await Promise.all(
      this.#endpoints.map(async (endpoint) => {
        const id = await this.createInstance(endpoint, 0);
        await this.closeInstance(endpoint, id);
      }),
    );
  }

  close(): Promise<void> {
    this.#closed ??= (async () => {
      this.#closing.abort(new Error('gym-http client closed'));
      await Promise.allSettled([...this.#pendingCloses]);
      await Promise.all(this.#endpoints.map((e) => e.pool.destroy()));
    })();
    return this.#closed;
  }

  // ---- used by GymHttpActor ----

  async createInstance(endpoint: Endpoint, seed: number, signal?: AbortSignal): Promise<string> {
    const label = `POST ${endpoint.url}/v1/envs/`;
    const { text } = await this.call(endpoint, {
      method: 'POST',
      path: '/v1/envs/',
      body: { env_id: this.options.name, seed },
      what: `create of an instance of ${JSON.stringify(this.options.name)}`,
      retry: true,
      signal,
    });
    const { instance_id: id } = object(parseJson(text, label), label, 'reply');
    if (typeof id !== 'string' || id === '' || id.includes('/'))
      throw badReply(label, 'instance_id', id, 'a non-empty string without "/"');
    return id;
  }

  /** Closes an instance (its errors are logged, never thrown: the episode's outcome is decided). */
  closeInstance(endpoint: Endpoint, id: string): Promise<void> {
    const done = this.call(endpoint, {
      method: 'POST',
      path: `/v1/envs/${encodeURIComponent(id)}/close/`,
      what: `close of instance ${JSON.stringify(id)}`,
      retry: true,
    }).then(
      () => undefined,
      (err: unknown) => {
        this.#logger ??= createLogger(process.env.LOG_LEVEL ?? 'info', { component: 'gym-http' });
        this.#logger.warn(
          { env: this.options.name, id, url: endpoint.url, err: (err as Error).message },
          'gym-http close failed (ignored)',
        );
      },
    );
    this.#pendingCloses.add(done);
    void done.finally(() => this.#pendingCloses.delete(done));
    return done;
  }

  released(endpoint: Endpoint): void {
    endpoint.live -= 1;
  }

  /** One call with the retry policy (module comment); a 2xx's status and text. */
  async call(endpoint: Endpoint, spec: CallSpec): Promise<{ status: number; text: string }> {
    const { retries, retryBackoffMs } = this.options;
    for (let attempt = 1; ; attempt++) {
      const outcome = await this.#attempt(endpoint, spec);
      if (outcome.ok) return outcome;
      const { error } = outcome;
      if (!outcome.retry || attempt > retries) {
        if (attempt === 1) throw error;
        throw new EnvError(error.code, `${error.message} (gave up after ${attempt} attempts)`, {
          status: error.status,
          cause: error.cause ?? error,
        });
      }
      try {
        await sleep(retryBackoffMs * 2 ** (attempt - 1), undefined, { signal: this.#signalFor(spec) });
      } catch {
        throw this.#cancelled(endpoint, spec);
      }
    }
  }

  /** What stops a call: the actor's close, and the client's close (except for a close call, which must run). */
  #signalFor(spec: CallSpec): AbortSignal | undefined {
    const isClose = spec.path.endsWith('/close/');
    const signals = [...(spec.signal ? [spec.signal] : []), ...(isClose ? [] : [this.#closing.signal])];
    return signals.length === 0 ? undefined : AbortSignal.any(signals);
  }

  #cancelled(endpoint: Endpoint, spec: CallSpec, cause?: unknown): EnvError {
    const byClient = this.#closing.signal.aborted && !spec.path.endsWith('/close/');
    return new EnvError(
      byClient ? 'ERR_ENV_CLOSED' : 'ERR_ENV_CANCELLED',
      `${spec.method} ${endpoint.url}${spec.path} (${spec.what}) cancelled: ${byClient ? 'the environment client was closed' : 'the episode was closed'}`,
      { cause },
    );
  }

  async #attempt(endpoint: Endpoint, spec: CallSpec): Promise<Attempt> {
    const label = `${spec.method} ${endpoint.url}${spec.path}`;
    const stop = this.#signalFor(spec);
    if (stop?.aborted) return { ok: false, retry: false, error: this.#cancelled(endpoint, spec) };
    const timeout = AbortSignal.timeout(this.options.timeoutMs);
    const signal = stop === undefined ? timeout : AbortSignal.any([timeout, stop]);
    let status: number;
    let text: string;
    try {
      const response = await endpoint.pool.request({
        method: spec.method,
        path: `${endpoint.prefix}${spec.path}`,
        headers: spec.body === undefined ? {} : { 'content-type': 'application/json' },
        body: spec.body === undefined ? undefined : JSON.stringify(spec.body),
        signal,
      });
      status = response.statusCode;
      text = await readLimited(response.body, this.options.maxResponseBytes, `${label} (${spec.what})`);
    } catch (err) {
      if (err instanceof EnvError) return { ok: false, retry: false, error: err };
      if (stop?.aborted) return { ok: false, retry: false, error: this.#cancelled(endpoint, spec, err) };
      const code = (err as { code?: unknown }).code;
      if (code === 'UND_ERR_DESTROYED' || code === 'UND_ERR_CLOSED')
        return { ok: false, retry: false, error: this.#cancelled(endpoint, spec, err) };
      if (timeout.aborted || (typeof code === 'string' && TIMEOUT_CODES.has(code)))
        return {
          ok: false,
          retry: spec.retry,
          error: new EnvError(
            'ERR_ENV_TIMEOUT',
            `${label} (${spec.what}) timed out after ${this.options.timeoutMs} ms`,
            {
              cause: err,
            },
          ),
        };
      const notSent = typeof code === 'string' && NOT_SENT_CODES.has(code);
      const detail = `${typeof code === 'string' ? `${code} ` : ''}${(err as Error)?.message ?? String(err)}`;
      return {
        ok: false,
        retry: spec.retry || notSent,
        error: new EnvError(
          notSent || spec.retry ? 'ERR_ENV_UNREACHABLE' : 'ERR_ENV_STEP_UNCERTAIN',
          `${label} (${spec.what}) failed: gym-http server ${endpoint.url} unreachable: ${detail}`,
          { cause: err },
        ),
      };
    }
    if (status >= 200 && status < 300) return { ok: true, status, text };
    // InvalidUsage's {"message"}; Flask's error page by its title; anything else shortened.
    const message =
      jsonMessage(text) ?? /<title>([^<]{1,200})<\/title>/i.exec(text)?.[1] ?? serverMessage(text, MAX_BODY_PREVIEW);
    return {
      ok: false,
      retry: status >= 500 && spec.retry,
      error: new EnvError('ERR_ENV_HTTP', `${label} (${spec.what}) answered ${status}: ${message}`, { status }),
    };
  }
}

/**
 * One episode on one server: an instance created at reset (with the episode's seed), stepped, closed.
 * Invariants: at most one instance at a time (a second reset closes the first); close sends one close
 * per instance created, releases the endpoint once, and cancels the actor's calls in flight.
 */
class GymHttpActor implements Environment {
  readonly #client: GymHttpClient;
  readonly #endpoint: Endpoint;
  /** Aborted by close(): a reset or step still waiting on the server stops (ERR_ENV_CANCELLED). */
  readonly #closing = new AbortController();
  #instance: string | null = null;
  /** The instance being created, so a close during its create still closes it. */
  #creating: Promise<string> | null = null;
  #messages: ChatMessage[] = [];
  #phase: 'idle' | 'running' | 'done' = 'idle';
  #closed: Promise<void> | null = null;

  constructor(client: GymHttpClient, endpoint: Endpoint) {
    this.#client = client;
    this.#endpoint = endpoint;
  }

  async reset({ seed, params }: ResetOptions): Promise<ResetResult> {
    if (Object.keys(params).length > 0)
      throw new ConfigError([
        `gym-http env ${JSON.stringify(this.#client.options.name)}: reset params ${preview(params)} cannot be sent: the server makes an instance from its env_id and seed alone (give the task no dataset)`,
      ]);
    if (this.#instance !== null) {
      const old = this.#instance;
      this.#instance = null;
      await this.#client.closeInstance(this.#endpoint, old);
    }
    this.#phase = 'idle';
    const signal = this.#closing.signal;
    const creating = (this.#creating = this.#client.createInstance(this.#endpoint, seed, signal));
    const id = await creating;
    this.#creating = null;
    this.#instance = id;
    if (signal.aborted) {
      // Closed while it was being made: nobody else will close it.
      this.#instance = null;
      await this.#client.closeInstance(this.#endpoint, id);
      throw new EnvError(
        'ERR_ENV_CANCELLED',
        `reset of ${JSON.stringify(this.#client.options.name)} cancelled: the episode was closed`,
      );
    }
    const path = `/v1/envs/${encodeURIComponent(id)}/reset/`;
    const label = `POST ${this.#endpoint.url}${path}`;
    const { text } = await this.#client.call(this.#endpoint, {
      method: 'POST',
      path,
      body: { seed },
      what: `reset of instance ${JSON.stringify(id)}`,
      retry: true,
      signal,
    });
    const reply = object(parseJson(text, label), label, 'reply');
    if (!Object.hasOwn(reply, 'observation')) throw badReply(label, 'observation', undefined, 'present');
    const { system } = this.#client.gym;
    this.#messages = [
      ...(system === null ? [] : [{ role: 'system', content: system } as ChatMessage]),
      ...observationMessages(reply.observation, label),
    ];
    this.#phase = 'running';
    return { observation: reply.observation, info: { instance_id: id } };
  }

  getTaskPrompt(): ChatMessage[] {
    return this.#phase === 'running' ? this.#messages.slice() : [];
  }

  async step(reply: string | AgentActions): Promise<StepResult> {
    const id = this.#instance;
    if (this.#phase !== 'running' || id === null)
      throw new Error(
        `gym-http env ${JSON.stringify(this.#client.options.name)}: step called ${this.#phase === 'done' ? 'after the episode ended' : 'before reset'}`,
      );
    if (typeof reply !== 'string')
      throw new Error('a gym-http environment has one agent: it takes one reply, not one per agent id');
    const action = toAction(reply, this.#client.gym.action);
    const path = `/v1/envs/${encodeURIComponent(id)}/step/`;
    const label = `POST ${this.#endpoint.url}${path}`;
    const { text } = await this.#client.call(this.#endpoint, {
      method: 'POST',
      path,
      body: { action },
      what: `step of instance ${JSON.stringify(id)}`,
      retry: false,
      signal: this.#closing.signal,
    });
    const result = stepResult(parseJson(text, label), label);
    this.#messages.push({ role: 'assistant', content: reply }, ...observationMessages(result.observation, label));
    if (result.terminated || result.truncated) this.#phase = 'done';
    return result;
  }

  close(): Promise<void> {
    this.#closed ??= (async () => {
      this.#closing.abort(new Error('episode closed'));
      this.#phase = 'done';
      this.#messages = [];
      try {
        // An instance still being made is closed by its reset, which sees the abort.
        if (this.#creating !== null) await this.#creating.catch(() => undefined);
        const id = this.#instance;
        this.#instance = null;
        if (id !== null) await this.#client.closeInstance(this.#endpoint, id);
      } finally {
        this.#client.released(this.#endpoint);
      }
    })();
    return this.#closed;
  }
}

/** The model's reply as the action the server takes (module comment). */
export function toAction(reply: string, mode: GymHttpSettings['action']): unknown {
  if (mode === 'text') return reply;
  if (mode === 'integer') {
    const n = lastInteger(reply);
    if (n === null)
      throw new EnvError(
        'ERR_ENV_BAD_ACTION',
        `the reply has no integer to send as the action (got ${preview(reply)})`,
      );
    return n;
  }
  try {
    return JSON.parse(reply.trim());
  } catch {
    throw new EnvError('ERR_ENV_BAD_ACTION', `the reply is not JSON to send as the action (got ${preview(reply)})`);
  }
}

/** An observation as the conversation's next messages (module comment). */
export function observationMessages(observation: unknown, label = 'observation'): ChatMessage[] {
  if (typeof observation === 'string') return [{ role: 'user', content: observation }];
  if (Array.isArray(observation) && observation.length > 0 && observation.every(isChatMessage))
    return observation.map((m) => ({ role: m.role, content: m.content }) as ChatMessage);
  if (observation === undefined) throw badReply(label, 'observation', observation, 'present');
  return [{ role: 'user', content: JSON.stringify(observation) }];
}

function isChatMessage(value: unknown): value is { role: string; content: string } {
  const m = value as { role?: unknown; content?: unknown } | null;
  return (
    typeof m === 'object' &&
    m !== null &&
    typeof m.role === 'string' &&
    ROLES.has(m.role) &&
    typeof m.content === 'string'
  );
}

/** A step reply, field by field: done (or terminated + truncated), reward, info. */
function stepResult(json: unknown, label: string): StepResult {
  const reply = object(json, label, 'reply');
  const { observation, reward, done, terminated, truncated } = reply;
  if (!Object.hasOwn(reply, 'observation')) throw badReply(label, 'observation', undefined, 'present');
  if (typeof reward !== 'number' || !Number.isFinite(reward))
    throw badReply(label, 'reward', reward, 'a finite number');
  const info = reply.info === undefined || reply.info === null ? {} : object(reply.info, label, 'info');
  if (typeof terminated === 'boolean' && typeof truncated === 'boolean')
    return { observation, reward, terminated, truncated, info };
  if (typeof done !== 'boolean') throw badReply(label, 'done', done, 'a boolean');
  const { 'TimeLimit.truncated': limit, ...rest } = info;
  if (limit !== undefined && typeof limit !== 'boolean')
    throw badReply(label, 'info["TimeLimit.truncated"]', limit, 'a boolean');
  const cut = done && limit === true;
  return { observation, reward, terminated: done && !cut, truncated: cut, info: rest };
}

function object(value: unknown, label: string, field: string): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    throw badReply(label, field, value, 'an object');
  return value as Record<string, unknown>;
}

function parseJson(text: string, label: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new EnvError(
      'ERR_ENV_BAD_REPLY',
      `${label}: reply is not JSON (got ${JSON.stringify(text.length > 80 ? `${text.slice(0, 77)}...` : text)})`,
    );
  }
}

function jsonMessage(text: string): string | null {
  try {
    const { message } = JSON.parse(text) as { message?: unknown };
    return typeof message === 'string' ? message : null;
  } catch {
    return null;
  }
}

function badReply(label: string, field: string, value: unknown, expected: string): EnvError {
  return new EnvError('ERR_ENV_BAD_REPLY', `${label}: ${field} must be ${expected} (got ${preview(value)})`);
}

async function readLimited(body: AsyncIterable<Buffer>, limit: number, label: string): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.length;
    if (size > limit)
      throw new EnvError('ERR_ENV_TOO_LARGE', `${label}: reply is larger than maxResponseBytes = ${limit} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, size).toString('utf8');
}

function checkOptions(options: HttpEnvOptions): void {
  const problems: string[] = [];
  if (!Array.isArray(options.urls) || options.urls.length === 0)
    problems.push(`urls: must list at least one gym-http server URL (got ${preview(options.urls)})`);
  else
    options.urls.forEach((raw, i) => {
      let url: URL | null = null;
      try {
        url = new URL(raw);
      } catch {
        // reported below
      }
      if (url === null || (url.protocol !== 'http:' && url.protocol !== 'https:') || url.search || url.hash)
        problems.push(`urls[${i}]: must be an http(s) URL without query or fragment (got ${preview(raw)})`);
    });
  if (typeof options.name !== 'string' || options.name === '')
    problems.push(`name: must be the env_id the server makes (got ${preview(options.name)})`);
  if (typeof options.timeoutMs !== 'number' || !(options.timeoutMs > 0))
    problems.push(`timeoutMs: must be a positive number (got ${preview(options.timeoutMs)})`);
  if (!Number.isInteger(options.retries) || options.retries < 0)
    problems.push(`retries: must be an integer >= 0 (got ${preview(options.retries)})`);
  if (options.dedupeSteps) problems.push('dedupeSteps: a gym-http server cannot deduplicate steps (got true)');
  if (options.params !== undefined && Object.keys(options.params).length > 0)
    problems.push(`params: a gym-http server takes none (got ${preview(options.params)})`);
  const gym = options.gym ?? DEFAULT_GYM_SETTINGS;
  if (!['text', 'integer', 'json'].includes(gym.action))
    problems.push(`gym.action: must be "text", "integer" or "json" (got ${preview(gym.action)})`);
  if (problems.length > 0) throw new ConfigError(problems.map((p) => `gym-http env: ${p}`));
}

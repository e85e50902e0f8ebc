/**
 * Environments on OpenEnv servers (github.com/meta-pytorch/OpenEnv, read at
 * 685de411e5f77286b0fd94798d42c4467cf8a1bc; paths below are under src/openenv/core/), spoken as
 * OpenEnv's own client speaks them (env_client.py `EnvClient`):
 *
 *   episode   WS {url}/ws: one socket is one session is one environment instance from the server's
 *             factory (env_server/http_server.py L1299-1515); JSON text frames, one reply per message
 *   reset     → {"type":"reset","data":{...env.params, ...dataset line, "seed": seed}}
 *             ← {"type":"observation","data":{"observation":{…},"reward":r|null,"done":b}}
 *   step      → {"type":"step","data":{"<env.openenv.actionField>": reply}}  ← the same
 *   tools     → {"type":"mcp","data":{"jsonrpc":"2.0","method":"tools/list"|"tools/call",…}}
 *             ← {"type":"mcp","data":{JSON-RPC response}} (mcp_handler bound to the session's own
 *             environment, http_server.py L670-962): with `env.openenv.tools`
 *   close     → {"type":"close"}: no reply; the server destroys the session and closes the socket
 *   errors    ← {"type":"error","data":{"message","code",…}} (env_server/types.py WSErrorCode L37-46)
 *   prewarm   GET /health, GET /metadata, GET /schema (the configured fields exist), and with
 *             `env.openenv.tools` a POST /mcp tools/list
 *
 * Not HTTP POST /reset and /step: in simulation mode, the only one create_app() gives
 * (http_server.py L1671), each of those calls builds a fresh environment from the factory and closes
 * it when it returns (L604-629, L632-667), so a /step never sees the /reset before it; production mode
 * does not serve them at all (L1072). Only a WebSocket session keeps an environment between calls.
 * Tools go over the episode's own session for the same reason (an HTTP /mcp call without a session id
 * runs on a temporary environment, L807-809), and not as `call_tool` step actions, which would make
 * each tool call a step of the episode.
 *
 * The conversation (env/protocol.ts OpenEnvSettings): the observation's `promptField` is either the
 * whole conversation as chat messages, kept by the environment, or a text the engine appends as a user
 * message to the conversation it keeps (the text, the reply, the next text, …). The observation's other
 * fields are the step's `info` (OpenEnv never sends an observation's `metadata`: serialization.py
 * L136-168). A null reward is 0, a boolean one 1 or 0 (types.py L86). `done` is `terminated`:
 * OpenEnv has no truncation flag, so only an environment that reports it in an observation field
 * (`truncatedField`) has truncated episodes.
 *
 * Failures, by what they say about the episode (domain/failure.ts gives the kinds):
 *   CAPACITY_REACHED (sent right after the socket is accepted, then the socket is closed: L1482-1491)
 *     → retried with backoff (`retries`, `retryBackoffMs`) within the reset's bound, then ERR_ENV_INFRA
 *   FACTORY_ERROR, SESSION_ERROR, a socket that drops mid-episode → ERR_ENV_INFRA (the session and its
 *     environment are gone; the episode is not the policy's)
 *   EXECUTION_ERROR (reset/step raised), VALIDATION_ERROR, INVALID_JSON, UNKNOWN_TYPE → ERR_ENV_HTTP
 *     without a status: the environment refused or failed on what it was sent
 *   a frame that is not JSON or not the shape above → ERR_ENV_BAD_REPLY; no reply within `timeoutMs`
 *     → ERR_ENV_TIMEOUT (the socket is closed: a late reply would answer the next message)
 *   a frame over `maxResponseBytes` is refused before it is buffered, by undici failing the socket:
 *     that reads as a drop (ERR_ENV_INFRA, the message says so); an HTTP reply over it (prewarm's) is
 *     ERR_ENV_TOO_LARGE
 * A step is never sent twice: a session that lost one cannot be trusted with the episode.
 *
 * Every call (connect, capacity retries and reply together for a reset) is bounded by
 * `env.http.timeoutMs`. The session is closed on every path: `close()` (an episode's end, a failure, a
 * pause that gives up on a pending call), and the client's `close()` (shutdown) closes every live one.
 */
import { setMaxListeners } from 'node:events';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { Agent, WebSocket } from 'undici';
import type { ChatMessage } from '../domain/rollout.ts';
import { ConfigError, preview, serverMessage } from '../errors.ts';
import { LeastBusy, KEEP_ALIVE_TIMEOUT_MS, MAX_CONNECT_TIMEOUT_MS } from './endpoints.ts';
import { EnvError } from './errors.ts';
import { type HttpEnvOptions, parseJson, readLimited } from './http-env.ts';
import { OPENENV_DEFAULTS, type OpenEnvSettings } from './protocol.ts';
import { checkTaskPrompt, EnvReplyError } from './replies.ts';
import type {
  Environment,
  ResetOptions,
  ResetResult,
  StepContext,
  StepResult,
  ToolCallRequest,
  ToolOutput,
  ToolSchema,
} from './types.ts';

const DEFAULT_CONNECTIONS = 64;

/** WSErrorCode values (types.py L37-46) that say the session, not the episode, failed. */
const INFRA_CODES = new Set(['CAPACITY_REACHED', 'FACTORY_ERROR', 'SESSION_ERROR']);

interface Endpoint {
  /** As configured, without a trailing slash: HTTP routes hang off it. */
  readonly url: string;
  /** `ws://…/ws` (`wss://` for https), as env_client.py L130-132 builds it. */
  readonly wsUrl: string;
  /** Actors created here and not closed yet: new ones go to the least busy server. */
  live: number;
}

/** What a socket delivered: a text frame, something that is not one, or its end. */
type Incoming = { kind: 'frame'; text: string } | { kind: 'binary' } | { kind: 'closed'; code: number; reason: string };

/** The shape of env/remote.ts RemoteEnvironments (not imported: remote.ts imports this module). */
export interface OpenEnvEnvironments {
  /** A fresh actor; its `reset` opens the session. */
  create(): Environment;
  /** Checks every server: /health, /metadata, /schema against env.openenv, and MCP tools when asked for. */
  prewarm(): Promise<void>;
  /** Closes every session still open (shutdown), then the connections. */
  close(): Promise<void>;
}

export function createOpenEnvEnvironments(options: HttpEnvOptions): OpenEnvEnvironments {
  return new OpenEnvClient(options);
}

class OpenEnvClient implements OpenEnvEnvironments {
  readonly options: HttpEnvOptions;
  readonly settings: OpenEnvSettings;
  readonly #endpoints: Endpoint[];
  /**
   * Sockets and HTTP calls alike. Its webSocket.maxPayloadSize is `maxResponseBytes`: a larger frame
   * is refused before it is buffered (the socket is failed, which reads as a drop).
   */
  readonly agent: Agent;
  /** Aborted by close(): backoff waits end, and no session opens after it. */
  readonly closing = new AbortController();
  readonly #live = new Set<OpenEnvActor>();
  /** New episodes go to the least busy server (endpoints.ts). */
  readonly #spread: LeastBusy<Endpoint>;
  #closed: Promise<void> | null = null;

  constructor(options: HttpEnvOptions) {
    checkOptions(options);
    // One listener per session being opened and per backoff wait, each removed when it settles.
    setMaxListeners(0, this.closing.signal);
    this.options = options;
    this.settings = { ...OPENENV_DEFAULTS, ...options.openenv };
    const connections = options.connections ?? DEFAULT_CONNECTIONS;
    this.agent = new Agent({
      connections,
      headersTimeout: options.timeoutMs,
      bodyTimeout: options.timeoutMs,
      connectTimeout: Math.min(options.timeoutMs, MAX_CONNECT_TIMEOUT_MS),
      keepAliveTimeout: KEEP_ALIVE_TIMEOUT_MS,
      webSocket: { maxPayloadSize: options.maxResponseBytes },
    });
    this.#endpoints = options.urls.map((raw) => {
      const url = new URL(raw);
      const base = `${url.origin}${url.pathname.replace(/\/+$/, '')}`;
      return { url: base, wsUrl: `${base.replace(/^http/, 'ws')}/ws`, live: 0 };
    });
    this.#spread = new LeastBusy(this.#endpoints);
  }

  create(): Environment {
    if (this.closing.signal.aborted)
      throw new EnvError(
        'ERR_ENV_CLOSED',
        `OpenEnv client for ${JSON.stringify(this.options.name)} is closed: no new actors`,
      );
    const endpoint = this.#spread.pick();
    endpoint.live += 1;
    const actor = this.settings.tools ? new OpenEnvToolActor(this, endpoint) : new OpenEnvActor(this, endpoint);
    this.#live.add(actor);
    return actor;
  }

  async prewarm(): Promise<void> {
    await Promise.all(this.#endpoints.map((endpoint) => this.#check(endpoint)));
  }

  close(): Promise<void> {
    this.#closed ??= (async () => {
      this.closing.abort(new Error('OpenEnv client closed'));
      // Shutdown: every session still open is closed (each bounded by timeoutMs), then the connections.
      await Promise.allSettled([...this.#live].map((actor) => actor.close()));
      await this.agent.destroy();
    })();
    return this.#closed;
  }

  released(actor: OpenEnvActor, endpoint: Endpoint): void {
    if (this.#live.delete(actor)) endpoint.live -= 1;
  }

  /** The server is an OpenEnv server, up, and its models have the configured fields (GET /schema). */
  async #check(endpoint: Endpoint): Promise<void> {
    const health = await this.http(endpoint, 'GET', '/health', 'health check');
    const status = (health as { status?: unknown } | null)?.status;
    if (typeof status !== 'string')
      throw badReply(`GET ${endpoint.url}/health`, 'reply', health, 'an object {"status": "healthy"}');
    if (status !== 'healthy')
      throw new EnvError('ERR_ENV_INFRA', `GET ${endpoint.url}/health: the OpenEnv server reports ${preview(status)}`);
    const metadata = await this.http(endpoint, 'GET', '/metadata', 'environment metadata');
    const name = (metadata as { name?: unknown } | null)?.name;
    if (typeof name !== 'string')
      throw badReply(`GET ${endpoint.url}/metadata`, 'name', name, 'a string (OpenEnv EnvironmentMetadata)');
    const schema = (await this.http(endpoint, 'GET', '/schema', 'action and observation schemas')) as {
      action?: unknown;
      observation?: unknown;
    } | null;
    const problems: string[] = [];
    const fieldOf = (option: keyof OpenEnvSettings, model: 'action' | 'observation', field: string | null) => {
      const properties = (schema?.[model] as { properties?: unknown } | undefined)?.properties;
      // A schema without properties (a custom model) cannot be checked here: the first reply will be.
      if (field === null || typeof properties !== 'object' || properties === null) return;
      if (!Object.hasOwn(properties, field))
        problems.push(
          `env.openenv.${option}: OpenEnv server ${endpoint.url} (${JSON.stringify(name)}) has no ${model} field ${JSON.stringify(field)} (GET /schema ${model} fields: ${Object.keys(properties).join(', ') || 'none'})`,
        );
    };
    fieldOf('actionField', 'action', this.settings.actionField);
    fieldOf('promptField', 'observation', this.settings.promptField);
    fieldOf('truncatedField', 'observation', this.settings.truncatedField);
    if (this.settings.tools) {
      // Without a session id this runs on a temporary environment (http_server.py L807-809): a check only.
      const reply = (await this.http(endpoint, 'POST', '/mcp', 'MCP tools/list', {
        jsonrpc: '2.0',
        method: 'tools/list',
        params: {},
        id: 1,
      })) as { result?: { tools?: unknown }; error?: { message?: unknown } } | null;
      if (!Array.isArray(reply?.result?.tools))
        problems.push(
          `env.openenv.tools: OpenEnv server ${endpoint.url} (${JSON.stringify(name)}) lists no MCP tools (POST /mcp tools/list: ${reply?.error !== undefined ? preview(reply.error.message) : preview(reply)})`,
        );
    }
    if (problems.length > 0) throw new ConfigError(problems);
  }

  /** One idempotent HTTP call (prewarm's): 5xx, timeouts and transport errors retried with backoff; a 4xx is not. */
  async http(endpoint: Endpoint, method: 'GET' | 'POST', path: string, what: string, body?: unknown): Promise<unknown> {
    const { retries, timeoutMs, maxResponseBytes } = this.options;
    const url = `${endpoint.url}${path}`;
    const label = `${method} ${url}`;
    for (let attempt = 1; ; attempt++) {
      if (this.closing.signal.aborted)
        throw new EnvError('ERR_ENV_CLOSED', `${label} (${what}) cancelled: the OpenEnv client was closed`);
      const timeout = AbortSignal.timeout(timeoutMs);
      let error: EnvError;
      try {
        const response = await this.agent.request({
          origin: new URL(url).origin,
          path: new URL(url).pathname,
          method,
          headers: body === undefined ? {} : { 'content-type': 'application/json' },
          body: body === undefined ? undefined : JSON.stringify(body),
          signal: AbortSignal.any([timeout, this.closing.signal]),
        });
        const text = await readLimited(
          response.body,
          response.headers['content-length'],
          maxResponseBytes,
          `${label} (${what})`,
        );
        if (response.statusCode >= 200 && response.statusCode < 300) return parseJson(text, label);
        error = new EnvError(
          'ERR_ENV_HTTP',
          `${label} (${what}) answered ${response.statusCode}: ${serverMessage(text, 300)}${response.statusCode === 404 ? ' (is it an OpenEnv server? every OpenEnv app serves /health, /metadata, /schema and /mcp)' : ''}`,
          { status: response.statusCode },
        );
        if (response.statusCode < 500) throw error;
      } catch (err) {
        if (err instanceof EnvError && (err.code !== 'ERR_ENV_HTTP' || (err.status ?? 0) < 500)) throw err;
        if (this.closing.signal.aborted)
          throw new EnvError('ERR_ENV_CLOSED', `${label} (${what}) cancelled: the OpenEnv client was closed`, {
            cause: err,
          });
        if (err instanceof EnvError) error = err;
        else if (timeout.aborted)
          error = new EnvError('ERR_ENV_TIMEOUT', `${label} (${what}) timed out after ${timeoutMs} ms`, { cause: err });
        else {
          const code = (err as { code?: unknown }).code;
          error = new EnvError(
            'ERR_ENV_UNREACHABLE',
            `${label} (${what}) failed: OpenEnv server ${endpoint.url} unreachable: ${typeof code === 'string' ? `${code} ` : ''}${(err as Error)?.message ?? String(err)}`,
            { cause: err },
          );
        }
      }
      if (attempt > retries) {
        if (attempt === 1) throw error;
        throw new EnvError(error.code, `${error.message} (gave up after ${attempt} attempts)`, {
          status: error.status,
          cause: error.cause ?? error,
        });
      }
      await this.backoff(attempt, `${label} (${what})`);
    }
  }

  /** The wait before retry `attempt + 1`; ERR_ENV_CLOSED when the client closes meanwhile. */
  async backoff(attempt: number, what: string): Promise<void> {
    try {
      await sleep(this.options.retryBackoffMs * 2 ** (attempt - 1), undefined, { signal: this.closing.signal });
    } catch {
      throw new EnvError('ERR_ENV_CLOSED', `${what} cancelled: the OpenEnv client was closed`);
    }
  }
}

/**
 * One WebSocket session. Strictly one message and one reply at a time, as the server handles them
 * (its loop reads, handles, answers: http_server.py L1334-1478); requests queue behind each other.
 * A frame that arrives unasked (the capacity error sent right after the socket is accepted) answers
 * the next request, which is then not sent. Once broken (timed out, dropped, closed), every request
 * fails with the error that broke it.
 */
class Session {
  readonly #ws: WebSocket;
  readonly label: string;
  readonly #maxBytes: number;
  readonly #inbox: Incoming[] = [];
  /** The request waiting for a frame, if one is. */
  #pending: { deliver(incoming: Incoming): void; fail(err: EnvError): void } | null = null;
  #ended: { code: number; reason: string } | null = null;
  readonly #endedPromise: Promise<void>;
  #broken: EnvError | null = null;
  #tail: Promise<unknown> = Promise.resolve();

  private constructor(ws: WebSocket, label: string, maxBytes: number) {
    this.#ws = ws;
    this.label = label;
    this.#maxBytes = maxBytes;
    this.#endedPromise = new Promise<void>((resolve) => {
      ws.addEventListener('close', (event) => {
        this.#ended = { code: event.code, reason: event.reason };
        this.#deliver({ kind: 'closed', code: event.code, reason: event.reason });
        resolve();
      });
    });
    ws.addEventListener('message', (event) => {
      this.#deliver(typeof event.data === 'string' ? { kind: 'frame', text: event.data } : { kind: 'binary' });
    });
  }

  /** Opens `{url}/ws`; rejects with ERR_ENV_UNREACHABLE (nothing was sent) or ERR_ENV_TIMEOUT. */
  static open(client: OpenEnvClient, endpoint: Endpoint, timeoutMs: number): Promise<Session> {
    const label = `WebSocket ${endpoint.wsUrl}`;
    return new Promise<Session>((resolve, reject) => {
      const ws = new WebSocket(endpoint.wsUrl, { dispatcher: client.agent });
      const session = new Session(ws, label, client.options.maxResponseBytes);
      let settled = false;
      const finish = (err: EnvError | null) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        client.closing.signal.removeEventListener('abort', onClosing);
        if (err === null) resolve(session);
        else {
          session.#break(err);
          try {
            ws.close();
          } catch {
            // closed already
          }
          reject(err);
        }
      };
      const onClosing = () =>
        finish(new EnvError('ERR_ENV_CLOSED', `${label}: not opened: the OpenEnv client was closed`));
      const timer = setTimeout(
        () => finish(new EnvError('ERR_ENV_TIMEOUT', `${label}: not open after ${timeoutMs} ms`)),
        timeoutMs,
      );
      client.closing.signal.addEventListener('abort', onClosing, { once: true });
      ws.addEventListener('open', () => finish(null), { once: true });
      ws.addEventListener(
        'close',
        (event) =>
          finish(
            new EnvError(
              'ERR_ENV_UNREACHABLE',
              `${label}: could not open a session (closed with code ${event.code}${event.reason ? ` ${JSON.stringify(event.reason)}` : ''}: refused, unreachable, or no OpenEnv /ws route there)`,
            ),
          ),
        { once: true },
      );
    });
  }

  get broken(): EnvError | null {
    return this.#broken;
  }

  /**
   * Sends `message` (unless a frame already came unasked) and resolves to the reply frame's text.
   * Past `timeoutMs` the session breaks (ERR_ENV_TIMEOUT); a socket that ends first breaks it with
   * ERR_ENV_INFRA.
   */
  request(message: object, what: string, timeoutMs: number): Promise<string> {
    const run = async (): Promise<string> => {
      if (this.#broken !== null) throw this.#broken;
      if (this.#inbox.length === 0 && this.#ended === null) this.#ws.send(JSON.stringify(message));
      const incoming = await this.#next(timeoutMs, what);
      if (incoming.kind === 'frame') return incoming.text;
      if (incoming.kind === 'binary') {
        const err = new EnvError('ERR_ENV_BAD_REPLY', `${this.label}: ${what}: reply is a binary frame, not JSON text`);
        this.#break(err);
        throw err;
      }
      throw this.#dropped(incoming, what);
    };
    const result = this.#tail.then(run, run);
    this.#tail = result.catch(() => undefined);
    return result;
  }

  /**
   * Sends the close message (no reply comes) and closes the socket; resolves once it ended, or after
   * `timeoutMs`. Requests still pending fail with ERR_ENV_CLOSED.
   */
  async close(timeoutMs: number): Promise<void> {
    this.#break(new EnvError('ERR_ENV_CLOSED', `${this.label}: the session was closed by the engine`));
    if (this.#ended !== null) return;
    try {
      if (this.#ws.readyState === WebSocket.OPEN) this.#ws.send(JSON.stringify({ type: 'close' }));
      this.#ws.close(1000);
    } catch {
      // already closing: waiting for its end below is all there is to do
    }
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      this.#endedPromise,
      new Promise<void>((resolve) => {
        timer = setTimeout(resolve, timeoutMs);
      }),
    ]);
    clearTimeout(timer);
  }

  #deliver(incoming: Incoming): void {
    const pending = this.#pending;
    if (pending !== null) {
      this.#pending = null;
      pending.deliver(incoming);
    } else if (incoming.kind !== 'closed') this.#inbox.push(incoming);
  }

  #next(timeoutMs: number, what: string): Promise<Incoming> {
    const queued = this.#inbox.shift();
    if (queued !== undefined) return Promise.resolve(queued);
    if (this.#ended !== null) return Promise.resolve({ kind: 'closed', ...this.#ended });
    return new Promise<Incoming>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#pending = null;
        const err = new EnvError('ERR_ENV_TIMEOUT', `${this.label}: no reply to ${what} within ${timeoutMs} ms`);
        // A late reply would answer the next message: this session is done.
        this.#break(err);
        this.#ws.close(1000);
        reject(err);
      }, timeoutMs);
      this.#pending = {
        deliver: (incoming) => {
          clearTimeout(timer);
          resolve(incoming);
        },
        fail: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      };
    });
  }

  /** Breaks the session for good; a request waiting fails at once with `err`. */
  #break(err: EnvError): void {
    if (this.#broken !== null) return;
    this.#broken = err;
    const pending = this.#pending;
    this.#pending = null;
    pending?.fail(err);
  }

  #dropped(incoming: { code: number; reason: string }, what: string): EnvError {
    if (this.#broken !== null) return this.#broken;
    const how = `code ${incoming.code}${incoming.reason ? ` ${JSON.stringify(incoming.reason)}` : ''}`;
    // undici fails a socket whose frame is over its maxPayloadSize with the same 1006 a dropped
    // connection gives: the two cannot be told apart here.
    const err = new EnvError(
      'ERR_ENV_INFRA',
      `${this.label}: the socket closed (${how}) before the reply to ${what}: the session and its environment are gone${incoming.code === 1006 ? ` (a reply over maxResponseBytes = ${this.#maxBytes} ends a socket the same way)` : ''}`,
    );
    this.#break(err);
    return err;
  }
}

/** A reply frame, checked: an observation, an MCP response, or the server's error. */
type Reply =
  | { type: 'observation'; observation: Record<string, unknown>; reward: number; done: boolean }
  | { type: 'mcp'; rpc: Record<string, unknown> }
  | { type: 'error'; code: string; error: EnvError };

/**
 * One episode on one server: a session opened by `reset`, closed by `close`. Invariants: at most one
 * session, never reopened after `close`; `close` sends the close message at most once and releases the
 * endpoint's busy count exactly once; a step is sent once whatever happens to its reply.
 */
class OpenEnvActor implements Environment {
  protected readonly client: OpenEnvClient;
  readonly #endpoint: Endpoint;
  protected session: Session | null = null;
  /** The conversation the model sees next; [] once the episode is done. */
  #messages: ChatMessage[] = [];
  #done = false;
  #steps = 0;
  #rpcId = 0;
  #closed: Promise<void> | null = null;

  constructor(client: OpenEnvClient, endpoint: Endpoint) {
    this.client = client;
    this.#endpoint = endpoint;
  }

  get url(): string {
    return this.#endpoint.url;
  }

  get wsUrl(): string {
    return this.#endpoint.wsUrl;
  }

  async reset({ seed, params }: ResetOptions): Promise<ResetResult> {
    const { timeoutMs, retries } = this.client.options;
    const deadline = performance.now() + timeoutMs;
    const what = 'reset';
    // A second reset of one actor starts the episode again on the same session (OpenEnv allows it).
    const data = { ...this.client.options.params, ...params, seed };
    for (let attempt = 1; ; attempt++) {
      this.#ensureOpen();
      let failure: EnvError;
      try {
        if (this.session === null || this.session.broken !== null) {
          this.session = null;
          this.session = await Session.open(this.client, this.#endpoint, left(deadline, this.#endpoint, what));
          if (this.#closed !== null) {
            await this.session.close(timeoutMs);
            throw this.#closedError(what);
          }
        }
        const reply = this.#read(
          await this.session.request({ type: 'reset', data }, what, left(deadline, this.#endpoint, what)),
          what,
          'observation',
        );
        if (reply.type === 'observation') {
          this.#steps = 0;
          this.#done = reply.done;
          this.#messages = [];
          const prompt = this.#prompt(reply.observation, what);
          if (typeof prompt === 'string') this.#messages = [{ role: 'user', content: prompt }];
          else this.#messages = prompt;
          return { observation: reply.observation, info: this.#info(reply.observation) };
        }
        if (reply.type !== 'error' || reply.code !== 'CAPACITY_REACHED') throw unexpected(reply, what);
        failure = reply.error;
      } catch (err) {
        // Only a socket that never opened may be tried again: nothing reached an environment.
        if (!(err instanceof EnvError) || err.code !== 'ERR_ENV_UNREACHABLE') throw err;
        failure = err;
      }
      await this.session?.close(timeoutMs);
      this.session = null;
      const wait = this.client.options.retryBackoffMs * 2 ** (attempt - 1);
      if (attempt > retries || performance.now() + wait >= deadline) {
        const tries = `${attempt} attempt${attempt === 1 ? '' : 's'} within timeoutMs = ${timeoutMs}`;
        if (failure.code === 'ERR_ENV_UNREACHABLE')
          throw new EnvError('ERR_ENV_UNREACHABLE', `${failure.message} (gave up after ${tries})`, { cause: failure });
        throw new EnvError('ERR_ENV_INFRA', `${failure.message} (gave up after ${tries})`, { cause: failure });
      }
      await this.client.backoff(attempt, `reset on ${this.#endpoint.wsUrl}`);
    }
  }

  getTaskPrompt(): ChatMessage[] {
    return this.#done ? [] : this.#messages.slice();
  }

  async step(action: unknown, turn?: StepContext): Promise<StepResult> {
    if (typeof action !== 'string')
      throw new TypeError(
        `OpenEnv environments are single-agent: step() takes the reply text (got ${preview(action)})`,
      );
    const session = this.#sessionFor('step');
    const n = this.#steps + 1;
    const what = `step ${n}`;
    const reply = this.#read(
      await session.request(
        { type: 'step', data: { [this.client.settings.actionField]: action } },
        what,
        this.client.options.timeoutMs,
      ),
      what,
      'observation',
    );
    if (reply.type !== 'observation') throw unexpected(reply, what);
    this.#steps = n;
    const { observation, reward, done } = reply;
    const prompt = this.#prompt(observation, what);
    if (typeof prompt === 'string') {
      this.#messages.push(...(turn?.toolMessages ?? []), { role: 'assistant', content: action });
      if (!done) this.#messages.push({ role: 'user', content: prompt });
    } else this.#messages = prompt;
    this.#done = done;
    const truncated = done && this.#truncated(observation, what);
    return { observation, reward, terminated: done && !truncated, truncated, info: this.#info(observation) };
  }

  close(): Promise<void> {
    this.#closed ??= (async () => {
      try {
        await this.session?.close(this.client.options.timeoutMs);
      } finally {
        this.session = null;
        this.client.released(this, this.#endpoint);
      }
    })();
    return this.#closed;
  }

  /** One JSON-RPC call over the session's `mcp` message; resolves to its `result`, or its `error`. */
  protected async rpc(
    method: string,
    params: Record<string, unknown>,
    what: string,
  ): Promise<{ result: unknown } | { error: { code: unknown; message: string } }> {
    const session = this.#sessionFor(what);
    const id = ++this.#rpcId;
    const reply = this.#read(
      await session.request(
        { type: 'mcp', data: { jsonrpc: '2.0', method, params, id } },
        what,
        this.client.options.timeoutMs,
      ),
      what,
      'mcp',
    );
    if (reply.type !== 'mcp') throw unexpected(reply, what);
    const label = `${session.label}: ${what}`;
    const { rpc } = reply;
    if (rpc.id !== id) throw badReply(label, 'data.id', rpc.id, `${id}, the request's id`);
    if (rpc.error !== undefined && rpc.error !== null) {
      const error = rpc.error as { code?: unknown; message?: unknown };
      if (typeof error !== 'object' || typeof error.message !== 'string')
        throw badReply(label, 'data.error', rpc.error, 'a JSON-RPC error {code, message}');
      return { error: { code: error.code, message: error.message } };
    }
    if (!Object.hasOwn(rpc, 'result')) throw badReply(label, 'data', rpc, 'a JSON-RPC response with result or error');
    return { result: rpc.result };
  }

  #ensureOpen(): void {
    if (this.#closed !== null) throw this.#closedError('reset');
    if (this.client.closing.signal.aborted)
      throw new EnvError('ERR_ENV_CLOSED', `${this.#endpoint.wsUrl}: reset cancelled: the OpenEnv client was closed`);
  }

  #closedError(what: string): EnvError {
    return new EnvError('ERR_ENV_CLOSED', `WebSocket ${this.#endpoint.wsUrl}: ${what} after the actor was closed`);
  }

  #sessionFor(what: string): Session {
    if (this.#closed !== null) throw this.#closedError(what);
    if (this.session === null)
      throw new EnvError('ERR_ENV_CLOSED', `WebSocket ${this.#endpoint.wsUrl}: ${what} before reset (no session)`);
    if (this.session.broken !== null) {
      const cause = this.session.broken;
      // A session that broke earlier (a drop, a timeout) cannot go on: its environment is gone.
      throw new EnvError(
        cause.code === 'ERR_ENV_CLOSED' ? 'ERR_ENV_CLOSED' : 'ERR_ENV_INFRA',
        `${this.session.label}: ${what}: the session is gone (${cause.message})`,
        { cause },
      );
    }
    return this.session;
  }

  /** Parses and checks one reply frame, field by field; an error frame becomes the EnvError it means. */
  #read(text: string, what: string, expected: 'observation' | 'mcp'): Reply {
    const label = `WebSocket ${this.#endpoint.wsUrl}: ${what}`;
    const frame = parseJson(text, label) as Record<string, unknown> | null;
    if (typeof frame !== 'object' || frame === null || Array.isArray(frame))
      throw badReply(label, 'reply', frame, 'an object {"type", "data"}');
    const { type, data } = frame;
    if (typeof data !== 'object' || data === null || Array.isArray(data))
      throw badReply(label, 'data', data, 'an object');
    const fields = data as Record<string, unknown>;
    if (type === 'error') {
      const { code, message } = fields;
      if (typeof code !== 'string') throw badReply(label, 'data.code', code, 'a string (an OpenEnv WSErrorCode)');
      const said = `${label}: the server answered ${code}: ${typeof message === 'string' ? message : preview(message)}`;
      if (INFRA_CODES.has(code)) return { type: 'error', code, error: new EnvError('ERR_ENV_INFRA', said) };
      const hint =
        code === 'VALIDATION_ERROR' && what.startsWith('step')
          ? ` (the action is {${JSON.stringify(this.client.settings.actionField)}: reply}: env.openenv.actionField; ${summarizeErrors(fields.errors)})`
          : '';
      return { type: 'error', code, error: new EnvError('ERR_ENV_HTTP', `${said}${hint}`) };
    }
    if (type !== expected)
      throw badReply(label, 'type', type, `${JSON.stringify(expected)} or "error" (OpenEnv's reply to ${what})`);
    if (type === 'mcp') return { type: 'mcp', rpc: fields };
    const { observation, reward, done } = fields;
    if (typeof observation !== 'object' || observation === null || Array.isArray(observation))
      throw badReply(label, 'data.observation', observation, 'an object');
    let value: number;
    if (reward === null || reward === undefined) value = 0;
    else if (typeof reward === 'boolean') value = reward ? 1 : 0;
    else if (typeof reward === 'number' && Number.isFinite(reward)) value = reward;
    else throw badReply(label, 'data.reward', reward, 'a finite number, a boolean or null');
    if (done !== undefined && typeof done !== 'boolean') throw badReply(label, 'data.done', done, 'a boolean');
    return {
      type: 'observation',
      observation: observation as Record<string, unknown>,
      reward: value,
      done: done === true,
    };
  }

  /** The observation's prompt: chat messages (the whole conversation) or one text. */
  #prompt(observation: Record<string, unknown>, what: string): ChatMessage[] | string {
    const field = this.client.settings.promptField;
    const value = observation[field];
    const label = `WebSocket ${this.#endpoint.wsUrl}: ${what}`;
    if (typeof value === 'string') return value;
    if (Array.isArray(value)) {
      try {
        return checkTaskPrompt(value).map((m) => ({ role: m.role, content: m.content }));
      } catch (err) {
        if (err instanceof EnvReplyError)
          throw new EnvError(
            'ERR_ENV_BAD_REPLY',
            `${label}: observation.${field} (env.openenv.promptField): ${err.message.replace('getTaskPrompt()', field)}`,
            { cause: err },
          );
        throw err;
      }
    }
    throw badReply(
      label,
      `observation.${field}`,
      value,
      `chat messages or a string (env.openenv.promptField; the observation's fields: ${Object.keys(observation).join(', ') || 'none'})`,
    );
  }

  #truncated(observation: Record<string, unknown>, what: string): boolean {
    const field = this.client.settings.truncatedField;
    if (field === null) return false;
    const value = observation[field];
    if (value === undefined || value === null) return false;
    if (typeof value !== 'boolean')
      throw badReply(
        `WebSocket ${this.#endpoint.wsUrl}: ${what}`,
        `observation.${field}`,
        value,
        'a boolean (env.openenv.truncatedField)',
      );
    return value;
  }

  /** The observation's fields besides the prompt and the truncation flag. */
  #info(observation: Record<string, unknown>): Record<string, unknown> {
    const { promptField, truncatedField } = this.client.settings;
    const info: Record<string, unknown> = {};
    for (const [key, value] of Object.entries(observation))
      if (key !== promptField && key !== truncatedField) info[key] = value;
    return info;
  }
}

/** An actor whose environment's MCP tools are the model's (`env.openenv.tools`). */
class OpenEnvToolActor extends OpenEnvActor {
  /** Asked once per session: an OpenEnv environment's tools do not change within an episode. */
  #tools: ToolSchema[] | null = null;

  async tools(): Promise<ToolSchema[]> {
    if (this.#tools !== null) return this.#tools;
    const what = 'MCP tools/list';
    const label = `WebSocket ${this.wsUrl}: ${what}`;
    const answer = await this.rpc('tools/list', {}, what);
    if ('error' in answer)
      throw new EnvError(
        'ERR_ENV_HTTP',
        `${label}: the server answered JSON-RPC error ${preview(answer.error.code)}: ${answer.error.message}`,
      );
    const tools = (answer.result as { tools?: unknown } | null)?.tools;
    if (!Array.isArray(tools)) throw badReply(label, 'result.tools', tools, 'an array');
    this.#tools = tools.map((tool, i) => {
      const { name, description, inputSchema, input_schema } = (tool ?? {}) as Record<string, unknown>;
      if (typeof name !== 'string' || name === '') throw badReply(label, `result.tools[${i}].name`, name, 'a string');
      const parameters = inputSchema ?? input_schema ?? { type: 'object', properties: {} };
      if (typeof parameters !== 'object' || parameters === null || Array.isArray(parameters))
        throw badReply(label, `result.tools[${i}].inputSchema`, parameters, 'a JSON schema object');
      return {
        type: 'function' as const,
        function: {
          name,
          ...(typeof description === 'string' && description !== '' ? { description } : {}),
          parameters: parameters as Record<string, unknown>,
        },
      };
    });
    return this.#tools;
  }

  /**
   * tools/call on the episode's session. A JSON-RPC error is the tool's failure, shown to the model;
   * a lost session throws (and the next step fails the episode as infrastructure). `signal` detaches
   * the caller only: the reply is still awaited, so the session stays in step.
   */
  async callTool(call: ToolCallRequest, signal: AbortSignal): Promise<ToolOutput> {
    const what = `MCP tools/call ${JSON.stringify(call.name)}`;
    const answer = this.rpc('tools/call', { name: call.name, arguments: call.arguments }, what);
    const aborted = new Promise<never>((_, reject) => {
      const onAbort = () => reject(signal.reason instanceof Error ? signal.reason : new Error(`${what} aborted`));
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
      void answer.finally(() => signal.removeEventListener('abort', onAbort)).catch(() => undefined);
    });
    const settled = await Promise.race([answer, aborted]);
    if ('error' in settled) return { content: settled.error.message, isError: true };
    return toolOutput(settled.result);
  }
}

/**
 * A tools/call result as text: an MCP CallToolResult (a FastMCP client's, turned into a dict) gives
 * its `data` when present — what OpenEnv's own client returns (mcp_client.py L420-423) — else its text
 * content; a raw MCP server's tool gives its return value (http_server.py L913-920).
 */
function toolOutput(result: unknown): ToolOutput {
  const text = (value: unknown) => (typeof value === 'string' ? value : JSON.stringify(value ?? null));
  if (typeof result !== 'object' || result === null || Array.isArray(result)) return text(result);
  const r = result as Record<string, unknown>;
  const isError = r.is_error === true || r.isError === true;
  let content: string;
  if (r.data !== undefined && r.data !== null) content = text(r.data);
  else if (Array.isArray(r.content))
    content = r.content
      .map((part) =>
        typeof part === 'object' && part !== null && (part as { type?: unknown }).type === 'text'
          ? text((part as { text?: unknown }).text)
          : JSON.stringify(part),
      )
      .join('\n');
  else content = text(result);
  return isError ? { content, isError } : content;
}

/** Time left before `deadline` for a part of `what`; ERR_ENV_TIMEOUT when none is. */
function left(deadline: number, endpoint: Endpoint, what: string): number {
  const ms = Math.floor(deadline - performance.now());
  if (ms <= 0)
    throw new EnvError('ERR_ENV_TIMEOUT', `WebSocket ${endpoint.wsUrl}: ${what} did not finish within timeoutMs`);
  return ms;
}

/** An error frame where an answer was expected is that error; any other reply, a bad one. */
function unexpected(reply: Reply, what: string): EnvError {
  if (reply.type === 'error') return reply.error;
  return new EnvError('ERR_ENV_BAD_REPLY', `${what}: unexpected ${reply.type} reply`);
}

function summarizeErrors(errors: unknown): string {
  if (!Array.isArray(errors) || errors.length === 0) return 'no details';
  return errors
    .slice(0, 3)
    .map((e) => {
      const { loc, msg } = (e ?? {}) as { loc?: unknown; msg?: unknown };
      return `${Array.isArray(loc) ? loc.join('.') : '?'}: ${typeof msg === 'string' ? msg : preview(msg)}`;
    })
    .join('; ');
}

function badReply(label: string, field: string, value: unknown, expected: string): EnvError {
  return new EnvError('ERR_ENV_BAD_REPLY', `${label}: ${field} must be ${expected} (got ${preview(value)})`);
}

function checkOptions(options: HttpEnvOptions): void {
  const problems: string[] = [];
  if (!Array.isArray(options.urls) || options.urls.length === 0)
    problems.push(`urls: must list at least one OpenEnv server URL (got ${preview(options.urls)})`);
  else
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
  const positive = (field: string, v: unknown) => {
    if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0)
      problems.push(`${field}: must be a positive number (got ${preview(v)})`);
  };
  positive('timeoutMs', options.timeoutMs);
  positive('maxResponseBytes', options.maxResponseBytes);
  if (!Number.isInteger(options.retries) || options.retries < 0)
    problems.push(`retries: must be an integer >= 0 (got ${preview(options.retries)})`);
  if (!Number.isFinite(options.retryBackoffMs) || options.retryBackoffMs < 0)
    problems.push(`retryBackoffMs: must be a number >= 0 (got ${preview(options.retryBackoffMs)})`);
  if (options.dedupeSteps === true)
    problems.push('dedupeSteps: an OpenEnv server applies every step it receives, so it cannot deduplicate steps');
  if (
    options.params !== undefined &&
    (typeof options.params !== 'object' || options.params === null || Array.isArray(options.params))
  )
    problems.push(`params: must be an object (got ${preview(options.params)})`);
  const settings = options.openenv ?? OPENENV_DEFAULTS;
  for (const key of ['actionField', 'promptField'] as const)
    if (typeof settings[key] !== 'string' || settings[key] === '')
      problems.push(`openenv.${key}: must be a field name (got ${preview(settings[key])})`);
  if (settings.truncatedField !== null && typeof settings.truncatedField !== 'string')
    problems.push(`openenv.truncatedField: must be a field name or null (got ${preview(settings.truncatedField)})`);
  if (problems.length > 0) throw new ConfigError(problems.map((p) => `openenv env: ${p}`));
}

/**
 * NeMo Gym resources servers, unchanged, as `Environment`s (`tasks[].env.protocol: "nemo-gym"`). The
 * engine takes the part of NeMo Gym's own agent, `responses_api_agents/simple_agent/app.py` (`run` and
 * `_create_episode`), of github.com/NVIDIA-NeMo/Gym read at 07d6b0d07b22fcf530b4c211dae2ee23100428e4:
 *
 *   reset          POST /seed_session  the dataset row as drawn                 → {} (and Set-Cookie: the session)
 *   getTaskPrompt  nothing sent        the row's responses_create_params.input (and instructions), as chat
 *   tools          nothing sent        the row's responses_create_params.tools (function tools)
 *   callTool       POST /<tool name>   the call's arguments                      → any status, any body: the tool's output
 *   step           POST /verify        {...row, "response": Responses object}    → {..., "reward": float}
 *   close          nothing sent        (a resources server has no route that ends a session)
 *   prewarm        GET /               → {"status": "ok"} (server_utils.py setup_liveness), with the session cookie
 *
 * One NeMo Gym episode is one engine step: the model calls the row's tools until it answers without a
 * call, and that answer is the step's action, verified at once (terminated). The dataset line is the
 * row NeMo Gym's rollout collection would POST to its agent: `responses_create_params` plus the fields
 * the server's seed and verify read (base_resources_server.py BaseRunRequest; e.g.
 * resources_servers/example_session_state_mgmt/data/example.jsonl). A line's `seed` is the engine's
 * (buffer/sampler.ts takes it out) and never reaches the server.
 *
 * The session. A resources server keeps each episode's state under the session id in a Starlette
 * session cookie named `<server class>___<config name>` (server_utils.py get_session_middleware_key,
 * setup_session_middleware), set on every reply. simple_agent sends the cookie /seed_session set on every
 * tool call and on /verify, replacing it with each reply's (`resources_server_cookies =
 * api_response.cookies`); here each actor (one rollout) keeps a jar of its own, emptied at reset and
 * updated from every reply. The cookie is opaque (signed); its name is how a reply shows it came from
 * the server `env.http.name` names, checked by prewarm and at every seed.
 *
 * Tool calls run one at a time, in the order of the reply, as simple_agent runs them (the agent loop
 * may call `callTool` concurrently; a stateful server such as example_session_state_mgmt's counter
 * depends on the order). Whatever a tool route answers — a 500 with `repr(e)` from the exception
 * middleware (server_utils.py setup_exception_middleware), a 422 — is the model's tool output, as in
 * simple_agent ("Resource-server errors are valid model-visible tool outputs"), never a failure.
 *
 * Failures the server says are not the policy's (ERR_ENV_INFRA: never trained, the slot runs again):
 * a verify reply with `_ng_failure_class` (judge.py judge_failsafe: "judge_failed", reward 0.0, HTTP
 * 200), `_ng_failure_terminal` or `_ng_no_persist` (rollout_collection.py, the routing sentinels), or
 * `mask_sample: true` (token_id_capture/delivery.py MASK_SAMPLE_KEY: "exclude a rollout from the loss").
 *
 * Timeouts and retries. NeMo Gym's own client has no timeout (server_utils.py set_global_aiohttp_client:
 * `ClientTimeout()`, every field None) and retries a dropped connection for ever: a collection job that
 * hangs is killed and resumed from its files. The engine is a long-running producer in which a hung call
 * would hold its episode, its actor slot and its group for ever, so every attempt is bounded by
 * `env.http.timeoutMs` (the whole call, retries included, by `env.timeoutMs`). /seed_session, /verify
 * and GET / are retried after a 5xx, a timeout or a transport error (a repeated seed is a fresh session,
 * a repeated verify reads the same state); a tool call only when it provably never left this process
 * (a tool may not be idempotent: increment_counter), otherwise its error is the call's result
 * (the agent loop shows it to the model as `error: …`).
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { Pool } from 'undici';
import type { ChatMessage, ToolCallMessage } from '../domain/rollout.ts';
import { ConfigError, preview, serverMessage } from '../errors.ts';
import {
  LeastBusy,
  KEEP_ALIVE_TIMEOUT_MS,
  MAX_CONNECT_TIMEOUT_MS,
  NOT_SENT_CODES,
  TIMEOUT_CODES,
} from './endpoints.ts';
import { EnvError } from './errors.ts';
import { readLimited, type HttpEnvOptions } from './http-env.ts';
import { formatConflict, protocolConflicts } from './protocol.ts';
import type {
  AgentActions,
  Environment,
  EnvParams,
  ResetOptions,
  ResetResult,
  StepContext,
  StepResult,
  ToolCallRequest,
  ToolSchema,
} from './types.ts';

/** One rollout's episode on one resources server. */
export interface NemoGymEnvironment extends Environment {
  /** The resources server this actor's episodes run on. */
  readonly url: string;
  reset(options: ResetOptions): Promise<ResetResult>;
  getTaskPrompt(): ChatMessage[];
  tools(): ToolSchema[];
  callTool(call: ToolCallRequest, signal: AbortSignal): Promise<string>;
  step(action: string | AgentActions, turn?: StepContext): Promise<StepResult>;
  checkResetParams(params: EnvParams): void;
  close(): Promise<void>;
}

export interface NemoGymEnvironments {
  /** A fresh actor on the least busy server; nothing is sent until its `reset`. */
  create(): NemoGymEnvironment;
  /** GET / on every server: up, and the NeMo Gym resources server `name` names (its session cookie). */
  prewarm(): Promise<void>;
  /** Cancels what is pending (ERR_ENV_CLOSED) and closes the connections. */
  close(): Promise<void>;
}

export function createNemoGymEnvironments(options: HttpEnvOptions): NemoGymEnvironments {
  return new NemoGymClient(options);
}

const DEFAULT_CONNECTIONS = 64;

/**
 * The routes of the server itself (base_resources_server.py SimpleResourcesServer.setup_webserver,
 * RESERVED_MCP_TOOL_NAMES): a row's tool of one of these names would have the model call them.
 */
const RESERVED_TOOL_NAMES = new Set(['seed_session', 'verify', 'aggregate_metrics', 'reverify_mode', 'mcp']);

/**
 * The fields of `responses_create_params` (openai_utils.py NeMoGymResponseCreateParamsNonStreaming,
 * `extra="forbid"`): any other makes the server refuse /verify (422), so a row holding one is refused
 * before the episode.
 */
const CREATE_PARAMS_FIELDS = new Set([
  'background',
  'include',
  'input',
  'instructions',
  'max_output_tokens',
  'max_tool_calls',
  'metadata',
  'model',
  'parallel_tool_calls',
  'previous_response_id',
  'prompt',
  'reasoning',
  'service_tier',
  'store',
  'temperature',
  'text',
  'tool_choice',
  'tools',
  'top_logprobs',
  'top_p',
  'truncation',
  'user',
  'stream',
]);

interface Endpoint {
  /** As configured, without a trailing slash: used in messages. */
  readonly url: string;
  /** Path prefix of the URL (`http://h:1/gym` → `/gym`), before every route. */
  readonly prefix: string;
  readonly pool: Pool;
  /** Actors on this server not closed yet: the "busy" measure new actors are spread by. */
  live: number;
}

interface CallSpec {
  method: 'GET' | 'POST';
  /** Route under the URL's prefix: `/seed_session`, `/verify`, `/<tool>`, `/`. */
  path: string;
  body?: string;
  /** For messages: what the call was, e.g. `tool call guess`. */
  what: string;
  /** May be sent again after it may have reached the server (everything but a tool call). */
  idempotent: boolean;
  /** Every status is an answer (a tool's output); otherwise a non-2xx fails the call (ERR_ENV_HTTP). */
  anyStatus: boolean;
  /** The episode's session cookies: sent, and updated from the reply's Set-Cookie. */
  cookies: SessionCookies;
  /** Aborted when the actor closes: ERR_ENV_CLOSED. */
  closed: AbortSignal | null;
  /** A tool call's own signal (its timeout, or the rollout cancelled): ERR_ENV_CANCELLED. */
  signal: AbortSignal | null;
}

interface Reply {
  status: number;
  text: string;
}

type Failure = { error: EnvError; kind: 'not-sent' | 'maybe-applied' | 'final' };
type Attempt = ({ ok: true } & Reply) | ({ ok: false } & Failure);

class NemoGymClient implements NemoGymEnvironments {
  readonly options: HttpEnvOptions;
  readonly #endpoints: Endpoint[];
  /** Aborted by close(): cancels in-flight attempts and backoff waits. */
  readonly #closing = new AbortController();
  /** New episodes go to the least busy server (endpoints.ts). */
  readonly #spread: LeastBusy<Endpoint>;

  constructor(options: HttpEnvOptions) {
    checkOptions(options);
    this.options = options;
    const connections = options.connections ?? DEFAULT_CONNECTIONS;
    this.#endpoints = options.urls.map((raw) => {
      const url = raw.replace(/\/+$/, '');
      const parsed = new URL(url);
      return {
        url,
        prefix: parsed.pathname.replace(/\/+$/, ''),
        pool: new Pool(parsed.origin, {
          connections,
          keepAliveTimeout: KEEP_ALIVE_TIMEOUT_MS,
          connectTimeout: Math.min(options.timeoutMs, MAX_CONNECT_TIMEOUT_MS),
          // Our own signal bounds each attempt; undici's timers only coarsely (about once a second).
          headersTimeout: 0,
          bodyTimeout: 0,
        }),
        live: 0,
      };
    });
    this.#spread = new LeastBusy(this.#endpoints);
  }

  create(): NemoGymEnvironment {
    if (this.#closing.signal.aborted)
      throw new EnvError('ERR_ENV_CLOSED', 'nemo-gym env: the environment client is closed');
    const endpoint = this.#spread.pick();
    endpoint.live += 1;
    return new NemoGymActor(this, endpoint);
  }

  async prewarm(): Promise<void> {
    await Promise.all(
      this.#endpoints.map(async (endpoint) => {
        const label = `GET ${endpoint.url}/`;
        const cookies = new SessionCookies();
        const { text } = await this.call(endpoint, {
          method: 'GET',
          path: '/',
          what: 'liveness check',
          idempotent: true,
          anyStatus: false,
          cookies,
          closed: null,
          signal: null,
        });
        const json = parseJson(text, label);
        if ((json as { status?: unknown } | null)?.status !== 'ok')
          throw badReply(label, 'reply', json, 'NeMo Gym\'s liveness reply {"status": "ok"}');
        this.checkSessionCookie(endpoint, cookies, label, 'prewarm');
      }),
    );
  }

  async close(): Promise<void> {
    if (this.#closing.signal.aborted) return;
    this.#closing.abort();
    await Promise.all(this.#endpoints.map((e) => e.pool.close().catch(() => undefined)));
  }

  released(endpoint: Endpoint): void {
    endpoint.live -= 1;
  }

  /**
   * The jar holds the session cookie of the server `name` names (`<class>___<name>`). At prewarm a
   * server that is another one is a configuration error; at a seed, a reply without it one we cannot use.
   */
  checkSessionCookie(endpoint: Endpoint, cookies: SessionCookies, label: string, when: 'prewarm' | 'seed'): void {
    const name = this.options.name;
    if (cookies.names().some((n) => n.endsWith(`___${name}`))) return;
    const sessions = cookies.names().filter((n) => n.includes('___'));
    if (when === 'prewarm' && sessions.length > 0) {
      throw new ConfigError([
        `nemo-gym env: name: ${endpoint.url} is the NeMo Gym server ${sessions.map((s) => JSON.stringify(s.slice(s.indexOf('___') + 3))).join(', ')} (its session cookie ${sessions.map((s) => JSON.stringify(s)).join(', ')}), not ${JSON.stringify(name)}`,
      ]);
    }
    const seen = cookies.names().length === 0 ? 'none' : cookies.names().join(', ');
    throw new EnvError(
      'ERR_ENV_BAD_REPLY',
      `${label}: no NeMo Gym session cookie "<server class>___${name}" in the reply (cookies: ${seen}); is ${endpoint.url} the resources server ${JSON.stringify(name)}?`,
    );
  }

  /** One call with the retry policy (module comment): the reply of its last attempt. */
  async call(endpoint: Endpoint, spec: CallSpec): Promise<Reply> {
    const attempts = this.options.retries + 1;
    for (let attempt = 1; ; attempt++) {
      const outcome = await this.#attempt(endpoint, spec);
      if (outcome.ok) return outcome;
      const { error, kind } = outcome;
      if (kind === 'final' || (kind === 'maybe-applied' && !spec.idempotent)) throw error;
      if (attempt >= attempts) {
        if (attempts === 1) throw error;
        throw new EnvError(error.code, `${error.message} (gave up after ${attempts} attempts)`, {
          status: error.status,
          cause: error.cause ?? error,
        });
      }
      const stops = [this.#closing.signal, spec.closed, spec.signal].filter((s): s is AbortSignal => s !== null);
      try {
        await sleep(this.options.retryBackoffMs * 2 ** (attempt - 1), undefined, { signal: AbortSignal.any(stops) });
      } catch (err) {
        throw this.#stopped(endpoint, spec, err) ?? error;
      }
    }
  }

  async #attempt(endpoint: Endpoint, spec: CallSpec): Promise<Attempt> {
    const label = `${spec.method} ${endpoint.url}${spec.path}`;
    const before = this.#stopped(endpoint, spec);
    if (before !== null) return { ok: false, kind: 'final', error: before };
    const timeout = AbortSignal.timeout(this.options.timeoutMs);
    const signal = AbortSignal.any(
      [timeout, this.#closing.signal, spec.closed, spec.signal].filter((s): s is AbortSignal => s !== null),
    );
    const cookie = spec.cookies.header();
    let status: number;
    let text: string;
    try {
      const response = await endpoint.pool.request({
        method: spec.method,
        path: `${endpoint.prefix}${spec.path}`,
        headers: {
          ...(spec.body === undefined ? {} : { 'content-type': 'application/json' }),
          ...(cookie === null ? {} : { cookie }),
        },
        body: spec.body,
        signal,
      });
      status = response.statusCode;
      // Every reply re-sends the session (server_utils.py add_session_id), whatever its status.
      spec.cookies.update(response.headers['set-cookie']);
      text = await readLimited(
        response.body,
        response.headers['content-length'],
        this.options.maxResponseBytes,
        `${label} (${spec.what})`,
      );
    } catch (err) {
      const stopped = this.#stopped(endpoint, spec, err);
      if (stopped !== null) return { ok: false, kind: 'final', error: stopped };
      if (err instanceof EnvError) return { ok: false, kind: 'final', error: err };
      const code = (err as { code?: unknown }).code;
      if (code === 'UND_ERR_DESTROYED' || code === 'UND_ERR_CLOSED')
        return { ok: false, kind: 'final', error: this.#closedError(endpoint, spec, err) };
      if (timeout.aborted || (typeof code === 'string' && TIMEOUT_CODES.has(code))) {
        return {
          ok: false,
          kind: 'maybe-applied',
          error: new EnvError(
            'ERR_ENV_TIMEOUT',
            `${label} (${spec.what}) timed out after ${this.options.timeoutMs} ms (env.http.timeoutMs)`,
            { cause: err },
          ),
        };
      }
      const detail = `${typeof code === 'string' ? `${code} ` : ''}${(err as Error)?.message ?? String(err)}`;
      return {
        ok: false,
        kind: typeof code === 'string' && NOT_SENT_CODES.has(code) ? 'not-sent' : 'maybe-applied',
        error: new EnvError(
          'ERR_ENV_UNREACHABLE',
          `${label} (${spec.what}) failed: NeMo Gym server ${endpoint.url} unreachable: ${detail}`,
          { cause: err },
        ),
      };
    }
    if (spec.anyStatus || (status >= 200 && status < 300)) return { ok: true, status, text };
    return {
      ok: false,
      kind: status >= 500 ? 'maybe-applied' : 'final',
      error: new EnvError('ERR_ENV_HTTP', `${label} (${spec.what}) answered ${status}: ${serverMessage(text, 300)}`, {
        status,
      }),
    };
  }

  /** Why a call may not go on, if it may not: the client or its actor closed, or its own signal aborted. */
  #stopped(endpoint: Endpoint, spec: CallSpec, cause?: unknown): EnvError | null {
    if (this.#closing.signal.aborted || spec.closed?.aborted) return this.#closedError(endpoint, spec, cause);
    if (spec.signal?.aborted) {
      return new EnvError(
        'ERR_ENV_CANCELLED',
        `${spec.method} ${endpoint.url}${spec.path} (${spec.what}) cancelled: the call was given up (its time limit, or the rollout cancelled)`,
        { cause },
      );
    }
    return null;
  }

  #closedError(endpoint: Endpoint, spec: CallSpec, cause?: unknown): EnvError {
    return new EnvError(
      'ERR_ENV_CLOSED',
      `${spec.method} ${endpoint.url}${spec.path} (${spec.what}) cancelled: the ${this.#closing.signal.aborted ? 'environment client' : "episode's environment"} was closed`,
      { cause },
    );
  }
}

/** A dataset row, read: sent as it is; its prompt and tools as the agent loop takes them. */
interface Row {
  params: EnvParams;
  create: Record<string, unknown>;
  prompt: ChatMessage[];
  tools: ToolSchema[];
}

/**
 * One rollout's episode. Invariants: the jar is emptied at every reset and only this actor's calls
 * use it; tool calls reach the server one at a time, in the order callTool was called; close() cancels
 * what is pending (ERR_ENV_CLOSED) and releases the server's busy count exactly once.
 */
class NemoGymActor implements NemoGymEnvironment {
  readonly #client: NemoGymClient;
  readonly #endpoint: Endpoint;
  readonly #closed = new AbortController();
  #cookies = new SessionCookies();
  #row: Row | null = null;
  #phase: 'idle' | 'running' | 'done' = 'idle';
  /** The last tool call queued: the next one starts after it settled. */
  #toolQueue: Promise<unknown> = Promise.resolve();

  constructor(client: NemoGymClient, endpoint: Endpoint) {
    this.#client = client;
    this.#endpoint = endpoint;
  }

  get url(): string {
    return this.#endpoint.url;
  }

  checkResetParams(params: EnvParams): void {
    readRow(params);
  }

  async reset({ params }: ResetOptions): Promise<ResetResult> {
    const row = readRow(params);
    this.#row = null;
    this.#phase = 'idle';
    this.#cookies = new SessionCookies();
    const label = `POST ${this.#endpoint.url}/seed_session`;
    const { text } = await this.#client.call(this.#endpoint, {
      method: 'POST',
      path: '/seed_session',
      // simple_agent's run(): `json=body.model_dump()`, the whole row.
      body: JSON.stringify(params),
      what: 'seed_session',
      idempotent: true,
      anyStatus: false,
      cookies: this.#cookies,
      closed: this.#closed.signal,
      signal: null,
    });
    const json = parseJson(text, label);
    if (!isObject(json)) throw badReply(label, 'reply', json, 'an object (BaseSeedSessionResponse)');
    this.#client.checkSessionCookie(this.#endpoint, this.#cookies, label, 'seed');
    this.#row = row;
    this.#phase = 'running';
    return { observation: null, info: json };
  }

  getTaskPrompt(): ChatMessage[] {
    return this.#phase === 'running' && this.#row !== null ? this.#row.prompt.map((m) => ({ ...m })) : [];
  }

  tools(): ToolSchema[] {
    return this.#phase === 'running' && this.#row !== null ? this.#row.tools : [];
  }

  async callTool(call: ToolCallRequest, signal: AbortSignal): Promise<string> {
    if (this.#phase !== 'running') throw new Error(`nemo-gym: tool call ${call.name} outside an episode`);
    const run = async (): Promise<string> => {
      const { text } = await this.#client.call(this.#endpoint, {
        method: 'POST',
        path: `/${encodeURIComponent(call.name)}`,
        body: JSON.stringify(call.arguments),
        what: `tool call ${call.name} (${call.id})`,
        idempotent: false,
        anyStatus: true,
        cookies: this.#cookies,
        closed: this.#closed.signal,
        signal,
      });
      // simple_agent: `tool_output = (await api_response.content.read()).decode()`, whatever the status.
      return text;
    };
    const result = this.#toolQueue.then(run, run);
    this.#toolQueue = result.catch(() => undefined);
    return result;
  }

  async step(action: string | AgentActions, turn?: StepContext): Promise<StepResult> {
    if (typeof action !== 'string') throw new Error('nemo-gym: an episode has one agent: step takes the reply text');
    const row = this.#row;
    if (this.#phase !== 'running' || row === null)
      throw new Error(`nemo-gym: step called ${this.#phase === 'idle' ? 'before reset' : 'after the episode ended'}`);
    this.#phase = 'done';
    const label = `POST ${this.#endpoint.url}/verify`;
    const response = responseOf(row.create, turn?.toolMessages ?? [], action);
    const { text } = await this.#client.call(this.#endpoint, {
      method: 'POST',
      path: '/verify',
      // simple_agent's run(): `body.model_dump() | {"response": model_response_json}`.
      body: JSON.stringify({ ...row.params, response }),
      what: 'verify',
      idempotent: true,
      anyStatus: false,
      cookies: this.#cookies,
      closed: this.#closed.signal,
      signal: null,
    });
    const json = parseJson(text, label);
    if (!isObject(json)) throw badReply(label, 'reply', json, 'an object (BaseVerifyResponse)');
    const signals = failureSignals(json, label);
    if (signals.length > 0) {
      throw new EnvError(
        'ERR_ENV_INFRA',
        `${label}: the server marks the episode as failed outside the policy (${signals.join('; ')}): never trained as its reward`,
      );
    }
    const reward = json.reward;
    if (typeof reward !== 'number' || !Number.isFinite(reward))
      throw badReply(label, 'reward', reward, 'a finite number');
    const info: Record<string, unknown> = {};
    // What verify added besides the reward (resolved, reward_components, …): the echoed row and response are ours.
    for (const [k, v] of Object.entries(json))
      if (k !== 'reward' && k !== 'response' && !Object.hasOwn(row.params, k)) info[k] = v;
    return { observation: null, reward, terminated: true, truncated: false, info };
  }

  close(): Promise<void> {
    if (!this.#closed.signal.aborted) {
      this.#closed.abort();
      this.#client.released(this.#endpoint);
      this.#phase = 'done';
      this.#row = null;
      this.#cookies = new SessionCookies();
    }
    return Promise.resolve();
  }
}

/**
 * The failure signals of a verify reply, described; none: an ordinary reward. A signal of the wrong
 * type is a malformed reply, not a reason to train on it.
 */
function failureSignals(json: Record<string, unknown>, label: string): string[] {
  const found: string[] = [];
  const failureClass = json._ng_failure_class;
  if (failureClass !== undefined && failureClass !== null) {
    if (typeof failureClass !== 'string') throw badReply(label, '_ng_failure_class', failureClass, 'a string');
    const judge = json._ng_failure_judge_error;
    found.push(`_ng_failure_class ${JSON.stringify(failureClass)}${typeof judge === 'string' ? `: ${judge}` : ''}`);
  }
  for (const flag of ['mask_sample', '_ng_failure_terminal', '_ng_no_persist']) {
    const value = json[flag];
    if (value === undefined || value === null || value === false) continue;
    if (value !== true) throw badReply(label, flag, value, 'a boolean');
    found.push(`${flag} true`);
  }
  return found;
}

/**
 * The episode as a Responses API object, built as NeMo Gym builds it from a chat completion
 * (responses_converter.py `chat_completion_to_response`, `postprocess_assistant_message_dict`) with the
 * tool outputs simple_agent appends (`NeMoGymFunctionCallOutput(type, call_id, output)`), field for
 * field as pydantic dumps them: `output` holds every model item and tool output of the episode, not the
 * input. The engine's policy is not named to an environment: `model` is the row's, or "".
 *
 * When the step ended on a reply that still called tools (out of `tasks[].tools.maxCallsPerTurn`), its
 * text is the action and already the last assistant message of the exchange: it is not added twice
 * (simple_agent with max_steps stops so too, after the calls' outputs).
 */
export function responseOf(
  create: Record<string, unknown>,
  toolMessages: readonly ChatMessage[],
  action: string,
): Record<string, unknown> {
  const output: Record<string, unknown>[] = [];
  for (const m of toolMessages) {
    if (m.role === 'assistant') output.push(...assistantItems(m.content, m.tool_calls ?? []));
    else if (m.role === 'tool')
      output.push({
        call_id: m.tool_call_id ?? '',
        output: m.content,
        type: 'function_call_output',
        id: null,
        status: null,
      });
  }
  const lastAssistant = toolMessages.findLastIndex((m) => m.role === 'assistant');
  const endedOnCalls =
    lastAssistant >= 0 &&
    toolMessages[lastAssistant].content === action &&
    toolMessages.slice(lastAssistant + 1).every((m) => m.role === 'tool');
  if (!endedOnCalls) output.push(...assistantItems(action, []));
  const field = (name: string, otherwise: unknown = null): unknown => create[name] ?? otherwise;
  return {
    id: `resp_${hex()}`,
    created_at: Math.floor(Date.now() / 1000),
    error: null,
    incomplete_details: null,
    instructions: field('instructions'),
    metadata: field('metadata'),
    model: typeof create.model === 'string' ? create.model : '',
    object: 'response',
    output,
    parallel_tool_calls: field('parallel_tool_calls', true),
    temperature: field('temperature'),
    tool_choice: field('tool_choice', 'auto'),
    tools: field('tools', []),
    top_p: field('top_p'),
    background: field('background'),
    max_output_tokens: field('max_output_tokens'),
    max_tool_calls: field('max_tool_calls'),
    previous_response_id: field('previous_response_id'),
    prompt: field('prompt'),
    reasoning: field('reasoning'),
    service_tier: field('service_tier'),
    status: 'completed',
    text: field('text'),
    top_logprobs: field('top_logprobs'),
    truncation: field('truncation'),
    usage: null,
    user: field('user'),
  };
}

/** postprocess_assistant_message_dict: a message item when there is text or nothing else, then one function_call per call. */
function assistantItems(content: string, calls: readonly ToolCallMessage[]): Record<string, unknown>[] {
  const items: Record<string, unknown>[] = [];
  if (content !== '' || calls.length === 0) {
    items.push({
      id: `msg_${hex()}`,
      content: [{ annotations: [], text: content, type: 'output_text', logprobs: null }],
      role: 'assistant',
      status: 'completed',
      type: 'message',
    });
  }
  for (const call of calls) {
    items.push({
      arguments: call.function.arguments,
      call_id: call.id,
      name: call.function.name,
      type: 'function_call',
      id: call.id,
      status: 'completed',
    });
  }
  return items;
}

function hex(): string {
  return randomUUID().replaceAll('-', '');
}

/**
 * A dataset row as NeMo Gym's model server would read it (responses_converter.py
 * `responses_to_chat_completion_create_params`): a string input is one user message; message items keep
 * their role (`developer` becomes `system`, as its vLLM server's replace_developer_role_with_system
 * does) and their text parts joined; function_call items join the assistant message before them and
 * function_call_output items are tool messages; `instructions` is a system message first, folded with
 * the leading system messages ("\n\n"). Function tools become chat tools without `strict` (the
 * converter drops it). What the engine cannot give the model (images, reasoning items, hosted tools)
 * is refused, naming the field: an Error (the dataset's, not the server's).
 */
export function readRow(params: EnvParams): Row {
  const fail = (field: string, value: unknown, expected: string): Error =>
    new Error(`nemo-gym row: ${field} must be ${expected} (got ${preview(value)})`);
  const create = params.responses_create_params;
  if (!isObject(create))
    throw fail('responses_create_params', create, 'an object (the row NeMo Gym collects rollouts from)');
  for (const key of Object.keys(create))
    if (!CREATE_PARAMS_FIELDS.has(key))
      throw fail(
        `responses_create_params.${key}`,
        create[key],
        'absent: NeMo Gym refuses fields the Responses create params do not have (extra="forbid")',
      );
  const prompt: ChatMessage[] = [];
  const input = create.input;
  if (typeof input === 'string') prompt.push({ role: 'user', content: input });
  else if (Array.isArray(input)) {
    let assistant: ChatMessage | null = null;
    input.forEach((item: unknown, i) => {
      const at = `responses_create_params.input[${i}]`;
      if (!isObject(item)) throw fail(at, item, 'an input item object');
      const type = item.type ?? (item.role !== undefined ? 'message' : undefined);
      if (type === 'function_call') {
        const { call_id, name, arguments: args } = item;
        if (typeof call_id !== 'string') throw fail(`${at}.call_id`, call_id, 'a string');
        if (typeof name !== 'string') throw fail(`${at}.name`, name, 'a string');
        if (typeof args !== 'string') throw fail(`${at}.arguments`, args, 'a string (JSON text)');
        if (assistant === null) prompt.push((assistant = { role: 'assistant', content: '' }));
        (assistant.tool_calls ??= []).push({ id: call_id, type: 'function', function: { name, arguments: args } });
        return;
      }
      assistant = null;
      if (type === 'function_call_output') {
        if (typeof item.call_id !== 'string') throw fail(`${at}.call_id`, item.call_id, 'a string');
        prompt.push({ role: 'tool', content: textOf(item.output, `${at}.output`, fail), tool_call_id: item.call_id });
        return;
      }
      if (type !== 'message')
        throw fail(`${at}.type`, item.type, '"message", "function_call" or "function_call_output"');
      const role = item.role;
      if (role !== 'user' && role !== 'system' && role !== 'developer' && role !== 'assistant')
        throw fail(`${at}.role`, role, 'one of user, system, developer, assistant');
      const message: ChatMessage = {
        role: role === 'developer' ? 'system' : role,
        content: item.content === null && role === 'assistant' ? '' : textOf(item.content, `${at}.content`, fail),
      };
      prompt.push(message);
      if (role === 'assistant') assistant = message;
    });
  } else throw fail('responses_create_params.input', input, 'a string or an array of input items');
  const instructions = create.instructions;
  if (instructions !== undefined && instructions !== null) {
    if (typeof instructions !== 'string') throw fail('responses_create_params.instructions', instructions, 'a string');
    if (instructions !== '') {
      const leading = [instructions];
      while (prompt.length > 0 && prompt[0].role === 'system') leading.push(prompt.shift()!.content);
      prompt.unshift({ role: 'system', content: leading.join('\n\n') });
    }
  }
  const tools: ToolSchema[] = [];
  const listed = create.tools ?? [];
  if (!Array.isArray(listed)) throw fail('responses_create_params.tools', listed, 'an array of function tools');
  listed.forEach((tool: unknown, i) => {
    const at = `responses_create_params.tools[${i}]`;
    if (!isObject(tool) || tool.type !== 'function')
      throw fail(
        at,
        tool,
        'a function tool {"type": "function", "name", "parameters", …} (the engine runs no hosted tools)',
      );
    const { name, description, parameters } = tool;
    if (typeof name !== 'string' || !/^[A-Za-z0-9_.-]+$/.test(name))
      throw fail(`${at}.name`, name, 'a tool name (letters, digits, "_", ".", "-"): the route /<name> on the server');
    if (RESERVED_TOOL_NAMES.has(name)) throw fail(`${at}.name`, name, "not one of the server's own routes");
    if (description !== undefined && description !== null && typeof description !== 'string')
      throw fail(`${at}.description`, description, 'a string');
    if (parameters !== undefined && parameters !== null && !isObject(parameters))
      throw fail(`${at}.parameters`, parameters, 'a JSON schema object');
    tools.push({
      type: 'function',
      function: {
        name,
        ...(typeof description === 'string' ? { description } : {}),
        ...(isObject(parameters) ? { parameters } : {}),
      },
    });
  });
  return { params, create, prompt, tools };
}

/** A content's text: a string, or its text parts joined (input_text, output_text). */
function textOf(
  content: unknown,
  field: string,
  fail: (field: string, value: unknown, expected: string) => Error,
): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) throw fail(field, content, 'a string or an array of text parts');
  return content
    .map((part: unknown, i) => {
      const p = part as { type?: unknown; text?: unknown } | null;
      if (!isObject(p) || (p.type !== 'input_text' && p.type !== 'output_text') || typeof p.text !== 'string')
        throw fail(
          `${field}[${i}]`,
          part,
          'a text part {"type": "input_text", "text": string} (the engine sends text only)',
        );
      return p.text;
    })
    .join('');
}

/**
 * The session cookies of one episode: name → value from every Set-Cookie, sent back as `Cookie`. A
 * cookie the server expires (Max-Age ≤ 0, or Expires past) is dropped, as a browser would.
 */
export class SessionCookies {
  readonly #values = new Map<string, string>();

  names(): string[] {
    return [...this.#values.keys()];
  }

  get(name: string): string | undefined {
    return this.#values.get(name);
  }

  header(): string | null {
    if (this.#values.size === 0) return null;
    return [...this.#values].map(([k, v]) => `${k}=${v}`).join('; ');
  }

  update(setCookie: string | string[] | undefined): void {
    for (const line of setCookie === undefined ? [] : Array.isArray(setCookie) ? setCookie : [setCookie]) {
      const [pair, ...attributes] = line.split(';');
      const eq = pair.indexOf('=');
      if (eq <= 0) continue;
      const name = pair.slice(0, eq).trim();
      const value = pair.slice(eq + 1).trim();
      const expired = attributes.some((a) => {
        const [key, v = ''] = a.split('=').map((s) => s.trim());
        if (key.toLowerCase() === 'max-age') return Number(v) <= 0;
        if (key.toLowerCase() === 'expires') return Date.parse(v) <= Date.now();
        return false;
      });
      if (expired) this.#values.delete(name);
      else this.#values.set(name, value);
    }
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
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

function badReply(label: string, field: string, value: unknown, expected: string): EnvError {
  return new EnvError('ERR_ENV_BAD_REPLY', `${label}: ${field} must be ${expected} (got ${preview(value)})`);
}

function checkOptions(options: HttpEnvOptions): void {
  const problems: string[] = [];
  if (!Array.isArray(options.urls) || options.urls.length === 0)
    problems.push(`urls: must list at least one NeMo Gym resources server URL (got ${preview(options.urls)})`);
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
  if (typeof options.name !== 'string' || !/^[^\s;=,]+$/.test(options.name))
    problems.push(
      `name: must be the resources server's name in its NeMo Gym config (its session cookie is "<class>___<name>") (got ${preview(options.name)})`,
    );
  for (const field of ['timeoutMs', 'maxResponseBytes'] as const) {
    const v = options[field];
    if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0)
      problems.push(`${field}: must be a positive number (got ${preview(v)})`);
  }
  if (!Number.isInteger(options.retries) || options.retries < 0)
    problems.push(`retries: must be an integer >= 0 (got ${preview(options.retries)})`);
  if (
    typeof options.retryBackoffMs !== 'number' ||
    !Number.isFinite(options.retryBackoffMs) ||
    options.retryBackoffMs < 0
  )
    problems.push(`retryBackoffMs: must be a number >= 0 (got ${preview(options.retryBackoffMs)})`);
  if (options.connections !== undefined && (!Number.isInteger(options.connections) || options.connections < 1))
    problems.push(`connections: must be a positive integer (got ${preview(options.connections)})`);
  if (options.protocol !== 'nemo-gym')
    problems.push(`protocol: must be "nemo-gym" for this client (got ${preview(options.protocol)})`);
  problems.push(
    ...protocolConflicts('nemo-gym', { dedupeSteps: options.dedupeSteps, params: options.params }).map((c) =>
      formatConflict(c),
    ),
  );
  if (problems.length > 0) throw new ConfigError(problems.map((p) => `nemo-gym env: ${p}`));
}

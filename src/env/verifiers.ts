/**
 * verifiers environments over env-serve v1 (`env.protocol: "verifiers"`, `env.http.urls` of the form
 * `tcp://host:port`): the environment runs the whole episode and calls the model itself, at a base
 * URL the request gives it. The engine hands it the token-trace gateway's session URL, so every call
 * of the episode is recorded token for token, and runs it as a black-box agent
 * (worker/blackbox-loop.ts): the gateway's main calls become the turns, the session the stitched
 * sample, and the episode's reward the rollout's.
 *
 * Read from PrimeIntellect-ai/verifiers at a60a606ecc4d309247edf9ff92c3eabca362781f:
 * - transport (verifiers/v1/serve/server.py, client.py): the server is a ROUTER; the client a DEALER
 *   sending [request_id, method, msgpack payload] and receiving [request_id, msgpack reply];
 *   request_id is uuid4 hex (client.py:80); methods `run`, `cancel`, `health` (types.py:10-57);
 *   a health payload is an empty map (the server unpacks every payload, server.py:110);
 * - `run` {task_data, client: {type: "eval", base_url, api_key_var, headers}, model, sampling}
 *   (types.py:42-50; configs/client.py:29-90): the environment posts to base_url + /chat/completions
 *   with `{...body, ...sampling, model}` (dialects/chat.py:547-556); the API key is never sent, the
 *   server reads the variable `api_key_var` names (here one no server sets: "EMPTY");
 * - reply {success, error, episode} (types.py:53-57; server.py:105-148). A request that fails is
 *   `success: false` with "<ExceptionType>: message" (server.py:134-138); an aborted run replies
 *   "Cancelled: rollout aborted" (server.py:130-133); an episode whose hooks failed is data:
 *   `ok: false` with `errors` (verifiers/v1/env.py:242-305);
 * - a trace's reward is Σ score × weight over its non-null `rewards` (trace.py:135-141, 412-414; a
 *   property, not on the wire): the rollout's is the sum over the episode's traces; truncated as
 *   Trace.is_truncated says (trace.py:493-504): a framework limit as stop_condition, or a last call
 *   cut by length;
 * - `cancel` {request_id} with a request id of its own (client.py:129-138) when the caller gives up.
 *
 * Failures and their codes (domain/failure.ts gives the kinds):
 * - `success: false` with "Cancelled: …" → ERR_ENV_CANCELLED (ABORTED: played again);
 * - `success: false` with "ValidationError: …" → ERR_ENV_REFUSED: the server refused the task_data
 *   (the dataset line does not fit its taskset): the environment's;
 * - any other `success: false` → ERR_ENV_INFRA: the server failed to run the episode;
 * - `ok: false` → ERR_ENV_EPISODE with the episode's errors: the environment's own outcome;
 * - the connection lost or refused → ERR_ENV_INFRA; no reply within env.timeoutMs → ERR_ENV_TIMEOUT
 *   (and a `cancel` is sent, which verifiers' own client does not do on a timeout);
 * - a reply that is not msgpack, not the reply's shape, or a ZMTP violation → ERR_ENV_BAD_REPLY.
 *
 * One DEALER connection per server per worker thread, opened on first use, carries every request;
 * when it ends, its pending requests fail and the next request opens a new one.
 */
import { randomUUID } from 'node:crypto';
import { Packr } from 'msgpackr';
import { ConfigError, preview } from '../errors.ts';
import { EnvError } from './errors.ts';
import type { HttpEnvOptions } from './http-env.ts';
import type { Environment } from './types.ts';
import { connectDealer, parseTcpUrl, ZmtpError, type ZmtpPeer } from './zmtp.ts';

/** Python's msgpack.unpackb reads maps and str/bin as this packs them (no msgpackr records). */
const packr = new Packr({ useRecords: false, mapsAsObjects: true });

/** The variable the server reads its API key from: one no server sets, so it sends "EMPTY" to the gateway. */
export const VERIFIERS_API_KEY_VAR = 'ROLLOUT_ENGINE_GATEWAY_API_KEY';

/** Trace.is_truncated's stop conditions (trace.py:495-502). */
const TRUNCATING_STOPS = new Set([
  'max_turns',
  'max_input_tokens',
  'max_output_tokens',
  'max_total_tokens',
  'context_length',
]);

/** What an episode is run with besides its task. */
export interface VerifiersRunSettings {
  model: string;
  /** SamplingConfig: temperature, top_p, max_tokens, and provider keys passed through (types.py:238-247). */
  sampling: Record<string, number>;
  /** Bound on one episode's reply (the task's env.timeoutMs). */
  timeoutMs: number;
}

/** One episode's input, as the black-box loop gives it (worker/blackbox-loop.ts BlackBoxInput). */
export interface VerifiersEpisodeInput {
  baseURL: string;
  /** The drawn dataset line: sent as task_data. */
  params: Record<string, unknown>;
  signal: AbortSignal;
}

export interface VerifiersEpisodeResult {
  reward: number;
  truncated: boolean;
  info: Record<string, unknown>;
}

/** The task's sampling as verifiers' SamplingConfig: its own keys, then OpenAI's names passed through. */
export function verifiersSampling(task: {
  temperature: number;
  maxTokens: number;
  sampling?: Partial<
    Record<'topP' | 'topK' | 'minP' | 'repetitionPenalty' | 'presencePenalty' | 'frequencyPenalty', number>
  >;
}): Record<string, number> {
  const out: Record<string, number> = { temperature: task.temperature, max_tokens: task.maxTokens };
  const names = {
    topP: 'top_p',
    topK: 'top_k',
    minP: 'min_p',
    repetitionPenalty: 'repetition_penalty',
    presencePenalty: 'presence_penalty',
    frequencyPenalty: 'frequency_penalty',
  } as const;
  for (const [key, name] of Object.entries(names)) {
    const value = task.sampling?.[key as keyof typeof names];
    if (value !== undefined) out[name] = value;
  }
  return out;
}

export interface VerifiersEnvironments {
  /** Never called: a verifiers server runs whole episodes (see `run`). */
  create(): Environment;
  /** A health request to every server, answered within env.http.timeoutMs. */
  prewarm(): Promise<void>;
  /** Runs one episode on the least busy server. */
  run(input: VerifiersEpisodeInput, settings: VerifiersRunSettings): Promise<VerifiersEpisodeResult>;
  /** Cancels what is pending (a `cancel` each), fails it ERR_ENV_CLOSED, and closes the connections. */
  close(): Promise<void>;
}

interface Pending {
  resolve(reply: unknown): void;
  reject(err: Error): void;
  method: string;
}

interface Server {
  url: string;
  peer: Promise<ZmtpPeer> | null;
  pending: Map<string, Pending>;
}

export function createVerifiersEnvironments(options: HttpEnvOptions): VerifiersEnvironments {
  return new VerifiersClient(options);
}

class VerifiersClient implements VerifiersEnvironments {
  readonly #options: HttpEnvOptions;
  readonly #servers: Server[];
  #closed = false;

  constructor(options: HttpEnvOptions) {
    const problems = options.urls.flatMap((url, i) =>
      parseTcpUrl(url) === null ? [`urls[${i}]: must be tcp://host:port (got ${preview(url)})`] : [],
    );
    if (options.urls.length === 0) problems.push('urls: must list at least one verifiers env server');
    if (problems.length > 0) throw new ConfigError(problems.map((p) => `verifiers env: ${p}`));
    this.#options = options;
    this.#servers = options.urls.map((url) => ({ url, peer: null, pending: new Map() }));
  }

  create(): Environment {
    throw new EnvError(
      'ERR_ENV_HTTP',
      `verifiers env ${JSON.stringify(this.#options.name)}: a verifiers server runs whole episodes; it has no reset and step`,
    );
  }

  async prewarm(): Promise<void> {
    await Promise.all(
      this.#servers.map(async (server) => {
        const reply = await this.#request(server, 'health', {}, this.#options.timeoutMs);
        const { success, error } = checkBase(reply, `${server.url} health`);
        if (!success)
          throw new EnvError('ERR_ENV_INFRA', `verifiers env server ${server.url} is not healthy: ${error}`);
      }),
    );
  }

  async run(input: VerifiersEpisodeInput, settings: VerifiersRunSettings): Promise<VerifiersEpisodeResult> {
    const server = this.#pick();
    const label = `verifiers env server ${server.url} run`;
    const reply = await this.#request(
      server,
      'run',
      {
        task_data: input.params,
        client: { type: 'eval', base_url: input.baseURL, api_key_var: VERIFIERS_API_KEY_VAR, headers: {} },
        model: settings.model,
        sampling: settings.sampling,
      },
      settings.timeoutMs,
      input.signal,
    );
    const { success, error } = checkBase(reply, label);
    if (!success) {
      if (error.startsWith('Cancelled:')) throw new EnvError('ERR_ENV_CANCELLED', `${label}: ${error}`);
      if (error.startsWith('ValidationError:'))
        throw new EnvError('ERR_ENV_REFUSED', `${label} refused the task_data ${preview(input.params)}: ${error}`);
      throw new EnvError('ERR_ENV_INFRA', `${label} failed: ${error}`);
    }
    return episodeResult((reply as { episode?: unknown }).episode, label);
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const server of this.#servers) {
      const peer = server.peer === null ? null : await server.peer.catch(() => null);
      for (const [id, pending] of server.pending) {
        if (pending.method === 'run') peer?.send(cancelMessage(id));
        pending.reject(new EnvError('ERR_ENV_CLOSED', `verifiers env server ${server.url}: the client was closed`));
      }
      server.pending.clear();
      peer?.close();
      server.peer = null;
    }
  }

  #pick(): Server {
    let best = this.#servers[0];
    for (const s of this.#servers) if (s.pending.size < best.pending.size) best = s;
    return best;
  }

  /** The connection to `server`, opened (and its handshake done) on first use; a failed one is not kept. */
  #peer(server: Server): Promise<ZmtpPeer> {
    if (server.peer === null) {
      const opening = connectDealer(server.url, {
        timeoutMs: this.#options.timeoutMs,
        maxFrameBytes: this.#options.maxResponseBytes,
        onMessage: (parts) => this.#reply(server, parts),
      });
      server.peer = opening;
      opening.then(
        (peer) =>
          void peer.closed.then((why) => {
            if (server.peer === opening) server.peer = null;
            // Everything sent on it is lost with it.
            const err = connectionError(server.url, why);
            for (const pending of server.pending.values()) pending.reject(err);
            server.pending.clear();
          }),
        () => {
          if (server.peer === opening) server.peer = null;
        },
      );
    }
    return server.peer;
  }

  #reply(server: Server, parts: Buffer[]): void {
    const id = parts[0]?.toString('latin1') ?? '';
    const pending = server.pending.get(id);
    // Replies to requests given up on (cancelled, timed out) are dropped, as verifiers' client does.
    if (pending === undefined) return;
    server.pending.delete(id);
    const label = `verifiers env server ${server.url} ${pending.method}`;
    if (parts.length !== 2) {
      pending.reject(
        new EnvError(
          'ERR_ENV_BAD_REPLY',
          `${label}: a reply must be 2 frames [request_id, msgpack], got ${parts.length}`,
        ),
      );
      return;
    }
    try {
      pending.resolve(packr.unpack(parts[1]));
    } catch (err) {
      pending.reject(
        new EnvError('ERR_ENV_BAD_REPLY', `${label}: the reply is not msgpack (${(err as Error).message})`),
      );
    }
  }

  async #request(
    server: Server,
    method: 'run' | 'health',
    payload: unknown,
    timeoutMs: number,
    signal?: AbortSignal,
  ): Promise<unknown> {
    if (this.#closed) throw new EnvError('ERR_ENV_CLOSED', `verifiers env server ${server.url}: the client was closed`);
    if (signal?.aborted)
      throw new EnvError(
        'ERR_ENV_CANCELLED',
        `verifiers env server ${server.url} ${method}: cancelled before it was sent`,
      );
    let peer: ZmtpPeer;
    try {
      peer = await this.#peer(server);
    } catch (err) {
      throw connectionError(server.url, err);
    }
    const id = randomUUID().replaceAll('-', '');
    const label = `verifiers env server ${server.url} ${method}`;
    return new Promise<unknown>((resolve, reject) => {
      let timer: NodeJS.Timeout | undefined;
      const settle = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      // The server keeps running an episode it is not told to stop: every give-up sends a cancel.
      const giveUp = (err: EnvError) => {
        if (!server.pending.delete(id)) return;
        settle();
        if (method === 'run') peer.send(cancelMessage(id));
        reject(err);
      };
      const onAbort = () => giveUp(new EnvError('ERR_ENV_CANCELLED', `${label}: cancelled (a pause or a shutdown)`));
      server.pending.set(id, {
        method,
        resolve: (reply) => {
          settle();
          resolve(reply);
        },
        reject: (err) => {
          settle();
          reject(err);
        },
      });
      timer = setTimeout(
        () => giveUp(new EnvError('ERR_ENV_TIMEOUT', `${label}: no reply within ${timeoutMs} ms`)),
        timeoutMs,
      );
      signal?.addEventListener('abort', onAbort, { once: true });
      if (!peer.send([Buffer.from(id, 'latin1'), Buffer.from(method, 'ascii'), packr.pack(payload)])) {
        server.pending.delete(id);
        settle();
        reject(connectionError(server.url, new Error('the connection is closed')));
      }
    });
  }
}

function cancelMessage(runId: string): Buffer[] {
  return [
    Buffer.from(randomUUID().replaceAll('-', ''), 'latin1'),
    Buffer.from('cancel', 'ascii'),
    packr.pack({ request_id: runId }),
  ];
}

/** A ZMTP violation is the server's reply being unreadable (parse); anything else, the connection lost. */
function connectionError(url: string, err: unknown): EnvError {
  if (err instanceof ZmtpError && (err.kind === 'protocol' || err.kind === 'too-large'))
    return new EnvError('ERR_ENV_BAD_REPLY', `verifiers env server ${url}: ${err.message}`, { cause: err });
  const what = err instanceof Error ? err.message : String(err);
  return new EnvError('ERR_ENV_INFRA', `verifiers env server ${url}: connection lost or refused (${what})`, {
    cause: err,
  });
}

function bad(label: string, field: string, value: unknown, expected: string): EnvError {
  return new EnvError('ERR_ENV_BAD_REPLY', `${label}: ${field} must be ${expected} (got ${preview(value)})`);
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value) && !Buffer.isBuffer(value);
}

/** BaseResponse: {success: bool, error: str | None} (types.py:16-18). */
function checkBase(reply: unknown, label: string): { success: boolean; error: string } {
  if (!isObject(reply)) throw bad(label, 'reply', reply, 'a map {success, error, …}');
  const { success, error } = reply;
  if (typeof success !== 'boolean') throw bad(label, 'success', success, 'a boolean');
  if (error !== null && error !== undefined && typeof error !== 'string')
    throw bad(label, 'error', error, 'a string or null');
  if (!success && typeof error !== 'string') throw bad(label, 'error', error, 'a string when success is false');
  return { success, error: error ?? '' };
}

/** The episode, field by field: its reward, truncation and errors (module comment). */
function episodeResult(episode: unknown, label: string): VerifiersEpisodeResult {
  if (!isObject(episode)) throw bad(label, 'episode', episode, 'a map');
  const { ok, errors, traces, id } = episode;
  if (typeof ok !== 'boolean') throw bad(label, 'episode.ok', ok, 'a boolean');
  if (!Array.isArray(errors)) throw bad(label, 'episode.errors', errors, 'a list');
  if (!Array.isArray(traces)) throw bad(label, 'episode.traces', traces, 'a list');
  let reward = 0;
  let truncated = false;
  const stops: unknown[] = [];
  const traceErrors: unknown[] = [];
  traces.forEach((trace, t) => {
    const at = `episode.traces[${t}]`;
    if (!isObject(trace)) throw bad(label, at, trace, 'a map');
    const { rewards, stop_condition: stop, calls } = trace;
    if (!isObject(rewards)) throw bad(label, `${at}.rewards`, rewards, 'a map of name → {score, weight} or null');
    for (const [name, r] of Object.entries(rewards)) {
      if (r === null) continue;
      const { score, weight } = (isObject(r) ? r : {}) as { score?: unknown; weight?: unknown };
      if (typeof score !== 'number' || !Number.isFinite(score))
        throw bad(label, `${at}.rewards.${name}.score`, score, 'a finite number');
      if (weight !== undefined && (typeof weight !== 'number' || !Number.isFinite(weight)))
        throw bad(label, `${at}.rewards.${name}.weight`, weight, 'a finite number');
      reward += score * ((weight as number | undefined) ?? 1);
    }
    if (stop !== null && stop !== undefined && typeof stop !== 'string')
      throw bad(label, `${at}.stop_condition`, stop, 'a string or null');
    if (calls !== undefined && !Array.isArray(calls)) throw bad(label, `${at}.calls`, calls, 'a list');
    const last = (calls ?? []).filter((c) => isObject(c) && (c.error === null || c.error === undefined)).at(-1) as
      | { finish_reason?: unknown }
      | undefined;
    if ((typeof stop === 'string' && TRUNCATING_STOPS.has(stop)) || last?.finish_reason === 'length') truncated = true;
    stops.push(stop ?? null);
    if (Array.isArray(trace.errors)) traceErrors.push(...trace.errors);
  });
  if (!ok) {
    const all = [...errors, ...traceErrors].map(describeVerifiersError);
    throw new EnvError(
      'ERR_ENV_EPISODE',
      `${label}: the episode failed (ok: false): ${all.length === 0 ? 'no error given' : all.slice(0, 3).join('; ')}`,
    );
  }
  if (traces.length === 0) throw new EnvError('ERR_ENV_EPISODE', `${label}: the episode has no trace`);
  if (!Number.isFinite(reward)) throw bad(label, 'the episode’s reward', reward, 'finite');
  return { reward, truncated, info: { episode_id: typeof id === 'string' ? id : null, stop_conditions: stops } };
}

/** Error {type, message, …} (trace.py:84-89) as one line. */
function describeVerifiersError(err: unknown): string {
  if (!isObject(err)) return preview(err);
  const type = typeof err.type === 'string' ? err.type : 'Error';
  const message = typeof err.message === 'string' ? err.message : '';
  return `${type}: ${message}`.slice(0, 300);
}

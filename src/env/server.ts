/**
 * An env server: in-process environment modules (EnvironmentFactory) served over the env-server
 * protocol (docs/ARCHITECTURE.md, "Environments over HTTP") with node:http, so environments can run on other
 * machines — and so the HTTP transport (env/http-env.ts) can be tested against the real protocol.
 *
 *   POST   /{env}/{id}/reset            {"env_param": {...}, "seed": n}  → {observation, info}   (creates the id)
 *   GET    /{env}/{id}/get_task_prompt                                   → [chat message, …]
 *   POST   /{env}/{id}/step             {"action": "...", "step": n?}    → {observation, reward, terminated, truncated, info}
 *   GET    /{env}/{id}/health | is_done | describe | render
 *   DELETE /{env}/{id}                                                   → 200, even for an unknown id
 *   GET    /envs                                                         → {"envs": [name, …]}
 *
 * Errors: unknown env or id → 404 `{"error": …}`; a bad request (bad JSON, reset without the
 * `env_param` key, a bad action) → 400; a body over the limit → 413; an error thrown inside the
 * environment → a bare 500 (text/plain message), as the protocol has it.
 *
 * Invariants: calls for one env id run one at a time in arrival order (a per-id promise chain), so an
 * environment never sees two calls at once; `health` and DELETE are not queued (a stuck environment
 * must still be observable and deletable: DELETE removes the id at once and closes the instance after
 * the calls queued before it). A step carrying a `step` index
 * equal to the last applied one is answered from the cache, never applied twice.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { ConfigError, preview } from '../protocol/errors.ts';
import type { Environment, EnvironmentFactory, EnvParams } from './types.ts';
import { listen, readRequestBody, type BodyErrors } from '../http-server.ts';

export interface ServedEnv {
  /** Path segment clients use: letters, digits, "_", "." and "-". */
  name: string;
  factory: EnvironmentFactory;
  /** Given to the factory for every instance (what a task's `env.params` is in-process). */
  params?: EnvParams;
}

/**
 * Fault injection, for tests and chaos runs. Rates are per request, drawn from `random`.
 * - failFirst: the next N requests (from start, or from the last setFaults that sets it) are answered 503;
 * - failRate: answered 500 before anything is applied;
 * - hangRate: never answered (the connection stays open until close());
 * - dropReplyRate: applied, then the connection is destroyed without a reply (the reply is lost: the
 *   client cannot know the call happened — the case step deduplication exists for).
 */
export interface EnvServerFaults {
  failFirst?: number;
  failRate?: number;
  hangRate?: number;
  dropReplyRate?: number;
}

export interface EnvServerOptions extends EnvServerFaults {
  envs: ServedEnv[];
  /** Default 0: any free port. */
  port?: number;
  host?: string;
  /** Request bodies above this are answered 413 (default 1 MiB). */
  maxBodyBytes?: number;
  /** Source of the fault dice (default Math.random). */
  random?: () => number;
  /** Instantiate each factory once at start so bad `params` fail there, not on every reset (default true). */
  checkParams?: boolean;
}

export interface EnvServerStats {
  /** Every request received, faulted ones included. */
  requests: number;
  /** Requests per route: reset, get_task_prompt, step, health, is_done, describe, render, delete, envs, other. */
  byRoute: Record<string, number>;
  /** Env ids with a live instance. */
  live: number;
  /** Steps applied to environments (a deduplicated repeat is not applied, so not counted). */
  stepsApplied: number;
  /** Steps answered from the cache because their index repeated the last applied one. */
  dedupeHits: number;
  /** Errors thrown by environments (answered 500). */
  envErrors: number;
  faults: { failed: number; hung: number; dropped: number };
}

export interface EnvServer {
  url: string;
  port: number;
  stats(): EnvServerStats;
  /** Changes the fault knobs of a running server (missing ones are left as they are). */
  setFaults(faults: EnvServerFaults): void;
  /** Stops listening, drops every connection (hung ones too) and closes every live instance. */
  close(): Promise<void>;
}

const DEFAULT_MAX_BODY_BYTES = 1024 * 1024;
/** What a served environment may be named: it is a path segment of every route. */
export const SERVED_ENV_NAME = /^[A-Za-z0-9_.-]+$/;
const INSTANCE_ROUTES = new Set(['reset', 'get_task_prompt', 'step', 'health', 'is_done', 'describe', 'render']);

/** One env id. `env` is null until its first reset succeeded. */
interface Instance {
  readonly served: ServedEnv;
  readonly id: string;
  env: Environment | null;
  /** Tail of the per-id chain: every queued call runs after it. */
  tail: Promise<void>;
  /** Steps applied since the last reset. */
  steps: number;
  /** The last applied step's index (the client's, or our count) and its serialized reply. */
  lastStep: { index: number; body: string } | null;
  done: boolean;
  lastObservation: unknown;
}

/** A reply decided by a route: status, JSON (or text for the bare 500), and whether the call touched an environment. */
interface Reply {
  status: number;
  json?: unknown;
  /** Already serialized JSON (the step cache). */
  raw?: string;
  text?: string;
}

class HttpFailure extends Error {
  readonly status: number;
  constructor(status: number, message: string) {
    super(message);
    this.status = status;
  }
}

export async function startEnvServer(options: EnvServerOptions): Promise<EnvServer> {
  const served = new Map<string, ServedEnv>();
  for (const env of options.envs) {
    if (!SERVED_ENV_NAME.test(env.name))
      throw new ConfigError([`envs: name must be letters, digits, "_", "." or "-" (got ${JSON.stringify(env.name)})`]);
    if (served.has(env.name)) throw new ConfigError([`envs: name ${JSON.stringify(env.name)} is served twice`]);
    if (typeof env.factory !== 'function')
      throw new ConfigError([`envs.${env.name}: factory must be a function (got ${typeof env.factory})`]);
    if (options.checkParams !== false) {
      try {
        const probe = await env.factory(env.params ?? {});
        await probe.close?.();
      } catch (err) {
        throw new ConfigError([
          `envs.${env.name}: the factory rejects its params ${JSON.stringify(env.params ?? {})}: ${(err as Error).message}`,
        ]);
      }
    }
    served.set(env.name, env);
  }
  if (served.size === 0) throw new ConfigError(['envs: serve at least one environment']);

  const maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const random = options.random ?? Math.random;
  const faults = { failFirst: 0, failRate: 0, hangRate: 0, dropReplyRate: 0 };
  const setFaults = (f: EnvServerFaults) => {
    for (const key of ['failFirst', 'failRate', 'hangRate', 'dropReplyRate'] as const) {
      const v = f[key];
      if (v === undefined) continue;
      const ok = key === 'failFirst' ? Number.isInteger(v) && v >= 0 : Number.isFinite(v) && v >= 0 && v <= 1;
      if (!ok)
        throw new RangeError(
          `env server fault ${key} must be ${key === 'failFirst' ? 'an integer >= 0' : 'a number in [0, 1]'} (got ${v})`,
        );
      faults[key] = v;
    }
  };
  setFaults(options);

  const instances = new Map<string, Instance>();
  const key = (env: string, id: string) => `${env}/${id}`;
  const stats: EnvServerStats = {
    requests: 0,
    byRoute: {},
    live: 0, // computed by stats()
    stepsApplied: 0,
    dedupeHits: 0,
    envErrors: 0,
    faults: { failed: 0, hung: 0, dropped: 0 },
  };
  const count = (route: string) => (stats.byRoute[route] = (stats.byRoute[route] ?? 0) + 1);

  /** Runs `fn` after every call queued before it on this id; the chain survives failures. */
  function serialize<T>(instance: Instance, fn: () => Promise<T>): Promise<T> {
    const run = instance.tail.then(fn);
    instance.tail = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  /** Calls into user code: anything it throws becomes the bare 500. */
  async function envCall<T>(what: string, fn: () => T | Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      stats.envErrors += 1;
      throw new HttpFailure(500, `environment error in ${what}: ${(err as Error)?.message ?? String(err)}`);
    }
  }

  function live(instance: Instance): Environment {
    if (instance.env === null || instances.get(key(instance.served.name, instance.id)) !== instance) {
      throw new HttpFailure(
        404,
        `unknown env id ${JSON.stringify(instance.id)} for ${instance.served.name} (reset it first)`,
      );
    }
    return instance.env;
  }

  async function closeQuietly(env: Environment | null): Promise<void> {
    try {
      await env?.close?.();
    } catch {
      // the instance is gone either way
    }
  }

  async function instanceRoute(
    req: IncomingMessage,
    servedEnv: ServedEnv,
    id: string,
    route: string,
    body: () => Promise<unknown>,
  ): Promise<Reply> {
    const k = key(servedEnv.name, id);
    let instance = instances.get(k);
    if (route === 'reset') {
      expectMethod(req, 'POST');
      const payload = await body();
      if (typeof payload !== 'object' || payload === null || Array.isArray(payload))
        throw new HttpFailure(
          400,
          `reset body must be a JSON object {"env_param": {...}, "seed": n} (got ${preview(payload)})`,
        );
      if (!('env_param' in payload))
        throw new HttpFailure(400, 'reset body needs the "env_param" key (the reset params; {} for none)');
      const { env_param: envParam, seed = 0 } = payload as { env_param: unknown; seed?: unknown };
      if (envParam !== null && (typeof envParam !== 'object' || Array.isArray(envParam)))
        throw new HttpFailure(400, `reset env_param must be an object or null (got ${preview(envParam)})`);
      if (seed !== null && (typeof seed !== 'number' || !Number.isFinite(seed)))
        throw new HttpFailure(400, `reset seed must be a number (got ${preview(seed)})`);
      if (instance === undefined) {
        instance = {
          served: servedEnv,
          id,
          env: null,
          tail: Promise.resolve(),
          steps: 0,
          lastStep: null,
          done: false,
          lastObservation: undefined,
        };
        instances.set(k, instance);
      }
      const target = instance;
      return serialize(target, async () => {
        // A reset is a new episode: a fresh instance from the factory, the old one closed first.
        const old = target.env;
        target.env = null;
        await closeQuietly(old);
        try {
          const env = await envCall('the factory', () => servedEnv.factory(servedEnv.params ?? {}));
          const result = await envCall('reset()', () =>
            env.reset({ seed: (seed as number | null) ?? 0, params: (envParam ?? {}) as EnvParams }),
          );
          target.env = env;
          target.steps = 0;
          target.lastStep = null;
          target.done = false;
          target.lastObservation = result?.observation;
          return { status: 200, json: { observation: result?.observation ?? null, info: result?.info ?? {} } };
        } finally {
          // A failed reset leaves nothing behind: the id is unknown again (unless a newer instance took the key).
          if (target.env === null && instances.get(k) === target) instances.delete(k);
        }
      });
    }
    if (instance === undefined)
      throw new HttpFailure(404, `unknown env id ${JSON.stringify(id)} for ${servedEnv.name} (reset it first)`);
    const target = instance;
    switch (route) {
      case 'health':
        expectMethod(req, 'GET');
        live(target);
        return { status: 200, json: { ok: true, env: servedEnv.name, id } };
      case 'get_task_prompt':
        expectMethod(req, 'GET');
        return serialize(target, async () => {
          const env = live(target);
          return { status: 200, json: await envCall('getTaskPrompt()', () => env.getTaskPrompt()) };
        });
      case 'step': {
        expectMethod(req, 'POST');
        const payload = await body();
        if (typeof payload !== 'object' || payload === null || Array.isArray(payload))
          throw new HttpFailure(
            400,
            `step body must be a JSON object {"action": "...", "step": n} (got ${preview(payload)})`,
          );
        const { action, step } = payload as { action?: unknown; step?: unknown };
        if (!isAction(action))
          throw new HttpFailure(
            400,
            `step action must be a string, or an object of agent id → string (got ${preview(action)})`,
          );
        if (
          step !== undefined &&
          step !== null &&
          (typeof step !== 'number' || !Number.isSafeInteger(step) || step < 1)
        ) {
          throw new HttpFailure(400, `step index must be a positive integer (got ${preview(step)})`);
        }
        return serialize(target, async () => {
          const env = live(target);
          if (typeof step === 'number') {
            // The same index again: the reply to the first one was lost; answer it again, do not re-apply.
            if (target.lastStep !== null && step === target.lastStep.index) {
              stats.dedupeHits += 1;
              return { status: 200, raw: target.lastStep.body };
            }
            if (step !== target.steps + 1) {
              throw new HttpFailure(
                409,
                `step index ${step} out of order for env id ${JSON.stringify(id)}: ${target.steps} step(s) applied since reset, so the next is ${target.steps + 1}`,
              );
            }
          }
          const result = await envCall('step()', () => env.step(action as string));
          target.steps += 1;
          stats.stepsApplied += 1;
          const raw = serializeReply(result, 'step()');
          target.lastStep = { index: typeof step === 'number' ? step : target.steps, body: raw };
          target.done = Boolean(result?.terminated || result?.truncated);
          target.lastObservation = result?.observation;
          return { status: 200, raw };
        });
      }
      case 'is_done':
        expectMethod(req, 'GET');
        return serialize(target, async () => {
          live(target);
          return { status: 200, json: { done: target.done } };
        });
      case 'describe':
        expectMethod(req, 'GET');
        return serialize(target, async () => {
          const env = live(target) as Environment & { describe?: () => unknown };
          const extra =
            typeof env.describe === 'function' ? await envCall('describe()', () => env.describe!()) : undefined;
          return {
            status: 200,
            json: {
              env: servedEnv.name,
              id,
              steps: target.steps,
              done: target.done,
              ...(extra === undefined ? {} : { description: extra }),
            },
          };
        });
      case 'render':
        expectMethod(req, 'GET');
        return serialize(target, async () => {
          const env = live(target) as Environment & { render?: () => unknown };
          const render =
            typeof env.render === 'function' ? await envCall('render()', () => env.render!()) : target.lastObservation;
          return { status: 200, json: { render: render ?? null } };
        });
      default:
        throw new HttpFailure(
          404,
          `unknown route ${JSON.stringify(route)} (expected one of ${[...INSTANCE_ROUTES].join(', ')})`,
        );
    }
  }

  function countLive(): number {
    let n = 0;
    for (const instance of instances.values()) if (instance.env !== null) n++;
    return n;
  }

  async function route(req: IncomingMessage): Promise<Reply> {
    let segments: string[];
    try {
      segments = new URL(req.url ?? '/', 'http://x').pathname.split('/').filter(Boolean).map(decodeURIComponent);
    } catch {
      throw new HttpFailure(400, `malformed path ${JSON.stringify(req.url)}`);
    }
    const body = () => readJson(req, maxBodyBytes);
    if (segments.length === 1 && (segments[0] === 'envs' || segments[0] === 'health')) {
      count(segments[0]);
      expectMethod(req, 'GET');
      // dedupes_steps: a repeated step index gets the reply already sent (so engines may retry steps).
      return {
        status: 200,
        json:
          segments[0] === 'envs'
            ? { envs: [...served.keys()], dedupes_steps: true }
            : { ok: true, envs: [...served.keys()] },
      };
    }
    const servedEnv = served.get(segments[0] ?? '');
    if (segments.length === 2 || segments.length === 3) {
      const routeName = segments.length === 2 ? 'delete' : segments[2];
      count(INSTANCE_ROUTES.has(routeName) || routeName === 'delete' ? routeName : 'other');
      if (servedEnv === undefined) {
        throw new HttpFailure(
          404,
          `unknown environment ${JSON.stringify(segments[0])} (serving: ${[...served.keys()].join(', ')})`,
        );
      }
      const id = segments[1];
      if (segments.length === 2) {
        expectMethod(req, 'DELETE');
        const k = key(servedEnv.name, id);
        const instance = instances.get(k);
        if (instance === undefined) return { status: 200, json: { deleted: false } };
        // Gone for every later call at once (404); closed once the calls queued before the delete have
        // run. Answered without waiting for that: a stuck environment must not make deletes time out.
        instances.delete(k);
        void serialize(instance, async () => {
          await closeQuietly(instance.env);
          instance.env = null;
        });
        return { status: 200, json: { deleted: true } };
      }
      return instanceRoute(req, servedEnv, id, routeName, body);
    }
    count('other');
    throw new HttpFailure(
      404,
      `no route for ${req.method} ${req.url} (env routes are /{env}/{id}/{reset|get_task_prompt|step|health|is_done|describe|render}, DELETE /{env}/{id}, GET /envs)`,
    );
  }

  const server = createServer((req, res) => {
    stats.requests += 1;
    // Faults are decided on arrival, before anything is read or applied (except dropReplyRate).
    if (faults.failFirst > 0) {
      faults.failFirst -= 1;
      stats.faults.failed += 1;
      return send(res, { status: 503, json: { error: 'injected failure (failFirst)' } });
    }
    if (faults.failRate > 0 && random() < faults.failRate) {
      stats.faults.failed += 1;
      return send(res, { status: 500, json: { error: 'injected failure (failRate)' } });
    }
    if (faults.hangRate > 0 && random() < faults.hangRate) {
      stats.faults.hung += 1;
      req.resume(); // read and drop the body; the reply never comes (close() drops the connection)
      return;
    }
    route(req).then(
      (reply) => {
        if (faults.dropReplyRate > 0 && random() < faults.dropReplyRate) {
          stats.faults.dropped += 1;
          req.socket.destroy();
          return;
        }
        send(res, reply);
      },
      (err: unknown) => {
        if (err instanceof HttpFailure) {
          // The protocol's "bare 500" for errors inside the environment; JSON {"error"} for the rest.
          send(
            res,
            err.status === 500
              ? { status: 500, text: err.message }
              : { status: err.status, json: { error: err.message } },
          );
        } else {
          send(res, { status: 500, text: `env server error: ${(err as Error)?.message ?? String(err)}` });
        }
      },
    );
  });

  await listen(server, options.host ?? '127.0.0.1', options.port ?? 0, 'env server');
  const address = server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  let closing: Promise<void> | null = null;

  return {
    url: `http://${host}:${address.port}`,
    port: address.port,
    stats: () => ({ ...stats, live: countLive(), byRoute: { ...stats.byRoute }, faults: { ...stats.faults } }),
    setFaults,
    close() {
      closing ??= (async () => {
        const closed = new Promise<void>((r) => server.close(() => r()));
        server.closeAllConnections();
        await closed;
        const all = [...instances.values()];
        instances.clear();
        await Promise.all(all.map((instance) => closeQuietly(instance.env)));
      })();
      return closing;
    },
  };
}

function expectMethod(req: IncomingMessage, method: string): void {
  if (req.method !== method) throw new HttpFailure(405, `${req.method} not allowed on ${req.url} (use ${method})`);
}

function isAction(value: unknown): boolean {
  if (typeof value === 'string') return true;
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
  return Object.values(value).every((v) => typeof v === 'string');
}

function serializeReply(value: unknown, what: string): string {
  try {
    const text = JSON.stringify(value ?? null);
    if (text === undefined) throw new Error('nothing to serialize');
    return text;
  } catch (err) {
    throw new HttpFailure(
      500,
      `environment error in ${what}: its result is not JSON-serializable (${(err as Error).message})`,
    );
  }
}

function send(res: ServerResponse, reply: Reply): void {
  if (res.headersSent || res.destroyed) return;
  let payload: string;
  let type = 'application/json';
  if (reply.text !== undefined) {
    payload = reply.text;
    type = 'text/plain; charset=utf-8';
  } else if (reply.raw !== undefined) {
    payload = reply.raw;
  } else {
    try {
      payload = JSON.stringify(reply.json ?? null);
    } catch (err) {
      payload = `environment error: its result is not JSON-serializable (${(err as Error).message})`;
      type = 'text/plain; charset=utf-8';
      reply = { status: 500 };
    }
  }
  res.writeHead(reply.status, { 'content-type': type, 'content-length': Buffer.byteLength(payload) });
  res.end(payload);
}

const bodyErrors: BodyErrors = {
  tooLarge: (message) => new HttpFailure(413, `${message} (maxBodyBytes, --max-body-bytes)`),
  aborted: (message) => new HttpFailure(400, message),
};

/** The request body as JSON; 413 past `limit` bytes (checked on the header and while reading), 400 when not JSON. */
async function readJson(req: IncomingMessage, limit: number): Promise<unknown> {
  const text = (await readRequestBody(req, limit, bodyErrors)).toString('utf8');
  try {
    return JSON.parse(text);
  } catch {
    throw new HttpFailure(400, `request body is not JSON (got ${preview(text)})`);
  }
}

/**
 * The control API a trainer drives the engine with (`rollout serve`, `engine.listen()`): node:http,
 * loopback by default, optional bearer token, body size limit, JSON or msgpack both ways.
 *
 *   GET  /health                      liveness (no token needed)
 *   GET  /status                      model step, train step, in flight, counts per status, paused
 *   POST /batch       {trainStep?, compact?}  the batch for a train step (status NORMAL | EXPIRED_BATCH |
 *                                     UPDATE_WEIGHT_AND_ABORT); compact: turns name the later turn whose
 *                                     conversation they begin (formats/compact.ts)
 *   POST /pause                       pause for a weight update; answers once every group is back
 *   POST /resume      {modelStep, weightVersion?}  the new weights are loaded (weightVersion: the
 *                                     servers' name for them, e.g. SGLang's --weight-version); only
 *                                     after a pause (409 otherwise), a repeat of the last one excepted
 *   POST /checkpoint  {path}          write a checkpoint file: a .ckpt path inside the run dir
 *   POST /audit       {rolloutId? | groupId?}  re-score on the inference server the rollout, the group,
 *                                     or (neither) the last batch handed out, and answer each rollout's
 *                                     |Δ logprob| by segment (coordinator/audit.ts, docs/AUDIT.md)
 *   GET  /endpoints                   the inference endpoints now (`llm.url`)
 *   POST /endpoints   {add?, remove?}  servers join (probed first: 502 if one does not answer) or leave
 *                                     the fleet; a joined one takes new sessions at once (docs/FLEET.md)
 *   GET  /metrics                     Prometheus text
 *
 * Errors are `{"error": {"code", "message"}}` with a stable code.
 *
 * Every request passes, in order: the Host allow-list and Origin check (./access.ts: web pages may not
 * drive it), the token, the rate limit, the route, the body's content type (JSON or msgpack only).
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { AuditTarget, EngineStats } from '../coordinator/engine-core.ts';
import type { RolloutAudit } from '../coordinator/audit-segments.ts';
import type { PauseReport } from '../coordinator/producer.ts';
import type { Batch } from '../domain/batch.ts';
import type { EngineMetrics } from './metrics.ts';
import { compactGroup } from '../formats/compact.ts';
import { HttpError, readBody, send, sendError, tokenMatches } from './http.ts';
import type { ErrorCode } from '../error-codes.ts';
import { listen } from '../http-server.ts';
import { checkpointPathIn, HostAllowList } from './access.ts';
import { preview } from '../errors.ts';
import { announcedVersionProblem, MAX_WEIGHT_VERSION_LENGTH } from '../llm/reply.ts';

const MAX_STEP = 0x7fffffff;

/** The engine as the control API sees it. */
export interface ControlTarget {
  getBatch(trainStep?: number): Promise<Batch>;
  pauseForWeightUpdate(): Promise<PauseReport>;
  resume(options: { modelStep: number; weightVersion?: string | null; pausedOnly?: boolean }): Promise<void>;
  checkpoint(path: string): Promise<{ path: string; bytes: number }>;
  stats(): Promise<EngineStats>;
  readonly endpoints: string[];
  updateEndpoints(change: { add?: readonly string[]; remove?: readonly string[] }): Promise<string[]>;
  /** The consistency audit on demand (`POST /audit`); absent: the route answers 404. */
  audit?(target: AuditTarget): Promise<RolloutAudit[]>;
  readonly llmUrl: string | null;
}

export interface ControlServerOptions {
  /** Address to bind; loopback unless you mean to expose it. */
  host?: string;
  port?: number;
  /** Require `Authorization: Bearer <token>` on every route but /health. */
  token?: string | null;
  maxBodyBytes?: number;
  /** Requests per second per client address (token bucket, bursts of twice that); over it: 429. */
  rateLimitPerSecond?: number;
  /**
   * Host names (or addresses) requests may name in their Host header besides the loopback ones and
   * `host` (with `host` 0.0.0.0 / ::, the machine's own addresses and name): a DNS name clients reach
   * it by, or a proxy's. An Origin naming one is accepted too.
   */
  allowHosts?: readonly string[];
  /**
   * The directory `POST /checkpoint {"path"}` writes in: the path is relative to it, a `.ckpt` file,
   * inside it; null refuses every path. `engine.listen()` defaults it to the config's `runDir`.
   */
  checkpointDir?: string | null;
}

export interface ControlServer {
  url: string;
  port: number;
  close(): Promise<void>;
}

type Handler = (body: Record<string, unknown>) => Promise<unknown>;

/** A route: the body fields it reads (any other is refused) and what it does. */
interface Route {
  fields: readonly string[];
  run: Handler;
}

export async function startControlServer(
  engine: ControlTarget,
  metrics: EngineMetrics,
  options: ControlServerOptions = {},
): Promise<ControlServer> {
  const host = options.host ?? '127.0.0.1';
  const token = options.token ?? null;
  const maxBodyBytes = options.maxBodyBytes ?? 1024 * 1024;
  const limiter = new RateLimiter(options.rateLimitPerSecond ?? 200);
  const access = new HostAllowList(host, options.allowHosts ?? []);
  const checkpointDir = options.checkpointDir ?? null;
  const routes: Record<string, Route> = {
    'GET /health': { fields: [], run: async () => ({ status: 'ok' }) },
    'GET /status': {
      fields: [],
      run: async () => {
        const { workers: _workers, ...status } = await engine.stats();
        return { ...status, llmUrl: engine.llmUrl };
      },
    },
    'POST /batch': {
      fields: ['trainStep', 'compact'],
      run: async (body) => {
        const compact = optionalBool(body, 'compact') ?? false; // checked before the batch is taken
        const batch = await engine.getBatch(optionalInt(body, 'trainStep', 1));
        return compact && batch.status === 'NORMAL' ? { ...batch, groups: batch.groups.map(compactGroup) } : batch;
      },
    },
    'POST /pause': { fields: [], run: async () => engine.pauseForWeightUpdate() },
    'POST /resume': {
      fields: ['modelStep', 'weightVersion'],
      run: async (body) => {
        const modelStep = requiredInt(body, 'modelStep', 0);
        const weightVersion = optionalVersion(body, 'weightVersion');
        // Only after a pause: a trainer that skipped it would move the model step under groups in flight.
        await engine.resume({ modelStep, weightVersion, pausedOnly: true });
        return { resumed: true, modelStep, ...(weightVersion !== null ? { weightVersion } : {}) };
      },
    },
    'POST /checkpoint': {
      fields: ['path'],
      run: async (body) => engine.checkpoint(checkpointPathIn(checkpointDir, body.path)),
    },
    'GET /endpoints': { fields: [], run: async () => ({ endpoints: engine.endpoints }) },
    'POST /endpoints': {
      fields: ['add', 'remove'],
      run: async (body) => {
        const add = optionalUrls(body, 'add');
        const remove = optionalUrls(body, 'remove');
        if (add.length === 0 && remove.length === 0)
          throw new HttpError(400, 'ERR_BAD_BODY', 'name endpoints to add or remove: {"add": [url], "remove": [url]}');
        try {
          return { endpoints: await engine.updateEndpoints({ add, remove }) };
        } catch (err) {
          // A server that does not answer, or serves another model: the gateway's answer, 502.
          const code = (err as { code?: unknown }).code;
          if (typeof code === 'string' && (code.startsWith('ERR_LLM_') || code === 'ERR_INVALID_CONFIG'))
            throw new HttpError(502, code as ErrorCode, (err as Error).message);
          throw err;
        }
      },
    },
    'POST /audit': {
      fields: ['rolloutId', 'groupId'],
      run: async (body) => {
        const rolloutId = optionalString(body, 'rolloutId');
        const groupId = optionalString(body, 'groupId');
        if (rolloutId !== undefined && groupId !== undefined)
          throw new HttpError(400, 'ERR_BAD_BODY', 'name a rolloutId or a groupId, not both');
        if (engine.audit === undefined) throw new HttpError(404, 'ERR_NOT_FOUND', 'this engine has no audit');
        const rollouts = await engine.audit({
          ...(rolloutId !== undefined ? { rolloutId } : {}),
          ...(groupId !== undefined ? { groupId } : {}),
        });
        return { rollouts, flagged: rollouts.filter((r) => r.flagged.length > 0).length };
      },
    },
  };

  const server = createServer((req, res) => void handle(req, res));
  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      const path = new URL(req.url ?? '/', 'http://x').pathname;
      const key = `${req.method} ${path}`;
      access.check(req.headers.host, req.headers.origin);
      const authorized = token === null || tokenMatches(req.headers.authorization, token);
      if (!authorized && path !== '/health')
        throw new HttpError(401, 'ERR_UNAUTHORIZED', 'missing or wrong bearer token (Authorization: Bearer …)');
      // Counted only once the token is known good: requests without it never spend a client's budget,
      // so a flood of them from the trainer's address (its host, a NAT) cannot push the trainer into 429s.
      // /health without the token is then not counted either: it does no work.
      if (authorized && !limiter.allow(req.socket.remoteAddress ?? '')) {
        res.setHeader('retry-after', '1');
        throw new HttpError(429, 'ERR_RATE_LIMITED', 'too many requests from this address; retry after a second');
      }
      if (key === 'GET /metrics') {
        const text = await metrics.text();
        res.writeHead(200, { 'content-type': metrics.contentType }).end(text);
        return;
      }
      const route = routes[key];
      if (route === undefined) {
        const known = Object.keys(routes).some((k) => k.endsWith(` ${path}`)) || path === '/metrics';
        throw known
          ? new HttpError(405, 'ERR_METHOD_NOT_ALLOWED', `${req.method} is not allowed on ${path}`)
          : new HttpError(404, 'ERR_NOT_FOUND', `no route ${req.method} ${path}`);
      }
      const body = req.method === 'POST' ? await readBody(req, maxBodyBytes) : {};
      if (typeof body !== 'object' || body === null || Array.isArray(body))
        throw new HttpError(
          400,
          'ERR_BAD_BODY',
          `body must be an object (got ${body === null ? 'null' : Array.isArray(body) ? 'an array' : typeof body})`,
        );
      // A misspelt field would otherwise be ignored: `{"trainstep": 5}` takes the next batch, not step 5.
      const { fields } = route;
      const unknown = Object.keys(body).find((field) => !fields.includes(field));
      if (unknown !== undefined) {
        throw new HttpError(
          400,
          'ERR_BAD_BODY',
          `unknown field ${JSON.stringify(unknown)} (${key} takes ${fields.length === 0 ? 'no fields' : fields.join(', ')})`,
        );
      }
      send(req, res, 200, await route.run(body as Record<string, unknown>));
    } catch (err) {
      if (!res.headersSent) sendError(req, res, err);
      else res.destroy();
    }
  }

  await listen(server, host, options.port ?? 0, 'control API');
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${host.includes(':') ? `[${host}]` : host}:${port}`,
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

function optionalString(body: Record<string, unknown>, field: string): string | undefined {
  const value = body[field];
  if (value !== undefined && (typeof value !== 'string' || value.length === 0))
    throw new HttpError(400, 'ERR_BAD_BODY', `${field} must be a non-empty string (got ${preview(value)})`);
  return value;
}

/** A URL or a list of URLs; absent = none. */
function optionalUrls(body: Record<string, unknown>, field: string): string[] {
  const value = body[field];
  if (value === undefined) return [];
  const list = Array.isArray(value) ? value : [value];
  if (list.some((v) => typeof v !== 'string' || v.length === 0))
    throw new HttpError(400, 'ERR_BAD_BODY', `${field} must be a URL or a list of URLs (got ${preview(value)})`);
  return list as string[];
}

function optionalBool(body: Record<string, unknown>, field: string): boolean | undefined {
  const value = body[field];
  if (value !== undefined && typeof value !== 'boolean')
    throw new HttpError(400, 'ERR_BAD_BODY', `${field} must be true or false (got ${preview(value)})`);
  return value;
}

/** A weight version is a name: a string, or an integer taken as its decimal text. */
function optionalVersion(body: Record<string, unknown>, field: string): string | null {
  const value = body[field];
  if (value === undefined || value === null) return null;
  if (Number.isSafeInteger(value)) return String(value);
  const problem =
    typeof value === 'string'
      ? announcedVersionProblem(value)
      : `must be a non-empty string of at most ${MAX_WEIGHT_VERSION_LENGTH} characters, or an integer`;
  if (problem !== null) throw new HttpError(400, 'ERR_BAD_BODY', `${field} ${problem} (got ${preview(value)})`);
  return value as string;
}

function optionalInt(body: Record<string, unknown>, field: string, min: number): number | undefined {
  return body[field] === undefined ? undefined : requiredInt(body, field, min);
}

function requiredInt(body: Record<string, unknown>, field: string, min: number): number {
  const value = body[field];
  // Steps live in 32-bit shared memory and typed arrays: larger values are refused here, not wrapped later.
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > MAX_STEP) {
    throw new HttpError(
      400,
      'ERR_BAD_BODY',
      `${field} must be an integer in [${min}, ${MAX_STEP}] (got ${preview(value)})`,
    );
  }
  return value;
}

/** A token bucket per client address: `rate` tokens a second, up to `2 × rate` saved for bursts. */
class RateLimiter {
  readonly #rate: number;
  readonly #buckets = new Map<string, { tokens: number; at: number }>();

  constructor(rate: number) {
    this.#rate = rate;
  }

  allow(client: string): boolean {
    const now = performance.now();
    const burst = 2 * this.#rate;
    const bucket = this.#buckets.get(client) ?? { tokens: burst, at: now };
    bucket.tokens = Math.min(burst, bucket.tokens + ((now - bucket.at) / 1000) * this.#rate);
    bucket.at = now;
    this.#buckets.set(client, bucket);
    if (this.#buckets.size > 10_000) this.#buckets.clear(); // bounded: forgetting buckets only ever allows more
    if (bucket.tokens < 1) return false;
    bucket.tokens -= 1;
    return true;
  }
}

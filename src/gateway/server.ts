/**
 * The token-trace gateway: an OpenAI-compatible server (node:http) in front of a token-in/token-out
 * backend, recording per-session token traces for RL training.
 *
 * Routes:
 *   POST /v1/chat/completions                 (session from body `session_id` or header `x-session-id`)
 *   POST /v1/sessions/{id}/chat/completions   (session from the path: give an OpenAI client this baseURL)
 *   GET  /v1/models, /v1/sessions/{id}/models, /health
 *   POST /tokenize  {messages} | {text}        (also /v1/tokenize)
 *   GET  /v1/sessions/{id}                    summary of the session's calls
 *   GET  /v1/sessions/{id}/traces             every call's kind (main or side), prompt ids, completion ids, logprobs, finish reason, model step
 *   POST /v1/sessions/{id}/stitch {reward?}   the training sample, its side calls beside it; releases the session
 *   DELETE /v1/sessions/{id}                  releases the session (200 even when unknown)
 * A call without a session id gets a session of its own, named in the reply (`session_id`, header
 * `x-session-id`) so it can still be stitched.
 */
import { createServer } from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { sessionBaseUrl } from '../llm/gateway-client.ts';
import { AnnouncedVersions } from '../domain/weight-versions.ts';
import { createTokenBackend } from './backend.ts';
import { runChatCall } from './chat.ts';
import type { ChatContext } from './chat.ts';
import { ChatModelError } from '../chat-model/errors.ts';
import { GatewayError, fromChatModelError } from './errors.ts';
import { listen } from '../http-server.ts';
import { hostForUrl, readBody, sendError, sendJson, sendText } from './http.ts';
import { loadChatModel, type ChatModel } from '../chat-model/model.ts';
import { DEFAULT_MAX_CONTEXT, resolveGatewayOptions } from './options.ts';
import type { GatewayOptions, ResolvedGatewayOptions } from './options.ts';
import { parseChatCompletionRequest, parseJsonObject, parseMessages, parseSessionId } from './request.ts';
import { chatCompletionBody, chatCompletionSse } from './response.ts';
import { SessionStore } from './sessions.ts';
import type { SessionSummary } from './sessions.ts';
import { stitchTraces, stitchedSampleJson } from './stitch.ts';
import type { StitchedSample } from './stitch.ts';
import { callRecords } from './trace.ts';
import type { CallRecord } from './trace.ts';

export interface GatewayStats {
  /** Live sessions (holding traces or with a call in flight). */
  sessions: number;
  /** Sessions released by their idle TTL. */
  expiredSessions: number;
  /** Chat calls answered 200. */
  calls: number;
  /** Chat calls that failed (4xx, backend errors, client gone). */
  failedCalls: number;
  stitched: number;
  /** Sum over answered calls of the time spent outside the backend (render, tokenize, bookkeeping), ms. */
  gatewayMs: number;
  /** Sum over answered calls of the backend round trips, ms. */
  backendMs: number;
  /**
   * Answered calls whose weight version is not the weights served when they went out: none announced
   * (`weightVersion`, `setModelStep`), or older ones — the backend is not serving what it was said to load.
   */
  weightVersionMismatches: number;
}

export interface Gateway {
  /** `http://host:port`, no trailing slash. */
  readonly url: string;
  /** `url + '/v1'`: the baseURL of an OpenAI client (send `session_id` in the body or `x-session-id`). */
  readonly baseURL: string;
  readonly port: number;
  readonly options: ResolvedGatewayOptions;
  /** The model id served on /v1/models. */
  readonly model: string;
  readonly maxContext: number;
  readonly chatModel: ChatModel;
  /** baseURL for an OpenAI client whose every call belongs to `sessionId` (no extra body field needed). */
  sessionBaseURL(sessionId: string): string;
  /**
   * The session's main conversation as one training sample, its side calls beside it (`sideCalls`);
   * the session and its traces are released. Throws
   * ERR_GATEWAY_UNKNOWN_SESSION, ERR_GATEWAY_SESSION_BUSY (a call still in flight) or ERR_GATEWAY_STITCH.
   */
  stitch(sessionId: string, options?: { reward?: number | null }): StitchedSample;
  session(sessionId: string): SessionSummary | undefined;
  /**
   * Each call of a live session, main and side, in call order, with its kind, prompt ids, completion
   * ids, logprobs, finish reason and model step (what an agent loop turns into per-turn records);
   * undefined for an unknown session. Does not release it.
   */
  traces(sessionId: string): CallRecord[] | undefined;
  /** Drops a session and its traces; false when there was none. */
  release(sessionId: string): boolean;
  /**
   * Weight version recorded for calls whose backend reports none (the engine's current model step);
   * `weightVersion`: the backend's name for these weights, as the trainer announced it (null: none).
   */
  setModelStep(step: number, weightVersion?: string | null): void;
  stats(): GatewayStats;
  /** Cancels calls in flight, closes every connection and releases all sessions. Idempotent. */
  close(): Promise<void>;
}

const KEEP_ALIVE_MS = 30_000;
const CLOSE_GRACE_MS = 200;
const SESSION_ROUTE = /^\/v1\/sessions\/([^/]+)(\/.*)?$/;
const HEADER_SAFE = /^[\x21-\x7e]+$/;

type Handler = (req: IncomingMessage, res: ServerResponse, sessionId: string | null) => Promise<void> | void;

function headerSessionId(req: IncomingMessage): string | null {
  const value = req.headers['x-session-id'];
  if (value === undefined) return null;
  return parseSessionId(Array.isArray(value) ? value[0] : value, 'x-session-id');
}

/** One id from path, header and body; several that disagree are a client bug worth a clear 400. */
function resolveSessionId(sources: [string, string | null][]): string | null {
  let chosen: [string, string] | null = null;
  for (const [where, id] of sources) {
    if (id === null) continue;
    if (chosen !== null && chosen[1] !== id) {
      throw new GatewayError(
        'ERR_GATEWAY_BAD_REQUEST',
        `session id ${JSON.stringify(id)} from ${where} differs from ${JSON.stringify(chosen[1])} from ${chosen[0]}`,
        { param: 'session_id' },
      );
    }
    chosen ??= [where, id];
  }
  return chosen?.[1] ?? null;
}

function unknownSession(id: string): GatewayError {
  return new GatewayError(
    'ERR_GATEWAY_UNKNOWN_SESSION',
    `no live session ${JSON.stringify(id)} (never used, already stitched or deleted, or expired after the session TTL)`,
    {
      param: 'session_id',
      details: { session_id: id },
    },
  );
}

export async function startGateway(options: GatewayOptions): Promise<Gateway> {
  const opts = resolveGatewayOptions(options);
  const model = await loadChatModel(opts.tokenizer).catch((err: unknown) => {
    throw err instanceof ChatModelError ? fromChatModelError(err) : err;
  });
  const maxContext = opts.maxContext ?? Math.min(model.maxLength ?? DEFAULT_MAX_CONTEXT, DEFAULT_MAX_CONTEXT);
  const servedModel = opts.model ?? opts.tokenizer;
  const backend = createTokenBackend({
    ...opts.backend,
    completeTokenId: model.encode('a')[0],
    routingShape: opts.routedExperts?.shape ?? null,
  });
  const sessions = new SessionStore({
    ttlMs: opts.sessionTtlMs,
    maxSessions: opts.maxSessions,
    onRelease: opts.onSessionReleased,
  });
  let modelStep = opts.modelStep;
  const counters = { calls: 0, failedCalls: 0, stitched: 0, gatewayMs: 0, backendMs: 0, weightVersionMismatches: 0 };
  // The same reading of a reply's version as the workers' (worker/pause-gate.ts).
  const versions = new AnnouncedVersions();
  if (opts.weightVersion !== null) versions.announce(opts.weightVersion, modelStep);
  const ctx: ChatContext = {
    model,
    backend,
    sessions,
    servedModel,
    maxContext,
    defaultMaxTokens: opts.defaultMaxTokens,
    sideCalls: opts.sideCalls,
    maxSideCalls: opts.maxSideCalls,
    modelStep: () => modelStep,
    stepOfVersion: (version) => versions.stepOf(version, modelStep, opts.modelStepIsNewest ? modelStep : Infinity),
    onVersionMismatch: (version, expected, tagged) => {
      counters.weightVersionMismatches += 1;
      opts.onVersionMismatch?.(version, expected, tagged);
    },
    routedExperts: opts.routedExperts !== null,
    samplingMasks: opts.samplingMasks,
  };
  const inFlight = new Set<AbortController>();
  let closing = false;

  function stitch(sessionId: string, stitchOptions: { reward?: number | null } = {}): StitchedSample {
    const session = sessions.get(sessionId);
    if (session === undefined) throw unknownSession(sessionId);
    if (session.busy) {
      throw new GatewayError(
        'ERR_GATEWAY_SESSION_BUSY',
        `session ${JSON.stringify(sessionId)} has a call in flight; stitch it once the agent is done`,
        { param: 'session_id', details: { session_id: sessionId } },
      );
    }
    if (session.traces.length === 0) throw unknownSession(sessionId);
    try {
      const sample = stitchTraces(
        { sessionId, tokens: session.tokens, traces: session.traces, sideCalls: session.sideCalls },
        stitchOptions,
      );
      counters.stitched += 1;
      return sample;
    } finally {
      sessions.release(sessionId, 'stitched');
    }
  }

  const chat: Handler = async (req, res, pathSessionId) => {
    const raw = await readBody(req, opts.maxBodyBytes);
    const request = parseChatCompletionRequest(parseJsonObject(raw));
    const sessionId = resolveSessionId([
      ['the path', pathSessionId],
      // A session in the path is the one meant: an x-session-id beside it is the client's own routing
      // hint (verifiers' EvalClient always sends its trace id there: verifiers/v1/clients/client.py:16-18
      // at a60a606e, set after any configured header, so the engine cannot make it match).
      ['header x-session-id', pathSessionId === null ? headerSessionId(req) : null],
      ['body session_id', request.sessionId],
    ]);
    if (closing) throw new GatewayError('ERR_GATEWAY_CLOSING', 'the gateway is shutting down');
    const controller = new AbortController();
    inFlight.add(controller);
    // The agent hung up: stop generating for it (the backend aborts the request).
    const onClose = (): void => {
      if (!res.writableEnded) controller.abort(new Error('the client closed the connection'));
    };
    res.once('close', onClose);
    let reply;
    try {
      reply = await runChatCall(ctx, request, sessionId, controller.signal);
    } catch (err) {
      // Cut short by close(): say so, rather than "cancelled" as if the client had hung up.
      if (closing && (err as GatewayError).code === 'ERR_BACKEND_ABORTED')
        throw new GatewayError('ERR_GATEWAY_CLOSING', 'the gateway is shutting down; the call was cancelled', {
          cause: err,
        });
      throw err;
    } finally {
      inFlight.delete(controller);
    }
    counters.backendMs += reply.timings.backendMs;
    counters.gatewayMs += reply.timings.totalMs - reply.timings.backendMs;
    counters.calls += 1;
    const headers: Record<string, string> = HEADER_SAFE.test(reply.sessionId)
      ? { 'x-session-id': reply.sessionId }
      : {};
    if (request.stream) {
      const sse = chatCompletionSse(model, reply);
      if (res.destroyed) return;
      res.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-cache',
        'content-length': Buffer.byteLength(sse),
        ...headers,
      });
      res.end(sse);
    } else {
      sendText(res, 200, JSON.stringify(chatCompletionBody(model, reply)), headers);
    }
  };

  const models: Handler = (req, res) => {
    req.resume();
    sendJson(res, 200, {
      object: 'list',
      data: [
        { id: servedModel, object: 'model', created: 0, owned_by: 'rollout-engine-gateway', max_model_len: maxContext },
      ],
    });
  };

  const tokenize: Handler = async (req, res) => {
    const body = parseJsonObject(await readBody(req, opts.maxBodyBytes));
    const hasMessages = body.messages !== undefined;
    const hasText = body.text !== undefined || body.prompt !== undefined;
    if (hasMessages === hasText) {
      throw new GatewayError(
        'ERR_GATEWAY_BAD_REQUEST',
        'send exactly one of messages (a conversation, rendered with the chat template) or text',
        { param: hasMessages ? 'text' : 'messages' },
      );
    }
    let text: string;
    if (hasMessages) {
      const addGenerationPrompt = body.add_generation_prompt ?? true;
      if (typeof addGenerationPrompt !== 'boolean')
        throw new GatewayError(
          'ERR_GATEWAY_BAD_REQUEST',
          `add_generation_prompt must be a boolean (got ${JSON.stringify(addGenerationPrompt)})`,
          { param: 'add_generation_prompt' },
        );
      const tools = Array.isArray(body.tools) && body.tools.length > 0 ? body.tools : null;
      text = model.render(parseMessages(body.messages), { addGenerationPrompt, tools });
    } else {
      const value = body.text ?? body.prompt;
      if (typeof value !== 'string')
        throw new GatewayError('ERR_GATEWAY_BAD_REQUEST', `text must be a string (got ${typeof value})`, {
          param: 'text',
        });
      text = value;
    }
    const ids = model.encode(text);
    sendJson(res, 200, { tokens: ids, count: ids.length, max_model_len: maxContext });
  };

  const sessionRoute: Handler = (req, res, sessionId) => {
    req.resume();
    const id = sessionId!;
    if (req.method === 'DELETE') {
      sendJson(res, 200, { session_id: id, deleted: sessions.release(id, 'deleted') });
      return;
    }
    const summary = sessions.summary(id);
    if (summary === undefined) throw unknownSession(id);
    sendJson(res, 200, summary);
  };

  const tracesRoute: Handler = (req, res, sessionId) => {
    req.resume();
    const session = sessions.get(sessionId!);
    if (session === undefined) throw unknownSession(sessionId!);
    sendJson(res, 200, {
      session_id: session.id,
      calls: callRecords(session.tokens, session.traces, session.sideCalls).map((c) => ({
        index: c.index,
        kind: c.kind,
        prompt_token_ids: Array.from(c.promptIds),
        completion_token_ids: Array.from(c.completionIds),
        logprobs: Array.from(c.logprobs),
        finish_reason: c.finishReason,
        model_step: c.modelStep,
      })),
    });
  };

  const stitchRoute: Handler = async (req, res, sessionId) => {
    const raw = await readBody(req, opts.maxBodyBytes);
    const body = raw.trim() === '' ? {} : parseJsonObject(raw);
    const reward = body.reward;
    if (reward !== undefined && reward !== null && (typeof reward !== 'number' || !Number.isFinite(reward))) {
      throw new GatewayError(
        'ERR_GATEWAY_BAD_REQUEST',
        `reward must be a finite number or null (got ${JSON.stringify(reward)})`,
        { param: 'reward' },
      );
    }
    sendJson(
      res,
      200,
      stitchedSampleJson(stitch(sessionId!, { reward: (reward as number | null | undefined) ?? null })),
    );
  };

  const health: Handler = (req, res) => {
    req.resume();
    sendJson(res, 200, { status: closing ? 'closing' : 'ok', model: servedModel, sessions: sessions.size });
  };

  const routes: Record<string, Record<string, Handler>> = {
    '/health': { GET: health },
    '/v1/models': { GET: models },
    '/v1/chat/completions': { POST: chat },
    '/tokenize': { POST: tokenize },
    '/v1/tokenize': { POST: tokenize },
  };
  const sessionRoutes: Record<string, Record<string, Handler>> = {
    '': { GET: sessionRoute, DELETE: sessionRoute },
    '/stitch': { POST: stitchRoute },
    '/traces': { GET: tracesRoute },
    '/chat/completions': { POST: chat },
    '/models': { GET: models },
  };

  function route(req: IncomingMessage): {
    handler: Handler | undefined;
    allowed: string[] | null;
    sessionId: string | null;
    path: string;
  } {
    const q = req.url?.indexOf('?') ?? -1;
    const path = q >= 0 ? req.url!.slice(0, q) : (req.url ?? '/');
    const match = SESSION_ROUTE.exec(path);
    let table: Record<string, Handler> | undefined;
    let sessionId: string | null = null;
    if (match !== null) {
      let decoded: string;
      try {
        decoded = decodeURIComponent(match[1]);
      } catch {
        throw new GatewayError('ERR_GATEWAY_BAD_REQUEST', `the session id in ${path} is not valid percent-encoding`, {
          param: 'session_id',
        });
      }
      sessionId = parseSessionId(decoded, 'session_id');
      table = sessionRoutes[match[2] ?? ''];
    } else {
      table = routes[path];
    }
    if (table === undefined) return { handler: undefined, allowed: null, sessionId, path };
    return { handler: table[req.method ?? ''], allowed: Object.keys(table), sessionId, path };
  }

  const sockets = new Map<Socket, number>();
  const server = createServer((req, res) => {
    const socket = req.socket;
    sockets.set(socket, (sockets.get(socket) ?? 0) + 1);
    res.once('close', () => {
      // The socket may be gone already (its 'close' removed it): do not bring it back.
      if (!sockets.has(socket)) return;
      const open = Math.max(0, sockets.get(socket)! - 1);
      sockets.set(socket, open);
      if (open === 0 && closing) socket.destroy();
    });
    const isChat = (req.url ?? '').includes('/chat/completions');
    Promise.resolve()
      .then(() => {
        const { handler, allowed, sessionId, path } = route(req);
        if (handler === undefined) {
          req.resume();
          if (allowed === null) throw new GatewayError('ERR_GATEWAY_NOT_FOUND', `unknown route ${req.method} ${path}`);
          throw new GatewayError(
            'ERR_GATEWAY_METHOD',
            `method ${req.method} is not allowed on ${path} (allowed: ${allowed.join(', ')})`,
          );
        }
        return handler(req, res, sessionId);
      })
      .catch((err: unknown) => {
        if (isChat) counters.failedCalls += 1;
        const error =
          err instanceof GatewayError
            ? err
            : err instanceof ChatModelError
              ? fromChatModelError(err)
              : new GatewayError('ERR_GATEWAY_INTERNAL', `gateway error: ${(err as Error).message}`, { cause: err });
        if (res.headersSent || res.destroyed) {
          res.destroy();
          return;
        }
        const headers: Record<string, string> =
          error.code === 'ERR_GATEWAY_BODY_TOO_LARGE' ? { connection: 'close' } : {};
        sendError(res, error, headers);
      });
  });
  server.keepAliveTimeout = KEEP_ALIVE_MS;
  server.on('connection', (socket: Socket) => {
    sockets.set(socket, 0);
    socket.once('close', () => sockets.delete(socket));
  });

  try {
    await listen(server, opts.host, opts.port, 'gateway');
  } catch (err) {
    await backend.close();
    throw err;
  }
  const port = (server.address() as AddressInfo).port;
  const url = `http://${hostForUrl(opts.host)}:${port}`;
  let closed: Promise<void> | null = null;

  return {
    url,
    baseURL: `${url}/v1`,
    port,
    options: opts,
    model: servedModel,
    maxContext,
    chatModel: model,
    sessionBaseURL: (sessionId) => sessionBaseUrl(url, sessionId),
    stitch,
    session: (sessionId) => sessions.summary(sessionId),
    traces(sessionId) {
      const session = sessions.get(sessionId);
      return session === undefined ? undefined : callRecords(session.tokens, session.traces, session.sideCalls);
    },
    release: (sessionId) => sessions.release(sessionId, 'deleted'),
    setModelStep(step, weightVersion = null) {
      if (!Number.isSafeInteger(step) || step < 0)
        throw new GatewayError(
          'ERR_GATEWAY_BAD_REQUEST',
          `model step must be a non-negative integer (got ${JSON.stringify(step)})`,
          { param: 'modelStep' },
        );
      if (weightVersion !== null && (typeof weightVersion !== 'string' || weightVersion === ''))
        throw new GatewayError(
          'ERR_GATEWAY_BAD_REQUEST',
          `weight version must be a non-empty string or null (got ${JSON.stringify(weightVersion)})`,
          { param: 'weightVersion' },
        );
      modelStep = step;
      if (weightVersion !== null) versions.announce(weightVersion, step);
    },
    stats: () => ({ sessions: sessions.size, expiredSessions: sessions.expired, ...counters }),
    close() {
      closed ??= (async () => {
        closing = true;
        for (const controller of inFlight) controller.abort(new Error('the gateway is closing'));
        const serverClosed = new Promise<void>((resolve) => server.close(() => resolve()));
        for (const [socket, open] of sockets) if (open === 0) socket.destroy();
        // Uploads still in progress would otherwise hold close() open until they time out.
        setTimeout(() => server.closeAllConnections(), CLOSE_GRACE_MS).unref();
        await serverClosed;
        await backend.close();
        sessions.releaseAll('closed');
      })();
      return closed;
    },
  };
}

/**
 * The mock's route table and the dispatch in front of it: the default dialect's routes (health,
 * models, chat and token-in completions, admin-routes.ts), or a dialect's (dialect-routes.ts), and
 * what every route shares — the request count, body validation answered 400 naming the field, 503
 * while closing, and the answers to an unknown route, a wrong method, a body too large or a bug.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { adminRoutes } from './admin-routes.ts';
import type { Completer } from './completer.ts';
import type { Gpu } from './gpu.ts';
import { parseTokenCompletionRequest, type TokenCompletionRequest } from './completions.ts';
import { dialectRoutes, type RouteTable } from './dialect-routes.ts';
import {
  badRequest,
  parseGenerateRequest,
  parseLlamaCompletionRequest,
  unknownRoute,
  type Dialect,
  type TokenInRequest,
} from './dialects.ts';
import { BodyTooLarge, errorBody, readBody, sendJson, sendText, type Rejections } from './http-replies.ts';
import type { ResolvedMockLlmOptions } from './options.ts';
import { parseChatRequest, RequestError, type MockChatRequest } from './request.ts';
import type { Scheduler } from './scheduler.ts';
import type { WeightVersion } from './weight-version.ts';

export interface RouteParts {
  options: ResolvedMockLlmOptions;
  /** null: the mock's own (default) dialect. */
  dialect: Dialect | null;
  context: number;
  completer: Completer;
  scheduler: Scheduler;
  rejections: Rejections;
  version: WeightVersion;
  /** True once close() was called: generation requests are answered 503 from then on. */
  closing(): boolean;
  /** Called after each generation request is counted (waitForStats). */
  onChange?: () => void;
  /** The GPU-like mock's replica, whose metrics `GET /admin/gpu` answers; null without option capacity. */
  gpu?: Gpu | null;
}

export class Routes {
  readonly #dialect: Dialect | null;
  readonly #parts: RouteParts;
  readonly #table: RouteTable;
  /** Generation requests received, valid or not (stats().requests). */
  #requests = 0;

  constructor(parts: RouteParts) {
    this.#parts = parts;
    this.#dialect = parts.dialect;
    this.#table = this.#dialect === null ? this.#defaultTable() : this.#dialectTable(this.#dialect);
  }

  get requests(): number {
    return this.#requests;
  }

  /** Answers one request: its route's handler, or the dialect's answer to an unknown route or method. */
  handle(req: IncomingMessage, res: ServerResponse): void {
    const { rejections } = this.#parts;
    const q = req.url?.indexOf('?') ?? -1;
    const path = q >= 0 ? req.url!.slice(0, q) : (req.url ?? '/');
    const route = this.#table[path];
    const handler = route?.[req.method ?? ''];
    if (handler === undefined) {
      req.resume();
      if (this.#dialect !== null) rejections.dialect(res, unknownRoute(this.#dialect, route !== undefined));
      else if (route === undefined) rejections.reject(res, 404, `unknown route ${req.method} ${path}`);
      else
        rejections.reject(res, 405, `method ${req.method} is not allowed on ${path}`, null, {
          allow: Object.keys(route).join(', '),
        });
      return;
    }
    Promise.resolve()
      .then(() => handler(req, res))
      .catch((error: unknown) => {
        if (error instanceof BodyTooLarge) rejections.reject(res, 413, error.message, null, { connection: 'close' });
        else if (res.headersSent || req.destroyed) res.destroy();
        else sendJson(res, 500, errorBody(`mock server error: ${(error as Error).message}`, 'server_error'));
      });
  }

  #defaultTable(): RouteTable {
    const { options, completer, scheduler, rejections, version } = this.#parts;
    return {
      '/health': { GET: (req, res) => (req.resume(), sendJson(res, 200, { status: 'ok' })) },
      '/v1/models': {
        GET: (req, res) => {
          req.resume();
          sendJson(res, 200, {
            object: 'list',
            data: [{ id: options.model, object: 'model', created: 0, owned_by: 'rollout-engine-mock' }],
          });
        },
      },
      '/v1/chat/completions': {
        POST: this.#generation<MockChatRequest>(parseChatRequest, (res, r) => completer.chat(res, r)),
      },
      '/v1/completions': {
        POST: this.#generation<TokenCompletionRequest>(parseTokenCompletionRequest, (res, r) =>
          completer.tokens(res, r),
        ),
      },
      ...adminRoutes({
        abortAll: () => scheduler.abortAll(),
        pause: (mode) => scheduler.pause(mode),
        resume: () => scheduler.resume(),
        version,
        readBody: (req) => readBody(req, options.maxBodyBytes),
        rejections,
        gpu: this.#parts.gpu ?? null,
      }),
    };
  }

  #dialectTable(dialect: Dialect): RouteTable {
    const { options, context, completer, scheduler, rejections, version } = this.#parts;
    const tokens =
      dialect === 'vllm'
        ? this.#generation<TokenCompletionRequest>(parseTokenCompletionRequest, (res, r) =>
            completer.vllmTokens(res, r),
          )
        : dialect === 'sglang'
          ? this.#generation<TokenInRequest>(
              parseGenerateRequest,
              (res, r) => completer.dialectTokens('sglang', res, r, 'native'),
              true,
            )
          : this.#generation<TokenInRequest>(
              parseLlamaCompletionRequest,
              (res, r) => completer.dialectTokens('llamacpp', res, r, 'native'),
              true,
            );
    return dialectRoutes(dialect, {
      options,
      context,
      chat: this.#generation<MockChatRequest>(parseChatRequest, (res, r) => completer.dialectChat(dialect, res, r)),
      tokens,
      abortAll: () => scheduler.abortAll(),
      abortIds: (rids) => scheduler.abortIds(rids),
      pause: (mode) => scheduler.pause(mode),
      resume: () => scheduler.resume(),
      getVersion: () => version.label,
      setVersion: (label) => version.setLabel(label),
      readBody: (req) => readBody(req, options.maxBodyBytes),
      reject: (res, error) => rejections.dialect(res, error),
      send: (res, status, body) => sendText(res, status, body),
    });
  }

  /** A generation route: count, read and validate the body (400 naming the field), refuse while closing, answer. */
  #generation<R>(parse: (raw: string) => R, answer: (res: ServerResponse, request: R) => void, native = false) {
    const { options, rejections, closing } = this.#parts;
    return async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
      this.#requests += 1;
      this.#parts.onChange?.();
      const raw = await readBody(req, options.maxBodyBytes);
      let request: R;
      try {
        request = parse(raw);
      } catch (error) {
        if (!(error instanceof RequestError)) throw error;
        if (this.#dialect !== null)
          rejections.dialect(res, badRequest(this.#dialect, native ? 'native' : 'openai', error.message, error.param));
        else rejections.reject(res, 400, error.message, error.param);
        return;
      }
      if (closing()) {
        sendJson(res, 503, errorBody('the mock server is shutting down', 'server_error'));
        return;
      }
      answer(res, request);
    };
  }
}

/**
 * The route table of each dialect: the generation routes, and the routes an engine probes to tell the
 * servers apart, to abort, and to read or set the weight version — each server's own, with the
 * others absent (answered as that server answers an unknown route, dialects.ts unknownRoute). The
 * mock's own `/admin/*` routes are absent too: a dialect is driven from the library (abortAll,
 * setWeightVersion) or through the server's routes.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Dialect, DialectError } from './dialects.ts';
import { LLAMACPP_BUILD_INFO, vllmError } from './dialects.ts';
import type { ResolvedMockLlmOptions } from './options.ts';
import { CONTINUED_REPLY, isPauseMode, PAUSED_REPLY, type PauseMode } from './pause-routes.ts';

type Handler = (req: IncomingMessage, res: ServerResponse) => void | Promise<void>;
export type RouteTable = Record<string, Record<string, Handler>>;

export interface DialectRouteContext {
  options: ResolvedMockLlmOptions;
  /** The context window the dialect enforces and reports. */
  context: number;
  chat: Handler;
  tokens: Handler;
  abortAll(): number;
  abortIds(rids: ReadonlySet<string>): number;
  /** SGLang's pause_generation / continue_generation (pause-routes.ts); vLLM's /pause and /resume map onto them. */
  pause(mode: PauseMode): number;
  resume(): void;
  getVersion(): string;
  setVersion(label: string): void;
  readBody(req: IncomingMessage): Promise<string>;
  reject(res: ServerResponse, error: DialectError): void;
  send(res: ServerResponse, status: number, body: string): void;
}

/** Qwen2.5's trained context, which llama.cpp reports as n_ctx_train whatever the server's -c is. */
const N_CTX_TRAIN = 32_768;

function get(answer: () => unknown, ctx: DialectRouteContext): Handler {
  return (req, res) => {
    req.resume();
    ctx.send(res, 200, JSON.stringify(answer()));
  };
}

/** Starlette's Response(status_code=200): no body, no content type. */
function empty(res: ServerResponse): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(200, { 'content-length': 0 }).end();
}

/** FastAPI's 422 for a body field it could not validate (pydantic v2 error list). */
function unprocessable(
  res: ServerResponse,
  ctx: DialectRouteContext,
  loc: string[],
  type: string,
  msg: string,
  input: unknown,
): void {
  ctx.reject(res, { status: 422, body: JSON.stringify({ detail: [{ type, loc, msg, input: input ?? null }] }) });
}

async function jsonBody(
  req: IncomingMessage,
  ctx: DialectRouteContext,
): Promise<{ ok: true; value: unknown } | { ok: false }> {
  const raw = await ctx.readBody(req);
  try {
    return { ok: true, value: JSON.parse(raw) };
  } catch {
    return { ok: false };
  }
}

export function dialectRoutes(dialect: Dialect, ctx: DialectRouteContext): RouteTable {
  if (dialect === 'vllm') return vllmRoutes(ctx);
  if (dialect === 'sglang') return sglangRoutes(ctx);
  return llamacppRoutes(ctx);
}

function vllmRoutes(ctx: DialectRouteContext): RouteTable {
  const model = ctx.options.model;
  const routes: RouteTable = {
    // 200 with no body (vLLM's health route; the index held only a re-export shim of
    // vllm/entrypoints/serve/instrumentator/health.py, so not re-read at a pinned commit).
    '/health': { GET: (req, res) => (req.resume(), empty(res)) },
    // vllm/entrypoints/openai/models/serving.py OpenAIModelRegistry.show_available_models @00153c8b7948077ebdfc5bfa14e403da41aaea6d
    // and protocol.py ModelCard @0052bed36509c7a5a2d8e48265334e40cf2f5a0e: owned_by "vllm", max_model_len = the context.
    '/v1/models': {
      GET: get(() => {
        const created = Math.floor(Date.now() / 1000);
        return {
          object: 'list',
          data: [
            {
              id: model,
              object: 'model',
              created,
              owned_by: 'vllm',
              root: model,
              parent: null,
              max_model_len: ctx.context,
              permission: [
                {
                  id: 'modelperm-mock',
                  object: 'model_permission',
                  created,
                  allow_create_engine: false,
                  allow_sampling: true,
                  allow_logprobs: true,
                  allow_search_indices: false,
                  allow_view: true,
                  allow_fine_tuning: false,
                  organization: '*',
                  group: null,
                  is_blocking: false,
                },
              ],
            },
          ],
        };
      }, ctx),
    },
    '/v1/chat/completions': { POST: ctx.chat },
    '/v1/completions': { POST: ctx.tokens },
  };
  if (!ctx.options.vllmDevMode) return routes;
  // Registered only with VLLM_SERVER_DEV_MODE=1 (api_server.py build_app → register_vllm_dev_api_routers),
  // in vllm/entrypoints/serve/dev/rlhf/api_router.py @0100a2129224e729af1b3b8ed42a900cdfe9a452: the
  // abort, pause and weight-version routes below (and GET /is_paused, not in the mock).
  routes['/abort_requests'] = {
    // abort_requests: the body must be JSON (an empty one is 400 "Invalid JSON format", through
    // api_server's http_exception_handler: type = the status phrase); no or empty request_ids = every
    // request in flight; answers {"status": "aborted", "aborted": n}.
    POST: async (req, res) => {
      const body = await jsonBody(req, ctx);
      if (!body.ok) {
        ctx.reject(res, {
          status: 400,
          body: '{"error":{"message":"Invalid JSON format","type":"Bad Request","param":null,"code":400}}',
        });
        return;
      }
      const ids = (body.value as { request_ids?: unknown } | null)?.request_ids;
      if (Array.isArray(ids) && ids.length > 0) {
        ctx.abortIds(new Set(ids.map(String)));
        ctx.send(res, 200, JSON.stringify({ status: 'aborted', aborted: ids.length }));
      } else {
        ctx.send(res, 200, JSON.stringify({ status: 'aborted', aborted: ctx.abortAll() }));
      }
    },
  };
  routes['/pause'] = { POST: (req, res) => vllmPause(req, res, ctx) };
  // resume_generation: the scheduler unpaused, kept requests go on and queued ones start.
  routes['/resume'] = {
    POST: (req, res) => {
      req.resume();
      ctx.resume();
      ctx.send(res, 200, '{"status":"resumed"}');
    },
  };
  // finish_weight_update {"weight_version"?: str}: the version is published only when named, else the
  // current one (from "default" at start) is kept (vllm-project/vllm#49040); no weights move in the mock.
  routes['/finish_weight_update'] = {
    POST: async (req, res) => {
      const body = await jsonBody(req, ctx);
      const value = body.ok ? (body.value as { weight_version?: unknown } | null)?.weight_version : undefined;
      if (value !== undefined && value !== null && typeof value !== 'string') {
        unprocessable(res, ctx, ['body', 'weight_version'], 'string_type', 'Input should be a valid string', value);
        return;
      }
      if (typeof value === 'string') ctx.setVersion(value);
      ctx.send(res, 200, '{"message":"Weight update finished"}');
    },
  };
  // weight_info: {"weight_version": <string>}; update_weight_version {"new_version": <string>} → {"success": true, "new_version": …}.
  routes['/weight_info'] = { GET: get(() => ({ weight_version: ctx.getVersion() }), ctx) };
  routes['/update_weight_version'] = {
    POST: async (req, res) => {
      const body = await jsonBody(req, ctx);
      const value = body.ok ? (body.value as { new_version?: unknown } | null)?.new_version : undefined;
      if (typeof value !== 'string') {
        unprocessable(
          res,
          ctx,
          ['body', 'new_version'],
          value === undefined ? 'missing' : 'string_type',
          value === undefined ? 'Field required' : 'Input should be a valid string',
          value,
        );
        return;
      }
      ctx.setVersion(value);
      ctx.send(res, 200, JSON.stringify({ success: true, new_version: value }));
    },
  };
  return routes;
}

/** vLLM's PauseMode (vllm/v1/engine/__init__.py), a Literal the /pause route validates. */
const VLLM_PAUSE_MODES = ['abort', 'wait', 'keep'] as const;

/**
 * vLLM's pause_generation: query parameters only (mode, clear_cache, and the deprecated
 * wait_for_inflight_requests, which means mode wait), no body read; 200 {"status": "paused"}. What the
 * modes do is EngineCoreProc.pause_scheduler (vllm/v1/engine/core.py @00080ee13c7a451fce071ccb8d0e94d395acf5a7):
 * `abort` finishes every request as aborted, `keep` freezes running and waiting requests where they
 * are; in both nothing is scheduled and new requests queue until /resume. clear_cache (default true)
 * then resets the prefix cache with the running requests preempted, so a kept request is prefilled
 * again on the new weights; false keeps its KV (docs/training/async_rl.md @006ebac240f34ddcd36383832b28c25840d2ea80).
 * Here keep with clear_cache false is SGLang's in_place, with true its retract (the mock's prefix cache
 * is not emptied as well).
 */
function vllmPause(req: IncomingMessage, res: ServerResponse, ctx: DialectRouteContext): void {
  req.resume();
  const query = new URL(req.url ?? '/', 'http://mock').searchParams;
  const mode = query.get('mode') ?? 'abort';
  if (!(VLLM_PAUSE_MODES as readonly string[]).includes(mode)) {
    const expected = "'abort', 'wait' or 'keep'";
    const msg = `Input should be ${expected}`;
    ctx.reject(
      res,
      vllmValidationError({ type: 'literal_error', loc: ['query', 'mode'], msg, input: mode, ctx: { expected } }),
    );
    return;
  }
  const flags = { clear_cache: true, wait_for_inflight_requests: false };
  for (const name of ['clear_cache', 'wait_for_inflight_requests'] as const) {
    const input = query.get(name);
    if (input === null) continue;
    const value = queryBool(input);
    if (value === null) {
      const msg = 'Input should be a valid boolean, unable to interpret input';
      ctx.reject(res, vllmValidationError({ type: 'bool_parsing', loc: ['query', name], msg, input }));
      return;
    }
    flags[name] = value;
  }
  if (mode === 'wait' || flags.wait_for_inflight_requests) {
    // Not simulated: wait lets the requests in flight run to their end while new ones queue, and
    // answers once they have; the scheduler and the GPU-like replica pause only as a whole.
    ctx.reject(
      res,
      vllmError(501, 'NotImplementedError', "mock-llm: pause mode 'wait' is not simulated; use mode keep or abort"),
    );
    return;
  }
  ctx.pause(mode === 'abort' ? 'abort' : flags.clear_cache ? 'retract' : 'in_place');
  ctx.send(res, 200, '{"status":"paused"}');
}

interface PydanticError {
  type: string;
  loc: string[];
  msg: string;
  input: string;
  ctx?: Record<string, string>;
}

/**
 * vLLM's answer to a request FastAPI could not validate: 400, not FastAPI's 422 — its
 * validation_exception_handler lists the pydantic errors, as Python prints them, in an ErrorResponse
 * with the first one's location as param (vllm/entrypoints/serve/utils/server_utils.py
 * @0753ceeb9cb7d7e39564ebebfe031d179e0c9924).
 */
function vllmValidationError(e: PydanticError): DialectError {
  const ctx = e.ctx
    ? `, 'ctx': {${Object.entries(e.ctx)
        .map(([k, v]) => `${pyStr(k)}: ${pyStr(v)}`)
        .join(', ')}}`
    : '';
  const printed = `{'type': ${pyStr(e.type)}, 'loc': (${e.loc.map(pyStr).join(', ')}), 'msg': ${pyStr(e.msg)}, 'input': ${pyStr(e.input)}${ctx}}`;
  return vllmError(400, 'Bad Request', `1 validation error:\n  ${printed}`, e.loc.join('.'));
}

/** A string as Python's repr() quotes it (its other escapes left out). */
function pyStr(text: string): string {
  return text.includes("'") && !text.includes('"') ? `"${text}"` : `'${text.replaceAll("'", "\\'")}'`;
}

/** pydantic's lax bool from a query string; null when it is none. */
function queryBool(raw: string): boolean | null {
  const text = raw.toLowerCase();
  if (['1', 'on', 't', 'true', 'y', 'yes'].includes(text)) return true;
  if (['0', 'off', 'f', 'false', 'n', 'no'].includes(text)) return false;
  return null;
}

function sglangRoutes(ctx: DialectRouteContext): RouteTable {
  const o = ctx.options;
  // python/sglang/srt/entrypoints/http_server.py get_model_info @0025436eab0556737d615b36a4dd3e1e26e82f3d
  // (newer SGLang also serves it as /model_info).
  const modelInfo = get(
    () => ({
      model_path: o.model,
      tokenizer_path: o.model,
      is_generation: true,
      preferred_sampling_params: null,
      weight_version: ctx.getVersion(),
    }),
    ctx,
  );
  // get_server_info: {**asdict(server_args), **scheduler_info, internal_states, version} (newer: /server_info).
  // The mock sends the server args an engine reads; context_length is what --context-length set (null
  // when the model's own is used): /v1/models max_model_len is the one always there.
  const serverInfo = get(
    () => ({
      model_path: o.model,
      tokenizer_path: o.model,
      served_model_name: o.model,
      context_length: o.contextLength,
      weight_version: ctx.getVersion(),
      host: o.host,
      port: o.port,
      skip_tokenizer_init: false,
      tp_size: 1,
      dp_size: 1,
      internal_states: [{}],
      version: 'mock',
    }),
    ctx,
  );
  return {
    // health_generate answers Response(status_code=200), no body (http_server.py @0025436eab0556737d615b36a4dd3e1e26e82f3d).
    '/health': { GET: (req, res) => (req.resume(), empty(res)) },
    // available_models: owned_by "sglang" (protocol.py ModelCard @9b116dffe828b2dfa7ec0e4d061555b6c354b67a),
    // max_model_len = model_config.context_len.
    '/v1/models': {
      GET: get(
        () => ({
          object: 'list',
          data: [
            {
              id: o.model,
              object: 'model',
              created: Math.floor(Date.now() / 1000),
              owned_by: 'sglang',
              root: o.model,
              max_model_len: ctx.context,
            },
          ],
        }),
        ctx,
      ),
    },
    '/v1/chat/completions': { POST: ctx.chat },
    '/generate': { POST: ctx.tokens, PUT: ctx.tokens },
    '/get_model_info': { GET: modelInfo },
    '/model_info': { GET: modelInfo },
    '/get_server_info': { GET: serverInfo },
    '/server_info': { GET: serverInfo },
    '/get_weight_version': { GET: get(() => ({ weight_version: ctx.getVersion() }), ctx) },
    // update_weight_version: UpdateWeightVersionReqInput {new_version: str, abort_all_requests = false}
    // → {"success": true, "message": "Weight version updated to …", "new_version": …}.
    '/update_weight_version': {
      POST: async (req, res) => {
        const body = await jsonBody(req, ctx);
        const b = (body.ok ? body.value : null) as { new_version?: unknown; abort_all_requests?: unknown } | null;
        if (typeof b?.new_version !== 'string') {
          unprocessable(
            res,
            ctx,
            ['body', 'new_version'],
            b?.new_version === undefined ? 'missing' : 'string_type',
            b?.new_version === undefined ? 'Field required' : 'Input should be a valid string',
            b?.new_version,
          );
          return;
        }
        if (b.abort_all_requests === true) ctx.abortAll();
        ctx.setVersion(b.new_version);
        ctx.send(
          res,
          200,
          JSON.stringify({
            success: true,
            message: `Weight version updated to ${b.new_version}`,
            new_version: b.new_version,
          }),
        );
      },
    },
    // pause_generation / continue_generation (pause-routes.ts): a body is required (FastAPI Body() of a
    // model, 422 without one); mode is a Literal, 422 literal_error naming the three otherwise.
    '/pause_generation': {
      POST: async (req, res) => {
        const body = await jsonBody(req, ctx);
        if (!body.ok || typeof body.value !== 'object' || body.value === null) {
          unprocessable(res, ctx, ['body'], 'missing', 'Field required', null);
          return;
        }
        const mode = (body.value as { mode?: unknown }).mode ?? 'abort';
        if (!isPauseMode(mode)) {
          unprocessable(
            res,
            ctx,
            ['body', 'mode'],
            'literal_error',
            "Input should be 'abort', 'retract' or 'in_place'",
            mode,
          );
          return;
        }
        ctx.pause(mode);
        ctx.send(res, 200, JSON.stringify(PAUSED_REPLY));
      },
    },
    '/continue_generation': {
      POST: async (req, res) => {
        const body = await jsonBody(req, ctx);
        if (!body.ok || typeof body.value !== 'object' || body.value === null) {
          unprocessable(res, ctx, ['body'], 'missing', 'Field required', null);
          return;
        }
        ctx.resume();
        ctx.send(res, 200, JSON.stringify(CONTINUED_REPLY));
      },
    },
    // abort_request: AbortReq {rid = "", abort_all = false} → tokenizer_manager.abort_request; 200, no
    // body. The body is required (FastAPI 422 without one); an unknown rid is ignored.
    '/abort_request': {
      POST: async (req, res) => {
        const body = await jsonBody(req, ctx);
        if (!body.ok || typeof body.value !== 'object' || body.value === null) {
          unprocessable(res, ctx, ['body'], 'missing', 'Field required', null);
          return;
        }
        const b = body.value as { rid?: unknown; abort_all?: unknown };
        if (b.abort_all === true) ctx.abortAll();
        else if (typeof b.rid === 'string' && b.rid !== '') ctx.abortIds(new Set([b.rid]));
        empty(res);
      },
    },
  };
}

const CHATML_TEMPLATE =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

function llamacppRoutes(ctx: DialectRouteContext): RouteTable {
  const o = ctx.options;
  // tools/server/server-context.cpp server_routes::init_routes get_models @fb4026604c67c682f552337ec9b91eced0abd35a:
  // an Ollama-style "models" list beside the OpenAI "data" one; owned_by "llamacpp"; meta.n_ctx_train is the
  // model's trained context, not the server's.
  const models = get(
    () => ({
      models: [
        {
          name: o.model,
          model: o.model,
          modified_at: '',
          size: '',
          digest: '',
          type: 'model',
          description: '',
          tags: [''],
          capabilities: ['completion'],
          parameters: '',
          details: {
            parent_model: '',
            format: 'gguf',
            family: '',
            families: [''],
            parameter_size: '',
            quantization_level: '',
          },
        },
      ],
      object: 'list',
      data: [
        {
          id: o.model,
          object: 'model',
          created: Math.floor(Date.now() / 1000),
          owned_by: 'llamacpp',
          meta: { vocab_type: 2, n_vocab: 151_936, n_ctx_train: N_CTX_TRAIN, n_embd: 0, n_params: 0, size: 0 },
        },
      ],
    }),
    ctx,
  );
  // get_props: the server's context per slot is default_generation_settings.n_ctx (get_slot_n_ctx).
  const props = get(
    () => ({
      default_generation_settings: {
        params: {
          n_predict: -1,
          seed: 4294967295,
          temperature: 0.8,
          top_k: 40,
          top_p: 0.95,
          min_p: 0.05,
          n_probs: 0,
          stream: false,
        },
        n_ctx: ctx.context,
      },
      total_slots: 1,
      model_alias: o.model,
      model_path: `${o.model}.gguf`,
      modalities: { vision: false, audio: false },
      endpoint_slots: true,
      endpoint_props: false,
      endpoint_metrics: false,
      webui: true,
      chat_template: CHATML_TEMPLATE,
      bos_token: '',
      eos_token: '<|im_end|>',
      build_info: LLAMACPP_BUILD_INFO,
    }),
    ctx,
  );
  return {
    // get_health: {"status": "ok"} (server-context.cpp init_routes @fb4026604c67c682f552337ec9b91eced0abd35a).
    '/health': { GET: get(() => ({ status: 'ok' }), ctx) },
    '/v1/health': { GET: get(() => ({ status: 'ok' }), ctx) },
    '/models': { GET: models },
    '/v1/models': { GET: models },
    '/props': { GET: props },
    '/v1/chat/completions': { POST: ctx.chat },
    '/chat/completions': { POST: ctx.chat },
    '/completion': { POST: ctx.tokens },
    '/completions': { POST: ctx.tokens },
  };
}

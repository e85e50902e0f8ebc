/**
 * Token-in / token-out inference client: the gateway sends prompt ids and gets completion ids and
 * their logprobs back, so no text is ever re-tokenised between the policy and the trace. The wire
 * shapes of each server (vLLM /v1/completions, SGLang /generate, llama.cpp /completion) are
 * llm/token-wire.ts, shared with the engine's `llm.api: tokens`.
 *
 * No retries here: the agent's own OpenAI client retries the gateway's 5xx, and two retry layers
 * multiply. One undici Pool per backend origin; keep-alive is what keeps the per-call cost small.
 */
import { Pool } from 'undici';
import { TRANSPORT_ERROR_CODES } from '../llm/client.ts';
import { ConfigError, serverMessage } from '../errors.ts';
import { GatewayError } from './errors.ts';
import {
  fillMissingLogprobs,
  TOKEN_WIRES,
  type GenerationResult,
  type SamplingParams,
  type SamplingRequest,
  type ReadContext,
  type TokenWireKind,
  type TopLogprob,
} from '../llm/token-wire.ts';
import type { RoutingShape } from '../llm/routing-wire.ts';
import { serverRoot } from '../llm/servers.ts';

export type BackendKind = TokenWireKind;
export const BACKEND_KINDS: readonly BackendKind[] = ['vllm', 'sglang', 'llamacpp'];
export type { GenerationResult, SamplingParams, SamplingRequest, TopLogprob };

/** A backend's defaults (the gateway's options show them as `backendTimeoutMs`, `backendConnections`). */
export const BACKEND_DEFAULTS = Object.freeze({ timeoutMs: 600_000, connections: 64 });

export interface BackendOptions {
  kind: BackendKind;
  /** Base URL of the server, e.g. `http://127.0.0.1:8000` (a trailing `/v1` is accepted for vLLM). */
  url: string;
  /** Model name sent to vLLM (`model`); null = the server's default model. */
  model?: string | null;
  apiKey?: string | null;
  /** Whole-request budget (generation included), ms. */
  timeoutMs?: number;
  connections?: number;
  /**
   * A token whose text is whole ("a" in the policy's vocabulary): llama.cpp leaves out the logprob of
   * a token ending inside a UTF-8 character, and it is computed again with this one generated after it.
   */
  completeTokenId?: number;
  /**
   * The model's routing shape, for a backend that sends routed experts without one (SGLang): what
   * `llm.routedExperts: {layers, topK}` names. Read only for a request that asks for them (`routedFrom`).
   */
  routingShape?: RoutingShape | null;
}

const SAMPLING_PARAMS = [
  'temperature',
  'topP',
  'topK',
  'minP',
  'presencePenalty',
  'frequencyPenalty',
  'repetitionPenalty',
  'seed',
  'stop',
] as const satisfies readonly (keyof SamplingParams)[];

/** The sampling settings of anything that carries them (a parsed chat request). */
export function samplingParamsOf(source: SamplingParams): SamplingParams {
  const params: SamplingParams = {};
  for (const key of SAMPLING_PARAMS) (params as Record<string, unknown>)[key] = source[key];
  return params;
}

export interface TokenBackend {
  readonly kind: BackendKind;
  /** Full URL of the generate endpoint, for messages. */
  readonly endpoint: string;
  generate(request: SamplingRequest, signal?: AbortSignal): Promise<GenerationResult>;
  close(): Promise<void>;
}

export function createTokenBackend(options: BackendOptions): TokenBackend {
  if (!BACKEND_KINDS.includes(options.kind)) {
    throw new ConfigError([
      `backend.kind: must be one of ${BACKEND_KINDS.map((k) => JSON.stringify(k)).join(', ')} (got ${JSON.stringify(options.kind)})`,
    ]);
  }
  let base: URL;
  try {
    base = new URL(options.url);
  } catch {
    throw new ConfigError([`backend.url: must be an http(s) URL (got ${JSON.stringify(options.url)})`]);
  }
  const timeoutMs = options.timeoutMs ?? BACKEND_DEFAULTS.timeoutMs;
  const prefix = serverRoot(base);
  const wire = TOKEN_WIRES[options.kind];
  const path = `${prefix}${wire.path}`;
  const endpoint = `${base.origin}${path}`;
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (options.apiKey) headers.authorization = `Bearer ${options.apiKey}`;
  const pool = new Pool(base.origin, {
    connections: options.connections ?? BACKEND_DEFAULTS.connections,
    // A non-streaming generation sends headers only when it is done: both timeouts are the request
    // budget, so no timer or composite signal is needed per call (as in llm/client.ts).
    headersTimeout: timeoutMs,
    bodyTimeout: timeoutMs,
    keepAliveTimeout: 60_000,
  });
  const model = options.model ?? null;
  const fail = (why: string) => badReply(endpoint, why);

  /** One call's JSON answer; transport failures and non-200 answers become GatewayErrors. */
  async function post(body: Record<string, unknown>, signal: AbortSignal | undefined): Promise<unknown> {
    let status: number;
    let text: string;
    try {
      const response = await pool.request({ method: 'POST', path, headers, body: JSON.stringify(body), signal });
      status = response.statusCode;
      text = await response.body.text();
    } catch (err) {
      const code = (err as { code?: string }).code ?? (err as Error).name;
      if (signal?.aborted)
        throw new GatewayError(
          'ERR_BACKEND_ABORTED',
          `backend call to ${endpoint} cancelled: ${String(signal.reason instanceof Error ? signal.reason.message : signal.reason)}`,
          { cause: err },
        );
      if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') {
        throw new GatewayError(
          'ERR_BACKEND_TIMEOUT',
          `backend ${endpoint} did not answer within ${timeoutMs} ms (backend.timeoutMs)`,
          { cause: err },
        );
      }
      const hint = TRANSPORT_ERROR_CODES.has(code) ? ' (is the backend running? check --backend-url)' : '';
      throw new GatewayError(
        'ERR_BACKEND_UNREACHABLE',
        `backend ${endpoint} unreachable: ${code} ${(err as Error).message}${hint}`,
        { cause: err },
      );
    }
    if (status !== 200) {
      // A 4xx is about the request (vLLM's own context check, a bad sampling value): the agent
      // should see it as its own error, not as a gateway fault.
      const passOn = status >= 400 && status < 500 && status !== 404 && status !== 405;
      throw new GatewayError('ERR_BACKEND_HTTP', `backend ${endpoint} answered ${status}: ${serverMessage(text)}`, {
        status: passOn ? status : 502,
        details: { backend_status: status },
      });
    }
    try {
      return JSON.parse(text);
    } catch {
      throw badReply(endpoint, `the body is not JSON: ${JSON.stringify(text.slice(0, 80))}`);
    }
  }

  return {
    kind: options.kind,
    endpoint,
    async generate(request, signal) {
      // Routed experts and sampling masks are asked for and read as the engine's token-in calls do (llm/token-chat.ts).
      const samplingMask = request.samplingMask === true;
      const context: ReadContext | undefined =
        request.routedFrom === undefined && !samplingMask
          ? undefined
          : { routedFrom: request.routedFrom ?? null, routingShape: options.routingShape ?? null, samplingMask };
      const result = wire.parse(await post(wire.body(request, model), signal), fail, context);
      if (result.missingLogprobs === undefined) return result;
      // llama.cpp leaves out the logprob of a token ending inside a UTF-8 character: computed again.
      if (options.completeTokenId === undefined)
        throw fail(
          `llama.cpp left out ${result.missingLogprobs.length} logprob(s) and no completeTokenId was given to compute them again`,
        );
      return fillMissingLogprobs(
        result,
        request.promptIds,
        options.completeTokenId,
        (body) => post(body, signal),
        fail,
      );
    },
    close: () => pool.close(),
  };
}

function badReply(endpoint: string, why: string): GatewayError {
  return new GatewayError('ERR_BACKEND_BAD_REPLY', `backend ${endpoint} reply unusable: ${why}`);
}

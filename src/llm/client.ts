/**
 * OpenAI chat-completions client for one worker thread (test/package-imports.test.ts lists the
 * modules that may import undici, and why).
 *
 * One undici Pool per inference origin, shared by every episode on the worker, and calls sent through
 * its `dispatch` with a handler of our own (llm/exchange.ts) — cheaper per call than `request()`, itself
 * several times cheaper than `fetch`; keep-alive connections are what keep the engine's own cost per
 * step small next to the HTTP round trip.
 */
import { Pool } from 'undici';
import { delay, type CancelSignal } from '../cancel.ts';
import { serverMessage } from '../errors.ts';
import type { ChatRequest } from './request.ts';
import { LlmError } from './errors.ts';
import { Exchanges, type ExchangeResult, type StreamSink } from './exchange.ts';
import { parseChatReply, type ChatResult } from './reply.ts';
import { ChatStream } from './stream-reply.ts';
import { DIALECTS, serverRoot, type ServerDialect, type ServerKind } from './servers.ts';
import { contextOverflowReply, isContextOverflow } from './context.ts';
import { TokenChat, type HistoryMode } from './token-chat.ts';
import { priorityFields } from './priority.ts';
import { samplingFields, type SamplingDialect } from './token-wire.ts';
import type { ToolParser } from './tool-calls.ts';
import type { RoutingShape } from './routing-wire.ts';
import type { ChatModel } from '../chat-model/model.ts';

export interface LlmClientOptions {
  url: string;
  model: string;
  apiKey: string | null;
  timeoutMs: number;
  /** Largest inference reply read (a whole body, or a stream's events together); over it the call fails. */
  maxReplyBytes: number;
  retries: number;
  retryBackoffMs: number;
  connections: number;
  returnTokenIds: boolean;
  logprobs: boolean;
  /** Path after `/v1` with `{session}` replaced by the session id (session-routing gateways); null = none. */
  sessionPath?: string | null;
  /**
   * True during a weight-update pause (a shared-memory read). Checked synchronously right before a
   * call is handed to the transport, and before a retry: nothing is sent while paused — the rollout
   * comes back ABORTED and continues after the resume, instead of generating during the update.
   */
  paused?: () => boolean;
  /** Told in the same tick as a call is handed to the transport (the pause broadcast's last-send clock). */
  onSend?: () => void;
  /**
   * Ask for the reply as server-sent events (`stream: true`, usage included) and read them as they
   * arrive (llm/stream-reply.ts). Replies are the same; a streamed call holds its tokens before the end.
   */
  stream?: boolean;
  /**
   * With `stream`: when `hold` aborts (a pause in abort mode), a call in flight settles at once as an
   * aborted generation with the tokens it holds, instead of waiting for the server's aborted answer.
   */
  holdOnPause?: boolean;
  /** The pause gate's hold signal (worker/pause-gate.ts), read per call: a fresh one after each resume. */
  hold?: () => CancelSignal;
  /** Told once per client of a reply that lacks what was asked for (token ids, logprobs): the worker logs it. */
  warn?: (message: string) => void;
  /** The server's dialect and context length, as probed at start (llm/servers.ts); default: generic, unknown. */
  server?: { kind: ServerKind; contextLength: number | null };
  /**
   * `chat` (default): OpenAI chat completions. `tokens`: the conversation is rendered and tokenized
   * here (`chatModel`) and sent as ids to the dialect's token-in route (llm/token-chat.ts).
   */
  api?: 'chat' | 'tokens';
  /** With `api: tokens`: the format tool calls are read from the text in (llm/tool-calls.ts); default hermes. */
  toolParser?: ToolParser;
  /** The policy's tokenizer and chat template, for `api: tokens` (loaded once per worker). */
  chatModel?: () => Promise<ChatModel>;
  /** `llm.routedExperts`: keep routed experts, shaped by `shape` where the server sends none (SGLang); null = not asked. */
  routedExperts?: { shape: RoutingShape | null } | null;
  /** `llm.samplingMasks`: ask for each token's sampling support (SGLang /generate). */
  samplingMasks?: boolean;
  /** With `api: tokens`: a turn whose chat template rewrote the history keeps the sampled ids or splits (llm/token-chat.ts). */
  historyMode?: HistoryMode;
}

/**
 * The OpenAI chat-completions request body for `request` (the object; each attempt serialises it).
 * `ids`: the dialect's fields asking for token ids (llm/servers.ts); default vLLM's `return_token_ids`.
 * `sampling`: whose names and neutral values the sampling fields take (llm/token-wire.ts samplingFields).
 */
export function chatPayload(
  options: Pick<LlmClientOptions, 'model' | 'logprobs' | 'returnTokenIds' | 'stream'>,
  request: ChatRequest,
  ids: Record<string, unknown> | null = VLLM_IDS,
  sampling: SamplingDialect = 'vllm',
  priority: ServerDialect['priority'] = null,
): object {
  const continuing = request.continueFrom !== undefined;
  return {
    model: options.model,
    messages: continuing
      ? [...request.messages, { role: 'assistant', content: request.continueFrom }]
      : request.messages,
    max_tokens: request.maxTokens,
    ...samplingFields(sampling, { ...request.sampling, temperature: request.temperature, seed: request.seed }),
    ...(request.tools !== undefined && request.tools.length > 0
      ? { tools: request.tools, tool_choice: request.toolChoice ?? 'auto' }
      : {}),
    ...(continuing ? { continue_final_message: true, add_generation_prompt: false } : {}),
    ...(options.logprobs ? { logprobs: true } : {}),
    ...(options.returnTokenIds && ids !== null ? ids : {}),
    ...(options.stream ? { stream: true, stream_options: { include_usage: true } } : {}),
    ...priorityFields({ priority }, request.urgency),
  };
}

const VLLM_IDS = { return_token_ids: true };

/** How one attempt ended: the reply, or why not and whether another attempt may do better. */
type Outcome<T = ChatResult> =
  | { ok: true; result: T }
  | { ok: false; error: LlmError; retryable: boolean; retryAfterMs?: number };

/** How the answer to one kind of call is read (chat, or a token-in route): plain functions, no closure per call. */
interface CallReader<T> {
  /** A 200 answer's JSON → the result (throws LlmError for a bad reply). */
  parse(json: unknown): T;
  /** A 4xx the call should not fail on (a context overflow ends the episode as truncated); null = none. */
  onClientError?(status: number, text: string): T | null;
  /** Told of each result before it is returned (what a reply lacked that was asked for). */
  check?(result: T): void;
}

const utf8 = new TextEncoder();
/** Retry-After is honoured up to this bound: a server asking for minutes should fail the rollout instead. */
const MAX_RETRY_AFTER_MS = 30_000;
/** undici / socket error codes of a request that failed in transport (worth a retry, or a hint to check the URL). */
export const TRANSPORT_ERROR_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'EPIPE',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'UND_ERR_SOCKET',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_CLOSED',
]);

export class LlmClient {
  readonly #options: LlmClientOptions;
  readonly #pool: Pool;
  /** `…/v1`: the chat path is this + optional session path + `/chat/completions`. */
  readonly #v1: string;
  readonly #origin: string;
  readonly #headers: Record<string, string>;
  readonly #exchanges: Exchanges;
  /** What a reply lacked that was asked for, already warned of (once per client, not per call). */
  readonly #warned = new Set<string>();
  readonly #dialect: ServerDialect;
  /** Chat replies read by this client's dialect (see #chatReader). */
  readonly #chatReader: CallReader<ChatResult>;
  /** `api: tokens`: the conversations, as token sequences (null in chat mode). */
  readonly #tokens: TokenChat | null;

  constructor(options: LlmClientOptions) {
    this.#options = options;
    this.#dialect = DIALECTS[options.server?.kind ?? 'generic'];
    const chatWants = { routedExperts: options.routedExperts != null };
    this.#chatReader = {
      parse: (json) => parseChatReply(json, chatWants),
      onClientError: (status, text) => (isContextOverflow(status, text) ? contextOverflowReply(text) : null),
      check: (result) => this.#checkAsked(result),
    };
    this.#tokens =
      options.api === 'tokens'
        ? new TokenChat(this.#dialect, options, (path, payload, reader, signal, stream) =>
            this.#call(path, payload, reader, signal, stream),
          )
        : null;
    this.#exchanges = new Exchanges({
      limits: { maxBodyBytes: options.maxReplyBytes, wholeBodyMs: options.timeoutMs },
    });
    const url = new URL(options.url);
    this.#origin = url.origin;
    this.#v1 = v1Path(url.pathname);
    this.#headers = { 'content-type': 'application/json' };
    if (options.apiKey) this.#headers.authorization = `Bearer ${options.apiKey}`;
    this.#pool = new Pool(url.origin, {
      connections: options.connections,
      // A non-streaming completion sends its headers only once generation is done: the headers timeout
      // is the request budget, the body timeout cuts a stalled body, and the exchange cuts a body still
      // arriving after the budget (llm/exchange.ts) — no per-call timer. A streamed one is bounded the
      // same way until its first event, then between events; any reply by llm.maxReplyBytes.
      headersTimeout: options.timeoutMs,
      bodyTimeout: options.timeoutMs,
      keepAliveTimeout: 60_000,
    });
  }

  get url(): string {
    return `${this.#origin}${this.#v1}/chat/completions`;
  }

  #chatPath(sessionId: string | undefined): string {
    const template = this.#options.sessionPath;
    if (!template || sessionId === undefined) return `${this.#v1}/chat/completions`;
    return `${this.#v1}${template.replaceAll('{session}', encodeURIComponent(sessionId))}/chat/completions`;
  }

  /**
   * One chat completion, retried on 429 / 5xx / transport errors with exponential backoff.
   * `signal` cancels it (pause, shutdown): the rejection is then an ERR_LLM_ABORTED LlmError.
   * With `api: tokens` the conversation goes out as token ids instead (llm/token-chat.ts), its
   * sequence kept under `conversation` (one per agent of a multi-agent episode; default `sessionId`).
   */
  chat(request: ChatRequest, signal?: CancelSignal, sessionId?: string, conversation = sessionId): Promise<ChatResult> {
    if (this.#tokens !== null) return this.#tokens.chat(request, signal, conversation);
    // The payload object, not its JSON: each attempt serialises it again (retries are rare), so no
    // string or buffer of the body stays alive while the call waits for its answer.
    const payload = chatPayload(
      this.#options,
      request,
      this.#dialect.chatIdFields(this.#options.stream === true),
      this.#dialect.sampling,
      this.#dialect.priority,
    );
    return this.#call(
      this.#chatPath(sessionId),
      payload,
      this.#chatReader,
      signal,
      this.#options.stream === true ? this.#chatStream : null,
    );
  }

  /** A fresh reader per attempt: a retry reads its own stream from the start. */
  readonly #chatStream = (): ChatStream =>
    new ChatStream({
      tokenIds: this.#options.returnTokenIds && this.#dialect.chatResponseIds,
      logprobs: this.#options.logprobs,
    });

  /** The episode is over: what `api: tokens` holds of its conversation is let go. */
  endSession(conversation: string): void {
    this.#tokens?.forget(conversation);
  }

  /** `api: tokens`: conversations whose token sequence this client keeps for their next turn. */
  get conversationsHeld(): number {
    return this.#tokens?.sessionsHeld ?? 0;
  }

  /**
   * One call with retries. The exchange is awaited here, in the one async frame of a call: every call
   * in flight holds its suspended frames until the answer (heap snapshot of the memory bench: ≈0.5–0.8
   * KB per frame), so the reading of an answer is plain functions (`#outcomeOf`, `#transportOutcome`)
   * instead of an awaited helper.
   */
  async #call<T>(
    path: string,
    payload: object,
    reader: CallReader<T>,
    signal: CancelSignal | undefined,
    stream: (() => StreamSink<T>) | null,
  ): Promise<T> {
    const attempts = this.#options.retries + 1;
    let lastError: LlmError | null = null;
    for (let attempt = 1; ; attempt++) {
      // Between the agent loop's step-boundary check and here there are awaits (environment, hooks, a
      // call slot, a retry's backoff): this check, in the same tick as the send, is what makes
      // "stopped issuing" immediate — for a first attempt and a retry alike.
      if (this.#options.paused?.()) {
        throw new LlmError(
          'ERR_LLM_ABORTED',
          lastError === null
            ? 'inference call not sent: paused for a weight update'
            : `not retried while paused for a weight update (after: ${lastError.message})`,
        );
      }
      // The request budget is enforced by the pool's headers and body timeouts (both llm.timeoutMs): a
      // timer and a composite signal per call cost more than the rest of the client's work per step.
      // Only the exchange is in the try: what the answer means is read after it (#outcomeOf), so a
      // fault there is not mistaken for a transport error.
      let response: ExchangeResult | null = null;
      let failure: unknown = null;
      const events = stream?.() ?? undefined;
      try {
        this.#options.onSend?.();
        response = await this.#exchanges.run(
          this.#pool,
          this.#origin,
          // Bytes of their own, not a string: undici keeps the body referenced until the answer arrives,
          // and copies a string into shared 8 KiB Buffer pool slabs, which a few live bodies pin whole.
          { method: 'POST', path, headers: this.#headers, body: utf8.encode(JSON.stringify(payload)), events },
          signal,
          events !== undefined && this.#options.holdOnPause ? this.#options.hold?.() : undefined,
        );
      } catch (err) {
        if (signal?.aborted) throw aborted(signal);
        failure = err;
      }
      const outcome = response !== null ? this.#outcomeOf(response, events, reader) : this.#transportOutcome(failure);
      if (outcome.ok) {
        reader.check?.(outcome.result);
        return outcome.result;
      }
      if (!outcome.retryable || attempt >= attempts) throw outcome.error;
      lastError = outcome.error;
      if (this.#options.paused?.()) continue; // refused at the top of the loop at once, not after a backoff
      const backoff = outcome.retryAfterMs ?? this.#options.retryBackoffMs * 2 ** (attempt - 1);
      try {
        await delay(backoff, signal);
      } catch {
        throw aborted(signal);
      }
    }
  }

  /**
   * A server that ignores `return_token_ids` / `logprobs` answers with text only: the turns are then
   * kept without token ids or logprobs, which a trainer cannot train on — said once, not per call.
   */
  #checkAsked(result: ChatResult): void {
    // An aborted call may have no tokens at all; a call refused for the context has none.
    if (result.finishReason === 'abort' || result.contextExceeded !== undefined) return;
    // What the dialect is known not to send was said once at start (llm/servers.ts serverGaps).
    if (this.#options.returnTokenIds && result.responseIds === null && this.#dialect.chatResponseIds) {
      this.#warnOnce('token ids', `llm.returnTokenIds (they need ${this.#dialect.chatIdsFrom})`);
    }
    if (this.#options.logprobs && result.logprobs === null)
      this.#warnOnce('logprobs', 'llm.logprobs (choices[0].logprobs.content)');
    if (this.#options.routedExperts != null && result.routedExperts === undefined && result.responseIds !== null)
      this.#warnOnce(
        'routed experts',
        'llm.routedExperts (choices[0].routed_experts: vLLM launched with --enable-return-routed-experts; SGLang needs llm.api: tokens)',
      );
  }

  #warnOnce(what: string, asked: string): void {
    if (this.#warned.has(what)) return;
    this.#warned.add(what);
    this.#options.warn?.(
      `${this.url} answers without ${what} though ${asked} asks for them: its turns are kept without them (said once)`,
    );
  }

  /** A request that got no answer (timeouts, transport errors; not a cancellation). */
  #transportOutcome(err: unknown): Outcome<never> {
    // The exchange cut an answer over its limits (size, or a body past the budget): not worth a retry.
    if (err instanceof LlmError) return { ok: false, retryable: false, error: err };
    const code = (err as { code?: string }).code;
    if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') {
      return {
        ok: false,
        retryable: false,
        error: new LlmError(
          'ERR_LLM_TIMEOUT',
          `inference request to ${this.url} timed out after ${this.#options.timeoutMs} ms (llm.timeoutMs)`,
          { cause: err },
        ),
      };
    }
    return {
      ok: false,
      retryable: TRANSPORT_ERROR_CODES.has(code ?? 'unknown'),
      error: new LlmError(
        'ERR_LLM_UNREACHABLE',
        `inference server ${this.url} unreachable: ${code ?? 'unknown'} ${(err as Error).message}`,
        { cause: err },
      ),
    };
  }

  /** What an answer means: the parsed reply, or an error (retryable for 429 and 5xx). */
  #outcomeOf<T>(response: ExchangeResult, events: StreamSink<T> | undefined, reader: CallReader<T>): Outcome<T> {
    const { statusCode, text } = response;
    // Held by a pause: the tokens that have arrived are the partial generation, whatever the answer was to be.
    if (response.held && events !== undefined) return this.#replyOutcome(heldReply, events);
    if (statusCode >= 400 && statusCode < 500 && reader.onClientError !== undefined) {
      const result = reader.onClientError(statusCode, text);
      if (result !== null) return { ok: true, result };
    }
    if (statusCode !== 200) {
      return {
        ok: false,
        retryable: statusCode === 429 || statusCode >= 500,
        retryAfterMs: statusCode === 429 ? parseRetryAfter(response.headers['retry-after']) : undefined,
        error: new LlmError('ERR_LLM_HTTP', `inference server answered ${statusCode}: ${serverMessage(text)}`, {
          status: statusCode,
        }),
      };
    }
    if (response.streamed && events !== undefined) return this.#replyOutcome(streamedReply, events);
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      return {
        ok: false,
        retryable: false,
        error: new LlmError('ERR_LLM_BAD_REPLY', `inference reply is not JSON: ${JSON.stringify(text.slice(0, 80))}`),
      };
    }
    return this.#replyOutcome(reader.parse, json);
  }

  /** The reply `read` makes of `input`, or the LlmError it throws (a bad reply is not retried). No closure per call. */
  #replyOutcome<I, T>(read: (input: I) => T, input: I): Outcome<T> {
    try {
      return { ok: true, result: read(input) };
    } catch (err) {
      return { ok: false, retryable: false, error: err as LlmError };
    }
  }

  async close(): Promise<void> {
    await this.#pool.close();
  }
}

const heldReply = <T>(events: StreamSink<T>): T => events.held();
const streamedReply = <T>(events: StreamSink<T>): T => events.result();

/** Whether a control route's status (null: no answer) says the server did what was asked. */
export const answeredOk = (status: number | null): boolean => status !== null && status >= 200 && status < 300;

/** A control route of an inference server: abort-all, or an in-place pause and its continue (llm/servers.ts). */
export interface ServerRoute {
  path: string;
  /**
   * JSON body: SGLang `{"abort_all":true}`, vLLM `{}`, SGLang's pause `{"mode":"in_place"}`; '' = none
   * (vLLM's pause and resume).
   */
  body: string;
}

export interface ServerRouteTarget {
  url: string;
  route: ServerRoute;
}

/**
 * Sends inference servers the requests a pause makes of them: abort every request in flight (SGLang's
 * `POST /abort_request {"abort_all": true}`, vLLM's dev-mode `POST /abort_requests {}`, the mock's
 * alias of `/admin/abort`: answered at once with finish reason `abort` and the tokens generated so
 * far), or pause generation in place and continue it (SGLang's `/pause_generation`,
 * `/continue_generation`; vLLM's dev-mode `/pause?mode=keep`, `/resume`).
 *
 * One keep-alive connection per server, opened on first use and kept: a pause is on the critical path
 * of a weight update, and a fresh TCP connection per pause would add its handshake to every one.
 */
export class ServerControlClient {
  readonly #headers: Record<string, string>;
  readonly #timeoutMs: number;
  /** Per endpoint URL: its connection, and the path prefix its routes go under (routers, gateways). */
  readonly #pools = new Map<string, { pool: Pool; prefix: string }>();

  constructor(options: { apiKey?: string | null; timeoutMs?: number } = {}) {
    this.#timeoutMs = options.timeoutMs ?? 2_000;
    this.#headers = {
      'content-type': 'application/json',
      ...(options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {}),
    };
  }

  /** POSTs each target's route; resolves true when every server answered 2xx, false when any did not or failed. */
  async postAll(targets: readonly ServerRouteTarget[]): Promise<boolean> {
    return (await this.postEach(targets)).every(answeredOk);
  }

  /** POSTs each target's route; resolves to each server's status, null where none came (failed, timed out). */
  postEach(targets: readonly ServerRouteTarget[]): Promise<(number | null)[]> {
    return Promise.all(targets.map((t) => this.#post(t)));
  }

  async close(): Promise<void> {
    const pools = [...this.#pools.values()];
    this.#pools.clear();
    await Promise.all(pools.map((p) => p.pool.close()));
  }

  async #post({ url, route }: ServerRouteTarget): Promise<number | null> {
    try {
      let target = this.#pools.get(url);
      if (target === undefined) {
        const base = new URL(url);
        target = {
          pool: new Pool(base.origin, { connections: 1, keepAliveTimeout: 600_000 }),
          prefix: serverRoot(base),
        };
        this.#pools.set(url, target);
      }
      const response = await target.pool.request({
        method: 'POST',
        path: `${target.prefix}${route.path}`,
        headers: this.#headers,
        body: route.body,
        signal: AbortSignal.timeout(this.#timeoutMs),
      });
      await response.body.dump();
      return response.statusCode;
    } catch {
      return null;
    }
  }
}

/** `http://h` and `http://h/v1` (OpenAI SDK style) both mean `/v1`; other prefixes are kept (routers, gateways). */
function v1Path(pathname: string): string {
  const base = pathname.replace(/\/+$/, '');
  return base.endsWith('/v1') ? base : `${base}/v1`;
}

function parseRetryAfter(value: string | string[] | undefined): number | undefined {
  const text = Array.isArray(value) ? value[0] : value;
  if (text === undefined) return undefined;
  const seconds = Number(text);
  const ms = Number.isFinite(seconds) ? seconds * 1000 : Date.parse(text) - Date.now();
  return Number.isFinite(ms) ? Math.min(Math.max(ms, 0), MAX_RETRY_AFTER_MS) : undefined;
}

function aborted(signal: CancelSignal | undefined): LlmError {
  const reason = signal?.reason instanceof Error ? signal.reason.message : String(signal?.reason ?? 'aborted');
  return new LlmError('ERR_LLM_ABORTED', `inference request cancelled: ${reason}`);
}

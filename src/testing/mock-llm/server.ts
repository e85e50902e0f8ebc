/**
 * The mock inference server: OpenAI-compatible chat completions on node:http, with the vLLM/SGLang
 * extras an RL engine relies on (token ids, logprobs, abort, weight version, and per-request `seed`
 * with `continue_final_message` for partial rollouts; replies whole or streamed as server-sent events,
 * stream.ts), and vLLM's token-in `/v1/completions` for
 * clients that tokenize themselves (the token-trace gateway; see vocab.ts for the vocabulary option).
 * Shipped for the demo run, tests, load tests and benchmarks, so the per-request path stays cheap:
 * one JSON.parse, cached tokenisation, timers for latency (never busy-waiting), one JSON.stringify.
 *
 * Option `dialect` swaps the routes and reply shapes for one real server's (vLLM, SGLang or
 * llama.cpp; dialects.ts, dialect-routes.ts, dialect-stream.ts): those paths are separate functions,
 * so the default one stays as it was.
 *
 * Fault injection for reliability tests (options.ts): per-request rates of 500s, 429s with
 * `Retry-After: 0`, connection resets, hangs, non-JSON bodies and bodies cut short, drawn from the seed
 * and the request's arrival index, so a sequential client sees the same faults on every run.
 */
import { createServer } from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { createRng, mixSeeds } from '../../env/synthetic/rng.ts';
import { DIALECT_DEFAULT_CONTEXT, MOCK_FAULTS, MOCK_LLM_DEFAULTS, resolveMockLlmOptions, validateWeightVersion } from './options.ts';
import type { MockFaultOption, MockLlmOptions, ResolvedMockLlmOptions } from './options.ts';
import { badRequest, checkContext, llamacppChatJson, llamacppCompletionJson, parseGenerateRequest, parseLlamaCompletionRequest, sglangChatJson, sglangGenerateJson, sglangOpenAiError, unknownRoute, vllmChatJson, vllmError, wantsAlternatives } from './dialects.ts';
import type { Dialect, DialectError, TokenInRequest } from './dialects.ts';
import { DialectStream } from './dialect-stream.ts';
import { dialectRoutes } from './dialect-routes.ts';
import { generateCompletion } from './policy.ts';
import { RequestError, parseChatRequest } from './request.ts';
import type { MockChatRequest } from './request.ts';
import { parseTokenCompletionRequest, textCompletionJson } from './completions.ts';
import type { TokenCompletionRequest } from './completions.ts';
import { completionJson, logprobDraws } from './response.ts';
import { CompletionStream } from './stream.ts';
import { decodeIds, encodeText, END_OF_TURN_ID, promptTokenIds, rememberEncoding } from './tokens.ts';
import { loadVocabulary, parseChatMl } from './vocab.ts';
import { listen, readRequestBody, type BodyErrors } from '../../http-server.ts';

export { MOCK_LLM_DEFAULTS };
export type { MockLlmOptions, ResolvedMockLlmOptions };

export interface MockLlmStats {
  /** Chat completion requests received (valid or not). */
  requests: number;
  /** Completions currently being "generated". */
  inFlight: number;
  promptTokens: number;
  /** Completion tokens returned, partial ones of aborted requests included. */
  completionTokens: number;
  /** Completions answered early with finish_reason abort (abort endpoint, abortAll, close). */
  aborted: number;
  /** Completions whose client went away before the answer. */
  cancelled: number;
  /** Requests answered 500 by `errorRate` (also counted in `faults.error`). */
  errorsInjected: number;
  /** Injected faults by kind (see the rate options): every request that drew one. */
  faults: Record<MockFault, number>;
  /** Requests held unanswered by `hangRate` right now. */
  hanging: number;
  /** Requests answered 4xx (bad body, unknown route, too large). */
  rejected: number;
}

export interface MockLlm {
  /** Base URL without a trailing slash, e.g. `http://127.0.0.1:43567` (append `/v1/...`). */
  readonly url: string;
  readonly port: number;
  readonly options: ResolvedMockLlmOptions;
  /**
   * Reported in `metadata.weight_version` of completions that start from now on. The string-versioned
   * dialects report `reportedWeightVersion` instead; this is the last integer version set (0 if none).
   */
  readonly weightVersion: number;
  /** The version as the dialect reports it: the number (default dialect), or the string (SGLang, vLLM). */
  readonly reportedWeightVersion: number | string;
  setWeightVersion(version: number): void;
  /** Answers every in-flight completion now with finish_reason abort; returns how many. */
  abortAll(): number;
  stats(): MockLlmStats;
  /** Resolves once at least `count` completions are in flight (for tests and load shaping; no polling). */
  waitForInFlight(count: number): Promise<void>;
  /** Resolves once at least `count` generation requests have arrived since the start (stats().requests). */
  waitForRequests(count: number): Promise<void>;
  /**
   * Resolves once `test(stats())` holds: checked now, and again whenever a request arrives, starts or
   * stops generating (answered, aborted or cancelled by its client), or is held or released by `hangRate`.
   */
  waitForStats(test: (stats: MockLlmStats) => boolean): Promise<void>;
  /** Aborts in-flight completions, then closes every connection. Idempotent; never hangs. */
  close(): Promise<void>;
}

type NaturalFinish = 'stop' | 'length';

/** The kinds of injected faults, one per rate option. */
export type MockFault = 'error' | 'rateLimit' | 'reset' | 'hang' | 'malformed' | 'truncate';
const FAULT_OF: Record<MockFaultOption, MockFault> = {
  errorRate: 'error',
  rateLimitRate: 'rateLimit',
  resetRate: 'reset',
  hangRate: 'hang',
  malformedRate: 'malformed',
  truncateRate: 'truncate',
};
/** Faults that spoil the generated reply (after the usual generation time) instead of answering at once. */
type ReplyFault = 'malformed' | 'truncate';

interface InFlight {
  /** The request id a client can abort it by (the dialects' abort routes); '' when not addressable. */
  rid: string;
  timer: NodeJS.Timeout;
  /** A streamed completion: sends the tokens generated since its last event (on the stream ticker). */
  progress: (() => void) | null;
  /** Answers the request with its first `count` tokens. */
  finish(reason: NaturalFinish | 'abort', count: number): void;
  /** How many tokens would have been generated by now (for an abort). */
  generatedSoFar(): number;
}

/** Sub-stream of the server seed, so fault injection never perturbs the policy's choices. */
const ERROR_STREAM = 0xe7707;

/** Longer than undici's default client keep-alive, so the server never closes a socket a client is about to reuse. */
const KEEP_ALIVE_MS = 30_000;
/** How long close() waits for requests still being uploaded before cutting their connections. */
const CLOSE_GRACE_MS = 200;

class BodyTooLarge extends Error {}

const bodyErrors: BodyErrors = { tooLarge: (message) => new BodyTooLarge(message), aborted: (message) => new Error(message) };

async function readBody(req: IncomingMessage, limit: number): Promise<string> {
  return (await readRequestBody(req, limit, bodyErrors)).toString('utf8');
}

function sendJson(res: ServerResponse, status: number, body: unknown, headers?: Record<string, string>): void {
  sendText(res, status, JSON.stringify(body), headers);
}

function sendText(res: ServerResponse, status: number, text: string, headers?: Record<string, string>): void {
  if (res.headersSent || res.destroyed) return;
  res.writeHead(status, {
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(text),
    ...headers,
  });
  res.end(text);
}

/** Promises that resolve once `current()` reaches a count (waitForInFlight, waitForRequests); `notify` after each change. */
function countWaiters(current: () => number): { wait(count: number): Promise<void>; notify(): void } {
  const waiting: { count: number; resolve: () => void }[] = [];
  return {
    wait(count) {
      if (current() >= count) return Promise.resolve();
      return new Promise((resolve) => waiting.push({ count, resolve }));
    },
    notify() {
      for (let i = waiting.length - 1; i >= 0; i--) if (current() >= waiting[i].count) waiting.splice(i, 1)[0].resolve();
    },
  };
}

function errorBody(message: string, type: string, param: string | null = null) {
  return { error: { message, type, param, code: null } };
}

function startsWith(ids: readonly number[], prefix: readonly number[]): boolean {
  if (prefix.length > ids.length) return false;
  for (let i = 0; i < prefix.length; i++) if (ids[i] !== prefix[i]) return false;
  return true;
}

function hostForUrl(host: string): string {
  if (host === '0.0.0.0') return '127.0.0.1';
  if (host === '::') return '[::1]';
  return host.includes(':') ? `[${host}]` : host;
}

export async function startMockLlm(options: MockLlmOptions = {}): Promise<MockLlm> {
  const opts = resolveMockLlmOptions(options);
  const vocab = await loadVocabulary(opts.tokenizer);
  const policy = { seed: opts.seed, mistakeRate: opts.mistakeRate, thinkTokens: opts.thinkTokens };
  const inFlight = new Set<InFlight>();
  const counters = { requests: 0, promptTokens: 0, completionTokens: 0, aborted: 0, cancelled: 0, errorsInjected: 0, rejected: 0 };
  const faultCounts: Record<MockFault, number> = { error: 0, rateLimit: 0, reset: 0, hang: 0, malformed: 0, truncate: 0 };
  const anyFault = MOCK_FAULTS.some((name) => opts[name] > 0);
  /** Requests held by `hangRate`: released only by the client hanging up or close(). */
  const hung = new Set<ServerResponse>();
  const dialect: Dialect | null = opts.dialect === 'default' ? null : opts.dialect;
  const context = opts.contextLength ?? DIALECT_DEFAULT_CONTEXT;
  // The default dialect's version is an integer; SGLang's (and vLLM's dev-mode one) is a string label.
  let weightVersion = typeof opts.weightVersion === 'number' ? opts.weightVersion : /^\d+$/.test(opts.weightVersion) ? Number(opts.weightVersion) : 0;
  let versionLabel = String(opts.weightVersion);
  let requestIndex = 0;
  let closing = false;

  const reject = (res: ServerResponse, status: number, message: string, param: string | null = null, headers?: Record<string, string>): void => {
    counters.rejected += 1;
    sendJson(res, status, errorBody(message, 'invalid_request_error', param), headers);
  };

  const inFlightReached = countWaiters(() => inFlight.size);
  const requestsReached = countWaiters(() => counters.requests);
  const stats = (): MockLlmStats => ({ ...counters, faults: { ...faultCounts }, hanging: hung.size, inFlight: inFlight.size });
  const statsWaiters = new Set<{ test: (stats: MockLlmStats) => boolean; resolve: () => void }>();
  /** Call after every change waitForStats promises to re-check on. */
  const statsChanged = (): void => {
    if (statsWaiters.size === 0) return;
    const now = stats();
    for (const waiter of [...statsWaiters]) if (waiter.test(now)) (statsWaiters.delete(waiter), waiter.resolve());
  };

  function abortAll(): number {
    let n = 0;
    for (const entry of [...inFlight]) {
      entry.finish('abort', entry.generatedSoFar());
      n += 1;
    }
    counters.aborted += n;
    return n;
  }

  /** Aborts the in-flight completions whose request id is in `rids`; returns how many. */
  function abortIds(rids: ReadonlySet<string>): number {
    let n = 0;
    for (const entry of [...inFlight]) {
      if (!rids.has(entry.rid)) continue;
      entry.finish('abort', entry.generatedSoFar());
      n += 1;
    }
    counters.aborted += n;
    return n;
  }

  function sendDialectError(res: ServerResponse, error: DialectError): void {
    counters.rejected += 1;
    sendText(res, error.status, error.body);
  }

  /**
   * Streamed completions in flight, and the one timer that sends their new tokens every
   * streamIntervalMs (one timer for all of them: a timer per stream costs the mock more than its events).
   */
  const streaming = new Set<InFlight>();
  let streamTicker: NodeJS.Timeout | null = null;
  function startStreaming(entry: InFlight): void {
    streaming.add(entry);
    streamTicker ??= setInterval(() => {
      if (streaming.size === 0) {
        clearInterval(streamTicker!);
        streamTicker = null;
        return;
      }
      for (const e of streaming) e.progress!();
    }, opts.streamIntervalMs);
  }

  function complete(res: ServerResponse, request: MockChatRequest): void {
    const index = requestIndex++;
    const fault = injectFault(res, index);
    if (fault === 'answered') return;
    const messages = request.messages;
    // A continuation is the completion of the conversation without the partial assistant message,
    // minus the tokens that message already holds: under the same request seed, partial + continuation
    // equals the uninterrupted completion exactly.
    const partial = request.continueFinalMessage ? messages[messages.length - 1].content : null;
    const completion = generateCompletion(partial === null ? messages : messages.slice(0, -1), policy, index, request.seed);
    let skip = 0;
    let extendsCompletion = true;
    if (partial !== null) {
      const partialIds = encodeText(partial);
      // Best effort when the partial message is not a prefix (another seed, an edited or foreign
      // text): skip as many tokens as it has, so the reply still has roughly the remaining length.
      extendsCompletion = startsWith(completion.ids, partialIds);
      skip = Math.min(partialIds.length, completion.ids.length);
    }
    let ids = skip > 0 ? completion.ids.slice(skip) : completion.ids;
    const fullLength = ids.length;
    let natural: NaturalFinish = 'stop';
    if (request.maxTokens !== null && ids.length > request.maxTokens) {
      ids = ids.slice(0, request.maxTokens);
      natural = 'length';
    } else if (extendsCompletion) {
      // The next turn re-sends partial + continuation = completion.text.
      rememberEncoding(completion.text, completion.ids);
    }
    // Exact whenever extendsCompletion: the skipped ids decode to `partial`, a whole-character prefix.
    const fullText = partial === null ? completion.text : extendsCompletion ? completion.text.slice(partial.length) : null;
    const promptIds = promptTokenIds(messages, partial !== null ? 'continue' : request.addGenerationPrompt ? 'generation' : 'closed');
    // The version that "generated" the reply: the one current when generation started.
    const version = weightVersion;

    const contentOf = (out: readonly number[]): string => (out.length === fullLength && fullText !== null ? fullText : decodeIds(out));
    if (request.stream) {
      const stream = new CompletionStream(res, {
        index,
        model: opts.model,
        promptIds,
        weightVersion: version,
        logprobs: request.logprobs,
        returnTokenIds: request.returnTokenIds,
        includeUsage: request.includeUsage,
        seed: opts.seed,
        requestSeed: request.seed,
        offset: skip,
      });
      schedule(res, ids, promptIds.length, natural, (reason, out) => stream.finish(reason, out, contentOf(out), fault), (n) => stream.progress(ids, n));
      return;
    }
    const respond = (reason: NaturalFinish | 'abort', out: readonly number[]): void => {
      const json = completionJson({
        index,
        model: opts.model,
        content: contentOf(out),
        finishReason: reason,
        ids: out,
        promptIds,
        weightVersion: version,
        logprobs: request.logprobs,
        returnTokenIds: request.returnTokenIds,
        seed: opts.seed,
        requestSeed: request.seed,
        offset: skip,
      });
      deliver(res, json, fault);
    };

    schedule(res, ids, promptIds.length, natural, respond);
  }

  /**
   * Calls `answer` with the ids generated by then once the simulated generation of `ids` is done: at
   * once without latency, else on a timer, as an in-flight entry that abortAll() / a client hang-up
   * can cut short (an abort answers with the prefix generated so far).
   */
  function schedule(
    res: ServerResponse,
    ids: readonly number[],
    promptTokens: number,
    natural: NaturalFinish,
    answer: (reason: NaturalFinish | 'abort', out: readonly number[]) => void,
    progress: ((n: number) => void) | null = null,
    rid = '',
  ): void {
    const count = ids.length;
    // The tokens "generated" by the time of the answer (all, or an abort's prefix), counted once here.
    const respond = (reason: NaturalFinish | 'abort', n: number): void => {
      const out = n >= count ? ids : ids.slice(0, n);
      counters.promptTokens += promptTokens;
      counters.completionTokens += out.length;
      answer(reason, out);
    };
    const startedAt = performance.now();
    const generationMs = opts.tokensPerSecond > 0 ? (count / opts.tokensPerSecond) * 1000 : 0;
    const totalMs = opts.latencyMs + generationMs;
    if (totalMs <= 0) {
      respond(natural, count);
      return;
    }
    const entry: InFlight = {
      rid,
      timer: setTimeout(() => entry.finish(natural, count), totalMs),
      // Events start with the first token, after the latency (vLLM sends its role chunk with it).
      progress: progress && (() => {
        if (performance.now() - startedAt >= opts.latencyMs) progress(entry.generatedSoFar());
      }),
      finish(reason, n) {
        if (!inFlight.delete(entry)) return;
        clearTimeout(entry.timer);
        streaming.delete(entry);
        respond(reason, n);
        statsChanged();
      },
      generatedSoFar() {
        const elapsed = performance.now() - startedAt - opts.latencyMs;
        if (elapsed < 0) return 0;
        if (opts.tokensPerSecond === 0) return count;
        return Math.min(count, Math.floor((elapsed / 1000) * opts.tokensPerSecond));
      },
    };
    inFlight.add(entry);
    if (entry.progress !== null) startStreaming(entry);
    res.once('close', () => {
      // Client gone before the answer: stop "generating" so timers and stats do not leak.
      streaming.delete(entry);
      if (inFlight.delete(entry)) {
        clearTimeout(entry.timer);
        counters.cancelled += 1;
        // The client half-closed: nothing will ever be read, and an unanswered response would keep
        // the server side of the socket open forever.
        res.destroy();
        statsChanged();
      }
    });
    inFlightReached.notify();
    statsChanged();
  }

  /**
   * The fault request `index` draws, if any: one die from (seed, index), the rates laid out as bands in
   * MOCK_FAULTS order (errorRate first, so runs that only set it fault exactly the requests they did
   * before the other knobs existed). Faults follow the request counter even for seeded requests: a
   * retry with the same seed must be able to succeed.
   */
  function drawFault(index: number): MockFault | null {
    if (!anyFault) return null;
    const u = createRng(mixSeeds(opts.seed, index, ERROR_STREAM)).next();
    let edge = 0;
    for (const name of MOCK_FAULTS) {
      edge += opts[name];
      if (u < edge) return FAULT_OF[name];
    }
    return null;
  }

  /**
   * Applies the faults that replace the answer: 'answered' when the request is dealt with (answered,
   * reset or held). A reply fault is returned for `deliver` to apply to the generated reply; null = none.
   */
  function injectFault(res: ServerResponse, index: number): 'answered' | ReplyFault | null {
    const fault = drawFault(index);
    if (fault === null) return null;
    faultCounts[fault] += 1;
    switch (fault) {
      case 'error':
        counters.errorsInjected += 1;
        sendJson(res, 500, errorBody(`injected error (errorRate=${opts.errorRate})`, 'server_error'));
        return 'answered';
      case 'rateLimit':
        sendJson(res, 429, errorBody(`injected rate limit (rateLimitRate=${opts.rateLimitRate})`, 'rate_limit_error'), { 'retry-after': '0' });
        return 'answered';
      case 'reset': {
        // RST rather than FIN: what a crashed proxy or a killed server process looks like to the client.
        const socket = res.socket;
        if (socket !== null && typeof socket.resetAndDestroy === 'function') socket.resetAndDestroy();
        else res.destroy();
        return 'answered';
      }
      case 'hang':
        hung.add(res);
        res.once('close', () => (hung.delete(res), statsChanged()));
        statsChanged();
        return 'answered';
      default:
        return fault;
    }
  }

  /** Sends a generated reply, spoilt by the request's reply fault if it drew one. */
  function deliver(res: ServerResponse, text: string, fault: ReplyFault | null): void {
    if (fault === null || res.headersSent || res.destroyed) {
      sendText(res, 200, text);
      return;
    }
    // Half of the completion's JSON: a prefix of a JSON object is never JSON (its closing brace is the last byte).
    const body = Buffer.from(text, 'utf8');
    const cut = body.subarray(0, Math.max(1, body.length >> 1));
    if (fault === 'malformed') {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': cut.length }).end(cut);
      return;
    }
    // truncate: promise the whole body, send half of it, then cut the connection once that half is flushed.
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
    res.write(cut, () => res.destroy());
  }

  /**
   * Token-in completion (vLLM's /v1/completions with a token-id prompt): the prompt is decoded with the
   * configured vocabulary, read as a ChatML conversation, answered by the same policy as the chat
   * endpoint, and the reply is encoded back in that vocabulary. A natural stop ends with the
   * end-of-turn token, like a chat model's sampled ids. An open assistant message at the end of the
   * prompt is continued (the tokens it already has are skipped), as continue_final_message does.
   */
  function completeTokens(res: ServerResponse, request: TokenCompletionRequest): void {
    let promptIds: number[];
    let promptText: string;
    try {
      promptIds = typeof request.prompt === 'string' ? vocab.encode(request.prompt) : request.prompt;
      promptText = typeof request.prompt === 'string' ? request.prompt : vocab.decode(request.prompt);
    } catch (error) {
      reject(res, 400, `prompt is not in the ${vocab.name} vocabulary of this mock: ${(error as Error).message} (start it with --tokenizer qwen2.5, or option tokenizer: 'qwen2.5', for a Qwen-tokenizing client)`, 'prompt');
      return;
    }
    const index = requestIndex++;
    const fault = injectFault(res, index);
    if (fault === 'answered') return;
    const { messages, partial } = parseChatMl(promptText);
    const completion = generateCompletion(messages, policy, index, request.seed);
    const full = vocab.name === 'cl100k' ? completion.ids.slice() : vocab.encode(completion.text);
    full.push(vocab.endOfTurnId);
    const skip = partial === null ? 0 : Math.min(vocab.encode(partial).length, full.length - 1);
    let ids = skip > 0 ? full.slice(skip) : full;
    let natural: NaturalFinish = 'stop';
    if (ids.length > request.maxTokens) {
      ids = ids.slice(0, request.maxTokens);
      natural = 'length';
    }
    const version = weightVersion;
    schedule(res, ids, promptIds.length, natural, (reason, out) => {
      deliver(
        res,
        textCompletionJson({
          index,
          model: opts.model,
          vocab,
          ids: out,
          promptIds,
          finishReason: reason,
          weightVersion: version,
          logprobs: request.logprobs,
          returnTokenIds: request.returnTokenIds,
          seed: opts.seed,
          requestSeed: request.seed,
          offset: skip,
        }),
        fault,
      );
    });
  }


  /**
   * A chat completion in a server's dialect: its request checks (vLLM's model name, SGLang's refusal
   * of prompt ids on a stream, the context window), then the policy's reply — ending in the
   * end-of-turn token on a natural stop, as a real model's sampled ids do — in that server's shape.
   */
  function completeDialect(d: Dialect, res: ServerResponse, request: MockChatRequest): void {
    // vLLM checks `model` against the served names before anything else (engine/serving.py
    // OpenAIServing._check_model @00bd1493b3e82d6c13c68ee8a0e1c5a96707e190); SGLang and llama.cpp accept any.
    if (d === 'vllm' && request.model !== undefined && request.model !== opts.model) {
      sendDialectError(res, vllmError(404, 'NotFoundError', `The model \`${request.model}\` does not exist.`, 'model'));
      return;
    }
    // SGLang serving_chat.py OpenAIServingChat._convert_to_internal_request @002897c23becbd522d88b8115a763a21765f978a → 400.
    if (d === 'sglang' && request.stream && request.returnPromptTokenIds) {
      sendDialectError(res, sglangOpenAiError(400, 'return_prompt_token_ids is not supported with streaming. Please set stream=false when using return_prompt_token_ids=true.'));
      return;
    }
    const messages = request.messages;
    const partial = request.continueFinalMessage ? messages[messages.length - 1].content : null;
    const promptIds = promptTokenIds(messages, partial !== null ? 'continue' : request.addGenerationPrompt ? 'generation' : 'closed');
    const limit = checkContext(d, 'openai', promptIds.length, request.maxTokens, context);
    if ('error' in limit) {
      sendDialectError(res, limit.error);
      return;
    }
    const index = requestIndex++;
    const fault = injectFault(res, index);
    if (fault === 'answered') return;
    const completion = generateCompletion(partial === null ? messages : messages.slice(0, -1), policy, index, request.seed);
    let skip = 0;
    let extendsCompletion = true;
    if (partial !== null) {
      const partialIds = encodeText(partial);
      extendsCompletion = startsWith(completion.ids, partialIds);
      skip = Math.min(partialIds.length, completion.ids.length);
    }
    let ids = completion.ids.slice(skip);
    ids.push(END_OF_TURN_ID);
    const fullLength = ids.length;
    let natural: NaturalFinish = 'stop';
    const budget = Math.min(request.maxTokens ?? Infinity, limit.cap);
    // llama.cpp only: a generation stopped by the full context is flagged truncated (server-context.cpp process_token).
    const truncated = d === 'llamacpp' && ids.length > limit.cap && limit.cap < (request.maxTokens ?? Infinity);
    if (ids.length > budget) {
      ids = ids.slice(0, budget);
      natural = 'length';
    } else if (extendsCompletion) {
      rememberEncoding(completion.text, completion.ids);
    }
    const fullText = partial === null ? completion.text : extendsCompletion ? completion.text.slice(partial.length) : null;
    const textOf = (out: readonly number[]): string => {
      if (out.length === fullLength && fullText !== null) return fullText;
      return decodeIds(out.length > 0 && out[out.length - 1] === END_OF_TURN_ID ? out.slice(0, -1) : out);
    };
    const model = d === 'sglang' ? (request.model ?? opts.model) : opts.model;
    const version = versionLabel;
    const rid = `chatcmpl-mock-${index}`;
    const draws = (): { next(): number } | null => (request.logprobs ? logprobDraws({ seed: opts.seed, index, requestSeed: request.seed, offset: skip }) : null);
    if (request.stream) {
      const stream = new DialectStream(res, {
        dialect: d,
        index,
        model,
        promptIds,
        draws: draws(),
        withTop: wantsAlternatives(d, request),
        returnTokenIds: request.returnTokenIds,
        includeUsage: request.includeUsage,
      });
      schedule(
        res,
        ids,
        promptIds.length,
        natural,
        (reason, out) => {
          // A reply fault cuts a dialect stream before its end (the mock's own stream.ts models the finer ones).
          if (fault !== null) res.destroy();
          else stream.finish(reason, out, textOf(out), reason === 'stop' ? END_OF_TURN_ID : null);
        },
        (n) => stream.progress(ids, n),
        rid,
      );
      return;
    }
    const serialise = d === 'vllm' ? vllmChatJson : d === 'sglang' ? sglangChatJson : llamacppChatJson;
    schedule(
      res,
      ids,
      promptIds.length,
      natural,
      (reason, out) => {
        deliver(
          res,
          serialise({
            index,
            model,
            content: textOf(out),
            finishReason: reason,
            ids: out,
            promptIds,
            request,
            version,
            draws: draws(),
            truncated: truncated && reason === 'length',
            created: Math.floor(Date.now() / 1000),
          }),
          fault,
        );
      },
      null,
      rid,
    );
  }

  /**
   * A token-in completion in a server's dialect: vLLM's /v1/completions, SGLang's /generate, llama.cpp's
   * /completion. The policy is the default token-in route's (the prompt read as ChatML in the
   * configured vocabulary); the limits and the reply are the dialect's.
   */
  function completeDialectTokens(d: Dialect, res: ServerResponse, request: TokenInRequest, route: 'openai' | 'native'): void {
    let promptIds: number[];
    let promptText: string;
    try {
      promptIds = typeof request.prompt === 'string' ? vocab.encode(request.prompt) : request.prompt;
      promptText = typeof request.prompt === 'string' ? request.prompt : vocab.decode(request.prompt);
    } catch (error) {
      sendDialectError(res, badRequest(d, route, `prompt is not in the ${vocab.name} vocabulary of this mock: ${(error as Error).message} (start it with --tokenizer qwen2.5, or option tokenizer: 'qwen2.5', for a Qwen-tokenizing client)`, 'prompt'));
      return;
    }
    const limit = checkContext(d, route, promptIds.length, request.maxTokens, context);
    if ('error' in limit) {
      sendDialectError(res, limit.error);
      return;
    }
    const index = requestIndex++;
    const fault = injectFault(res, index);
    if (fault === 'answered') return;
    const { messages, partial } = parseChatMl(promptText);
    const completion = generateCompletion(messages, policy, index, request.seed);
    const full = vocab.name === 'cl100k' ? completion.ids.slice() : vocab.encode(completion.text);
    full.push(vocab.endOfTurnId);
    const skip = partial === null ? 0 : Math.min(vocab.encode(partial).length, full.length - 1);
    let ids = skip > 0 ? full.slice(skip) : full;
    let natural: NaturalFinish = 'stop';
    const budget = Math.min(request.maxTokens ?? Infinity, limit.cap);
    const truncated = d === 'llamacpp' && ids.length > limit.cap && limit.cap < (request.maxTokens ?? Infinity);
    if (ids.length > budget) {
      ids = ids.slice(0, budget);
      natural = 'length';
    }
    const version = versionLabel;
    const rid = d === 'vllm' ? `cmpl-mock-${index}` : (request.rid ?? `mock-${index}`);
    schedule(
      res,
      ids,
      promptIds.length,
      natural,
      (reason, out) => {
        const shape = { index, model: opts.model, vocab, ids: out, promptIds, finishReason: reason, truncated: truncated && reason === 'length', version, request, seed: opts.seed, offset: skip };
        let json: string;
        if (d === 'vllm') {
          json = textCompletionJson({ ...shape, weightVersion: null, logprobs: request.logprobs, returnTokenIds: request.returnTokenIds === true, requestSeed: request.seed });
        } else if (d === 'sglang') {
          json = sglangGenerateJson({ ...shape, rid });
        } else {
          json = llamacppCompletionJson(shape);
        }
        deliver(res, json, fault);
      },
      null,
      rid,
    );
  }

  /** A generation route: count, read and validate the body (400 naming the field), refuse while closing, answer. */
  function generationRoute<R>(parse: (raw: string) => R, answer: (res: ServerResponse, request: R) => void, native = false) {
    return async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
      counters.requests += 1;
      requestsReached.notify();
      statsChanged();
      const raw = await readBody(req, opts.maxBodyBytes);
      let request: R;
      try {
        request = parse(raw);
      } catch (error) {
        if (!(error instanceof RequestError)) throw error;
        if (dialect !== null) sendDialectError(res, badRequest(dialect, native ? 'native' : 'openai', error.message, error.param));
        else reject(res, 400, error.message, error.param);
        return;
      }
      if (closing) {
        sendJson(res, 503, errorBody('the mock server is shutting down', 'server_error'));
        return;
      }
      answer(res, request);
    };
  }

  const tokenCompletions = generationRoute<TokenCompletionRequest>(parseTokenCompletionRequest, completeTokens);
  const chatCompletions = generationRoute<MockChatRequest>(parseChatRequest, complete);
  const dialectChat = dialect === null ? null : generationRoute<MockChatRequest>(parseChatRequest, (res, r) => completeDialect(dialect, res, r));
  const dialectTokens =
    dialect === null
      ? null
      : dialect === 'vllm'
        ? generationRoute<TokenCompletionRequest>(parseTokenCompletionRequest, (res, r) => {
            // vLLM checks the model name on /v1/completions as on chat (OpenAIServing._check_model).
            if (r.model !== undefined && r.model !== opts.model) {
              sendDialectError(res, vllmError(404, 'NotFoundError', `The model \`${r.model}\` does not exist.`, 'model'));
              return;
            }
            completeDialectTokens('vllm', res, { prompt: r.prompt, maxTokens: r.maxTokens, logprobs: r.logprobs, seed: r.seed, rid: null, returnTokenIds: r.returnTokenIds }, 'openai');
          })
        : dialect === 'sglang'
          ? generationRoute<TokenInRequest>(parseGenerateRequest, (res, r) => completeDialectTokens('sglang', res, r, 'native'), true)
          : generationRoute<TokenInRequest>(parseLlamaCompletionRequest, (res, r) => completeDialectTokens('llamacpp', res, r, 'native'), true);

  async function weightVersionRoute(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (req.method === 'GET') {
      req.resume();
      sendJson(res, 200, { weight_version: weightVersion });
      return;
    }
    const raw = await readBody(req, opts.maxBodyBytes);
    let value: unknown;
    try {
      value = (JSON.parse(raw) as { weight_version?: unknown } | null)?.weight_version;
    } catch (error) {
      reject(res, 400, `request body is not valid JSON: ${(error as Error).message}`);
      return;
    }
    try {
      weightVersion = validateWeightVersion(value);
    } catch (error) {
      reject(res, 400, (error as Error).message, 'weight_version');
      return;
    }
    sendJson(res, 200, { weight_version: weightVersion });
  }

  const defaultRoutes: Record<string, Record<string, (req: IncomingMessage, res: ServerResponse) => void | Promise<void>>> = {
    '/health': { GET: (req, res) => (req.resume(), sendJson(res, 200, { status: 'ok' })) },
    '/v1/models': {
      GET: (req, res) => {
        req.resume();
        sendJson(res, 200, {
          object: 'list',
          data: [{ id: opts.model, object: 'model', created: 0, owned_by: 'rollout-engine-mock' }],
        });
      },
    },
    '/v1/chat/completions': { POST: chatCompletions },
    '/v1/completions': { POST: tokenCompletions },
    '/admin/abort': { POST: (req, res) => (req.resume(), sendJson(res, 200, { aborted: abortAll() })) },
    '/admin/weight_version': { GET: weightVersionRoute, POST: weightVersionRoute },
  };
  // SGLang's name for the abort endpoint; the body (rid / abort_all) is ignored: everything is aborted.
  defaultRoutes['/abort_request'] = defaultRoutes['/admin/abort'];
  const routes =
    dialect === null
      ? defaultRoutes
      : dialectRoutes(dialect, {
          options: opts,
          context,
          chat: dialectChat!,
          tokens: dialectTokens!,
          abortAll,
          abortIds,
          getVersion: () => versionLabel,
          setVersion: (label) => {
            versionLabel = label;
            if (/^\d+$/.test(label)) weightVersion = Number(label);
          },
          readBody: (req) => readBody(req, opts.maxBodyBytes),
          reject: sendDialectError,
          send: (res, status, body) => sendText(res, status, body),
        });

  // Requests open per socket, so close() can cut idle keep-alive sockets at once, including ones a
  // client opened but never used (server.closeIdleConnections() misses those), and cut busy ones as
  // soon as their last answer is flushed.
  const sockets = new Map<Socket, number>();
  const server = createServer((req, res) => {
    const socket = req.socket;
    sockets.set(socket, (sockets.get(socket) ?? 0) + 1);
    res.once('close', () => {
      const open = (sockets.get(socket) ?? 1) - 1;
      if (open > 0) sockets.set(socket, open);
      else if (closing) socket.destroy();
      else if (sockets.has(socket)) sockets.set(socket, 0);
    });
    const q = req.url?.indexOf('?') ?? -1;
    const path = q >= 0 ? req.url!.slice(0, q) : (req.url ?? '/');
    const route = routes[path];
    const handler = route?.[req.method ?? ''];
    if (handler === undefined) {
      req.resume();
      if (dialect !== null) sendDialectError(res, unknownRoute(dialect, route !== undefined));
      else if (route === undefined) reject(res, 404, `unknown route ${req.method} ${path}`);
      else reject(res, 405, `method ${req.method} is not allowed on ${path}`, null, { allow: Object.keys(route).join(', ') });
      return;
    }
    Promise.resolve()
      .then(() => handler(req, res))
      .catch((error: unknown) => {
        if (error instanceof BodyTooLarge) reject(res, 413, error.message, null, { connection: 'close' });
        else if (res.headersSent || req.destroyed) res.destroy();
        else sendJson(res, 500, errorBody(`mock server error: ${(error as Error).message}`, 'server_error'));
      });
  });
  server.keepAliveTimeout = KEEP_ALIVE_MS;
  server.on('connection', (socket: Socket) => {
    sockets.set(socket, 0);
    socket.once('close', () => sockets.delete(socket));
  });

  await listen(server, opts.host, opts.port, 'mock inference server');
  const port = (server.address() as AddressInfo).port;
  const url = `http://${hostForUrl(opts.host)}:${port}`;
  let closed: Promise<void> | null = null;

  return {
    url,
    port,
    options: opts,
    get weightVersion() {
      return weightVersion;
    },
    get reportedWeightVersion() {
      return dialect === null ? weightVersion : versionLabel;
    },
    setWeightVersion(version) {
      weightVersion = validateWeightVersion(version);
      versionLabel = String(version);
    },
    abortAll,
    stats,
    waitForInFlight: inFlightReached.wait,
    waitForRequests: requestsReached.wait,
    waitForStats(test) {
      if (test(stats())) return Promise.resolve();
      return new Promise<void>((resolve) => statsWaiters.add({ test, resolve }));
    },
    close() {
      closed ??= new Promise<void>((resolve) => {
        closing = true;
        abortAll();
        if (streamTicker !== null) clearInterval(streamTicker);
        // Held requests are never answered: cut them, so close() does not wait for the clients' timeouts.
        for (const res of hung) res.destroy();
        server.close(() => resolve());
        for (const [socket, open] of sockets) if (open === 0) socket.destroy();
        // Requests still uploading their body would otherwise hold close() open until they time out.
        setTimeout(() => server.closeAllConnections(), CLOSE_GRACE_MS).unref();
      });
      return closed;
    },
  };
}

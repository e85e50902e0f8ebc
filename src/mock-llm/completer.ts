/**
 * What each generation route answers: the policy's completion of a validated request (policy.ts),
 * less what a partial assistant message already holds, cut to the token budget, scheduled
 * (scheduler.ts) and serialised in the route's shape — the mock's own (response.ts, stream.ts,
 * completions.ts) or a dialect's (dialects.ts, dialect-stream.ts).
 *
 * Invariant: every request that reaches generation takes the next request index, in arrival order.
 * The policy and the fault dice are keyed on it, so a sequential client gets the same replies and the
 * same faults on every run.
 */
import type { ServerResponse } from 'node:http';
import {
  checkContext,
  badRequest,
  llamacppChatJson,
  llamacppCompletionJson,
  sglangChatJson,
  sglangGenerateJson,
  sglangOpenAiError,
  vllmChatJson,
  vllmError,
  wantsAlternatives,
} from './dialects.ts';
import type { Dialect, TokenInRequest } from './dialects.ts';
import { DialectStream } from './dialect-stream.ts';
import { deliver, type FaultInjector, type ReplyFault } from './faults.ts';
import type { Rejections } from './http-replies.ts';
import type { ResolvedMockLlmOptions } from './options.ts';
import { generateCompletion, type Completion, type PolicyOptions, type PromptMessage } from './policy.ts';
import type { MockChatRequest } from './request.ts';
import { textCompletionJson, type TokenCompletionRequest } from './completions.ts';
import { completionJson, type TokenDraws } from './response.ts';
import type { MockLogprobModel, ReplyContext } from './scoring.ts';
import type { Finish, NaturalFinish, Scheduler } from './scheduler.ts';
import { CompletionStream } from './stream.ts';
import { sglangMaskFields, sglangRoutedFields, vllmListFields, vllmRoutedField, type MockRouting } from './routing.ts';
import { pythonJsonDumps, ToolCallDeltas } from './stream-tools.ts';
import { decodeIds, encodeText, END_OF_TURN_ID, promptTokenIds, rememberEncoding } from './tokens.ts';
import { parseChatMl, type MockVocabulary } from './vocab.ts';
import type { WeightVersion } from './weight-version.ts';

export interface CompleterParts {
  options: ResolvedMockLlmOptions;
  vocab: MockVocabulary;
  /** The context window the dialects enforce. */
  context: number;
  scheduler: Scheduler;
  faults: FaultInjector;
  rejections: Rejections;
  version: WeightVersion;
  /** The logprobs' model: what a token's logprob is in its context, and the prompt scoring routes. */
  logprobs: MockLogprobModel;
}

/** A chat completion that continues a partial assistant message, or answers the conversation. */
interface ChatReply {
  completion: Completion;
  /** Ids of the completion the partial message already holds (not sent again). */
  skip: number;
  /** The partial message is a prefix of the completion (else `skip` is a best effort). */
  extendsCompletion: boolean;
  /** The text of all the ids after `skip` when it is exactly known, else null (decode the ids). */
  fullText: string | null;
}

/** A token-in reply, cut to its budget. */
interface TokenReply {
  index: number;
  fault: ReplyFault | null;
  ids: number[];
  /** Ids of the reply an open assistant message in the prompt already holds (not sent again). */
  skip: number;
  /** How many ids the reply had before the cut: more than `ids` means it ends with finish reason length. */
  uncut: number;
  /** Ids sampled but not reported (the `dropped-first-token` fault): later ones are conditioned on them. */
  hidden: number[];
}

export class Completer {
  readonly #options: ResolvedMockLlmOptions;
  readonly #vocab: MockVocabulary;
  readonly #context: number;
  readonly #policy: PolicyOptions;
  readonly #scheduler: Scheduler;
  readonly #faults: FaultInjector;
  readonly #rejections: Rejections;
  readonly #version: WeightVersion;
  readonly #logprobs: MockLogprobModel;
  /** The next request index (see the invariant above). */
  #requestIndex = 0;

  constructor(parts: CompleterParts) {
    this.#options = parts.options;
    this.#vocab = parts.vocab;
    this.#context = parts.context;
    const capacity = parts.options.capacity;
    const lengths =
      capacity?.responseTokens == null ? null : { median: capacity.responseTokens, sigma: capacity.lengthSigma };
    this.#policy = {
      seed: parts.options.seed,
      mistakeRate: parts.options.mistakeRate,
      thinkTokens: parts.options.thinkTokens,
      thinkTags: parts.options.thinkTags,
      lengths,
    };
    this.#scheduler = parts.scheduler;
    this.#faults = parts.faults;
    this.#rejections = parts.rejections;
    this.#version = parts.version;
    this.#logprobs = parts.logprobs;
  }

  /** `POST /v1/chat/completions` of the default dialect, whole or streamed. */
  chat(res: ServerResponse, request: MockChatRequest): void {
    const index = this.#requestIndex++;
    const fault = this.#faults.inject(res, index);
    if (fault === 'answered') return;
    const messages = request.messages;
    const partial = request.continueFinalMessage ? messages[messages.length - 1].content : null;
    const { completion, skip, extendsCompletion, fullText } = this.#chatReply(messages, partial, index, request.seed);
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
    const promptIds = promptTokenIds(
      messages,
      partial !== null ? 'continue' : request.addGenerationPrompt ? 'generation' : 'closed',
    );
    // The version that "generated" the reply: the one current when generation started.
    const version = this.#version.number;
    const o = this.#options;
    const lp = this.#chatContext(messages, partial, completion, skip, promptIds);
    const replyDraws = () => this.#logprobs.draws(lp);
    const contentOf = (out: readonly number[]): string =>
      out.length === fullLength && fullText !== null ? fullText : decodeIds(out);
    if (request.stream) {
      const stream = new CompletionStream(res, {
        index,
        model: o.model,
        promptIds,
        weightVersion: version,
        logprobs: request.logprobs,
        returnTokenIds: request.returnTokenIds,
        includeUsage: request.includeUsage,
        seed: o.seed,
        requestSeed: request.seed,
        offset: skip,
        draws: replyDraws,
        ...(request.tools && partial === null && completion.toolCalls !== undefined
          ? {
              // The whole reply's text: a cut one still paces its calls by where they lie in it.
              tools: new ToolCallDeltas(fullText ?? decodeIds(completion.ids), completion.toolCalls, (call) =>
                mockToolCallId(index, call),
              ),
            }
          : {}),
      });
      this.#scheduler.schedule(res, {
        ids,
        promptTokens: promptIds.length,
        promptIds,
        natural,
        priority: request.priority,
        answer: (reason, out) => {
          this.#logprobs.remember(lp.version, lp.promptIds, out);
          stream.finish(reason, out, contentOf(out), fault);
        },
        progress: (n) => stream.progress(ids, n),
      });
      return;
    }
    // Spelled out, not spread from a head shared with the stream: on this per-reply path the spread
    // cost the mock about 15% more CPU per request.
    // vLLM reads calls only from a whole generation that stopped on its own (a cut one is text), and
    // only when every block parses: its hermes parser answers a reply with one bad block as plain text,
    // tool_calls empty (tool_parsers/hermes_tool_parser.py extract_tool_calls @0085432, the except
    // branch). The arguments it sends are json.dumps of the parsed object: Python's separators.
    const calls =
      request.tools && partial === null && completion.toolCalls !== undefined
        ? vllmToolCalls(completion.toolCalls)
        : undefined;
    const answer = (reason: Finish, out: readonly number[]): void => {
      const whole = calls !== undefined && reason === 'stop' && out.length === fullLength;
      const text = contentOf(out);
      const json = completionJson({
        index,
        model: o.model,
        content: whole ? text.slice(0, text.indexOf('<tool_call>')).trimEnd() : text,
        ...(whole ? { toolCalls: calls.map((c, i) => ({ id: mockToolCallId(index, i), ...c })) } : {}),
        finishReason: reason,
        ids: out,
        promptIds,
        weightVersion: version,
        logprobs: request.logprobs,
        returnTokenIds: request.returnTokenIds,
        seed: o.seed,
        requestSeed: request.seed,
        offset: skip,
        draws: replyDraws,
      });
      this.#logprobs.remember(lp.version, lp.promptIds, out);
      deliver(res, json, fault);
    };
    this.#scheduler.schedule(res, {
      ids,
      promptTokens: promptIds.length,
      promptIds,
      natural,
      answer,
      priority: request.priority,
    });
  }

  /**
   * Token-in completion (vLLM's /v1/completions with a token-id prompt): the prompt is decoded with the
   * configured vocabulary, read as a ChatML conversation, answered by the same policy as the chat
   * endpoint, and the reply is encoded back in that vocabulary. A natural stop ends with the
   * end-of-turn token, like a chat model's sampled ids. An open assistant message at the end of the
   * prompt is continued (the tokens it already has are skipped), as continue_final_message does.
   */
  tokens(res: ServerResponse, request: TokenCompletionRequest): void {
    const prompt = this.#readPrompt(request.prompt);
    if ('error' in prompt) {
      this.#rejections.reject(res, 400, prompt.error, 'prompt');
      return;
    }
    if (request.promptLogprobs !== null) {
      this.#scoreVllm(res, prompt.ids, this.#version.number);
      return;
    }
    const reply = this.#tokenReply(res, prompt.text, request.seed, request.maxTokens);
    if (reply === null) return;
    const { index, fault, ids, skip } = reply;
    const version = this.#version.number;
    const o = this.#options;
    const lp = { version: this.#version.label, promptIds: prompt.ids, hidden: reply.hidden };
    const answer = (reason: Finish, out: readonly number[]): void => {
      this.#logprobs.remember(lp.version, prompt.ids, [...reply.hidden, ...out]);
      const json = textCompletionJson({
        draws: () => this.#logprobs.draws(lp),
        index,
        model: o.model,
        vocab: this.#vocab,
        ids: out,
        promptIds: prompt.ids,
        finishReason: reason,
        weightVersion: version,
        logprobs: request.logprobs,
        returnTokenIds: request.returnTokenIds,
        seed: o.seed,
        requestSeed: request.seed,
        offset: skip,
      });
      deliver(res, json, fault);
    };
    this.#scheduler.schedule(res, {
      ids,
      promptTokens: prompt.ids.length,
      promptIds: prompt.ids,
      natural: ids.length < reply.uncut ? 'length' : 'stop',
      answer,
      priority: request.priority,
    });
  }

  /**
   * A chat completion in a server's dialect: its request checks (vLLM's model name, SGLang's refusal
   * of prompt ids on a stream, the context window), then the policy's reply — ending in the
   * end-of-turn token on a natural stop, as a real model's sampled ids do — in that server's shape.
   */
  dialectChat(d: Dialect, res: ServerResponse, request: MockChatRequest): void {
    if (d === 'vllm' && this.#refuseModel(res, request.model)) return;
    // SGLang serving_chat.py OpenAIServingChat._convert_to_internal_request @002897c23becbd522d88b8115a763a21765f978a → 400;
    // return_token_ids (sgl-project/sglang#30917) is refused on a stream the same way.
    if (d === 'sglang' && request.stream && (request.returnPromptTokenIds || request.returnTokenIds)) {
      const field = request.returnPromptTokenIds ? 'return_prompt_token_ids' : 'return_token_ids';
      this.#rejections.dialect(
        res,
        sglangOpenAiError(
          400,
          `${field} is not supported with streaming. Please set stream=false when using ${field}=true.`,
        ),
      );
      return;
    }
    const messages = request.messages;
    const partial = request.continueFinalMessage ? messages[messages.length - 1].content : null;
    const promptIds = promptTokenIds(
      messages,
      partial !== null ? 'continue' : request.addGenerationPrompt ? 'generation' : 'closed',
    );
    const limit = checkContext(d, 'openai', promptIds.length, request.maxTokens, this.#context);
    if ('error' in limit) {
      this.#rejections.dialect(res, limit.error);
      return;
    }
    const index = this.#requestIndex++;
    const fault = this.#faults.inject(res, index);
    if (fault === 'answered') return;
    const { completion, skip, extendsCompletion, fullText } = this.#chatReply(messages, partial, index, request.seed);
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
    const textOf = (out: readonly number[]): string => {
      if (out.length === fullLength && fullText !== null) return fullText;
      return decodeIds(out.length > 0 && out[out.length - 1] === END_OF_TURN_ID ? out.slice(0, -1) : out);
    };
    const o = this.#options;
    const model = d === 'sglang' ? (request.model ?? o.model) : o.model;
    const version = this.#version.label;
    const rid = `chatcmpl-mock-${index}`;
    const lp = this.#chatContext(messages, partial, completion, skip, promptIds);
    const draws = (): TokenDraws | null => (request.logprobs ? this.#logprobs.draws({ ...lp, version }) : null);
    const promptTokens = promptIds.length;
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
        ...(d === 'sglang' ? { sglext: request } : {}),
      });
      const answer = (reason: Finish, out: readonly number[]): void => {
        // A reply fault cuts a dialect stream before its end (the mock's own stream.ts models the finer ones).
        if (fault !== null) res.destroy();
        else stream.finish(reason, out, textOf(out), reason === 'stop' ? END_OF_TURN_ID : null);
      };
      this.#scheduler.schedule(res, {
        ids,
        promptTokens,
        promptIds,
        natural,
        answer,
        progress: (n) => stream.progress(ids, n),
        rid,
        priority: request.priority,
      });
      return;
    }
    const serialise = d === 'vllm' ? vllmChatJson : d === 'sglang' ? sglangChatJson : llamacppChatJson;
    const answer = (reason: Finish, out: readonly number[]): void => {
      const json = serialise({
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
      });
      // vLLM's chat choices carry routed_experts too (ChatCompletionResponseChoice); SGLang's engine path is /generate.
      const routed = d === 'vllm' ? withRouting(d, json, promptIds, out, CHAT_ROUTING, o.routedExperts) : json;
      deliver(res, routed, fault);
    };
    this.#scheduler.schedule(res, { ids, promptTokens, promptIds, natural, answer, rid, priority: request.priority });
  }

  /** vLLM's `/v1/completions` in its dialect: the model name is checked as on chat (OpenAIServing._check_model). */
  vllmTokens(res: ServerResponse, r: TokenCompletionRequest): void {
    if (this.#refuseModel(res, r.model)) return;
    this.dialectTokens(
      'vllm',
      res,
      {
        prompt: r.prompt,
        maxTokens: r.maxTokens,
        logprobs: r.logprobs,
        seed: r.seed,
        rid: null,
        returnTokenIds: r.returnTokenIds,
        routedFrom: r.routedExpertsPromptStart,
        promptLogprobs: r.promptLogprobs,
        ...(r.priority !== undefined ? { priority: r.priority } : {}),
      },
      'openai',
    );
  }

  /**
   * A token-in completion in a server's dialect: vLLM's /v1/completions, SGLang's /generate, llama.cpp's
   * /completion. The policy is the default token-in route's (the prompt read as ChatML in the
   * configured vocabulary); the limits and the reply are the dialect's.
   */
  dialectTokens(d: Dialect, res: ServerResponse, request: TokenInRequest, route: 'openai' | 'native'): void {
    const prompt = this.#readPrompt(request.prompt);
    if ('error' in prompt) {
      this.#rejections.dialect(res, badRequest(d, route, prompt.error, 'prompt'));
      return;
    }
    const limit = checkContext(d, route, prompt.ids.length, request.maxTokens, this.#context);
    if ('error' in limit) {
      this.#rejections.dialect(res, limit.error);
      return;
    }
    if (d === 'vllm' && request.promptLogprobs != null) {
      this.#scoreVllm(res, prompt.ids, null);
      return;
    }
    if (d === 'sglang' && request.logprobStartLen != null && request.maxTokens === 0) {
      this.#scoreSglang(res, prompt.ids, request.logprobStartLen, request.rid);
      return;
    }
    const budget = Math.min(request.maxTokens ?? Infinity, limit.cap);
    const reply = this.#tokenReply(res, prompt.text, request.seed, budget);
    if (reply === null) return;
    const { index, fault, ids, skip } = reply;
    const truncated = d === 'llamacpp' && reply.uncut > limit.cap && limit.cap < (request.maxTokens ?? Infinity);
    const version = this.#version.label;
    const rid = d === 'vllm' ? `cmpl-mock-${index}` : (request.rid ?? `mock-${index}`);
    const o = this.#options;
    const lp = { version, promptIds: prompt.ids, hidden: reply.hidden };
    const answer = (reason: Finish, out: readonly number[]): void => {
      this.#logprobs.remember(version, prompt.ids, [...reply.hidden, ...out]);
      const shape = {
        draws: () => this.#logprobs.draws(lp),
        index,
        model: o.model,
        vocab: this.#vocab,
        ids: out,
        promptIds: prompt.ids,
        finishReason: reason,
        truncated: truncated && reason === 'length',
        version,
        request,
        seed: o.seed,
        offset: skip,
      };
      let json: string;
      if (d === 'vllm') {
        json = textCompletionJson({
          ...shape,
          weightVersion: null,
          logprobs: request.logprobs,
          returnTokenIds: request.returnTokenIds === true,
          requestSeed: request.seed,
        });
      } else if (d === 'sglang') {
        json = sglangGenerateJson({ ...shape, rid });
      } else {
        json = llamacppCompletionJson(shape);
      }
      deliver(res, withRouting(d, json, prompt.ids, out, request, o.routedExperts), fault);
    };
    this.#scheduler.schedule(res, {
      ids,
      promptTokens: prompt.ids.length,
      promptIds: prompt.ids,
      natural: ids.length < reply.uncut ? 'length' : 'stop',
      answer,
      rid,
      priority: request.priority,
    });
  }

  /**
   * What a chat reply's logprobs are conditioned on: the prompt, or for a continuation the
   * uninterrupted generation's prompt and the ids the partial message already holds — so a continued
   * reply's tokens score as the uninterrupted ones do.
   */
  #chatContext(
    messages: PromptMessage[],
    partial: string | null,
    completion: Completion,
    skip: number,
    promptIds: readonly number[],
  ): ReplyContext {
    if (partial === null) return { version: this.#version.label, promptIds };
    const head = promptTokenIds(messages.slice(0, -1), 'generation');
    return { version: this.#version.label, promptIds: [...head, ...completion.ids.slice(0, skip)] };
  }

  /**
   * vLLM's prompt scoring: `/v1/completions` with `prompt_logprobs` → `choices[0].prompt_logprobs`,
   * `[null, {"<id>": {logprob, rank, decoded_token}}, ...]` (the first prompt token has none), one
   * token generated (the mock: the end-of-turn token). `weightVersion` null: no `metadata` (the vllm
   * dialect). Answered at once, outside the scheduler: scoring is one prefill.
   */
  #scoreVllm(res: ServerResponse, ids: readonly number[], weightVersion: number | null): void {
    this.#requestIndex++;
    const scores = this.#logprobs.score(this.#version.label, ids, 1);
    const promptLogprobs: (Record<string, { logprob: number; rank: number; decoded_token: string }> | null)[] = [null];
    for (let i = 1; i < ids.length; i++)
      promptLogprobs.push({
        [String(ids[i])]: { logprob: scores[i - 1], rank: 1, decoded_token: this.#vocab.tokenText(ids[i]) },
      });
    const eot = this.#vocab.endOfTurnId;
    const body: Record<string, unknown> = {
      id: `cmpl-mock-score-${this.#requestIndex}`,
      object: 'text_completion',
      created: Math.floor(Date.now() / 1000),
      model: this.#options.model,
      choices: [
        {
          index: 0,
          text: '',
          logprobs: null,
          finish_reason: 'length',
          stop_reason: null,
          prompt_logprobs: promptLogprobs,
          token_ids: [eot],
        },
      ],
      usage: { prompt_tokens: ids.length, completion_tokens: 1, total_tokens: ids.length + 1 },
      ...(weightVersion === null ? {} : { metadata: { weight_version: weightVersion } }),
    };
    deliver(res, JSON.stringify(body), null);
  }

  /**
   * SGLang's prompt scoring: `/generate` with `max_new_tokens: 0`, `return_logprob` and
   * `logprob_start_len` L → `meta_info.input_token_logprobs`, `[logprob, id, null]` for ids[L..], the
   * first entry's logprob null (scheduler_output_processor_mixin.py pads it), no output ids.
   */
  #scoreSglang(res: ServerResponse, ids: readonly number[], start: number, rid: string | null): void {
    const index = this.#requestIndex++;
    const from = Math.max(0, Math.min(start, ids.length - 1));
    const scores = this.#logprobs.score(this.#version.label, ids, from + 1);
    const entries: [number | null, number, null][] = [[null, ids[from], null]];
    for (let i = from + 1; i < ids.length; i++) entries.push([scores[i - from - 1], ids[i], null]);
    const body = {
      text: '',
      output_ids: [],
      meta_info: {
        id: rid ?? `mock-${index}`,
        finish_reason: { type: 'length', length: 0 },
        prompt_tokens: ids.length,
        weight_version: this.#version.label,
        completion_tokens: 0,
        cached_tokens: 0,
        input_token_logprobs: entries,
        output_token_logprobs: [],
      },
    };
    deliver(res, JSON.stringify(body), null);
  }

  /**
   * A continuation is the completion of the conversation without the partial assistant message, minus
   * the tokens that message already holds: under the same request seed, partial + continuation equals
   * the uninterrupted completion exactly.
   */
  #chatReply(messages: PromptMessage[], partial: string | null, index: number, seed: number | undefined): ChatReply {
    const completion = generateCompletion(
      partial === null ? messages : messages.slice(0, -1),
      this.#policy,
      index,
      seed,
    );
    if (partial === null) return { completion, skip: 0, extendsCompletion: true, fullText: completion.text };
    const partialIds = encodeText(partial);
    // Best effort when the partial message is not a prefix (another seed, an edited or foreign
    // text): skip as many tokens as it has, so the reply still has roughly the remaining length.
    const extendsCompletion = startsWith(completion.ids, partialIds);
    const skip = Math.min(partialIds.length, completion.ids.length);
    // Exact whenever extendsCompletion: the skipped ids decode to `partial`, a whole-character prefix.
    return {
      completion,
      skip,
      extendsCompletion,
      fullText: extendsCompletion ? completion.text.slice(partial.length) : null,
    };
  }

  /** A token-in prompt as ids and as text in the configured vocabulary, or why it is not in it. */
  #readPrompt(prompt: number[] | string): { ids: number[]; text: string } | { error: string } {
    try {
      return typeof prompt === 'string'
        ? { ids: this.#vocab.encode(prompt), text: prompt }
        : { ids: prompt, text: this.#vocab.decode(prompt) };
    } catch (error) {
      return {
        error: `prompt is not in the ${this.#vocab.name} vocabulary of this mock: ${(error as Error).message} (start it with --tokenizer qwen2.5, or option tokenizer: 'qwen2.5', for a Qwen-tokenizing client)`,
      };
    }
  }

  /**
   * The policy's reply to a ChatML prompt, in the configured vocabulary, ending in the end-of-turn
   * token, cut to `budget` ids; null when an injected fault has answered the request.
   */
  #tokenReply(res: ServerResponse, promptText: string, seed: number | undefined, budget: number): TokenReply | null {
    const index = this.#requestIndex++;
    const fault = this.#faults.inject(res, index);
    if (fault === 'answered') return null;
    const vocab = this.#vocab;
    const { messages, partial } = parseChatMl(promptText);
    const completion = generateCompletion(messages, this.#policy, index, seed);
    const full = vocab.name === 'cl100k' ? completion.ids.slice() : vocab.encode(completion.text);
    full.push(vocab.endOfTurnId);
    const skip = partial === null ? 0 : Math.min(vocab.encode(partial).length, full.length - 1);
    let ids = skip > 0 ? full.slice(skip) : full;
    // A resume's continuation whose first sampled token never reaches the reply (scoring.ts).
    const hidden =
      partial !== null && ids.length > 1 && this.#logprobs.has('dropped-first-token') ? ids.slice(0, 1) : [];
    if (hidden.length > 0) ids = ids.slice(1);
    return { index, fault, ids: ids.length > budget ? ids.slice(0, budget) : ids, skip, uncut: ids.length, hidden };
  }

  /** vLLM checks `model` against the served names before anything else (engine/serving.py
   * OpenAIServing._check_model @00bd1493b3e82d6c13c68ee8a0e1c5a96707e190); SGLang and llama.cpp accept any. */
  #refuseModel(res: ServerResponse, model: string | undefined): boolean {
    if (model === undefined || model === this.#options.model) return false;
    this.#rejections.dialect(res, vllmError(404, 'NotFoundError', `The model \`${model}\` does not exist.`, 'model'));
    return true;
  }
}

/** The calls as vLLM's hermes parser returns them; undefined when one does not parse (the reply is then text). */
function vllmToolCalls(
  calls: readonly { name: string; arguments: string }[],
): { name: string; arguments: string }[] | undefined {
  const out: { name: string; arguments: string }[] = [];
  for (const call of calls) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(call.arguments);
    } catch {
      return undefined;
    }
    out.push({ name: call.name, arguments: pythonJsonDumps(parsed) });
  }
  return out;
}

/** vLLM's call id shape (`chatcmpl-tool-` + 32 hex digits), made from the request index: replies stay reproducible. */
function mockToolCallId(index: number, call: number): string {
  return `chatcmpl-tool-${index.toString(16).padStart(24, '0')}${call.toString(16).padStart(8, '0')}`;
}

function startsWith(ids: readonly number[], prefix: readonly number[]): boolean {
  if (prefix.length > ids.length) return false;
  for (let i = 0; i < prefix.length; i++) if (ids[i] !== prefix[i]) return false;
  return true;
}

/** A chat request's routing: from the first prompt token (the engine asks no later start on chat). */
const CHAT_ROUTING: TokenInRequest = {
  prompt: [],
  maxTokens: null,
  logprobs: null,
  seed: undefined,
  rid: null,
  routedFrom: 0,
};

/**
 * A token-in reply with the routed experts and sampling masks its server would add: vLLM's on every
 * choice when launched with them (the request only moves the start), SGLang's when the request asks.
 */
function withRouting(
  d: Dialect,
  json: string,
  promptIds: readonly number[],
  ids: readonly number[],
  request: TokenInRequest,
  routing: MockRouting | null,
): string {
  const wantsRouting = routing !== null && (d === 'vllm' || (d === 'sglang' && request.routedFrom != null));
  if (!wantsRouting && !(d === 'sglang' && request.samplingMask === true)) return json;
  const body = JSON.parse(json) as Record<string, unknown>;
  const sequence = [...promptIds, ...ids];
  if (d === 'vllm' && routing !== null) {
    const choice = (body.choices as Record<string, unknown>[])[0];
    if (routing.vllmWire === 'lists') {
      // vLLM 0.21: the prompt's rows on the response, every one from 0 (no routed_experts_prompt_start).
      const fields = vllmListFields(promptIds, ids, routing);
      body.prompt_routed_experts = fields.prompt_routed_experts;
      choice.routed_experts = fields.routed_experts;
    } else choice.routed_experts = vllmRoutedField(sequence, request.routedFrom ?? 0, routing);
  }
  if (d === 'sglang') {
    const meta = body.meta_info as Record<string, unknown>;
    if (wantsRouting && routing !== null)
      Object.assign(meta, sglangRoutedFields(sequence, request.routedFrom ?? 0, routing));
    if (request.samplingMask === true) Object.assign(meta, sglangMaskFields(ids, promptIds.length));
  }
  return JSON.stringify(body);
}

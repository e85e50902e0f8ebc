/**
 * `llm.api: tokens`: the conversation is rendered with the policy's chat template and tokenized here,
 * and sent as token ids to the server's token-in route (llm/token-wire.ts). Each turn's prompt is the
 * previous turn's prompt + response ids + the ids of only the new text after them (delta tokenization,
 * chat-model/prompt.ts, as in the gateway), so an episode is one exact token sequence: what the policy
 * sampled is what the trainer sees, with no retokenization drift between turns.
 *
 * The sequence so far comes from the previous turn of the same session (`ChatRequest.previous`, its
 * prompt and response ids and the messages it was rendered from), so it holds across pauses and
 * workers: nothing but a cache lives here. A conversation that does not extend the previous one (the
 * agent loop trimmed it, `messageCut` > 0) is tokenized whole.
 *
 * Some chat templates do not render a conversation as a prefix of its extension: Qwen3's drops the
 * reasoning of assistant turns before the last user message, and a template writes tool calls its own
 * way when a message carries them as `tool_calls` (docs/TEMPLATES.md). When the conversation extends
 * the previous turn's message for message (the previous messages, the reply, new messages) but its
 * render does not start with the text of the previous prompt + sampled ids, the reply says so
 * (`historyRewrite`, with where they diverge) and the prompt follows `historyMode`:
 * - `keep-sampled` (default): the previous prompt + sampled ids + the ids of the new messages' text,
 *   cut out of a render in which the reply is a marker (see #newMessagesText): what the trainer gets
 *   is exactly what was sampled, and the model sees its own earlier reasoning at inference. When the
 *   new messages cannot be cut out that way, the turn is split instead, and says why (`fallback`).
 * - `split`: the whole re-rendered conversation, tokenized: a new training segment that begins
 *   with the history as the template writes it.
 *
 * The prompt is counted before it is sent: over the server's context it is not sent at all, and
 * `max_tokens` is capped to the room left (llm/context.ts).
 */
import type { CancelSignal } from '../cancel.ts';
import type { ChatModel } from '../chat-model/model.ts';
import { planPrompt, prefixDivergence, type PrefixDivergence, type PromptBase } from '../chat-model/prompt.ts';
import { extendsSequence, sharedMessageCount, type ChatMessage } from '../domain/rollout.ts';
import { LlmError } from './errors.ts';
import { contextOverflowReply } from './context.ts';
import type { ChatRequest } from './request.ts';
import type { StreamSink } from './exchange.ts';
import { GenerateStream } from './generate-stream.ts';
import type { ChatResult, HistoryRewrite } from './reply.ts';
import type { ServerDialect } from './servers.ts';
import { parseToolCalls, type ToolParser } from './tool-calls.ts';
import { fillMissingLogprobs, TOKEN_WIRES, type GenerationResult, type TokenWire } from './token-wire.ts';
import type { RoutingShape } from './routing-wire.ts';
import { priorityFields } from './priority.ts';

/** The client settings token-in calls read (an TokenChatOptions has them). */
export interface TokenChatOptions {
  model: string;
  /** Stream the generation where the dialect's token-in route names the weights of each event (ServerDialect.tokenStreamVersions). */
  stream?: boolean;
  toolParser?: ToolParser;
  server?: { contextLength: number | null };
  chatModel?: () => Promise<ChatModel>;
  routedExperts?: { shape: RoutingShape | null } | null;
  samplingMasks?: boolean;
  /** What a turn whose re-rendered history diverged from the sampled sequence gets (module header); default `keep-sampled`. */
  historyMode?: HistoryMode;
}

/** `llm.historyMode`: see the module header and docs/TEMPLATES.md. */
export type HistoryMode = 'keep-sampled' | 'split';

/** Stands for the previous reply in the render the new messages are cut out of: text no template rewrites. */
const REPLY_MARKER = 'ROLLOUT_ENGINE_REPLY_MARKER_5c1f';

/** Sends one token-in call with the client's retries, pause checks and reply limits (LlmClient #call). */
export type TokenCall = <T>(
  path: string,
  payload: object,
  reader: { parse(json: unknown): T },
  signal: CancelSignal | undefined,
  stream: (() => StreamSink<T>) | null,
) => Promise<T>;

/** Sessions whose sequence is kept at once per client: an episode's next turn finds its own; older ones are rebuilt from `previous`. */
const SESSIONS_KEPT = 4096;

const fail = (why: string): LlmError => new LlmError('ERR_LLM_BAD_REPLY', `token-in reply: ${why}`);
const newGenerateStream = (): GenerateStream => new GenerateStream();
/** A reply read as it is (llama.cpp's recompute calls pick one number out of it). */
const RAW_JSON = { parse: (json: unknown) => json };

export class TokenChat {
  readonly #wire: TokenWire;
  readonly #options: TokenChatOptions;
  readonly #call: TokenCall;
  readonly #reader: { parse(json: unknown): GenerationResult };
  /** Calls are streamed, each event naming its weights (llm/generate-stream.ts). */
  readonly #streamed: boolean;
  /** session → its sequence after the last call (insertion order: oldest first, for eviction). */
  readonly #sessions = new Map<string, PromptBase>();
  #model: ChatModel | null = null;
  #aToken: number | undefined;
  /** How the dialect reads `priority` (llm/priority.ts). */
  readonly #priority: ServerDialect['priority'];

  constructor(dialect: ServerDialect, options: TokenChatOptions, call: TokenCall) {
    if (dialect.tokenRoute === null)
      throw new LlmError('ERR_LLM_HTTP', `llm.api "tokens": a ${dialect.label} server has no token-in route`);
    const kind =
      dialect.kind === 'generic' || dialect.kind === 'vllm'
        ? 'vllm'
        : dialect.kind === 'sglang'
          ? 'sglang'
          : 'llamacpp';
    this.#wire = TOKEN_WIRES[kind];
    this.#priority = dialect.priority;
    this.#options = options;
    // Routed experts and sampling masks come in the whole reply (config.ts refuses them with llm.stream).
    this.#streamed =
      options.stream === true &&
      dialect.tokenStreamVersions &&
      options.routedExperts == null &&
      options.samplingMasks !== true;
    this.#call = call;
    this.#reader = { parse: (json) => this.#wire.parse(json, fail) };
  }

  async chat(
    request: ChatRequest,
    signal: CancelSignal | undefined,
    sessionId: string | undefined,
  ): Promise<ChatResult> {
    const model = (this.#model ??= await this.#loadModel());
    let promptIds: number[];
    let rendered: string | null = null;
    /** The text the prompt ids stand for (the render, unless the sampled continuation was kept). */
    let promptText: string | null = null;
    let rewrite: HistoryRewrite | undefined;
    if (request.continueTokens !== undefined) {
      // A generation cut by a pause goes on from its own tokens: the prompt it had plus what it made.
      promptIds = [...request.continueTokens.promptIds, ...request.continueTokens.responseIds];
    } else {
      rendered = model.render(this.#renderable(request.messages), { addGenerationPrompt: true, tools: request.tools });
      promptText = rendered;
      const base = this.#base(model, sessionId, request.previous, request.tools);
      // A conversation that does not extend the previous turn's (trimmed by messageCut) is tokenized
      // whole, and becomes the sequence the next turn extends.
      const plan = planPrompt(model, base, rendered);
      promptIds = plan.promptIds;
      if (plan.kind === 'side' && base !== null) {
        const reply = this.#replyIndex(model, base, request);
        if (reply !== null) {
          // The messages extend the previous turn's, the render does not: the template rewrote the history.
          const render = rendered;
          const where = () => prefixDivergence(model, base, render);
          const kept = this.#historyMode === 'keep-sampled' ? this.#newMessagesText(model, base, request, reply) : null;
          if (typeof kept === 'string') {
            promptIds = base.tokens.slice();
            for (const id of model.encode(kept)) promptIds.push(id);
            promptText = base.coveredText + kept;
            rewrite = historyRewrite('kept', undefined, where);
          } else {
            rewrite = historyRewrite('split', kept?.fallback, where);
          }
        }
      }
    }
    const contextLength = this.#options.server?.contextLength ?? null;
    if (contextLength !== null && promptIds.length >= contextLength) {
      if (sessionId !== undefined) this.#sessions.delete(sessionId);
      return {
        ...contextOverflowReply(
          `the prompt is ${promptIds.length} tokens and the server's context is ${contextLength}`,
        ),
        promptIds: Int32Array.from(promptIds),
      };
    }
    const maxTokens =
      contextLength === null ? request.maxTokens : Math.min(request.maxTokens, contextLength - promptIds.length);
    const routedFrom = this.#routedFrom(request, promptIds);
    const samplingMask = this.#options.samplingMasks === true;
    const payload = this.#wire.body(
      {
        promptIds,
        maxTokens,
        topLogprobs: 0,
        ...request.sampling,
        temperature: request.temperature,
        ...(request.seed !== undefined ? { seed: request.seed } : {}),
        ...(routedFrom !== null ? { routedFrom } : {}),
        ...(samplingMask ? { samplingMask } : {}),
      },
      this.#options.model,
    );
    if (this.#streamed) payload.stream = true;
    Object.assign(payload, priorityFields({ priority: this.#priority }, request.urgency));
    const context = { routedFrom, routingShape: this.#options.routedExperts?.shape ?? null, samplingMask };
    const result = await this.#call(
      this.#wire.path,
      payload,
      routedFrom === null && !samplingMask
        ? this.#reader
        : { parse: (json: unknown) => this.#wire.parse(json, fail, context) },
      signal,
      this.#streamed ? newGenerateStream : null,
    );
    if (result.missingLogprobs !== undefined) {
      // llama.cpp leaves out the logprob of a token ending inside a UTF-8 character: computed again.
      await fillMissingLogprobs(
        result,
        promptIds,
        this.#completeToken(model),
        (body) => this.#call(this.#wire.path, body, RAW_JSON, signal, null),
        fail,
      );
    }
    const ids = result.completionIds;
    for (let i = 0; i < ids.length; i++) {
      if (!model.hasToken(ids[i]))
        throw new LlmError(
          'ERR_LLM_BAD_REPLY',
          `token-in reply: token id ${ids[i]} (completion position ${i}) is not in the ${model.name} vocabulary: the server serves another tokenizer than llm.tokenizer`,
        );
    }
    // The stop token stays in the ids (the policy sampled it) but not in the text the environment sees,
    // as a chat completion would give it; the session's text keeps it, since the template writes it back.
    const last = ids.length > 0 ? ids[ids.length - 1] : -1;
    const stripStop = result.finishReason === 'stop' && model.specialIds.has(last);
    const content = model.decode(stripStop ? ids.slice(0, -1) : ids);
    // Tool calls are read from the text only when tools were offered; the content stays the raw text
    // (blocks included): it is what the template writes back, so the next turn extends this sequence.
    const calls =
      request.tools !== undefined && request.tools.length > 0 && result.finishReason !== 'abort'
        ? parseToolCalls(this.#parser, content).calls
        : [];
    if (sessionId !== undefined && rendered !== null && promptText !== null) {
      this.#remember(sessionId, {
        tokens: promptIds.concat(ids),
        coveredText: promptText + content + (stripStop ? model.tokenText(last) : ''),
        lastPromptText: rendered,
        lastPromptLength: promptIds.length,
      });
    } else if (sessionId !== undefined) {
      this.#sessions.delete(sessionId); // a continuation: the next turn rebuilds from it (`previous`)
    }
    return {
      ...(calls.length > 0 ? { toolCalls: calls } : {}),
      content,
      // As vLLM's chat route says it when its parser found calls.
      finishReason: calls.length > 0 && result.finishReason === 'stop' ? 'tool_calls' : result.finishReason,
      promptIds: Int32Array.from(promptIds),
      responseIds: Int32Array.from(ids),
      logprobs: Float32Array.from(result.logprobs),
      weightVersion: result.weightVersion,
      ...(result.versionSpans !== undefined ? { versionSpans: result.versionSpans } : {}),
      ...(result.routedExperts !== undefined ? { routedExperts: result.routedExperts } : {}),
      ...(result.samplingMask !== undefined ? { samplingMask: result.samplingMask } : {}),
      ...(rewrite !== undefined ? { historyRewrite: rewrite } : {}),
      promptTokens: promptIds.length,
      completionTokens: ids.length,
    };
  }

  #routedFrom(request: ChatRequest, promptIds: readonly number[]): number | null {
    return this.#options.routedExperts == null ? null : routedStartOf(request, promptIds);
  }

  get #parser(): ToolParser {
    return this.#options.toolParser ?? 'hermes';
  }

  get #historyMode(): HistoryMode {
    return this.#options.historyMode ?? 'keep-sampled';
  }

  /**
   * The index of the previous reply in `request.messages` when the conversation extends the previous
   * turn's message for message: its messages, then an assistant message saying the reply (its text,
   * or the end of it — the answer without the reasoning, or nothing beside its `tool_calls`), then new
   * ones. Null otherwise: a trimmed or edited history, which is no template's doing.
   */
  #replyIndex(model: ChatModel, base: PromptBase, request: ChatRequest): number | null {
    const previous = request.previous?.messages;
    if (previous === undefined) return null;
    const k = previous.length;
    const reply = request.messages[k];
    if (reply === undefined || reply.role !== 'assistant' || k + 1 >= request.messages.length) return null;
    if (sharedMessageCount(previous, request.messages) !== k) return null;
    const stop = stopText(model, base);
    const sampled =
      stop !== '' && base.coveredText.endsWith(stop) ? base.coveredText.slice(0, -stop.length) : base.coveredText;
    return sampled.endsWith(reply.content) ? k : null;
  }

  /**
   * The text of the messages after the previous reply, as the template writes them after it: the
   * conversation rendered with the reply replaced by a marker no template rewrites, cut after the
   * marker, less the stop token the sampled ids already end with. `{fallback}` (why not) when the
   * marker is not in the render once, or the render after it does not begin with that stop token.
   */
  #newMessagesText(
    model: ChatModel,
    base: PromptBase,
    request: ChatRequest,
    reply: number,
  ): string | { fallback: string } {
    const probe = request.messages.slice();
    probe[reply] = { role: 'assistant', content: REPLY_MARKER };
    let text: string;
    try {
      text = model.render(this.#renderable(probe), { addGenerationPrompt: true, tools: request.tools });
    } catch (err) {
      return {
        fallback: `the template cannot render the conversation with the reply as a marker: ${(err as Error).message}`,
      };
    }
    const at = text.indexOf(REPLY_MARKER);
    if (at < 0 || text.indexOf(REPLY_MARKER, at + 1) >= 0)
      return { fallback: 'the template does not write the reply as it is given, once' };
    const after = text.slice(at + REPLY_MARKER.length);
    const stop = stopText(model, base);
    if (!after.startsWith(stop))
      return {
        fallback: `the template does not end the reply with ${JSON.stringify(stop)}, the token it was sampled ending in`,
      };
    return after.slice(stop.length);
  }

  /**
   * The conversation as the template gets it. An assistant message whose text already holds its calls
   * (the model's own reply in this mode) is rendered from that text alone: rendered again from
   * `tool_calls`, the template would write them a second time, and differently from what was sampled.
   * Other assistant calls get their arguments as objects, as chat templates expect them.
   */
  #renderable(messages: readonly ChatMessage[]): ChatMessage[] {
    if (!messages.some((m) => m.tool_calls !== undefined)) return messages as ChatMessage[];
    return messages.map((m) => {
      if (m.tool_calls === undefined) return m;
      if (parseToolCalls(this.#parser, m.content).calls.length === m.tool_calls.length)
        return { role: m.role, content: m.content };
      const toolCalls = m.tool_calls.map((c) => ({
        ...c,
        function: { name: c.function.name, arguments: argumentsObject(c.function.arguments) },
      }));
      return { ...m, tool_calls: toolCalls as unknown as ChatMessage['tool_calls'] };
    });
  }

  /** A token whose text is whole in any context ("a"), for llama.cpp's recompute calls. */
  #completeToken(model: ChatModel): number {
    return (this.#aToken ??= model.encode('a')[0]);
  }

  forget(sessionId: string): void {
    this.#sessions.delete(sessionId);
  }

  /** Conversations whose sequence is kept for their next turn (at most SESSIONS_KEPT). */
  get sessionsHeld(): number {
    return this.#sessions.size;
  }

  /** The session's sequence so far: cached, or rebuilt from the previous turn the agent loop passes. */
  #base(
    model: ChatModel,
    sessionId: string | undefined,
    previous: ChatRequest['previous'],
    tools: ChatRequest['tools'],
  ): PromptBase | null {
    const cached = sessionId === undefined ? undefined : this.#sessions.get(sessionId);
    if (cached !== undefined) return cached;
    if (previous === undefined || previous.promptIds === null || previous.responseIds === null) return null;
    // The same tools as this turn's: an episode's tools are the same from step to step, or it is tokenized whole.
    const lastPromptText = model.render(this.#renderable(previous.messages), { addGenerationPrompt: true, tools });
    const tokens = Array.from(previous.promptIds);
    for (const id of previous.responseIds) tokens.push(id);
    // decode keeps special tokens: the stop token's text is in it, as the template writes it back.
    return {
      tokens,
      coveredText: lastPromptText + model.decode(Array.from(previous.responseIds)),
      lastPromptText,
      lastPromptLength: previous.promptIds.length,
    };
  }

  #remember(sessionId: string, base: PromptBase): void {
    this.#sessions.delete(sessionId);
    this.#sessions.set(sessionId, base);
    if (this.#sessions.size > SESSIONS_KEPT) this.#sessions.delete(this.#sessions.keys().next().value!);
  }

  async #loadModel(): Promise<ChatModel> {
    if (this.#options.chatModel === undefined)
      throw new LlmError('ERR_LLM_HTTP', 'llm.api "tokens" needs the policy tokenizer (llm.tokenizer)');
    return this.#options.chatModel();
  }
}

/** The text of the stop token the session's sampled ids end with; empty when they end in no special token. */
function stopText(model: ChatModel, base: PromptBase): string {
  const last = base.tokens.at(-1);
  return last !== undefined && model.specialIds.has(last) ? model.tokenText(last) : '';
}

/**
 * A HistoryRewrite whose divergence (token, char, both sides' text) is found when first read:
 * O(log n) decodes of the whole sequence, read only by the once-per-task warning, while a template
 * that rewrites history (Qwen3's, dropping earlier reasoning) does so on every turn of every episode.
 */
function historyRewrite(
  mode: HistoryRewrite['mode'],
  fallback: string | undefined,
  find: () => PrefixDivergence,
): HistoryRewrite {
  let at: PrefixDivergence | undefined;
  const divergence = (): PrefixDivergence => (at ??= find());
  return {
    mode,
    ...(fallback !== undefined ? { fallback } : {}),
    get token() {
      return divergence().token;
    },
    get char() {
      return divergence().char;
    },
    get sampledText() {
      return divergence().sessionText;
    },
    get renderedText() {
      return divergence().renderText;
    },
  };
}

/**
 * Where a token-in call asks for routed experts from: where the session's rows end
 * (`request.routedFrom`) when its prompt extends the sequence those rows belong to (a continued reply
 * always does), else 0 — never past the last prompt token (SGLang and vLLM refuse a start beyond it).
 */
export function routedStartOf(request: ChatRequest, promptIds: readonly number[]): number {
  const from = request.routedFrom ?? 0;
  if (from <= 0) return 0;
  const prev = request.continueTokens ?? request.previous;
  if (prev === undefined || prev.promptIds === null || prev.responseIds === null) return 0;
  if (!extendsSequence(promptIds, prev.promptIds, prev.responseIds)) return 0;
  return Math.min(from, promptIds.length - 1);
}

function argumentsObject(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

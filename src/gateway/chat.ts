/**
 * One chat call through the gateway, independent of HTTP: render → plan the prompt (delta tokens +
 * prefix check) → context check → backend → commit the trace. Nothing in the session changes until
 * the backend has answered, so a failed call (backend down, client gone, 4xx) leaves the session
 * exactly as it was and the agent may simply retry.
 *
 * A main call (first, extend, replay) commits to the session's buffer and main traces; a side call
 * (prompt.ts) only appends a trace of its own, so the main conversation is exactly as if it had not
 * happened. A side call whose prompt ids are those of the side call just before it (the session's
 * latest call) is that call's retry and replaces it, as `replay` does for main calls: an agent that
 * re-sends an aborted or failed side call does not leave the dead one behind.
 *
 * With routed experts asked for (docs/ROUTING-REPLAY.md), a call extending the main conversation asks
 * only for the rows from where the session's rows end — every position before is held by an earlier
 * main call, as in the agent loop (llm/token-chat.ts routedStartOf) — and a first or side call asks
 * from 0: each trace keeps its rows at the positions they were reported for, never shifted.
 */
import { randomUUID } from 'node:crypto';
import { replyStep } from '../domain/weight-versions.ts';
import { routedProblem } from '../domain/routing.ts';
import { samplingParamsOf, type GenerationResult, type SamplingParams, type TokenBackend } from './backend.ts';
import { GatewayError } from './errors.ts';
import type { ChatModel } from '../chat-model/model.ts';
import { planPrompt, type PromptPlan } from '../chat-model/prompt.ts';
import { prefixMismatch, type SideCallMode } from './prompt.ts';
import type { ChatCompletionRequest } from './request.ts';
import type { CallReply } from './response.ts';
import type { Session, SessionStore } from './sessions.ts';
import { hashIds } from './trace.ts';
import type { CallTrace, SideCallTrace } from './trace.ts';

export interface ChatContext {
  model: ChatModel;
  backend: TokenBackend;
  sessions: SessionStore;
  /** Model id echoed in replies when the request names none. */
  servedModel: string;
  maxContext: number;
  defaultMaxTokens: number | null;
  sideCalls: SideCallMode;
  maxSideCalls: number;
  /** Weight version for calls whose backend reports none. */
  modelStep(): number;
  /** The model step a backend's weight version stands for (domain/weight-versions.ts AnnouncedVersions.stepOf). */
  stepOfVersion(version: string | null): number;
  /** A reply from other weights than those served when the call went out (domain/weight-versions.ts replyStep). */
  onVersionMismatch(version: string, expected: number, tagged: number): void;
  /** Ask the backend for routed experts (gateway option `routedExperts`). */
  routedExperts?: boolean;
  /** Ask the backend for sampling masks where the call's sampling truncates (gateway option `samplingMasks`). */
  samplingMasks?: boolean;
}

export async function runChatCall(
  ctx: ChatContext,
  request: ChatCompletionRequest,
  sessionId: string | null,
  signal?: AbortSignal,
): Promise<CallReply> {
  const t0 = performance.now();
  const id = sessionId ?? `anon-${randomUUID()}`;
  const rendered = ctx.model.render(request.messages, { addGenerationPrompt: true, tools: request.tools });
  const t1 = performance.now();

  const existing = ctx.sessions.get(id);
  if (existing?.busy) {
    throw new GatewayError(
      'ERR_GATEWAY_SESSION_BUSY',
      `session ${JSON.stringify(id)} already has a call in flight; a session's turns are sequential (each prompt extends the previous completion)`,
      {
        param: 'session_id',
        details: { session_id: id },
      },
    );
  }
  const base = existing !== undefined && existing.traces.length > 0 ? existing : null;
  const plan = planPrompt(
    ctx.model,
    base,
    rendered,
    ctx.sideCalls === 'refuse'
      ? { refuse: (b) => prefixMismatch(ctx.model, id, b, rendered, (char) => messageAt(ctx.model, request, char)) }
      : {},
  );
  let retriedSide: SideCallTrace | null = null;
  if (plan.kind === 'side') {
    // A side call needs a main call before it, so `existing` is set.
    const previous = existing!.sideCalls.at(-1);
    if (existing!.lastCallSide && previous !== undefined && sameIds(previous.promptIds, plan.promptIds)) {
      retriedSide = previous;
    } else if (existing!.sideCalls.length >= ctx.maxSideCalls) {
      throw new GatewayError(
        'ERR_GATEWAY_TOO_MANY_SIDE_CALLS',
        `session ${JSON.stringify(id)} already keeps ${existing!.sideCalls.length} side calls (maxSideCalls ${ctx.maxSideCalls}), and this call does not extend its conversation: ` +
          'stitch the session and start a new one, or raise maxSideCalls',
        {
          param: 'messages',
          details: { session_id: id, side_calls: existing!.sideCalls.length, max_side_calls: ctx.maxSideCalls },
        },
      );
    }
  }
  const promptLength = plan.promptIds.length;
  if (promptLength >= ctx.maxContext) {
    throw new GatewayError(
      'ERR_GATEWAY_CONTEXT_LENGTH',
      `session ${JSON.stringify(id)}: the prompt is ${promptLength} tokens and the context limit is ${ctx.maxContext} tokens (max-context), which leaves no room for a completion`,
      {
        param: 'messages',
        details: { session_id: id, prompt_tokens: promptLength, max_context: ctx.maxContext },
      },
    );
  }
  const room = ctx.maxContext - promptLength;
  // Clamped rather than rejected (vLLM would 400): an agent near the end of its context still gets a
  // reply, finishing with `length`, and the sample is marked truncated.
  const maxTokens = Math.min(request.maxTokens ?? ctx.defaultMaxTokens ?? room, room);
  const t2 = performance.now();

  const session = ctx.sessions.open(id, sessionId === null);
  session.busy = true;
  const sentAt = ctx.modelStep();
  const sampling = samplingParamsOf(request);
  let result;
  try {
    result = await ctx.backend.generate(
      {
        ...sampling,
        promptIds: plan.promptIds,
        maxTokens,
        topLogprobs: request.topLogprobs,
        ...(ctx.routedExperts === true ? { routedFrom: routedStart(session, plan) } : {}),
        ...(ctx.samplingMasks === true && truncates(sampling) ? { samplingMask: true } : {}),
      },
      signal,
    );
    checkVocabulary(ctx, result.completionIds);
    checkRouting(ctx, result, promptLength);
  } catch (err) {
    session.busy = false;
    if (session.traces.length === 0) ctx.sessions.release(id, 'failed');
    else ctx.sessions.touch(session);
    throw err;
  }
  const t3 = performance.now();

  const ids = result.completionIds;
  const last = ids.length > 0 ? ids[ids.length - 1] : -1;
  // The stop token (end of turn) stays in the trace — the policy sampled it and must learn to — but not
  // in the message content, as with vLLM's skip_special_tokens. The session's text keeps it, because
  // the template writes it back after the assistant message on the next turn.
  const stripStop = result.finishReason === 'stop' && ctx.model.specialIds.has(last);
  const contentTokens = stripStop ? ids.length - 1 : ids.length;
  const content = ctx.model.decode(ids.slice(0, contentTokens));
  const version = result.weightVersion;
  const modelStep = replyStep(ctx.stepOfVersion(version), sentAt, ctx.modelStep(), (expected, tagged) =>
    ctx.onVersionMismatch(version!, expected, tagged),
  );

  const timings = { renderMs: t1 - t0, tokenizeMs: t2 - t1, backendMs: t3 - t2, totalMs: 0 };
  const completionIds = Int32Array.from(ids);
  const logprobs = Float32Array.from(result.logprobs);
  let promptIds: readonly number[];
  if (plan.kind === 'side') {
    if (retriedSide !== null) session.sideCalls.pop();
    session.sideCalls.push({
      index: retriedSide?.index ?? nextIndex(session),
      promptIds: Int32Array.from(plan.promptIds),
      deltaLength: plan.deltaLength,
      completionIds,
      logprobs,
      finishReason: result.finishReason,
      modelStep,
      timings,
      ...routingOf(result),
    });
    session.lastCallSide = true;
    promptIds = plan.promptIds;
  } else {
    // A retry takes the place of the call it replaces, so indices stay 0..calls−1 in every session.
    const replaced = plan.kind === 'replay' ? session.traces.pop() : undefined;
    const trace: CallTrace = {
      index: replaced?.index ?? nextIndex(session),
      promptLength,
      deltaLength: plan.deltaLength,
      promptHash: hashIds(plan.promptIds),
      completionIds,
      logprobs,
      finishReason: result.finishReason,
      modelStep,
      timings,
      ...routingOf(result),
    };
    session.traces.push(trace);
    const tokens = plan.promptIds;
    for (let i = 0; i < ids.length; i++) tokens.push(ids[i]);
    session.tokens = tokens;
    session.coveredText = rendered + content + (stripStop ? ctx.model.tokenText(last) : '');
    session.lastPromptText = rendered;
    session.lastPromptLength = promptLength;
    session.lastCallSide = false;
    promptIds = tokens;
  }
  session.busy = false;
  ctx.sessions.touch(session);
  timings.totalMs = performance.now() - t0;

  return {
    id: `chatcmpl-${randomUUID().replaceAll('-', '').slice(0, 24)}`,
    created: Math.floor(Date.now() / 1000),
    model: request.model ?? ctx.servedModel,
    sessionId: id,
    content,
    contentTokens,
    completionIds: ids,
    promptTokens: promptLength,
    promptIds: request.returnTokenIds ? promptIds.slice(0, promptLength) : null,
    logprobs: result.logprobs,
    topLogprobs: result.topLogprobs,
    finishReason: result.finishReason,
    modelStep,
    sideCall: plan.kind === 'side',
    timings,
    wantLogprobs: request.logprobs,
    wantTopLogprobs: request.topLogprobs,
    wantTokenIds: request.returnTokenIds,
    includeUsage: request.includeUsage,
  };
}

/**
 * Where a call asks for routed experts from: a call extending the main conversation (`extend`, or the
 * `replay` of its last call) from where the rows of the main calls it keeps end — each of their
 * sequences is a prefix of its prompt — but never past its last prompt token (vLLM and SGLang refuse
 * a start beyond it); a first or side call from 0.
 */
function routedStart(session: Session, plan: PromptPlan): number {
  if (plan.kind === 'first' || plan.kind === 'side') return 0;
  const kept = plan.kind === 'replay' ? session.traces.length - 1 : session.traces.length;
  // Rows only grow along the main line: the latest kept call holding any ends them.
  for (let i = kept - 1; i >= 0; i--) {
    const r = session.traces[i].routedExperts;
    if (r !== undefined) return Math.max(0, Math.min(r.start + r.rows, plan.promptIds.length - 1));
  }
  return 0;
}

/** The call's sampling truncates the support (SGLang refuses a mask over the whole vocabulary). */
function truncates(s: SamplingParams): boolean {
  return (
    (s.topK !== undefined && s.topK > 0) || (s.topP !== undefined && s.topP < 1) || (s.minP !== undefined && s.minP > 0)
  );
}

/** Rows for positions the call's sequence never forwarded are the backend's fault (as in worker/routing.ts). */
function checkRouting(ctx: ChatContext, result: GenerationResult, promptLength: number): void {
  const r = result.routedExperts;
  if (r === undefined) return;
  const problem = routedProblem(r, promptLength + result.completionIds.length);
  if (problem !== null)
    throw new GatewayError(
      'ERR_BACKEND_BAD_REPLY',
      `backend ${ctx.backend.endpoint} reply unusable: routed experts: ${problem}`,
    );
}

function routingOf(result: GenerationResult): Pick<CallTrace, 'routedExperts' | 'samplingMask'> {
  return {
    ...(result.routedExperts !== undefined ? { routedExperts: result.routedExperts } : {}),
    ...(result.samplingMask !== undefined ? { samplingMask: result.samplingMask } : {}),
  };
}

/** Calls recorded so far (a retry replaces one): the next call's index. */
function nextIndex(session: Session): number {
  return session.traces.length + session.sideCalls.length;
}

function sameIds(a: Int32Array, b: readonly number[]): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** Ids from a backend serving another tokenizer would decode to garbage (or silently to nothing). */
function checkVocabulary(ctx: ChatContext, ids: readonly number[]): void {
  for (let i = 0; i < ids.length; i++) {
    if (!ctx.model.hasToken(ids[i])) {
      throw new GatewayError(
        'ERR_BACKEND_BAD_REPLY',
        `backend ${ctx.backend.endpoint} returned token id ${ids[i]} (completion position ${i}), which is not in the ${ctx.model.name} vocabulary: the backend serves another tokenizer than the gateway's`,
        {
          details: { position: i, token_id: ids[i] },
        },
      );
    }
  }
}

/**
 * The first message whose rendering reaches past character `char` — rendering growing prefixes of the
 * conversation, so it costs O(messages) renders: for the mismatch error only.
 */
function messageAt(model: ChatModel, request: ChatCompletionRequest, char: number): number | null {
  for (let k = 1; k <= request.messages.length; k++) {
    try {
      if (
        model.render(request.messages.slice(0, k), { addGenerationPrompt: false, tools: request.tools }).length > char
      )
        return k - 1;
    } catch {
      return null;
    }
  }
  return null;
}

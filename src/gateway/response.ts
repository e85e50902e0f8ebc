/**
 * The OpenAI shapes of one finished call: a `chat.completion` object, or the same content as a
 * `chat.completion.chunk` SSE stream ending in `data: [DONE]`. Both carry vLLM's extras when asked
 * (`prompt_token_ids`, `token_ids`), plus `session_id`, `metadata.weight_version` and
 * `metadata.side_call` (the call did not extend the session's conversation and was kept apart).
 *
 * The stream is produced after generation is complete (the backend is called token-in/token-out,
 * non-streaming), so it is one write: the chunk format is what OpenAI clients need, not the timing.
 */
import type { TopLogprob } from './backend.ts';
import type { ChatModel } from '../chat-model/model.ts';
import type { CallTimings } from './trace.ts';

export interface CallReply {
  id: string;
  created: number;
  model: string;
  sessionId: string;
  /** Message content: the completion decoded without its trailing stop token. */
  content: string;
  /** How many leading completion ids make up `content` (all but a stripped stop token). */
  contentTokens: number;
  completionIds: readonly number[];
  promptTokens: number;
  /** Only when the client asked for token ids. */
  promptIds: readonly number[] | null;
  logprobs: readonly number[];
  topLogprobs: TopLogprob[][] | null;
  finishReason: string;
  modelStep: number;
  /** The call was recorded as a side call (prompt.ts). */
  sideCall: boolean;
  /** Of the trace recorded for the call. */
  timings: CallTimings;
  /** What the client asked to get back. */
  wantLogprobs: boolean;
  wantTopLogprobs: number;
  wantTokenIds: boolean;
  includeUsage: boolean;
}

function logprobEntry(model: ChatModel, reply: CallReply, i: number): Record<string, unknown> {
  const top =
    reply.wantTopLogprobs > 0 && reply.topLogprobs !== null ? reply.topLogprobs[i].slice(0, reply.wantTopLogprobs) : [];
  return {
    token: model.tokenText(reply.completionIds[i]),
    logprob: reply.logprobs[i],
    bytes: null,
    top_logprobs: top.map((t) => ({
      token: t.token ?? (t.tokenId !== null ? model.tokenText(t.tokenId) : ''),
      logprob: t.logprob,
      bytes: null,
    })),
  };
}

function usage(reply: CallReply): Record<string, number> {
  const prompt = reply.promptTokens;
  const completion = reply.completionIds.length;
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
}

export function chatCompletionBody(model: ChatModel, reply: CallReply): Record<string, unknown> {
  const choice: Record<string, unknown> = {
    index: 0,
    message: { role: 'assistant', content: reply.content },
    logprobs: reply.wantLogprobs ? { content: reply.completionIds.map((_, i) => logprobEntry(model, reply, i)) } : null,
    finish_reason: reply.finishReason,
  };
  if (reply.wantTokenIds) choice.token_ids = reply.completionIds;
  const body: Record<string, unknown> = {
    id: reply.id,
    object: 'chat.completion',
    created: reply.created,
    model: reply.model,
    choices: [choice],
    usage: usage(reply),
    session_id: reply.sessionId,
    metadata: { weight_version: reply.modelStep, side_call: reply.sideCall },
  };
  if (reply.wantTokenIds) body.prompt_token_ids = reply.promptIds;
  return body;
}

/**
 * Content text per completion token, such that the pieces concatenate to `content`. A token that ends
 * inside a multi-byte character yields '' and its text comes with the token that completes it (the
 * incremental detokenization vLLM and TGI use: decode a short window and emit only settled text).
 */
function contentPieces(model: ChatModel, ids: readonly number[], contentTokens: number, content: string): string[] {
  const pieces = new Array<string>(ids.length).fill('');
  let prefixOffset = 0;
  let readOffset = 0;
  let emitted = 0;
  for (let i = 0; i < contentTokens; i++) {
    const prefixText = model.decode(ids.slice(prefixOffset, readOffset));
    const newText = model.decode(ids.slice(prefixOffset, i + 1));
    if (newText.length > prefixText.length && !newText.endsWith('\uFFFD')) {
      pieces[i] = newText.slice(prefixText.length);
      emitted += pieces[i].length;
      prefixOffset = readOffset;
      readOffset = i + 1;
    }
  }
  // Bytes that never formed a character (a generation cut mid-character) are in `content` as U+FFFD.
  if (contentTokens > 0 && emitted < content.length) pieces[contentTokens - 1] += content.slice(emitted);
  if (pieces.join('') !== content) {
    // A decoder whose windows do not add up: correctness of the text first.
    pieces.fill('');
    pieces[0] = content;
  }
  return pieces;
}

export function chatCompletionSse(model: ChatModel, reply: CallReply): string {
  const head = `{"id":${JSON.stringify(reply.id)},"object":"chat.completion.chunk","created":${reply.created},"model":${JSON.stringify(reply.model)},"session_id":${JSON.stringify(reply.sessionId)},`;
  const out: string[] = [];
  const first: Record<string, unknown> = {
    index: 0,
    delta: { role: 'assistant', content: '' },
    logprobs: null,
    finish_reason: null,
  };
  out.push(
    `data: ${head}"choices":[${JSON.stringify(first)}]${reply.wantTokenIds ? `,"prompt_token_ids":${JSON.stringify(reply.promptIds)}` : ''}}\n\n`,
  );
  const pieces = contentPieces(model, reply.completionIds, reply.contentTokens, reply.content);
  for (let i = 0; i < reply.completionIds.length; i++) {
    const choice: Record<string, unknown> = {
      index: 0,
      delta: { content: pieces[i] },
      logprobs: reply.wantLogprobs ? { content: [logprobEntry(model, reply, i)] } : null,
      finish_reason: null,
    };
    if (reply.wantTokenIds) choice.token_ids = [reply.completionIds[i]];
    out.push(`data: ${head}"choices":[${JSON.stringify(choice)}]}\n\n`);
  }
  const last = { index: 0, delta: {}, logprobs: null, finish_reason: reply.finishReason };
  out.push(
    `data: ${head}"choices":[${JSON.stringify(last)}],"metadata":{"weight_version":${reply.modelStep},"side_call":${reply.sideCall}}}\n\n`,
  );
  if (reply.includeUsage) out.push(`data: ${head}"choices":[],"usage":${JSON.stringify(usage(reply))}}\n\n`);
  out.push('data: [DONE]\n\n');
  return out.join('');
}

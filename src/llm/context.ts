/**
 * Context limits are a truncation, not a failure. A long agent episode outgrows the server's context
 * sooner or later; each server then refuses the call with a 400 of its own words. That reply, and a
 * prompt counted over the limit before sending (`api: tokens`), become a reply flagged
 * `contextExceeded`: the agent loop ends the episode as truncated with every turn it has.
 */
import { serverMessage } from '../protocol/errors.ts';
import type { ChatResult } from './reply.ts';

/**
 * Each server's refusal of a prompt + max_tokens over its context (the mock's dialects reproduce them):
 * - vLLM: "This model's maximum context length is N tokens. However, you requested M tokens …" (older)
 *   or "… maximum context length is N tokens and your request has M input tokens …" (serving_engine.py);
 * - SGLang: "The input (N tokens) is longer than the model's context length (M tokens)." or "Requested
 *   token count exceeds the model's maximum context length of N tokens …" (tokenizer_manager.py);
 * - llama.cpp: "request (N tokens) exceeds the available context size (M tokens), try increasing it",
 *   type `exceed_context_size_error` (tools/server/server-context.cpp, server-common.cpp);
 * - OpenAI: code `context_length_exceeded`.
 */
const OVERFLOW =
  /maximum context length|longer than the model's context length|exceeds? the available context size|exceed_context_size_error|context_length_exceeded/i;

export function isContextOverflow(status: number, text: string): boolean {
  return status === 400 && OVERFLOW.test(text);
}

/** The reply standing for a refused call: no tokens, finish reason `length`, and why. */
export function contextOverflowReply(why: string): ChatResult {
  return {
    content: '',
    finishReason: 'length',
    promptIds: null,
    responseIds: null,
    logprobs: null,
    weightVersion: null,
    promptTokens: null,
    completionTokens: 0,
    contextExceeded: serverMessage(why),
  };
}

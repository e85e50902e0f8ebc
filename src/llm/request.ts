/**
 * What one inference call asks for: the conversation and its sampling budget, plus what continues an
 * interrupted reply. Every client (chat, token-in) and the agent loop speak it.
 */
import type { ChatMessage } from '../domain/rollout.ts';

export interface ChatRequest {
  messages: ChatMessage[];
  maxTokens: number;
  temperature: number;
  /** Sampling seed (OpenAI `seed`): the same rollout turn samples the same way when it is continued. */
  seed?: number;
  /**
   * Text of a partial assistant reply to continue (a generation interrupted by a weight update):
   * sent as a final assistant message with vLLM's `continue_final_message`.
   */
  continueFrom?: string;
  /** The same partial reply as tokens (`api: tokens`): its prompt ids and the ids generated so far. */
  continueTokens?: { promptIds: Int32Array; responseIds: Int32Array };
  /**
   * The session's previous turn (`api: tokens`): the messages it was rendered from and its ids, so
   * this turn's prompt extends that exact sequence even when no cache holds it (another worker, a
   * restart after a pause).
   */
  previous?: { messages: readonly ChatMessage[]; promptIds: Int32Array | null; responseIds: Int32Array | null };
}

/**
 * What one inference call asks for: the conversation and its sampling budget, plus what continues an
 * interrupted reply. Every client (chat, token-in) and the agent loop speak it.
 */
import type { ChatMessage } from '../domain/rollout.ts';
import type { SamplingSettings } from './token-wire.ts';

/** An OpenAI function tool, as sent in `tools` (env/types.ts: an environment's, or an MCP server's). */
export interface ToolSchema {
  type: 'function';
  function: { name: string; description?: string; parameters?: Record<string, unknown>; strict?: boolean };
}

/** OpenAI `tool_choice`: let the model decide, make it call one, or forbid calls. */
export type ToolChoice = 'auto' | 'required' | 'none';

export interface ChatRequest {
  messages: ChatMessage[];
  maxTokens: number;
  temperature: number;
  /**
   * Truncation and penalties the task sets (top_p, top_k, …); each one absent is sent at the server's
   * neutral value (llm/token-wire.ts samplingFields).
   */
  sampling?: SamplingSettings;
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
  /** Tools the model may call this turn (OpenAI `tools`); absent or empty: none are sent. */
  tools?: ToolSchema[];
  toolChoice?: ToolChoice;
  /**
   * With routed experts asked for (`llm.routedExperts`): the sequence position from which the session
   * still lacks rows — where the rows of the sequence this call extends (the partial reply it
   * continues, else the previous turn) end. A token-in call whose prompt extends that sequence asks
   * only from there; any other asks from 0 (docs/ROUTING-REPLAY.md).
   */
  routedFrom?: number;
  /**
   * `llm.priority: trajectory`: how soon the call should be served, 0..URGENCY_LEVELS, higher = sooner
   * (llm/priority.ts); sent in the dialect's `priority` field where it has one.
   */
  urgency?: number;
}

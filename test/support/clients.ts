/**
 * Client factories for tests against loopback servers: the inference client the workers use, and the
 * OpenAI SDK client an agent behind the gateway uses. Defaults suit a server on 127.0.0.1; a test
 * states in `overrides` only what it is about.
 */
import OpenAI from 'openai';
import { LlmClient, type LlmClientOptions } from '../../src/llm/client.ts';

/** Everything but the URL: model `m`, token ids and logprobs asked for, no retries, 5 s per call. */
export const TEST_CLIENT: Omit<LlmClientOptions, 'url'> = {
  model: 'm',
  apiKey: null,
  timeoutMs: 5_000,
  maxReplyBytes: 64 * 1024 * 1024,
  retries: 0,
  retryBackoffMs: 1,
  connections: 2,
  returnTokenIds: true,
  logprobs: true,
};

/** An inference client for `url` (the server's base, `/v1` included where it routes so). */
export function llmClient(url: string, overrides: Partial<LlmClientOptions> = {}): LlmClient {
  return new LlmClient({ ...TEST_CLIENT, url, ...overrides });
}

/** The OpenAI SDK as an agent would use it, without its retries: a 4xx/5xx surfaces exactly as the server sent it. */
export function openaiClient(baseURL: string): OpenAI {
  return new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 30_000 });
}

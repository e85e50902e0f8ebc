/**
 * Why an episode did not end normally, in the kinds a trainer must tell apart: an `infrastructure`
 * failure (a server gone, a session lost, a judge that failed) says nothing about the policy, so its
 * rollout is never trained — as reward 0 it would teach the wrong thing — and runs again in its slot;
 * every other kind is the episode's own outcome and is counted as it is.
 *
 * The one table from error codes (src/error-codes.ts) to kinds. An error without a code is the
 * environment's own (its code threw).
 */
export const FAILURE_KINDS = ['environment', 'infrastructure', 'inference', 'timeout', 'parse', 'policy'] as const;
export type FailureKind = (typeof FAILURE_KINDS)[number];

const BY_CODE: Readonly<Record<string, FailureKind>> = {
  ERR_ENV_INFRA: 'infrastructure',
  ERR_ENV_UNREACHABLE: 'infrastructure',
  ERR_ENV_CLOSED: 'infrastructure',
  ERR_ENV_POOL_EXHAUSTED: 'infrastructure',
  // Sent, and its answer lost: the server may hold the step, so the episode cannot go on — nor is it the policy's.
  ERR_ENV_STEP_UNCERTAIN: 'infrastructure',
  ERR_WORKER: 'infrastructure',
  ERR_ENV_TIMEOUT: 'timeout',
  ERR_HOOK_TIMEOUT: 'timeout',
  ERR_LLM_TIMEOUT: 'timeout',
  ERR_ENV_BAD_REPLY: 'parse',
  ERR_ENV_TOO_LARGE: 'parse',
  ERR_PROTOCOL: 'parse',
  ERR_CONTEXT_EXCEEDED: 'policy',
  ERR_AGENT_BAD_REWARD: 'environment',
  ERR_AGENT_NO_REWARD: 'environment',
};

/**
 * The kind of a failure, from the error that caused it: its code, and for ERR_ENV_HTTP its status (a
 * 5xx after every retry is the server's trouble, a 4xx the environment refusing what it was sent).
 */
export function failureKindOf(err: unknown): FailureKind {
  const { code, status } = (err ?? {}) as { code?: unknown; status?: unknown };
  if (typeof code !== 'string') return 'environment';
  if (code === 'ERR_ENV_HTTP') return typeof status === 'number' && status >= 500 ? 'infrastructure' : 'environment';
  const kind = BY_CODE[code];
  if (kind !== undefined) return kind;
  return code.startsWith('ERR_LLM_') ? 'inference' : 'environment';
}

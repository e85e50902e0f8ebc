/**
 * Why an episode did not end normally, in the kinds a trainer must tell apart: an `infrastructure`
 * failure (a server gone, a session lost, a judge that failed) says nothing about the policy, so its
 * rollout is never trained — as reward 0 it would teach the wrong thing — and goes on in its slot
 * from its last finished step (worker/continuation.ts); every other kind is the episode's own
 * outcome and is counted as it is.
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
  // The first prompt does not fit: the task's, before the policy said anything.
  ERR_CONTEXT_EXCEEDED: 'environment',
  ERR_LLM_FINISH_REASON: 'inference',
  // A reply that cannot be made into an action the environment takes: the policy's.
  ERR_ENV_BAD_ACTION: 'policy',
  ERR_ENV_REFUSED: 'environment',
  ERR_ENV_EPISODE: 'environment',
  ERR_AGENT_BAD_REWARD: 'environment',
  ERR_AGENT_NO_REWARD: 'environment',
};

/**
 * `policy` is the environment saying the model broke the episode's rules in a way it cannot score (an
 * adapter's call); the engine's own errors are never the policy's — a reply cut by max tokens or a
 * conversation past the context is a truncated episode, trained as such, not a failure.
 *
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

/**
 * The kind of a failure known only by its reason string (`CODE: message`, as describeError writes it):
 * what a rollout that failed before kinds were recorded is counted as.
 */
export function failureKindOfReason(reason: string | null): FailureKind {
  const code = /^(ERR_[A-Z0-9_]+)\b/.exec(reason ?? '')?.[1];
  return failureKindOf(code === undefined ? null : { code });
}

/** A count of each kind, all 0. */
export function noFailures(): Record<FailureKind, number> {
  return { environment: 0, infrastructure: 0, inference: 0, timeout: 0, parse: 0, policy: 0 };
}

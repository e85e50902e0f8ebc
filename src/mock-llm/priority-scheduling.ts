/**
 * Which waiting request the GPU-like mock admits first, and which running one it preempts, under a
 * server's priority scheduling (capacity option `scheduling: priority`). Without it the queue is FIFO.
 *
 * As the real servers do it (docs/SCHEDULING.md cites the source):
 * - vLLM, `--scheduling-policy priority`: the waiting queue is a heap on (priority, arrival) — lower
 *   value first (vllm/v1/core/sched/request_queue.py PriorityRequestQueue). A running request is
 *   preempted only when the KV cache cannot grow (the victim is the max of (priority, arrival)), never
 *   for a waiting one: the mock has no KV limit, so it never preempts.
 * - SGLang, `--enable-priority-scheduling`: the waiting queue sorted by (priority × sign, entry time),
 *   higher value first unless `--schedule-low-priority-values-first`; with the batch full, a waiting
 *   request preempts running ones whose priority is worse by more than
 *   `--priority-scheduling-preemption-threshold` (10), the worst (and latest) first, which go back to
 *   the queue to prefill again (python/sglang/srt/managers/schedule_policy.py preempt_to_schedule).
 *
 * The model sees a rank: lower = sooner, whichever way the server reads its field (Gpu converts).
 */

/** How a server reads the `priority` field of a request. */
export interface PriorityRule {
  /** vLLM: true (lower value first); SGLang: false by default (higher first). */
  lowerFirst: boolean;
  /** Rank gap past which a waiting request preempts a running one; null = never (vLLM). */
  preemptThreshold: number | null;
}

/** vLLM's `--scheduling-policy priority` (the mock's default and vllm dialects). */
export const VLLM_PRIORITY: PriorityRule = Object.freeze({ lowerFirst: true, preemptThreshold: null });
/** SGLang's `--enable-priority-scheduling` with its defaults (higher first, threshold 10). */
export const SGLANG_PRIORITY: PriorityRule = Object.freeze({ lowerFirst: false, preemptThreshold: 10 });

/** A request's rank under `rule` (lower = sooner); an absent priority is 0, as on both servers. */
export function rankOf(priority: number | undefined, rule: PriorityRule): number {
  const p = priority ?? 0;
  return rule.lowerFirst ? p : -p;
}

export interface Ranked {
  readonly id: number;
  readonly rank: number;
}

/** Index in `queue` of the one to admit next: the lowest rank, the earliest arrival (id) among equals. */
export function nextIndex(queue: readonly Ranked[]): number {
  let best = 0;
  for (let i = 1; i < queue.length; i++) {
    const a = queue[i];
    const b = queue[best];
    if (a.rank < b.rank || (a.rank === b.rank && a.id < b.id)) best = i;
  }
  return best;
}

/**
 * The running one `candidate` preempts with the batch full, or null: the worst-ranked (the latest
 * among equals), if its rank is worse than the candidate's by more than `threshold`.
 */
export function preemptionVictim<T extends Ranked>(
  running: Iterable<T>,
  candidate: Ranked,
  threshold: number,
): T | null {
  let worst: T | null = null;
  for (const r of running) {
    if (worst === null || r.rank > worst.rank || (r.rank === worst.rank && r.id > worst.id)) worst = r;
  }
  return worst !== null && worst.rank - candidate.rank > threshold ? worst : null;
}

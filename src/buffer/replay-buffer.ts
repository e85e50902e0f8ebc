/**
 * The replay buffer: groups by task and status, taken FIFO by insertion.
 *
 * Invariants:
 * - a group id is in at most one status pool of its task;
 * - FAILED and FILTERED groups are never stored — they are counted in `dropped` and their reasons kept
 *   in `lastDropReason`, so every group the producer made is either stored, taken or counted here.
 */
import { Status, type RolloutGroup } from '../protocol/rollout.ts';

const STORED_STATUSES = [Status.COMPLETED, Status.ABORTED, Status.EXPIRED] as const;
type StoredStatus = (typeof STORED_STATUSES)[number];

export class ReplayBuffer {
  /** task → status → (group id → group); Map iteration order is insertion order, which gives FIFO. */
  readonly #pools = new Map<string, Map<StoredStatus, Map<string, RolloutGroup>>>();
  readonly #dropped = { FAILED: 0, FILTERED: 0 };
  #lastDropReason: string | null = null;

  constructor(taskNames: readonly string[]) {
    for (const name of taskNames) this.#pools.set(name, new Map(STORED_STATUSES.map((s) => [s, new Map()])));
  }

  /** Store a finished group under its status; FAILED / FILTERED ones are counted and let go. */
  put(group: RolloutGroup): void {
    const pools = this.#taskPools(group.taskName);
    for (const pool of pools.values()) pool.delete(group.id);
    if (group.status === Status.FAILED || group.status === Status.FILTERED) {
      this.#dropped[group.status]++;
      this.#lastDropReason = group.error ?? group.rollouts.find((r) => r.error !== null)?.error ?? group.status;
      return;
    }
    const pool = pools.get(group.status as StoredStatus);
    if (pool === undefined) throw new Error(`replay buffer cannot store group ${group.id} with status ${group.status}`);
    pool.set(group.id, group);
  }

  count(taskName?: string, status: StoredStatus = Status.COMPLETED): number {
    let n = 0;
    for (const [name, pools] of this.#pools) if (taskName === undefined || name === taskName) n += pools.get(status)!.size;
    return n;
  }

  /** Remove and return up to `n` COMPLETED groups of a task, oldest first. */
  take(taskName: string, n: number): RolloutGroup[] {
    const pool = this.#taskPools(taskName).get(Status.COMPLETED)!;
    const out: RolloutGroup[] = [];
    for (const [id, group] of pool) {
      if (out.length >= n) break;
      pool.delete(id);
      out.push(group);
    }
    return out;
  }

  get dropped(): Readonly<Record<'FAILED' | 'FILTERED', number>> {
    return { ...this.#dropped };
  }

  get lastDropReason(): string | null {
    return this.#lastDropReason;
  }

  #taskPools(taskName: string): Map<StoredStatus, Map<string, RolloutGroup>> {
    const pools = this.#pools.get(taskName);
    if (pools === undefined) throw new Error(`replay buffer has no task ${JSON.stringify(taskName)}`);
    return pools;
  }
}

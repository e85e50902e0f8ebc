/**
 * The replay buffer: groups by task and status.
 *
 * Invariants:
 * - a group id is in at most one pool (task × status) at a time;
 * - only COMPLETED, ABORTED and EXPIRED groups are stored; FAILED, FILTERED and expired-but-not-
 *   retryable groups are counted in `dropped` (with the last reason) and let go — so every group the
 *   producer made is stored, taken, or counted here;
 * - Map iteration order is insertion order, which is what "FIFO by insertion" means below.
 *
 * Expiry lifecycle (on every put and every refresh, for COMPLETED / ABORTED / EXPIRED groups): a
 * member whose staleness reaches the threshold, or whose every token the token-level mask would
 * mask, has expired — here and nowhere else, so the EXPIRED pool and the drop counts the tail-batch
 * trigger and the stats read always hold every expired group. When expired groups are retryable, only
 * the expired members are reset to their prompt and marked EXPIRED (siblings keep their responses);
 * when they are not, the whole group is dropped and counted.
 */
import {
  approxGroupBytes,
  groupError,
  groupStatus,
  resetToPrompt,
  responseTokenCount,
  Status,
  type RolloutGroup,
} from '../domain/rollout.ts';
import { rolloutExpired, rolloutMinModelStep } from './staleness.ts';

const STORED_STATUSES = [Status.COMPLETED, Status.ABORTED, Status.EXPIRED] as const;
export type StoredStatus = (typeof STORED_STATUSES)[number];
export type DropReason = 'FAILED' | 'FILTERED' | 'EXPIRED';
export type TakeOrder = 'fifo' | 'stalest';

export interface ExpiryPolicy {
  /** The consumer's train step staleness is measured against. */
  trainStep: number;
  /** staleThreshold(maxStaleness, syncWeightsInterval); Infinity disables group-level expiry. */
  threshold: number;
  /** producer.tokenStalenessThreshold: a member with every token this stale expires; null or absent = off. */
  tokenThreshold?: number | null;
  /** true: reset expired members and keep the group as EXPIRED; false: drop the group. */
  retryable: boolean;
}

export interface BufferSnapshot {
  /** Every stored group, pool by pool in insertion order. */
  groups: RolloutGroup[];
  dropped: Record<DropReason, number>;
  lastDropReason: string | null;
}

export function emptyDropCounts(): Record<DropReason, number> {
  return { FAILED: 0, FILTERED: 0, EXPIRED: 0 };
}

export class ReplayBuffer {
  /** task → status → (group id → group). */
  readonly #pools = new Map<string, Map<StoredStatus, Map<string, RolloutGroup>>>();
  readonly #dropped: Record<DropReason, number> = emptyDropCounts();
  /** Approximate bytes of every stored group (approxGroupBytes), kept as groups come and go. */
  readonly #sizes = new Map<string, number>();
  #bytes = 0;
  #lastDropReason: string | null = null;
  /** Called with every group that leaves the buffer's accounting by being dropped. */
  onDrop: ((group: RolloutGroup, reason: DropReason) => void) | null = null;
  /** Called with the response tokens thrown away when expired members are reset to their prompts. */
  onReset: ((tokens: number) => void) | null = null;

  constructor(taskNames: readonly string[]) {
    for (const name of taskNames) this.#pools.set(name, new Map(STORED_STATUSES.map((s) => [s, new Map()])));
  }

  /**
   * Store a finished group under its status after the expiry lifecycle; returns where it went
   * (its stored status, or the drop reason).
   */
  put(group: RolloutGroup, expiry?: ExpiryPolicy): StoredStatus | DropReason {
    const pools = this.#taskPools(group.taskName);
    for (const pool of pools.values()) pool.delete(group.id);
    group.status = groupStatus(group.rollouts);
    if (group.status === Status.FAILED || group.status === Status.FILTERED) {
      this.#drop(group, group.status);
      return group.status;
    }
    if (expiry !== undefined && !applyExpiry(group, expiry, this.onReset)) {
      this.#drop(group, 'EXPIRED');
      return 'EXPIRED';
    }
    const status = group.status as StoredStatus;
    const pool = pools.get(status);
    if (pool === undefined) throw new Error(`replay buffer cannot store group ${group.id} with status ${group.status}`);
    pool.set(group.id, group);
    this.#forget(group.id);
    const size = approxGroupBytes(group);
    this.#sizes.set(group.id, size);
    this.#bytes += size;
    return status;
  }

  /**
   * Re-run the expiry lifecycle over every stored group (the consumer's step moved). A group that
   * stays in its pool keeps its place in the insertion order.
   */
  refresh(expiry: ExpiryPolicy): void {
    for (const pools of this.#pools.values()) {
      for (const [status, pool] of pools) {
        for (const group of [...pool.values()]) {
          if (!applyExpiry(group, expiry, this.onReset)) {
            pool.delete(group.id);
            this.#forget(group.id);
            this.#drop(group, 'EXPIRED');
          } else if (group.status !== status) {
            pool.delete(group.id);
            pools.get(group.status as StoredStatus)!.set(group.id, group);
          }
        }
      }
    }
  }

  count(taskName?: string, status: StoredStatus = Status.COMPLETED): number {
    let n = 0;
    for (const [name, pools] of this.#pools)
      if (taskName === undefined || name === taskName) n += pools.get(status)!.size;
    return n;
  }

  /**
   * Remove and return up to `n` COMPLETED groups of a task: oldest first (`fifo`), or stalest first
   * then oldest (`stalest`, measured by the oldest token's model step).
   */
  take(taskName: string, n: number, order: TakeOrder = 'fifo'): RolloutGroup[] {
    const pool = this.#taskPools(taskName).get(Status.COMPLETED)!;
    let chosen: RolloutGroup[];
    if (order === 'fifo') {
      chosen = [];
      for (const group of pool.values()) {
        if (chosen.length >= n) break;
        chosen.push(group);
      }
    } else {
      // Each key once (it scans every token's model step); the sort is stable, so equal staleness keeps
      // insertion order (oldest first).
      chosen = [...pool.values()]
        .map((group) => ({ group, minStep: groupMinModelStep(group) }))
        .sort((a, b) => a.minStep - b.minStep)
        .slice(0, n)
        .map((keyed) => keyed.group);
    }
    for (const group of chosen) {
      pool.delete(group.id);
      this.#forget(group.id);
    }
    return chosen;
  }

  /**
   * Remove and return one group of the first non-empty pool in `statuses`, for regeneration, chosen
   * in the same `order` as `take`: the oldest, or the stalest then the oldest.
   */
  takeForRetry(taskName: string, statuses: readonly StoredStatus[], order: TakeOrder = 'fifo'): RolloutGroup | null {
    const pools = this.#taskPools(taskName);
    for (const status of statuses) {
      const pool = pools.get(status)!;
      let chosen: RolloutGroup | null = null;
      let chosenStep = Infinity;
      for (const group of pool.values()) {
        if (order === 'fifo') {
          chosen = group;
          break;
        }
        // Strictly older only: among equally stale groups the first inserted stays chosen.
        const step = groupMinModelStep(group);
        if (chosen === null || step < chosenStep) {
          chosen = group;
          chosenStep = step;
        }
      }
      if (chosen === null) continue;
      pool.delete(chosen.id);
      this.#forget(chosen.id);
      return chosen;
    }
    return null;
  }

  /** The first stored group `match` accepts (any task, any status); null when none. */
  find(match: (group: RolloutGroup) => boolean): RolloutGroup | null {
    for (const pools of this.#pools.values())
      for (const pool of pools.values()) for (const group of pool.values()) if (match(group)) return group;
    return null;
  }

  get dropped(): Readonly<Record<DropReason, number>> {
    return { ...this.#dropped };
  }

  get lastDropReason(): string | null {
    return this.#lastDropReason;
  }

  /** The stored groups themselves, not copies: encode the snapshot before the buffer changes again. */
  snapshot(): BufferSnapshot {
    const groups: RolloutGroup[] = [];
    for (const pools of this.#pools.values()) for (const pool of pools.values()) groups.push(...pool.values());
    return { groups, dropped: { ...this.#dropped }, lastDropReason: this.#lastDropReason };
  }

  /** Replace the contents in place (no expiry: the restored consumer step decides on the next refresh). */
  restore(snapshot: BufferSnapshot): void {
    for (const pools of this.#pools.values()) for (const pool of pools.values()) pool.clear();
    this.#sizes.clear();
    this.#bytes = 0;
    for (const group of snapshot.groups) this.put(group);
    Object.assign(this.#dropped, snapshot.dropped);
    this.#lastDropReason = snapshot.lastDropReason;
  }

  /** Let a group go and count it (it was taken out, and cannot be stored again). */
  drop(group: RolloutGroup, reason: DropReason): void {
    for (const pool of this.#taskPools(group.taskName).values()) pool.delete(group.id);
    this.#drop(group, reason);
  }

  /** Approximate bytes held by stored groups. */
  get bytes(): number {
    return this.#bytes;
  }

  #forget(id: string): void {
    const size = this.#sizes.get(id);
    if (size === undefined) return;
    this.#sizes.delete(id);
    this.#bytes -= size;
  }

  #drop(group: RolloutGroup, reason: DropReason): void {
    this.#forget(group.id);
    this.#dropped[reason]++;
    this.#lastDropReason =
      reason === 'EXPIRED'
        ? `group ${group.id} expired (too stale) and expired groups are not retried`
        : (groupError(group) ?? reason);
    this.onDrop?.(group, reason);
  }

  #taskPools(taskName: string): Map<StoredStatus, Map<string, RolloutGroup>> {
    const pools = this.#pools.get(taskName);
    if (pools === undefined) throw new Error(`replay buffer has no task ${JSON.stringify(taskName)}`);
    return pools;
  }
}

/**
 * The expiry lifecycle for one group. Returns false when the group must be dropped (it has an
 * expired member and expired groups are not retryable).
 */
export function applyExpiry(
  group: RolloutGroup,
  { trainStep, threshold, retryable, tokenThreshold = null }: ExpiryPolicy,
  onReset?: ((tokens: number) => void) | null,
): boolean {
  if (!Number.isFinite(threshold) && tokenThreshold === null) return true;
  let expiredAny = false;
  for (const rollout of group.rollouts) {
    if (rollout.status !== Status.COMPLETED && rollout.status !== Status.ABORTED) continue;
    if (!rolloutExpired(rollout, trainStep, threshold, tokenThreshold)) continue;
    expiredAny = true;
    if (!retryable) break;
    onReset?.(responseTokenCount(rollout));
    resetToPrompt(rollout, Status.EXPIRED);
  }
  if (!expiredAny) return true;
  if (!retryable) return false;
  group.status = groupStatus(group.rollouts); // EXPIRED, or ABORTED if an interrupted member remains
  return true;
}

function groupMinModelStep(group: RolloutGroup): number {
  let min = Infinity;
  for (const r of group.rollouts) {
    const m = rolloutMinModelStep(r);
    if (m !== null && m < min) min = m;
  }
  return min;
}

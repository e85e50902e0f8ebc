/**
 * Synchronous production: make one batch per train step, on demand.
 *
 * Per task: start the task's share of the batch at once, then top up while
 * `in flight + completed < share`, until `share` groups are COMPLETED. FAILED groups are counted and
 * replaced; past `maxFailedGroupsPerStep` the round stops (after letting in-flight groups land, so
 * nothing is lost) and `getBatch` rejects with the last reason — an unreachable server or a broken
 * environment becomes one clear error instead of an endless loop.
 */
import type { ResolvedConfig } from '../config.ts';
import type { ReplayBuffer } from '../buffer/replay-buffer.ts';
import type { Sampler } from '../buffer/sampler.ts';
import { RolloutEngineError } from '../protocol/errors.ts';
import { responseTokenCount, Status, type RolloutGroup } from '../protocol/rollout.ts';
import { allocateBatch } from './allocate.ts';
import { SettledQueue } from './settled-queue.ts';
import type { WorkerPool } from './worker-pool.ts';

/** Cumulative group counts since the engine started: `scheduled = inFlight + Σ finished statuses`. */
export interface GroupCounts {
  scheduled: number;
  inFlight: number;
  finished: Record<Status, number>;
  /** COMPLETED groups handed to the trainer. */
  taken: number;
}

export interface BatchStats {
  groups: number;
  rollouts: number;
  meanReward: number;
  /** Agent turns (inference calls) in the batch's rollouts. */
  turns: number;
  responseTokens: number;
  /** Groups produced this round by final status, including ones not in the batch (failed, left in the buffer). */
  produced: Record<Status, number>;
  produceMs: number;
  byTask: Record<string, { groups: number; meanReward: number }>;
}

export interface Batch {
  trainStep: number;
  status: 'NORMAL';
  groups: RolloutGroup[];
  stats: BatchStats;
}

export function emptyStatusCounts(): Record<Status, number> {
  return { INIT: 0, COMPLETED: 0, ABORTED: 0, EXPIRED: 0, FAILED: 0, FILTERED: 0 };
}

export class SyncProducer {
  readonly #config: ResolvedConfig;
  readonly #pool: WorkerPool;
  readonly #buffer: ReplayBuffer;
  readonly #samplers: Map<string, Sampler>;
  readonly counts: GroupCounts = { scheduled: 0, inFlight: 0, finished: emptyStatusCounts(), taken: 0 };
  modelStep: number;

  constructor(config: ResolvedConfig, pool: WorkerPool, buffer: ReplayBuffer, samplers: Map<string, Sampler>) {
    this.#config = config;
    this.#pool = pool;
    this.#buffer = buffer;
    this.#samplers = samplers;
    this.modelStep = config.modelStep;
  }

  async produceBatch(trainStep: number): Promise<Batch> {
    const start = performance.now();
    const shares = allocateBatch(this.#config.batchSize, this.#config.tasks);
    const produced = emptyStatusCounts();
    const results = await Promise.allSettled(
      this.#config.tasks.map((task) => this.#produceTask(task.name, shares.get(task.name)!, produced)),
    );
    const failure = results.find((r) => r.status === 'rejected');
    if (failure) throw (failure as PromiseRejectedResult).reason;

    const groups: RolloutGroup[] = [];
    const byTask: BatchStats['byTask'] = {};
    for (const task of this.#config.tasks) {
      const taken = this.#buffer.take(task.name, shares.get(task.name)!);
      byTask[task.name] = { groups: taken.length, meanReward: meanReward(taken) };
      groups.push(...taken);
    }
    this.counts.taken += groups.length;
    let rollouts = 0;
    let turns = 0;
    let responseTokens = 0;
    for (const group of groups) {
      rollouts += group.rollouts.length;
      for (const r of group.rollouts) {
        turns += r.turns.length;
        responseTokens += responseTokenCount(r);
      }
    }
    return {
      trainStep,
      status: 'NORMAL',
      groups,
      stats: { groups: groups.length, rollouts, meanReward: meanReward(groups), turns, responseTokens, produced, produceMs: performance.now() - start, byTask },
    };
  }

  async #produceTask(taskName: string, share: number, produced: Record<Status, number>): Promise<void> {
    const sampler = this.#samplers.get(taskName)!;
    const maxFailed = this.#config.producer.maxFailedGroupsPerStep ?? 2 * this.#config.batchSize;
    const inFlight = new SettledQueue<RolloutGroup>();
    let completed = this.#buffer.count(taskName, Status.COMPLETED);
    let failed = 0;
    let lastFailure: string | null = null;

    const launch = () => {
      this.counts.scheduled++;
      this.counts.inFlight++;
      inFlight.add(this.#pool.runGroup(sampler.draw(), this.modelStep));
    };
    const land = async () => {
      const group = await inFlight.next();
      this.counts.inFlight--;
      this.counts.finished[group.status]++;
      produced[group.status]++;
      this.#buffer.put(group);
      return group;
    };

    while (inFlight.size + completed < share) launch();
    while (completed < share && inFlight.size > 0) {
      const group = await land();
      if (group.status === Status.COMPLETED) completed++;
      else if (group.status === Status.FAILED) {
        failed++;
        lastFailure = group.error ?? group.rollouts.find((r) => r.error !== null)?.error ?? 'unknown';
        if (failed > maxFailed) {
          while (inFlight.size > 0) await land(); // account for every group before giving up
          throw new RolloutEngineError(
            'ERR_TOO_MANY_FAILED_GROUPS',
            `task ${taskName}: ${failed} groups failed while producing one batch (producer.maxFailedGroupsPerStep = ${maxFailed}); last reason: ${lastFailure}`,
          );
        }
      }
      while (inFlight.size + completed < share) launch();
    }
  }
}

function meanReward(groups: readonly RolloutGroup[]): number {
  let sum = 0;
  let n = 0;
  for (const g of groups) for (const r of g.rollouts) {
    sum += r.reward;
    n++;
  }
  return n === 0 ? 0 : sum / n;
}

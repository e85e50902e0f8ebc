/**
 * Local threads and worker nodes serving one run (`workers.nats.localThreads`): a group runs on the
 * local threads while they have a free slot (`threads × groupsPerWorker`), otherwise on the nodes.
 * Local first because a local group costs no NATS round trip and no copy over the network.
 */
import type { WorkerStats } from '../protocol/messages.ts';
import type { RolloutGroup } from '../domain/rollout.ts';
import type { PromptLine, TaskCheck } from '../protocol/messages.ts';
import type { NodeStatus, PauseNodes, PiscinaWorkerPool, WorkerPool } from '../coordinator/worker-pool.ts';
import type { NatsWorkerPool } from './nats-pool.ts';

export class CombinedWorkerPool implements WorkerPool {
  readonly #local: PiscinaWorkerPool;
  readonly #remote: NatsWorkerPool;
  readonly #localSlots: number;
  /** Groups on the local threads now; ≤ #localSlots. */
  #localInFlight = 0;

  constructor(local: PiscinaWorkerPool, remote: NatsWorkerPool, localSlots: number) {
    this.#local = local;
    this.#remote = remote;
    this.#localSlots = localSlots;
  }

  async runGroup(group: RolloutGroup, modelStep: number): Promise<RolloutGroup> {
    if (this.#localInFlight >= this.#localSlots) return this.#remote.runGroup(group, modelStep);
    this.#localInFlight++;
    try {
      return await this.#local.runGroup(group, modelStep);
    } finally {
      this.#localInFlight--;
    }
  }

  /** Local threads ack the pause in the shared block themselves; each live node once. */
  get liveWorkers(): number {
    return this.#local.liveWorkers + this.#remote.liveWorkers;
  }

  stats(): Promise<WorkerStats[]> {
    return this.#local.stats();
  }

  nodes(): NodeStatus[] {
    return this.#remote.nodes();
  }

  pauseNodes(): PauseNodes | null {
    return this.#remote.pauseNodes();
  }

  checkTask(task: string, prompts: PromptLine[]): Promise<TaskCheck> {
    return this.#local.checkTask(task, prompts);
  }

  async flush(): Promise<void> {
    await Promise.all([this.#local.flush(), this.#remote.flush()]);
  }

  async close(): Promise<void> {
    await Promise.all([this.#local.close(), this.#remote.close()]);
  }
}

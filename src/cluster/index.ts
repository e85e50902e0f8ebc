/**
 * Worker nodes over NATS JetStream: the pool the coordinator uses when `workers.nats` is set.
 * Loaded only then (coordinator/engine-core.ts imports it lazily), so a run on local threads never
 * loads the clients.
 */
import { PiscinaWorkerPool, type WorkerPool } from '../coordinator/worker-pool.ts';
import { CombinedWorkerPool } from './combined-pool.ts';
import { NatsWorkerPool, type NatsWorkerPoolOptions } from './nats-pool.ts';

export { NatsWorkerPool } from './nats-pool.ts';
export type { NodeStatus, PauseNodes } from '../coordinator/worker-pool.ts';
export { RolloutNode, type RolloutNodeOptions } from './node.ts';

export async function createClusterPool(options: NatsWorkerPoolOptions): Promise<WorkerPool> {
  const remote = await NatsWorkerPool.create(options);
  const { workers } = options.config;
  if (!workers.nats?.localThreads) return remote;
  const local = new PiscinaWorkerPool({ ...options, gatewayUrl: options.gatewayUrl ?? null });
  return new CombinedWorkerPool(local, remote, workers.threads * workers.groupsPerWorker);
}

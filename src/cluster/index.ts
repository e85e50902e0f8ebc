/**
 * Worker nodes over NATS JetStream: the pool the coordinator uses when `workers.nats` is set
 * (coordinator/engine-core.ts imports this module only then), and the node `rollout node` runs. This
 * module imports none of the NATS client: the modules that do are imported on demand, through
 * loadOptional (src/optional-packages.ts), so a run on local threads never loads the client and a
 * missing one is one line naming the feature and the packages instead of an import stack.
 */
import { PiscinaWorkerPool, type WorkerPool } from '../coordinator/worker-pool.ts';
import { loadOptional, type OptionalImport } from '../optional-packages.ts';
import { CombinedWorkerPool } from './combined-pool.ts';
import type { NatsWorkerPoolOptions } from './nats-pool.ts';

export type { NodeStatus, PauseNodes } from '../coordinator/worker-pool.ts';
export type { RolloutNodeOptions } from './node.ts';

export async function createClusterPool(
  options: NatsWorkerPoolOptions,
  importPool: OptionalImport<typeof import('./nats-pool.ts')> = () => import('./nats-pool.ts'),
): Promise<WorkerPool> {
  const { NatsWorkerPool } = await loadOptional('nats', importPool);
  const remote = await NatsWorkerPool.create(options);
  const { workers } = options.config;
  if (!workers.nats?.localThreads) return remote;
  const local = new PiscinaWorkerPool({ ...options, gatewayUrl: options.gatewayUrl ?? null });
  return new CombinedWorkerPool(local, remote, workers.threads * workers.groupsPerWorker);
}

/** The worker node class, for `rollout node` (cli/node.ts). */
export async function loadRolloutNode(
  importNode: OptionalImport<typeof import('./node.ts')> = () => import('./node.ts'),
): Promise<typeof import('./node.ts')['RolloutNode']> {
  return (await loadOptional('nats', importNode)).RolloutNode;
}

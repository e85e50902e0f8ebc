/**
 * Environments on servers, by the protocol they speak (`tasks[].env.protocol`): the one entry the
 * engine and its workers call. Each protocol's client makes its servers' episodes into `Environment`s
 * the agent loop cannot tell from in-process ones, and reports a failure that is not the policy's (a
 * server gone, a session lost, a judge that failed) as such (env/errors.ts), never as a reward.
 */
import { createGymHttpEnvironments } from './gym-http.ts';
import { createHttpEnvironments, type HttpEnvOptions } from './http-env.ts';
import { createNemoGymEnvironments } from './nemo-gym.ts';
import { createOpenEnvEnvironments } from './openenv.ts';
import type { Environment } from './types.ts';
import { createVerifiersEnvironments } from './verifiers.ts';

export interface RemoteEnvironments {
  /** A fresh actor; nothing is sent until its `reset`. */
  create(): Environment;
  /** Checks every server is up and serves the environment (a clear error naming the URL otherwise). */
  prewarm(): Promise<void>;
  /** Ends what is pending (bounded by the call timeout) and lets the connections go. */
  close(): Promise<void>;
}

export function createRemoteEnvironments(options: HttpEnvOptions): RemoteEnvironments {
  switch (options.protocol ?? 'rollout') {
    case 'auto':
    case 'rollout':
    case 'safactory':
      return createHttpEnvironments(options);
    case 'nemo-gym':
      return createNemoGymEnvironments(options);
    case 'gym-http':
      return createGymHttpEnvironments(options);
    case 'verifiers':
      // Its episodes run as a black-box agent's (worker/worker-runtime.ts); here: the start-up health check.
      return createVerifiersEnvironments(options);
    case 'openenv':
      return createOpenEnvEnvironments(options);
  }
}

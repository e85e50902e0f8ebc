/**
 * An episode's calls into the task's own code, its environment actor and its hooks: each through the
 * task's guard when there is one (worker/env-guard.ts), a hook's failure reported and ignored.
 */
import type { Environment } from '../env/types.ts';
import type { EnvCall } from '../protocol/env-watch.ts';
import { describeError, RolloutEngineError } from '../errors.ts';
import type { RolloutState } from '../domain/rollout.ts';
import type { ActorSource, EpisodeContext } from './episode-context.ts';

/** A fresh environment actor for an episode; an exhausted or closed pool is the episode's failure. */
export async function acquireActor(actors: ActorSource, signal: AbortSignal): Promise<Environment> {
  const env = await actors.acquire(signal);
  if (env === null)
    throw new RolloutEngineError(
      'ERR_ENV_POOL_EXHAUSTED',
      'no environment actor available: the actor pool is exhausted or closed',
    );
  return env;
}

/** One call into the task's environment or hooks, through the guard when there is one. */
export function envCall<T>(
  ctx: EpisodeContext,
  rollout: RolloutState,
  call: EnvCall,
  run: () => T | Promise<T>,
): T | Promise<T> {
  return ctx.guard === undefined ? run() : ctx.guard.call(rollout, call, run);
}

/** A hook of the task (`tasks[].hooks`): one that throws is reported and the episode goes on. */
export async function callHook<T>(
  ctx: EpisodeContext,
  rollout: RolloutState,
  name: 'beforeInference' | 'onEpisodeEnd',
  call: () => T | Promise<T> | undefined,
): Promise<T | undefined> {
  if (!ctx.hooks) return undefined;
  try {
    return await envCall(ctx, rollout, name, call);
  } catch (err) {
    ctx.onProblem?.(rollout, `hook ${name} failed (ignored): ${describeError(err)}`);
    return undefined;
  }
}

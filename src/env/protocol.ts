/**
 * The env-server protocols an HTTP environment may speak (env/http-env.ts has rollout's and
 * Safactory's side by side; env/nemo-gym.ts speaks NeMo Gym's), and the options each cannot honour. Shared by the config check, for a configured protocol,
 * and by the HTTP client, for one a server's GET /envs showed: kept apart from the client so that
 * validating a config does not load undici.
 */
import { preview } from '../errors.ts';
import type { EnvParams } from './types.ts';

export const ENV_PROTOCOLS = ['auto', 'rollout', 'safactory', 'nemo-gym'] as const;
export type EnvProtocolSetting = (typeof ENV_PROTOCOLS)[number];
export type EnvProtocol = Exclude<EnvProtocolSetting, 'auto'>;

export interface ProtocolConflict {
  /** The option, as HttpEnvOptions names it (`params` is the task's `env.params`). */
  option: 'dedupeSteps' | 'params' | 'params.dataset';
  why: string;
  value: unknown;
}

export function protocolConflicts(
  protocol: EnvProtocol,
  options: { dedupeSteps?: boolean; params?: EnvParams },
): ProtocolConflict[] {
  const conflicts: ProtocolConflict[] = [];
  const params = options.params ?? {};
  if (protocol === 'safactory') {
    if (options.dedupeSteps === true) {
      conflicts.push({
        option: 'dedupeSteps',
        value: true,
        why: 'a Safactory server applies every step it receives (its step route takes no step index), so it cannot deduplicate steps',
      });
    }
    if (Object.hasOwn(params, 'dataset')) {
      conflicts.push({
        option: 'params.dataset',
        value: params.dataset,
        why: 'Safactory\'s env_param carries the dataset line under "dataset", which would replace this one',
      });
    }
  } else if (protocol === 'nemo-gym') {
    if (options.dedupeSteps === true) {
      conflicts.push({
        option: 'dedupeSteps',
        value: true,
        why: "a NeMo Gym resources server has no step index to deduplicate by (its tool routes take the call's arguments alone)",
      });
    }
    if (Object.keys(params).length > 0) {
      conflicts.push({
        option: 'params',
        value: params,
        why: 'a NeMo Gym resources server takes its task from the dataset row alone (POST /seed_session and /verify get the row as it is)',
      });
    }
  } else if (Object.keys(params).length > 0) {
    // Sending them anyway would be silently ignored: the server builds its environments from its own.
    conflicts.push({
      option: 'params',
      value: params,
      why: 'a rollout env-server takes no params from the engine (its environments get theirs from the server: rollout env-server --params)',
    });
  }
  return conflicts;
}

/** `option: [context] why (got value)`, the form of every config problem. */
export function formatConflict(conflict: ProtocolConflict, context = ''): string {
  return `${conflict.option}: ${context}${conflict.why} (got ${preview(conflict.value)})`;
}

/**
 * Everything a worker thread holds: the inference client, the environment factories, counters, and the
 * control API it exposes to the coordinator. The entry point in workers/ is a thin shell around this.
 *
 * Invariant: `runGroup` never rejects for an episode's failure — each rollout carries its own status —
 * so one bad environment cannot take the other groups sharing this worker down with it.
 */
import { threadId } from 'node:worker_threads';
import { LlmClient, type LlmClientOptions } from '../llm/client.ts';
import { loadEnvironmentFactory } from '../env/loader.ts';
import type { EnvParams } from '../env/types.ts';
import { createLogger, type Logger } from '../log.ts';
import { describeError } from '../protocol/errors.ts';
import {
  PROTOCOL_VERSION,
  type GroupResultMessage,
  type RunGroupMessage,
  type WorkerConfigPatch,
  type WorkerControl,
  type WorkerStats,
} from '../protocol/messages.ts';
import { Status } from '../protocol/rollout.ts';
import { runGroup, type AgentSettings } from './agent-loop.ts';
import { PauseGate } from './pause-gate.ts';

/** Per-task settings a worker needs; sent once as workerData. */
export interface WorkerTaskSettings {
  moduleUrl: string;
  exportName: string;
  envParams: EnvParams;
  agent: AgentSettings;
}

export interface WorkerInit {
  v: typeof PROTOCOL_VERSION;
  /** The pause broadcast (protocol/control-block.ts), shared with the coordinator. */
  control: SharedArrayBuffer;
  llm: LlmClientOptions;
  tasks: Record<string, WorkerTaskSettings>;
  logLevel: string;
}

export class WorkerRuntime implements WorkerControl {
  readonly #init: WorkerInit;
  readonly #llm: LlmClient;
  readonly #log: Logger;
  readonly #gate: PauseGate;
  #inFlightGroups = 0;
  #inFlightRollouts = 0;
  #groupsDone = 0;
  #rolloutsDone = 0;
  #steps = 0;
  readonly #rolloutsByStatus: Record<string, number> = {};

  constructor(init: WorkerInit) {
    if (init?.v !== PROTOCOL_VERSION) throw new Error(`worker init v must be ${PROTOCOL_VERSION}, got ${JSON.stringify(init?.v)}`);
    this.#init = init;
    this.#llm = new LlmClient(init.llm);
    this.#log = createLogger(init.logLevel, { worker: threadId });
    this.#gate = new PauseGate(init.control);
  }

  async runGroup(message: RunGroupMessage): Promise<GroupResultMessage> {
    const { group } = message;
    const task = this.#init.tasks[group.taskName];
    const queueMs = Math.max(0, Date.now() - message.enqueuedAt);
    this.#inFlightGroups++;
    this.#inFlightRollouts += group.rollouts.length;
    try {
      if (task === undefined) throw new Error(`unknown task ${JSON.stringify(group.taskName)} (worker knows ${Object.keys(this.#init.tasks).join(', ')})`);
      const createEnv = await loadEnvironmentFactory(task.moduleUrl, task.exportName);
      await runGroup(group, {
        createEnv,
        envParams: task.envParams,
        llm: this.#llm,
        settings: task.agent,
        gate: this.#gate,
        workerId: threadId,
        onStep: () => this.#steps++,
        onProblem: (rollout, reason) => this.#log.warn({ rollout: rollout.id, status: rollout.status }, reason),
      }, queueMs);
    } catch (err) {
      // Setup failed (module import, unknown task): every rollout fails with the same reason.
      const reason = describeError(err);
      this.#log.error({ group: group.id }, reason);
      for (const rollout of group.rollouts) {
        rollout.status = Status.FAILED;
        rollout.error = reason;
        rollout.workerId = threadId;
      }
      group.status = Status.FAILED;
      group.error = reason;
    } finally {
      this.#inFlightGroups--;
      this.#inFlightRollouts -= group.rollouts.length;
      this.#groupsDone++;
      this.#rolloutsDone += group.rollouts.length;
      for (const rollout of group.rollouts) this.#rolloutsByStatus[rollout.status] = (this.#rolloutsByStatus[rollout.status] ?? 0) + 1;
    }
    return { v: PROTOCOL_VERSION, type: 'group-result', group, workerId: threadId };
  }

  stats(): WorkerStats {
    return {
      workerId: threadId,
      inFlightGroups: this.#inFlightGroups,
      inFlightRollouts: this.#inFlightRollouts,
      groupsDone: this.#groupsDone,
      rolloutsDone: this.#rolloutsDone,
      steps: this.#steps,
      rolloutsByStatus: { ...this.#rolloutsByStatus },
      heapUsedBytes: process.memoryUsage().heapUsed,
    };
  }

  configure(patch: WorkerConfigPatch): void {
    if (patch.logLevel !== undefined) this.#log.level = patch.logLevel;
  }
}

/**
 * The worker pool the coordinator schedules groups on — the only module that knows Piscina.
 *
 * `WorkerPool` is the interface; `PiscinaWorkerPool` runs groups on local worker threads. A remote
 * pool (worker nodes over the network) implements the same three calls.
 *
 * Invariant: `runGroup` never rejects. A task that throws, or a worker that dies mid-task (piscina
 * then fails every task on that thread and starts a replacement), comes back as a FAILED group with
 * the reason, so the producer's counts always add up.
 */
import * as Comlink from 'comlink';
import { Piscina } from 'piscina';
import type { ResolvedConfig } from '../config.ts';
import type { Logger } from '../log.ts';
import { projectModuleUrl } from '../paths.ts';
import { decodeMessage, encodeMessage } from '../protocol/codec.ts';
import { describeError } from '../protocol/errors.ts';
import { isWorkerRegistration, PROTOCOL_VERSION, type WorkerControl, type WorkerStats } from '../protocol/messages.ts';
import { Status, type RolloutGroup } from '../protocol/rollout.ts';
import type { WorkerInit } from '../rollout/worker-runtime.ts';

export interface WorkerPool {
  /** Run every rollout of `group`; resolves with the group in a final status, never rejects. */
  runGroup(group: RolloutGroup, modelStep: number): Promise<RolloutGroup>;
  /** Live counters of every worker that has registered. */
  stats(): Promise<WorkerStats[]>;
  /** Worker threads alive now (each acknowledges a pause broadcast). */
  readonly liveWorkers: number;
  close(): Promise<void>;
}

export interface PiscinaWorkerPoolOptions {
  config: ResolvedConfig;
  /** Base URL of the inference server (the configured one, or the embedded mock's). */
  llmUrl: string;
  log: Logger;
  /** The pause broadcast block every worker watches. */
  control: SharedArrayBuffer;
  /** Overrides the worker entry file (tests use it to load a worker that misbehaves on purpose). */
  workerUrl?: URL;
}

export class PiscinaWorkerPool implements WorkerPool {
  readonly #pool: Piscina;
  readonly #log: Logger;
  /** One control proxy per live worker thread; removed when piscina destroys the worker. */
  readonly #controls = new Map<number, Comlink.Remote<WorkerControl>>();
  #closed = false;

  constructor(options: PiscinaWorkerPoolOptions) {
    const { config } = options;
    this.#log = options.log;
    const init: WorkerInit = {
      v: PROTOCOL_VERSION,
      control: options.control,
      llm: { ...config.llm, url: options.llmUrl },
      logLevel: config.logLevel,
      tasks: Object.fromEntries(
        config.tasks.map((t) => [
          t.name,
          {
            moduleUrl: t.env.moduleUrl,
            exportName: t.env.export,
            envParams: t.env.params,
            agent: {
              maxSteps: t.maxSteps,
              messageCut: t.messageCut,
              maxTokens: t.maxTokens,
              temperature: t.temperature,
              partialRollout: config.producer.partialRollout,
              sendSeed: config.llm.sendSeed,
            },
          },
        ]),
      ),
    };
    const threads = config.workers.threads;
    this.#pool = new Piscina({
      filename: (options.workerUrl ?? projectModuleUrl('workers/episode-worker')).href,
      // Fixed size, never idled out: a worker holds keep-alive connections and loaded environments.
      minThreads: threads,
      maxThreads: threads,
      idleTimeout: Infinity,
      // 'sync' parks idle workers in Atomics.wait, where they cannot receive control messages.
      atomics: 'disabled',
      concurrentTasksPerWorker: config.workers.groupsPerWorker,
      workerData: init,
      ...(config.workers.maxOldGenerationSizeMb !== null ? { resourceLimits: { maxOldGenerationSizeMb: config.workers.maxOldGenerationSizeMb } } : {}),
    });
    this.#pool.on('message', (message: unknown) => {
      if (!isWorkerRegistration(message)) return;
      const { workerId, port } = message;
      this.#controls.set(workerId, Comlink.wrap<WorkerControl>(port as unknown as Comlink.Endpoint));
      // The port closes when its worker exits (piscina's workerDestroy reports threadId -1 by then).
      port.once('close', () => {
        this.#controls.delete(workerId);
        if (!this.#closed) this.#log.warn({ worker: workerId }, 'worker thread exited; piscina starts a replacement');
      });
    });
    // With no task on it, a dying worker is reported here instead of through a task's rejection.
    this.#pool.on('error', (err: unknown) => this.#log.error({ err: describeError(err) }, 'worker pool error'));
  }

  async runGroup(group: RolloutGroup, modelStep: number): Promise<RolloutGroup> {
    const bytes = encodeMessage({ v: PROTOCOL_VERSION, type: 'run-group', group, modelStep, enqueuedAt: Date.now() });
    try {
      const resultBytes = (await this.#pool.run(bytes, { transferList: [bytes.buffer as ArrayBuffer] })) as Uint8Array;
      const message = decodeMessage(resultBytes);
      if (message.type !== 'group-result') throw new Error(`worker answered ${message.type} to run-group`);
      return message.group;
    } catch (err) {
      return failedGroup(group, `worker failed while running the group: ${describeError(err)}`);
    }
  }

  get liveWorkers(): number {
    return this.#controls.size;
  }

  async stats(): Promise<WorkerStats[]> {
    const controls = [...this.#controls.values()];
    // A worker busy in a CPU-heavy step (or dying) must not stall the caller: give each one a deadline.
    const settled = await Promise.allSettled(controls.map((c) => withDeadline(c.stats(), STATS_DEADLINE_MS)));
    return settled.flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []));
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const control of this.#controls.values()) control[Comlink.releaseProxy]();
    this.#controls.clear();
    await this.#pool.destroy();
  }
}

const STATS_DEADLINE_MS = 1_000;

function withDeadline<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

/** The group as it was sent (its bytes were transferred away), every rollout FAILED with `reason`. */
function failedGroup(group: RolloutGroup, reason: string): RolloutGroup {
  for (const rollout of group.rollouts) {
    rollout.status = Status.FAILED;
    rollout.error = reason;
  }
  group.status = Status.FAILED;
  group.error = reason;
  return group;
}

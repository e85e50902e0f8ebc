/**
 * The worker pool the coordinator schedules groups on — the only module of src/ that knows Piscina
 * (the other is the worker entry it loads, workers/episode-worker.ts).
 *
 * `WorkerPool` is the interface; `PiscinaWorkerPool` runs groups on local worker threads. A remote
 * pool (worker nodes over the network) implements the same three calls.
 *
 * Invariant: `runGroup` never rejects. A task that throws comes back as a FAILED group with the
 * reason, so the producer's counts always add up.
 *
 * A worker that dies mid-task (piscina then fails every task on that thread and starts a replacement)
 * takes healthy groups down with the faulty one. The shared env watch (protocol/env-watch.ts) names
 * the rollout that was inside its environment when the thread died: its group comes back FAILED with
 * the reason; every other group of the thread comes back ABORTED (innocent: the producer sends it
 * again), until its own deaths exceed `workers.deathRetries` — then FAILED, so a group that keeps
 * dying without being caught inside its environment (a timer that kills, an out-of-memory outside a
 * call) cannot loop for ever.
 */
import { join } from 'node:path';
import { Piscina } from 'piscina';
import { samplingShapeOf, urlList, type ResolvedConfig, type TaskConfig } from '../config.ts';
import { wantsPrettyLogs, type Logger } from '../log.ts';
import { projectModuleUrl } from '../paths.ts';
import { decodeGroupResult, encodeRunGroup } from '../protocol/codec.ts';
import { connectControl, releaseControl, type ControlProxy } from '../protocol/control-port.ts';
import { EnvWatch, type Culprit } from '../protocol/env-watch.ts';
import { describeError, RolloutEngineError } from '../errors.ts';
import {
  isWorkerRegistration,
  PROTOCOL_VERSION,
  type PromptLine,
  type TaskCheck,
  type WorkerEnvSettings,
  type WorkerInit,
  type WorkerStats,
  type EndpointUpdate,
  type WorkerTasks,
} from '../protocol/messages.ts';
import { failRollout, Status, type RolloutGroup } from '../domain/rollout.ts';
import type { FailureKind } from '../domain/failure.ts';
import type { ServerInfo } from '../llm/servers.ts';

/** A worker node serving the run (src/cluster/), as /status lists it. */
export interface NodeStatus {
  id: string;
  host: string;
  threads: number;
  groupsInFlight: number;
  groupsDone: number;
  /** Milliseconds since its last heartbeat reached the coordinator. */
  lastHeartbeatMsAgo: number;
  metricsUrl: string | null;
}

/** Which worker nodes answered a pause (src/cluster/). */
export interface PauseNodes {
  answered: string[];
  /** Live when the pause began, and never answered while it lasted. */
  missing: string[];
}

export interface WorkerPool {
  /** Run every rollout of `group`; resolves with the group in a final status, never rejects. */
  runGroup(group: RolloutGroup, modelStep: number): Promise<RolloutGroup>;
  /** Live counters of every worker that has registered. */
  stats(): Promise<WorkerStats[]>;
  /** Worker threads alive now (each acknowledges a pause broadcast). */
  readonly liveWorkers: number;
  /** Every worker writes its buffered step records to disk. */
  flush(): Promise<void>;
  close(): Promise<void>;
  /** Worker nodes serving the run (src/cluster/), for /status; pools of local threads leave it out. */
  nodes?(): NodeStatus[];
  /** Which worker nodes answered the latest pause (src/cluster/); null before any. */
  pauseNodes?(): PauseNodes | null;
  /**
   * Every worker routes the default policy's calls to these endpoints from now on (`POST /endpoints`);
   * a pool that leaves it out keeps the endpoints it started with (the engine then refuses a change).
   */
  setEndpoints?(update: EndpointUpdate): Promise<void>;
  /** The start-up check of one task on a worker (WorkerRuntime.checkTask); pools without workers of their own may leave it out. */
  checkTask?(task: string, prompts: PromptLine[]): Promise<TaskCheck>;
}

export interface PiscinaWorkerPoolOptions {
  config: ResolvedConfig;
  /** Base URLs of the inference servers (the configured ones, or the embedded mock's). */
  llmUrls: string[];
  log: Logger;
  /** The token-trace gateway for black-box agents, when a task has one. */
  gatewayUrl?: string | null;
  /** The pause broadcast block every worker watches. */
  control: SharedArrayBuffer;
  /** Overrides the worker entry file (tests use it to load a worker that misbehaves on purpose). */
  workerUrl?: URL;
  /** What the start-up probe learnt of each inference endpoint (its dialect, context length). */
  servers?: readonly ServerInfo[];
}

export class PiscinaWorkerPool implements WorkerPool {
  readonly #pool: Piscina;
  readonly #log: Logger;
  /** One control proxy per live worker thread; removed when piscina destroys the worker. */
  readonly #controls = new Map<number, ControlProxy>();
  #closed = false;
  #watchdog: NodeJS.Timeout | null = null;
  /** Set when no worker can run at all; every queued and later group fails with it. */
  #broken: string | null = null;
  #lastTaskError: string | null = null;
  #liveness: NodeJS.Timeout;
  #breakPool: (err: Error) => void = () => {};
  readonly #brokenPromise: Promise<never> = new Promise<never>((_, reject) => (this.#breakPool = reject));
  /** Workers being checked right now (one probe at a time per worker). */
  readonly #probing = new Set<number>();
  /** Why the watchdog last terminated a worker: added to the reason of the groups that died with it. */
  #lastKill: { at: number; reason: string } | null = null;
  readonly #envWatch: EnvWatch;
  /**
   * Culprits read from dead workers' slots, by dispatch, until the rejection of that dispatch is
   * handled: one sweep frees every dead slot, possibly before the culprit's own rejection runs (the
   * tasks of a dead worker are all rejected in one go, their handlers run after it, in any order).
   */
  readonly #culprits = new Map<number, Culprit>();
  /** Group id → deaths of the worker running it, not blamed on it, since it last came back from a worker. */
  readonly #deaths = new Map<string, number>();
  readonly #deathRetries: number;
  /** The endpoints set since start (setEndpoints); null = the ones in workerData. A replacement worker is told on registering. */
  #endpoints: EndpointUpdate | null = null;

  constructor(options: PiscinaWorkerPoolOptions) {
    const { config } = options;
    this.#log = options.log;
    this.#brokenPromise.catch(() => undefined); // observed through runGroup's race
    const threads = config.workers.threads;
    this.#envWatch = new EnvWatch(threads);
    this.#deathRetries = config.workers.deathRetries;
    const init = workerInit(
      config,
      options.llmUrls,
      options.control,
      options.gatewayUrl ?? null,
      options.servers ?? [],
      this.#envWatch.block,
    );
    this.#pool = new Piscina({
      filename: (options.workerUrl ?? projectModuleUrl('workers/episode-worker')).href,
      // Fixed size, never idled out: a worker holds keep-alive connections and loaded environments.
      minThreads: threads,
      maxThreads: threads,
      idleTimeout: Infinity,
      // 'sync' parks idle workers in Atomics.wait, where they cannot receive control messages.
      atomics: 'disabled',
      concurrentTasksPerWorker: config.workers.groupsPerWorker,
      // Its run- and wait-time histograms are read by nobody here: two records per group on the main thread.
      recordTiming: false,
      workerData: init,
      ...(config.workers.maxOldGenerationSizeMb !== null
        ? { resourceLimits: { maxOldGenerationSizeMb: config.workers.maxOldGenerationSizeMb } }
        : {}),
    });
    this.#pool.on('message', (message: unknown) => {
      if (!isWorkerRegistration(message)) return;
      const { workerId, port } = message;
      const control = connectControl(port);
      this.#controls.set(workerId, control);
      if (this.#endpoints !== null) void control.setEndpoints(this.#endpoints).catch(() => undefined);
      // The port closes when its worker exits (piscina's workerDestroy reports threadId -1 by then).
      port.once('close', () => {
        this.#controls.delete(workerId);
        if (!this.#closed) this.#log.warn({ worker: workerId }, 'worker thread exited; piscina starts a replacement');
      });
    });
    // With no task on it, a dying worker is reported here instead of through a task's rejection.
    this.#pool.on('error', (err: unknown) => this.#log.error({ err: describeError(err) }, 'worker pool error'));
    // Piscina stops replacing workers that die while starting: with none left, queued groups would wait
    // for ever. Checked on a short timer: fail them — and every later one — with the reason instead.
    this.#liveness = setInterval(() => {
      if (this.#broken !== null || this.#closed || this.#pool.threads.length > 0) return;
      this.#broken = `no worker thread is running: workers die while starting (last error: ${this.#lastTaskError ?? 'none'}); check workers.maxOldGenerationSizeMb and that environment modules load`;
      this.#log.error(this.#broken);
      this.#breakPool(new Error(this.#broken));
    }, 250);
    this.#liveness.unref();
    const watchdogMs = config.workers.watchdogMs;
    if (watchdogMs !== null) {
      this.#watchdog = setInterval(() => void this.#checkWorkers(watchdogMs), Math.max(50, watchdogMs / 4));
      this.#watchdog.unref();
    }
  }

  async runGroup(group: RolloutGroup, modelStep: number): Promise<RolloutGroup> {
    if (this.#broken !== null) return failedGroup(group, this.#broken);
    const dispatch = this.#envWatch.nextDispatch();
    const bytes = encodeRunGroup(group, modelStep, dispatch);
    let resultBytes: Uint8Array;
    try {
      resultBytes = await Promise.race([
        this.#run('default', { bytes }, [bytes.buffer as ArrayBuffer]),
        this.#brokenPromise,
      ]);
    } catch (err) {
      const kill =
        this.#lastKill !== null && Date.now() - this.#lastKill.at < 5_000 ? ` (${this.#lastKill.reason})` : '';
      const reason = `worker failed while running the group: ${describeError(err)}${kill}`;
      this.#lastTaskError = describeError(err);
      if (this.#broken !== null || this.#closed) return failedGroup(group, reason);
      return this.#lostWithWorker(group, dispatch, reason);
    }
    this.#deaths.delete(group.id);
    try {
      return decodeGroupResult(resultBytes, group);
    } catch (err) {
      return failedGroup(group, `worker failed while running the group: ${describeError(err)}`);
    }
  }

  /**
   * The run of `group` ended with its worker (or the task threw in it: indistinguishable here, and
   * retried alike within the budget). FAILED when its own rollout was inside its environment when the
   * thread died, or its deaths exceed `workers.deathRetries`; otherwise ABORTED, to be sent again.
   */
  #lostWithWorker(group: RolloutGroup, dispatch: number, reason: string): RolloutGroup {
    // piscina removes a dead worker from its threads before it rejects the worker's tasks.
    for (const [d, culprit] of this.#envWatch.sweep(new Set(this.#pool.threads.map((w) => w.threadId))))
      this.#culprits.set(d, culprit);
    const culprit = this.#culprits.get(dispatch);
    this.#culprits.delete(dispatch);
    if (culprit !== undefined) {
      this.#deaths.delete(group.id);
      const where =
        culprit.call === 'beforeInference' || culprit.call === 'onEpisodeEnd'
          ? `hook ${culprit.call}()`
          : `environment ${culprit.call}()`;
      return failedGroup(
        group,
        `${reason}; rollout ${group.rollouts[culprit.rollout]?.id ?? culprit.rollout} was in its ${where} when the worker died`,
      );
    }
    const deaths = (this.#deaths.get(group.id) ?? 0) + 1;
    if (deaths > this.#deathRetries) {
      this.#deaths.delete(group.id);
      return failedGroup(
        group,
        `${reason}; its worker died ${deaths} times while running it, never inside its environment (workers.deathRetries = ${this.#deathRetries})`,
      );
    }
    this.#deaths.set(group.id, deaths);
    return abortedGroup(
      group,
      `${reason}; no rollout of the group was in its environment: sent again (death ${deaths}, workers.deathRetries = ${this.#deathRetries})`,
    );
  }

  async checkTask(task: string, prompts: PromptLine[]): Promise<TaskCheck> {
    if (this.#broken !== null) throw new RolloutEngineError('ERR_WORKER', this.#broken);
    // Raced with the pool breaking: a module that kills its worker on import leaves no worker to answer.
    return await Promise.race([this.#run('checkTask', { task, prompts }), this.#brokenPromise]);
  }

  /** A piscina task by name, typed by what the worker entry exports for it (WorkerTasks). */
  #run<K extends keyof WorkerTasks>(
    name: K,
    request: Parameters<WorkerTasks[K]>[0],
    transferList?: ArrayBuffer[],
  ): ReturnType<WorkerTasks[K]> {
    return this.#pool.run(request, { name, ...(transferList === undefined ? {} : { transferList }) }) as ReturnType<
      WorkerTasks[K]
    >;
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

  /**
   * The watchdog: a worker whose event loop cannot answer a stats call within `watchdogMs` is stuck
   * (an environment spinning, a synchronous loop that never yields). Terminating it fails its groups
   * with the reason, and piscina starts a replacement.
   */
  async #checkWorkers(watchdogMs: number): Promise<void> {
    for (const [workerId, control] of this.#controls) {
      if (this.#probing.has(workerId)) continue;
      this.#probing.add(workerId);
      withDeadline(control.stats(), watchdogMs)
        .catch(() => {
          if (this.#closed || !this.#controls.has(workerId)) return;
          const worker = this.#pool.threads.find((w) => w.threadId === workerId);
          if (worker === undefined) return;
          const reason = `worker ${workerId} did not answer for ${watchdogMs} ms (workers.watchdogMs) and was terminated by the watchdog`;
          this.#lastKill = { at: Date.now(), reason };
          this.#log.error({ worker: workerId }, reason);
          void worker.terminate();
        })
        .finally(() => this.#probing.delete(workerId));
    }
  }

  async setEndpoints(update: EndpointUpdate): Promise<void> {
    this.#endpoints = update;
    await Promise.allSettled(
      [...this.#controls.values()].map((c) => withDeadline(c.setEndpoints(update), STATS_DEADLINE_MS)),
    );
  }

  async flush(): Promise<void> {
    await Promise.allSettled([...this.#controls.values()].map((c) => withDeadline(c.flush(), FLUSH_DEADLINE_MS)));
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#watchdog !== null) clearInterval(this.#watchdog);
    clearInterval(this.#liveness);
    // Workers release their actors and flush their records before the threads are terminated.
    await Promise.allSettled([...this.#controls.values()].map((c) => withDeadline(c.close(), FLUSH_DEADLINE_MS)));
    for (const control of this.#controls.values()) releaseControl(control);
    this.#controls.clear();
    await this.#pool.destroy();
  }
}

const STATS_DEADLINE_MS = 1_000;
const FLUSH_DEADLINE_MS = 10_000;

/** What every worker is started with (workerData): resolved once from the config. */
function workerEnv(env: TaskConfig['env']): WorkerEnvSettings | null {
  if (env === null) return null;
  if (env.http !== undefined)
    return { kind: 'http', http: { ...env.http }, poolSize: env.poolSize, timeoutMs: env.timeoutMs };
  return {
    kind: 'module',
    moduleUrl: env.moduleUrl!,
    exportName: env.export,
    params: env.params,
    poolSize: env.poolSize,
    timeoutMs: env.timeoutMs,
  };
}

export function workerInit(
  config: ResolvedConfig,
  llmUrls: string[],
  control: SharedArrayBuffer,
  gatewayUrl: string | null = null,
  servers: readonly ServerInfo[] = [],
  envWatch: SharedArrayBuffer | null = null,
): WorkerInit {
  const { llm } = config;
  const urls = (url: string | string[] | undefined) => (url === undefined ? llmUrls : urlList(url));
  return {
    v: PROTOCOL_VERSION,
    control,
    envWatch,
    logLevel: config.logLevel,
    prettyLogs: wantsPrettyLogs(),
    gatewayUrl,
    recordsDir: config.runDir !== null && config.recordSteps ? join(config.runDir, 'steps') : null,
    firstWave: Math.min(
      config.workers.groupsPerWorker * Math.max(...config.tasks.map((t) => t.groupSize)),
      config.workers.rolloutsPerWorker ?? Infinity,
    ),
    rolloutsPerWorker: config.workers.rolloutsPerWorker,
    llm: {
      client: {
        apiKey: llm.apiKey,
        timeoutMs: llm.timeoutMs,
        maxReplyBytes: llm.maxReplyBytes,
        retries: llm.retries,
        retryBackoffMs: llm.retryBackoffMs,
        connections: llm.connections,
        returnTokenIds: llm.returnTokenIds,
        logprobs: llm.logprobs,
        sessionPath: llm.sessionPath,
        stream: llm.stream,
        // Drain mode lets every call finish on the old weights; only an aborting pause holds streams.
        // An in-place pause leaves calls to the servers (the gate holds nothing in IN_PLACE); one that
        // falls back to an abort holds streamed calls as abort mode does.
        holdOnPause: llm.stream && config.pause.mode !== 'drain',
        api: llm.api,
        toolParser: llm.toolParser,
        routedExperts:
          llm.routedExperts === false ? null : { shape: llm.routedExperts === true ? null : llm.routedExperts },
        samplingMasks: llm.samplingMasks,
        historyMode: llm.historyMode,
      },
      // Unprobed endpoints (a test's own pool) are taken for `llm.server`, or generic under auto.
      servers: Object.fromEntries(servers.map((s) => [s.url, { kind: s.kind, contextLength: s.contextLength }])),
      fallbackServer: { kind: llm.server === 'auto' ? 'generic' : llm.server, contextLength: null },
      tokenizer: llm.api === 'tokens' ? llm.tokenizer : null,
      default: { urls: llmUrls, model: llm.model, temperature: null, sampling: null, maxTokens: null },
      policies: Object.fromEntries(
        Object.entries(llm.policies).map(([agent, p]) => [
          agent,
          {
            urls: urls(p.url),
            model: p.model ?? llm.model,
            temperature: p.temperature ?? null,
            sampling: Object.keys(samplingShapeOf(p)).length > 0 ? samplingShapeOf(p) : null,
            maxTokens: p.maxTokens ?? null,
          },
        ]),
      ),
      maxConcurrency: llm.maxConcurrency,
      routing: llm.routing,
      startupJitterMs: llm.startupJitterMs,
    },
    tasks: Object.fromEntries(
      config.tasks.map((t) => [
        t.name,
        {
          env: workerEnv(t.env),
          hooks: t.hooks === null ? null : { moduleUrl: t.hooks.moduleUrl, exportName: t.hooks.export },
          blackbox: t.agent === null ? null : { moduleUrl: t.agent.moduleUrl, exportName: t.agent.export },
          agent: {
            maxSteps: t.maxSteps,
            messageCut: t.messageCut,
            maxTokens: t.maxTokens,
            temperature: t.temperature,
            ...(Object.keys(samplingShapeOf(t)).length > 0 ? { sampling: samplingShapeOf(t) } : {}),
            partialRollout: config.producer.partialRollout,
            infraRetries: t.infraRetries,
            sendSeed: llm.sendSeed,
            tools: t.tools,
            ...(llm.priority !== 'off' ? { priority: llm.priority } : {}),
          },
        },
      ]),
    ),
  };
}

function withDeadline<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

/**
 * The group as it was sent (its bytes were transferred away), ABORTED: every rollout not COMPLETED
 * carries `reason` and runs again from where it was sent (what it held then, partial turns included).
 */
export function abortedGroup(group: RolloutGroup, reason: string): RolloutGroup {
  for (const rollout of group.rollouts) {
    if (rollout.status === Status.COMPLETED) continue;
    rollout.status = Status.ABORTED;
    rollout.error = reason;
  }
  group.status = Status.ABORTED;
  return group;
}

/**
 * The group as it was sent (its bytes were transferred away), every rollout FAILED with `reason`; of
 * `kind` infrastructure unless said otherwise — a pool fails a group when what runs it broke.
 */
export function failedGroup(group: RolloutGroup, reason: string, kind: FailureKind = 'infrastructure'): RolloutGroup {
  for (const rollout of group.rollouts) failRollout(rollout, reason, kind);
  group.status = Status.FAILED;
  group.error = reason;
  return group;
}

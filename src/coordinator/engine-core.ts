/**
 * EngineCore: the engine on the main thread. It owns every piece of bookkeeping and composes the parts.
 *
 *   Sampler ─► Producer (sync | async strategy) ─► WorkerPool (Piscina threads run the agent loops)
 *                  │   ▲                                │
 *                  │   └── ABORTED / EXPIRED retries    │ finished groups
 *                  ▼                                    ▼
 *              ReplayBuffer ◄───────────────────────────┘  ─► getBatch(trainStep) ─► trainer
 *   PauseControl ── shared flag ──► every worker (pause / resume, model step)
 *
 * The public `Engine` class in src/engine.ts is a thin shell over this, and supplies what it starts
 * when `llm.url` is null (EmbeddedLlm: the shipped mock, which the coordinator never imports).
 */
import { noFailures, type FailureKind } from '../domain/failure.ts';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { policyUrls, samplingUses, urlList, usesGateway, type ResolvedConfig } from '../config.ts';
import { emptyDropCounts, type DropReason } from '../buffer/replay-buffer.ts';
import { Sampler } from '../buffer/sampler.ts';
import { createRemoteEnvironments } from '../env/remote.ts';
import type { Gateway } from '../gateway/index.ts';
import {
  checkServedVersions,
  probeServer,
  samplingGaps,
  serverGaps,
  unhonouredSampling,
  DIALECTS,
  type ServerInfo,
} from '../llm/servers.ts';
import { createLogger, type Logger } from '../log.ts';
import { ConfigError, describeError, RolloutEngineError } from '../errors.ts';
import { requireInstalled } from '../optional-packages.ts';
import type { TaskCheck, WorkerStats } from '../protocol/messages.ts';
import { readCheckpoint, writeCheckpoint } from './checkpoint.ts';
import { PauseControl } from './pause-control.ts';
import {
  emptyGroupCounts,
  Producer,
  type Batch,
  type GroupCounts,
  type PauseReport,
  type ProducerHooks,
  type ProducerObserver,
  type ProducerSnapshot,
} from './producer.ts';
import { PiscinaWorkerPool, type NodeStatus, type PauseNodes, type WorkerPool } from './worker-pool.ts';
import type { OutageStats } from './outage.ts';
import type { AdmissionStats } from './admission.ts';
import { Auditor, type AuditObserver, type AuditStats } from './audit.ts';
import { CANNOT_SCORE, scoreWire } from '../llm/score-wire.ts';
import type { RolloutAudit } from './audit-segments.ts';
import type { RolloutGroup, RolloutState } from '../domain/rollout.ts';

export interface EngineStats {
  modelStep: number;
  /** The train step the next `getBatch()` without an argument produces for. */
  nextTrainStep: number;
  /** The step the producer is producing for (async: may run ahead of the trainer). */
  producerFutureStep: number;
  paused: boolean;
  groups: GroupCounts;
  buffer: {
    completed: number;
    aborted: number;
    expired: number;
    bytes: number;
    dropped: Record<DropReason, number>;
    lastDropReason: string | null;
  };
  /**
   * Episodes that failed, by kind (src/domain/failure.ts), since this process started; infrastructure
   * ones include those run again in their slot (`tasks[].infraRetries`), none of which is trained.
   */
  failures: Record<FailureKind, number>;
  /** Inference outages: whether one is on now, how many and how long so far, the groups they aborted. */
  outage: OutageStats;
  /** With `producer.admission: deadline` only: the predicted group lifetime, the trainer's pace, rounds held back. */
  admission?: AdmissionStats;
  workers: WorkerStats[];
  /**
   * Weight-version mismatches, every one the engine warned of: the workers' replies (each worker's
   * `weightVersionMismatches`), the gateway's replies for agent tasks, and servers a resume's check
   * found serving other weights than announced (vLLM, SGLang's streamed chat: their replies carry no
   * version). The workers' and the gateway's are warned of once each, the resume check's every time.
   */
  weightVersionMismatches: number;
  /** Worker nodes serving the run (with `workers.nats`): id, host, groups in flight, last heartbeat. */
  nodes?: NodeStatus[];
  /** The consistency audit since the start (coordinator/audit.ts); absent before start. */
  audit?: AuditStats;
}

/** What `POST /audit` names: a rollout, a group, or (neither) the last batch handed out. */
export interface AuditTarget {
  rolloutId?: string;
  groupId?: string;
}

/** What `resume` is told: the weights now served, and whether it may only end a pause. */
export interface ResumeOptions {
  modelStep: number;
  /** The servers' own name for these weights (SGLang's `--weight-version`); null or absent: unnamed. */
  weightVersion?: string | null;
  /**
   * Refuse (ERR_ENGINE_STATE) unless a pause came since the last resume, as `POST /resume` does: a
   * trainer's resume with no pause before it would move the model step under groups in flight. A
   * repeat of the last resume (same model step, same or no weightVersion) is answered as done, so a
   * retried resume whose answer was lost does not fail.
   */
  pausedOnly?: boolean;
}

/** createEngine's options besides the config (hooks, an observer, a replacement pool, a logger). */
export interface EngineOptions extends ProducerHooks {
  /** Told about landed, taken and dropped groups and pauses, and audits (metrics). */
  observer?: ProducerObserver & AuditObserver;
  /** Replace the worker pool (remote pools; tests). */
  pool?: (config: ResolvedConfig, llmUrls: string[], control: SharedArrayBuffer, log: Logger) => WorkerPool;
  log?: Logger;
}

/**
 * The inference server the engine starts itself when `llm.url` is null: what EngineCore needs of it.
 * The composition root (src/engine.ts) supplies the starter, which loads the shipped mock
 * (mock-llm/) on demand, so neither the coordinator nor a run against real servers loads it.
 */
export interface EmbeddedLlm {
  /** Base URL without a trailing slash. */
  readonly url: string;
  /** "Loads" the weights of `modelStep`: replies that start from now on name it. */
  setWeightVersion(modelStep: number): void;
  close(): Promise<void>;
}

/** What the embedded server is started with. */
export interface EmbeddedLlmOptions {
  /** The config's `mock` section. */
  mock: ResolvedConfig['mock'];
  /** The model id it serves (`llm.model`). */
  model: string;
  /** Read and answer in qwen2.5 token ids (black-box agents through the gateway, `llm.api: tokens`). */
  tokenIds: boolean;
}

export type StartEmbeddedLlm = (options: EmbeddedLlmOptions) => Promise<EmbeddedLlm>;

/** Dataset lines sent to a worker per start-up check call. */
const CHECK_SLICE = 10_000;

type State = 'created' | 'starting' | 'running' | 'closing' | 'closed';

export class EngineCore {
  readonly config: ResolvedConfig;
  readonly log: Logger;
  readonly #options: EngineOptions;
  #state: State = 'created';
  #llmUrls: string[] = [];
  readonly #startEmbeddedLlm: StartEmbeddedLlm;
  /** The built-in mock server, when `llm.url` is null: resume "loads" weights into it by setting its version. */
  #embeddedMock: EmbeddedLlm | null = null;
  /** The token-trace gateway, when a task has a black-box agent. */
  #gateway: Gateway | null = null;
  #pool: WorkerPool | null = null;
  #producer: Producer | null = null;
  /** What the start-up probe learnt of each inference endpoint. */
  #servers: ServerInfo[] = [];
  /** Servers a resume's check found serving other weights than announced (the workers count their replies). */
  #resumeMismatches = 0;
  #gatewayMismatchSaid = false;
  /** The consistency audit (coordinator/audit.ts), from start. */
  #auditor: Auditor | null = null;
  /** Serializes getBatch / pause / resume / checkpoint: one at a time, in call order. */
  #queue: Promise<unknown> = Promise.resolve();
  /** Serializes endpoint changes (not behind a getBatch, which may wait on the very server joining). */
  #endpointQueue: Promise<unknown> = Promise.resolve();

  /** `startEmbeddedLlm` is called at start when `llm.url` is null. */
  constructor(config: ResolvedConfig, options: EngineOptions, startEmbeddedLlm: StartEmbeddedLlm) {
    this.config = config;
    this.#options = options;
    this.#startEmbeddedLlm = startEmbeddedLlm;
    this.log = options.log ?? createLogger(config.logLevel, { thread: 'main' });
  }

  /** The first inference endpoint (the embedded mock's when `llm.url` is null); null before start(). */
  get llmUrl(): string | null {
    return this.#llmUrls[0] ?? null;
  }

  /** The default policy's inference endpoints now: `llm.url`, as changed by updateEndpoints. */
  get endpoints(): string[] {
    return [...this.#llmUrls];
  }

  /**
   * Endpoints join or leave the fleet while the engine runs (the control API's `POST /endpoints`):
   * each joining one is probed as at start (it must answer `/v1/models` and serve `llm.model`), then
   * every worker sends new sessions to it at once; a leaving one takes no new call, its sessions
   * moving at their next call. Pauses, the outage check and the resume's version check follow the new
   * list. Resolves with the endpoints now. Only the default policy's (`llm.url`); not with worker nodes.
   */
  updateEndpoints(change: { add?: readonly string[]; remove?: readonly string[] }): Promise<string[]> {
    const run = this.#endpointQueue.then(() =>
      this.#withProducer((producer) => this.#changeEndpoints(producer, change)),
    );
    this.#endpointQueue = run.catch(() => undefined);
    return run;
  }

  async #changeEndpoints(
    producer: Producer,
    change: { add?: readonly string[]; remove?: readonly string[] },
  ): Promise<string[]> {
    const pool = this.#pool!;
    if (pool.setEndpoints === undefined)
      throw new RolloutEngineError(
        'ERR_ENGINE_STATE',
        'this worker pool (worker nodes) keeps the inference endpoints it started with',
      );
    for (const url of [...(change.add ?? []), ...(change.remove ?? [])]) {
      let ok = false;
      try {
        ok = /^https?:$/.test(new URL(url).protocol);
      } catch {
        // not a URL
      }
      if (!ok)
        throw new RolloutEngineError('ERR_INVALID_ARGUMENT', `endpoint ${JSON.stringify(url)} is not an http(s) URL`);
    }
    const remove = new Set(change.remove ?? []);
    const unknown = [...remove].filter((url) => !this.#llmUrls.includes(url));
    if (unknown.length > 0)
      throw new RolloutEngineError(
        'ERR_INVALID_ARGUMENT',
        `not an endpoint of llm.url: ${unknown.join(', ')} (the endpoints are ${this.#llmUrls.join(', ')})`,
      );
    const joining = [...new Set(change.add ?? [])].filter((url) => !this.#llmUrls.includes(url) && !remove.has(url));
    const next = [...this.#llmUrls.filter((url) => !remove.has(url)), ...joining];
    if (next.length === 0)
      throw new RolloutEngineError('ERR_INVALID_ARGUMENT', 'the last endpoint of llm.url cannot be removed');
    const policyEndpoints = policyUrls(this.config);
    // As at start: a server that does not answer, or serves another model, is refused before any call goes to it.
    const probed = await this.#probeServers(joining, []);
    const kept = this.#servers.filter((s) => !remove.has(s.url) || policyEndpoints.includes(s.url));
    this.#servers = [...kept, ...probed];
    this.#llmUrls = next;
    await pool.setEndpoints({
      urls: next,
      servers: Object.fromEntries(probed.map((s) => [s.url, { kind: s.kind, contextLength: s.contextLength }])),
    });
    producer.setEndpoints(
      [...new Set([...next, ...policyEndpoints])],
      new Map(this.#servers.map((s) => [s.url, s.abort])),
      new Map(this.#servers.map((s) => [s.url, s.pauseInPlace])),
    );
    this.log.info({ endpoints: next, joined: joining, left: [...remove] }, 'inference endpoints changed');
    return [...next];
  }

  async start(): Promise<void> {
    if (this.#state !== 'created')
      throw new RolloutEngineError('ERR_ENGINE_STATE', `start() called on an engine that is ${this.#state}`);
    this.#state = 'starting';
    try {
      const { config } = this;
      const autoPath = this.#autoCheckpointPath();
      const resumeFrom =
        config.resumeFrom ?? (config.resume && autoPath !== null && existsSync(autoPath) ? autoPath : null);
      const resumed = resumeFrom === null ? null : readCheckpoint(resumeFrom, config);
      if (config.tasks.some((task) => task.tools.mcp.length > 0)) requireInstalled('mcp');
      const samplers = new Map<string, Sampler>();
      for (const task of config.tasks) samplers.set(task.name, await Sampler.create(task, config.seed));
      const configured = config.llm.url;
      this.#llmUrls = configured === null ? [await this.#startEmbeddedMock()] : urlList(configured);
      const policyEndpoints = policyUrls(config);
      const endpoints = [...new Set([...this.#llmUrls, ...policyEndpoints])];
      const servers = await this.#probeServers(endpoints, policyEndpoints);
      this.#servers = servers;
      // Environment servers too: a wrong URL or env name is one clear error at start, not a failed group each.
      for (const task of config.tasks) {
        if (task.env?.http === undefined) continue;
        const servers = createRemoteEnvironments(task.env.http);
        try {
          await servers.prewarm();
        } finally {
          await servers.close();
        }
      }
      if (config.runDir !== null) mkdirSync(config.runDir, { recursive: true });
      const launched = launchVersion(servers);
      const control = new PauseControl(resumed?.modelStep ?? config.modelStep, launched);
      if (config.tasks.some(usesGateway)) {
        // One gateway per process: it holds the policy's tokenizer, and workers reach it over loopback.
        const { startGateway } = await import('../gateway/index.ts');
        this.#gateway = await startGateway({
          backend: {
            kind: config.gateway.backend,
            url: this.#llmUrls[0],
            model: config.llm.model,
            apiKey: config.llm.apiKey,
          },
          tokenizer: config.gateway.tokenizer,
          // The server's own limit when the config names none: a session past it is truncated by the
          // gateway (max_tokens clamped) instead of refused by the server.
          maxContext:
            config.gateway.maxContext ?? servers.find((s) => s.url === this.#llmUrls[0])?.contextLength ?? null,
          sessionTtlMs: config.gateway.sessionTtlMs,
          modelStep: resumed?.modelStep ?? config.modelStep,
          // Its replies' versions read as the workers read theirs (domain/weight-versions.ts).
          weightVersion: launched,
          modelStepIsNewest: true,
          onVersionMismatch: this.#gatewayMismatch,
          // Routing replay and sampling masks asked of its backend as the agent loop asks (docs/ROUTING-REPLAY.md).
          routedExperts: config.llm.routedExperts,
          samplingMasks: config.llm.samplingMasks,
          port: 0,
        });
        this.log.info({ url: this.#gateway.url }, 'token-trace gateway started');
      }
      const gatewayUrl = this.#gateway?.url ?? null;
      const poolOptions = {
        config,
        llmUrls: this.#llmUrls,
        control: control.block,
        log: this.log,
        gatewayUrl,
        servers,
      };
      const pool =
        this.#options.pool?.(config, this.#llmUrls, control.block, this.log) ??
        // Worker nodes over NATS (src/cluster/): loaded only when asked for.
        (config.workers.nats !== null
          ? await (await import('../cluster/index.ts')).createClusterPool(poolOptions)
          : new PiscinaWorkerPool(poolOptions));
      this.#pool = pool;
      await this.#checkTasks(pool, samplers);
      const abortRoutes = new Map(servers.map((s) => [s.url, s.abort]));
      const auditor = this.#startAuditor(servers);
      const base = this.#options.observer;
      this.#producer = new Producer({
        config,
        pool,
        control,
        samplers,
        log: this.log,
        endpoints,
        abortRoutes,
        inPlaceRoutes: new Map(servers.map((s) => [s.url, s.pauseInPlace])),
        hooks: this.#options,
        observer: {
          landed: (group, sent) => {
            base?.landed?.(group, sent);
            auditor.landed(group);
          },
          taken: (groups, step) => base?.taken?.(groups, step),
          dropped: (group, reason) => base?.dropped?.(group, reason),
          discarded: (tokens, cause) => base?.discarded?.(tokens, cause),
          paused: (report) => base?.paused?.(report),
          outageBegan: () => base?.outageBegan?.(),
          outageEnded: (ms) => base?.outageEnded?.(ms),
          outageAborted: (group) => base?.outageAborted?.(group),
        },
      });
      if (resumed !== null) {
        this.#producer.restore(resumed);
        this.#embeddedMock?.setWeightVersion(resumed.modelStep);
      }
      this.#producer.start();
      this.#state = 'running';
      this.log.info(
        {
          llm: this.#llmUrls,
          strategy: config.producer.strategy,
          threads: config.workers.threads,
          groupsPerWorker: config.workers.groupsPerWorker,
          tasks: config.tasks.map((t) => t.name),
          ...(resumed ? { resumedFrom: resumeFrom, nextTrainStep: this.#producer.progress.nextTrainStep } : {}),
        },
        'engine started',
      );
    } catch (err) {
      await this.close();
      throw err;
    }
  }

  /** Produce (sync) or wait for (async) and take the batch for `trainStep` (default: the next one). */
  getBatch(trainStep?: number): Promise<Batch> {
    return this.#serialized(async (producer) => {
      const step = trainStep ?? producer.progress.nextTrainStep;
      if (!Number.isInteger(step) || step < 1)
        throw new RolloutEngineError(
          'ERR_INVALID_ARGUMENT',
          `trainStep must be a positive integer (got ${String(trainStep)})`,
        );
      const batch = await producer.getBatch(step);
      const autoPath = this.#autoCheckpointPath();
      // Saved before the batch leaves: after a crash the run resumes past it, and asking for the same step again re-delivers it.
      // The audit since the previous batch rides with it (a batch delivered again keeps its own).
      if (batch.status === 'NORMAL' && batch.stats !== undefined && batch.stats.audit === undefined && this.#auditing())
        batch.stats.audit = this.#auditor?.takeWindow();
      if (batch.status === 'NORMAL' && autoPath !== null) writeCheckpoint(autoPath, this.config, producer.snapshot());
      if (batch.status === 'NORMAL') {
        const s = batch.stats!;
        this.log.info(
          {
            trainStep: step,
            groups: s.groups,
            meanReward: round3(s.meanReward),
            maxStaleness: s.staleness.max,
            ms: Math.round(s.produceMs),
          },
          'batch ready',
        );
      } else this.log.info({ trainStep: step, status: batch.status }, 'no batch');
      return batch;
    });
  }

  /** Pause production for a weight update; resolves when every group in flight is back (or timed out). */
  pauseForWeightUpdate(): Promise<PauseReport & { nodes?: PauseNodes }> {
    // Not queued behind a getBatch in progress: the pause is what lets that call return.
    return this.#withProducer(async (producer) => {
      this.#auditor?.pausing();
      const report = await producer.pause();
      const nodes = this.#pool?.pauseNodes?.() ?? null;
      return nodes === null ? report : { ...report, nodes };
    });
  }

  /** New weights are in the inference servers: continue with `modelStep` (the servers name them `weightVersion`). */
  resume(options: ResumeOptions): Promise<void> {
    return this.#withProducer(async (producer) => {
      this.#auditor?.pausing();
      producer.resume(options.modelStep, options.weightVersion ?? null, { pausedOnly: options.pausedOnly });
      // In the same tick: a gateway call answered once production goes on is read against these weights.
      this.#gateway?.setModelStep(options.modelStep, options.weightVersion ?? null);
      this.#embeddedMock?.setWeightVersion(options.modelStep); // "loading" the new weights into the embedded server
      // After an in-place pause the servers go on too (a call the workers send first waits there for it).
      await producer.continueServers();
      if (options.weightVersion != null) {
        // Not awaited: production has resumed, and the check is a report, not a gate.
        void checkServedVersions(this.#servers, options.weightVersion, options.modelStep, {
          api: this.config.llm.api,
          stream: this.config.llm.stream,
          apiKey: this.config.llm.apiKey,
        }).then((problems) => {
          for (const problem of problems) {
            // A server not serving what was announced is a mismatch, as a reply naming other weights is.
            this.#resumeMismatches++;
            this.log.warn(
              { weightVersion: options.weightVersion, modelStep: options.modelStep },
              `${problem}; counted in weightVersionMismatches`,
            );
          }
        });
      }
    });
  }

  /** Write the run's state to `path` atomically. Production goes on; groups in flight are saved as they were sent. */
  checkpoint(path: string): Promise<{ path: string; bytes: number }> {
    return this.#serialized(async (producer) => ({
      path,
      bytes: writeCheckpoint(path, this.config, producer.snapshot()),
    }));
  }

  /**
   * Every endpoint probed once (llm/servers.ts): a server that is down, serves another model, or cannot
   * do what `llm.api` needs is one clear error at start; its kind, context length, abort and in-place
   * pause routes are logged, and what the user loses on it is said now, not found at the first pause.
   */
  async #probeServers(endpoints: string[], policyEndpoints: string[]): Promise<ServerInfo[]> {
    const { llm } = this.config;
    const servers: ServerInfo[] = [];
    for (const url of endpoints) {
      const info = await probeServer(url, { server: llm.server, apiKey: llm.apiKey, abortPath: llm.abortPath });
      const dialect = DIALECTS[info.kind];
      // vLLM and SGLang answer 404 to a model they do not serve: every call would fail. llama.cpp serves
      // its one model whatever the request names.
      if (
        info.models.length > 0 &&
        !info.models.includes(llm.model) &&
        !policyEndpoints.includes(url) &&
        info.kind !== 'llamacpp'
      ) {
        throw new RolloutEngineError(
          'ERR_LLM_MODEL',
          `llm.model: ${url} does not serve ${JSON.stringify(llm.model)} (it lists ${info.models.map((m) => JSON.stringify(m)).join(', ')}); set llm.model (--model) to one of them`,
        );
      }
      if (llm.api === 'tokens' && dialect.tokenRoute === null) {
        throw new RolloutEngineError(
          'ERR_LLM_API',
          `llm.api "tokens": ${url} is a ${dialect.label} server, which has no token-in route; use llm.api "chat", or set llm.server if it is vLLM, SGLang or llama.cpp`,
        );
      }
      this.log.info(
        {
          url,
          server: info.kind,
          contextLength: info.contextLength,
          abort: info.abort?.path ?? null,
          pauseInPlace: info.pauseInPlace?.pause.path ?? null,
          api: llm.api,
        },
        `inference server: ${dialect.label}${llm.server === 'auto' ? ' (llm.server auto)' : ''}`,
      );
      const pauseInPlace = this.config.pause.mode === 'in-place';
      for (const gap of serverGaps(info, {
        api: llm.api,
        stream: llm.stream,
        wantIds: llm.returnTokenIds,
        pauseInPlace,
      }))
        this.log.warn({ url, server: info.kind }, `${dialect.label} at ${url}: ${gap}`);
      // What the tasks sample with, against what this server can do and reports (llm/servers.ts).
      const uses = samplingUses(this.config, url);
      const refused = unhonouredSampling(info, uses);
      if (refused.length > 0) throw new ConfigError(refused);
      for (const gap of samplingGaps(info, uses, { logprobs: llm.logprobs }))
        this.log.warn({ url, server: info.kind }, `${dialect.label} at ${url}: ${gap}`);
      servers.push(info);
    }
    return servers;
  }

  /**
   * Each task's modules loaded, its environment made once and its dataset checked line by line by the
   * environment's own `checkResetParams`, on a worker, before anything is produced: a module that does
   * not load or construct, or a misspelt field in a dataset line, is one ConfigError naming the task
   * and the module or the line — not a FAILED group after another, or hours on random tasks.
   */
  async #checkTasks(pool: WorkerPool, samplers: Map<string, Sampler>): Promise<void> {
    if (pool.checkTask === undefined) return;
    for (const [i, task] of this.config.tasks.entries()) {
      const sampler = samplers.get(task.name)!;
      // In slices: a dataset is copied to the worker a slice at a time, not whole.
      for (let start = 0; start === 0 || start < sampler.size; start += CHECK_SLICE) {
        let check: TaskCheck;
        try {
          check = await pool.checkTask(task.name, sampler.prompts(start, start + CHECK_SLICE));
        } catch (err) {
          // The worker died under the check (a module that exits on import), or none can start at all.
          throw new RolloutEngineError(
            'ERR_WORKER',
            `tasks[${i}] (${task.name}): no worker could check the task: ${describeError(err)}`,
          );
        }
        const { problem, checksPrompts } = check;
        if (problem !== null) {
          throw new ConfigError([
            problem.line === null
              ? `tasks[${i}] (${task.name}): ${problem.message}`
              : `task ${task.name} dataset ${task.dataset}:${problem.line}: ${problem.message}`,
          ]);
        }
        if (!checksPrompts) break;
      }
    }
  }

  /** `<runDir>/engine.ckpt` when every batch is checkpointed, else null. */
  #autoCheckpointPath(): string | null {
    const { runDir, checkpointEachBatch } = this.config;
    return runDir !== null && checkpointEachBatch ? join(runDir, 'engine.ckpt') : null;
  }

  snapshot(): ProducerSnapshot | null {
    return this.#producer?.snapshot() ?? null;
  }

  async stats(): Promise<EngineStats> {
    const producer = this.#producer;
    const buffer = producer?.buffer;
    const workers = (await this.#pool?.stats()) ?? [];
    return {
      modelStep: producer?.modelStep ?? this.config.modelStep,
      nextTrainStep: producer?.progress.nextTrainStep ?? 1,
      producerFutureStep: producer?.progress.producerFutureStep ?? 1,
      paused: producer?.paused ?? false,
      groups: structuredClone(producer?.counts) ?? emptyGroupCounts(),
      buffer: {
        completed: buffer?.count(undefined, 'COMPLETED') ?? 0,
        aborted: buffer?.count(undefined, 'ABORTED') ?? 0,
        expired: buffer?.count(undefined, 'EXPIRED') ?? 0,
        bytes: buffer?.bytes ?? 0,
        dropped: buffer?.dropped ?? emptyDropCounts(),
        lastDropReason: buffer?.lastDropReason ?? null,
      },
      failures: producer?.failures ?? noFailures(),
      outage: producer?.outage ?? {
        state: 'up',
        currentMs: null,
        outages: 0,
        totalMs: 0,
        groupsAborted: 0,
        budgetMs: this.config.llm.outageBudgetMs,
      },
      ...(producer?.admission ? { admission: producer.admission } : {}),
      workers,
      weightVersionMismatches:
        this.#resumeMismatches +
        (this.#gateway?.stats().weightVersionMismatches ?? 0) +
        workers.reduce((n, w) => n + w.weightVersionMismatches, 0),
      ...(this.#pool?.nodes !== undefined ? { nodes: this.#pool.nodes() } : {}),
      ...(this.#auditor !== null ? { audit: this.#auditor.totals() } : {}),
    };
  }

  /** A gateway call answered by other weights than those served when it went out: counted there, said once. */
  readonly #gatewayMismatch = (version: string, expected: number, tagged: number): void => {
    if (this.#gatewayMismatchSaid) return;
    this.#gatewayMismatchSaid = true;
    const which =
      tagged === expected
        ? 'none the trainer announced, or newer'
        : `the weights of model step ${tagged}: the server has not loaded what the trainer announced since`;
    this.log.warn(
      { weightVersion: version, modelStep: expected, taggedStep: tagged },
      `the inference server behind the token-trace gateway answered with weight version ${JSON.stringify(version)}, which is not the weights of model step ${expected} the call was sent at (${which}): tokens tagged with step ${tagged}; counted in weightVersionMismatches, said once`,
    );
  };
  /**
   * Re-scores rollouts now (`POST /audit`): the one named, every one of the group named, or every
   * finished one of the last batch handed out; searched in the last batch, then the buffer. Resolves
   * with each rollout's audit once scored.
   */
  audit(target: AuditTarget = {}): Promise<RolloutAudit[]> {
    return this.#withProducer(async (producer) => {
      const auditor = this.#auditor as Auditor;
      const batch = producer.lastBatch?.groups ?? [];
      const holds = (g: RolloutGroup) =>
        target.groupId !== undefined
          ? g.id === target.groupId
          : target.rolloutId !== undefined && g.rollouts.some((r) => r.id === target.rolloutId);
      let groups: readonly RolloutGroup[];
      if (target.groupId === undefined && target.rolloutId === undefined) {
        if (batch.length === 0)
          throw new RolloutEngineError(
            'ERR_INVALID_ARGUMENT',
            'no batch handed out yet: name a rolloutId or a groupId to audit',
          );
        groups = batch;
      } else {
        const found = batch.find(holds) ?? producer.buffer.find(holds);
        if (found === null)
          throw new RolloutEngineError(
            'ERR_INVALID_ARGUMENT',
            `${target.groupId !== undefined ? `groupId ${JSON.stringify(target.groupId)}` : `rolloutId ${JSON.stringify(target.rolloutId)}`} is neither in the last batch nor in the buffer`,
          );
        groups = [found];
      }
      const items: { group: RolloutGroup; rollout: RolloutState }[] = [];
      for (const group of groups)
        for (const rollout of group.rollouts)
          if (target.rolloutId === undefined || rollout.id === target.rolloutId) items.push({ group, rollout });
      return auditor.auditNow(items);
    });
  }

  #auditing(): boolean {
    const totals = this.#auditor?.totals();
    return this.config.audit.fraction > 0 || (totals !== undefined && totals.cost.scoredTokens + totals.rollouts > 0);
  }

  #startAuditor(servers: readonly ServerInfo[]): Auditor {
    const config = this.config;
    const byUrl = new Map(servers.map((s) => [s.url, s]));
    const defaultUrl = this.#llmUrls[0];
    const auditor = new Auditor({
      settings: config.audit,
      serverFor: (_rollout, turn) => {
        const policy = turn.agentId !== null ? config.llm.policies[turn.agentId] : undefined;
        const url = policy?.url !== undefined ? urlList(policy.url)[0] : defaultUrl;
        const info = byUrl.get(url);
        return { url, kind: info?.kind ?? 'generic', model: policy?.model ?? config.llm.model };
      },
      serving: () => ({
        modelStep: this.#producer?.modelStep ?? config.modelStep,
        paused: this.#producer?.paused ?? false,
      }),
      apiKey: config.llm.apiKey,
      timeoutMs: config.llm.timeoutMs,
      log: this.log,
      observer: this.#options.observer,
    });
    if (config.audit.fraction > 0)
      for (const s of servers.filter((info) => scoreWire(info.kind) === null))
        this.log.warn(
          { url: s.url, kind: s.kind },
          `audit: ${DIALECTS[s.kind].label} at ${s.url} cannot score prompts, so its rollouts are not audited: ${CANNOT_SCORE[s.kind] ?? 'no scoring route'} (docs/AUDIT.md)`,
        );
    this.#auditor = auditor;
    return auditor;
  }

  async close(): Promise<void> {
    if (this.#state === 'closed' || this.#state === 'closing') return;
    const wasRunning = this.#state === 'running';
    this.#state = 'closing';
    if (wasRunning) await this.#queue; // let a call in progress land its groups first
    await this.#producer?.close();
    await this.#auditor?.close();
    await this.#pool?.close();
    await this.#gateway?.close();
    await this.#embeddedMock?.close();
    this.#state = 'closed';
  }

  #withProducer<T>(fn: (producer: Producer) => Promise<T>): Promise<T> {
    if (this.#state !== 'running' || this.#producer === null) {
      return Promise.reject(
        new RolloutEngineError('ERR_ENGINE_STATE', `the engine must be running (it is ${this.#state})`),
      );
    }
    return fn(this.#producer);
  }

  #serialized<T>(fn: (producer: Producer) => Promise<T>): Promise<T> {
    const run = this.#queue.then(() => this.#withProducer(fn));
    this.#queue = run.catch(() => undefined);
    return run;
  }

  async #startEmbeddedMock(): Promise<string> {
    // Black-box agents reach the mock through the gateway's token-in calls, and `llm.api: tokens` sends
    // ids of its own: the mock then reads and answers in that vocabulary.
    const tokenIds = this.config.llm.api === 'tokens' || this.config.tasks.some(usesGateway);
    if (this.config.llm.api === 'tokens' && this.config.llm.tokenizer !== 'qwen2.5') {
      throw new RolloutEngineError(
        'ERR_LLM_API',
        `llm.tokenizer: the built-in mock speaks qwen2.5 ids only (got ${JSON.stringify(this.config.llm.tokenizer)}); give llm.url for another tokenizer`,
      );
    }
    const mock = await this.#startEmbeddedLlm({ mock: this.config.mock, model: this.config.llm.model, tokenIds });
    this.#embeddedMock = mock;
    this.log.info({ url: mock.url }, 'embedded mock inference server started');
    return mock.url;
  }
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}

/**
 * The weight version the servers serve at start, for the step the engine starts at; null when none
 * says, or when they disagree (then no version names the start's weights: replies are told apart by
 * the announcements alone, as before any was made).
 */
function launchVersion(servers: readonly ServerInfo[]): string | null {
  const versions = new Set(servers.flatMap((s) => (s.weightVersion === undefined ? [] : [s.weightVersion])));
  return versions.size === 1 ? [...versions][0] : null;
}

/**
 * The coordinator: owns every piece of bookkeeping on the main thread and composes the parts.
 *
 *   Sampler ─► SyncProducer ─► WorkerPool (Piscina threads run the agent loops)
 *                   │                │
 *                   └─► ReplayBuffer ◄┘ (finished groups)  ─► getBatch() ─► trainer
 *
 * The public `Engine` class in src/index.ts is a thin shell over this.
 */
import type { ResolvedConfig } from '../config.ts';
import { ReplayBuffer } from '../buffer/replay-buffer.ts';
import { Sampler } from '../buffer/sampler.ts';
import { probeInferenceServer } from '../llm/client.ts';
import { createLogger, type Logger } from '../log.ts';
import { RolloutEngineError } from '../protocol/errors.ts';
import type { WorkerStats } from '../protocol/messages.ts';
import { PiscinaWorkerPool, type WorkerPool } from './worker-pool.ts';
import { SyncProducer, type Batch, type GroupCounts } from './producer.ts';

export interface EngineStats {
  modelStep: number;
  /** The train step the next `getBatch()` without an argument produces for. */
  nextTrainStep: number;
  groups: GroupCounts;
  buffer: { completed: number; aborted: number; expired: number; dropped: { FAILED: number; FILTERED: number } };
  workers: WorkerStats[];
}

export interface CoordinatorOptions {
  /** Replace the worker pool (tests, remote pools). */
  pool?: (config: ResolvedConfig, llmUrl: string, log: Logger) => WorkerPool;
  log?: Logger;
}

type State = 'created' | 'starting' | 'running' | 'closing' | 'closed';

export class Coordinator {
  readonly config: ResolvedConfig;
  readonly log: Logger;
  readonly #options: CoordinatorOptions;
  #state: State = 'created';
  #llmUrl: string | null = null;
  #closeMock: (() => Promise<void>) | null = null;
  #pool: WorkerPool | null = null;
  #buffer: ReplayBuffer | null = null;
  #producer: SyncProducer | null = null;
  #nextTrainStep = 1;
  /** Serializes getBatch calls: one round of production at a time. */
  #round: Promise<unknown> = Promise.resolve();

  constructor(config: ResolvedConfig, options: CoordinatorOptions = {}) {
    this.config = config;
    this.#options = options;
    this.log = options.log ?? createLogger(config.logLevel, { thread: 'main' });
  }

  get llmUrl(): string | null {
    return this.#llmUrl;
  }

  async start(): Promise<void> {
    if (this.#state !== 'created') throw new RolloutEngineError('ERR_ENGINE_STATE', `start() called on an engine that is ${this.#state}`);
    this.#state = 'starting';
    try {
      const { config } = this;
      const samplers = new Map<string, Sampler>();
      for (const task of config.tasks) samplers.set(task.name, await Sampler.create(task, config.seed));
      this.#llmUrl = config.llm.url ?? (await this.#startEmbeddedMock());
      const models = await probeInferenceServer(this.#llmUrl, { apiKey: config.llm.apiKey });
      if (models.length > 0 && !models.includes(config.llm.model)) {
        this.log.warn({ model: config.llm.model, served: models }, 'llm.model is not among the models the server lists');
      }
      const pool = this.#options.pool?.(config, this.#llmUrl, this.log) ?? new PiscinaWorkerPool({ config, llmUrl: this.#llmUrl, log: this.log });
      this.#pool = pool;
      this.#buffer = new ReplayBuffer(config.tasks.map((t) => t.name));
      this.#producer = new SyncProducer(config, pool, this.#buffer, samplers);
      this.#state = 'running';
      this.log.info(
        { llm: this.#llmUrl, threads: config.workers.threads, groupsPerWorker: config.workers.groupsPerWorker, tasks: config.tasks.map((t) => t.name) },
        'engine started',
      );
    } catch (err) {
      await this.close();
      throw err;
    }
  }

  /** Produce and take the batch for `trainStep` (default: the step after the last one taken). */
  getBatch(trainStep?: number): Promise<Batch> {
    const round = this.#round.then(() => this.#produce(trainStep));
    this.#round = round.catch(() => undefined);
    return round;
  }

  async #produce(trainStep: number | undefined): Promise<Batch> {
    if (this.#state !== 'running') throw new RolloutEngineError('ERR_ENGINE_STATE', `getBatch() needs a running engine; it is ${this.#state}`);
    const step = trainStep ?? this.#nextTrainStep;
    if (!Number.isInteger(step) || step < 1) throw new RolloutEngineError('ERR_INVALID_ARGUMENT', `trainStep must be a positive integer (got ${String(trainStep)})`);
    const batch = await this.#producer!.produceBatch(step);
    this.#nextTrainStep = step + 1;
    this.log.info({ trainStep: step, groups: batch.stats.groups, meanReward: round3(batch.stats.meanReward), ms: Math.round(batch.stats.produceMs) }, 'batch ready');
    return batch;
  }

  async stats(): Promise<EngineStats> {
    const buffer = this.#buffer;
    return {
      modelStep: this.#producer?.modelStep ?? this.config.modelStep,
      nextTrainStep: this.#nextTrainStep,
      groups: structuredClone(this.#producer?.counts ?? { scheduled: 0, inFlight: 0, finished: { INIT: 0, COMPLETED: 0, ABORTED: 0, EXPIRED: 0, FAILED: 0, FILTERED: 0 }, taken: 0 }),
      buffer: {
        completed: buffer?.count(undefined, 'COMPLETED') ?? 0,
        aborted: buffer?.count(undefined, 'ABORTED') ?? 0,
        expired: buffer?.count(undefined, 'EXPIRED') ?? 0,
        dropped: buffer?.dropped ?? { FAILED: 0, FILTERED: 0 },
      },
      workers: (await this.#pool?.stats()) ?? [],
    };
  }

  async close(): Promise<void> {
    if (this.#state === 'closed' || this.#state === 'closing') return;
    this.#state = 'closing';
    await this.#round; // let a round in progress land its groups first
    await this.#pool?.close();
    await this.#closeMock?.();
    this.#state = 'closed';
  }

  async #startEmbeddedMock(): Promise<string> {
    // Loaded lazily: a production run against a real server never pays for the tokenizer tables.
    const { startMockLlm } = await import('../testing/mock-llm/server.ts');
    const mock = await startMockLlm({ ...this.config.mock, host: '127.0.0.1', port: 0, model: this.config.llm.model });
    this.#closeMock = () => mock.close();
    this.log.info({ url: mock.url }, 'embedded mock inference server started');
    return mock.url;
  }
}

function round3(x: number): number {
  return Math.round(x * 1000) / 1000;
}

/**
 * rollout-engine's public API.
 *
 *   const engine = createEngine({ tasks: [...], llm: { url, model } });
 *   await engine.start();
 *   for await (const batch of engine.batches({ steps: 10 })) train(batch);
 *   await engine.close();
 */
import { resolveConfig, type EngineConfigInput, type ResolvedConfig, type ResolveOptions } from './config.ts';
import { Coordinator, type CoordinatorOptions, type EngineStats } from './coordinator/engine.ts';
import type { Batch, PauseReport } from './coordinator/producer.ts';
import { RolloutEngineError } from './protocol/errors.ts';
import { EngineMetrics } from './control/metrics.ts';
import { startControlServer, type ControlServer, type ControlServerOptions } from './control/server.ts';

export class Engine {
  readonly #coordinator: Coordinator;
  readonly #metrics: EngineMetrics;
  readonly #servers: ControlServer[] = [];

  constructor(config: ResolvedConfig, options?: CoordinatorOptions) {
    this.#metrics = new EngineMetrics(() => this.#coordinator.stats());
    this.#coordinator = new Coordinator(config, { ...options, observer: options?.observer ?? this.#metrics });
  }

  /** Serve the control API for trainers (see README "Control API"); closed with the engine. */
  async listen(options: ControlServerOptions = {}): Promise<ControlServer> {
    const server = await startControlServer(this, this.#metrics, { checkpointDir: this.config.runDir, ...options });
    this.#servers.push(server);
    return server;
  }

  /** Prometheus text of the engine's metrics. */
  metrics(): Promise<string> {
    return this.#metrics.text();
  }

  /** The validated config with every default filled in. */
  get config(): ResolvedConfig {
    return this.#coordinator.config;
  }

  /** Inference base URL in use (the embedded mock's when `llm.url` is null); null before start(). */
  get llmUrl(): string | null {
    return this.#coordinator.llmUrl;
  }

  /** Load datasets, start the embedded mock if needed, check the inference server, start the workers. */
  start(): Promise<void> {
    return this.#coordinator.start();
  }

  /** The batch for `trainStep` (default: the next one). Calls are served one at a time, in order. */
  getBatch(trainStep?: number): Promise<Batch> {
    return this.#coordinator.getBatch(trainStep);
  }

  /**
   * NORMAL batches for consecutive train steps; `steps` bounds it (default: until the loop breaks).
   * It does not update weights itself: with the async strategy, an EXPIRED_BATCH ends the iteration
   * with an error telling the caller to sync weights (use getBatch for that loop).
   */
  async *batches(options: { steps?: number } = {}): AsyncGenerator<Batch, void, undefined> {
    const steps = options.steps ?? Infinity;
    for (let i = 0; i < steps; i++) {
      const batch = await this.getBatch();
      if (batch.status !== 'NORMAL') {
        throw new RolloutEngineError(
          'ERR_BATCH_STATUS',
          `train step ${batch.trainStep}: ${batch.status} — sync the weights (pauseForWeightUpdate, resume) and call getBatch again`,
        );
      }
      yield batch;
    }
  }

  /**
   * Pause for a weight update: workers stop issuing inference calls at once, in-flight calls are
   * aborted (or drained, `pause.mode`), and every interrupted rollout comes back ABORTED with what it
   * had. Resolves with timings once every group in flight is back on the main thread.
   */
  pauseForWeightUpdate(): Promise<PauseReport> {
    return this.#coordinator.pauseForWeightUpdate();
  }

  /**
   * The inference servers hold weights `modelStep`: production continues, new tokens are tagged with
   * it. `weightVersion` is the servers' own name for these weights, when they report one (SGLang's
   * `--weight-version`, a string): a reply with another version is counted and warned of, once.
   */
  resume(options: { modelStep: number; weightVersion?: string | null }): Promise<void> {
    return this.#coordinator.resume(options);
  }

  /** Save the run to one file (atomic); `createEngine({ resumeFrom: path })` continues it. */
  checkpoint(path: string): Promise<{ path: string; bytes: number }> {
    return this.#coordinator.checkpoint(path);
  }

  stats(): Promise<EngineStats> {
    return this.#coordinator.stats();
  }

  /** Stop the workers and the embedded mock; waits for a batch in progress. Safe to call twice. */
  async close(): Promise<void> {
    await Promise.all(this.#servers.splice(0).map((s) => s.close()));
    await this.#coordinator.close();
  }
}

/** Validate `config` (throws a ConfigError naming each bad field) and build an engine; call start() next. */
export function createEngine(
  config: EngineConfigInput = {},
  options: ResolveOptions & CoordinatorOptions = {},
): Engine {
  return new Engine(resolveConfig(config, options), options);
}

export { resolveConfig, EngineConfigSchema, BUILTIN_ENVS } from './config.ts';
export type { EngineConfigInput, ResolvedConfig, TaskConfig, LlmConfig, MockConfig, ResolveOptions } from './config.ts';
export type { EngineStats, CoordinatorOptions } from './coordinator/engine.ts';
export type { Batch, BatchStats, GroupCounts, PauseReport, ProducerHooks } from './coordinator/producer.ts';
export { hasRewardSpread } from './coordinator/producer.ts';
export type { ProduceStatus, ShouldContinue } from './coordinator/strategies.ts';
export type { WorkerPool } from './coordinator/worker-pool.ts';
export { ConfigError, ProtocolError, RolloutEngineError } from './protocol/errors.ts';
export { LlmError } from './llm/errors.ts';
export { Status, groupStatus, statusForFinishReason } from './protocol/rollout.ts';
export type {
  RolloutState,
  RolloutGroup,
  TurnRecord,
  ChatMessage,
  PromptSample,
  FinishReason,
} from './protocol/rollout.ts';
export type { Environment, EnvironmentFactory, ResetOptions, ResetResult, StepResult, EnvParams } from './env/types.ts';
export { BatchFileWriter, groupToJson } from './coordinator/batch-file.ts';
export { listCompletedSessions, readStepRecords, indexSessions } from './records/index.ts';
export type { StepRecord, SessionEnd, CompletedSession } from './records/index.ts';
export { EnvError } from './env/errors.ts';
export { startEnvServer } from './env/server.ts';
export { createHttpEnvironments } from './env/http-env.ts';
export type { ControlServer, ControlServerOptions } from './control/server.ts';
export { runLoadtest } from './loadtest/index.ts';
export { startGateway, stitchTraces } from './gateway/index.ts';
export type { Gateway, GatewayOptions, StitchedSample } from './gateway/index.ts';
export type { BlackBoxAgent, BlackBoxInput, BlackBoxResult } from './rollout/blackbox-loop.ts';
export type { EpisodeHooks } from './rollout/agent-loop.ts';
export type { StitchedSession } from './protocol/rollout.ts';

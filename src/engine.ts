/**
 * The engine a trainer holds: a thin shell over the coordinator (coordinator/engine-core.ts) that adds
 * the control API and metrics, and gives it the mock to start when `llm.url` is null. The package entry
 * (src/index.ts) re-exports it; modules inside the package import it from here, never from the entry.
 *
 *   const engine = createEngine({ tasks: [...], llm: { url, model } });
 *   await engine.start();
 *   for await (const batch of engine.batches({ steps: 10 })) train(batch);
 *   await engine.close();
 */
import { resolveConfig, type EngineConfigInput, type ResolvedConfig, type ResolveOptions } from './config.ts';
import {
  EngineCore,
  type AuditTarget,
  type EmbeddedLlm,
  type EmbeddedLlmOptions,
  type EngineOptions,
  type EngineStats,
  type ResumeOptions,
} from './coordinator/engine-core.ts';
import type { RolloutAudit } from './coordinator/audit-segments.ts';
import type { PauseReport } from './coordinator/producer.ts';
import type { Batch } from './domain/batch.ts';
import type { PauseNodes } from './coordinator/worker-pool.ts';
import { RolloutEngineError } from './errors.ts';
import { EngineMetrics } from './control/metrics.ts';
import { startControlServer, type ControlServer, type ControlServerOptions } from './control/server.ts';

export class Engine {
  readonly #core: EngineCore;
  readonly #metrics: EngineMetrics;
  readonly #servers: ControlServer[] = [];

  constructor(config: ResolvedConfig, options?: EngineOptions) {
    this.#metrics = new EngineMetrics(() => this.#core.stats());
    this.#core = new EngineCore(
      config,
      { ...options, observer: options?.observer ?? this.#metrics },
      startEmbeddedMock,
    );
  }

  /** Serve the control API for trainers (see docs/CONTROL-API.md); closed with the engine. */
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
    return this.#core.config;
  }

  /** Inference base URL in use (the embedded mock's when `llm.url` is null); null before start(). */
  get llmUrl(): string | null {
    return this.#core.llmUrl;
  }

  /** The inference endpoints of `llm.url` now, as changed by updateEndpoints; empty before start(). */
  get endpoints(): string[] {
    return this.#core.endpoints;
  }

  /**
   * Inference servers join or leave while the engine runs (a trainer that launches or retires
   * servers; the control API's `POST /endpoints`). A joining server is probed as at start, then takes
   * new sessions at once; a leaving one takes no new call, its sessions moving to the others at their
   * next call. Resolves with the endpoints now. Local worker threads only (not worker nodes).
   */
  updateEndpoints(change: { add?: readonly string[]; remove?: readonly string[] }): Promise<string[]> {
    return this.#core.updateEndpoints(change);
  }

  /** Load datasets, start the embedded mock if needed, check the inference server, start the workers. */
  start(): Promise<void> {
    return this.#core.start();
  }

  /** The batch for `trainStep` (default: the next one). Calls are served one at a time, in order. */
  getBatch(trainStep?: number): Promise<Batch> {
    return this.#core.getBatch(trainStep);
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
  pauseForWeightUpdate(): Promise<PauseReport & { nodes?: PauseNodes }> {
    return this.#core.pauseForWeightUpdate();
  }

  /**
   * The inference servers hold weights `modelStep`: production continues, new tokens are tagged with
   * it. `weightVersion` is the servers' own name for these weights, when they report one (SGLang's
   * `--weight-version`, a string): a reply with another version is counted and warned of, once.
   * Without a pause before it, the model step moves under the groups in flight; `pausedOnly` refuses
   * that instead (the control API's `POST /resume`).
   */
  resume(options: ResumeOptions): Promise<void> {
    return this.#core.resume(options);
  }

  /** Save the run to one file (atomic); `createEngine({ resumeFrom: path })` continues it. */
  checkpoint(path: string): Promise<{ path: string; bytes: number }> {
    return this.#core.checkpoint(path);
  }

  stats(): Promise<EngineStats> {
    return this.#core.stats();
  }

  /**
   * The consistency audit on demand: re-scores on the inference server the rollout or group named, or
   * every rollout of the last batch handed out, and resolves with each one's |Δ logprob| by segment
   * (docs/AUDIT.md). `audit.fraction` audits a share of all rollouts as they land without asking.
   */
  audit(target: AuditTarget = {}): Promise<RolloutAudit[]> {
    return this.#core.audit(target);
  }

  /** Stop the workers and the embedded mock; waits for a batch in progress. Safe to call twice. */
  async close(): Promise<void> {
    await Promise.all(this.#servers.splice(0).map((s) => s.close()));
    await this.#core.close();
  }
}

/**
 * The embedded inference server when `llm.url` is null: the shipped mock, on loopback. Loaded on
 * demand: a production run against a real server never pays for the mock or its tokenizer tables.
 */
async function startEmbeddedMock({ mock, model, tokenIds }: EmbeddedLlmOptions): Promise<EmbeddedLlm> {
  const { startMockLlm } = await import('./mock-llm/server.ts');
  return startMockLlm({
    ...mock,
    ...(tokenIds ? { tokenizer: 'qwen2.5' as const } : {}),
    host: '127.0.0.1',
    port: 0,
    model,
  });
}

/** Validate `config` (throws a ConfigError naming each bad field) and build an engine; call start() next. */
export function createEngine(config: EngineConfigInput = {}, options: ResolveOptions & EngineOptions = {}): Engine {
  return new Engine(resolveConfig(config, options), options);
}

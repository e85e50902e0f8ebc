/**
 * Every message that crosses between the coordinator (main thread) and the worker threads.
 *
 * - once, at start: `WorkerInit`, piscina's workerData (structured clone: it carries the shared
 *   blocks). Its settings are typed by the worker-side module that reads each of them (a type-only
 *   import: nothing of env/, llm/ or worker/ is loaded by this module);
 * - task / result bytes through the pool: `WireMessage`, msgpack-encoded by ./codec.ts and carried in
 *   transferred ArrayBuffers (never structured-cloned rollout states); `WorkerTasks` names the
 *   piscina tasks a worker answers, the start-up check (`CheckTaskRequest` → `TaskCheck`) among them;
 * - a per-worker control port (comlink over a MessagePort, ./control-port.ts) for stats, flushes and
 *   close: `WorkerControl`, registered by the worker with a `WorkerRegistration` message.
 *
 * `v` is bumped whenever a wire shape changes, so a stale worker file cannot silently misread a task.
 */
import type { MessagePort } from 'node:worker_threads';
import type { HttpEnvOptions } from '../env/http-env.ts';
import type { EnvParams } from '../env/types.ts';
import type { RouterOptions } from '../llm/router.ts';
import type { ServerKind } from '../llm/servers.ts';
import type { AgentSettings } from '../worker/episode-context.ts';
import type { RolloutGroup } from '../domain/rollout.ts';

export const PROTOCOL_VERSION = 2;

/** `timeoutMs`: `tasks[].env.timeoutMs`, the bound on every environment and hook call. */
export type WorkerEnvSettings =
  | {
      kind: 'module';
      moduleUrl: string;
      exportName: string;
      params: EnvParams;
      poolSize: number | null;
      timeoutMs: number;
    }
  | { kind: 'http'; http: HttpEnvOptions; poolSize: number | null; timeoutMs: number };

/** Per-task settings a worker needs; sent once as workerData. */
export interface WorkerTaskSettings {
  /** Null only for a black-box agent whose prompts come from the dataset. */
  env: WorkerEnvSettings | null;
  hooks: { moduleUrl: string; exportName: string } | null;
  /** A black-box agent module (worker/blackbox-loop.ts) instead of the built-in agent loop. */
  blackbox: { moduleUrl: string; exportName: string } | null;
  agent: AgentSettings;
}

/** Coordinator → every worker, once at start (piscina's workerData), built by `workerInit()` in coordinator/worker-pool.ts. */
export interface WorkerInit {
  v: typeof PROTOCOL_VERSION;
  /** The pause broadcast (protocol/control-block.ts), shared with the coordinator. */
  control: SharedArrayBuffer;
  /** Which rollout is inside its environment, per worker (protocol/env-watch.ts); null = not watched. */
  envWatch: SharedArrayBuffer | null;
  llm: RouterOptions & { startupJitterMs: number };
  tasks: Record<string, WorkerTaskSettings>;
  /** The token-trace gateway black-box agents talk to; null when no task has one. */
  gatewayUrl: string | null;
  /** Where step records go (one JSONL file per worker); null = not recorded. */
  recordsDir: string | null;
  /** Episodes a worker starts at once at most: the size of its first wave (start-up jitter). */
  firstWave: number;
  /** Episodes this worker runs at once (`workers.rolloutsPerWorker`); null = every rollout of its groups. */
  rolloutsPerWorker: number | null;
  logLevel: string;
  /** Readable log lines (the main thread's stderr is a terminal) instead of JSON. */
  prettyLogs: boolean;
}

/** Coordinator → worker: run every rollout of one group. */
export interface RunGroupMessage {
  v: typeof PROTOCOL_VERSION;
  type: 'run-group';
  group: RolloutGroup;
  /** Weight version the coordinator believes the inference servers hold. */
  modelStep: number;
  /** Wall clock (ms since epoch) when the coordinator handed the group to the pool: gives queue time. */
  enqueuedAt: number;
  /**
   * The pool's number for this run of the group (protocol/env-watch.ts): what a worker writes while
   * one of its rollouts is inside its environment. Absent or 0: not watched.
   */
  dispatch?: number;
}

/** Worker → coordinator: the group with every rollout in a final status. */
export interface GroupResultMessage {
  v: typeof PROTOCOL_VERSION;
  type: 'group-result';
  /** Each rollout without the leading turns counted in `keptTurns` (see protocol/result-delta.ts). */
  group: RolloutGroup;
  /** Per rollout: leading turns of the dispatched rollout left out because they are unchanged. */
  keptTurns: number[];
  workerId: number;
}

export type WireMessage = RunGroupMessage | GroupResultMessage;
export type WireMessageType = WireMessage['type'];
export const WIRE_MESSAGE_TYPES: readonly WireMessageType[] = ['run-group', 'group-result'];

/**
 * What a piscina task carries: the encoded run-group message in a box, so that the worker can drop
 * the bytes once decoded (piscina holds the task object until the task settles, for as long as the
 * group plays).
 */
export interface TaskBox {
  bytes: Uint8Array | null;
}

/** One dataset line for the start-up check: its line number in the file, and its reset params. */
export interface PromptLine {
  line: number;
  params: EnvParams;
}

/** Coordinator → worker (piscina's `name: 'checkTask'`): check one task before production starts. */
export interface CheckTaskRequest {
  task: string;
  prompts: PromptLine[];
}

/** What the start-up check found for one task (WorkerRuntime.checkTask). */
export interface TaskCheck {
  /** The first problem, one line: a module that does not load or construct (`line` null), or a dataset line its environment refuses. */
  problem: { line: number | null; message: string } | null;
  /** The environment checks reset params (`checkResetParams`): worth sending it the rest of the dataset. */
  checksPrompts: boolean;
}

/**
 * The piscina tasks a worker entry exports, by name (`default` runs groups): both ends are typed by it,
 * so a call the worker does not answer, or answers with another shape, does not compile.
 */
export interface WorkerTasks {
  default(box: TaskBox): Promise<Uint8Array>;
  checkTask(request: CheckTaskRequest): Promise<TaskCheck>;
}

/** Worker → pool, once at start-up (structured clone: it carries a port, so it is not msgpack). */
export interface WorkerRegistration {
  type: 'rollout-engine:register-control';
  workerId: number;
  port: MessagePort;
}

export function isWorkerRegistration(value: unknown): value is WorkerRegistration {
  return (
    typeof value === 'object' &&
    value !== null &&
    (value as { type?: unknown }).type === 'rollout-engine:register-control'
  );
}

/** Live counters of one worker thread. */
export interface WorkerStats {
  workerId: number;
  /** The thread's id in the operating system (Linux tid: `top -H`, /proc/<pid>/task/<tid>); null elsewhere. */
  osThreadId: number | null;
  inFlightGroups: number;
  /** Rollouts of the groups the worker holds, whatever their state. */
  inFlightRollouts: number;
  /** Episodes being played (holding an episode slot); ≤ workers.rolloutsPerWorker. */
  episodesRunning: number;
  groupsDone: number;
  rolloutsDone: number;
  steps: number;
  /** Replies whose weight version is none the trainer announced: a server not serving the weights it was said to load. */
  weightVersionMismatches: number;
  /** Episodes that ended in each status since start. */
  rolloutsByStatus: Record<string, number>;
  heapUsedBytes: number;
  /** Event-loop delay of the worker since the previous stats() call: a busy or blocked loop shows here. */
  eventLoopDelayP99Ms: number;
  eventLoopDelayMeanMs: number;
}

/** The API each worker exposes on its control port. */
export interface WorkerControl {
  stats(): WorkerStats;
  /** Write buffered step records to disk. */
  flush(): Promise<void>;
  /** Flush and release everything (actors deleted, connections closed) before the thread ends. */
  close(): Promise<void>;
  /**
   * The default policy's inference endpoints are now `update.urls` (`llm.url` changed at run time,
   * the control API's `POST /endpoints`); `servers`: what was probed of each new one.
   */
  setEndpoints(update: EndpointUpdate): void;
}

/** Coordinator → every worker: the inference endpoints now, with what was probed of each. */
export interface EndpointUpdate {
  urls: string[];
  servers: Record<string, { kind: ServerKind; contextLength: number | null }>;
}

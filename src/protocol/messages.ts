/**
 * Every message that crosses between the coordinator (main thread) and the worker threads.
 *
 * Two channels:
 * - task / result bytes through the pool: `WireMessage`, msgpack-encoded by ./codec.ts and carried in
 *   transferred ArrayBuffers (never structured-cloned rollout states);
 * - a per-worker control port (comlink over a MessagePort) for stats and live configuration:
 *   `WorkerControl`, registered by the worker with a `WorkerRegistration` message.
 *
 * `v` is bumped whenever a wire shape changes, so a stale worker file cannot silently misread a task.
 */
import type { MessagePort } from 'node:worker_threads';
import type { RolloutGroup } from './rollout.ts';

export const PROTOCOL_VERSION = 2;

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
}

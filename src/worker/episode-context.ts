/**
 * What an episode of the agent loop is given (EpisodeContext): the task's settings, its environment
 * actors, the inference client, the pause view and the worker's callbacks. A worker makes one per task
 * (worker/worker-runtime.ts) and every episode of the task shares it.
 */
import type { CancelSignal } from '../cancel.ts';
import type { ChatResult, HistoryRewrite } from '../llm/reply.ts';
import type { ChatRequest } from '../llm/request.ts';
import type { SamplingSettings } from '../llm/token-wire.ts';
import type { Route } from '../llm/router.ts';
import type { Environment } from '../env/types.ts';
import type { McpServers } from '../env/mcp.ts';
import type { EnvCall } from '../protocol/env-watch.ts';
import type { PriorityMode } from '../llm/priority.ts';
import type { ChatMessage, RolloutState, Status, TurnRecord } from '../domain/rollout.ts';
import type { ToolSettings } from './tools.ts';

/** Tool settings of a task that has no `tools` section: what config.ts defaults them to. */
export const DEFAULT_TOOL_SETTINGS: ToolSettings = {
  maxCallsPerTurn: 16,
  timeoutMs: 30_000,
  toolChoice: 'auto',
  mcp: [],
  mcpSessions: 'worker',
};

export interface AgentSettings {
  maxSteps: number;
  messageCut: number;
  maxTokens: number;
  temperature: number;
  /** The task's truncation and penalties (`tasks[].topP`, …); absent ones go at the server's neutral values. */
  sampling?: SamplingSettings;
  /** Continue ABORTED rollouts where they stopped instead of restarting them. */
  partialRollout: boolean;
  /** Episodes that failed by infrastructure run again in their slot this many times (`tasks[].infraRetries`). */
  infraRetries?: number;
  /** Send a per-rollout, per-turn `seed` with every inference call. */
  sendSeed: boolean;
  /** `tasks[].tools`: absent for a task without the section (the environment's own tools still run, with the defaults). */
  tools?: ToolSettings;
  /** `llm.priority`: `trajectory` gives each call an urgency from its trajectory (llm/priority.ts); default off. */
  priority?: PriorityMode;
}

export interface ChatClient {
  chat(request: ChatRequest, signal: CancelSignal | undefined, route: Route): Promise<ChatResult>;
  /** The episode is over: its session no longer needs to stay on one endpoint. */
  endSession?(session: string): void;
}

/** What the agent loop needs to know about pauses (worker/pause-gate.ts in a worker). */
export interface PauseView {
  readonly paused: boolean;
  readonly modelStep: number;
  /** A rollout holding a response token of an older model step has expired (NO_EXPIRY: none has). */
  readonly oldestUsefulStep: number;
  readonly signal: AbortSignal;
  /** `signal`, also aborted once a rollout holding tokens of `oldestStep` expires (worker/pause-gate.ts). */
  signalFor(oldestStep: number): CancelSignal;
  /** The model step a reply's weight version names; −1 for a version the trainer did not announce (worker/pause-gate.ts). */
  stepOfVersion(version: string | null): number;
}

/** Environment actors for one task: a fresh one per episode, handed back when the episode ends. */
export interface ActorSource {
  /** Null when no actor will come (the pool was closed or its episode budget is spent). */
  acquire(signal?: AbortSignal): Promise<Environment | null>;
  /** `failed`: the actor misbehaved and is recycled, not reused. */
  done(env: Environment, failed: boolean): Promise<void>;
}

/** User hooks (`tasks[].hooks`): a hook that throws is logged and the episode goes on. */
export interface EpisodeHooks {
  /** May return rewritten messages for this inference call (before trimming). */
  beforeInference?(ctx: {
    rolloutId: string;
    taskName: string;
    step: number;
    agentId: string | null;
    messages: ChatMessage[];
  }): ChatMessage[] | undefined | Promise<ChatMessage[] | undefined>;
  onEpisodeEnd?(ctx: {
    rolloutId: string;
    taskName: string;
    status: Status;
    totalReward: number;
    lastInfo: Record<string, unknown> | null;
    steps: number;
  }): void | Promise<void>;
}

/**
 * Runs one call into the task's user code for `rollout` (worker/env-guard.ts: time bound, cancel,
 * blame on a worker's death). Absent: calls run unguarded.
 */
export interface EnvCallGuard {
  call<T>(rollout: RolloutState, call: EnvCall, run: () => T | Promise<T>): T | Promise<T>;
}

export interface EpisodeContext {
  actors: ActorSource;
  guard?: EnvCallGuard;
  llm: ChatClient;
  settings: AgentSettings;
  gate: PauseView;
  workerId: number;
  hooks?: EpisodeHooks | null;
  /** Milliseconds to wait before the episode's first inference call (start-up jitter), or 0. */
  startDelayMs?: () => number;
  /** Called once per environment step, for worker counters. */
  onStep?: () => void;
  /** Called with every recorded turn once the environment has stepped on it (or it ended the episode). */
  onTurn?: (rollout: RolloutState, turns: TurnRecord[], info: Record<string, unknown> | null) => void;
  /** Called when an episode ends, whatever its status. */
  onEpisodeEnd?: (rollout: RolloutState) => void;
  /** Called when an episode ends badly or a continuation has to restart, for logs. */
  onProblem?: (rollout: RolloutState, reason: string) => void;
  /**
   * The task's MCP servers for one episode (env/mcp.ts): the worker's shared connections, or a set of
   * the episode's own (`tasks[].tools.mcpSessions`), handed back with `release` when it ends.
   */
  mcp?: { acquire(): McpServers; release(servers: McpServers): Promise<void> };
  /**
   * A reply's weight version is not the weights the engine served when the call went out (`expected`):
   * none the trainer announced, or older ones — the server is not serving the weights the trainer said
   * it loaded. Its tokens are tagged with `tagged` (the older step, or the current one for a version
   * nobody named).
   */
  onVersionMismatch?: (version: string, expected: number, tagged: number) => void;
  /**
   * `api: tokens`: the chat template re-rendered `turn`'s history otherwise than it was sampled
   * (ChatResult.historyRewrite), and what was done about it; for the once-per-task warning.
   */
  onHistoryRewrite?: (rollout: RolloutState, turn: TurnRecord, rewrite: HistoryRewrite) => void;
}

/** One episode being played: its rollout, what it was given, and the environment actor it plays on. */
export interface Episode {
  rollout: RolloutState;
  ctx: EpisodeContext;
  env: Environment;
  /** The `info` of the environment's last step, for the onEpisodeEnd hook. */
  lastInfo: Record<string, unknown> | null;
  /** Until its first inference call, which waits out the start-up jitter (EpisodeContext.startDelayMs). */
  firstCall: boolean;
  /** The episode's MCP servers, taken on its first step with tools; null until then. */
  mcp: McpServers | null;
}

/**
 * Rollout states and groups: the data the engine produces (docs/ARCHITECTURE.md, "Statuses").
 *
 * Token ids, logprobs and per-token model steps are typed arrays so they cross threads as raw bytes
 * (msgpackr `moreTypes`) instead of number lists.
 */
import type { FailureKind } from './failure.ts';
import type { RoutedExperts, SamplingMask, SequenceRouting } from './routing.ts';
import { isDeepStrictEqual } from 'node:util';

export const Status = {
  INIT: 'INIT',
  COMPLETED: 'COMPLETED',
  ABORTED: 'ABORTED',
  EXPIRED: 'EXPIRED',
  FAILED: 'FAILED',
  FILTERED: 'FILTERED',
} as const;
export type Status = (typeof Status)[keyof typeof Status];

/** Priority for a group's status when not every member is COMPLETED (docs/ARCHITECTURE.md, "Statuses"). */
const GROUP_STATUS_PRIORITY: readonly Status[] = [Status.FAILED, Status.ABORTED, Status.EXPIRED, Status.FILTERED];

export type Role = 'system' | 'user' | 'assistant' | 'tool';

export interface ChatMessage {
  role: Role;
  content: string;
  name?: string;
  /** An assistant message that called tools (OpenAI shape): its calls, answered by the `tool` messages after it. */
  tool_calls?: ToolCallMessage[];
  /** A `tool` message: the id of the call it answers. */
  tool_call_id?: string;
}

/** One tool call as an OpenAI assistant message carries it: `arguments` is JSON text, as the model wrote it. */
export interface ToolCallMessage {
  id: string;
  type: 'function';
  function: { name: string; arguments: string };
}

/**
 * Why a tool call did not run or failed; the model is shown the reason as the call's result:
 * `unparsed` (tokens mode: a `<tool_call>` block that is not JSON), `bad_arguments` (not a JSON
 * object), `unknown_tool`, `tool_error` (it threw, or an MCP server answered isError or died),
 * `timeout` (`tasks[].tools.timeoutMs`), `limit` (over `tasks[].tools.maxCallsPerTurn`).
 */
export type ToolErrorKind = 'unparsed' | 'bad_arguments' | 'unknown_tool' | 'tool_error' | 'timeout' | 'limit';

/** One tool call of a turn's reply and what came of it (worker/tools.ts). */
export interface ToolCallRecord {
  /** The server's id (chat), or one the engine gave it (tokens mode: the text carries none). */
  id: string;
  name: string;
  /** JSON text as the model wrote it (the raw block when it did not parse). */
  arguments: string;
  /** The text the model is shown as the `tool` message answering this call. */
  result: string;
  error: ToolErrorKind | null;
  /** Where the call went: the environment, an MCP server (its label), or nowhere (null: it never ran). */
  source: string | null;
  /** Wall time of the call, from its start to its result (0 when it never ran). */
  ms: number;
}

/**
 * Two messages say the same thing: the same object (turns of a rollout share them), or deeply equal
 * (a copy, as a checkpoint restores them) — every own field, a missing one differing from `undefined`.
 */
export function sameMessage(a: ChatMessage, b: ChatMessage): boolean {
  return a === b || isDeepStrictEqual(a, b);
}

/** How many leading messages two conversations share (usually the very objects: turns of a rollout share them). */
export function sharedMessageCount(a: readonly ChatMessage[], b: readonly ChatMessage[]): number {
  const n = Math.min(a.length, b.length);
  let k = 0;
  while (k < n && sameMessage(a[k], b[k])) k++;
  return k;
}

/** `ids` begins with `a` then `b`, token for token: a prompt that extends the sequence `a ++ b`. */
export function extendsSequence(ids: ArrayLike<number>, a: ArrayLike<number>, b: ArrayLike<number>): boolean {
  if (ids.length < a.length + b.length) return false;
  for (let i = 0; i < a.length; i++) if (ids[i] !== a[i]) return false;
  for (let i = 0; i < b.length; i++) if (ids[a.length + i] !== b[i]) return false;
  return true;
}

/** `ids` begins with `prefix`, token for token (a view of it, or a copy: compared as bytes). */
export function idsStartWith(ids: Int32Array, prefix: Int32Array): boolean {
  if (prefix.length > ids.length) return false;
  if (prefix.buffer === ids.buffer && prefix.byteOffset === ids.byteOffset) return true;
  return Buffer.from(ids.buffer, ids.byteOffset, prefix.byteLength).equals(
    Buffer.from(prefix.buffer, prefix.byteOffset, prefix.byteLength),
  );
}

/** Why the inference server stopped generating; anything else it sends is kept as-is and fails the rollout. */
export type FinishReason = 'stop' | 'length' | 'tool_calls' | 'abort' | (string & {});

/** One drawn prompt: what an environment is reset with. Shared by every rollout of a group. */
export interface PromptSample {
  taskName: string;
  /** Position in the task's prompt source (dataset line, or generator index). */
  promptIndex: number;
  /** Cumulative draw counter of the task's sampler: stable across epochs and restarts. */
  drawIndex: number;
  seed: number;
  envParams: Record<string, unknown>;
}

export interface TurnTimings {
  inferenceMs: number;
  envMs: number;
  totalMs: number;
  /** Wall time of the reply's tool calls (run concurrently: the span of them all); absent without calls. */
  toolMs?: number;
}

/** One agent turn: what was sent, what came back, and what the environment made of it. */
export interface TurnRecord {
  /** 1-based step index within the episode. */
  step: number;
  /** Agent id in a multi-agent environment (one turn per agent per step); null for a single agent. */
  agentId: string | null;
  /** Messages sent to the inference server, after `messageCut` trimming. */
  messages: ChatMessage[];
  response: string;
  finishReason: FinishReason;
  /** Null when the server does not return token ids / logprobs. */
  promptIds: Int32Array | null;
  responseIds: Int32Array | null;
  logprobs: Float32Array | null;
  /**
   * Model step (weight version) that generated each response token; same length as responseIds.
   * Workers leave it null while every token has the turn's `modelStep` (a turn not continued across
   * a weight update): an episode in flight does not hold 4 bytes a token of one repeated number, and
   * the wire does not carry them. The pool fills it in as a group arrives (`fillModelSteps`), so
   * everything on the main thread sees it whenever there are response ids.
   */
  modelSteps: Int32Array | null;
  /**
   * Per response token, 1 where it was sampled on a KV cache computed with earlier weights than its
   * own model step — a generation kept across an in-place weight update (worker/token-steps.ts): no
   * single set of weights gives its logprob. Absent when no token was.
   */
  staleKv?: Uint8Array;
  /**
   * The response came from more than one set of weights and the server did not say which token came
   * from which (a whole reply kept across an in-place update): `modelSteps` then hold the oldest step
   * for every token. Absent otherwise.
   */
  spansVersions?: true;
  /**
   * `api: tokens`: the chat template re-rendered this turn's history differently from what was
   * sampled (docs/TEMPLATES.md). `kept`: the prompt still extends the previous turn's prompt + response
   * ids; `split`: the prompt is the re-rendered history and begins a new training segment (the turn
   * before it, of the same agent, is then trainable: it ends the previous segment). Absent otherwise.
   */
  historyRewrite?: 'kept' | 'split';
  /** Sampling seed sent with the request (null when `llm.sendSeed` is off); a continuation reuses it. */
  seed: number | null;
  /** Weight version the turn was generated with (the server's report, else the engine's model step). */
  modelStep: number;
  reward: number;
  terminated: boolean;
  truncated: boolean;
  /** Whether the turn should be trained on (reference Interactor semantics, see worker/env-step.ts). */
  trainable: boolean;
  /**
   * The tool calls this reply made, in its order, each with its result (set only on a reply that
   * called tools). The results are not in this turn's tokens: they are in the next turn's prompt
   * (`promptIds`), so the loss (response tokens only) never covers a tool result.
   */
  toolCalls?: ToolCallRecord[];
  /**
   * Set when the batch is taken with a token-level staleness threshold: 1 = the token counts in the
   * loss, 0 = too stale. Absent otherwise (every token counts).
   */
  lossMask?: Uint8Array;
  /**
   * Experts each position of `promptIds ++ responseIds` was routed to, from `start` on (`llm.routedExperts`;
   * domain/routing.ts): the rows this turn adds to its sequence — a turn whose prompt extends the
   * previous turn's holds only the rows after that turn's. Absent when not asked or not sent.
   */
  routedExperts?: RoutedExperts;
  /** Each response token's sampling support (`llm.samplingMasks`), aligned with responseIds. */
  samplingMask?: SamplingMask;
  timings: TurnTimings;
}

export interface RolloutTimings {
  /** From the coordinator handing the group to the pool to a worker starting it. */
  queueMs: number;
  inferenceMs: number;
  envMs: number;
  totalMs: number;
  /** Time spent interrupted by weight updates (back on the main thread, waiting to continue). */
  pausedMs: number;
  /** Time in tool calls (their spans joined per turn: parallel calls count once); absent without tools. */
  toolMs?: number;
  /** Wall clock (ms since epoch) when the episode started / ended in the worker. */
  startedAt: number;
  finishedAt: number;
}

/** One episode of one agent for one prompt. */
export interface RolloutState {
  id: string;
  groupId: string;
  /** Position within the group, 0..k-1. */
  index: number;
  taskName: string;
  sample: PromptSample;
  status: Status;
  /** The last conversation seen: the environment's last prompt plus the final response. */
  messages: ChatMessage[];
  turns: TurnRecord[];
  /** Sum of step rewards (over every agent in a multi-agent environment). */
  reward: number;
  /** Multi-agent: the sum of each agent's rewards; null for a single agent. */
  agentRewards: Record<string, number> | null;
  /** Times the rollout was reset to its prompt (expiry, restart after a pause): names its step-record session. */
  attempt: number;
  terminated: boolean;
  truncated: boolean;
  /** Finish reason of the last inference call. */
  finishReason: FinishReason | null;
  /** Why the rollout FAILED (or was ABORTED), with an error code where there is one. */
  error: string | null;
  /** What kind of failure (domain/failure.ts), set with FAILED. */
  failureKind?: FailureKind;
  /**
   * Episodes of this rollout that failed by infrastructure and went on in its slot: the step each
   * failure cut short is not in it, it was played again (absent: none).
   */
  maskedFailures?: number;
  /**
   * Response tokens the worker threw away to generate them again: each run from the prompt adds what
   * the rollout held then, each step played again whole what that step held (absent: none).
   * Cumulative, as `maskedFailures`: one dispatch's share is the landed value less the dispatched one.
   */
  restartedTokens?: number;
  /** Tool calls the model made in the turns kept, and how many of them failed (any ToolErrorKind); absent without tools. */
  tools?: { calls: number; errors: number };
  timings: RolloutTimings;
  /** Worker thread that ran the episode. */
  workerId: number | null;
  /**
   * Black-box agents (their own OpenAI client, through the token-trace gateway): the session as one
   * training sample — observation tokens, the exact completion spans, logprobs aligned to them.
   */
  stitched?: StitchedSession;
}

export interface StitchedSession {
  /** Last prompt + last completion: every token the model saw or produced, in order. */
  observationTokens: Int32Array;
  /** `[start, end)` of each call's completion inside observationTokens, in call order. */
  actionRanges: [number, number][];
  /** Logprob of each observation token (0 outside the action ranges). */
  rolloutLogprobs: Float32Array;
  /** Model step of each observation token (−1 outside the action ranges). */
  modelSteps: Int32Array;
  /** The last call stopped on its token budget (finish reason `length`). */
  truncated: boolean;
  /**
   * Experts each observation position was routed to (`llm.routedExperts`; domain/routing.ts): one row
   * per position of observationTokens, `fill` where the server reported none (the last token, never
   * forwarded). Absent when not asked or never sent.
   */
  routedExperts?: SequenceRouting;
  /**
   * Each observation token's sampling support (`llm.samplingMasks`): the sampled tokens' where the
   * server sent one, empty elsewhere (prompt tokens, calls without truncation). Absent when none.
   */
  samplingMask?: SamplingMask;
  /**
   * The session's side calls (calls that did not extend its conversation: a summariser, a judge, a
   * retry with an edited history), each a sample of its own beside this one, in call order. Absent in
   * samples stitched before side calls were recorded.
   */
  sideCalls?: SideCall[];
}

/** One side call of a black-box session: its own prompt, not a prefix of the session's observation. */
export interface SideCall {
  /** Position of the call among all the session's calls (main and side), 0-based. */
  index: number;
  promptIds: Int32Array;
  completionIds: Int32Array;
  /** Logprob of each completion token under the policy that sampled it. */
  logprobs: Float32Array;
  finishReason: FinishReason;
  /** Weight version that generated the completion. */
  modelStep: number;
  /** Experts each position of `promptIds ++ completionIds` was routed to, as the server reported them (from 0). */
  routedExperts?: RoutedExperts;
  /** Each completion token's sampling support, aligned with completionIds. */
  samplingMask?: SamplingMask;
}

/**
 * What a group's tokens were sampled with, for the trainer: the temperature, and each truncating or
 * penalising setting the task set (`tasks[].topP`, …). A setting absent here was sent at the server's
 * neutral value: the distribution sampled from is the model's whole one at the temperature.
 */
export interface SamplingShape {
  temperature: number;
  topP?: number;
  topK?: number;
  minP?: number;
  repetitionPenalty?: number;
  presencePenalty?: number;
  frequencyPenalty?: number;
}

export interface SamplingRecord extends SamplingShape {
  /** Agents whose policy (`llm.policies`) samples otherwise, each with its settings whole; absent when none does. */
  agents?: Record<string, SamplingShape>;
}

/** The k rollouts of one prompt: the unit the producer schedules and the buffer stores. */
export interface RolloutGroup {
  id: string;
  taskName: string;
  sample: PromptSample;
  status: Status;
  rollouts: RolloutState[];
  /** Group-level failure (the worker running it threw or died); rollouts carry their own errors. */
  error: string | null;
  /**
   * What its turns were sampled with, once per group rather than per turn or token (every turn of a
   * task samples alike). Absent for a black-box agent's group, whose agent sets its own sampling.
   */
  sampling?: SamplingRecord;
}

export function groupStatus(rollouts: readonly RolloutState[]): Status {
  if (rollouts.length > 0 && rollouts.every((r) => r.status === Status.COMPLETED)) return Status.COMPLETED;
  for (const status of GROUP_STATUS_PRIORITY) {
    if (rollouts.some((r) => r.status === status)) return status;
  }
  return Status.INIT;
}

/**
 * stop / length / tool_calls complete a rollout; abort interrupts it; anything else is a failure.
 * Compared case-insensitively, as every reader of a reply does: a server answering "STOP" stopped.
 */
export function statusForFinishReason(reason: FinishReason): Status {
  switch (reason.toLowerCase()) {
    case 'stop':
    case 'length':
    case 'tool_calls':
      return Status.COMPLETED;
    case 'abort':
      return Status.ABORTED;
    default:
      return Status.FAILED;
  }
}

export function emptyTimings(): RolloutTimings {
  return { queueMs: 0, inferenceMs: 0, envMs: 0, totalMs: 0, pausedMs: 0, startedAt: 0, finishedAt: 0 };
}

/** A fresh INIT group of `size` rollouts for one drawn prompt. Ids are stable: `{task}/{drawIndex}[/{i}]`. */
export function newGroup(sample: PromptSample, size: number, sampling?: SamplingRecord): RolloutGroup {
  const id = `${sample.taskName}/${sample.drawIndex}`;
  const rollouts: RolloutState[] = [];
  for (let index = 0; index < size; index++) {
    rollouts.push({
      id: `${id}/${index}`,
      groupId: id,
      index,
      taskName: sample.taskName,
      sample,
      status: Status.INIT,
      messages: [],
      turns: [],
      reward: 0,
      agentRewards: null,
      attempt: 0,
      terminated: false,
      truncated: false,
      finishReason: null,
      error: null,
      timings: emptyTimings(),
      workerId: null,
    });
  }
  return {
    id,
    taskName: sample.taskName,
    sample,
    status: Status.INIT,
    rollouts,
    error: null,
    ...(sampling !== undefined ? { sampling } : {}),
  };
}

/** Forget a rollout's responses: it will be generated again from its prompt. */
export function resetToPrompt(rollout: RolloutState, status: Status): void {
  if (rollout.turns.length > 0) rollout.attempt++;
  rollout.status = status;
  rollout.messages = [];
  rollout.turns = [];
  rollout.reward = 0;
  rollout.agentRewards = null;
  rollout.terminated = false;
  rollout.truncated = false;
  rollout.finishReason = null;
  rollout.error = null;
  delete rollout.failureKind;
  delete rollout.tools;
}

/**
 * The worker runs `rollout` again from its prompt (interrupted without partialRollout, an
 * infrastructure failure with nothing to keep, a replay that no longer matched): what it held is
 * counted in `restartedTokens` first (`countRestarted`).
 */
export function restartFromPrompt(rollout: RolloutState): void {
  countRestarted(rollout, 0);
  resetToPrompt(rollout, Status.INIT);
}

/** Drops `rollout`'s turns from index `from` on (a step to be played again whole), counted as a restart's. */
export function dropTurnsFrom(rollout: RolloutState, from: number): void {
  countRestarted(rollout, from);
  rollout.turns.splice(from);
}

/**
 * Adds the response tokens of `rollout`'s turns from `from` on to `restartedTokens`, before the worker
 * throws them away to generate them again: a restart inside one dispatch leaves no other trace in the
 * group that lands, and the producer reports this count thrown away (`restartedInDispatch`).
 */
function countRestarted(rollout: RolloutState, from: number): void {
  let held = 0;
  for (let i = from; i < rollout.turns.length; i++) held += rollout.turns[i].responseIds?.length ?? 0;
  if (held > 0) rollout.restartedTokens = (rollout.restartedTokens ?? 0) + held;
}

/** Ends `rollout` FAILED with `reason`, of `kind`. */
export function failRollout(rollout: RolloutState, reason: string, kind: FailureKind): void {
  rollout.status = Status.FAILED;
  rollout.error = reason;
  rollout.failureKind = kind;
}

/**
 * Oldest model step among a turn's response tokens: the per-token array when the server gave ids,
 * else the turn's own model step when it produced any text. Null for a turn with no response.
 */
export function turnMinModelStep(turn: TurnRecord): number | null {
  const steps = turn.modelSteps;
  if (steps !== null && steps.length > 0) {
    let min = steps[0];
    for (let i = 1; i < steps.length; i++) if (steps[i] < min) min = steps[i];
    return min;
  }
  return turn.response.length > 0 ? turn.modelStep : null;
}

export function rolloutMinModelStep(rollout: RolloutState): number | null {
  let min: number | null = null;
  for (const turn of rollout.turns) {
    const m = turnMinModelStep(turn);
    if (m !== null && (min === null || m < min)) min = m;
  }
  return min;
}

/** Total response tokens of a rollout (0 when the server returned no ids). */
export function responseTokenCount(rollout: RolloutState): number {
  let n = 0;
  for (const turn of rollout.turns) n += turn.responseIds?.length ?? 0;
  return n;
}

/** Turns of a rollout whose re-rendered history diverged (TurnRecord.historyRewrite), and those that began a new segment. */
export function historyRewriteCounts(rollout: RolloutState): { rewrites: number; splits: number } {
  let rewrites = 0;
  let splits = 0;
  for (const turn of rollout.turns) {
    if (turn.historyRewrite === undefined) continue;
    rewrites++;
    if (turn.historyRewrite === 'split') splits++;
  }
  return { rewrites, splits };
}

/** Response tokens of a rollout no single set of weights reproduces (TurnRecord.staleKv, spansVersions). */
export function inexactTokenCount(rollout: RolloutState): number {
  let n = 0;
  for (const turn of rollout.turns) {
    if (turn.spansVersions === true) n += turn.responseIds?.length ?? 0;
    else if (turn.staleKv !== undefined) for (const mark of turn.staleKv) n += mark;
  }
  return n;
}

/**
 * Response tokens generated in one dispatch of a rollout: `sent` as dispatched, `landed` as it came
 * back. A continued partial rollout adds to what it had and a kept COMPLETED sibling adds nothing; what
 * the worker threw away to generate again (`restartedTokens`: a run from the prompt, a step played
 * again), what it was sent with possibly included, was generated too: this dispatch generated what
 * the rollout holds now plus what it threw away, less what it was sent with.
 */
export function dispatchTokenCount(sent: RolloutState | undefined, landed: RolloutState): number {
  const generated = responseTokenCount(landed) + restartedInDispatch(sent, landed);
  return Math.max(0, generated - (sent === undefined ? 0 : responseTokenCount(sent)));
}

/** Response tokens the worker threw away to generate them again during one dispatch. */
export function restartedInDispatch(sent: RolloutState | undefined, landed: RolloutState): number {
  return Math.max(0, (landed.restartedTokens ?? 0) - (sent?.restartedTokens ?? 0));
}

/**
 * Approximate memory a group holds: the buffers under its token arrays, each once (the arrays of a
 * group that crossed threads are views into one block, and a turn's prompt ids may view a later
 * turn's: worker/prompt-prefix.ts), plus its text at two bytes a character and a fixed cost per
 * object. Used for the producer's memory budget, where a cheap estimate that grows with the real
 * thing is what matters.
 */
export function approxGroupBytes(group: RolloutGroup): number {
  let bytes = 256;
  const buffers = new Set<ArrayBufferLike>();
  const count = (array: ArrayBufferView | null | undefined): void => {
    if (array == null || buffers.has(array.buffer)) return;
    buffers.add(array.buffer);
    bytes += array.buffer.byteLength;
  };
  for (const r of group.rollouts) {
    bytes += 512;
    for (const m of r.messages) bytes += 64 + 2 * m.content.length;
    for (const t of r.turns) {
      bytes += 256 + 2 * t.response.length;
      for (const m of t.messages) bytes += 64 + 2 * m.content.length;
      for (const c of t.toolCalls ?? []) bytes += 128 + 2 * (c.arguments.length + c.result.length);
      count(t.promptIds);
      count(t.responseIds);
      count(t.logprobs);
      count(t.modelSteps);
      count(t.lossMask);
      count(t.staleKv);
      count(t.routedExperts?.ids);
      count(t.samplingMask?.ids);
      count(t.samplingMask?.offsets);
    }
    // A stitched session's routing is as large as its turns' would be (layers × topK bytes a token).
    const s = r.stitched;
    count(s?.routedExperts?.ids);
    count(s?.samplingMask?.ids);
    count(s?.samplingMask?.offsets);
    for (const c of s?.sideCalls ?? []) {
      count(c.routedExperts?.ids);
      count(c.samplingMask?.ids);
    }
  }
  return bytes;
}

/** A turn's per-token model steps, made from its `modelStep` when a worker left them implicit. */
export function modelStepsOf(turn: TurnRecord): Int32Array | null {
  if (turn.modelSteps !== null || turn.responseIds === null) return turn.modelSteps;
  return new Int32Array(turn.responseIds.length).fill(turn.modelStep);
}

/** Fill in the model steps workers leave implicit (see TurnRecord.modelSteps), in place. */
export function fillModelSteps(group: RolloutGroup): RolloutGroup {
  for (const rollout of group.rollouts) for (const turn of rollout.turns) turn.modelSteps = modelStepsOf(turn);
  return group;
}

/** Why a group went wrong: its own error, else its first member's; null when none has one. */
export function groupError(group: RolloutGroup): string | null {
  return group.error ?? group.rollouts.find((r) => r.error !== null)?.error ?? null;
}

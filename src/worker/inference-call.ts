/**
 * One turn's inference call: the request for one agent's prompt at one step (sampling, seed, a
 * partial turn to continue, the previous turn a token-in call extends, tools, urgency), and the
 * turn it becomes: the reply's token ids and logprobs, each token tagged with the model step that
 * sampled it, its routing rows placed on the sequence they belong to.
 */
import type { ChatResult } from '../llm/reply.ts';
import type { ParsedToolCall } from '../llm/tool-calls.ts';
import { TaskPace, trajectoryUrgency } from '../llm/priority.ts';
import { rolloutMinModelStep, type ChatMessage, type RolloutState, type TurnRecord } from '../domain/rollout.ts';
import { replyStep } from '../domain/weight-versions.ts';
import { NO_EXPIRY } from '../protocol/control-block.ts';
import { mergeContinuation } from './continuation.ts';
import { DEFAULT_TOOL_SETTINGS, type EpisodeContext } from './episode-context.ts';
import { alignTurnRouting, continuationRouting, routedEnd } from './routing.ts';
import { tokenSteps } from './token-steps.ts';
import type { StepTools } from './tools.ts';

/** One agent's call at one step: what it is sent, and what the turn it becomes records. */
export interface TurnCall {
  rollout: RolloutState;
  step: number;
  /** Null for a single-agent environment. */
  agentId: string | null;
  /** The messages sent (trimmed to `messageCut`): what the turn records as its prompt. */
  prompt: ChatMessage[];
  /** The partial last turn this call continues after a pause (single agent only); null for a new turn. */
  partial: TurnRecord | null;
  /** The step's wait for its prompt from the environment: the turn's `envMs`. */
  promptMs: number;
  /** performance.now() when the turn began: its `totalMs` runs from here. */
  turnStart: number;
  /** The step's tools (NO_TOOLS for none, and for every multi-agent step). */
  tools: StepTools;
}

/**
 * The calls a reply made, kept beside its turn until they run (the turn records them once they have
 * results: TurnRecord.toolCalls).
 */
export const pendingCalls = new WeakMap<TurnRecord, ParsedToolCall[]>();

/**
 * This worker's running means of turns and time per finished episode, per task (llm/priority.ts):
 * read for each call's urgency, fed as each COMPLETED episode ends (agent-loop.ts).
 */
export const pace = new TaskPace();

/** A call that did not fit the server's context (llm/context.ts): the episode ends truncated, not failed. */
export class ContextExceeded extends Error {}

/**
 * One inference call for one agent (or the single agent), continuing `turn.partial` when given. Not
 * an async function: the call in flight holds a callback instead of one more suspended frame.
 */
export function infer(turn: TurnCall, ctx: EpisodeContext): Promise<TurnRecord> {
  const { settings, gate } = ctx;
  const { rollout, step, agentId, prompt, partial, tools } = turn;
  const already = partial?.responseIds?.length ?? 0;
  const seed = settings.sendSeed ? turnSeed(rollout, step, agentId) : null;
  const t = performance.now();
  // A call kept across an in-place pause began on these weights: its early tokens are theirs.
  const stepAtSend = gate.modelStep;
  const previous = partial === null ? previousTurn(rollout, agentId) : undefined;
  // Where this agent's sequence lacks rows: the partial's end, else the previous turn's (llm/request.ts).
  const routedFrom = routedEnd(partial ?? previous);
  let call: Promise<ChatResult>;
  try {
    call = ctx.llm.chat(
      {
        messages: prompt,
        maxTokens: Math.max(1, settings.maxTokens - already),
        temperature: settings.temperature,
        ...(settings.sampling !== undefined ? { sampling: settings.sampling } : {}),
        ...(seed !== null ? { seed } : {}),
        ...(partial ? { continueFrom: partial.response } : {}),
        ...(partial?.promptIds && partial.responseIds
          ? { continueTokens: { promptIds: partial.promptIds, responseIds: partial.responseIds } }
          : {}),
        ...(previous !== undefined
          ? {
              previous: {
                messages: previous.messages,
                promptIds: previous.promptIds,
                responseIds: previous.responseIds,
              },
            }
          : {}),
        ...(tools.schemas.length > 0
          ? { tools: tools.schemas, toolChoice: (settings.tools ?? DEFAULT_TOOL_SETTINGS).toolChoice }
          : {}),
        ...(routedFrom > 0 ? { routedFrom } : {}),
        ...(settings.priority === 'trajectory' ? { urgency: urgencyOf(rollout, step, ctx) } : {}),
      },
      // Cut when the rollout expires mid-call (its oldest token is this call's first or older); the
      // scan of its turns only where something can expire.
      gate.oldestUsefulStep === NO_EXPIRY
        ? gate.signal
        : gate.signalFor(Math.min(rolloutMinModelStep(rollout) ?? stepAtSend, stepAtSend)),
      agentId === null ? { session: rollout.id } : { session: rollout.id, agent: agentId },
    );
  } catch (err) {
    // As from an async function: a client that throws instead of rejecting fails this call only, and a
    // multi-agent step still waits for its other calls (allOrFirstError).
    return Promise.reject(err);
  }
  return call.then((reply) => {
    if (reply.contextExceeded !== undefined) throw new ContextExceeded(reply.contextExceeded);
    const steps = tokenSteps(reply, stepAtSend, (version) =>
      replyStep(gate.stepOfVersion(version), stepAtSend, gate.modelStep, (expected, tagged) =>
        ctx.onVersionMismatch?.(version!, expected, tagged),
      ),
    );
    const record = turnRecord(turn, reply, {
      modelStep: steps.modelStep,
      seed,
      inferenceMs: performance.now() - t,
      trainable: settings.messageCut > 0,
    });
    record.modelSteps = steps.modelSteps;
    if (steps.staleKv !== null) record.staleKv = steps.staleKv;
    if (steps.spansVersions) record.spansVersions = true;
    if (reply.historyRewrite !== undefined) {
      record.historyRewrite = reply.historyRewrite.mode; // a split ends the segment before it once recorded (segments.ts)
      ctx.onHistoryRewrite?.(rollout, record, reply.historyRewrite);
    }
    // Rows placed on the sequence they belong to, or dropped: never shifted onto other tokens.
    if (partial) {
      continuationRouting(partial, record);
      mergeContinuation(partial, record);
    } else alignTurnRouting(record, previous);
    if (reply.toolCalls !== undefined && reply.toolCalls.length > 0) pendingCalls.set(record, reply.toolCalls);
    return record;
  });
}

/** What a reply was sampled with, beside the call that sent it. */
interface Sampled {
  modelStep: number;
  seed: number | null;
  inferenceMs: number;
  /** With trimming every turn is a self-contained sample (AgentSettings.messageCut > 0). */
  trainable: boolean;
}

function turnRecord(turn: TurnCall, reply: ChatResult, sampled: Sampled): TurnRecord {
  const responseIds = reply.responseIds;
  return {
    step: turn.step,
    agentId: turn.agentId,
    messages: turn.prompt,
    response: reply.content,
    finishReason: reply.finishReason,
    promptIds: reply.promptIds,
    responseIds,
    logprobs: reply.logprobs,
    modelSteps: null, // every token has `modelStep`: implicit until the group reaches the main thread (TurnRecord.modelSteps)
    seed: sampled.seed,
    modelStep: sampled.modelStep,
    reward: 0,
    terminated: false,
    truncated: false,
    trainable: sampled.trainable,
    timings: { inferenceMs: sampled.inferenceMs, envMs: turn.promptMs, totalMs: performance.now() - turn.turnStart },
    ...(reply.routedExperts !== undefined ? { routedExperts: reply.routedExperts } : {}),
    ...(reply.samplingMask !== undefined ? { samplingMask: reply.samplingMask } : {}),
  };
}

/** This agent's last turn in the rollout: a token-in call extends its exact sequence (llm/token-chat.ts). */
function previousTurn(rollout: RolloutState, agentId: string | null): TurnRecord | undefined {
  for (let i = rollout.turns.length - 1; i >= 0; i--) if (rollout.turns[i].agentId === agentId) return rollout.turns[i];
  return undefined;
}

/** The urgency of `rollout`'s call at `step` (llm/priority.ts): its staleness, progress and age. */
function urgencyOf(rollout: RolloutState, step: number, ctx: EpisodeContext): number {
  const { settings, gate } = ctx;
  const oldest = rolloutMinModelStep(rollout);
  const bounded = gate.oldestUsefulStep !== NO_EXPIRY;
  return trajectoryUrgency({
    turnsDone: step - 1,
    maxSteps: settings.maxSteps,
    meanTurns: pace.meanTurns(rollout.taskName),
    ageMs: rollout.timings.startedAt > 0 ? Date.now() - rollout.timings.startedAt : 0,
    meanEpisodeMs: pace.meanEpisodeMs(rollout.taskName),
    staleness: oldest === null ? 0 : Math.max(0, gate.modelStep - oldest),
    // Tokens of model step oldestUsefulStep are the oldest still taken: a fresh one may age this many syncs + 1.
    staleBound: bounded ? Math.max(1, gate.modelStep - gate.oldestUsefulStep + 1) : null,
  });
}

/**
 * A seed per (draw, rollout, step, agent): a continuation samples with the seed of the turn it
 * continues, and a prompt drawn again in a later epoch samples anew — its environment seed is the
 * same (the same task), but with unchanged weights the same sampling seed would give the very same
 * completions (regression: every epoch resent them).
 */
function turnSeed(rollout: RolloutState, step: number, agentId: string | null): number {
  let h =
    Math.imul(rollout.sample.seed ^ 0x9e3779b9, 0x85ebca6b) ^
    Math.imul(rollout.index + 1, 0xc2b2ae35) ^
    Math.imul(step, 0x27d4eb2f);
  h = Math.imul(h ^ rollout.sample.drawIndex, 0x165667b1);
  if (agentId !== null) for (let i = 0; i < agentId.length; i++) h = Math.imul(h ^ agentId.charCodeAt(i), 0x01000193);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  h ^= h >>> 12;
  return h >>> 1;
}

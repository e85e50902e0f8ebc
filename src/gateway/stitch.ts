/**
 * A session's main calls become one training sample: the observation is the last main prompt plus the
 * last main completion, and every main call's completion is an action span inside it. Nothing is
 * re-tokenized: the spans hold the exact ids the policy sampled, with their logprobs and weight
 * versions. Side calls (prompt.ts) do not touch it: each comes out beside it as a sample of its own
 * (`sideCalls`: its prompt ids, completion ids, logprobs, finish reason and model step), in call order.
 *
 * The sample is checked against the traces before it is returned — each call's prompt hash matches
 * the buffer prefix it claims, each action span equals that call's completion ids, spans are ordered
 * and the last one ends the observation — so a bug in the gateway fails loudly instead of training
 * on misaligned logprobs.
 *
 * Routed experts and sampling masks (docs/ROUTING-REPLAY.md), when the calls carry them, are laid on
 * the observation at the positions each call reported them for: a main call's rows are for
 * positions of its own prompt ++ completion, which the observation holds at the same positions, so
 * nothing moves; a position no call reported (the last token, never forwarded) holds the fill. A side
 * call keeps its own, over its own prompt ++ completion.
 */
import type { SideCall, StitchedSession } from '../domain/rollout.ts';
import { maskTokens, masksOver, routedProblem, routingOver, type SamplingMask } from '../domain/routing.ts';
import { maskJson, routedJson } from '../llm/routing-wire.ts';
import { GatewayError } from './errors.ts';
import { EMPTY_HASH, hashIds } from './trace.ts';
import type { CallTrace, SideCallTrace } from './trace.ts';

/** A stitched session (the training sample fields are domain/rollout.ts StitchedSession) with its id and reward. */
export interface StitchedSample extends StitchedSession {
  sessionId: string;
  reward: number | null;
  /** Finish reason of each main call, in order. */
  finishReasons: string[];
  sideCalls: SideCall[];
}

export interface StitchInput {
  sessionId: string;
  /** The main conversation's buffer and calls. */
  tokens: ArrayLike<number>;
  traces: readonly CallTrace[];
  sideCalls?: readonly SideCallTrace[];
}

function broken(sessionId: string, why: string, details: Record<string, unknown>): GatewayError {
  return new GatewayError('ERR_GATEWAY_STITCH', `session ${JSON.stringify(sessionId)}: traces do not stitch: ${why}`, {
    details: { session_id: sessionId, ...details },
  });
}

export function stitchTraces(input: StitchInput, options: { reward?: number | null } = {}): StitchedSample {
  const { sessionId, tokens, traces, sideCalls = [] } = input;
  const reward = options.reward ?? null;
  if (reward !== null && (typeof reward !== 'number' || !Number.isFinite(reward))) {
    throw new GatewayError(
      'ERR_GATEWAY_BAD_REQUEST',
      `reward must be a finite number or null (got ${typeof reward === 'number' ? String(reward) : JSON.stringify(reward)})`,
      { param: 'reward' },
    );
  }
  if (traces.length === 0) throw broken(sessionId, 'the session has no completed call', { calls: 0 });
  const observation = Int32Array.from(tokens);
  const logprobs = new Float32Array(observation.length);
  const steps = new Int32Array(observation.length).fill(-1);
  const ranges: [number, number][] = [];
  const masks: { at: number; mask: SamplingMask }[] = [];
  let hashedTo = 0;
  let hash = EMPTY_HASH;
  let previousEnd = 0;
  for (const trace of traces) {
    const start = trace.promptLength;
    const end = start + trace.completionIds.length;
    if (start < previousEnd)
      throw broken(
        sessionId,
        `call ${trace.index} starts at token ${start}, inside the previous action which ends at ${previousEnd}`,
        { call: trace.index, start, previous_end: previousEnd },
      );
    if (end > observation.length)
      throw broken(
        sessionId,
        `call ${trace.index} ends at token ${end}, past the ${observation.length} tokens of the session`,
        { call: trace.index, end, tokens: observation.length },
      );
    hash = hashIds(observation, hashedTo, start, hash);
    hashedTo = start;
    if (hash !== trace.promptHash)
      throw broken(sessionId, `call ${trace.index}: the first ${start} tokens are not the prompt that call sent`, {
        call: trace.index,
        prompt_length: start,
      });
    if (trace.logprobs.length !== trace.completionIds.length) {
      throw broken(
        sessionId,
        `call ${trace.index} has ${trace.logprobs.length} logprobs for ${trace.completionIds.length} completion tokens`,
        { call: trace.index },
      );
    }
    for (let j = 0; j < trace.completionIds.length; j++) {
      if (observation[start + j] !== trace.completionIds[j]) {
        throw broken(
          sessionId,
          `call ${trace.index}: token ${start + j} is ${observation[start + j]} but that call generated ${trace.completionIds[j]}`,
          { call: trace.index, position: start + j },
        );
      }
    }
    logprobs.set(trace.logprobs, start);
    steps.fill(trace.modelStep, start, end);
    ranges.push([start, end]);
    previousEnd = end;
    checkRouting(sessionId, trace, start);
    if (trace.samplingMask !== undefined) masks.push({ at: start, mask: trace.samplingMask });
  }
  if (previousEnd !== observation.length) {
    throw broken(
      sessionId,
      `the last action ends at token ${previousEnd} but the session holds ${observation.length} (observation must be last prompt + last completion)`,
      { last_end: previousEnd, tokens: observation.length },
    );
  }
  for (const side of sideCalls) {
    if (side.logprobs.length !== side.completionIds.length) {
      throw broken(
        sessionId,
        `side call ${side.index} has ${side.logprobs.length} logprobs for ${side.completionIds.length} completion tokens`,
        { call: side.index },
      );
    }
    checkRouting(sessionId, side, side.promptIds.length);
  }
  const routed = routingOver(
    observation.length,
    traces.map((t) => t.routedExperts),
  );
  if (typeof routed === 'string') throw broken(sessionId, `routed experts: ${routed}`, {});
  const mask = masksOver(observation.length, masks);
  const last = traces[traces.length - 1];
  return {
    sessionId,
    observationTokens: observation,
    actionRanges: ranges,
    rolloutLogprobs: logprobs,
    modelSteps: steps,
    truncated: last.finishReason === 'length',
    ...(routed !== null ? { routedExperts: routed } : {}),
    ...(mask !== null ? { samplingMask: mask } : {}),
    reward,
    finishReasons: traces.map((t) => t.finishReason),
    // Shared with the traces, not copied: the gateway releases a session once stitched, so nothing writes them again.
    sideCalls: sideCalls
      .map(
        (t): SideCall => ({
          index: t.index,
          promptIds: t.promptIds,
          completionIds: t.completionIds,
          logprobs: t.logprobs,
          finishReason: t.finishReason,
          modelStep: t.modelStep,
          ...(t.routedExperts !== undefined ? { routedExperts: t.routedExperts } : {}),
          ...(t.samplingMask !== undefined ? { samplingMask: t.samplingMask } : {}),
        }),
      )
      .sort((a, b) => a.index - b.index),
  };
}

/** A call's rows only for positions its own sequence forwarded, and a mask over exactly its completion. */
function checkRouting(
  sessionId: string,
  call: Pick<CallTrace, 'index' | 'completionIds' | 'routedExperts' | 'samplingMask'>,
  promptLength: number,
): void {
  const r = call.routedExperts;
  const problem = r === undefined ? null : routedProblem(r, promptLength + call.completionIds.length);
  if (problem !== null) throw broken(sessionId, `call ${call.index}: routed experts: ${problem}`, { call: call.index });
  const m = call.samplingMask;
  if (m !== undefined && maskTokens(m) !== call.completionIds.length)
    throw broken(
      sessionId,
      `call ${call.index}: sampling mask covers ${maskTokens(m)} tokens, the completion has ${call.completionIds.length}`,
      { call: call.index },
    );
}

/** The sample as JSON for `POST /v1/sessions/{id}/stitch` (the reference executor's snake_case names). */
export function stitchedSampleJson(sample: StitchedSample): Record<string, unknown> {
  return {
    session_id: sample.sessionId,
    observation_tokens: Array.from(sample.observationTokens),
    action_ranges: sample.actionRanges,
    rollout_log_probs: Array.from(sample.rolloutLogprobs),
    model_steps: Array.from(sample.modelSteps),
    truncated: sample.truncated,
    ...(sample.routedExperts !== undefined ? { routed_experts: routedJson(sample.routedExperts) } : {}),
    ...(sample.samplingMask !== undefined ? { sampling_mask: maskJson(sample.samplingMask) } : {}),
    reward: sample.reward,
    finish_reasons: sample.finishReasons,
    side_calls: sample.sideCalls.map((c) => ({
      index: c.index,
      prompt_token_ids: Array.from(c.promptIds),
      completion_token_ids: Array.from(c.completionIds),
      logprobs: Array.from(c.logprobs),
      finish_reason: c.finishReason,
      model_step: c.modelStep,
      ...(c.routedExperts !== undefined ? { routed_experts: routedJson(c.routedExperts) } : {}),
      ...(c.samplingMask !== undefined ? { sampling_mask: maskJson(c.samplingMask) } : {}),
    })),
  };
}

/** Test builders for turn records. */
import type { TurnRecord } from '../../src/domain/rollout.ts';

/** A finished turn with these prompt ids (null: the server returned none) and nothing else of note. */
export function turnRecord(step: number, promptIds: number[] | null, agentId: string | null = null): TurnRecord {
  return {
    step,
    agentId,
    messages: [],
    response: '',
    finishReason: 'stop',
    promptIds: promptIds === null ? null : Int32Array.from(promptIds),
    responseIds: null,
    logprobs: null,
    modelSteps: null,
    seed: null,
    modelStep: 0,
    reward: 0,
    terminated: false,
    truncated: false,
    trainable: false,
    timings: { inferenceMs: 0, envMs: 0, totalMs: 0 },
  };
}

/**
 * A scripted, in-process `WorkerPool` for producer tests: `runGroup` hands back a promise the test
 * settles later, in the order and with the outcome it chooses. It keeps the pool contract:
 *
 * - `runGroup` never rejects;
 * - the group is deep-copied on the way in (the real pool sends bytes), so the producer's object and
 *   the result are distinct objects;
 * - an outcome is applied the way the worker's agent loop would apply it: COMPLETED siblings kept from
 *   an earlier run are left alone, an ABORTED member is continued (partial rollout) or restarted from
 *   its prompt, new tokens are tagged with the model step the group was sent with.
 *
 * It also records contract breaches on the producer's side (the same group id sent twice while the
 * first run is still out) in `violations`, for the test to assert on.
 */
import type { WorkerPool } from '../../src/coordinator/worker-pool.ts';
import type { WorkerStats } from '../../src/protocol/messages.ts';
import {
  groupStatus,
  restartFromPrompt,
  Status,
  type RolloutGroup,
  type RolloutState,
  type TurnRecord,
} from '../../src/domain/rollout.ts';

/** How a held group comes back. */
export type Outcome =
  /** Every member that is not already COMPLETED completes, with rewards that differ across the group. */
  | { kind: 'completed' }
  /** Every member completes with the same reward: `drop-equal-rewards` turns the group FILTERED. */
  | { kind: 'equal-rewards' }
  /** Interrupted by a pause: members listed in `finished` complete, the rest come back ABORTED with a partial turn of `tokens` tokens. */
  | { kind: 'aborted'; tokens: number; finished: boolean[] }
  /** One member fails with an error (the group is FAILED). */
  | { kind: 'failed' };

interface Held {
  group: RolloutGroup;
  modelStep: number;
  resolve: (group: RolloutGroup) => void;
}

export class ScriptedPool implements WorkerPool {
  readonly liveWorkers = 1;

  async flush(): Promise<void> {}
  /** Continue ABORTED rollouts from their partial turn (the agent loop's `partialRollout`). */
  readonly partialRollout: boolean;
  /** Group id → the copy the "worker" holds, in dispatch order. */
  readonly #held = new Map<string, Held>();
  /** Every group id ever sent, with the model step it was sent with (latest run). */
  readonly sent: { id: string; modelStep: number }[] = [];
  readonly violations: string[] = [];
  #closed = false;

  constructor(options: { partialRollout: boolean }) {
    this.partialRollout = options.partialRollout;
  }

  runGroup(group: RolloutGroup, modelStep: number): Promise<RolloutGroup> {
    const copy = structuredClone(group);
    this.sent.push({ id: group.id, modelStep });
    if (this.#closed) this.violations.push(`group ${group.id} was sent to a closed pool`);
    return new Promise<RolloutGroup>((resolve) => {
      if (this.#held.has(copy.id)) {
        this.violations.push(`group ${copy.id} was sent again while its previous run was still in flight`);
        // Keep both runs resolvable: the earlier one under a suffixed key.
        const earlier = this.#held.get(copy.id)!;
        this.#held.delete(copy.id);
        this.#held.set(`${copy.id}#dup${this.sent.length}`, earlier);
      }
      this.#held.set(copy.id, { group: copy, modelStep, resolve });
    });
  }

  /** Ids of the groups held (in flight from the producer's point of view), oldest first. */
  heldIds(): string[] {
    return [...this.#held.keys()];
  }

  get heldCount(): number {
    return this.#held.size;
  }

  /** Settle one held group with `outcome`. */
  settle(id: string, outcome: Outcome): void {
    const held = this.#held.get(id);
    if (held === undefined) throw new Error(`scripted pool holds no group ${id}`);
    this.#held.delete(id);
    held.resolve(applyOutcome(held.group, outcome, held.modelStep, this.partialRollout));
  }

  async stats(): Promise<WorkerStats[]> {
    return [];
  }

  async close(): Promise<void> {
    this.#closed = true;
  }
}

/** Run `group` (already a private copy) to `outcome`, the way the worker's agent loop would. */
export function applyOutcome(
  group: RolloutGroup,
  outcome: Outcome,
  modelStep: number,
  partialRollout: boolean,
): RolloutGroup {
  group.rollouts.forEach((rollout, i) => {
    if (rollout.status === Status.COMPLETED) return; // a sibling kept from an earlier run of its group
    if (rollout.status === Status.ABORTED && !partialRollout) restartFromPrompt(rollout); // as the worker does (worker/agent-loop.ts)
    rollout.error = null;
    switch (outcome.kind) {
      case 'completed':
        complete(rollout, modelStep, 2, i + 1);
        break;
      case 'equal-rewards':
        complete(rollout, modelStep, 2, 1);
        break;
      case 'aborted':
        if (outcome.finished[i % outcome.finished.length]) complete(rollout, modelStep, 2, i + 1);
        else interrupt(rollout, modelStep, outcome.tokens);
        break;
      case 'failed':
        if (i === 0) {
          rollout.status = Status.FAILED;
          rollout.error = 'ERR_SCRIPTED: the scripted pool failed this rollout';
        } else complete(rollout, modelStep, 2, i + 1);
        break;
    }
  });
  group.status = groupStatus(group.rollouts);
  return group;
}

function complete(rollout: RolloutState, modelStep: number, tokens: number, reward: number): void {
  generate(rollout, modelStep, tokens, 'stop');
  rollout.turns.at(-1)!.reward = reward;
  rollout.turns.at(-1)!.terminated = true;
  rollout.reward += reward;
  rollout.terminated = true;
  rollout.finishReason = 'stop';
  rollout.status = Status.COMPLETED;
}

function interrupt(rollout: RolloutState, modelStep: number, tokens: number): void {
  generate(rollout, modelStep, tokens, 'abort');
  rollout.finishReason = 'abort';
  rollout.status = Status.ABORTED;
}

/** Add `tokens` response tokens at `modelStep`: continuing a partial last turn, or as a new turn. */
function generate(rollout: RolloutState, modelStep: number, tokens: number, finishReason: 'stop' | 'abort'): void {
  const last = rollout.turns.at(-1);
  const partial = last !== undefined && last.finishReason === 'abort' ? last : null;
  const ids = new Int32Array(tokens).fill(7);
  const steps = new Int32Array(tokens).fill(modelStep);
  if (partial !== null) {
    partial.responseIds = concat(partial.responseIds ?? new Int32Array(0), ids);
    partial.modelSteps = concat(partial.modelSteps ?? new Int32Array(0), steps);
    partial.logprobs = concatF(partial.logprobs ?? new Float32Array(0), new Float32Array(tokens).fill(-0.5));
    partial.response += 'x'.repeat(tokens);
    partial.finishReason = finishReason;
    partial.modelStep = modelStep;
    return;
  }
  const turn: TurnRecord = {
    step: rollout.turns.length + 1,
    agentId: null,
    messages: [{ role: 'user', content: 'What is 1 + 1?' }],
    response: 'x'.repeat(tokens),
    finishReason,
    promptIds: new Int32Array([1, 2, 3]),
    responseIds: ids,
    logprobs: new Float32Array(tokens).fill(-0.5),
    modelSteps: steps,
    seed: null,
    modelStep,
    reward: 0,
    terminated: false,
    truncated: false,
    trainable: true,
    timings: { inferenceMs: 0, envMs: 0, totalMs: 0 },
  };
  rollout.turns.push(turn);
}

function concat(a: Int32Array, b: Int32Array): Int32Array {
  const out = new Int32Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

function concatF(a: Float32Array, b: Float32Array): Float32Array {
  const out = new Float32Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/** Group results from a worker carry only the turns it added (src/protocol/result-delta.ts). */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { omitKeptTurns, receivedTurns, restoreKeptTurns } from '../src/protocol/result-delta.ts';
import { newGroup, type TurnRecord } from '../src/domain/rollout.ts';
import { endTruncated, trainOnLastStep } from '../src/worker/episode-end.ts';

describe('group results carry only the turns a worker added (protocol/result-delta.ts)', () => {
  const turn = (step: number): TurnRecord => ({
    step,
    agentId: null,
    messages: [],
    response: `r${step}`,
    finishReason: 'stop',
    promptIds: null,
    responseIds: null,
    logprobs: null,
    modelSteps: null,
    seed: null,
    modelStep: 0,
    reward: 0,
    terminated: false,
    truncated: false,
    trainable: true,
    timings: { inferenceMs: 0, envMs: 0, totalMs: 0 },
  });

  it('leaves out the unchanged leading turns and puts them back from the group as sent', () => {
    const sent = newGroup({ taskName: 't', promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} }, 3);
    sent.rollouts[0].turns = [turn(1), turn(2)]; // continued: turn 3 added
    sent.rollouts[1].turns = [turn(1), turn(2)]; // partial last turn popped and continued
    sent.rollouts[2].turns = [turn(1)]; // reset to its prompt, played again
    const inWorker = structuredClone(sent); // what a worker decodes
    const received = receivedTurns(inWorker);
    inWorker.rollouts[0].turns.push(turn(3));
    inWorker.rollouts[1].turns.pop();
    inWorker.rollouts[1].turns.push(turn(2));
    inWorker.rollouts[2].turns = [turn(1)];
    const kept = omitKeptTurns(inWorker, received);
    assert.deepEqual(kept, [2, 1, 0]);
    assert.deepEqual(
      inWorker.rollouts.map((r) => r.turns.length),
      [1, 1, 1],
    );
    const back = restoreKeptTurns(structuredClone(inWorker), sent, kept);
    assert.deepEqual(
      back.rollouts.map((r) => r.turns.map((t) => t.step)),
      [[1, 2, 3], [1, 2], [1]],
    );
    assert.equal(back.rollouts[0].turns[0], sent.rollouts[0].turns[0]);
  });

  // Regression: a continuation whose first step outgrew the context (or found no prompt) ended on
  // the step it arrived with, flagged in place; the result left that turn out as unchanged and the
  // coordinator put back its own unflagged copy, so the trainer got an episode with no turn to train.
  it('carries the flags an ending sets on a turn the rollout arrived with back to the coordinator', () => {
    const sent = newGroup({ taskName: 't', promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} }, 2);
    for (const r of sent.rollouts) r.turns = [turn(1), turn(2)].map((t) => ({ ...t, trainable: false }));
    const inWorker = structuredClone(sent);
    const received = receivedTurns(inWorker);
    endTruncated(inWorker.rollouts[0], null, 'the context is full');
    trainOnLastStep(inWorker.rollouts[1]);
    const kept = omitKeptTurns(inWorker, received);
    const back = restoreKeptTurns(structuredClone(inWorker), sent, kept);
    assert.deepEqual(kept, [1, 1], 'the flagged last step travels');
    const last = back.rollouts.map((r) => r.turns.at(-1));
    assert.deepEqual(
      last.map((t) => [t?.trainable, t?.terminated, t?.truncated]),
      [
        [true, true, true],
        [true, false, false],
      ],
    );
  });

  it('refuses counts that do not fit the group as sent, naming the field', () => {
    const sent = newGroup({ taskName: 't', promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} }, 1);
    assert.throws(
      () => restoreKeptTurns(structuredClone(sent), sent, [1]),
      /keptTurns\[0\] must be an integer from 0 to 0/,
    );
    assert.throws(
      () => restoreKeptTurns(structuredClone(sent), sent, 'x'),
      /keptTurns must list one count per rollout/,
    );
  });
});

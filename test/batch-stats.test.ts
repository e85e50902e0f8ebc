import { noFailures } from '../src/domain/failure.ts';
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { batchStats, groupLossMasks } from '../src/coordinator/batch-stats.ts';
import type { WindowStats } from '../src/coordinator/progress.ts';
import { newGroup, Status, type RolloutGroup, type TurnRecord } from '../src/domain/rollout.ts';

/** A turn whose response tokens carry the model steps `steps` (null: the server gave no ids). */
function turn(steps: number[] | null): TurnRecord {
  return {
    step: 1,
    agentId: null,
    messages: [],
    response: steps === null ? 'text' : 'tok'.repeat(steps.length),
    finishReason: 'stop',
    seed: null,
    promptIds: null,
    responseIds: steps === null ? null : Int32Array.from(steps, (_, i) => 100 + i),
    logprobs: null,
    modelSteps: steps === null ? null : Int32Array.from(steps),
    modelStep: steps === null || steps.length === 0 ? 0 : Math.max(...steps),
    reward: 0,
    terminated: true,
    truncated: false,
    trainable: true,
    timings: { inferenceMs: 0, envMs: 0, totalMs: 0 },
  };
}

/** A COMPLETED group of `task` with one member per entry: its reward and its turns' token model steps. */
function group(task: string, draw: number, ...members: { reward: number; turns: (number[] | null)[] }[]): RolloutGroup {
  const g = newGroup({ taskName: task, promptIndex: draw, drawIndex: draw, seed: draw, envParams: {} }, members.length);
  members.forEach((m, i) => {
    g.rollouts[i].status = Status.COMPLETED;
    g.rollouts[i].reward = m.reward;
    g.rollouts[i].turns = m.turns.map(turn);
  });
  g.status = Status.COMPLETED;
  return g;
}

const window: WindowStats = {
  meanReward: { a: 0.5, b: null },
  producedSamples: { a: 6, b: 2 },
  producedTokens: { a: 40, b: 0 },
  failures: { ...noFailures(), infrastructure: 2 },
  produceMs: 12,
};

describe('batch stats (coordinator/batch-stats.ts batchStats)', () => {
  it('adds up groups, rollouts, rewards, turns and tokens by hand: 2 + 1 groups, rewards (1 + 0 + 0.5) / 3', () => {
    // Task a: two groups of one member; task b: one group of one member. Train step 5.
    // Staleness = 5 − min step − 1: member 1 → 5 − 3 − 1 = 1, member 2 → 5 − 4 − 1 = 0, member 3 → 5 − 2 − 1 = 2,
    // which alone reaches the stale threshold 2.
    const taken = new Map([
      ['a', [group('a', 0, { reward: 1, turns: [[3, 4], [4]] }), group('a', 1, { reward: 0, turns: [[4, 4, 4]] })]],
      ['b', [group('b', 0, { reward: 0.5, turns: [[2]] })]],
    ]);
    const stats = batchStats(5, taken, 7, window, 2);
    assert.deepEqual(stats, {
      groups: 3,
      rollouts: 3,
      meanReward: 1.5 / 3,
      turns: 4,
      responseTokens: 2 + 1 + 3 + 1,
      staleness: { min: 0, max: 2, mean: (1 + 0 + 2) / 3, pastThreshold: 1 },
      maskedTokens: 7,
      inexactTokens: 0,
      historyRewrites: 0,
      historySplits: 0,
      producedSamples: { a: 6, b: 2 },
      producedTokens: { a: 40, b: 0 },
      rawMeanReward: { a: 0.5, b: null },
      failures: { ...noFailures(), infrastructure: 2 },
      produceMs: 12,
      byTask: { a: { groups: 2, meanReward: 0.5 }, b: { groups: 1, meanReward: 0.5 } },
    });
  });

  it('counts the inexact tokens: marked stale-KV ones, and every token of a turn that spans versions', () => {
    const g = group(
      'a',
      0,
      {
        reward: 1,
        turns: [
          [3, 3, 4, 4],
          [4, 4, 4],
        ],
      },
      { reward: 0, turns: [[3, 3]] },
    );
    g.rollouts[0].turns[0].staleKv = Uint8Array.of(0, 0, 1, 1);
    g.rollouts[1].turns[0].spansVersions = true;
    assert.equal(batchStats(5, new Map([['a', [g]]]), 0, window, Infinity).inexactTokens, 2 + 2);
  });

  it('counts the turns whose chat template rewrote the history, and of those the ones that split a rollout into segments', () => {
    const g = group('a', 0, { reward: 1, turns: [[4], [4], [4]] }, { reward: 0, turns: [[4], [4]] });
    g.rollouts[0].turns[1].historyRewrite = 'split';
    g.rollouts[0].turns[2].historyRewrite = 'kept';
    g.rollouts[1].turns[1].historyRewrite = 'kept';
    const stats = batchStats(5, new Map([['a', [g]]]), 0, window, Infinity);
    assert.deepEqual([stats.historyRewrites, stats.historySplits], [3, 1]);
  });

  it('gives rewards of 1e308 a mean reward of 1e308, overall and by task, not Infinity (regression: summed past Number.MAX_VALUE)', () => {
    const huge = (task: string, draw: number) =>
      group(task, draw, { reward: 1e308, turns: [[4]] }, { reward: 1e308, turns: [[4]] });
    const stats = batchStats(
      5,
      new Map([
        ['a', [huge('a', 0), huge('a', 1)]],
        ['b', [huge('b', 0)]],
      ]),
      0,
      window,
      2,
    );
    assert.deepEqual([stats.meanReward, stats.byTask.a.meanReward, stats.byTask.b.meanReward], [1e308, 1e308, 1e308]);
    const opposite = group('a', 0, { reward: 1e308, turns: [[4]] }, { reward: -1e308, turns: [[4]] });
    assert.equal(batchStats(5, new Map([['a', [opposite]]]), 0, window, 2).meanReward, 0);
  });

  it('reports zeros, not NaN, for a batch with no rollouts', () => {
    const stats = batchStats(1, new Map([['a', []]]), 0, window, 1);
    assert.deepEqual(
      [stats.groups, stats.rollouts, stats.meanReward, stats.staleness, stats.byTask],
      [0, 0, 0, { min: 0, max: 0, mean: 0, pastThreshold: 0 }, { a: { groups: 0, meanReward: 0 } }],
    );
  });

  it('counts a rollout with no response as staleness 0, and a text-only turn at its own model step: 9 − 0 − 1 = 8', () => {
    const stats = batchStats(9, new Map([['a', [group('a', 0, { reward: 1, turns: [] })]]]), 0, window, 1);
    assert.deepEqual(stats.staleness, { min: 0, max: 0, mean: 0, pastThreshold: 0 });
    const textOnly = batchStats(
      9,
      new Map([['a', [group('a', 0, { reward: 1, turns: [null] })]]]),
      0,
      window,
      Infinity,
    );
    assert.deepEqual(textOnly.staleness, { min: 8, max: 8, mean: 8, pastThreshold: 0 });
  });
});

describe('token loss masks (coordinator/batch-stats.ts groupLossMasks)', () => {
  it('masks the tokens threshold or more steps stale at the train step: 1 of 3, then 2 of 2, and no mask without ids', () => {
    // Train step 5, threshold 2: a token of step s is 5 − s − 1 stale; steps 2 and 1 are ≥ 2 stale.
    const g = group('a', 0, { reward: 1, turns: [[4, 3, 2], null] }, { reward: 1, turns: [[1, 2]] });
    const before = structuredClone(g);
    const { masks, masked } = groupLossMasks(g, 5, 2);
    assert.deepEqual(masks, [[Uint8Array.from([1, 1, 0]), null], [Uint8Array.from([0, 0])]]);
    assert.equal(masked, 3);
    assert.deepEqual(g, before, "the group is not touched: applying the masks is the caller's");
  });
});

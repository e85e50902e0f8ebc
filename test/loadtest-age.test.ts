import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { newGroup, type RolloutGroup } from '../src/domain/rollout.ts';
import { AgeTally } from '../src/loadtest/stats.ts';

/** A group whose members ran from `spans[i][0]` to `spans[i][1]` (wall ms). */
function groupOf(spans: [number, number][], drawIndex = 0): RolloutGroup {
  const g = newGroup({ taskName: 't', promptIndex: 0, drawIndex, seed: 0, envParams: {} }, spans.length);
  g.rollouts.forEach((r, i) => {
    r.timings.startedAt = spans[i][0];
    r.timings.finishedAt = spans[i][1];
  });
  return g;
}

/** 1 000 model ms a real ms: the figures, in model seconds, read as the real ms of the timings below. */
const MS = 1_000;

describe('the age of the rollouts a trainer takes', () => {
  it('splits each rollout’s age at the take into its episode, the rest of its group and the buffer', () => {
    const tally = new AgeTally(MS);
    // Members end at 1 100 and 1 400: the group is stored at 1 400 and taken at 2 000.
    tally.add(
      [
        groupOf([
          [1_000, 1_100],
          [1_000, 1_400],
        ]),
      ],
      2_000,
    );
    const a = tally.figures();
    assert.equal(a.rollouts, 2);
    assert.equal(a.episodeSeconds, (100 + 400) / 2);
    assert.equal(a.groupSeconds, (300 + 0) / 2, 'the first member waited 300 ms for the second');
    assert.equal(a.bufferSeconds, 600);
    assert.equal(a.episodeSeconds + a.groupSeconds + a.bufferSeconds, 1_000, 'the parts add up to take − start');
  });

  it('leaves out a member generated again, whose first start is not the start of what is taken', () => {
    const tally = new AgeTally(MS);
    const g = groupOf([
      [1_000, 5_000],
      [4_000, 5_000],
    ]);
    g.rollouts[0].attempt = 1; // reset at 4 000 and run again; its timings kept the first start, 1 000
    tally.add([g], 5_000);
    const a = tally.figures();
    assert.equal(a.rollouts, 1);
    assert.equal(a.generatedAgain, 1);
    assert.equal(a.episodeSeconds, 1_000);
  });

  it('leaves out and counts a taken rollout with no start on the clock', () => {
    const tally = new AgeTally(MS);
    tally.add(
      [
        groupOf([
          [0, 0],
          [1_000, 1_200],
        ]),
      ],
      1_200,
    );
    const a = tally.figures();
    assert.equal(a.rollouts, 1);
    assert.equal(a.untimed, 1);
    assert.equal(a.episodeSeconds, 200);
  });

  it('weights every rollout once across batches and groups', () => {
    const tally = new AgeTally(MS);
    tally.add([groupOf([[1_000, 1_100]], 0), groupOf([[1_000, 1_300]], 1)], 1_300);
    tally.add([groupOf([[2_000, 2_100]], 2)], 2_500);
    const a = tally.figures();
    assert.equal(a.rollouts, 3);
    assert.equal(a.episodeSeconds, 500 / 3);
    assert.equal(a.bufferSeconds, 600 / 3);
  });
});

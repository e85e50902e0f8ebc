/**
 * How a batch is split across tasks by weight (src/coordinator/allocate.ts allocateBatch): largest
 * remainder, ties to the task listed first, remainders compared as the doubles they are.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { allocateBatch } from '../src/coordinator/allocate.ts';

describe('batch allocation across tasks', () => {
  it('splits by weight with the largest remainder, ties going to the task listed first', () => {
    assert.deepEqual(
      [
        ...allocateBatch(8, [
          { name: 'a', weight: 1 },
          { name: 'b', weight: 1 },
        ]),
      ],
      [
        ['a', 4],
        ['b', 4],
      ],
    );
    assert.deepEqual(
      [
        ...allocateBatch(7, [
          { name: 'a', weight: 1 },
          { name: 'b', weight: 1 },
        ]),
      ],
      [
        ['a', 4],
        ['b', 3],
      ],
    );
    assert.deepEqual(
      [
        ...allocateBatch(10, [
          { name: 'a', weight: 1 },
          { name: 'b', weight: 2 },
          { name: 'c', weight: 3 },
        ]),
      ],
      [
        ['a', 2],
        ['b', 3],
        ['c', 5],
      ],
    );
    assert.deepEqual(
      [
        ...allocateBatch(1, [
          { name: 'a', weight: 1 },
          { name: 'b', weight: 1 },
          { name: 'c', weight: 1 },
        ]),
      ],
      [
        ['a', 1],
        ['b', 0],
        ['c', 0],
      ],
    );
  });
});

describe('batch split across tasks (coordinator/allocate.ts allocateBatch)', () => {
  const rows: { batch: number; weights: number[]; want: number[]; arithmetic: string }[] = [
    { batch: 8, weights: [1, 1], want: [4, 4], arithmetic: '4, 4 exactly' },
    { batch: 7, weights: [1, 1], want: [4, 3], arithmetic: '3.5, 3.5 → 3, 3 + 1 left; tie → first' },
    { batch: 10, weights: [1, 1, 1], want: [4, 3, 3], arithmetic: '3.33 each → 3, 3, 3 + 1 left; tie → first' },
    { batch: 2, weights: [1, 1, 1], want: [1, 1, 0], arithmetic: '0.67 each → 0, 0, 0 + 2 left; ties → first two' },
    { batch: 1, weights: [1, 1, 1], want: [1, 0, 0], arithmetic: '0.33 each → 1 left; tie → first' },
    {
      batch: 7,
      weights: [0.2, 0.3, 0.5],
      want: [1, 2, 4],
      arithmetic: '1.4, 2.1, 3.5 → 1, 2, 3 + 1 left; largest remainder .5 → third',
    },
    { batch: 10, weights: [0.2, 0.3, 0.5], want: [2, 3, 5], arithmetic: '2, 3, 5 exactly' },
    { batch: 10, weights: [1, 2, 3], want: [2, 3, 5], arithmetic: '1.67, 3.33, 5 → 1, 3, 5 + 1 left; .67 → first' },
    { batch: 5, weights: [3, 1], want: [4, 1], arithmetic: '3.75, 1.25 → 3, 1 + 1 left; .75 → first' },
    { batch: 3, weights: [1, 3], want: [1, 2], arithmetic: '0.75, 2.25 → 0, 2 + 1 left; .75 → first' },
    { batch: 11, weights: [5, 3, 2], want: [6, 3, 2], arithmetic: '5.5, 3.3, 2.2 → 5, 3, 2 + 1 left; .5 → first' },
    { batch: 9, weights: [1, 1, 1, 1], want: [3, 2, 2, 2], arithmetic: '2.25 each → 8 + 1 left; tie → first' },
    { batch: 6, weights: [1, 10], want: [1, 5], arithmetic: '0.545, 5.455 → 0, 5 + 1 left; .545 → first' },
    { batch: 4, weights: [2], want: [4], arithmetic: 'a single task takes the whole batch' },
    { batch: 0, weights: [1, 2], want: [0, 0], arithmetic: 'an empty batch gives nothing' },
  ];
  for (const { batch, weights, want, arithmetic } of rows) {
    it(`splits ${batch} by weights ${weights.join(':')} into ${want.join('/')} (${arithmetic})`, () => {
      const tasks = weights.map((weight, i) => ({ name: `t${i}`, weight }));
      const got = allocateBatch(batch, tasks);
      assert.deepEqual(
        [...got.keys()],
        tasks.map((t) => t.name),
      ); // listed order
      assert.deepEqual([...got.values()], want);
    });
  }

  it('gives the tie to whichever task is listed first, not to a name: 10 over c, b, a at 1:1:1 → c gets 4', () => {
    assert.deepEqual(
      [
        ...allocateBatch(10, [
          { name: 'c', weight: 1 },
          { name: 'b', weight: 1 },
          { name: 'a', weight: 1 },
        ]),
      ],
      [
        ['c', 4],
        ['b', 3],
        ['a', 3],
      ],
    );
  });

  it('always sums to the batch size and never strays more than 1 from the exact share (batches 0–40, weights 1–4 over 3 tasks)', () => {
    for (let batch = 0; batch <= 40; batch++) {
      for (let a = 1; a <= 4; a++) {
        for (let b = 1; b <= 4; b++) {
          for (let c = 1; c <= 4; c++) {
            const w = [a, b, c];
            const parts = [
              ...allocateBatch(
                batch,
                w.map((weight, i) => ({ name: `t${i}`, weight })),
              ).values(),
            ];
            assert.equal(
              parts.reduce((s, n) => s + n, 0),
              batch,
              `batch ${batch} weights ${w}`,
            );
            parts.forEach((n, i) =>
              assert.ok(Math.abs(n - (batch * w[i]) / (a + b + c)) < 1, `batch ${batch} weights ${w}`),
            );
          }
        }
      }
    }
  });

  // Near ties are compared as the doubles they are, as the reference does: 4/3 − 1 is
  // 0.33333333333333326 and loses to 1/3 = 0.3333333333333333. A tolerance of 1e-9 used to call these
  // ties and give them to the task listed first, so the split differed from the reference's.
  const floatTieRows: { batch: number; weights: number[]; want: number[]; was: number[]; arithmetic: string }[] = [
    {
      batch: 2,
      weights: [4, 1, 1],
      want: [1, 1, 0],
      was: [2, 0, 0],
      arithmetic:
        'remainders .33333333333333326, .3333333333333333, .3333333333333333 → second and third tie, second first',
    },
    {
      batch: 4,
      weights: [1, 4, 1],
      want: [1, 2, 1],
      was: [1, 3, 0],
      arithmetic: 'remainders .6666666666666666, .6666666666666665, .6666666666666666 → first and third',
    },
    {
      batch: 3,
      weights: [2, 2, 5],
      want: [1, 0, 2],
      was: [1, 1, 1],
      arithmetic: 'remainders .6666666666666666, .6666666666666666, .6666666666666667 → third, then first',
    },
    {
      batch: 2,
      weights: [0.1, 0.7, 0.2],
      want: [0, 1, 1],
      was: [0, 2, 0],
      arithmetic: 'remainders .2, .3999999999999999, .4 → third',
    },
  ];
  for (const { batch, weights, want, was, arithmetic } of floatTieRows) {
    it(`splits ${batch} by weights ${weights.join(':')} into ${want.join('/')} as plain doubles do, not ${was.join('/')} (regression: a 1e-9 tie tolerance disagreed with the reference; ${arithmetic})`, () => {
      assert.deepEqual(
        [
          ...allocateBatch(
            batch,
            weights.map((weight, i) => ({ name: `t${i}`, weight })),
          ).values(),
        ],
        want,
      );
    });
  }

  it('gives an exact tie of doubles to the task listed first: 7 over 1:1 has remainders 0.5 and 0.5 → 4/3', () => {
    assert.deepEqual(
      [
        ...allocateBatch(7, [
          { name: 'b', weight: 1 },
          { name: 'a', weight: 1 },
        ]).values(),
      ],
      [4, 3],
    );
  });
});

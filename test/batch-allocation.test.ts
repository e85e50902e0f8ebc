/**
 * How a batch is split across tasks by weight (src/coordinator/allocate.ts allocateBatch): largest
 * remainder, ties to the task listed first, remainders compared as the doubles they are.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { resolveConfig } from '../src/config.ts';
import { allocateBatch } from '../src/coordinator/allocate.ts';
import { ProduceProgress } from '../src/coordinator/progress.ts';
import { RolloutEngineError } from '../src/errors.ts';

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

describe('batch split with extreme but valid weights (issue 28 item 4)', () => {
  /** Weights spanning every order of magnitude a double has, subnormals and 0 included. */
  const weightArb = fc.oneof(
    fc.constantFrom(0, 5e-324, 1e-310, 1e-300, 1e-20, 0.1, 1, 3, 1e20, 1e300, 1.7e302),
    fc.double({ min: 0, max: 1e300, noNaN: true, noDefaultInfinity: true }),
    fc.integer({ min: -1074, max: 996 }).map((e) => 2 ** e),
  );
  const splitArb = fc
    .record({
      batch: fc.oneof(fc.integer({ min: 1, max: 64 }), fc.constantFrom(999_999, 1_000_000)),
      weights: fc.array(weightArb, { minLength: 1, maxLength: 60 }),
    })
    // What the config accepts: some weight above 0, and batchSize × Σ weights finite.
    .filter(({ batch, weights }) => {
      const total = weights.reduce((a, b) => a + b, 0);
      return total > 0 && Number.isFinite(batch * total);
    });

  it('fills the batch exactly, every part an integer within 1 of its exact share and 0 for a zero weight, for 1 to 60 tasks weighted from 5e-324 to 1e300 mixed', () => {
    fc.assert(
      fc.property(splitArb, ({ batch, weights }) => {
        const total = weights.reduce((a, b) => a + b, 0);
        const parts = [
          ...allocateBatch(
            batch,
            weights.map((weight, i) => ({ name: `t${i}`, weight })),
          ).values(),
        ];
        assert.equal(
          parts.reduce((a, b) => a + b, 0),
          batch,
        );
        parts.forEach((n, i) => {
          assert.ok(Number.isSafeInteger(n) && n >= 0, `part ${i} is ${n}`);
          if (weights[i] === 0) assert.equal(n, 0, `task ${i} has weight 0`);
          assert.ok(Math.abs(n - (batch * weights[i]) / total) < 1, `part ${i}: ${n}`);
        });
      }),
      { seed: 28, numRuns: 3000 },
    );
  });

  it('gives 1e300 the whole batch and 1e-300 nothing, in either order: 8 over 1e-300:1e300 → 0/8', () => {
    for (const weights of [
      [1e-300, 1e300],
      [1e300, 1e-300],
    ]) {
      const parts = [
        ...allocateBatch(
          8,
          weights.map((weight, i) => ({ name: `t${i}`, weight })),
        ).values(),
      ];
      assert.deepEqual(parts, weights[0] === 1e300 ? [8, 0] : [0, 8]);
    }
  });

  it('splits the largest weights the config accepts: 1e6 over 1e300:1e300:1e300 → 333334/333333/333333', () => {
    const tasks = [1e300, 1e300, 1e300].map((weight, i) => ({
      name: `t${i}`,
      weight,
      env: { module: 'builtin:arithmetic' },
    }));
    const config = resolveConfig({ batchSize: 1_000_000, tasks });
    assert.deepEqual(
      [...new ProduceProgress(config.tasks, config.batchSize).shares().values()],
      [333_334, 333_333, 333_333],
    );
  });

  const refused: { why: string; batch: number; weights: number[]; message: RegExp }[] = [
    {
      why: 'a sum of weights that overflows the split (1e308 × 8 is Infinity: a share of Infinity spawned groups for ever)',
      batch: 8,
      weights: [1, 1e308],
      message: /^batch split: tasks: batchSize \(8\) × the sum of the weights \(1e\+308\) overflows a double/,
    },
    {
      why: 'a sum that is itself Infinity (1e308 + 1e308: every share NaN, a batch of 0 groups)',
      batch: 2,
      weights: [1e308, 1e308],
      message: /^batch split: tasks: batchSize \(2\) × the sum of the weights \(Infinity\) overflows a double/,
    },
    {
      why: 'a NaN weight',
      batch: 4,
      weights: [1, Number.NaN],
      message: /^batch split: tasks\[1\]\.weight must be a finite number ≥ 0 \(got NaN\)$/,
    },
    {
      why: 'a negative weight',
      batch: 4,
      weights: [-1, 2],
      message: /^batch split: tasks\[0\]\.weight must be a finite number ≥ 0 \(got -1\)$/,
    },
    {
      why: 'every weight 0',
      batch: 4,
      weights: [0, 0],
      message:
        /^batch split: tasks: every weight is 0; at least one task needs a weight above 0 to share a batch of 4$/,
    },
    {
      why: 'a batch size that is not an integer',
      batch: 2.5,
      weights: [1],
      message: /^batch split: batchSize must be a non-negative integer \(got 2\.5\)$/,
    },
  ];
  for (const { why, batch, weights, message } of refused) {
    it(`refuses to split with ${why}, in one line naming the field and the value`, () => {
      const tasks = weights.map((weight, i) => ({ name: `t${i}`, weight }));
      const refusal = (err: unknown) =>
        err instanceof RolloutEngineError &&
        err.code === 'ERR_INVALID_ARGUMENT' &&
        message.test(err.message) &&
        !err.message.includes('\n');
      assert.throws(() => allocateBatch(batch, tasks), refusal);
      // Where a producer is built: before any batch, not as a short batch later.
      assert.throws(() => new ProduceProgress(tasks, batch), refusal);
    });
  }
});

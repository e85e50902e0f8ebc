/**
 * The replay buffer (src/buffer/replay-buffer.ts): its pools per task and status, FIFO and stalest-first
 * takes, drops and their reasons, expiry on refresh, and snapshot and restore.
 *
 * Worked numbers in the notation of test/support/groups.ts: C(3, 4) is a COMPLETED member with one
 * turn of tokens from model steps 3 and 4.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ReplayBuffer, type ExpiryPolicy } from '../src/buffer/replay-buffer.ts';
import { groupStatus, newGroup, Status, type RolloutGroup } from '../src/protocol/rollout.ts';
import { A, at5, C, E, fill, group, I, ids, L, multi, statuses, T2, turnCounts, X } from './support/groups.ts';

/** Drain a pool with takeForRetry, oldest first, returning the ids. */
function drainRetry(
  buffer: ReplayBuffer,
  task: string,
  status: typeof Status.EXPIRED | typeof Status.ABORTED,
): string[] {
  const out: string[] = [];
  for (let g = buffer.takeForRetry(task, [status]); g !== null; g = buffer.takeForRetry(task, [status])) out.push(g.id);
  return out;
}

describe('replay buffer', () => {
  function group(task: string, i: number, status: (typeof Status)[keyof typeof Status]) {
    const g = newGroup({ taskName: task, promptIndex: i, drawIndex: i, seed: i, envParams: {} }, 2);
    for (const r of g.rollouts) r.status = status;
    g.status = groupStatus(g.rollouts);
    if (status === Status.FAILED) g.rollouts[0].error = `boom ${i}`;
    return g;
  }

  it('takes COMPLETED groups first-in first-out and counts them per task', () => {
    const buffer = new ReplayBuffer(['a', 'b']);
    for (let i = 0; i < 3; i++) buffer.put(group('a', i, Status.COMPLETED));
    buffer.put(group('b', 9, Status.COMPLETED));
    assert.equal(buffer.count('a'), 3);
    assert.equal(buffer.count(), 4);
    assert.deepEqual(
      buffer.take('a', 2).map((g) => g.id),
      ['a/0', 'a/1'],
    );
    assert.equal(buffer.count('a'), 1);
  });

  it('counts FAILED and FILTERED groups without storing them, keeping the last reason', () => {
    const buffer = new ReplayBuffer(['a']);
    buffer.put(group('a', 1, Status.FAILED));
    buffer.put(group('a', 2, Status.ABORTED));
    assert.deepEqual(buffer.dropped, { FAILED: 1, FILTERED: 0, EXPIRED: 0 });
    assert.equal(buffer.lastDropReason, 'boom 1');
    assert.equal(buffer.count('a', Status.ABORTED), 1);
    assert.equal(buffer.count('a', Status.COMPLETED), 0);
  });

  it('moves a group between status pools when it is put again', () => {
    const buffer = new ReplayBuffer(['a']);
    const g = group('a', 1, Status.ABORTED);
    buffer.put(g);
    for (const r of g.rollouts) r.status = Status.COMPLETED;
    g.status = Status.COMPLETED;
    buffer.put(g);
    assert.equal(buffer.count('a', Status.ABORTED), 0);
    assert.equal(buffer.count('a', Status.COMPLETED), 1);
  });
});

describe('replay buffer put (buffer/replay-buffer.ts)', () => {
  const rows: {
    name: string;
    build: () => RolloutGroup;
    expiry?: ExpiryPolicy;
    where: string;
    stored: Partial<Record<'COMPLETED' | 'ABORTED' | 'EXPIRED', number>>;
    dropped: Record<'FAILED' | 'FILTERED' | 'EXPIRED', number>;
  }[] = [
    {
      name: 'a COMPLETED group is stored as COMPLETED',
      build: () => group('a', 0, C(4), C(4)),
      where: 'COMPLETED',
      stored: { COMPLETED: 1 },
      dropped: { FAILED: 0, FILTERED: 0, EXPIRED: 0 },
    },
    {
      name: 'an ABORTED group is stored as ABORTED',
      build: () => group('a', 0, C(4), A(4)),
      where: 'ABORTED',
      stored: { ABORTED: 1 },
      dropped: { FAILED: 0, FILTERED: 0, EXPIRED: 0 },
    },
    {
      name: 'an EXPIRED group is stored as EXPIRED',
      build: () => group('a', 0, E(), C(4)),
      where: 'EXPIRED',
      stored: { EXPIRED: 1 },
      dropped: { FAILED: 0, FILTERED: 0, EXPIRED: 0 },
    },
    {
      name: 'a FAILED group is counted, not stored',
      build: () => group('a', 0, C(4), X(4)),
      where: 'FAILED',
      stored: {},
      dropped: { FAILED: 1, FILTERED: 0, EXPIRED: 0 },
    },
    {
      name: 'a FILTERED group is counted, not stored',
      build: () => group('a', 0, L(4), C(4)),
      where: 'FILTERED',
      stored: {},
      dropped: { FAILED: 0, FILTERED: 1, EXPIRED: 0 },
    },
    {
      name: 'a fresh COMPLETED group passes expiry: C(4) at 5 → 0 < 2',
      build: () => group('a', 0, C(4), C(3)),
      expiry: at5(true),
      where: 'COMPLETED',
      stored: { COMPLETED: 1 },
      dropped: { FAILED: 0, FILTERED: 0, EXPIRED: 0 },
    },
    {
      name: 'a stale COMPLETED group becomes EXPIRED when retryable: C(2) at 5 → 2 ≥ 2',
      build: () => group('a', 0, C(4), C(2)),
      expiry: at5(true),
      where: 'EXPIRED',
      stored: { EXPIRED: 1 },
      dropped: { FAILED: 0, FILTERED: 0, EXPIRED: 0 },
    },
    {
      name: 'a stale group with a fresh ABORTED sibling stays ABORTED when retryable: C(1) → 3 expires, A(4) remains',
      build: () => group('a', 0, C(1), A(4)),
      expiry: at5(true),
      where: 'ABORTED',
      stored: { ABORTED: 1 },
      dropped: { FAILED: 0, FILTERED: 0, EXPIRED: 0 },
    },
    {
      name: 'a stale ABORTED group is dropped and counted when not retryable: A(2) at 5 → 2 ≥ 2',
      build: () => group('a', 0, A(2), C(4)),
      expiry: at5(false),
      where: 'EXPIRED',
      stored: {},
      dropped: { FAILED: 0, FILTERED: 0, EXPIRED: 1 },
    },
    {
      name: 'a FAILED group is counted as FAILED even when also stale',
      build: () => group('a', 0, X(0), C(0)),
      expiry: at5(false),
      where: 'FAILED',
      stored: {},
      dropped: { FAILED: 1, FILTERED: 0, EXPIRED: 0 },
    },
  ];
  for (const row of rows) {
    it(`returns ${row.where}: ${row.name}`, () => {
      const buffer = new ReplayBuffer(['a', 'b']);
      assert.equal(buffer.put(row.build(), row.expiry), row.where);
      for (const s of ['COMPLETED', 'ABORTED', 'EXPIRED'] as const)
        assert.equal(buffer.count('a', s), row.stored[s] ?? 0, `count(a, ${s})`);
      assert.equal(buffer.count('b'), 0);
      assert.deepEqual(buffer.dropped, row.dropped);
    });
  }

  it('derives the stored status from the members, not from a stale group.status', () => {
    const buffer = new ReplayBuffer(['a']);
    const g = group('a', 0, C(4), C(4));
    g.status = Status.INIT;
    assert.equal(buffer.put(g), 'COMPLETED');
    assert.equal(g.status, Status.COMPLETED);
  });

  it('moves a re-put group between pools instead of keeping two copies (ABORTED, then completed on retry)', () => {
    const buffer = new ReplayBuffer(['a']);
    const g = group('a', 0, C(4), A(4));
    buffer.put(g);
    fill(g.rollouts[1], C(5));
    buffer.put(g);
    assert.deepEqual([buffer.count('a', 'ABORTED'), buffer.count('a', 'COMPLETED')], [0, 1]);
  });

  it('drops a group that was stored and comes back FAILED, so it is in no pool', () => {
    const buffer = new ReplayBuffer(['a']);
    const g = group('a', 0, C(4), A(4));
    buffer.put(g);
    fill(g.rollouts[1], X(5));
    assert.equal(buffer.put(g), 'FAILED');
    assert.deepEqual([buffer.count('a', 'ABORTED'), buffer.count('a', 'COMPLETED'), buffer.dropped.FAILED], [0, 0, 1]);
  });

  it('reports every drop to onDrop with its reason and keeps the last reason (the error for FAILED, a message naming the group for EXPIRED)', () => {
    const buffer = new ReplayBuffer(['a']);
    const seen: [string, string][] = [];
    buffer.onDrop = (g, reason) => seen.push([g.id, reason]);
    buffer.put(group('a', 1, C(4), X(4)));
    assert.equal(buffer.lastDropReason, 'ERR_TEST a/1/1 failed');
    buffer.put(group('a', 2, L(4)));
    assert.equal(buffer.lastDropReason, 'FILTERED');
    buffer.put(group('a', 3, C(0)), at5(false));
    assert.match(buffer.lastDropReason!, /a\/3/);
    assert.match(buffer.lastDropReason!, /expired/);
    assert.deepEqual(seen, [
      ['a/1', 'FAILED'],
      ['a/2', 'FILTERED'],
      ['a/3', 'EXPIRED'],
    ]);
    assert.deepEqual(buffer.dropped, { FAILED: 1, FILTERED: 1, EXPIRED: 1 });
  });

  it('refuses a group with nothing to store (all INIT) and a task it does not know', () => {
    const buffer = new ReplayBuffer(['a']);
    assert.throws(() => buffer.put(group('a', 0, I(), I())), /cannot store/);
    assert.throws(() => buffer.put(group('zzz', 0, C(4))), /no task "zzz"/);
    assert.throws(() => buffer.take('zzz', 1), /no task "zzz"/);
  });

  it('hands out copies of the drop counts, so callers cannot change them', () => {
    const buffer = new ReplayBuffer(['a']);
    const d = buffer.dropped as Record<string, number>;
    d.FAILED = 42;
    assert.equal(buffer.dropped.FAILED, 0);
  });
});

describe('replay buffer refresh (buffer/replay-buffer.ts)', () => {
  // Stored COMPLETED in this order: a/0 (C4), a/1 (C1), a/2 (C4), a/3 (C2), a/4 (C3).
  // At train step 5 with threshold 2: staleness 0, 3, 0, 2, 1 → a/1 and a/3 expire.
  function filled(): ReplayBuffer {
    const buffer = new ReplayBuffer(['a', 'b']);
    [[4], [1], [4], [2], [3]].forEach(([m], i) => buffer.put(group('a', i, C(m), C(4))));
    return buffer;
  }

  it('when retryable, moves the expired groups (a/1: 5−1−1=3, a/3: 5−2−1=2) to EXPIRED and keeps the FIFO order of those that stay', () => {
    const buffer = filled();
    buffer.refresh(at5(true));
    assert.deepEqual([buffer.count('a', 'COMPLETED'), buffer.count('a', 'EXPIRED')], [3, 2]);
    assert.deepEqual(ids(buffer.take('a', 10)), ['a/0', 'a/2', 'a/4']);
    const expired = [buffer.takeForRetry('a', ['EXPIRED'])!, buffer.takeForRetry('a', ['EXPIRED'])!];
    assert.deepEqual(ids(expired), ['a/1', 'a/3']);
    // only the stale member was reset; its sibling C(4) kept its response
    for (const g of expired)
      assert.deepEqual(
        [statuses(g), turnCounts(g)],
        [
          ['EXPIRED', 'COMPLETED'],
          [0, 1],
        ],
      );
    assert.deepEqual(buffer.dropped, { FAILED: 0, FILTERED: 0, EXPIRED: 0 });
  });

  it('when not retryable, drops the expired groups (dropped.EXPIRED = 2) and keeps the FIFO order of those that stay', () => {
    const buffer = filled();
    const seen: string[] = [];
    buffer.onDrop = (g) => seen.push(g.id);
    buffer.refresh(at5(false));
    assert.deepEqual(buffer.dropped, { FAILED: 0, FILTERED: 0, EXPIRED: 2 });
    assert.deepEqual(seen, ['a/1', 'a/3']);
    assert.equal(buffer.count('a', 'EXPIRED'), 0);
    assert.deepEqual(ids(buffer.take('a', 10)), ['a/0', 'a/2', 'a/4']);
  });

  it('appends newly expired groups after the ones already in the EXPIRED pool, in their FIFO order', () => {
    const buffer = new ReplayBuffer(['a']);
    buffer.put(group('a', 9, E(), C(4))); // already EXPIRED
    buffer.put(group('a', 1, C(2)));
    buffer.put(group('a', 2, C(4)));
    buffer.put(group('a', 3, C(0)));
    buffer.refresh(at5(true)); // a/1: 2 ≥ 2, a/3: 4 ≥ 2, a/2: 0
    assert.deepEqual(drainRetry(buffer, 'a', 'EXPIRED'), ['a/9', 'a/1', 'a/3']);
    assert.deepEqual(ids(buffer.take('a', 10)), ['a/2']);
  });

  it('expires ABORTED groups too: A(1)+A(2) → both reset, group EXPIRED; A(1)+A(4) → stays ABORTED with its fresh member', () => {
    const buffer = new ReplayBuffer(['a']);
    buffer.put(group('a', 0, A(4), A(4))); // 0, 0: stays
    buffer.put(group('a', 1, A(1), A(2))); // 3, 2: both expire
    buffer.put(group('a', 2, A(1), A(4))); // 3, 0: one expires, ABORTED remains
    buffer.refresh(at5(true));
    assert.deepEqual(drainRetry(buffer, 'a', 'EXPIRED'), ['a/1']);
    const aborted: RolloutGroup[] = [];
    for (let g = buffer.takeForRetry('a', ['ABORTED']); g; g = buffer.takeForRetry('a', ['ABORTED'])) aborted.push(g);
    assert.deepEqual(ids(aborted), ['a/0', 'a/2']);
    assert.deepEqual(statuses(aborted[1]), ['EXPIRED', 'ABORTED']);
  });

  it('expires the remaining COMPLETED sibling of an EXPIRED group once it too is stale (step 5, then step 7: 7−4−1 = 2)', () => {
    const buffer = new ReplayBuffer(['a']);
    buffer.put(group('a', 0, C(2), C(4)));
    buffer.refresh(at5(true));
    assert.equal(buffer.count('a', 'EXPIRED'), 1);
    buffer.refresh({ trainStep: 7, threshold: T2, retryable: true });
    const g = buffer.takeForRetry('a', ['EXPIRED'])!;
    assert.deepEqual(
      [statuses(g), turnCounts(g)],
      [
        ['EXPIRED', 'EXPIRED'],
        [0, 0],
      ],
    );
  });

  it('changes nothing when nothing is stale, and a refresh with an infinite threshold changes nothing at all', () => {
    const buffer = filled();
    buffer.refresh({ trainStep: 2, threshold: T2, retryable: false }); // 2−1−1 = 0 for the oldest (a/1)
    buffer.refresh({ trainStep: 1000, threshold: Number.POSITIVE_INFINITY, retryable: false });
    assert.deepEqual(buffer.dropped.EXPIRED, 0);
    assert.deepEqual(ids(buffer.take('a', 10)), ['a/0', 'a/1', 'a/2', 'a/3', 'a/4']);
  });
});

describe('replay buffer taking (buffer/replay-buffer.ts take / takeForRetry / count)', () => {
  // Inserted in this order with their oldest token's model step: g0:5, g1:3, g2:5, g3:1, g4:3.
  function staggered(): ReplayBuffer {
    const buffer = new ReplayBuffer(['a', 'b']);
    [5, 3, 5, 1, 3].forEach((m, i) => buffer.put(group('a', i, C(m + 1), C(m, m + 2))));
    return buffer;
  }

  const fifoRows: [n: number, want: string[]][] = [
    [0, []],
    [1, ['a/0']],
    [3, ['a/0', 'a/1', 'a/2']],
    [5, ['a/0', 'a/1', 'a/2', 'a/3', 'a/4']],
    [9, ['a/0', 'a/1', 'a/2', 'a/3', 'a/4']], // more than stored: all 5
  ];
  for (const [n, want] of fifoRows) {
    it(`takes ${want.length} groups first-in first-out for take(a, ${n}, 'fifo')`, () => {
      const buffer = staggered();
      assert.deepEqual(ids(buffer.take('a', n, 'fifo')), want);
      assert.equal(buffer.count('a'), 5 - want.length);
    });
  }

  const stalestRows: [n: number, want: string[]][] = [
    [1, ['a/3']], // step 1 is the oldest
    [2, ['a/3', 'a/1']], // then step 3: a/1 before a/4 (inserted first)
    [3, ['a/3', 'a/1', 'a/4']],
    [5, ['a/3', 'a/1', 'a/4', 'a/0', 'a/2']], // step 5 tie: a/0 before a/2
  ];
  for (const [n, want] of stalestRows) {
    it(`takes by oldest token then insertion for take(a, ${n}, 'stalest') with steps g0:5 g1:3 g2:5 g3:1 g4:3 → ${want.join(' ')}`, () => {
      const buffer = staggered();
      assert.deepEqual(ids(buffer.take('a', n, 'stalest')), want);
    });
  }

  it('leaves the rest in FIFO order after a stalest take (take 3 stalest → a/0, a/2 remain)', () => {
    const buffer = staggered();
    buffer.take('a', 3, 'stalest');
    assert.deepEqual(ids(buffer.take('a', 9, 'fifo')), ['a/0', 'a/2']);
  });

  it('measures a group by its oldest token over all members and turns (member turns [6] and [6, 0] → 0 beats a group at 1)', () => {
    const buffer = new ReplayBuffer(['a']);
    buffer.put(group('a', 0, C(1), C(1)));
    buffer.put(group('a', 1, C(6), multi(Status.COMPLETED, [6], [6, 0])));
    assert.deepEqual(ids(buffer.take('a', 2, 'stalest')), ['a/1', 'a/0']);
  });

  it('puts groups with no response tokens after every group with tokens when taking stalest first, keeping their insertion order', () => {
    const buffer = new ReplayBuffer(['a']);
    const empty = (i: number) => {
      const g = group('a', i, C(), C());
      for (const r of g.rollouts) r.turns = [];
      return g;
    };
    buffer.put(empty(0));
    buffer.put(group('a', 1, C(9)));
    buffer.put(empty(2));
    buffer.put(group('a', 3, C(7)));
    assert.deepEqual(ids(buffer.take('a', 4, 'stalest')), ['a/3', 'a/1', 'a/0', 'a/2']);
  });

  it('takes only COMPLETED groups of the named task', () => {
    const buffer = new ReplayBuffer(['a', 'b']);
    buffer.put(group('a', 0, A(4)));
    buffer.put(group('b', 0, C(4)));
    buffer.put(group('a', 1, C(4)));
    buffer.put(group('a', 2, E()));
    assert.deepEqual(ids(buffer.take('a', 9)), ['a/1']);
    assert.deepEqual(ids(buffer.take('a', 9, 'stalest')), []);
    assert.deepEqual([buffer.count('a', 'ABORTED'), buffer.count('a', 'EXPIRED'), buffer.count('b')], [1, 1, 1]);
  });

  it('counts per task and status, and over all tasks when no task is named (a: 2 C + 1 A, b: 3 C → 5 COMPLETED)', () => {
    const buffer = new ReplayBuffer(['a', 'b']);
    buffer.put(group('a', 0, C(1)));
    buffer.put(group('a', 1, C(1)));
    buffer.put(group('a', 2, A(1)));
    for (let i = 0; i < 3; i++) buffer.put(group('b', i, C(1)));
    assert.deepEqual(
      [
        buffer.count('a'),
        buffer.count('b'),
        buffer.count(),
        buffer.count(undefined, 'ABORTED'),
        buffer.count('b', 'ABORTED'),
        buffer.count(undefined, 'EXPIRED'),
      ],
      [2, 3, 5, 1, 0, 0],
    );
  });

  const retryRows: { name: string; order: ('EXPIRED' | 'ABORTED')[]; want: (string | null)[] }[] = [
    {
      name: 'EXPIRED first, then ABORTED, each oldest first',
      order: ['EXPIRED', 'ABORTED'],
      want: ['a/1', 'a/3', 'a/0', 'a/2', null],
    },
    { name: 'only ABORTED when EXPIRED is not asked for', order: ['ABORTED'], want: ['a/0', 'a/2', null] },
    {
      name: 'ABORTED first when listed first',
      order: ['ABORTED', 'EXPIRED'],
      want: ['a/0', 'a/2', 'a/1', 'a/3', null],
    },
  ];
  for (const row of retryRows) {
    it(`takes groups for retry from [${row.order}] as ${row.want.map(String).join(', ')}: ${row.name}`, () => {
      const buffer = new ReplayBuffer(['a']);
      buffer.put(group('a', 0, A(4)));
      buffer.put(group('a', 1, E()));
      buffer.put(group('a', 2, A(4), C(4)));
      buffer.put(group('a', 3, E(), C(4)));
      buffer.put(group('a', 4, C(4)));
      const got = row.want.map(() => buffer.takeForRetry('a', row.order)?.id ?? null);
      assert.deepEqual(got, row.want);
      assert.equal(buffer.count('a'), 1); // the COMPLETED group is never taken for retry
    });
  }

  it("draws groups for retry stalest first under takeOrder 'stalest' (regression: retries came back in insertion order whatever the order)", () => {
    // EXPIRED pool: a/0 keeps a sibling at step 4, a/1 one at step 2, a/2 was reset whole (no tokens:
    // least stale), a/3 one at step 2 again. ABORTED pool: a/4 at step 5, a/5 at step 3.
    const buffer = new ReplayBuffer(['a']);
    buffer.put(group('a', 0, E(), C(4)));
    buffer.put(group('a', 1, E(), C(2)));
    buffer.put(group('a', 2, E()));
    buffer.put(group('a', 3, E(), C(2)));
    buffer.put(group('a', 4, A(5)));
    buffer.put(group('a', 5, A(3)));
    const got: (string | null)[] = [];
    for (let i = 0; i < 7; i++) got.push(buffer.takeForRetry('a', ['EXPIRED', 'ABORTED'], 'stalest')?.id ?? null);
    assert.deepEqual(got, ['a/1', 'a/3', 'a/0', 'a/2', 'a/5', 'a/4', null]);
  });
});

describe('replay buffer snapshot and restore (buffer/replay-buffer.ts)', () => {
  function populated(): ReplayBuffer {
    const buffer = new ReplayBuffer(['a', 'b']);
    buffer.put(group('a', 0, C(4)));
    buffer.put(group('b', 0, C(4)));
    buffer.put(group('a', 1, A(4)));
    buffer.put(group('a', 2, C(3)));
    buffer.put(group('a', 3, E()));
    buffer.put(group('a', 4, X(4)));
    buffer.put(group('a', 5, C(0)), at5(false));
    return buffer;
  }

  it('lists every stored group pool by pool (task a: COMPLETED, ABORTED, EXPIRED, then task b) with the drop counts', () => {
    const snap = populated().snapshot();
    assert.deepEqual(ids(snap.groups), ['a/0', 'a/2', 'a/1', 'a/3', 'b/0']);
    assert.deepEqual(snap.dropped, { FAILED: 1, FILTERED: 0, EXPIRED: 1 });
    assert.match(snap.lastDropReason!, /a\/5/);
  });

  it('restores contents, FIFO order, pools and drop counts into another buffer, replacing what it held', () => {
    const snap = populated().snapshot();
    const other = new ReplayBuffer(['a', 'b']);
    other.put(group('a', 77, C(4)));
    other.put(group('a', 78, X(4)));
    other.restore(snap);
    assert.deepEqual(other.dropped, { FAILED: 1, FILTERED: 0, EXPIRED: 1 });
    assert.equal(other.lastDropReason, snap.lastDropReason);
    assert.deepEqual([other.count('a', 'ABORTED'), other.count('a', 'EXPIRED'), other.count('b')], [1, 1, 1]);
    assert.deepEqual(ids(other.take('a', 9)), ['a/0', 'a/2']);
  });

  it('does not apply expiry on restore: a group at step 0 comes back COMPLETED whatever the step', () => {
    const buffer = new ReplayBuffer(['a']);
    buffer.restore({
      groups: [group('a', 0, C(0))],
      dropped: { FAILED: 0, FILTERED: 0, EXPIRED: 0 },
      lastDropReason: null,
    });
    assert.equal(buffer.count('a'), 1);
    buffer.refresh(at5(false)); // the next refresh decides: 5−0−1 = 4 ≥ 2
    assert.deepEqual([buffer.count('a'), buffer.dropped.EXPIRED], [0, 1]);
  });
});

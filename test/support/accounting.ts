/**
 * The accounting identity every engine test can check (docs/GUARANTEES.md): every group the producer
 * scheduled is in flight, stored in the buffer, taken, or dropped with a reason — none vanished.
 */
import assert from 'node:assert/strict';
import type { EngineStats } from '../../src/index.ts';

/** scheduled = in flight + stored in the buffer + taken + dropped (FAILED + FILTERED + EXPIRED); `when` names the moment. */
export function assertAccounted(stats: EngineStats, when = 'now'): void {
  const { scheduled, inFlight, taken, dropped } = stats.groups;
  const stored = stats.buffer.completed + stats.buffer.aborted + stats.buffer.expired;
  const droppedTotal = dropped.FAILED + dropped.FILTERED + dropped.EXPIRED;
  assert.equal(
    scheduled,
    inFlight + stored + taken + droppedTotal,
    `${when}: scheduled ${scheduled} ≠ in flight ${inFlight} + stored ${stored} + taken ${taken} + dropped ${JSON.stringify(dropped)}`,
  );
}

/** Nothing is in flight any more and the identity holds: every scheduled group has landed somewhere. */
export function assertSettled(stats: EngineStats, when = 'now'): void {
  assert.equal(stats.groups.inFlight, 0, `${when}: ${stats.groups.inFlight} groups still in flight`);
  assertAccounted(stats, when);
}

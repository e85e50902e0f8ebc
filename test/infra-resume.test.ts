/**
 * An episode that failed by infrastructure goes on from its last finished step
 * (src/worker/continuation.ts, `resumeAfterInfra`): the steps the environment finished are kept for
 * the replay, the step it did not finish is dropped and counted thrown away, and where a replay
 * cannot rebuild the state the rollout starts from its prompt. The engine-level behaviour, against a
 * mock server, is in test/failure-kinds.test.ts.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Status, type RolloutState, type ToolCallRecord } from '../src/domain/rollout.ts';
import { resumeAfterInfra } from '../src/worker/continuation.ts';
import { markUnfinished } from '../src/worker/env-step.ts';
import { group, multi } from './support/groups.ts';

/** A FAILED rollout of three one-turn steps (2, 3 and 4 tokens), failed by infrastructure. */
function failed(): RolloutState {
  const r = group('t', 0, multi(Status.FAILED, [0, 0], [1, 1, 1], [2, 2, 2, 2])).rollouts[0];
  r.error = 'ERR_ENV_INFRA: the sandbox was lost';
  r.failureKind = 'infrastructure';
  r.finishReason = 'stop';
  return r;
}

function toolCall(source: string | null): ToolCallRecord {
  return { id: 'c1', name: 'read', arguments: '{}', result: 'ok', error: null, source, ms: 1 };
}

describe('an infrastructure failure resumes at the last finished step (worker/continuation.ts)', () => {
  it('keeps the finished steps as they were and drops the one the failure cut short, counting its tokens', () => {
    const r = failed();
    const [first, second, third] = r.turns;
    third.response = 'the reply the sandbox died on';
    markUnfinished(third);
    r.messages = [{ role: 'assistant', content: third.response }];
    resumeAfterInfra(r);
    assert.equal(r.turns.length, 2);
    assert.equal(r.turns[0], first, 'the kept turns are the very records, tokens and model steps untouched');
    assert.equal(r.turns[1], second);
    assert.equal(r.restartedTokens, 4, "the dropped step's tokens are counted thrown away");
    assert.equal(r.attempt, 0, 'the same attempt goes on');
    assert.deepEqual([r.status, r.error, r.failureKind], [Status.INIT, null, undefined]);
    assert.deepEqual(
      r.messages.at(-1),
      { role: 'assistant', content: second.response },
      "the conversation is the last kept step's, not the dropped one's",
    );
  });

  it('keeps every step when the failure came before the next one was recorded (a reset or a prompt that failed)', () => {
    const r = failed();
    resumeAfterInfra(r);
    assert.equal(r.turns.length, 3);
    assert.equal(r.restartedTokens, undefined);
  });

  it('starts from the prompt when nothing was finished', () => {
    const r = failed();
    for (const t of r.turns) markUnfinished(t);
    resumeAfterInfra(r);
    assert.deepEqual([r.turns.length, r.restartedTokens, r.attempt], [0, 9, 1]);
  });

  it('starts from the prompt when a kept step called an MCP server, whose effects a replay does not redo', () => {
    const r = failed();
    r.turns[0].toolCalls = [toolCall('mcp:files')];
    markUnfinished(r.turns[2]);
    resumeAfterInfra(r);
    assert.deepEqual([r.turns.length, r.restartedTokens], [0, 9]);
  });

  it("resumes when the kept steps called only the environment's own tools, which a replay runs again", () => {
    const r = failed();
    r.turns[0].toolCalls = [toolCall('env'), toolCall(null)];
    markUnfinished(r.turns[2]);
    resumeAfterInfra(r);
    assert.deepEqual([r.turns.length, r.restartedTokens], [2, 4]);
  });
});

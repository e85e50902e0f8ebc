/**
 * Rollout groups (src/protocol/rollout.ts): a group's status from its members', a finish reason's
 * rollout status, new groups and their ids, reset to the prompt, and implicit per-token model steps.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { TOKEN_WIRES } from '../src/llm/token-wire.ts';
import {
  fillModelSteps,
  groupStatus,
  newGroup,
  resetToPrompt,
  Status,
  statusForFinishReason,
} from '../src/protocol/rollout.ts';
import { group, multi, sample } from './support/groups.ts';

describe('group status (protocol/rollout.ts groupStatus)', () => {
  const rows: { name: string; members: Status[]; want: Status }[] = [
    { name: 'all COMPLETED → COMPLETED', members: ['COMPLETED', 'COMPLETED', 'COMPLETED'], want: 'COMPLETED' },
    { name: 'a single COMPLETED member → COMPLETED', members: ['COMPLETED'], want: 'COMPLETED' },
    { name: 'one FAILED among COMPLETED → FAILED', members: ['COMPLETED', 'FAILED', 'COMPLETED'], want: 'FAILED' },
    {
      name: 'FAILED beats ABORTED, EXPIRED and FILTERED wherever it sits',
      members: ['FILTERED', 'EXPIRED', 'ABORTED', 'FAILED'],
      want: 'FAILED',
    },
    {
      name: 'ABORTED beats EXPIRED and FILTERED',
      members: ['EXPIRED', 'FILTERED', 'ABORTED', 'COMPLETED'],
      want: 'ABORTED',
    },
    { name: 'EXPIRED beats FILTERED', members: ['FILTERED', 'COMPLETED', 'EXPIRED'], want: 'EXPIRED' },
    { name: 'FILTERED with COMPLETED siblings → FILTERED', members: ['COMPLETED', 'FILTERED'], want: 'FILTERED' },
    { name: 'all ABORTED → ABORTED', members: ['ABORTED', 'ABORTED'], want: 'ABORTED' },
    { name: 'no members → INIT (an empty group is not COMPLETED)', members: [], want: 'INIT' },
    { name: 'COMPLETED + INIT (none of the priority statuses) → INIT', members: ['COMPLETED', 'INIT'], want: 'INIT' },
  ];
  for (const row of rows) {
    it(`gives ${row.want} for [${row.members.join(', ')}]: ${row.name}`, () => {
      const g = newGroup(sample('t', 1), row.members.length);
      row.members.forEach((s, i) => (g.rollouts[i].status = s));
      assert.equal(groupStatus(g.rollouts), row.want);
    });
  }
});

describe('finish reason to rollout status (protocol/rollout.ts statusForFinishReason)', () => {
  const rows: [reason: string, want: Status][] = [
    ['stop', 'COMPLETED'],
    ['length', 'COMPLETED'],
    ['tool_calls', 'COMPLETED'],
    ['abort', 'ABORTED'],
    ['error', 'FAILED'],
    ['content_filter', 'FAILED'],
    ['', 'FAILED'],
    ['STOP', 'COMPLETED'], // compared case-insensitively, like every reader of a reply
    ['Abort', 'ABORTED'],
    ['Content_Filter', 'FAILED'],
  ];
  for (const [reason, want] of rows) {
    it(`maps finish reason ${JSON.stringify(reason)} to ${want}`, () =>
      assert.equal(statusForFinishReason(reason), want));
  }
});

describe('finish reasons read case-insensitively (issue 17 item 16)', () => {
  it('reads a llama.cpp stop_type of "EOS" as stop and "LIMIT" as length (regression: kept as given, the rollout FAILED)', () => {
    const fail = (why: string) => new Error(why);
    const reply = (stop: string) => ({
      tokens: [64],
      stop_type: stop,
      completion_probabilities: [{ id: 64, logprob: -1 }],
    });
    assert.equal(TOKEN_WIRES.llamacpp.parse(reply('EOS'), fail).finishReason, 'stop');
    assert.equal(TOKEN_WIRES.llamacpp.parse(reply('LIMIT'), fail).finishReason, 'length');
    assert.equal(TOKEN_WIRES.llamacpp.parse(reply('Other'), fail).finishReason, 'other');
  });
});

describe('new groups and reset (protocol/rollout.ts)', () => {
  it('newGroup names the group {task}/{drawIndex} and its members {task}/{drawIndex}/{i}, all INIT and sharing the sample', () => {
    const s = sample('math', 7);
    const g = newGroup(s, 3);
    assert.equal(g.id, 'math/7');
    assert.equal(g.taskName, 'math');
    assert.equal(g.status, Status.INIT);
    assert.equal(g.error, null);
    assert.equal(g.sample, s);
    assert.deepEqual(
      g.rollouts.map((r) => [r.id, r.groupId, r.index, r.taskName, r.status]),
      [
        ['math/7/0', 'math/7', 0, 'math', 'INIT'],
        ['math/7/1', 'math/7', 1, 'math', 'INIT'],
        ['math/7/2', 'math/7', 2, 'math', 'INIT'],
      ],
    );
    for (const r of g.rollouts) {
      assert.equal(r.sample, s);
      assert.deepEqual(
        [r.messages, r.turns, r.reward, r.finishReason, r.error, r.workerId],
        [[], [], 0, null, null, null],
      );
    }
  });

  it('newGroup ids depend on the draw index, not the prompt index (draw 12 of prompt 3 → "code/12")', () => {
    const g = newGroup({ taskName: 'code', promptIndex: 3, drawIndex: 12, seed: 0, envParams: {} }, 1);
    assert.deepEqual([g.id, g.rollouts[0].id], ['code/12', 'code/12/0']);
  });

  it('newGroup with size 0 has no members', () => assert.deepEqual(newGroup(sample('t', 0), 0).rollouts, []));

  it('resetToPrompt forgets responses, reward, flags, finish reason and error but keeps identity, sample and timings', () => {
    const g = group('t', 4, multi(Status.FAILED, [3, 4], [5]));
    const r = g.rollouts[0];
    r.truncated = true;
    r.workerId = 2;
    r.timings.totalMs = 99;
    resetToPrompt(r, Status.EXPIRED);
    assert.deepEqual(
      {
        status: r.status,
        messages: r.messages,
        turns: r.turns,
        reward: r.reward,
        terminated: r.terminated,
        truncated: r.truncated,
        finishReason: r.finishReason,
        error: r.error,
      },
      {
        status: 'EXPIRED',
        messages: [],
        turns: [],
        reward: 0,
        terminated: false,
        truncated: false,
        finishReason: null,
        error: null,
      },
    );
    assert.deepEqual(
      [r.id, r.groupId, r.index, r.sample, r.workerId, r.timings.totalMs],
      ['t/4/0', 't/4', 0, g.sample, 2, 99],
    );
  });
});

describe('group status', () => {
  it('is COMPLETED only when every member is, else the first present of FAILED > ABORTED > EXPIRED > FILTERED', () => {
    const g = newGroup({ taskName: 't', promptIndex: 0, drawIndex: 0, seed: 0, envParams: {} }, 3);
    const set = (...s: (typeof Status)[keyof typeof Status][]) => s.forEach((st, i) => (g.rollouts[i].status = st));
    set(Status.COMPLETED, Status.COMPLETED, Status.COMPLETED);
    assert.equal(groupStatus(g.rollouts), Status.COMPLETED);
    set(Status.COMPLETED, Status.ABORTED, Status.FAILED);
    assert.equal(groupStatus(g.rollouts), Status.FAILED);
    set(Status.EXPIRED, Status.ABORTED, Status.COMPLETED);
    assert.equal(groupStatus(g.rollouts), Status.ABORTED);
    set(Status.FILTERED, Status.EXPIRED, Status.COMPLETED);
    assert.equal(groupStatus(g.rollouts), Status.EXPIRED);
  });
});

describe('implicit model steps', () => {
  it('fills a turn whose tokens all have its model step, and keeps explicit (continued) or absent ones', () => {
    const group = newGroup({ taskName: 't', promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} }, 1);
    const base = {
      agentId: null,
      messages: [],
      response: 'r',
      finishReason: 'stop' as const,
      promptIds: null,
      logprobs: null,
      seed: null,
      reward: 0,
      terminated: false,
      truncated: false,
      trainable: true,
      timings: { inferenceMs: 0, envMs: 0, totalMs: 0 },
    };
    group.rollouts[0].turns.push(
      { ...base, step: 1, responseIds: Int32Array.of(5, 6, 7), modelSteps: null, modelStep: 4 },
      { ...base, step: 2, responseIds: Int32Array.of(8, 9), modelSteps: Int32Array.of(3, 4), modelStep: 4 },
      { ...base, step: 3, responseIds: null, modelSteps: null, modelStep: 4 },
    );
    const [implicit, continued, noIds] = fillModelSteps(group).rollouts[0].turns;
    assert.deepEqual(implicit.modelSteps, Int32Array.of(4, 4, 4));
    assert.deepEqual(continued.modelSteps, Int32Array.of(3, 4));
    assert.equal(noIds.modelSteps, null);
  });
});

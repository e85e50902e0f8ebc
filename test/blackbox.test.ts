import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { createEngine, Status, type Engine } from '../src/index.ts';
import { decodeMessage, encodeMessage } from '../src/protocol/codec.ts';
import { decodeCheckpoint, encodeCheckpoint } from '../src/formats/checkpoint-file.ts';
import { toJson } from '../src/formats/peer.ts';
import { compactGroup, expandGroup } from '../src/formats/compact.ts';
import { PROTOCOL_VERSION, type GroupResultMessage } from '../src/protocol/messages.ts';
import type { RolloutGroup } from '../src/domain/rollout.ts';
import { startMockLlm } from '../src/mock-llm/server.ts';
import { mockSupport, type MockRouting } from '../src/mock-llm/routing.ts';
import { assertCallRows, assertRowsOnTokens } from './support/routing.ts';

const AGENT = new URL('./fixtures/blackbox-agent.ts', import.meta.url).pathname;

/** Each rollout's stitched sample comes back unchanged over the thread codec and from a (compact) checkpoint. */
function assertStitchedSurvivesTravel(group: RolloutGroup): void {
  const overThread = decodeMessage(
    encodeMessage({
      v: PROTOCOL_VERSION,
      type: 'group-result',
      group,
      keptTurns: group.rollouts.map(() => 0),
      workerId: 0,
    }),
  ) as GroupResultMessage;
  const fromCheckpoint = expandGroup(
    (
      decodeCheckpoint(encodeCheckpoint({ v: 2, group: compactGroup(group) }), 'test') as unknown as {
        group: RolloutGroup;
      }
    ).group,
    'test',
  );
  for (const copy of [overThread.group, fromCheckpoint])
    assert.deepEqual(
      copy.rollouts.map((r) => r.stitched),
      group.rollouts.map((r) => r.stitched),
    );
}

describe('black-box agents through the token-trace gateway', () => {
  const engines: Engine[] = [];
  after(() => Promise.all(engines.map((e) => e.close())));

  it('runs an OpenAI-client agent inside the workers and stitches each session into one training sample', async () => {
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      workers: { threads: 1 },
      tasks: [{ name: 'bb-math', env: { module: 'builtin:arithmetic' }, agent: { module: AGENT }, groupSize: 2 }],
    });
    engines.push(engine);
    await engine.start();
    const batch = await engine.getBatch();
    assert.equal(batch.status, 'NORMAL');
    for (const rollout of batch.groups.flatMap((g) => g.rollouts)) {
      assert.equal(rollout.status, Status.COMPLETED, rollout.error ?? '');
      assert.ok(rollout.reward === 0 || rollout.reward === 1, 'the environment judged the final answer');
      assert.equal(rollout.turns.length, 2, 'one turn per inference call of the agent');
      const s = rollout.stitched!;
      assert.ok(s, 'the session was stitched');
      assert.equal(s.actionRanges.length, 2);
      rollout.turns.forEach((turn, i) => {
        const [start, end] = s.actionRanges[i];
        assert.deepEqual(
          [...s.observationTokens.subarray(start, end)],
          [...turn.responseIds!],
          `action ${i} is exactly the completion`,
        );
        assert.deepEqual([...s.rolloutLogprobs.subarray(start, end)], [...turn.logprobs!]);
        // the call's prompt is the observation up to where its completion starts
        assert.deepEqual([...turn.promptIds!], [...s.observationTokens.subarray(0, start)]);
      });
      assert.equal(s.observationTokens.length, s.actionRanges[1][1]);
    }
  });

  it("keeps an agent's side calls out of its turns and its sample, and carries them beside the sample in rollout.stitched.sideCalls, through the thread codec and checkpoints", async () => {
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 1,
      workers: { threads: 1 },
      tasks: [
        {
          name: 'bb-side',
          env: { module: 'builtin:arithmetic' },
          agent: { module: new URL('./fixtures/blackbox-side-call-agent.ts', import.meta.url).pathname },
          groupSize: 2,
        },
      ],
    });
    engines.push(engine);
    await engine.start();
    const batch = await engine.getBatch();
    const group = batch.groups[0] as RolloutGroup;
    for (const rollout of group.rollouts) {
      assert.equal(rollout.status, Status.COMPLETED, rollout.error ?? '');
      assert.equal(rollout.turns.length, 2, 'the two turns of the conversation; the judge is not a turn');
      const s = rollout.stitched!;
      assert.equal(s.actionRanges.length, 2);
      rollout.turns.forEach((turn, i) => {
        const [start, end] = s.actionRanges[i];
        assert.deepEqual(
          [...s.observationTokens.subarray(start, end)],
          [...turn.responseIds!],
          `action ${i} is turn ${i}'s completion`,
        );
        assert.deepEqual([...turn.promptIds!], [...s.observationTokens.subarray(0, start)]);
      });
      assert.equal(s.sideCalls?.length, 1);
      const [side] = s.sideCalls!;
      assert.equal(side.index, 1, "the judge was the session's second call");
      assert.equal(side.finishReason, 'stop');
      assert.ok(side.completionIds.length > 0);
      assert.equal(side.logprobs.length, side.completionIds.length);
      assert.ok([...side.logprobs].every((lp) => lp < 0));
      const observation = [...s.observationTokens];
      assert.notDeepEqual(
        [...side.promptIds],
        observation.slice(0, side.promptIds.length),
        'its prompt is its own, not a prefix of the sample',
      );
    }

    // What the rollout carries survives every way a group travels: the thread codec, a checkpoint
    // (compact form), and JSON for a trainer.
    assertStitchedSurvivesTravel(group);
    const json = JSON.parse(toJson(group)) as {
      rollouts: { stitched: { sideCalls: { promptIds: number[]; logprobs: number[] }[] } }[];
    };
    assert.deepEqual(json.rollouts[0].stitched.sideCalls[0].promptIds, [
      ...group.rollouts[0].stitched!.sideCalls![0].promptIds,
    ]);
  });

  it("carries each session's routed experts and sampling masks (SGLang) on its stitched sample, every position's row the one its token was routed to there, through the thread codec and checkpoints", async () => {
    const routing: MockRouting = { layers: 3, topK: 2, experts: 48 };
    const mock = await startMockLlm({
      dialect: 'sglang',
      tokenizer: 'qwen2.5',
      thinkTokens: 4,
      routedExperts: routing,
    });
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 1,
      workers: { threads: 1 },
      llm: { url: mock.url, routedExperts: { layers: routing.layers, topK: routing.topK }, samplingMasks: true },
      gateway: { backend: 'sglang' },
      tasks: [
        {
          name: 'bb-routing',
          env: { module: 'builtin:arithmetic' },
          agent: { module: new URL('./fixtures/blackbox-routing-agent.ts', import.meta.url).pathname },
          groupSize: 2,
        },
      ],
    });
    engines.push(engine);
    try {
      await engine.start();
      const batch = await engine.getBatch();
      const group = batch.groups[0] as RolloutGroup;
      for (const rollout of group.rollouts) {
        assert.equal(rollout.status, Status.COMPLETED, rollout.error ?? '');
        const s = rollout.stitched!;
        assert.equal(s.actionRanges.length, 2);
        assertRowsOnTokens(s.routedExperts!, s.observationTokens, routing);
        const mask = s.samplingMask!;
        for (let p = 0; p < s.observationTokens.length; p++) {
          const inAction = s.actionRanges.some(([a, b]) => p >= a && p < b);
          assert.deepEqual(
            [...mask.ids.subarray(mask.offsets[p], mask.offsets[p + 1])],
            inAction ? mockSupport(s.observationTokens[p], p) : [],
            `support of position ${p}`,
          );
        }
        const [side] = s.sideCalls!;
        assertCallRows(side.routedExperts!, [...side.promptIds, ...side.completionIds], routing);
        assert.equal(side.samplingMask!.offsets.length, side.completionIds.length + 1);
      }
      assertStitchedSurvivesTravel(group);
    } finally {
      await engine.close();
      await mock.close();
    }
  });

  it('fails a rollout whose agent returns no reward when no environment can judge it, naming why (regression: kept with a silent reward of 0)', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'bb-noenv-'));
    const dataset = join(dir, 'prompts.jsonl');
    writeFileSync(
      dataset,
      `${JSON.stringify({ messages: [{ role: 'user', content: 'What is 2 + 3?' }], label: '5' })}\n`,
    );
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 1,
      workers: { threads: 1 },
      producer: { maxFailedGroupsPerStep: 1 },
      tasks: [{ name: 'bb-noenv', env: null, dataset, agent: { module: AGENT }, groupSize: 1 }],
    });
    engines.push(engine);
    await engine.start();
    await assert.rejects(engine.getBatch(), {
      message:
        /ERR_AGENT_NO_REWARD: the black-box agent returned no reward, and its task has no environment to judge an answer/,
    });
  });

  it('fails a rollout whose agent returns a reward that is not a finite number (regression: NaN reached the batch and the checkpoint as null)', async () => {
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 1,
      workers: { threads: 1 },
      producer: { maxFailedGroupsPerStep: 1 },
      tasks: [
        {
          name: 'bb-nan',
          env: { module: 'builtin:arithmetic' },
          agent: { module: new URL('./fixtures/blackbox-nan-agent.ts', import.meta.url).pathname },
          groupSize: 1,
        },
      ],
    });
    engines.push(engine);
    await engine.start();
    await assert.rejects(engine.getBatch(), {
      message: /ERR_AGENT_BAD_REWARD: the black-box agent returned reward NaN: a reward must be a finite number/,
    });
  });

  it('rejects a task without an environment and without a black-box agent, naming the field', () => {
    assert.throws(() => createEngine({ tasks: [{ name: 'x', env: null }] }), {
      code: 'ERR_INVALID_CONFIG',
      message: /tasks\[0\]\.env: a task needs an env/,
    });
  });
});

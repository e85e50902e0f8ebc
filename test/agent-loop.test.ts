/**
 * The agent loop (src/worker/agent-loop.ts runEpisode) driven directly: a scripted inference client
 * and a small in-process environment, no HTTP and no worker thread. Each test pins one thing the loop
 * promises about a rollout: what a turn records, how an episode ends, and what a failure or a pause
 * leaves behind.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { ChatRequest } from '../src/llm/request.ts';
import type { ChatResult } from '../src/llm/reply.ts';
import type { Environment, StepResult } from '../src/env/types.ts';
import { runEpisode } from '../src/worker/agent-loop.ts';
import { resumeAfterInfra } from '../src/worker/continuation.ts';
import { LlmError } from '../src/llm/errors.ts';
import { EnvError } from '../src/env/errors.ts';
import { omitKeptTurns, receivedTurns, restoreKeptTurns } from '../src/protocol/result-delta.ts';
import type { AgentSettings, ChatClient, EpisodeContext, PauseView } from '../src/worker/episode-context.ts';
import type { ToolSettings } from '../src/worker/tools.ts';
import { newGroup, Status, type RolloutState } from '../src/domain/rollout.ts';
import { sample, turn } from './support/groups.ts';
import { deferred } from './support/waits.ts';
import { NO_EXPIRY } from '../src/protocol/control-block.ts';

const SETTINGS: AgentSettings = {
  maxSteps: 5,
  messageCut: 0,
  maxTokens: 16,
  temperature: 1,
  partialRollout: true,
  sendSeed: false,
};

/** Tool settings for the tests whose episodes have tools (no MCP server). */
const TOOLS: ToolSettings = { maxCallsPerTurn: 4, timeoutMs: 1000, toolChoice: 'auto', mcp: [], mcpSessions: 'worker' };

/** What a reply whose prompt re-renders the history carries (llm.historyMode split). */
const SPLIT = { mode: 'split', token: 3, char: 10, sampledText: 'a', renderedText: 'b' } as const;

/** A reply with token ids 7, 8, … and logprobs −0.5, −1, … for `content` (one token per character). */
function reply(content: string, overrides: Partial<ChatResult> = {}): ChatResult {
  const n = content.length;
  return {
    content,
    finishReason: 'stop',
    promptIds: Int32Array.of(1, 2, 3),
    responseIds: Int32Array.from({ length: n }, (_, i) => 7 + i),
    logprobs: Float32Array.from({ length: n }, (_, i) => -0.5 * (i + 1)),
    weightVersion: '3',
    promptTokens: 3,
    completionTokens: n,
    ...overrides,
  };
}

/** Answers the n-th call with `script[n]`; records every request. */
function scriptedClient(
  script: ((request: ChatRequest, signal: AbortSignal) => Promise<ChatResult>)[],
): ChatClient & { requests: ChatRequest[] } {
  const requests: ChatRequest[] = [];
  return {
    requests,
    chat(request, signal) {
      requests.push(request);
      const next = script.shift();
      if (next === undefined) return Promise.reject(new Error(`no scripted reply for call ${requests.length}`));
      return next(request, signal as AbortSignal);
    },
  };
}

/**
 * Counts to `terminateAt` (never, when null): each step's reward is the step number, and the prompt
 * grows by the action. `failAt`: step() throws on that step.
 */
function countingEnv({
  terminateAt = null,
  failAt = null,
}: {
  terminateAt?: number | null;
  failAt?: number | null;
} = {}): Environment & { actions: string[] } {
  const actions: string[] = [];
  return {
    actions,
    reset() {
      actions.length = 0;
      return { observation: null };
    },
    getTaskPrompt: () => [
      { role: 'user', content: 'Count.' },
      ...actions.map((a) => ({ role: 'assistant' as const, content: a })),
    ],
    step(action): StepResult {
      actions.push(String(action));
      const n = actions.length;
      if (n === failAt) throw new Error(`the counter broke at step ${n}`);
      return { observation: null, reward: n, terminated: n === terminateAt, truncated: false, info: { n } };
    },
  };
}

/** A pause flag and signal as a worker's PauseGate gives them; version "3" is model step 3. */
function testGate(): { -readonly [K in keyof PauseView]: PauseView[K] } & { pause(): void } {
  const controller = new AbortController();
  return {
    paused: false,
    modelStep: 3,
    oldestUsefulStep: NO_EXPIRY,
    signal: controller.signal,
    signalFor: () => controller.signal,
    stepOfVersion: (version) => (version === null ? 3 : Number(version)),
    pause() {
      this.paused = true;
      controller.abort();
    },
  };
}

function episode(
  env: Environment,
  llm: ChatClient,
  gate: PauseView = testGate(),
  settings: Partial<AgentSettings> = {},
) {
  const released: boolean[] = [];
  const ctx: EpisodeContext = {
    actors: { acquire: async () => env, done: async (_env, failed) => void released.push(failed) },
    llm,
    settings: { ...SETTINGS, ...settings },
    gate,
    workerId: 1,
  };
  const rollout: RolloutState = newGroup(sample('count', 0), 1).rollouts[0];
  return { ctx, rollout, released };
}

const answer =
  (content: string, overrides: Partial<ChatResult> = {}) =>
  async () =>
    reply(content, overrides);

/**
 * One episode of a counting environment that serves the tool `look` (answered "seen"): its first reply
 * calls it, `second` answers the tool round. Returns the rollout once the episode ended.
 */
async function toolRoundEpisode(
  second: (request: ChatRequest, signal: AbortSignal) => Promise<ChatResult>,
  env: { terminateAt?: number | null; failAt?: number | null },
): Promise<RolloutState> {
  const llm = scriptedClient([answer('call', { toolCalls: [{ id: 'c1', name: 'look', arguments: '{}' }] }), second]);
  const tooled = {
    ...countingEnv(env),
    tools: () => [{ type: 'function' as const, function: { name: 'look', parameters: {} } }],
    callTool: () => 'seen',
  };
  const { ctx, rollout } = episode(tooled, llm, testGate(), { tools: TOOLS });
  await runEpisode(rollout, ctx);
  return rollout;
}

describe('agent loop (worker/agent-loop.ts runEpisode)', () => {
  it('records each turn with its prompt, the reply token ids and logprobs, the model step that made them and the step reward', async () => {
    const llm = scriptedClient([answer('one'), answer('two')]);
    const { ctx, rollout } = episode(countingEnv({ terminateAt: 2 }), llm);
    await runEpisode(rollout, ctx);
    assert.equal(rollout.status, Status.COMPLETED);
    assert.deepEqual(
      rollout.turns.map((t) => [t.step, t.response, t.reward, t.modelStep]),
      [
        [1, 'one', 1, 3],
        [2, 'two', 2, 3],
      ],
    );
    const [first] = rollout.turns;
    assert.deepEqual(first.promptIds, Int32Array.of(1, 2, 3));
    assert.deepEqual(first.responseIds, Int32Array.of(7, 8, 9));
    assert.deepEqual(first.logprobs, Float32Array.of(-0.5, -1, -1.5));
    assert.deepEqual(
      llm.requests[1].messages,
      [
        { role: 'user', content: 'Count.' },
        { role: 'assistant', content: 'one' },
      ],
      'the second call sees the first reply',
    );
    assert.equal(rollout.reward, 1 + 2);
  });

  it('ends COMPLETED and terminated at the step the environment terminates, with no call after it', async () => {
    const llm = scriptedClient([answer('a'), answer('b'), answer('c')]);
    const env = countingEnv({ terminateAt: 2 });
    const { ctx, rollout, released } = episode(env, llm);
    await runEpisode(rollout, ctx);
    assert.equal(rollout.status, Status.COMPLETED);
    assert.deepEqual(
      [rollout.terminated, rollout.truncated, rollout.turns.length, llm.requests.length],
      [true, false, 2, 2],
    );
    assert.equal(rollout.turns.at(-1)!.terminated, true);
    assert.deepEqual(released, [false], 'the actor goes back to its pool as sound');
  });

  it('stops after maxSteps and marks the rollout truncated, not terminated', async () => {
    const llm = scriptedClient([answer('a'), answer('b'), answer('c'), answer('d')]);
    const { ctx, rollout } = episode(countingEnv(), llm, testGate(), { maxSteps: 3 });
    await runEpisode(rollout, ctx);
    assert.equal(rollout.status, Status.COMPLETED);
    assert.deepEqual(
      [rollout.terminated, rollout.truncated, rollout.turns.length, llm.requests.length],
      [false, true, 3, 3],
    );
  });

  it('trains on the last step of an episode that ran out of steps with the whole conversation sent (regression: it had no trainable turn)', async () => {
    const llm = scriptedClient([answer('a'), answer('b'), answer('c')]);
    const { ctx, rollout } = episode(countingEnv(), llm, testGate(), { maxSteps: 3, messageCut: 0 });
    await runEpisode(rollout, ctx);
    assert.equal(rollout.status, Status.COMPLETED);
    assert.deepEqual(
      rollout.turns.map((t) => [t.trainable, t.truncated]),
      [
        [false, false],
        [false, false],
        [true, true],
      ],
    );
  });

  it('stops a rollout at its next turn once its oldest token can no longer be taken, instead of generating what landing resets', async () => {
    const gate = testGate();
    const llm = scriptedClient([
      async () => {
        // The trainer moves on while the first turn is generated at model step 3: tokens older than step 4 expire.
        gate.oldestUsefulStep = 4;
        return reply('one');
      },
      answer('two'),
    ]);
    const { ctx, rollout } = episode(countingEnv(), llm, gate, { maxSteps: 4 });
    await runEpisode(rollout, ctx);
    assert.equal(rollout.status, Status.ABORTED, 'landed as interrupted: the buffer expires it and counts its tokens');
    assert.deepEqual([rollout.turns.length, llm.requests.length], [1, 1], 'no call after the turn that made it stale');
  });

  it('takes no actor and replays nothing for an interrupted rollout that expired while it waited to continue', async () => {
    const llm = scriptedClient([answer('one'), answer('two')]);
    const { ctx, rollout, released } = episode(countingEnv(), llm);
    rollout.turns = [turn([3, 3], { modelStep: 3, response: 'pa' })];
    rollout.status = Status.ABORTED;
    const gate = testGate();
    gate.oldestUsefulStep = 4; // its tokens are of step 3
    await runEpisode(rollout, { ...ctx, gate });
    assert.equal(rollout.status, Status.ABORTED);
    assert.deepEqual([released.length, llm.requests.length, rollout.turns.length], [0, 0, 1]);
  });

  it('tags a turn kept across an in-place pause with the weights it began on, not the newer ones its reply names', async () => {
    const gate = testGate();
    const llm = scriptedClient([
      async () => {
        gate.modelStep = 4; // new weights loaded while the server kept this call
        return reply('one', { weightVersion: '4' });
      },
    ]);
    const { ctx, rollout } = episode(countingEnv({ terminateAt: 1 }), llm, gate);
    await runEpisode(rollout, ctx);
    assert.equal(rollout.turns[0].modelStep, 3);
  });

  it('plays on while its oldest token is still young enough to be taken', async () => {
    const gate = testGate();
    gate.oldestUsefulStep = 3; // the rollout's tokens are of step 3: not older
    const llm = scriptedClient([answer('one'), answer('two')]);
    const { ctx, rollout } = episode(countingEnv({ terminateAt: 2 }), llm, gate);
    await runEpisode(rollout, ctx);
    assert.equal(rollout.status, Status.COMPLETED);
    assert.equal(rollout.turns.length, 2);
  });

  it('fails the rollout with the environment error when a step throws, keeping the turns so far and recycling the actor', async () => {
    const llm = scriptedClient([answer('a'), answer('b')]);
    const { ctx, rollout, released } = episode(countingEnv({ failAt: 2 }), llm);
    await runEpisode(rollout, ctx);
    assert.equal(rollout.status, Status.FAILED);
    assert.match(rollout.error ?? '', /the counter broke at step 2/);
    assert.deepEqual(
      rollout.turns.map((t) => [t.response, t.reward]),
      [
        ['a', 1],
        ['b', 0],
      ],
      'the reply the environment failed on is recorded, unrewarded',
    );
    assert.deepEqual(released, [true], 'an actor whose step threw is not reused');
  });

  it('goes on after an infrastructure failure from the last step the environment finished: replayed on a fresh actor, the failed step played again', async () => {
    const llm = scriptedClient([answer('a'), answer('bb'), answer('cc'), answer('d')]);
    const first = episode(countingEnv({ failAt: 2 }), llm);
    await runEpisode(first.rollout, first.ctx);
    assert.equal(first.rollout.status, Status.FAILED);
    const kept = first.rollout.turns[0];
    resumeAfterInfra(first.rollout); // as the worker does for a failure of kind infrastructure
    const fresh = countingEnv({ terminateAt: 3 });
    const second = episode(fresh, llm);
    await runEpisode(first.rollout, second.ctx);
    const r = first.rollout;
    assert.equal(r.status, Status.COMPLETED);
    assert.deepEqual(
      r.turns.map((t) => [t.step, t.response, t.reward]),
      [
        [1, 'a', 1],
        [2, 'cc', 2],
        [3, 'd', 3],
      ],
    );
    assert.equal(r.turns[0], kept, 'the finished step is kept as it was, not generated again');
    assert.deepEqual(fresh.actions, ['a', 'cc', 'd'], 'the fresh actor replayed step 1, then played on');
    assert.equal(r.restartedTokens, 2, "the failed step's reply (2 tokens) is counted thrown away");
    assert.equal(llm.requests.length, 4, 'one call a step, and one for the step played again');
  });

  // Regression: when one agent's call of a multi-agent step failed, the step was dropped with the
  // other agents' finished replies, which no count of produced or thrown-away tokens saw.
  it("counts thrown away the other agents' replies of a multi-agent step one agent's call ended", async () => {
    const twoAgents: Environment = {
      reset: () => ({ observation: null }),
      getTaskPrompt: () => ({ a: [{ role: 'user', content: 'A' }], b: [{ role: 'user', content: 'B' }] }),
      step: () => ({ observation: null, reward: 1, terminated: false, truncated: false, info: {} }),
    };
    const llm = scriptedClient([
      answer('x'),
      answer('y'),
      answer('aaa'),
      answer('', { contextExceeded: 'the prompt is 9000 tokens, the context 8192' }),
    ]);
    const { ctx, rollout } = episode(twoAgents, llm);
    await runEpisode(rollout, ctx);
    assert.equal(rollout.status, Status.COMPLETED);
    assert.ok(rollout.truncated, 'the conversation outgrew the context: the episode ends truncated');
    assert.deepEqual(
      rollout.turns.map((t) => [t.step, t.agentId, t.response]),
      [
        [1, 'a', 'x'],
        [1, 'b', 'y'],
      ],
    );
    assert.equal(rollout.restartedTokens, 3, "agent a's reply at step 2 (3 tokens) is counted thrown away");

    // A call that fails the rollout: the other agent's reply stays with the failed step, to go as the
    // failed rollout's (its group dropped), not as generated again.
    const failing = scriptedClient([
      answer('x'),
      answer('y'),
      answer('aaa'),
      () => Promise.reject(new LlmError('ERR_LLM_BAD_REPLY', 'choices[0] is missing')),
    ]);
    const second = episode(twoAgents, failing);
    await runEpisode(second.rollout, second.ctx);
    assert.equal(second.rollout.status, Status.FAILED);
    assert.deepEqual(
      second.rollout.turns.map((t) => [t.step, t.agentId, t.response]),
      [
        [1, 'a', 'x'],
        [1, 'b', 'y'],
        [2, 'a', 'aaa'],
      ],
    );
    assert.equal(second.rollout.restartedTokens, undefined);
  });

  it("plays a continued rollout again from its prompt where a step it keeps called an MCP server whose session was the episode's own", async () => {
    const run = async (mcpSessions: 'episode' | 'worker') => {
      const llm = scriptedClient([answer('x'), answer('y')]);
      const { ctx, rollout } = episode(countingEnv({ terminateAt: 2 }), llm, testGate(), {
        tools: { ...TOOLS, mcpSessions },
      });
      const call = { id: 'c1', name: 'remember', arguments: '{}', result: 'ok', error: null, ms: 1 };
      rollout.turns = [
        {
          ...turn([3], { response: 'a' }),
          terminated: false,
          trainable: false,
          toolCalls: [{ ...call, source: 'mcp:http://127.0.0.1:9/mcp' }],
        },
      ];
      rollout.status = Status.ABORTED; // paused between its steps
      await runEpisode(rollout, ctx);
      assert.equal(rollout.status, Status.COMPLETED);
      return { rollout, sent: llm.requests.map((r) => r.messages.map((m) => m.content).join('|')) };
    };
    const own = await run('episode');
    assert.deepEqual(own.sent, ['Count.', 'Count.|x'], 'a fresh session lacks what step 1 did: played from the prompt');
    assert.deepEqual(
      own.rollout.turns.map((t) => t.response),
      ['x', 'y'],
    );
    assert.equal(own.rollout.restartedTokens, 1, 'the kept reply is counted thrown away');
    const shared = await run('worker');
    assert.deepEqual(shared.sent, ['Count.|a'], "a worker's shared session: continued from step 2");
  });

  // Regression: a split (llm.historyMode 'split') marked the turn before it as a segment end in place;
  // on a continued rollout that turn was one it arrived with, which the worker's result leaves out as
  // unchanged (protocol/result-delta.ts), so the coordinator kept its own unmarked copy and the
  // segment it ended was never trained on.
  it('sends back the segment end a split marks on a turn the rollout arrived with', async () => {
    const llm = scriptedClient([answer('bb', { historyRewrite: SPLIT })]);
    const { ctx, rollout } = episode(countingEnv({ terminateAt: 2 }), llm);
    const group = { ...newGroup(sample('count', 0), 1), rollouts: [rollout] };
    rollout.turns = [{ ...turn([3], { response: 'a' }), terminated: false, trainable: false }];
    rollout.status = Status.ABORTED; // paused between its steps: continued from step 2
    const sent = structuredClone(group);
    const received = receivedTurns(group);
    await runEpisode(rollout, ctx);
    assert.equal(rollout.status, Status.COMPLETED);
    const kept = omitKeptTurns(group, received);
    const back = restoreKeptTurns(structuredClone(group), sent, kept);
    assert.deepEqual(
      back.rollouts[0].turns.map((t) => [t.step, t.historyRewrite, t.trainable]),
      [
        [1, undefined, true],
        [2, 'split', true],
      ],
      'step 1 ends the first segment, step 2 the second',
    );
  });

  it("ends the segment on the tool-calling reply a split follows within one step, flagged as the step's turn it is", async () => {
    const run = (failAt: number | null) =>
      toolRoundEpisode(answer('done', { historyRewrite: SPLIT }), { terminateAt: 1, failAt });
    const done = await run(null);
    assert.equal(done.status, Status.COMPLETED);
    assert.deepEqual(
      done.turns.map((t) => [t.response, t.historyRewrite, t.trainable, t.terminated]),
      [
        ['call', undefined, true, true],
        ['done', 'split', true, true],
      ],
      'the environment ended the step on both turns; the first also ends a segment',
    );
    const failed = await run(1);
    assert.equal(failed.status, Status.FAILED);
    resumeAfterInfra(failed); // as the worker does for a failure of kind infrastructure
    assert.deepEqual(failed.turns, [], 'the step the failure cut short is dropped whole, its tool-calling reply too');
  });

  it('drops a tool round interrupted by a pause, counted thrown away, and keeps the turns of one that failed, to be thrown away with the rollout', async () => {
    const run = (second: LlmError | null, reply = answer('unused')) =>
      toolRoundEpisode(second === null ? reply : () => Promise.reject(second), { terminateAt: 2 });
    const paused = await run(new LlmError('ERR_LLM_ABORTED', 'paused for a weight update'));
    assert.equal(paused.status, Status.ABORTED);
    assert.deepEqual(paused.turns, [], 'a continuation plays the step again whole');
    assert.equal(paused.restartedTokens, 4, "the tool-calling reply's 4 tokens, generated again");
    const failed = await run(new LlmError('ERR_LLM_BAD_REPLY', 'choices[0] is missing'));
    assert.equal(failed.status, Status.FAILED);
    assert.deepEqual(
      failed.turns.map((t) => t.response),
      ['call'],
    );
    assert.equal(
      failed.restartedTokens,
      undefined,
      'nothing is generated again: the tokens go with the failed rollout',
    );
    const odd = await run(null, answer('hm', { finishReason: 'content_filter' }));
    assert.equal(odd.status, Status.FAILED);
    assert.deepEqual(
      [odd.turns.map((t) => t.response), odd.finishReason, odd.restartedTokens],
      [['call', 'hm'], 'content_filter', undefined],
      'a reply ending otherwise fails the rollout, recorded as its last turn',
    );
  });

  // Regression: a pause that cancelled the environment's `step` left the step's reply in the ABORTED
  // rollout; the continuation replayed it as a finished step and, where the environment rewarded it,
  // found the record disagreeing and played the whole rollout again from its prompt.
  it('drops the step whose environment call a pause cancelled, counted thrown away, and plays it again after the resume', async () => {
    const cancelling: Environment & { actions: string[] } = {
      ...countingEnv({ terminateAt: 2 }),
      step(action): StepResult {
        if (String(action) === 'bb') throw new EnvError('ERR_ENV_CANCELLED', 'environment step() was still pending');
        return { observation: null, reward: 1, terminated: false, truncated: false, info: {} };
      },
    };
    const llm = scriptedClient([answer('a'), answer('bb'), answer('cc')]);
    const first = episode(cancelling, llm);
    await runEpisode(first.rollout, first.ctx);
    const r = first.rollout;
    assert.equal(r.status, Status.ABORTED);
    assert.deepEqual(
      r.turns.map((t) => [t.step, t.response]),
      [[1, 'a']],
      'only the step the environment finished',
    );
    assert.equal(r.restartedTokens, 2, "the cut step's reply, counted thrown away");
    assert.deepEqual(
      [r.messages.at(-1)?.content, r.finishReason],
      ['a', 'stop'],
      "the conversation is the kept step's again",
    );
    const fresh = countingEnv({ terminateAt: 2 });
    const second = episode(fresh, llm);
    await runEpisode(r, second.ctx);
    assert.equal(r.status, Status.COMPLETED);
    assert.deepEqual(
      r.turns.map((t) => [t.step, t.response, t.reward]),
      [
        [1, 'a', 1],
        [2, 'cc', 2],
      ],
    );
    assert.deepEqual(fresh.actions, ['a', 'cc'], 'step 1 replayed, step 2 played again');
  });

  it('comes back ABORTED with the tokens generated so far when a pause aborts a call, and continues from them after the resume', async () => {
    const called = deferred();
    const gate = testGate();
    const llm = scriptedClient([
      // The server stops generating when the pause reaches it, answering with what it has.
      (_request, signal) => {
        called.resolve();
        return new Promise((resolve) =>
          signal.addEventListener('abort', () => resolve(reply('pa', { finishReason: 'abort' })), { once: true }),
        );
      },
      answer('rt', { responseIds: Int32Array.of(20, 21), weightVersion: '4' }),
    ]);
    const env = countingEnv({ terminateAt: 1 });
    const { ctx, rollout } = episode(env, llm, gate);
    const running = runEpisode(rollout, ctx);
    await called.promise;
    gate.pause();
    await running;
    assert.equal(rollout.status, Status.ABORTED);
    assert.equal(rollout.error, null);
    assert.deepEqual(
      rollout.turns.map((t) => [t.finishReason, t.response, [...t.responseIds!]]),
      [['abort', 'pa', [7, 8]]],
    );
    assert.deepEqual(env.actions, [], 'the environment never saw the unfinished reply');

    // Resumed on model step 4: the partial turn is continued, not generated again.
    const resumed = testGate();
    resumed.modelStep = 4;
    await runEpisode(rollout, { ...ctx, gate: resumed });
    assert.equal(rollout.status, Status.COMPLETED);
    assert.equal(llm.requests[1].continueFrom, 'pa');
    assert.equal(llm.requests[1].maxTokens, SETTINGS.maxTokens - 2, 'max_tokens less what the partial turn has');
    const [turn] = rollout.turns;
    assert.deepEqual(
      [turn.response, [...turn.responseIds!], [...turn.modelSteps!]],
      ['part', [7, 8, 20, 21], [3, 3, 4, 4]],
    );
    assert.deepEqual(env.actions, ['part']);
  });

  it('comes back ABORTED, not FAILED, when a pause cancels a call on the client side', async () => {
    const called = deferred();
    const gate = testGate();
    const llm = scriptedClient([
      (_request, signal) => {
        called.resolve();
        return new Promise((_, reject) =>
          signal.addEventListener(
            'abort',
            () => reject(Object.assign(new Error('cancelled by a pause'), { code: 'ERR_LLM_ABORTED' })),
            { once: true },
          ),
        );
      },
    ]);
    const { ctx, rollout, released } = episode(countingEnv(), llm, gate);
    const running = runEpisode(rollout, ctx);
    await called.promise;
    gate.pause();
    await running;
    assert.equal(rollout.status, Status.ABORTED);
    assert.deepEqual(rollout.turns, []);
    assert.deepEqual(released, [false], 'an interrupted call says nothing against the actor');
  });
});

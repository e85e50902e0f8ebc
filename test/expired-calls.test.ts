/**
 * A rollout whose oldest token the consumer has moved past is reset on landing whatever it generates
 * next, so the reply it is waiting for is cut at once instead of decoded to its end
 * (worker/pause-gate.ts signalFor, coordinator/pause-control.ts setOldestUsefulStep).
 *
 * What cutting the connection does on the servers, read from their source:
 * - vLLM: `/v1/chat/completions` is wrapped in `@with_cancellation`
 *   (vllm/entrypoints/openai/chat_completion/api_router.py @c0bc59655a4068c08621bcac8ab67b39cd2ec173),
 *   which cancels the handler when the ASGI `http.disconnect` message arrives, and with it the
 *   request's generation (vllm/entrypoints/utils.py @97c10e4485f6dc98ff9b959a06d78828ffd00a07).
 * - llama.cpp (tools/server/server-context.cpp, server-queue.cpp @de3ff815ea7d559ee917f063901b8986f038abc6):
 *   a streamed reply stops at its next token; a non-streamed one waits in `rd.wait_for_all(req.should_stop)`
 *   and checks httplib's `is_connection_closed` only when a 1 s wait for results times out, so under
 *   load it runs to its end — both pinned in test/real-server/llama-server.test.ts ("stopping a
 *   generation"). Against llama.cpp the cut saves the server's time with `llm.stream` only.
 * - the mock: its scheduler stops the sequence when the response closes (src/mock-llm/scheduler.ts).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { PauseControl } from '../src/coordinator/pause-control.ts';
import { newGroup, Status } from '../src/domain/rollout.ts';
import type { Environment } from '../src/env/types.ts';
import { LlmClient } from '../src/llm/client.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/server.ts';
import { NO_EXPIRY } from '../src/protocol/control-block.ts';
import { runEpisode } from '../src/worker/agent-loop.ts';
import type { EpisodeContext } from '../src/worker/episode-context.ts';
import { PauseGate } from '../src/worker/pause-gate.ts';
import { TEST_CLIENT } from './support/clients.ts';
import { sample } from './support/groups.ts';

/** Resolves with the signal's reason once it aborts. */
function aborted(signal: AbortSignal): Promise<unknown> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve(signal.reason);
    else signal.addEventListener('abort', () => resolve(signal.reason), { once: true });
  });
}

/** Each step asks one question; it never ends on its own. */
function talkativeEnv(): Environment {
  return {
    async reset() {
      return { observation: null, info: {} };
    },
    async getTaskPrompt() {
      return [{ role: 'user', content: 'Tell me everything.' }];
    },
    async step() {
      return { observation: null, reward: 0, terminated: false, truncated: false };
    },
  };
}

describe('the calls of expired rollouts (worker/pause-gate.ts signalFor)', () => {
  it('hands out the plain cancel signal while nothing can expire', () => {
    const control = new PauseControl(3);
    const gate = new PauseGate(control.block);
    try {
      assert.equal(gate.oldestUsefulStep, NO_EXPIRY);
      assert.equal(gate.signalFor(0), gate.signal);
    } finally {
      gate.close();
    }
  });

  it('aborts the signal of calls holding tokens older than the new oldest useful step, and only those', async () => {
    const control = new PauseControl(5);
    const gate = new PauseGate(control.block);
    try {
      control.setOldestUsefulStep(2);
      const ofStep2 = gate.signalFor(2) as AbortSignal;
      const ofStep3 = gate.signalFor(3) as AbortSignal;
      assert.equal(gate.signalFor(2), ofStep2, 'calls of rollouts begun on the same weights share one signal');
      control.setOldestUsefulStep(3); // the consumer moved: tokens of step 2 can no longer be taken
      const reason = await aborted(ofStep2);
      assert.match(String((reason as Error).message), /holds tokens of model step 2.*none older than 3/);
      assert.equal(ofStep3.aborted, false);
      assert.equal((gate.signalFor(1) as AbortSignal).aborted, true, 'a call already expired when sent is cut at once');
    } finally {
      gate.close();
    }
  });

  it('aborts every such signal when a pause cancels in-flight calls', async () => {
    const control = new PauseControl(5);
    const gate = new PauseGate(control.block);
    try {
      control.setOldestUsefulStep(2);
      const signal = gate.signalFor(4) as AbortSignal;
      control.cancel();
      const reason = await aborted(signal);
      assert.match(String((reason as Error).message), /weight update/);
    } finally {
      gate.close();
    }
  });
});

describe('a reply in flight when its rollout expires', () => {
  let mock: MockLlm;
  before(async () => {
    // 20 tokens/s and 4 000 to write: a reply that would take minutes unless cut.
    mock = await startMockLlm({ tokensPerSecond: 20, thinkTokens: 4_000, seed: 1 });
  });
  after(() => mock.close());

  it('is cut on the server, and the rollout lands interrupted with nothing of the reply recorded', async () => {
    const control = new PauseControl(3);
    const gate = new PauseGate(control.block);
    const client = new LlmClient({ ...TEST_CLIENT, url: mock.url });
    try {
      control.setOldestUsefulStep(3); // tokens of the weights served now may still be taken
      const ctx: EpisodeContext = {
        actors: { acquire: async () => talkativeEnv(), done: async () => {} },
        llm: { chat: (request, signal) => client.chat(request, signal) },
        settings: {
          maxSteps: 5,
          messageCut: 0,
          maxTokens: 8_192,
          temperature: 1,
          partialRollout: true,
          sendSeed: false,
        },
        gate,
        workerId: 1,
      };
      const rollout = newGroup(sample('talk', 0), 1).rollouts[0];
      const episode = runEpisode(rollout, ctx);
      await mock.waitForInFlight(1);
      control.setOldestUsefulStep(4); // the trainer moved on: the reply's first token, of weights 3, is too old
      await episode;
      await mock.waitForStats((s) => s.cancelled === 1 && s.inFlight === 0);
      assert.equal(rollout.status, Status.ABORTED);
      assert.match(rollout.error ?? '', /expired: it holds tokens of model step 3/);
      assert.equal(rollout.turns.length, 0);
    } finally {
      gate.close();
      await client.close();
    }
  });
});

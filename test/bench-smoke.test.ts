/**
 * The bench's parts still run (npm run bench is not part of npm test): no figure is asserted, only
 * that each side does its work and that the bare loop sends what the engine sent.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { startMockLlm, type MockLlm } from '../src/testing/index.ts';
import { bareLoop, engineThroughput } from './bench/engine-throughput.ts';

describe('bench parts (smoke, no figures checked)', () => {
  let mock: MockLlm;
  before(async () => {
    mock = await startMockLlm({ port: 0 });
  });
  after(() => mock.close());

  it('records the chat bodies the engine sent, every turn of an episode, and the bare loop replays them', async () => {
    const engine = await engineThroughput({ url: mock.url, concurrency: 8, threads: 1, seconds: 0.2, groupSize: 4, maxTokens: 32, recordBodies: 50 });
    assert.ok(engine.operations > 0);
    // Workers report their OS thread ids, so the CPU split finds them (Linux /proc).
    if (process.platform === 'linux') assert.ok(engine.cpuSplit !== null && engine.cpuSplit.workersMs >= 0 && engine.cpuSplit.mainMs > 0);
    assert.ok(engine.bodies.length > 0 && engine.bodies.length <= 50);
    const sent = engine.bodies.map((b) => JSON.parse(b) as { model: string; messages: { role: string }[]; max_tokens: number; logprobs: boolean; return_token_ids: boolean });
    for (const body of sent) {
      assert.equal(body.model, 'mock-policy');
      assert.equal(body.max_tokens, 32);
      assert.equal(body.messages[0].role, 'system');
      assert.ok(body.logprobs && body.return_token_ids);
    }
    assert.ok(sent.some((b) => b.messages.length > 2), 'later turns carry the conversation so far');
    const bare = await bareLoop({ url: mock.url, concurrency: 8, seconds: 0.2, bodies: engine.bodies });
    assert.ok(bare.operations > 0);
    assert.ok(bare.cpuMs > 0);
  });
});

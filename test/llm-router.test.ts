/**
 * The inference router each worker calls through (src/llm/router.ts): the llm.maxConcurrency bound,
 * session paths, session affinity with least-busy placement across endpoints, round-robin routing
 * (`llm.routing`), and endpoints changed at run time (setEndpoints, the control API's /endpoints).
 */
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import { describe, it } from 'node:test';
import { LlmRouter } from '../src/llm/router.ts';
import { startMockLlm } from '../src/mock-llm/server.ts';
import { TEST_CLIENT } from './support/clients.ts';
import { chatCompletion, listenLoopback } from './support/http.ts';

/** A chat server that records request paths and the most requests it ever had open at once. */
async function countingServer(
  delayMs: number,
): Promise<{ url: string; server: Server; paths: string[]; peak: () => number }> {
  let open = 0;
  let peak = 0;
  const paths: string[] = [];
  const server = createServer((req, res) => {
    open++;
    peak = Math.max(peak, open);
    paths.push(req.url ?? '');
    req.resume();
    setTimeout(() => {
      open--;
      res.writeHead(200, { 'content-type': 'application/json' }).end(chatCompletion('4'));
    }, delayMs);
  });
  return { url: await listenLoopback(server), server, paths, peak: () => peak };
}

const clientOptions = { ...TEST_CLIENT, connections: 16, returnTokenIds: false, logprobs: false };
const request = { messages: [{ role: 'user' as const, content: 'hi' }], maxTokens: 8, temperature: 1 };

describe('inference routing in a worker', () => {
  it('never has more calls in flight than llm.maxConcurrency', async () => {
    const s = await countingServer(20);
    const router = new LlmRouter({
      client: clientOptions,
      default: { urls: [s.url], model: 'm', temperature: null, maxTokens: null },
      policies: {},
      maxConcurrency: 2,
    });
    await Promise.all(Array.from({ length: 8 }, (_, i) => router.chat(request, undefined, { session: `s${i}` })));
    assert.equal(s.peak(), 2);
    await router.close();
    s.server.close();
  });

  it('puts the session id in the path when llm.sessionPath is set (session-routing gateways)', async () => {
    const s = await countingServer(0);
    const router = new LlmRouter({
      client: { ...clientOptions, sessionPath: '/sessions/{session}' },
      default: { urls: [`${s.url}/v1`], model: 'm', temperature: null, maxTokens: null },
      policies: {},
      maxConcurrency: null,
    });
    await router.chat(request, undefined, { session: 'guess/3/1' });
    assert.deepEqual(s.paths, ['/v1/sessions/guess%2F3%2F1/chat/completions']);
    await router.close();
    s.server.close();
  });

  it('keeps a session on its endpoint and sends new sessions to the least busy one', async () => {
    const a = await countingServer(30);
    const b = await countingServer(30);
    const router = new LlmRouter({
      client: clientOptions,
      default: { urls: [a.url, b.url], model: 'm', temperature: null, maxTokens: null },
      policies: {},
      maxConcurrency: null,
    });
    // Two sessions start together: they land on different endpoints.
    await Promise.all([
      router.chat(request, undefined, { session: 'x' }),
      router.chat(request, undefined, { session: 'y' }),
    ]);
    assert.deepEqual([a.paths.length, b.paths.length], [1, 1]);
    // Session x goes back to its endpoint even while that endpoint is the busier one.
    const busy = router.chat(request, undefined, { session: 'y' });
    await router.chat(request, undefined, { session: 'x' });
    await busy;
    const xOnA = a.paths.length === 2 ? a : b;
    assert.equal(xOnA.paths.length, 2);
    router.endSession('x');
    await router.close();
    a.server.close();
    b.server.close();
  });

  it('sends each call to the next endpoint in turn under llm.routing round-robin, whatever its session', async () => {
    const a = await countingServer(0);
    const b = await countingServer(0);
    const router = new LlmRouter({
      client: clientOptions,
      default: { urls: [a.url, b.url], model: 'm', temperature: null, maxTokens: null },
      policies: {},
      maxConcurrency: null,
      routing: 'round-robin',
    });
    for (let i = 0; i < 4; i++) await router.chat(request, undefined, { session: 'x' });
    assert.deepEqual([a.paths.length, b.paths.length], [2, 2]);
    router.endSession('x');
    await router.close();
    a.server.close();
    b.server.close();
  });

  it('gives new sessions to a joined endpoint at once and moves the sessions of a removed one', async () => {
    const a = await countingServer(0);
    const b = await countingServer(0);
    const router = new LlmRouter({
      client: clientOptions,
      default: { urls: [a.url], model: 'm', temperature: null, maxTokens: null },
      policies: {},
      maxConcurrency: null,
    });
    await router.chat(request, undefined, { session: 'old' });
    // A call held open on a: the joined endpoint b has nothing outstanding, so it takes the next session.
    const held = router.chat(request, undefined, { session: 'old' });
    router.setEndpoints([a.url, b.url]);
    assert.deepEqual(router.endpoints, [a.url, b.url]);
    await router.chat(request, undefined, { session: 'new' });
    await held;
    assert.deepEqual([a.paths.length, b.paths.length], [2, 1]);
    // a leaves: its session moves to b at its next call, and nothing more goes to a.
    router.setEndpoints([b.url]);
    await router.chat(request, undefined, { session: 'old' });
    assert.deepEqual([a.paths.length, b.paths.length], [2, 2]);
    assert.throws(() => router.setEndpoints([]), /at least one/);
    await router.close();
    a.server.close();
    b.server.close();
  });

  it('fails over from a dead endpoint and keeps new sessions off it while it rests', async () => {
    const a = await countingServer(0);
    const dead = await countingServer(0);
    const deadUrl = dead.url;
    await new Promise((r) => dead.server.close(r));
    const router = new LlmRouter({
      client: { ...clientOptions, retries: 0 },
      default: { urls: [deadUrl, a.url], model: 'm', temperature: null, maxTokens: null },
      policies: {},
      maxConcurrency: null,
    });
    // Sessions placed on the dead endpoint fail over to a; later ones avoid it while it rests.
    for (let i = 0; i < 6; i++) await router.chat(request, undefined, { session: `s${i}` });
    assert.equal(a.paths.length, 6);
    assert.deepEqual(router.outstanding(), [0, 0]);
    await router.close();
    a.server.close();
  });
});

describe('what an ended episode leaves on the clients (llm/router.ts endSession)', () => {
  it('forgets a multi-agent episode on every client under round-robin, each agent’s token-in conversation included (regression: only the default policy’s clients forgot the session, and none an agent’s conversation)', async () => {
    const mocks = await Promise.all([
      startMockLlm({ seed: 1, tokenizer: 'qwen2.5' }),
      startMockLlm({ seed: 2, tokenizer: 'qwen2.5' }),
    ]);
    const policy = (url: string) => ({ urls: [url], model: 'm', temperature: null, maxTokens: null });
    const router = new LlmRouter({
      client: { ...TEST_CLIENT, api: 'tokens' },
      fallbackServer: { kind: 'vllm', contextLength: null },
      tokenizer: 'qwen2.5',
      default: policy(mocks[0].url),
      policies: { judge: policy(mocks[1].url) },
      maxConcurrency: null,
      routing: 'round-robin',
    });
    try {
      for (const session of ['a', 'b']) {
        await router.chat(request, undefined, { session, agent: 'player' });
        await router.chat(request, undefined, { session, agent: 'judge' });
      }
      assert.equal(router.conversationsHeld(), 4, 'two agents of two episodes, each kept for its next turn');
      router.endSession('a');
      assert.equal(router.conversationsHeld(), 2);
      router.endSession('b');
      assert.equal(router.conversationsHeld(), 0);
    } finally {
      await router.close();
      await Promise.all(mocks.map((m) => m.close()));
    }
  });
});

/**
 * The bench's parts still run (npm run bench is not part of npm test): no figure is asserted, only
 * that each side does its work and that the bare loop sends what the engine sent.
 */
import assert from 'node:assert/strict';
import { createServer, request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { createEngine } from '../src/index.ts';
import { runTrainingLoop } from '../src/loadtest/training.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/index.ts';
import { callFloor } from './bench/call-floor.ts';
import { bareLoop, clientLoop, engineThroughput } from './bench/engine-throughput.ts';
import { toolCallCost } from './bench/tool-calls.ts';
import { fleetBench, fleetBenchDefaults, fleetTargets } from './bench/fleet.ts';
import { longTailBench, LONG_TAIL_SIDES } from './bench/long-tail.ts';
import createAgenticEnv, { agenticSystemPrompt } from './bench/workloads/agentic-env.ts';
import { LONG_TAIL_WORKLOADS, longTailDataset } from './bench/workloads/long-tail.ts';

/** A pass-through proxy on 127.0.0.1:0 that keeps every chat body it forwards. */
async function recordingProxy(target: string): Promise<{ url: string; bodies: Set<string>; server: Server }> {
  const bodies = new Set<string>();
  const to = new URL(target);
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      if (req.url?.endsWith('/chat/completions')) bodies.add(body.toString('utf8'));
      const out = httpRequest(
        { host: to.hostname, port: to.port, path: req.url, method: req.method, headers: req.headers },
        (answer) => {
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          answer.pipe(res);
        },
      );
      out.end(body);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, bodies, server };
}

describe('bench parts (smoke, no figures checked)', () => {
  let mock: MockLlm;
  let proxy: Awaited<ReturnType<typeof recordingProxy>>;
  before(async () => {
    mock = await startMockLlm({ port: 0 });
    proxy = await recordingProxy(mock.url);
  });
  after(async () => {
    proxy.server.closeAllConnections();
    await new Promise((r) => proxy.server.close(r));
    await mock.close();
  });

  it('records the chat bodies the engine sent, byte for byte, every turn of an episode, and the bare loop replays them', async () => {
    const engine = await engineThroughput({
      url: proxy.url,
      concurrency: 8,
      threads: 1,
      seconds: 0.2,
      groupSize: 4,
      maxTokens: 32,
      recordBodies: 50,
    });
    assert.ok(engine.operations > 0);
    // Workers report their OS thread ids, so the CPU split finds them (Linux /proc).
    if (process.platform === 'linux')
      assert.ok(engine.cpuSplit !== null && engine.cpuSplit.workersMs >= 0 && engine.cpuSplit.mainMs > 0);
    assert.ok(engine.bodies.length > 0 && engine.bodies.length <= 50);
    for (const body of engine.bodies) assert.ok(proxy.bodies.has(body), `the engine never sent ${body.slice(0, 120)}…`);
    assert.ok(
      engine.bodies.some((b) => (JSON.parse(b) as { messages: unknown[] }).messages.length > 2),
      'later turns carry the conversation so far',
    );
    const bare = await bareLoop({ url: mock.url, concurrency: 8, seconds: 0.2, bodies: engine.bodies });
    assert.ok(bare.operations > 0);
    assert.ok(bare.cpuMs > 0);
    // The engine's own client in a plain loop sends those very bytes again: nothing new reaches the proxy.
    const sent = proxy.bodies.size;
    const client = await clientLoop({ url: proxy.url, concurrency: 8, seconds: 0.2, bodies: engine.bodies });
    assert.ok(client.operations > 0);
    assert.equal(proxy.bodies.size, sent, 'the client loop sent a body the engine never sent');
  });

  it('measures the call floor in order: the server sees the call, its timer fires, then the client has the answer', async () => {
    const floor = await callFloor(5, 4);
    assert.equal(floor.calls, 4);
    assert.ok(floor.serverSawMs < floor.timerFiredMs && floor.timerFiredMs < floor.answeredMs, JSON.stringify(floor));
    assert.equal(floor.boundPct, (100 * 5) / floor.answeredMs);
  });

  it('counts the tool calls of tool-lookup and none of arithmetic from the turn records, and derives a CPU per tool call', async () => {
    const f = await toolCallCost({ seconds: 0.3, repeats: 1, concurrency: 8, latencyMs: 0 });
    assert.deepEqual(
      f.samples.map((s) => s.env),
      ['tool-lookup', 'arithmetic'],
    );
    const [tools, plain] = f.samples;
    assert.ok(tools.toolCalls > 0 && tools.inferenceCalls > tools.steps, JSON.stringify(tools));
    assert.equal(plain.toolCalls, 0);
    assert.equal(plain.inferenceCalls, plain.steps);
    assert.ok(Number.isFinite(f.cpuUsPerToolCall));
  });
});

describe('the simulated training loop on a GPU-like mock (smoke, no figures checked)', () => {
  for (const side of ['sync', 'async+partial', 'async+keep'] as const) {
    it(`runs the ${side} trainer for three steps and accounts for its syncs and production`, async (t) => {
      const gpu = await startMockLlm({
        port: 0,
        capacity: { slots: 16, responseTokens: 20, lengthSigma: 0.5, speedup: 50 },
      });
      t.after(() => gpu.close());
      const async = side !== 'sync';
      const engine = createEngine({
        logLevel: 'warn',
        // A reply the mock never answers costs this, not the default 120 s, and fails the check below.
        llm: { url: gpu.url, abortPath: '/admin/abort', timeoutMs: 10_000 },
        batchSize: 4,
        workers: { threads: 1 },
        tasks: [{ name: 'a', env: { module: 'builtin:arithmetic' }, groupSize: 4, maxTokens: 256 }],
        producer: async
          ? {
              strategy: 'async',
              maxStaleness: 1,
              partialRollout: true,
              staleRollouts: side === 'async+keep' ? 'keep' : 'reset',
            }
          : { strategy: 'sync' },
        pause: { mode: side === 'async+keep' ? 'in-place' : 'abort' },
      });
      t.after(() => engine.close());
      await engine.start();
      const f = await runTrainingLoop({
        engine,
        servers: [gpu.url],
        strategy: async ? 'async' : 'sync',
        steps: 3,
        trainer: { trainMsPerToken: 0.5, loadMs: 50, speedup: 50, syncEvery: 1 },
      });
      assert.equal(f.steps, 3);
      assert.equal(f.cycles, 2);
      assert.ok(f.stepsPerHour > 0 && Number.isFinite(f.stepsPerHour), JSON.stringify(f));
      assert.ok(f.syncs.count <= 2, 'no sync after the last step');
      assert.ok(f.production.busyFraction > 0 && f.production.busyFraction <= 1);
      assert.ok(f.production.slotFill > 0 && f.production.slotFill <= 1);
      const { mean, max, pastThresholdFraction } = f.staleness;
      assert.ok(
        mean >= 0 && mean <= max && pastThresholdFraction >= 0 && pastThresholdFraction <= 1,
        JSON.stringify(f.staleness),
      );
      if (side === 'sync') assert.deepEqual(f.staleness, { mean: 0, max: 0, pastThresholdFraction: 0 });
      assert.equal(gpu.weightVersion, 2, 'the servers were told each step’s weights but the last');
      assert.equal(
        gpu.stats().cancelled,
        0,
        'the mock left a reply unanswered until the engine gave up on it (llm.timeoutMs)',
      );
    });
  }
});

describe('the training loop’s warm-up', () => {
  // Regression: the strict side's bound is 8 train steps and the window measured steps 1–8, so no
  // rollout could be past the bound in it and "nothing thrown away" was a property of the window.
  it('measures only the steps after the warm-up: its cycles and syncs, not the warm-up’s', async (t) => {
    const gpu = await startMockLlm({
      port: 0,
      capacity: { slots: 16, responseTokens: 20, lengthSigma: 0.5, speedup: 50 },
    });
    t.after(() => gpu.close());
    const engine = createEngine({
      logLevel: 'warn',
      llm: { url: gpu.url, abortPath: '/admin/abort', timeoutMs: 10_000 },
      batchSize: 4,
      workers: { threads: 1 },
      tasks: [{ name: 'a', env: { module: 'builtin:arithmetic' }, groupSize: 4, maxTokens: 256 }],
      producer: { strategy: 'async', maxStaleness: 1, partialRollout: true, staleRollouts: 'reset' },
      pause: { mode: 'in-place' },
    });
    t.after(() => engine.close());
    await engine.start();
    const f = await runTrainingLoop({
      engine,
      servers: [gpu.url],
      strategy: 'async',
      steps: 3,
      warmupSteps: 2,
      trainer: { trainMsPerToken: 0.5, loadMs: 50, speedup: 50, syncEvery: 1 },
    });
    assert.equal(f.steps, 5, 'the warm-up’s steps are run');
    assert.equal(f.cycles, 2, 'the cycles are those of the measured steps: 3 − 1');
    assert.equal(gpu.weightVersion, 4, 'a sync after every step but the last, the warm-up’s included');
    // Syncs after steps 3 and 4 are measured; those after the warm-up's steps 1 and 2 are not.
    assert.ok(f.syncs.count <= 2, JSON.stringify(f.syncs));
    assert.ok(f.stepsPerHour > 0 && Number.isFinite(f.stepsPerHour), JSON.stringify(f));
    assert.ok(f.production.busyFraction > 0 && f.production.busyFraction <= 1);
    assert.ok(f.age !== undefined && f.age.rollouts > 0 && f.age.episodeSeconds > 0, JSON.stringify(f.age));
  });
});

describe('the fleet bench (smoke, no figures checked)', () => {
  it('runs session routing, round-robin and the one-replica reference on the same workload, each on its own mocks', async () => {
    const o = { ...fleetBenchDefaults(true), servers: 2, slots: 16, groups: 2, groupSize: 4, batches: 1, turns: 2 };
    const r = await fleetBench(o);
    assert.deepEqual(
      r.sides.map((s) => [s.side, s.servers, s.rollouts]),
      [
        ['session', 2, 8],
        ['round-robin', 2, 8],
        ['one replica', 1, 8],
      ],
    );
    for (const s of r.sides) {
      assert.ok(s.promptTokens > 0 && s.cachedTokens >= 0 && s.cachedTokens <= s.promptTokens, JSON.stringify(s));
      assert.equal(s.generatedPerServer.length, s.servers);
    }
    const [target] = fleetTargets(r);
    assert.ok(target.value === null || Number.isFinite(target.value));
  });
});

describe('the long-tail workloads (smoke, no figures checked)', () => {
  it('defines multi-turn, long-tailed, straggling, failing workloads on several servers with a shared system prompt', () => {
    assert.ok(LONG_TAIL_WORKLOADS.length >= 2);
    for (const w of LONG_TAIL_WORKLOADS) {
      assert.equal(w.env.maxTurns, 8, w.name);
      assert.ok(w.servers >= 2 && w.lengthSigma >= 1 && w.maxTokens >= 20 * w.responseTokens, w.name);
      assert.ok(w.env.stragglerRate > 0 && w.env.stragglerMs[0] >= 10_000, w.name);
      assert.ok(w.env.infraRate > 0 && w.env.infraRate < 0.05, w.name);
      assert.equal(longTailDataset(w).trim().split('\n').length, w.prompts);
    }
  });

  it('plays an episode of 1–8 turns under the shared system prompt, and replays it the same from the same replies', async () => {
    const params = { ...LONG_TAIL_WORKLOADS[0].env, infraRate: 0, speedup: 1e6 };
    const play = async (): Promise<unknown[]> => {
      const env = createAgenticEnv(params);
      await env.reset({ seed: 7, params: { id: 3 } });
      const prompt = await env.getTaskPrompt();
      assert.equal((prompt as { content: string }[])[0].content, agenticSystemPrompt(params.systemPromptWords));
      const seen: unknown[] = [];
      for (let turn = 1; turn <= 8; turn++) {
        const r = await env.step(`reply ${turn}`, { toolMessages: [] });
        seen.push(r.observation, r.reward);
        if (r.terminated) return seen;
      }
      assert.fail('no episode runs past 8 turns');
    };
    const first = await play();
    assert.ok(first.length >= 2 && first.length <= 16);
    assert.deepEqual(await play(), first);
  });

  it('runs sync, async strict and async keep on a tiny long-tail workload with infrastructure failures injected', async () => {
    const w = LONG_TAIL_WORKLOADS[1];
    const workload = {
      ...w,
      env: { ...w.env, stepMs: 20, stragglerMs: [200, 400] as [number, number], infraRate: 0.2 },
    };
    const r = await longTailBench(workload, true, {
      workload,
      groups: 2,
      steps: 3,
      // One step, not each side's bound (up to 10): the path runs, the test stays short.
      warmupSteps: 1,
      slots: 8,
      maxTokens: 256,
      speedup: 20,
    });
    assert.deepEqual(
      r.sides.map((s) => s.side),
      [...LONG_TAIL_SIDES],
    );
    for (const s of r.sides) {
      assert.ok(s.figures !== null && s.figures.steps >= 2, s.side);
      assert.ok(s.engineCores === null || (s.engineCores ?? -1) >= 0);
    }
    assert.ok(r.ceiling !== null && Number.isFinite(r.ceiling.value));
  });
});

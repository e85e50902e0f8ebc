import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import type { ServerResponse } from 'node:http';
import { describe, it } from 'node:test';
import type { TestContext } from 'node:test';
import { request } from 'undici';
import { GpuModel, type GpuModelOptions } from '../src/mock-llm/gpu-model.ts';
import { Gpu, gpuWindow, GPU_DEFAULTS, type GpuMetrics } from '../src/mock-llm/gpu.ts';
import { drawLength, promptKey } from '../src/mock-llm/lengths.ts';
import { BLOCK_TOKENS, blockHashes, PrefixCache } from '../src/mock-llm/prefix-cache.ts';
import { Scheduler, type Finish } from '../src/mock-llm/scheduler.ts';
import { startMockLlm, type MockLlm, type MockLlmOptions } from '../src/mock-llm/server.ts';
import { mockLlmCommand } from '../src/cli/mock-llm.ts';
import { drain, ids } from './support/gpu-model.ts';

/** Round numbers so step times are exact: a step is 10 ms + 1 ms per decoding sequence + 1 ms per prefilled token. */
const SHAPE: GpuModelOptions = {
  slots: 2,
  decodeMs: 10,
  decodeMsPerSeq: 1,
  decodeMsPerKvToken: 0,
  prefillTokensPerSecond: 1000,
  prefillChunkTokens: 64,
  prefixCacheTokens: 1024,
};

describe('GPU-like mock: the replica model', () => {
  it('runs at most `slots` sequences and queues the rest in arrival order', () => {
    const model = new GpuModel(SHAPE);
    const seqs = [0, 1, 2, 3].map((i) => model.submit(0, { promptIds: ids(1, 100 * i), outputIds: ids(3) }).seq);
    assert.deepEqual(
      seqs.map((s) => s.state),
      ['prefill', 'prefill', 'queued', 'queued'],
    );
    assert.deepEqual(model.state(), { running: 2, queued: 2, cacheTokens: 0 });
    const done = drain(model);
    assert.deepEqual(
      done.map((s) => s.id),
      [0, 1, 2, 3],
    );
    // The third is admitted only when a slot frees, at the end of the step that finished the first two.
    assert.equal(seqs[2].admittedAt, seqs[0].doneAt);
    const c = model.counters();
    assert.equal(c.completed, 4);
    assert.equal(c.generatedTokens, 12);
  });

  it('makes a decode step longer with every sequence running', () => {
    const one = new GpuModel(SHAPE);
    one.submit(0, { promptIds: [7], outputIds: ids(5) });
    const [a] = drain(one);
    const two = new GpuModel(SHAPE);
    two.submit(0, { promptIds: [7], outputIds: ids(5) });
    two.submit(0, { promptIds: [8], outputIds: ids(5) });
    const [b] = drain(two);
    // Prefill step (10 + 2 ms or 10 + 1 ms) then 4 decode steps of 10 + n ms.
    assert.equal(a.doneAt, 11 + 4 * 11);
    assert.equal(b.doneAt, 12 + 4 * 12);
  });

  it('prefills only what the prefix cache does not hold for a session that comes back', () => {
    const model = new GpuModel(SHAPE);
    const prompt = ids(40);
    const output = ids(24, 500);
    const first = model.submit(0, { promptIds: prompt, outputIds: output }).seq;
    drain(model);
    assert.equal(first.cachedTokens, 0);
    // The next turn: the whole conversation so far, then a new observation.
    const next = model.submit(model.now, { promptIds: [...prompt, ...output, ...ids(10, 900)], outputIds: ids(2) }).seq;
    drain(model);
    assert.equal(next.cachedTokens, 64, 'the 4 whole blocks of prompt + output');
    const c = model.counters();
    assert.equal(c.cachedTokens, 64);
    assert.equal(c.prefilledTokens, 40 + (74 - 64));
    // At 1 000 prompt tokens per second, 1 ms of each step per token prefilled.
    assert.equal(c.prefillMs, 40 + (74 - 64));
  });

  it('paused in place, ends the step under way, then generates nothing until resumed, and loses nothing (SGLang pause_generation in_place)', () => {
    const model = new GpuModel(SHAPE);
    const seq = model.submit(0, { promptIds: [7], outputIds: ids(5) }).seq;
    model.advanceTo(15); // mid-way through the second step (prefill 0–11, decode 11–22)
    model.pause(15, 'in_place');
    assert.deepEqual(model.advanceTo(22), [], 'the step under way ends');
    assert.equal(seq.generated, 2);
    assert.equal(model.nextEventAt, null, 'no step starts while paused');
    const late = model.submit(30, { promptIds: [8], outputIds: ids(1) }).seq;
    assert.equal(late.state, 'queued', 'a request that comes during the pause waits');
    model.advanceTo(1_000);
    assert.equal(seq.generated, 2);
    const c = model.counters();
    assert.equal(c.busyMs, 22, 'idle while paused');
    model.resume(1_000);
    const done = drain(model);
    assert.deepEqual(
      done.map((s) => s.id),
      [late.id, seq.id],
      'the late one-token request first',
    );
    assert.equal(seq.generated, 5, 'it went on from the KV it kept: no token generated twice or lost');
    assert.equal(model.counters().prefilledTokens, 1 + 1, 'nothing prefilled again');
  });

  it('retracted by a pause, prefills its prompt and the tokens it had again once resumed', () => {
    const model = new GpuModel(SHAPE);
    const seq = model.submit(0, { promptIds: ids(4, 50), outputIds: ids(6) }).seq;
    model.advanceTo(26); // prefill 0–14 (first token), one decode step 14–25: 2 tokens
    model.pause(26, 'retract');
    drain(model); // the step under way ends, then the sequence goes back to the queue
    assert.equal(seq.state, 'queued');
    assert.equal(seq.generated, 3);
    model.resume(model.now);
    drain(model);
    assert.equal(seq.generated, 6);
    assert.equal(model.counters().prefilledTokens, 4 + (4 + 3), 'the prompt, then the prompt and the 3 tokens again');
  });

  it('forgets every cached prefix when new weights are loaded', () => {
    const model = new GpuModel(SHAPE);
    model.submit(0, { promptIds: ids(32), outputIds: ids(1) });
    drain(model);
    model.flushCache();
    const again = model.submit(model.now, { promptIds: ids(32), outputIds: ids(1) }).seq;
    drain(model);
    assert.equal(again.cachedTokens, 0);
    assert.equal(model.counters().cacheFlushes, 1);
  });

  it('frees the slot of a cancelled sequence for the one queued, keeping the tokens it had', () => {
    const model = new GpuModel({ ...SHAPE, slots: 1 });
    const long = model.submit(0, { promptIds: [1], outputIds: ids(100) }).seq;
    const waiting = model.submit(0, { promptIds: [2], outputIds: ids(2) }).seq;
    model.advanceTo(11 + 3 * 11); // prefill step + 3 decode steps
    assert.equal(long.generated, 4);
    assert.equal(waiting.state, 'queued');
    model.cancel(model.now, long);
    assert.equal(long.state, 'done');
    const done = drain(model);
    assert.deepEqual(
      done.map((s) => s.id),
      [waiting.id],
    );
    assert.equal(model.counters().cancelled, 1);
  });

  it('accounts busy time, slots taken and queue length over every millisecond', () => {
    const model = new GpuModel({ ...SHAPE, slots: 1 });
    model.submit(0, { promptIds: [1], outputIds: ids(2) }); // prefill 11 ms, decode 11 ms
    model.submit(0, { promptIds: [2], outputIds: ids(2) });
    drain(model);
    model.advanceTo(64); // 20 ms idle after 44 ms of work
    const c = model.counters();
    assert.equal(c.timeMs, 64);
    assert.equal(c.busyMs, 44);
    assert.equal(c.slotMs, 44);
    assert.equal(c.queueMs, 22);
  });

  it('lets a step prefill at most the chunk budget left after the decodes', () => {
    const model = new GpuModel({ ...SHAPE, prefillChunkTokens: 16 });
    const seq = model.submit(0, { promptIds: ids(40), outputIds: ids(1) }).seq;
    drain(model);
    assert.equal(model.counters().steps, 3, '16 + 16 + 8 prompt tokens');
    assert.equal(seq.doneAt, 3 * 10 + 40);
  });
});

describe('GPU-like mock: the prefix cache', () => {
  it('names a block by everything before it, so only a shared prefix hits', () => {
    const a = blockHashes(ids(48));
    const b = blockHashes([0, ...ids(47)]);
    assert.equal(a.length, 3);
    assert.equal(blockHashes(ids(47)).length, 2, 'a partial block has no hash');
    assert.equal(b.filter((h) => a.includes(h)).length, 0);
  });

  it('evicts the least recently used block beyond its size', () => {
    const cache = new PrefixCache(2 * BLOCK_TOKENS);
    const [x, y] = blockHashes(ids(32));
    const [z] = blockHashes(ids(16, 1000));
    cache.insert([x, y]);
    assert.equal(cache.match([x]), BLOCK_TOKENS); // x is now the most recent
    cache.insert([z]);
    assert.equal(cache.tokens, 2 * BLOCK_TOKENS);
    assert.equal(cache.match([x]), BLOCK_TOKENS);
    assert.equal(cache.match([x, y]), BLOCK_TOKENS, 'y was evicted');
  });
});

describe('GPU-like mock: response lengths', () => {
  const draws = (sigma: number, prompts: number, perPrompt: number) =>
    Array.from({ length: prompts }, (_, p) =>
      Array.from({ length: perPrompt }, (_, r) => drawLength({ median: 200, sigma }, 7, p, 1000 * p + r)),
    );

  it('draws a long tail around the median under a seed, the same every time', () => {
    const all = draws(1, 200, 10)
      .flat()
      .sort((a, b) => a - b);
    const q = (p: number) => all[Math.floor((p / 100) * (all.length - 1))];
    assert.deepEqual(
      draws(1, 200, 10)
        .flat()
        .sort((a, b) => a - b),
      all,
    );
    assert.ok(q(50) > 150 && q(50) < 270, `median ${q(50)}`);
    assert.ok(q(99) / q(50) > 5, `p99 ${q(99)} vs median ${q(50)}`);
    const mean = all.reduce((s, x) => s + x, 0) / all.length;
    assert.ok(mean > 1.3 * q(50), `mean ${mean} above the median: a long right tail`);
  });

  it('makes the replies to one prompt closer to each other than to another prompt’s', () => {
    const log = draws(1, 100, 8).map((xs) => xs.map(Math.log));
    const mean = (xs: number[]) => xs.reduce((s, x) => s + x, 0) / xs.length;
    const variance = (xs: number[]) => mean(xs.map((x) => (x - mean(xs)) ** 2));
    const within = mean(log.map(variance));
    const total = variance(log.flat());
    assert.ok(within < 0.7 * total, `within-prompt variance ${within.toFixed(2)} vs overall ${total.toFixed(2)}`);
  });

  it('gives every reply the median with σ 0, and tells prompts apart by their opening messages', () => {
    assert.deepEqual(draws(0, 3, 3).flat(), Array(9).fill(200));
    const a = promptKey([
      { role: 'system', content: 'between 1 and 100' },
      { role: 'user', content: 'go' },
    ]);
    const b = promptKey([
      { role: 'system', content: 'between 1 and 200' },
      { role: 'user', content: 'go' },
    ]);
    const a2 = promptKey([
      { role: 'system', content: 'between 1 and 100' },
      { role: 'user', content: 'go' },
      { role: 'assistant', content: '50' },
      { role: 'user', content: 'Too low.' },
    ]);
    assert.notEqual(a, b);
    assert.equal(a, a2, 'later turns keep the prompt’s key');
  });
});

async function start(t: TestContext, options: MockLlmOptions): Promise<MockLlm> {
  const mock = await startMockLlm(options);
  t.after(() => mock.close());
  return mock;
}

async function get(mock: MockLlm, path: string): Promise<{ status: number; json: any }> {
  const res = await request(`${mock.url}${path}`);
  return { status: res.statusCode, json: await res.body.json() };
}

function chatBody(content: string, extra: Record<string, unknown> = {}) {
  return JSON.stringify({ model: 'mock-policy', messages: [{ role: 'user', content }], seed: 3, ...extra });
}

describe('GPU-like mock: the scheduler on the replica', () => {
  it('answers a reply whose sequence ends while the ones before it are answered, instead of leaving its client to time out', () => {
    // The wall clock is the test's: answering a reply takes time only when the test says so.
    let wall = 0;
    const gpu = new Gpu(
      { ...GPU_DEFAULTS, ...SHAPE, speedup: 1 },
      () => {},
      () => wall,
    );
    const scheduler = new Scheduler({ latencyMs: 0, tokensPerSecond: 0, streamIntervalMs: 50, gpu });
    const answers: [string, Finish, number][] = [];
    const generation = (name: string, promptId: number, onAnswer = () => {}) => ({
      ids: ids(2),
      promptTokens: 1,
      promptIds: [promptId],
      natural: 'stop' as const,
      answer(reason: Finish, out: readonly number[]) {
        answers.push([name, reason, out.length]);
        onAnswer();
      },
    });
    const client = () => new EventEmitter() as unknown as ServerResponse;
    try {
      // a1 and a2 share a prefill step (12 ms) and a decode step (12 ms): done at 24, not yet reported.
      scheduler.schedule(
        client(),
        generation('a1', 1, () => (wall += 100)),
      );
      scheduler.schedule(client(), generation('a2', 2));
      wall = 100;
      // b arrives at 100 and is done at 122. Submitting it reports a1 and a2; answering a1 takes until
      // 200, so letting a2's finished sequence go catches the replica up past b's end.
      scheduler.schedule(client(), generation('b', 3));
      // b is answered inside a2's answering, before it: the order is not the point.
      assert.deepEqual(
        answers.toSorted(([x], [y]) => x.localeCompare(y)),
        [
          ['a1', 'stop', 2],
          ['a2', 'stop', 2],
          ['b', 'stop', 2],
        ],
      );
      assert.equal(scheduler.inFlight, 0);
      assert.equal(gpu.metrics().completed, 3);
    } finally {
      gpu.stop();
      scheduler.stop();
    }
  });
});

describe('GPU-like mock: the server', () => {
  it('answers with the drawn length and reports its metrics at /admin/gpu', async (t) => {
    const mock = await start(t, { capacity: { slots: 4, responseTokens: 40, lengthSigma: 0, speedup: 50 } });
    const res = await request(`${mock.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: chatBody('Compute 2+3. Answer with the number only.'),
    });
    const reply = (await res.body.json()) as {
      usage: { completion_tokens: number };
      choices: { message: { content: string } }[];
    };
    assert.equal(reply.usage.completion_tokens, 40);
    assert.match(reply.choices[0].message.content, /5/);
    const { status, json } = await get(mock, '/admin/gpu');
    assert.equal(status, 200);
    const m = json as GpuMetrics;
    assert.equal(m.slots, 4);
    assert.equal(m.completed, 1);
    assert.equal(m.generatedTokens, 40);
    assert.deepEqual(mock.stats().gpu?.completed, 1);
  });

  it('answers an abort with the tokens the replica generated so far and frees its slots', async (t) => {
    const mock = await start(t, { capacity: { slots: 2, responseTokens: 5_000, lengthSigma: 0, speedup: 1 } });
    const pending = [1, 2, 3].map(() =>
      request(`${mock.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: chatBody('hello', { max_tokens: 6_000 }),
      }),
    );
    await mock.waitForStats(
      (s) => s.gpu !== null && s.gpu.running === 2 && s.gpu.queued === 1 && s.gpu.generatedTokens > 0,
    );
    assert.equal(mock.abortAll(), 3);
    const replies = await Promise.all(
      pending.map(
        async (p) =>
          (await (await p).body.json()) as {
            choices: { finish_reason: string }[];
            usage: { completion_tokens: number };
          },
      ),
    );
    assert.deepEqual(
      replies.map((r) => r.choices[0].finish_reason),
      ['abort', 'abort', 'abort'],
    );
    assert.ok(replies[0].usage.completion_tokens > 0 && replies[0].usage.completion_tokens < 5_000);
    assert.equal(replies[2].usage.completion_tokens, 0, 'the queued one never ran');
    const gpu = mock.stats().gpu!;
    assert.equal(gpu.running, 0);
    assert.equal(gpu.queued, 0);
    assert.equal(gpu.cancelled, 3);
  });

  it('drops its prefix cache when a new weight version is set', async (t) => {
    const mock = await start(t, { capacity: { slots: 2, responseTokens: 20, lengthSigma: 0, speedup: 50 } });
    const long = `Compute 1+1. Answer with the number only. ${'padding words '.repeat(20)}`;
    await (
      await request(`${mock.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: chatBody(long),
      })
    ).body.dump();
    assert.ok(mock.stats().gpu!.cacheTokens > 0);
    mock.setWeightVersion(1);
    assert.equal(mock.stats().gpu!.cacheTokens, 0);
    assert.equal(mock.stats().gpu!.cacheFlushes, 1);
  });

  it('computes a window’s busy fraction, slot fill and token rate from two readings', () => {
    // A fresh model's readings, as Gpu.metrics() reports them: every counter at zero.
    const idle = new GpuModel(SHAPE);
    const zero: GpuMetrics = { ...idle.counters(), ...idle.state(), profile: 'h200-8b', slots: 4, speedup: 1 };
    const w = gpuWindow(zero, {
      ...zero,
      timeMs: 1000,
      busyMs: 900,
      slotMs: 3000,
      queueMs: 500,
      generatedTokens: 2000,
      promptTokens: 100,
      cachedTokens: 25,
      decodeSequences: 1800,
      decodeKvTokens: 900_000,
    });
    assert.deepEqual(w, {
      timeMs: 1000,
      busyFraction: 0.9,
      meanRunning: 3,
      slotFill: 0.75,
      meanQueue: 0.5,
      tokensPerSecond: 2000,
      generatedTokens: 2000,
      cacheHitFraction: 0.25,
      completed: 0,
      meanDecodeContext: 500,
    });
  });

  it('refuses a capacity beside a fixed latency, and an unknown capacity field, naming it', async () => {
    await assert.rejects(
      startMockLlm({ capacity: {}, latencyMs: 50 }),
      /option latencyMs must be 0 with option capacity \(the GPU model sets the timing\) \(got 50\)/,
    );
    await assert.rejects(
      startMockLlm({ capacity: { slot: 4 } as never }),
      /unknown option capacity\.slot \(known: profile, slots, /,
    );
    await assert.rejects(
      startMockLlm({ capacity: { slots: 0 } }),
      /option capacity\.slots must be in \[1, 65536\] \(got 0\)/,
    );
    await assert.rejects(mockLlmCommand(['--capacity-speedup', '10']), /--capacity-speedup needs --capacity <slots>/);
    assert.equal(GPU_DEFAULTS.slots, 256);
  });

  it('refuses a --capacity-scheduling other than fcfs or priority, naming the value', async () => {
    await assert.rejects(
      mockLlmCommand(['--capacity', '4', '--capacity-scheduling', 'lifo']),
      /--capacity-scheduling must be fcfs or priority \(got "lifo"\)/,
    );
  });
});

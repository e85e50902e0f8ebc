/**
 * Issue 7, target 5: memory per in-flight rollout against its raw payload.
 *
 * Setup: the mock server (no latency, `thinkTokens` filler tokens per answer) behind the stall proxy
 * (./stall-proxy.ts, its own process), which holds every chat request of a conversation that has
 * reached turn `holdAtTurn` (1 = the first call). The engine runs the *sync* strategy with one batch
 * of exactly `rollouts` rollouts, all in flight at once (groupsPerWorker × threads × groupSize). So:
 *
 *   1. start the engine, wait for its workers: nothing in flight, no connection open → GC every thread
 *      (./memory-probe.ts) and take the baseline;
 *   2. ask for the batch: every rollout plays up to turn `holdAtTurn` and waits there with its
 *      inference call pending (a rollout that ended sooner waits inside its group, holding all of it);
 *   3. when every rollout is held (or finished) and nothing moves → GC every thread, sample 3 times;
 *   4. release the proxy: the held call is each episode's last (maxSteps = holdAtTurn), so the batch
 *      completes at once, and it holds *the very rollouts that were in flight*: their payload at the
 *      hold point is computed exactly from their first `holdAtTurn − 1` turns.
 *
 * Memory = V8 heap used by the main thread and every worker (engine.stats().workers[].heapUsedBytes,
 * after a full GC of each thread), and the same plus each thread's ArrayBuffer bytes (typed arrays —
 * token ids, logprobs, model steps, msgpack buffers — live off the V8 heap, so the heap alone misses
 * most of a rollout's token payload). RSS (whole process) is reported too; it is the least precise.
 *
 * Raw payload of a rollout (as issue 7 counts it): prompt and response token ids as int32, logprobs as
 * float32, and the text of its conversation (every message once) at 2 bytes a character (UTF-16).
 */
import { fileURLToPath } from 'node:url';
import { BroadcastChannel } from 'node:worker_threads';
import { Pool } from 'undici';
import { createEngine, type Engine, type RolloutState } from '../../src/index.ts';
import { startMockProcess } from '../../src/loadtest/mock-process.ts';
import { collectGarbage, PROBE_CHANNEL, threadMemory, type ProbeReply, type ThreadMemory } from './memory-probe.ts';
import { startStallProxy, type StallProxy } from './stall-proxy.ts';
import { firstTurnBody } from './engine-throughput.ts';

const PROBE_MODULE = fileURLToPath(new URL('./memory-probe.ts', import.meta.url));

export interface MemoryOptions {
  rollouts: number;
  /** 1 = held at the first inference call; 3 = after two full turns (the latest the proxy can pick out). */
  holdAtTurn: 1 | 2 | 3;
  threads: number;
  groupSize: number;
  /** Filler tokens in every mock answer: sets the size of responses (and of later prompts). */
  thinkTokens: number;
}

export interface MemorySnapshot {
  /** V8 heap used, main thread + every worker, after a full GC of each. */
  heapBytes: number;
  /** ArrayBuffer bytes, main thread + every worker (off-heap typed-array storage). */
  arrayBufferBytes: number;
  /** The main thread's share of the two above. */
  mainHeapBytes: number;
  mainArrayBufferBytes: number;
  rssBytes: number;
  workers: number;
}

export interface PayloadBreakdown {
  promptIdsBytes: number;
  responseIdsBytes: number;
  logprobsBytes: number;
  textBytes: number;
  totalBytes: number;
  turns: number;
}

export interface MemoryFigures {
  holdAtTurn: number;
  thinkTokens: number;
  rolloutsTarget: number;
  /** Rollouts the workers reported in flight while sampled. */
  rolloutsInFlight: number;
  /** Of those, inference calls the proxy held (the rest had ended and waited for their group). */
  callsHeld: number;
  rampSeconds: number;
  baseline: MemorySnapshot;
  loaded: MemorySnapshot[];
  perRollout: { heapBytes: number; heapPlusArrayBuffersBytes: number; rssBytes: number };
  /** Mean raw payload per rollout at the hold point (what the rollouts in flight held). */
  payloadHeld: PayloadBreakdown;
  ratio: { heap: number; heapPlusArrayBuffers: number; rss: number };
  notes: string[];
}

/** GC every thread, then read every thread's memory: main thread, and each worker through the probe. */
async function snapshot(
  engine: Engine,
  channel: BroadcastChannel,
  threads: number,
  id: number,
): Promise<MemorySnapshot> {
  const replies = new Map<number, ThreadMemory>();
  // Asked again until every worker answered: a worker still importing the probe module misses a
  // broadcast (a worker answers each id once).
  const ask = () => channel.postMessage({ type: 'gc', id });
  const again = setInterval(ask, 500);
  const got = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`memory probe: ${replies.size} of ${threads} workers answered within 20 s`)),
      20_000,
    );
    channel.onmessage = (event: unknown) => {
      const data = (event as { data: ProbeReply }).data;
      if (data?.type !== 'memory' || data.id !== id) return;
      replies.set(data.memory.threadId, data.memory);
      if (replies.size >= threads) {
        clearTimeout(timer);
        resolve();
      }
    };
  });
  ask();
  try {
    await got;
  } finally {
    clearInterval(again);
  }
  collectGarbage();
  const main = threadMemory();
  // Heap used as the engine reports it (the workers' GC just ran), for the figure the brief names.
  const stats = await engine.stats();
  const workerHeap = stats.workers.reduce((n, w) => n + w.heapUsedBytes, 0);
  const workerBuffers = [...replies.values()].reduce((n, m) => n + m.arrayBuffers, 0);
  return {
    heapBytes: main.heapUsed + workerHeap,
    arrayBufferBytes: main.arrayBuffers + workerBuffers,
    mainHeapBytes: main.heapUsed,
    mainArrayBufferBytes: main.arrayBuffers,
    rssBytes: process.memoryUsage().rss,
    workers: stats.workers.length,
  };
}

function textBytes(messages: readonly { content: string }[]): number {
  let n = 0;
  for (const m of messages) n += 2 * m.content.length;
  return n;
}

/** Raw payload of a rollout's first `turns` turns (all of them when it has fewer), and the conversation text up to there. */
function payloadOf(rollout: RolloutState, turns: number): PayloadBreakdown {
  const kept = rollout.turns.slice(0, turns);
  let promptIds = 0;
  let responseIds = 0;
  let logprobs = 0;
  for (const t of kept) {
    promptIds += (t.promptIds?.length ?? 0) * 4;
    responseIds += (t.responseIds?.length ?? 0) * 4;
    logprobs += (t.logprobs?.length ?? 0) * 4;
  }
  // The conversation at that point: the prompt of the next turn (the environment's whole conversation,
  // untrimmed up to turn 3 with the default messageCut) — or, for a rollout that had ended, all of it.
  const next = rollout.turns[turns];
  const text = next !== undefined ? textBytes(next.messages) : textBytes(rollout.messages);
  return {
    promptIdsBytes: promptIds,
    responseIdsBytes: responseIds,
    logprobsBytes: logprobs,
    textBytes: text,
    totalBytes: promptIds + responseIds + logprobs + text,
    turns: kept.length,
  };
}

function meanPayload(rollouts: readonly RolloutState[], turns: number): PayloadBreakdown {
  const sum: PayloadBreakdown = {
    promptIdsBytes: 0,
    responseIdsBytes: 0,
    logprobsBytes: 0,
    textBytes: 0,
    totalBytes: 0,
    turns: 0,
  };
  for (const r of rollouts) {
    const p = payloadOf(r, turns);
    for (const k of Object.keys(sum) as (keyof PayloadBreakdown)[]) sum[k] += p[k];
  }
  const n = Math.max(1, rollouts.length);
  for (const k of Object.keys(sum) as (keyof PayloadBreakdown)[]) sum[k] /= n;
  return sum;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

export async function memoryBench(options: MemoryOptions): Promise<MemoryFigures> {
  const { rollouts, holdAtTurn, threads, groupSize, thinkTokens } = options;
  const groups = Math.ceil(rollouts / groupSize);
  const target = groups * groupSize;
  const notes: string[] = [];
  const mock = await startMockProcess(['--latency-ms', '0', '--think-tokens', String(thinkTokens)]);
  let proxy: StallProxy | null = null;
  const channel = new BroadcastChannel(PROBE_CHANNEL);
  try {
    proxy = await startStallProxy(mock.url, holdAtTurn - 1);
    const engine = createEngine({
      logLevel: 'warn',
      batchSize: groups,
      // One batch, every group of it at once: exactly `target` rollouts in flight.
      workers: { threads, groupsPerWorker: Math.ceil(groups / threads) },
      llm: { url: proxy.url, connections: Math.ceil(target / threads) + 8, abortPath: '/admin/abort' },
      producer: { strategy: 'sync' },
      tasks: [
        {
          name: 'guess',
          env: { module: 'builtin:guess-number' },
          hooks: { module: PROBE_MODULE },
          groupSize,
          // Episodes end with the held call: what a rollout holds up to there does not depend on
          // maxSteps, and the batch then completes right after the release (one call per rollout).
          maxSteps: holdAtTurn,
          maxTokens: thinkTokens + 64,
        },
      ],
    });
    try {
      await engine.start();
      for (let waited = 0; (await engine.stats()).workers.length < threads; waited += 50) {
        if (waited > 20_000) throw new Error('memory bench: workers did not register within 20 s');
        await new Promise((r) => setTimeout(r, 50));
      }
      await new Promise((r) => setTimeout(r, 300)); // modules (environment, hooks) imported
      let probeId = 0;
      const baseline = await snapshot(engine, channel, threads, ++probeId);

      const t0 = performance.now();
      const batchPromise = engine.getBatch();
      batchPromise.catch(() => undefined); // awaited below; a failure must not go unhandled meanwhile
      // Wait until the rollouts are in flight and nothing moves: every call held, or its episode over
      // (a group whose rollouts all ended early lands in the buffer and is not replaced: one batch).
      let inFlight = 0;
      let calm = 0;
      let last = { held: -1, inFlight: -1 };
      for (;;) {
        await new Promise((r) => setTimeout(r, 100));
        const [stats, p] = await Promise.all([engine.stats(), proxy.stats()]);
        inFlight = stats.workers.reduce((n, w) => n + w.inFlightRollouts, 0);
        const moving = p.forwarding > 0 || p.held !== last.held || inFlight !== last.inFlight;
        last = { held: p.held, inFlight };
        calm = inFlight >= 0.9 * target && !moving ? calm + 1 : 0;
        if (calm >= 5) break;
        if (performance.now() - t0 > 90_000) {
          notes.push(`no steady state within 90 s (${inFlight} in flight, ${p.held} held): sampled anyway`);
          break;
        }
      }
      const rampSeconds = (performance.now() - t0) / 1000;
      const callsHeld = (await proxy.stats()).held;
      const loaded: MemorySnapshot[] = [];
      for (let i = 0; i < 3; i++) {
        loaded.push(await snapshot(engine, channel, threads, ++probeId));
        await new Promise((r) => setTimeout(r, 200));
      }
      await proxy.release();
      const batch = await batchPromise;
      const all = batch.groups.flatMap((g) => g.rollouts);
      if (all.length !== target) notes.push(`the batch held ${all.length} rollouts, not ${target}`);
      // The rollouts that were in flight at the hold: those of groups that had not all ended before it
      // (such a group landed in the buffer early; every other one had a call held at turn `holdAtTurn`).
      const held = batch.groups
        .filter((g) => g.rollouts.some((r) => r.turns.length >= holdAtTurn))
        .flatMap((g) => g.rollouts);
      const payloadHeld = meanPayload(held, holdAtTurn - 1);
      const per = (f: (s: MemorySnapshot) => number) =>
        median(loaded.map((s) => (f(s) - f(baseline)) / Math.max(1, inFlight)));
      const perRollout = {
        heapBytes: per((s) => s.heapBytes),
        heapPlusArrayBuffersBytes: per((s) => s.heapBytes + s.arrayBufferBytes),
        rssBytes: per((s) => s.rssBytes),
      };
      return {
        holdAtTurn,
        thinkTokens,
        rolloutsTarget: target,
        rolloutsInFlight: inFlight,
        callsHeld,
        rampSeconds,
        baseline,
        loaded,
        perRollout,
        payloadHeld,
        ratio: {
          heap: perRollout.heapBytes / payloadHeld.totalBytes,
          heapPlusArrayBuffers: perRollout.heapPlusArrayBuffersBytes / payloadHeld.totalBytes,
          rss: perRollout.rssBytes / payloadHeld.totalBytes,
        },
        notes,
      };
    } finally {
      await proxy?.release().catch(() => undefined);
      await engine.close();
    }
  } finally {
    channel.close();
    await proxy?.close();
    await mock.close();
  }
}

export interface BareRequestMemory {
  requests: number;
  /** Per pending request, this thread after a full GC, minus before the requests. */
  heapBytes: number;
  arrayBufferBytes: number;
}

/**
 * The transport's share, for reference: `requests` chat calls pending at once from a bare undici Pool
 * (one connection each, as HTTP/1.1 needs), with the engine's first-turn body, held by the stall
 * proxy — the memory a rollout in flight costs before the engine holds anything of its own.
 */
export async function bareRequestMemory(requests: number): Promise<BareRequestMemory> {
  const mock = await startMockProcess(['--latency-ms', '0']);
  let proxy: StallProxy | null = null;
  try {
    proxy = await startStallProxy(mock.url, 0);
    const pool = new Pool(new URL(proxy.url).origin, { connections: requests + 8, headersTimeout: 0, bodyTimeout: 0 });
    const body = firstTurnBody(64);
    try {
      collectGarbage();
      const before = threadMemory();
      const pending = Array.from({ length: requests }, () =>
        pool
          .request({
            method: 'POST',
            path: '/v1/chat/completions',
            headers: { 'content-type': 'application/json' },
            body,
          })
          .then((r) => r.body.text()),
      );
      for (let waited = 0; (await proxy.stats()).held < requests; waited += 100) {
        if (waited > 60_000) throw new Error('bare memory reference: the requests were not all held within 60 s');
        await new Promise((r) => setTimeout(r, 100));
      }
      collectGarbage();
      const after = threadMemory();
      await proxy.release();
      await Promise.all(pending);
      return {
        requests,
        heapBytes: (after.heapUsed - before.heapUsed) / requests,
        arrayBufferBytes: (after.arrayBuffers - before.arrayBuffers) / requests,
      };
    } finally {
      await pool.close();
    }
  } finally {
    await proxy?.close();
    await mock.close();
  }
}

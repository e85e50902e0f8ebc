/**
 * One timed engine run for the bench: exactly `concurrency` rollouts in flight (groupsPerWorker ×
 * threads × groupSize), the async producer with over-sampling and no staleness limit so that capacity
 * stays full between batches, batches taken back to back for `seconds`.
 *
 * The unit is the inference call (turn), as on the bare loop's and the Python loop's side; CPU is
 * process.cpuUsage() over the window (coordinator and every worker thread, not the mock server).
 */
import { Pool } from 'undici';
import { createEngine, type Batch } from '../../src/index.ts';
import type { MockProcess } from '../../src/loadtest/mock-process.ts';

/** src/rollout/worker-runtime.ts: monitorEventLoopDelay({ resolution: 10 }); its mean includes the interval. */
const WORKER_LOOP_MONITOR_RESOLUTION_MS = 10;

export interface Sample {
  operations: number;
  seconds: number;
  cpuMs: number;
}

export interface ThroughputOptions {
  url: string;
  concurrency: number;
  threads: number;
  seconds: number;
  groupSize: number;
  maxTokens: number;
  /** Factory params of builtin:guess-number (e.g. `cpuCostUs`). */
  envParams?: Record<string, unknown>;
  /** Gather per-turn timings and group shapes from the batches (latency-bound runs). */
  detail?: boolean;
  /** The mock's process, to report its CPU over the window. */
  mock?: MockProcess;
  /**
   * Episode slots (workers.rolloutsPerWorker) with this fraction of extra groups held per worker (0.5 =
   * half as many again); 0 / absent = no slots: `concurrency` counts every rollout of the groups held.
   */
  groupSlack?: number;
}

export interface ThroughputSample extends Sample {
  /** The mock server's CPU over the window (ms), when readable. */
  mockCpuMs: number | null;
  /** With `detail`: over the rollouts of the batches taken in the window. */
  detail: {
    /**
     * Σ turns ÷ Σ (groupSize × the group's longest rollout): the share of a group's slots that issue
     * calls if every turn took equal time. A rollout that ends early sits idle ("in flight") until
     * its group's last rollout ends: the ceiling group structure puts on calls in flight ÷ rollouts.
     */
    groupOccupancy: number;
    /** Mean engine-side inference time per call (ms): the mock's latency plus the client's own time. */
    meanInferenceMs: number;
    /** Mean turn time (inference + environment + the loop's own work), ms. */
    meanTurnMs: number;
    turns: number;
  } | null;
  /**
   * Mean over workers of their event-loop delay over the window (ms), beyond the 10 ms sampling
   * interval the workers' monitor uses (an idle loop reads ≈ 0): a saturated worker shows here.
   */
  workerLoopDelayMeanMs: number;
}

export async function engineThroughput(o: ThroughputOptions): Promise<ThroughputSample> {
  const groupsInFlight = Math.max(1, Math.round(o.concurrency / o.groupSize));
  const rolloutsPerWorker = Math.ceil(o.concurrency / o.threads);
  const engine = createEngine({
    logLevel: 'warn',
    llm: { url: o.url, connections: rolloutsPerWorker + 8 },
    batchSize: groupsInFlight,
    // Without slack: exactly `concurrency` rollouts held (the pool's capacity), finished ones waiting for
    // their group. With it: exactly `concurrency` episodes playing (episode slots), each worker holding
    // that many more groups, whose rollouts take the slot of one that ended before its siblings.
    // Async production with over-sampling keeps the workers supplied between batches, as a steady loop does.
    workers: !o.groupSlack
      ? { threads: o.threads, groupsPerWorker: Math.ceil(groupsInFlight / o.threads) }
      : { threads: o.threads, rolloutsPerWorker, groupsPerWorker: Math.ceil(((1 + o.groupSlack) * rolloutsPerWorker) / o.groupSize) },
    producer: { strategy: 'async', maxStaleness: 1_000_000, overSampleThreshold: 1 },
    tasks: [{ name: 'guess', env: { module: 'builtin:guess-number', params: o.envParams ?? {} }, groupSize: o.groupSize, maxSteps: 8, maxTokens: o.maxTokens }],
  });
  await engine.start();
  try {
    await engine.getBatch(); // warm-up: workers loaded, connections open
    const before = await engine.stats(); // also resets the workers' event-loop delay histograms
    const steps0 = before.workers.reduce((n, w) => n + w.steps, 0);
    const acc = { slots: 0, turns: 0, inferenceMs: 0, turnMs: 0 };
    const gather = (batch: Batch) => {
      for (const g of batch.groups) {
        let longest = 0;
        for (const r of g.rollouts) {
          longest = Math.max(longest, r.turns.length);
          for (const t of r.turns) {
            acc.turns++;
            acc.inferenceMs += t.timings.inferenceMs;
            acc.turnMs += t.timings.totalMs;
          }
        }
        acc.slots += longest * g.rollouts.length;
      }
    };
    const mockCpu0 = o.mock?.cpuMs() ?? null;
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    let turns = 0;
    while (performance.now() - t0 < o.seconds * 1000) {
      const batch = await engine.getBatch();
      turns += batch.stats?.turns ?? 0;
      if (o.detail) gather(batch);
    }
    const elapsed = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    const mockCpu1 = o.mock?.cpuMs() ?? null;
    const after = await engine.stats();
    const steps = after.workers.reduce((n, w) => n + w.steps, 0) - steps0;
    // Inference calls (turns) are the unit the bare loop also counts; env steps can be one fewer per
    // episode (a `length` finish ends it without a step). Count turns from the workers' step counter
    // when it is larger (it includes groups still in the buffer).
    return {
      operations: Math.max(turns, steps),
      seconds: elapsed,
      cpuMs: (cpu.user + cpu.system) / 1000,
      workerLoopDelayMeanMs: Math.max(0, after.workers.reduce((n, w) => n + w.eventLoopDelayMeanMs, 0) / Math.max(1, after.workers.length) - WORKER_LOOP_MONITOR_RESOLUTION_MS),
      mockCpuMs: mockCpu0 !== null && mockCpu1 !== null ? mockCpu1 - mockCpu0 : null,
      detail: o.detail
        ? { groupOccupancy: acc.turns / Math.max(1, acc.slots), meanInferenceMs: acc.inferenceMs / Math.max(1, acc.turns), meanTurnMs: acc.turnMs / Math.max(1, acc.turns), turns: acc.turns }
        : null,
    };
  } finally {
    await engine.close();
  }
}

/** What one engine step sends: a guess-number turn, built like the agent loop builds it. */
function chatBody(maxTokens: number): string {
  return JSON.stringify({
    model: 'mock-policy',
    messages: [
      { role: 'system', content: 'You are playing a number guessing game. Reply with a single integer.' },
      { role: 'user', content: "I'm thinking of an integer between 1 and 100. What is your guess?" },
    ],
    max_tokens: maxTokens,
    temperature: 1,
    logprobs: true,
    return_token_ids: true,
  });
}

/** The bare side: `concurrency` loops sending the same chat body over one undici Pool, for `seconds`. */
export async function bareLoop({ url, concurrency, seconds, maxTokens }: { url: string; concurrency: number; seconds: number; maxTokens: number }): Promise<Sample> {
  const origin = new URL(url).origin;
  const pool = new Pool(origin, { connections: concurrency, headersTimeout: 60_000, bodyTimeout: 60_000 });
  const body = chatBody(maxTokens);
  let operations = 0;
  let stop = false;
  const worker = async () => {
    while (!stop) {
      const res = await pool.request({ method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json' }, body });
      const reply = JSON.parse(await res.body.text()) as { choices: { message: { content: string } }[] };
      if (typeof reply.choices[0].message.content !== 'string') throw new Error('bad reply');
      operations++;
    }
  };
  // warm-up: open the connections
  stop = false;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const timer = setTimeout(() => (stop = true), seconds * 1000);
  await Promise.all(Array.from({ length: concurrency }, worker));
  clearTimeout(timer);
  const elapsed = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  await pool.close();
  return { operations, seconds: elapsed, cpuMs: (cpu.user + cpu.system) / 1000 };
}

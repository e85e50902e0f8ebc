/**
 * One timed engine run for the bench: exactly `concurrency` rollouts in flight (groupsPerWorker ×
 * threads × groupSize), the async producer with over-sampling and no staleness limit so that capacity
 * stays full between batches, batches taken back to back for `seconds`.
 *
 * The unit is the inference call (turn), as on the bare loop's and the Python loop's side; CPU is
 * process.cpuUsage() over the window (coordinator and every worker thread, not the mock server).
 */
import { Pool } from 'undici';
import {
  FIRST_GUESS_PROMPT,
  GUESS_NUMBER_DEFAULTS,
  GUESS_NUMBER_SYSTEM_PROMPT,
  guessNumberTaskText,
} from '../../src/env/synthetic/guess-number.ts';
import { resolveConfig } from '../../src/config.ts';
import { createEngine, type Batch, type TurnRecord } from '../../src/index.ts';
import { chatPayload, LlmClient } from '../../src/llm/client.ts';
import type { ChatRequest } from '../../src/llm/request.ts';
import type { MockProcess } from '../../src/loadtest/mock-process.ts';
import { threadCpuMs } from './machine.ts';

/** src/worker/worker-runtime.ts: monitorEventLoopDelay({ resolution: 10 }); its mean includes the interval. */
const WORKER_LOOP_MONITOR_RESOLUTION_MS = 10;
/** Batches taken before the measured window, at least one. */
const WARM_UP_MS = 1_000;

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
  /** Keep up to this many chat bodies the engine sent (built from the turns taken), for the bare loop. */
  recordBodies?: number;
  /** Streamed replies (llm.stream): the cost of reading server-sent events instead of one body. */
  stream?: boolean;
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
  /**
   * CPU over the window by thread (ms): the main thread, the worker threads (by the OS thread ids they
   * report), and the rest (V8's GC and compiler helpers, libuv's pool); null where /proc is unreadable.
   */
  cpuSplit: { mainMs: number; workersMs: number; helpersMs: number } | null;
  /** With `recordBodies`: the chat bodies of the turns taken, as the engine's client serialised them. */
  bodies: string[];
}

export async function engineThroughput(o: ThroughputOptions): Promise<ThroughputSample> {
  const groupsInFlight = Math.max(1, Math.round(o.concurrency / o.groupSize));
  const rolloutsPerWorker = Math.ceil(o.concurrency / o.threads);
  const engine = createEngine({
    logLevel: 'warn',
    llm: { url: o.url, connections: rolloutsPerWorker + 8, stream: o.stream ?? false },
    batchSize: groupsInFlight,
    // Without slack: exactly `concurrency` rollouts held (the pool's capacity), finished ones waiting for
    // their group. With it: exactly `concurrency` episodes playing (episode slots), each worker holding
    // that many more groups, whose rollouts take the slot of one that ended before its siblings.
    // Async production with over-sampling keeps the workers supplied between batches, as a steady loop does.
    workers: !o.groupSlack
      ? { threads: o.threads, groupsPerWorker: Math.ceil(groupsInFlight / o.threads) }
      : {
          threads: o.threads,
          rolloutsPerWorker,
          groupsPerWorker: Math.ceil(((1 + o.groupSlack) * rolloutsPerWorker) / o.groupSize),
        },
    producer: { strategy: 'async', maxStaleness: 1_000_000, overSampleThreshold: 1 },
    tasks: [
      {
        name: 'guess',
        env: { module: 'builtin:guess-number', params: o.envParams ?? {} },
        groupSize: o.groupSize,
        maxSteps: 8,
        maxTokens: o.maxTokens,
      },
    ],
  });
  await engine.start();
  try {
    // Warm-up: workers loaded, connections open, and the workers' code optimised — each run starts
    // new worker threads, whose JIT compiles everything again on V8's helper threads.
    const warmUntil = performance.now() + WARM_UP_MS;
    do await engine.getBatch();
    while (performance.now() < warmUntil);
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
    // Turns only, in the window: their bodies are serialised after it, off the engine's CPU figure.
    const recorded: TurnRecord[] = [];
    const record = (batch: Batch) => {
      for (const g of batch.groups)
        for (const r of g.rollouts)
          for (const t of r.turns) {
            if (recorded.length >= (o.recordBodies ?? 0)) return;
            recorded.push(t);
          }
    };
    const threads0 = threadCpuMs();
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    let turns = 0;
    while (performance.now() - t0 < o.seconds * 1000) {
      const batch = await engine.getBatch();
      turns += batch.stats?.turns ?? 0;
      if (o.detail) gather(batch);
      if (o.recordBodies) record(batch);
    }
    const elapsed = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    const threads1 = threadCpuMs();
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
      workerLoopDelayMeanMs: Math.max(
        0,
        after.workers.reduce((n, w) => n + w.eventLoopDelayMeanMs, 0) / Math.max(1, after.workers.length) -
          WORKER_LOOP_MONITOR_RESOLUTION_MS,
      ),
      cpuSplit: cpuSplit(
        threads0,
        threads1,
        after.workers.map((w) => w.osThreadId),
      ),
      bodies: recorded.map((t) =>
        JSON.stringify(
          chatPayload(CLIENT, {
            messages: t.messages,
            maxTokens: o.maxTokens,
            temperature: 1,
            seed: t.seed ?? undefined,
          }),
        ),
      ),
      mockCpuMs: mockCpu0 !== null && mockCpu1 !== null ? mockCpu1 - mockCpu0 : null,
      detail: o.detail
        ? {
            groupOccupancy: acc.turns / Math.max(1, acc.slots),
            meanInferenceMs: acc.inferenceMs / Math.max(1, acc.turns),
            meanTurnMs: acc.turnMs / Math.max(1, acc.turns),
            turns: acc.turns,
          }
        : null,
    };
  } finally {
    await engine.close();
  }
}

function cpuSplit(
  before: Map<number, number> | null,
  after: Map<number, number> | null,
  workerTids: (number | null)[],
): ThroughputSample['cpuSplit'] {
  if (before === null || after === null || workerTids.some((tid) => tid === null)) return null;
  const workers = new Set(workerTids);
  const split = { mainMs: 0, workersMs: 0, helpersMs: 0 };
  for (const [tid, ms] of after) {
    const used = ms - (before.get(tid) ?? 0);
    if (tid === process.pid) split.mainMs += used;
    else if (workers.has(tid)) split.workersMs += used;
    else split.helpersMs += used;
  }
  return split;
}

/**
 * The engine's client options that shape a chat body (the config defaults with the mock's model name):
 * the bare loop sends the very bodies the engine sent, serialised by the client's own chatPayload.
 */
const CLIENT = { model: 'mock-policy', logprobs: true, returnTokenIds: true };

/** A first-turn guess-number body with the env's defaults: the bare references for pauses and memory send it. */
export function firstTurnBody(maxTokens: number): string {
  return JSON.stringify(
    chatPayload(CLIENT, {
      messages: [
        {
          role: 'system',
          content: `${GUESS_NUMBER_SYSTEM_PROMPT} ${guessNumberTaskText(GUESS_NUMBER_DEFAULTS.min, GUESS_NUMBER_DEFAULTS.max, GUESS_NUMBER_DEFAULTS.maxTurns)}`,
        },
        { role: 'user', content: FIRST_GUESS_PROMPT },
      ],
      maxTokens,
      temperature: 1,
    }),
  );
}

/** A plain loop's run: `concurrency` loops against `url` for `seconds`, sending the recorded `bodies` in turn. */
interface LoopOptions {
  url: string;
  concurrency: number;
  seconds: number;
  bodies: readonly string[];
  mock?: Pick<MockProcess, 'cpuMs'>;
}

/**
 * The bare side: `concurrency` loops over one undici Pool for `seconds`, sending `bodies` in turn — the
 * chat bodies the engine sent (every turn of its conversations, so later turns' longer prompts too).
 */
export async function bareLoop({
  url,
  concurrency,
  seconds,
  bodies,
  mock,
}: LoopOptions): Promise<Sample & { mockCpuMs: number | null }> {
  if (bodies.length === 0) throw new Error('bareLoop needs at least one chat body');
  const origin = new URL(url).origin;
  const pool = new Pool(origin, { connections: concurrency, headersTimeout: 60_000, bodyTimeout: 60_000 });
  let next = 0;
  const sample = await timedLoops(concurrency, seconds, mock, async () => {
    const body = bodies[next++ % bodies.length];
    const res = await pool.request({
      method: 'POST',
      path: '/v1/chat/completions',
      headers: { 'content-type': 'application/json' },
      body,
    });
    const reply = JSON.parse(await res.body.text()) as { choices: { message: { content: string } }[] };
    if (typeof reply.choices[0].message.content !== 'string') throw new Error('bad reply');
  });
  await pool.close();
  return sample;
}

/**
 * The engine's own inference client (src/llm/client.ts, the settings a worker gives it) in a plain
 * loop on one thread: `concurrency` loops over one LlmClient, each call the request of a recorded
 * body (its messages, max_tokens, temperature and seed), so it sends the very bytes the engine and
 * the bare loop sent. What the client adds to the bare loop per call — the body serialised from the
 * conversation, the reply read into typed arrays — without the agent loop, the environment, the
 * group's hop between threads or the coordinator: the part of an engine step no change outside the
 * client can cut.
 */
export async function clientLoop({
  url,
  concurrency,
  seconds,
  bodies,
  mock,
}: LoopOptions): Promise<Sample & { mockCpuMs: number | null }> {
  if (bodies.length === 0) throw new Error('clientLoop needs at least one chat body');
  const requests = bodies.map((b): ChatRequest => {
    const j = JSON.parse(b) as {
      messages: ChatRequest['messages'];
      max_tokens: number;
      temperature: number;
      seed?: number;
    };
    return { messages: j.messages, maxTokens: j.max_tokens, temperature: j.temperature, seed: j.seed };
  });
  const { llm } = resolveConfig({ llm: { url, connections: concurrency } });
  const client = new LlmClient({
    url,
    model: CLIENT.model,
    apiKey: null,
    timeoutMs: llm.timeoutMs,
    maxReplyBytes: llm.maxReplyBytes,
    retries: 0,
    retryBackoffMs: llm.retryBackoffMs,
    connections: concurrency,
    returnTokenIds: CLIENT.returnTokenIds,
    logprobs: CLIENT.logprobs,
    server: { kind: 'generic', contextLength: null },
  });
  let next = 0;
  const sample = await timedLoops(concurrency, seconds, mock, async () => {
    const reply = await client.chat(requests[next++ % requests.length]);
    if (reply.responseIds === null || reply.logprobs === null) throw new Error('reply without token ids or logprobs');
  });
  await client.close();
  return sample;
}

/**
 * `concurrency` loops, each making `call` back to back until `seconds` are up: the calls made, the
 * time taken, and the CPU this process (and the mock, when given) spent meanwhile.
 */
async function timedLoops(
  concurrency: number,
  seconds: number,
  mock: Pick<MockProcess, 'cpuMs'> | undefined,
  call: () => Promise<void>,
): Promise<Sample & { mockCpuMs: number | null }> {
  let operations = 0;
  let stop = false;
  const loop = async () => {
    while (!stop) {
      await call();
      operations++;
    }
  };
  const mockCpu0 = mock?.cpuMs() ?? null;
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const timer = setTimeout(() => (stop = true), seconds * 1000);
  try {
    await Promise.all(Array.from({ length: concurrency }, loop));
  } finally {
    clearTimeout(timer);
  }
  const elapsed = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const mockCpu1 = mock?.cpuMs() ?? null;
  return {
    operations,
    seconds: elapsed,
    cpuMs: (cpu.user + cpu.system) / 1000,
    mockCpuMs: mockCpu0 !== null && mockCpu1 !== null ? mockCpu1 - mockCpu0 : null,
  };
}

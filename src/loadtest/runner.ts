/**
 * Drives the engine for a load test the way a trainer would: take batches for consecutive train
 * steps, and sync weights (pause → load → resume) when the async producer reports EXPIRED_BATCH or
 * when `pauseEveryS` says so. Meanwhile it samples the engine (worker counters, memory) and records
 * every batch and pause. Only the public API is used.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { EngineConfigInput } from '../config.ts';
import type { EngineStats } from '../coordinator/engine-core.ts';
import type { Batch } from '../domain/batch.ts';
import { createEngine, type Engine } from '../engine.ts';
import type { GpuMetrics } from '../mock-llm/gpu.ts';
import type { MockProcess } from './mock-process.ts';
import type { LoadtestOptions } from './options.ts';
import { Recorder, type PauseReason, type Sample } from './recorder.ts';
import { readGpu, setMockWeightVersion } from './training.ts';

/** How often the engine is sampled; short enough to catch the moments production is full. */
const SAMPLE_INTERVAL_MS = 200;
/** Workers load their modules after start(); stats() only lists the ones that registered. */
const WORKER_START_TIMEOUT_MS = 20_000;

export interface EngineRun {
  recorder: Recorder;
  /** Sampled while paused before the window started: nothing in flight, workers loaded. */
  baseline: Sample;
  /** The measured window in seconds (start-up and shutdown excluded). */
  seconds: number;
  /** process.cpuUsage() over the window: coordinator and every worker thread of this process. */
  cpu: { userMs: number; systemMs: number };
  /** The mock server process's CPU over the window; null where it cannot be read. */
  mockCpuMs: number | null;
  /** Engine counters when the window ended. */
  stats: EngineStats;
  /** What the engine resolved (the report shows these over the options asked for). */
  engineSettings: {
    batchSize: number;
    groupsPerWorker: number;
    connectionsPerWorker: number;
    partialRollout: boolean;
    staleRollouts: 'reset' | 'keep';
  };
  notes: string[];
}

function engineConfig(options: LoadtestOptions, llmUrl: string): EngineConfigInput {
  const groups = Math.ceil(options.rollouts / options.groupSize);
  const rolloutsPerWorker = Math.ceil(options.rollouts / options.workers);
  return {
    logLevel: (process.env.LOG_LEVEL as EngineConfigInput['logLevel']) ?? 'warn',
    seed: options.seed,
    batchSize: groups,
    // Every group of a batch must be able to run at once, and every rollout needs its connection.
    workers: options.episodeSlots
      ? {
          threads: options.workers,
          rolloutsPerWorker,
          groupsPerWorker: Math.ceil((1.5 * rolloutsPerWorker) / options.groupSize) + 1,
        }
      : { threads: options.workers, groupsPerWorker: Math.ceil(groups / options.workers) + 1 },
    llm: {
      url: llmUrl,
      connections: Math.ceil((groups * options.groupSize) / options.workers) + 8,
      abortPath: '/admin/abort',
      stream: options.stream,
    },
    tasks: options.envs.map((env) => ({
      name: env,
      env: { module: `builtin:${env}`, params: { cpuCostUs: options.envCpuUs } },
      groupSize: options.groupSize,
      maxSteps: env === 'arithmetic' ? 1 : 8,
      maxTokens: options.maxTokens,
    })),
    producer: {
      strategy: options.strategy,
      maxStaleness: options.maxStaleness,
      partialRollout: true,
      ...(options.strategy === 'async' ? { staleRollouts: options.staleRollouts } : {}),
    },
    pause: { mode: options.pauseMode },
  };
}

export async function runEngine(options: LoadtestOptions, mock: MockProcess): Promise<EngineRun> {
  const config = engineConfig(options, mock.url);
  const engine = createEngine(config);
  const recorder = new Recorder();
  const notes: string[] = [];
  try {
    await engine.start();
    await waitForWorkers(engine, options.workers, notes);

    // Baseline: workers up, nothing in flight. The async producer starts at once, so pause it first.
    const gpu = options.capacity === null ? null : () => readGpu(mock.url);
    await engine.pauseForWeightUpdate();
    const baseline = await sample(engine, recorder, gpu);
    await engine.resume({ modelStep: 0 });

    return await measure(engine, options, mock, recorder, baseline, notes, gpu);
  } finally {
    await engine.close();
  }
}

async function measure(
  engine: Engine,
  options: LoadtestOptions,
  mock: MockProcess,
  recorder: Recorder,
  baseline: Sample,
  notes: string[],
  gpu: (() => Promise<GpuMetrics>) | null,
): Promise<EngineRun> {
  recorder.startWindow();
  /** The trainer's and the loader's times are GPU time: the GPU-like mock runs this many times faster. */
  const speedup = options.capacity?.speedup ?? 1;
  const cpu0 = process.cpuUsage();
  const mockCpu0 = mock.cpuMs();
  let step = 1;
  let modelStep = 0;
  let stopping = false;
  let inGetBatch = false;
  /** The weight sync under way, if any (a holder: it is set and cleared in callbacks). */
  const current: { sync: Promise<void> | null } = { sync: null };

  /** One weight sync at a time: a second request (timer and EXPIRED_BATCH together) joins the one running. */
  const syncWeights = (reason: PauseReason): Promise<void> => {
    current.sync ??= (async () => {
      const t = recorder.now();
      const inFlightBefore = recorder.lastSample()?.inFlightRollouts ?? 0;
      const report = await engine.pauseForWeightUpdate();
      const resumeStart = performance.now();
      // Loading the new weights: the servers stand idle meanwhile.
      if (options.loadMs > 0) await sleep(options.loadMs / speedup);
      // The trainer has trained steps 1..step-1: those are the weights it would push now.
      const next = Math.max(modelStep, step - 1);
      await setMockWeightVersion(mock.url, next);
      await engine.resume({ modelStep: next });
      modelStep = next;
      recorder.addPause(
        report,
        { reason, inFlightBefore, modelStep: next, resumeMs: performance.now() - resumeStart },
        t,
      );
    })().finally(() => (current.sync = null));
    return current.sync;
  };

  let sampling: Promise<unknown> | null = null;
  const sampler = setInterval(() => {
    sampling ??= sample(engine, recorder, gpu).finally(() => (sampling = null));
  }, SAMPLE_INTERVAL_MS);
  /** A scheduled sync runs beside the loop: its failure is rethrown there, not lost. */
  let timerFailure: unknown = null;
  const pauseTimer =
    options.pauseEveryS === null
      ? undefined
      : setInterval(() => {
          // A sync already under way (EXPIRED_BATCH) does not replace the scheduled one: it runs right after.
          void (current.sync ?? Promise.resolve())
            .catch(() => undefined)
            .then(() => (stopping ? undefined : syncWeights('scheduled')))
            .catch((err: unknown) => (timerFailure ??= err));
        }, options.pauseEveryS * 1000);

  // Set from the deadline timer; an object so the compiler does not narrow them to their initial null.
  const closing: { end: WindowEnd | null; done: Promise<void> | null } = { end: null, done: null };
  const deadline = setTimeout(() => {
    closing.done = (async () => {
      stopping = true;
      closing.end = { seconds: recorder.now(), cpu: process.cpuUsage(cpu0), mockCpuMs: mock.cpuMs() };
      clearInterval(sampler);
      clearInterval(pauseTimer);
      await sampling;
      await sample(engine, recorder, gpu);
      // A batch in production would hold the run past its duration: a pause makes getBatch return.
      if (inGetBatch && current.sync === null) await engine.pauseForWeightUpdate();
    })();
  }, options.durationS * 1000);

  try {
    while (!stopping) {
      inGetBatch = true;
      let batch: Batch;
      try {
        batch = await engine.getBatch(step);
      } finally {
        inGetBatch = false;
      }
      if (timerFailure !== null) throw timerFailure;
      if (stopping) break;
      if (batch.status === 'NORMAL') {
        recorder.addBatch(batch);
        // "Training": async production goes on meanwhile.
        const trainMs = options.trainMs + (batch.stats.responseTokens * options.trainMsPerToken) / speedup;
        if (trainMs > 0) await sleep(trainMs);
        step++;
        // The trainer pushes the weights of the steps it has trained (step - 1 of them by now).
        if (options.syncEvery !== null && (step - 1) % options.syncEvery === 0 && !stopping)
          await syncWeights('scheduled');
      } else if (batch.status === 'EXPIRED_BATCH') {
        await syncWeights('expired-batch');
      } else {
        // UPDATE_WEIGHT_AND_ABORT: a sync is under way; ask again once it resumed (never spin if none is).
        await (current.sync ?? sleep(SAMPLE_INTERVAL_MS));
      }
    }
  } finally {
    stopping = true;
    clearTimeout(deadline);
    clearInterval(sampler);
    clearInterval(pauseTimer);
    await closing.done?.catch(() => undefined);
    await current.sync?.catch(() => undefined);
  }
  await closing.done; // rethrows a failure of the closing figures
  const finished = closing.end;
  if (finished === null) throw new Error('loadtest: the measured window ended without its closing figures');
  if (recorder.batches.length === 0)
    notes.push(`no batch was completed in ${options.durationS} s: raise --duration or lower --latency-ms / --rollouts`);
  const resolved = engine.config;
  return {
    recorder,
    baseline,
    seconds: finished.seconds,
    cpu: { userMs: finished.cpu.user / 1000, systemMs: finished.cpu.system / 1000 },
    mockCpuMs: finished.mockCpuMs !== null && mockCpu0 !== null ? finished.mockCpuMs - mockCpu0 : null,
    stats: await engine.stats(),
    engineSettings: {
      batchSize: resolved.batchSize,
      groupsPerWorker: resolved.workers.groupsPerWorker,
      connectionsPerWorker: resolved.llm.connections,
      partialRollout: resolved.producer.partialRollout,
      staleRollouts: resolved.producer.staleRollouts,
    },
    notes,
  };
}

interface WindowEnd {
  seconds: number;
  cpu: NodeJS.CpuUsage;
  mockCpuMs: number | null;
}

async function sample(engine: Engine, recorder: Recorder, gpu: (() => Promise<GpuMetrics>) | null): Promise<Sample> {
  const [stats, gpuMetrics] = await Promise.all([engine.stats(), gpu?.() ?? null]);
  const memory = process.memoryUsage();
  let inFlightRollouts = 0;
  let agentSteps = 0;
  let heapBytes = memory.heapUsed;
  for (const w of stats.workers) {
    inFlightRollouts += w.inFlightRollouts;
    agentSteps += w.steps;
    heapBytes += w.heapUsedBytes;
  }
  return recorder.addSample({
    workers: stats.workers.length,
    inFlightRollouts,
    agentSteps,
    rssBytes: memory.rss,
    heapBytes,
    gpu: gpuMetrics,
  });
}

async function waitForWorkers(engine: Engine, threads: number, notes: string[]): Promise<void> {
  const started = performance.now();
  let live = 0;
  while (performance.now() - started < WORKER_START_TIMEOUT_MS) {
    live = (await engine.stats()).workers.length;
    if (live >= threads) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  notes.push(
    `only ${live} of ${threads} workers answered stats within ${WORKER_START_TIMEOUT_MS} ms: memory and step counts miss the others`,
  );
}

/**
 * What a load test runs: the knobs of `rollout loadtest` as typed values, with their defaults.
 * The CLI (src/cli/loadtest.ts) turns flags into these; `runLoadtest` takes them as they are.
 */
import { availableParallelism } from 'node:os';

export const LOADTEST_ENVS = ['guess-number', 'arithmetic', 'tool-lookup'] as const;
export type LoadtestEnv = (typeof LOADTEST_ENVS)[number];

export interface LoadtestOptions {
  /** Rollouts in flight (rounded up to whole groups): batchSize = ceil(rollouts / groupSize). */
  rollouts: number;
  groupSize: number;
  /**
   * Count episodes playing instead of rollouts held (workers.rolloutsPerWorker = rollouts ÷ workers,
   * each worker holding half as many groups again): a rollout that ends before its siblings hands its
   * slot on, so calls in flight stay at `rollouts`.
   */
  episodeSlots: boolean;
  /** Built-in synthetic environments, one task each, sharing the batch equally. */
  envs: LoadtestEnv[];
  /** Mock server: fixed latency per request, generation rate (0 = instant), filler tokens per answer. */
  latencyMs: number;
  tokensPerSecond: number;
  thinkTokens: number;
  /** Environment CPU burnt per step (the synthetic envs' `cpuCostUs` param), in µs. */
  envCpuUs: number;
  maxTokens: number;
  workers: number;
  /** Time the stand-in trainer spends on each batch before asking for the next (0 = takes them back to back). */
  trainMs: number;
  /**
   * The GPU-like mock (`rollout mock-llm --capacity`): slots, median response length (null = the
   * think tokens), σ of log(length), GPU ms per real ms; null = the fixed-latency mock. With it the
   * report shows the servers' busy fraction and slot fill, and times below are GPU time.
   */
  capacity: { slots: number; responseTokens: number | null; lengthSigma: number; speedup: number } | null;
  /** The simulated trainer: GPU ms of training per response token taken (0 = none), on top of trainMs. */
  trainMsPerToken: number;
  /** Sync weights after every this many batches (pause, `loadMs`, resume); null = only on EXPIRED_BATCH and --pause-every. */
  syncEvery: number | null;
  /** GPU ms a weight sync spends loading the weights, between the pause and the resume. */
  loadMs: number;
  /** Measured time, after start-up. */
  durationS: number;
  strategy: 'sync' | 'async';
  /** Pause for a weight update every this many seconds; null = only when the async producer asks (EXPIRED_BATCH). */
  pauseEveryS: number | null;
  pauseMode: 'abort' | 'drain' | 'in-place';
  /**
   * Streamed replies (llm.stream): the mock sends the tokens generated every `streamIntervalMs`, and an
   * aborting pause holds each call with the tokens it has instead of waiting for the aborted replies.
   */
  stream: boolean;
  streamIntervalMs: number;
  /** async: weight syncs a sample may lag (producer.maxStaleness). */
  maxStaleness: number;
  /** async: a rollout past that bound is reset and generated again, or kept and trained as it is (producer.staleRollouts). */
  staleRollouts: 'reset' | 'keep';
  seed: number;
  /** Where report.json and report.html go. */
  outDir: string;
}

export function defaultLoadtestOptions(outDir: string): LoadtestOptions {
  return {
    rollouts: 256,
    groupSize: 4,
    episodeSlots: false,
    envs: ['guess-number', 'arithmetic'],
    latencyMs: 20,
    tokensPerSecond: 0,
    thinkTokens: 16,
    envCpuUs: 0,
    maxTokens: 512,
    workers: availableParallelism(),
    trainMs: 0,
    capacity: null,
    trainMsPerToken: 0,
    syncEvery: null,
    loadMs: 0,
    durationS: 10,
    strategy: 'async',
    pauseEveryS: null,
    pauseMode: 'abort',
    stream: false,
    streamIntervalMs: 20,
    maxStaleness: 1,
    staleRollouts: 'reset',
    seed: 0,
    outDir,
  };
}

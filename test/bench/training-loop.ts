/**
 * Issue 21: the end-to-end speed-up of asynchronous production on GPU-like mocks. One simulated RL
 * training loop (src/loadtest/training.ts: take a batch, train for a time proportional to its
 * tokens, sync weights — pause, load, resume), the same workload measured side by side in one run:
 *
 *   sync            producer.strategy sync: each batch produced on demand, the servers idle while the
 *                   trainer trains, and every batch waits for its longest rollout
 *   async           strategy async, maxStaleness 1: production runs while the trainer trains; a
 *                   weight sync aborts the rollouts in flight, which restart from their prompt
 *   async+partial   the same with partialRollout: aborted rollouts continue with the new weights
 *   async+in-place  the same, the weights loaded in place (pause.mode in-place): the servers keep every
 *                   call in flight, KV cache and all, and go on after the resume
 *   async+strict    async+in-place paced for strict staleness (issue 31.3): producer.admission deadline
 *                   (a group beyond the next batch starts only when predicted to be taken inside the
 *                   bound), takeOrder stalest, llm.priority trajectory against servers with priority
 *                   scheduling; nothing past the bound is trained (`strict*` options, --strict-… flags)
 *   async+keep      async+in-place with stale rollouts kept (producer.staleRollouts keep): a rollout
 *                   past the stale threshold is trained as it is, the threshold only bounds how far
 *                   production runs ahead (AReaL's admission bound); each side reports how stale what
 *                   it took was
 *   python sync     test/bench/python_baseline.py --mode sync-trainer: the seed-style asyncio loop
 *                   grown into the same sync trainer (batch, wait for all, train, sync)
 *
 * Workload: guess-number (multi-turn, ≤ `turns` turns) whose prompts differ by their range (so the
 * mock's per-prompt lengths differ), response lengths log-normal (median `responseTokens`, σ
 * `lengthSigma`, cut at `maxTokens`; by default the anchors' tail: p99 20× the median), each side
 * against fresh mocks. Figures are GPU time (the mocks run `speedup` GPU ms per real ms). The mocks'
 * cost profile (`--profile`, default h200-8b: fitted on a measured H200) and the trainer's speed
 * (`--train-ms-per-token`, default 0.074 then 0.09: every side at each) are knobs; every speed-up is
 * printed beside the workload's ceiling at that trainer speed.
 *
 * Each async side warms up for its staleness bound's number of train steps before the measured ones
 * (`--warmup-steps` to set it): until then nothing can be past the bound, and a window that opened
 * at the first batch reported "nothing thrown away" of runs too short to throw anything away.
 *
 *   node --import tsx test/bench/training-loop.ts            # the full section at both trainer speeds
 *   node --import tsx test/bench/training-loop.ts --quick    # a smoke run
 *   node --import tsx test/bench/training-loop.ts --profile h100-8b-flat --train-ms-per-token 0.074
 *                                                            # the mock and trainer of the runs before the calibration
 *   npm run bench                                            # runs it too, with every other part
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { createEngine, type GroupCounts } from '../../src/index.ts';
import { rolloutStaleness, staleThreshold } from '../../src/buffer/staleness.ts';
import { rolloutMinModelStep } from '../../src/domain/rollout.ts';
import { startMockProcess, type MockProcess } from '../../src/loadtest/mock-process.ts';
import { noDiscards, runTrainingLoop, type DiscardTally, type TrainingFigures } from '../../src/loadtest/training.ts';
import {
  fullSlotTokensPerSecond,
  GPU_DEFAULTS,
  GPU_PROFILE_NAMES,
  GPU_PROFILES,
  type GpuProfileName,
} from '../../src/mock-llm/gpu.ts';
import { runPythonTrainer } from './python-baseline.ts';
import { row, type TargetRow } from './targets.ts';
import { AGENTIC_ENV_MODULE, longTailDataset, type LongTailWorkload } from './workloads/long-tail.ts';

/**
 * The simulated trainer's GPU ms per trained token of an 8B model (docs/MOCK-CALIBRATION.md, "The
 * trainer"): `fineTune` is a plain fine-tune on one H200 at ≈ 80 % of its measured bf16 matmul peak
 * (the bench's trainer until the calibration, then chosen as "as long per token as generation at full
 * speed"); `measured` is what a real forward + backward + AdamW step reached on the same H200 (65–74 %
 * MFU: 0.087–0.09 ms). A GRPO step that also recomputes old or reference logprobs costs more again.
 */
export const TRAINER_MS_PER_TOKEN = Object.freeze({ fineTune: 0.074, measured: 0.09 });

export interface TrainingBenchOptions {
  quick: boolean;
  /** The GPU-like mocks' cost profile (gpu.ts GPU_PROFILES). */
  profile: GpuProfileName;
  servers: number;
  slots: number;
  speedup: number;
  responseTokens: number;
  lengthSigma: number;
  maxTokens: number;
  turns: number;
  groupSize: number;
  /** Groups per batch. */
  groups: number;
  steps: number;
  /** GPU ms of training per token taken (this run's trainer). */
  trainMsPerToken: number;
  /** The trainer speeds trainingBenches runs the sides at, one after the other (the first is the headline). */
  trainerSpeeds: number[];
  loadMs: number;
  overSample: number;
  /**
   * The async sides sync weights every this many steps (producer.syncWeightsInterval, as verl's
   * fully async mode's trigger_parameter_sync_step): staleness counts syncs, so at maxStaleness 1 a
   * rollout may then span (1 + 1) × this many steps. The sync sides sync every step (on-policy).
   */
  asyncSyncEvery: number;
  /** producer.maxStaleness on the async sides (the issue's target is at 1). */
  maxStaleness: number;
  /** workers.rolloutsPerWorker on the async sides; 0 = null (every rollout of the groups in flight). */
  episodeSlots: number;
  /**
   * tasks[].messageCut on every side. 0 sends the whole conversation, as verl, slime and AReaL do for
   * multi-turn RL (one exact sample per episode); 3, the engine's default, keeps the system message
   * and the last five messages, so from turn 4 on a prompt no longer extends the last and the
   * servers' prefix cache misses.
   */
  messageCut: number;
  /** producer.takeOrder on the async sides: which retried group is sent out first, and which stored group is taken first. */
  takeOrder: 'fifo' | 'stalest';
  /**
   * async+strict: producer.maxStaleness there (the other async sides take `maxStaleness`). Issue
   * 31.3 fixes no bound, only that nothing past it is trained and the mean; wider than the others'
   * lets the long replies land inside it.
   */
  strictMaxStaleness: number;
  /** async+strict: groups over-sampled (producer.overSampleThreshold), paced by the admission below. */
  strictOverSample: number;
  /** async+strict: llm.priority trajectory against servers with priority scheduling on. */
  strictPriority: boolean;
  /** async+strict: producer.admission (deadline: paced by the staleness bound). */
  strictAdmission: 'eager' | 'deadline';
  /** async+strict: producer.admissionQuantile. */
  strictQuantile: number;
  /**
   * Train steps each async side runs before its measured `steps`; null: its own staleness bound in
   * train steps ((maxStaleness + 1) × asyncSyncEvery), before which it can expire nothing. The sync
   * sides start measuring at once: each of their steps starts from empty servers.
   */
  warmupSteps: number | null;
  /**
   * An agentic long-tail workload (workloads/long-tail.ts) in place of guess-number: its environment,
   * dataset and env latencies; the sizes above are set from it by `longTailOptions`. null: guess-number.
   */
  workload: LongTailWorkload | null;
}

export function trainingBenchDefaults(quick: boolean): TrainingBenchOptions {
  return {
    quick,
    profile: GPU_DEFAULTS.profile,
    servers: 1,
    slots: GPU_DEFAULTS.slots,
    speedup: 5,
    // The anchors' workload (test/bench/README.md, "The workload"): ROLL Flash measured the longest
    // responses at more than 20× the median; σ 1.3 puts the p99 at 20× (σ 1: 10×), and the cut at
    // 4 096 (25.6× the median) lets that tail through, where 1 024 cut it at 6.4×.
    responseTokens: 160,
    lengthSigma: 1.3,
    maxTokens: 4096,
    turns: 4,
    groupSize: 8,
    groups: quick ? 16 : 32,
    steps: quick ? 4 : 8,
    trainMsPerToken: TRAINER_MS_PER_TOKEN.fineTune,
    trainerSpeeds: [TRAINER_MS_PER_TOKEN.fineTune, TRAINER_MS_PER_TOKEN.measured],
    loadMs: 2_000,
    // At 1, a fifth of the slots stay empty while the longest rollouts of a batch finish (82 % filled);
    // 1.5 keeps them full. The sweep (training-sweep.ts) shows 0.25 to 2.
    overSample: 1.5,
    asyncSyncEvery: 2,
    maxStaleness: 1,
    episodeSlots: 0,
    // Measured 2026-11-29 (docs/PERFORMANCE-HISTORY.md, "Runs of 2026-11-29 05:55–06:25"): with 3 the prefix
    // cache hit 61–63 % and prefill took 16–17 % of the async sides' busy time, with 0 94 % and 3 %.
    messageCut: 0,
    takeOrder: 'fifo',
    // Measured on today's workload (docs/SCHEDULING.md, "Strict staleness at speed"): at 0.9 and 1
    // nothing was thrown away at the in-place side's speed; 0.85 and 1.5 ran a little faster and threw
    // away 9 %.
    strictOverSample: 1,
    // Measured after a warm-up of the bound's steps (docs/PERFORMANCE-HISTORY.md, "The window, corrected"):
    // at 3, 3.7 % of the tokens thrown away on today's workload and 3.3 / 2.5 % on the long tail; at
    // 4, 0.0 % and 0.0 / 1.6 %, a little slower, the mean staleness 0.1–0.3 train steps higher.
    strictMaxStaleness: 4,
    strictPriority: true,
    strictAdmission: 'deadline',
    strictQuantile: 0.9,
    warmupSteps: null,
    workload: null,
  };
}

/** The bench's options for a long-tail workload: its sizes, the defaults' trainer and async settings. */
export function longTailOptions(w: LongTailWorkload, quick: boolean): TrainingBenchOptions {
  return {
    ...trainingBenchDefaults(quick),
    servers: w.servers,
    slots: w.slots,
    responseTokens: w.responseTokens,
    lengthSigma: w.lengthSigma,
    maxTokens: w.maxTokens,
    turns: w.env.maxTurns,
    groupSize: w.groupSize,
    groups: quick ? Math.max(2, Math.ceil(w.groups / 4)) : w.groups,
    steps: quick ? 3 : w.steps,
    speedup: w.speedup,
    // Group lifetimes there carry the environment's stragglers: at 0.9 the admission held back so much
    // that the slots ran a third full (agentic-search: 90 steps/h against 196 at 0.7).
    strictOverSample: w.strictOverSample,
    strictQuantile: 0.7,
    workload: w,
  };
}

export interface SideResult {
  side: string;
  figures: TrainingFigures | null;
  skipped: string | null;
  /** The mock processes' CPU per GPU-second, to tell a CPU-bound run from a GPU-bound one. */
  mockCores: number | null;
  /** The engine's group counts at the end (where wasted tokens went: retried, dropped). */
  groups: GroupCounts | null;
  /**
   * This process's CPU (the engine's main thread and workers, the simulated trainer) per real second
   * over the side's run: well under 1 on a 2-core machine means the engine is not the bottleneck.
   */
  engineCores?: number | null;
  /** Episodes the engine played again after an infrastructure failure (masked). */
  maskedFailures?: number;
  /**
   * The staleness of the rollouts taken after the first batch counted in weight syncs instead of train
   * steps: the syncs published before the train step since the weights of the rollout's oldest token
   * (`(published − m) ÷ syncWeightsInterval`). Equal to the train-step figure at syncWeightsInterval 1.
   */
  syncStaleness?: { mean: number; max: number } | null;
  /**
   * The same rollouts by staleness in train steps: `[i]` the share taken at staleness i. Staleness 0
   * is a rollout that landed while the trainer waited at the take right after its weights were
   * published (docs/SCHEDULING.md, "Why the mean stays above 1 train step").
   */
  stalenessShares?: number[];
  /** The deadline admission's figures at the end (EngineStats.admission), GPU ms; absent without it. */
  admission?: { quantile: number; held: number; lifetimeSeconds: number | null; stepSeconds: number | null };
}

/**
 * The workload's own bound on any speed-up (issue 31): the sync side's step over the larger of its
 * batch's training time and the time the servers need to generate it at full slots (pure decode at
 * the context the sync side decoded at; no prefill, no waste).
 */
export interface Ceiling {
  trainMsPerToken: number;
  /** The sync side's tokens taken a step. */
  tokensPerStep: number;
  trainSeconds: number;
  /** Mean KV tokens per decoding sequence on the sync side. */
  context: number;
  /** All servers at full slots, pure decode at that context. */
  fullSlotTokensPerSecond: number;
  generationSeconds: number;
  syncStepSeconds: number;
  value: number;
}

export interface TrainingBenchResult {
  options: TrainingBenchOptions;
  sides: SideResult[];
  /** async+keep (the headline configuration) ÷ sync steps/hour. */
  speedUp: number | null;
  /** null without a sync side. */
  ceiling: Ceiling | null;
}

export function ceilingOf(o: TrainingBenchOptions, sync: TrainingFigures): Ceiling {
  const profile = { ...GPU_PROFILES[o.profile], slots: o.slots };
  const context = sync.production.meanDecodeContext ?? 0;
  const tps = fullSlotTokensPerSecond(profile, context) * o.servers;
  const tokens = sync.tokensTakenPerStep;
  const trainSeconds = (tokens * o.trainMsPerToken) / 1000;
  const generationSeconds = tokens / tps;
  const bound = Math.max(trainSeconds, generationSeconds);
  return {
    trainMsPerToken: o.trainMsPerToken,
    tokensPerStep: tokens,
    trainSeconds,
    context,
    fullSlotTokensPerSecond: tps,
    generationSeconds,
    syncStepSeconds: sync.stepSeconds,
    value: bound > 0 ? sync.stepSeconds / bound : 0,
  };
}

/** The dataset: one line per prompt, ranges from 20 to 1000 so the mock's per-prompt lengths differ. */
export const promptRange = (i: number): number => 20 + ((i * 7919) % 981);

/** `lines` prompts of promptRange() into `dir`/guess.jsonl; returns its path. */
export function writeDataset(dir: string, lines: number): string {
  const file = join(dir, 'guess.jsonl');
  writeFileSync(
    file,
    `${Array.from({ length: lines }, (_, i) => JSON.stringify({ min: 1, max: promptRange(i) })).join('\n')}\n`,
  );
  return file;
}

export function capacityArgs(o: TrainingBenchOptions): string[] {
  return [
    '--capacity',
    String(o.slots),
    '--capacity-profile',
    o.profile,
    '--capacity-response-tokens',
    String(o.responseTokens),
    '--capacity-length-sigma',
    String(o.lengthSigma),
    '--capacity-speedup',
    String(o.speedup),
  ];
}

async function startServers(o: TrainingBenchOptions, priority = false): Promise<MockProcess[]> {
  const out: MockProcess[] = [];
  // A side that sends priorities runs against servers with priority scheduling on (vLLM's
  // `--scheduling-policy priority`: lower first, no preemption); the others keep FIFO.
  const scheduling = priority ? ['--capacity-scheduling', 'priority'] : [];
  try {
    for (let i = 0; i < o.servers; i++)
      out.push(await startMockProcess([...capacityArgs(o), ...scheduling, '--seed', String(i)]));
  } catch (error) {
    await Promise.all(out.map((m) => m.close()));
    throw error;
  }
  return out;
}

const mockCpuMs = (mocks: MockProcess[]): number | null => {
  const xs = mocks.map((m) => m.cpuMs());
  return xs.every((x) => x !== null) ? xs.reduce((a, b) => a! + b!, 0)! : null;
};

async function engineSide(o: TrainingBenchOptions, dataset: string, side: EngineSide): Promise<SideResult> {
  const asyncSide: AsyncSide | null = side === 'sync' ? null : ASYNC_SIDES[side];
  const strict = asyncSide?.strict === true;
  const mocks = await startServers(o, strict && o.strictPriority);
  const cpu0 = mockCpuMs(mocks);
  const own0 = process.cpuUsage();
  const t0 = performance.now();
  const rollouts = o.groups * o.groupSize;
  const async = asyncSide !== null;
  const overSample = strict ? o.strictOverSample : o.overSample;
  const discarded = noDiscards();
  const syncEvery = async ? o.asyncSyncEvery : 1;
  const warmup = !async
    ? 0
    : (o.warmupSteps ?? staleThreshold(strict ? o.strictMaxStaleness : o.maxStaleness, syncEvery));
  const bySyncs = { sum: 0, max: 0, rollouts: 0 };
  const byTrainSteps: number[] = [];
  const engine = createEngine(
    {
      logLevel: 'warn',
      llm: {
        url: mocks.map((m) => m.url),
        abortPath: '/admin/abort',
        connections: 2 * rollouts * (1 + overSample) + 16,
        ...(strict && o.strictPriority ? { priority: 'trajectory' as const } : {}),
      },
      batchSize: o.groups,
      workers: {
        threads: 1,
        groupsPerWorker: Math.ceil(o.groups * (2 + overSample)),
        rolloutsPerWorker: async && o.episodeSlots > 0 ? o.episodeSlots : null,
      },
      tasks: [
        o.workload === null
          ? {
              name: 'guess',
              env: { module: 'builtin:guess-number', params: { maxTurns: o.turns } },
              dataset,
              groupSize: o.groupSize,
              maxSteps: o.turns,
              maxTokens: o.maxTokens,
              messageCut: o.messageCut,
            }
          : {
              name: o.workload.name,
              env: { module: AGENTIC_ENV_MODULE, params: { ...o.workload.env, speedup: o.speedup } },
              dataset,
              groupSize: o.groupSize,
              maxSteps: o.turns,
              maxTokens: o.maxTokens,
              messageCut: o.messageCut,
            },
      ],
      producer: async
        ? {
            strategy: 'async',
            maxStaleness: strict ? o.strictMaxStaleness : o.maxStaleness,
            syncWeightsInterval: o.asyncSyncEvery,
            partialRollout: asyncSide.partialRollout,
            overSampleThreshold: overSample,
            takeOrder: strict ? 'stalest' : o.takeOrder,
            staleRollouts: asyncSide.staleRollouts,
            ...(strict ? { admission: o.strictAdmission, admissionQuantile: o.strictQuantile } : {}),
          }
        : { strategy: 'sync' },
      pause: { mode: asyncSide?.pause ?? 'abort' },
    },
    {
      observer: {
        discarded: (tokens, cause) => (discarded[cause] += tokens),
        taken: (groups, trainStep) => {
          if (trainStep <= warmup + 1) return; // the warm-up and the first batch are not steady cycles (training.ts)
          // The trainer syncs after each step that is a multiple of syncEvery, naming it the model step.
          const published = Math.floor((trainStep - 1) / syncEvery) * syncEvery;
          for (const g of groups)
            for (const r of g.rollouts) {
              const m = rolloutMinModelStep(r);
              const stale = rolloutStaleness(r, trainStep);
              byTrainSteps[stale] = (byTrainSteps[stale] ?? 0) + 1;
              const behind = m === null ? 0 : Math.max(0, Math.ceil((published - m) / syncEvery));
              bySyncs.sum += behind;
              bySyncs.max = Math.max(bySyncs.max, behind);
              bySyncs.rollouts++;
            }
        },
      },
    },
  );
  try {
    await engine.start();
    const figures = await runTrainingLoop({
      engine,
      servers: mocks.map((m) => m.url),
      strategy: async ? 'async' : 'sync',
      steps: o.steps,
      warmupSteps: warmup,
      discarded: () => discarded,
      trainer: {
        trainMsPerToken: o.trainMsPerToken,
        loadMs: o.loadMs,
        speedup: o.speedup,
        syncEvery: async ? o.asyncSyncEvery : 1,
      },
    });
    const cpu1 = mockCpuMs(mocks);
    const own = process.cpuUsage(own0);
    const stats = await engine.stats();
    const groups = stats.groups;
    const gpuSeconds = ((performance.now() - t0) * o.speedup) / 1000;
    const realSeconds = gpuSeconds / o.speedup;
    return {
      side,
      figures: { ...figures, strategy: side },
      skipped: null,
      mockCores: cpu0 === null || cpu1 === null ? null : (cpu1 - cpu0) / 1000 / realSeconds,
      groups,
      engineCores: (own.user + own.system) / 1e6 / realSeconds,
      maskedFailures: stats.failures.infrastructure,
      syncStaleness: bySyncs.rollouts > 0 ? { mean: bySyncs.sum / bySyncs.rollouts, max: bySyncs.max } : null,
      stalenessShares: Array.from(byTrainSteps, (n) => (n ?? 0) / Math.max(1, bySyncs.rollouts)),
      ...(stats.admission
        ? {
            admission: {
              quantile: stats.admission.quantile,
              held: stats.admission.held,
              // Real ms on the engine's clock: × speedup for GPU time.
              lifetimeSeconds:
                stats.admission.predictedLifetimeMs === null
                  ? null
                  : (stats.admission.predictedLifetimeMs * o.speedup) / 1000,
              stepSeconds: stats.admission.stepMs === null ? null : (stats.admission.stepMs * o.speedup) / 1000,
            },
          }
        : {}),
    };
  } finally {
    await engine.close();
    await Promise.all(mocks.map((m) => m.close()));
  }
}

async function pythonSide(o: TrainingBenchOptions): Promise<SideResult> {
  const mocks = await startServers(o);
  try {
    const outcome = await runPythonTrainer({
      urls: mocks.map((m) => m.url),
      groups: o.groups,
      groupSize: o.groupSize,
      turns: o.turns,
      maxTokens: o.maxTokens,
      steps: o.steps,
      trainMsPerToken: o.trainMsPerToken,
      loadMs: o.loadMs,
      speedup: o.speedup,
      messageCut: o.messageCut,
    });
    if (!outcome.ok)
      return { side: 'python sync', figures: null, skipped: outcome.reason, mockCores: null, groups: null };
    return { side: 'python sync', figures: outcome.result, skipped: null, mockCores: null, groups: null };
  } finally {
    await Promise.all(mocks.map((m) => m.close()));
  }
}

interface AsyncSide {
  partialRollout: boolean;
  pause: 'abort' | 'in-place';
  staleRollouts: 'reset' | 'keep';
  /** Issue 31.3's strict side: the `strict*` options apply (admission, priority, over-sampling, take order stalest). */
  strict?: boolean;
}

/** What each async side changes over the one before it (the header's table). */
const ASYNC_SIDES: Record<'async' | 'async+partial' | 'async+in-place' | 'async+strict' | 'async+keep', AsyncSide> = {
  async: { partialRollout: false, pause: 'abort', staleRollouts: 'reset' },
  'async+partial': { partialRollout: true, pause: 'abort', staleRollouts: 'reset' },
  'async+in-place': { partialRollout: true, pause: 'in-place', staleRollouts: 'reset' },
  'async+strict': { partialRollout: true, pause: 'in-place', staleRollouts: 'reset', strict: true },
  'async+keep': { partialRollout: true, pause: 'in-place', staleRollouts: 'keep' },
};
const ENGINE_SIDES = ['sync', ...(Object.keys(ASYNC_SIDES) as (keyof typeof ASYNC_SIDES)[])] as const;
type EngineSide = (typeof ENGINE_SIDES)[number];
export const TRAINING_SIDES = [...ENGINE_SIDES, 'python sync'] as const;

export async function trainingBench(
  o: TrainingBenchOptions,
  only: readonly string[] = TRAINING_SIDES,
): Promise<TrainingBenchResult> {
  const dir = mkdtempSync(join(tmpdir(), 'rollout-training-bench-'));
  const sides: SideResult[] = [];
  try {
    let dataset: string;
    if (o.workload === null) dataset = writeDataset(dir, 4096);
    else writeFileSync((dataset = join(dir, `${o.workload.name}.jsonl`)), longTailDataset(o.workload));
    for (const side of ENGINE_SIDES) if (only.includes(side)) sides.push(await engineSide(o, dataset, side));
    if (only.includes('python sync') && o.workload === null) sides.push(await pythonSide(o));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const sync = sides.find((s) => s.side === 'sync')?.figures;
  const kept = sides.find((s) => s.side === 'async+keep')?.figures;
  return {
    options: o,
    sides,
    speedUp: sync && kept && sync.stepsPerHour > 0 ? kept.stepsPerHour / sync.stepsPerHour : null,
    ceiling: sync ? ceilingOf(o, sync) : null,
  };
}

/**
 * The sides at each of `o.trainerSpeeds`, one run after the other; the Python sync trainer only at
 * the first (it measures the seed loop's sync step, which the engine's sync side already gives).
 */
export async function trainingBenches(
  o: TrainingBenchOptions,
  only: readonly string[] = TRAINING_SIDES,
): Promise<TrainingBenchResult[]> {
  const out: TrainingBenchResult[] = [];
  for (const [i, trainMsPerToken] of o.trainerSpeeds.entries())
    out.push(await trainingBench({ ...o, trainMsPerToken }, i === 0 ? only : only.filter((s) => s !== 'python sync')));
  return out;
}

/** The ceiling and the trainer speed it is at, in words. */
export function describeCeiling(c: Ceiling | null): string {
  if (c === null) return 'ceiling: not measured (no sync side)';
  return `ceiling ${c.value.toFixed(2)}× at trainer ${c.trainMsPerToken} ms/token: sync step ${c.syncStepSeconds.toFixed(1)} s ÷ max(training ${c.trainSeconds.toFixed(1)} s, generation at full slots ${c.generationSeconds.toFixed(1)} s = ${c.tokensPerStep.toFixed(0)} tokens at ${c.fullSlotTokensPerSecond.toFixed(0)} tokens/s, context ${c.context.toFixed(0)} tokens a sequence)`;
}

/** The anchors' published end-to-end speed-ups of asynchronous over synchronous RL (issue 21). */
export const ANCHORS =
  'AReaL 2.77×; verl fully async 2.35–2.67× (one-step-off +23–40 %); ROLL Flash 2.24× RLVR, 2.72× agentic; NeMo-RL in-flight updates 187 → 478 tokens/s/GPU (2.56×)';

export function printTrainingBench(r: TrainingBenchResult): void {
  const o = r.options;
  console.log(
    `\nsimulated training loop on GPU-like mocks: ${o.servers} × ${o.slots}-slot replica (profile ${o.profile}), ${o.groups} groups × ${o.groupSize} per batch, ${o.workload === null ? 'guess-number' : `workload ${o.workload.name}`} ≤ ${o.turns} turns,` +
      ` response length log-normal (median ${o.responseTokens}, σ ${o.lengthSigma}, max ${o.maxTokens}); trainer ${o.trainMsPerToken.toFixed(3)} ms/token, weight load ${o.loadMs} ms, sync every step (async: every ${o.asyncSyncEvery}, syncWeightsInterval ${o.asyncSyncEvery}); GPU time at ${o.speedup}× speed`,
  );
  const h = [
    'side',
    'steps/h',
    '× sync',
    'step s',
    'wait s',
    'busy %',
    'prefill %',
    'KV read %',
    'slots %',
    'running',
    'context',
    'tok/s',
    'sync idle ms',
    'beyond load',
    'taken tok/step',
    'wasted tok/step',
    'wasted %',
    'cache hit %',
    'stale mean/max',
    'in syncs',
    'past bound %',
  ];
  const w = [15, 9, 8, 8, 8, 8, 11, 11, 9, 9, 9, 8, 14, 13, 16, 17, 10, 13, 16, 13, 14];
  const line = (cells: string[]): string => cells.map((x, i) => (i === 0 ? x.padEnd(w[i]) : x.padStart(w[i]))).join('');
  console.log(line(h));
  const sync = r.sides.find((s) => s.side === 'sync')?.figures;
  for (const s of r.sides) {
    if (s.figures === null) {
      console.log(`${s.side.padEnd(w[0])}skipped: ${s.skipped}`);
      continue;
    }
    const f = s.figures;
    const cells = [
      s.side,
      f.stepsPerHour.toFixed(0),
      sync && sync.stepsPerHour > 0 ? `${(f.stepsPerHour / sync.stepsPerHour).toFixed(2)}×` : 'n/a',
      f.stepSeconds.toFixed(1),
      (f.waitSeconds ?? 0).toFixed(1),
      (100 * f.production.busyFraction).toFixed(1),
      (100 * (f.production.prefillFraction ?? 0)).toFixed(1),
      f.production.kvReadFraction === undefined ? 'n/a' : (100 * f.production.kvReadFraction).toFixed(1),
      (100 * f.production.slotFill).toFixed(1),
      f.production.meanRunning.toFixed(0),
      f.production.meanDecodeContext === undefined ? 'n/a' : f.production.meanDecodeContext.toFixed(0),
      f.production.tokensPerSecond.toFixed(0),
      f.syncs.idleMs.toFixed(0),
      f.syncs.idleBeyondLoadMs.toFixed(0),
      f.tokensTakenPerStep.toFixed(0),
      f.wastedTokensPerStep.toFixed(0),
      (100 * f.wastedFraction).toFixed(1),
      (100 * f.cacheHitFraction).toFixed(1),
      `${f.staleness.mean.toFixed(2)} / ${f.staleness.max}`,
      s.syncStaleness ? `${s.syncStaleness.mean.toFixed(2)} / ${s.syncStaleness.max}` : 'n/a',
      (100 * f.staleness.pastThresholdFraction).toFixed(1),
    ];
    console.log(line(cells));
  }
  for (const s of r.sides) {
    if (s.groups === null) continue;
    const g = s.groups;
    const dropped =
      Object.entries(g.dropped)
        .filter(([, n]) => n > 0)
        .map(([k, n]) => `${k} ${n}`)
        .join(', ') || 'none';
    const landed = Object.entries(g.landed)
      .filter(([, n]) => n > 0)
      .map(([k, n]) => `${k} ${n}`)
      .join(', ');
    const cores =
      s.engineCores === undefined || s.engineCores === null
        ? ''
        : `; CPU per real second: engine process ${s.engineCores.toFixed(2)}, mocks ${s.mockCores?.toFixed(2) ?? 'n/a'}`;
    const masked = s.maskedFailures === undefined ? '' : `; infrastructure failures ${s.maskedFailures}`;
    const shares = s.stalenessShares?.length ? `; ${stalenessSharesText(s.stalenessShares)}` : '';
    const age = s.figures === null ? null : ageText(s.figures);
    const aged = age === null ? '' : `; ${age}`;
    const a = s.admission;
    const admitted =
      a === undefined
        ? ''
        : `; admission: predicted group lifetime (q ${a.quantile}) ${a.lifetimeSeconds?.toFixed(1) ?? 'n/a'} s against a trainer step of ${a.stepSeconds?.toFixed(1) ?? 'n/a'} s, rounds held back ${a.held}`;
    console.log(
      `  ${s.side}: groups scheduled ${g.scheduled}, retried ${g.retried}, landed ${landed}, taken ${g.taken}, in flight at the end ${g.inFlight}, dropped ${dropped}${masked}${shares}${aged}${admitted}${cores}`,
    );
  }
  console.log(`  ${describeCeiling(r.ceiling)}`);
  if (r.sides.some((s) => s.side === 'async+strict'))
    console.log(
      `  async+strict: as async+in-place (stale rollouts reset), paced — producer.admission ${o.strictAdmission}${o.strictAdmission === 'deadline' ? ` (admissionQuantile ${o.strictQuantile})` : ''}, over-sampling ${o.strictOverSample}, takeOrder stalest, llm.priority ${o.strictPriority ? 'trajectory against servers with priority scheduling (vLLM reading)' : 'off'}`,
    );
  console.log(
    '  wait: the trainer inside getBatch per step; busy / prefill / KV read / slots / running / context / tok/s: the servers while production runs (sync: inside getBatch; async: between syncs), prefill and KV reads as shares of busy, context the KV tokens per decoding sequence;',
  );
  console.log(
    '  sync idle: pause request → servers running again, GPU ms; wasted: tokens the engine threw away (members restarted, groups dropped; Python: generated but not taken), per step and as a share of the tokens generated',
  );
  console.log(
    `  stale: staleness of the rollouts taken, in train steps (train step − oldest token's model step − 1: the definition the buffer expires by); in syncs: the same in weight syncs published since those weights; past bound: the share at or past the stale threshold ${staleThreshold(o.maxStaleness, o.asyncSyncEvery)} = (maxStaleness ${o.maxStaleness} + 1) × sync every ${o.asyncSyncEvery}, which only async+keep hands out (async+strict: ${staleThreshold(o.strictMaxStaleness, o.asyncSyncEvery)}, maxStaleness ${o.strictMaxStaleness})`,
  );
  const warmup =
    o.warmupSteps === null
      ? `its bound's train steps (${staleThreshold(o.maxStaleness, o.asyncSyncEvery)}; async+strict ${staleThreshold(o.strictMaxStaleness, o.asyncSyncEvery)})`
      : `${o.warmupSteps} train steps`;
  console.log(
    `  window: ${o.steps} train steps measured per side, from the first batch taken in it; each async side first runs a warm-up of ${warmup}: until then nothing can be past its bound, so nothing can be thrown away for it`,
  );
  console.log(`  anchors (published, real GPUs): ${ANCHORS}`);
}

/** Response tokens trained per GPU hour: the unit issue 31.3's speed-ups are counted in. */
export const tokensPerHour = (f: TrainingFigures): number => f.stepsPerHour * f.tokensTakenPerStep;

/** `f` ÷ `base` in tokens trained per hour; null when the base trained nothing. */
export const tokensPerHourRatio = (f: TrainingFigures, base: TrainingFigures): number | null =>
  tokensPerHour(base) > 0 ? tokensPerHour(f) / tokensPerHour(base) : null;

/** An async side against sync, the issue's first target: steps per hour, with the ratio in tokens beside it. */
function speedUpRow(
  target: string,
  side: TrainingFigures | null,
  sync: TrainingFigures | null,
  more: (side: TrainingFigures) => string,
  ceiling: Ceiling | null,
): TargetRow {
  const measured = side !== null && sync !== null && sync.stepsPerHour > 0;
  const bound =
    ceiling === null
      ? 'ceiling not measured'
      : `ceiling ${ceiling.value.toFixed(2)}× (trainer ${ceiling.trainMsPerToken} ms/token)`;
  return row({
    target,
    figure: 'training steps/hour ÷ sync',
    value: measured ? side.stepsPerHour / sync.stepsPerHour : null,
    limit: 2.5,
    kind: 'min',
    unit: '×',
    detail: measured
      ? `${bound}; ${side.stepsPerHour.toFixed(0)} vs ${sync.stepsPerHour.toFixed(0)} steps/h (GPU time); in tokens trained per hour ${tokensPerHourRatio(side, sync)?.toFixed(2) ?? 'n/a'}×; ${more(side)}`
      : 'not measured',
  });
}

/** Issue 31.3's speed-up goal on today's workload, and its share of the ceiling everywhere. */
export const STRICT_GOALS = Object.freeze({ speedUp: 3.0, ofCeiling: 85, wastedPercent: 3, meanStaleness: 1 });

/**
 * Issue 31.3, strict staleness at speed, read from the async+strict side: nothing past the bound handed
 * to the trainer, mean staleness ≤ 1 (in train steps, the definition the buffer expires by; the same
 * in weight syncs beside it), ≤ 3 % of the generated tokens thrown away, and the speed-up — ≥ 3.0×
 * sync where `speedUpGoal` is set (today's workload) and ≥ 85 % of the ceiling — each with the
 * ceiling beside it and, in the detail, what limits it: the servers' production rate, slot fill and
 * the trainer's wait.
 */
export function strictTargets(r: TrainingBenchResult, label: string, speedUpGoal: boolean): TargetRow[] {
  const side = r.sides.find((s) => s.side === 'async+strict') ?? null;
  const f = side?.figures ?? null;
  const sync = r.sides.find((s) => s.side === 'sync')?.figures ?? null;
  const o = r.options;
  const c = r.ceiling;
  const steps = f !== null && sync !== null && sync.stepsPerHour > 0 ? f.stepsPerHour / sync.stepsPerHour : null;
  // The speed-up in tokens trained per hour, not steps: the strict side's batches carried 8–15 % fewer
  // tokens than sync's (the long replies are the ones reset past the bound and the ones still out),
  // and a trainer's step time follows its tokens — counted in steps, a side at trainer 0.09 read
  // 3.59× against a ceiling of 3.39×. The ceiling is sync's batch over the larger of its training and
  // generation times, the same ratio in either unit.
  const x = f !== null && sync !== null ? tokensPerHourRatio(f, sync) : null;
  const age = f === null ? null : ageText(f);
  const ceiling = c === null ? 'ceiling not measured' : `ceiling ${c.value.toFixed(2)}×`;
  const settings = `maxStaleness ${o.strictMaxStaleness}, sync every ${o.asyncSyncEvery}, admission ${o.strictAdmission}${o.strictAdmission === 'deadline' ? ` (quantile ${o.strictQuantile})` : ''}, over-sample ${o.strictOverSample}, priority ${o.strictPriority ? 'trajectory' : 'off'}`;
  const target = `31.3 · ${label}, async strict (${settings})`;
  // What the step is made of: the batch's tokens at the rate the servers produced useful tokens.
  const limits =
    f === null
      ? 'not measured'
      : `in training steps per hour ${steps?.toFixed(2) ?? 'n/a'}×; step ${f.stepSeconds.toFixed(1)} s = trainer wait ${f.waitSeconds.toFixed(1)} s + training and syncs; servers while producing: ${f.production.tokensPerSecond.toFixed(0)} tokens/s generated (full-slot decode ${c?.fullSlotTokensPerSecond.toFixed(0) ?? 'n/a'}), slots ${(100 * f.production.slotFill).toFixed(1)} % filled, prefill ${(100 * (f.production.prefillFraction ?? 0)).toFixed(1)} % of busy, ${(100 * f.wastedFraction).toFixed(1)} % thrown away; ${f.tokensTakenPerStep.toFixed(0)} tokens taken a step (sync ${sync?.tokensTakenPerStep.toFixed(0) ?? 'n/a'})`;
  const rows: TargetRow[] = [];
  if (speedUpGoal)
    rows.push(
      row({
        target,
        figure: `tokens trained per hour ÷ sync (${ceiling})`,
        value: x,
        limit: STRICT_GOALS.speedUp,
        kind: 'min',
        unit: '×',
        detail: limits,
      }),
    );
  rows.push(
    row({
      target,
      figure: `speed-up ÷ ceiling (${ceiling})`,
      value: x !== null && c !== null && c.value > 0 ? (100 * x) / c.value : null,
      limit: STRICT_GOALS.ofCeiling,
      kind: 'min',
      unit: ' %',
      digits: 0,
      detail: x === null ? 'not measured' : `${x.toFixed(2)}× sync in tokens trained per hour; ${limits}`,
    }),
    row({
      target,
      figure: 'generated tokens thrown away',
      value: f === null ? null : 100 * f.wastedFraction,
      limit: STRICT_GOALS.wastedPercent,
      kind: 'max',
      unit: ' %',
      digits: 1,
      detail:
        f === null
          ? 'not measured'
          : `${f.wastedTokensPerStep.toFixed(0)} tokens a step${f.wastedByCause === undefined ? '' : ` (${wasteText(f.wastedByCause)})`}, of ${(f.tokensTakenPerStep + f.wastedTokensPerStep).toFixed(0)}`,
    }),
    row({
      target,
      figure: 'mean staleness taken, train steps',
      value: f === null ? null : f.staleness.mean,
      limit: STRICT_GOALS.meanStaleness,
      kind: 'max',
      unit: '',
      digits: 2,
      detail:
        f === null
          ? 'not measured'
          : `train step − oldest token's model step − 1; max ${f.staleness.max}; in weight syncs mean ${side?.syncStaleness?.mean.toFixed(2) ?? 'n/a'}, max ${side?.syncStaleness?.max ?? 'n/a'}${side?.stalenessShares ? `; ${stalenessSharesText(side.stalenessShares)} (0 only for what lands while the trainer waits: docs/SCHEDULING.md)` : ''}${age === null ? '' : `; ${age}`}`,
    }),
    row({
      target,
      figure: 'rollouts taken at or past the bound',
      value: f === null ? null : 100 * f.staleness.pastThresholdFraction,
      limit: 0,
      kind: 'max',
      unit: ' %',
      digits: 1,
      detail: `bound: staleness ${staleThreshold(o.strictMaxStaleness, o.asyncSyncEvery)} train steps = (maxStaleness ${o.strictMaxStaleness} + 1) × syncWeightsInterval ${o.asyncSyncEvery}`,
    }),
  );
  return rows;
}

/**
 * Where the taken rollouts' age went, in model seconds and in the side's train steps: what the mean
 * staleness is made of. The episode and the wait for the rest of its group are the workload's at
 * the slot fill the side ran at; only the buffer is the scheduler's to shorten. null: nothing measured.
 */
export function ageText(f: TrainingFigures): string | null {
  const a = f.age;
  if (a === undefined || a.rollouts === 0 || f.stepSeconds <= 0) return null;
  const total = a.episodeSeconds + a.groupSeconds + a.bufferSeconds;
  const steps = (x: number) => (x / f.stepSeconds).toFixed(2);
  return `age at the take ${total.toFixed(1)} s = ${steps(total)} train steps of ${f.stepSeconds.toFixed(1)} s: the episode ${a.episodeSeconds.toFixed(1)} s (${steps(a.episodeSeconds)}) + the rest of its group ${a.groupSeconds.toFixed(1)} s (${steps(a.groupSeconds)}) + the buffer ${a.bufferSeconds.toFixed(1)} s (${steps(a.bufferSeconds)}), over ${a.rollouts} rollouts that ran once (left out: ${a.generatedAgain} generated again${a.untimed > 0 ? `, ${a.untimed} without timings` : ''})`;
}

/**
 * The waste's causes a step (the producer's DiscardCause): only `expired` is the bound's and the
 * pacing's; a restart is the environment's failure or an interruption, a dropped group its reason's.
 */
export const wasteText = (w: DiscardTally): string =>
  `past the bound ${w.expired.toFixed(0)}, generated again ${w.restarted.toFixed(0)}, groups dropped otherwise ${w.dropped.toFixed(0)}`;

/** "taken at 0 / 1 / 2 train steps stale: 3 / 52 / 45 %" from the side's shares. */
export const stalenessSharesText = (shares: readonly number[]): string =>
  `taken at ${shares.map((_, i) => i).join(' / ')} train steps stale: ${shares.map((x) => (100 * x).toFixed(0)).join(' / ')} %`;

const staleNote = (f: TrainingFigures): string =>
  `staleness taken mean ${f.staleness.mean.toFixed(2)}, max ${f.staleness.max}, ${(100 * f.staleness.pastThresholdFraction).toFixed(1)} % at or past the bound`;

/**
 * The issue's targets, each met or missed by the headline configuration — async, partial rollouts,
 * weights loaded in place, stale rollouts kept — with the other async sides beside it. The strict
 * reading of staleness 1 (nothing past the bound handed out, stale rollouts reset) is a row of its
 * own, so a reader sees what keeping them buys.
 */
export function trainingTargets(r: TrainingBenchResult, speedUpsOnly = false): TargetRow[] {
  const figures = (side: string) => r.sides.find((s) => s.side === side)?.figures ?? null;
  const sync = figures('sync');
  const partial = figures('async+partial');
  const inPlace = figures('async+in-place');
  const kept = figures('async+keep');
  const pct = (x: number | undefined) => (x === undefined ? 'n/a' : `${(100 * x).toFixed(1)} %`);
  const o = r.options;
  const syncShare = (f: TrainingFigures | null) =>
    f && f.stepSeconds > 0 ? (100 * f.syncs.idleBeyondLoadMs) / (f.stepSeconds * 1000 * o.asyncSyncEvery) : null;
  const trainer = `trainer ${o.trainMsPerToken} ms/token`;
  const speedUps = [
    speedUpRow(
      `21 · async+partial, in place, stale rollouts kept, staleness ${o.maxStaleness}, ${trainer}`,
      kept,
      sync,
      (f) => `${staleNote(f)}; slots ${pct(f.production.slotFill)} filled; anchors 2.24–2.77×`,
      r.ceiling,
    ),
    speedUpRow(
      `21 · async+partial, in place, stale rollouts reset, staleness ${o.maxStaleness}, ${trainer}`,
      inPlace,
      sync,
      (f) => `nothing past the bound handed out; ${f.wastedTokensPerStep.toFixed(0)} tokens thrown away a step`,
      r.ceiling,
    ),
    speedUpRow(
      `21 · async+partial, aborted on sync, staleness ${o.maxStaleness}, sync every ${o.asyncSyncEvery}, ${trainer}`,
      partial,
      sync,
      (f) => `${f.wastedTokensPerStep.toFixed(0)} tokens thrown away a step`,
      r.ceiling,
    ),
  ];
  const strict = r.sides.some((s) => s.side === 'async+strict')
    ? strictTargets(r, `today's workload, ${trainer}`, true)
    : [];
  if (speedUpsOnly) return [...speedUps, ...strict];
  return [
    ...speedUps,
    ...strict,
    row({
      target: '21 · async+keep, production',
      figure: 'servers busy',
      value: kept ? 100 * kept.production.busyFraction : null,
      limit: 95,
      kind: 'min',
      unit: ' %',
      digits: 1,
      detail: kept
        ? `over ${kept.production.seconds.toFixed(0)} GPU s of production; async+partial ${pct(partial?.production.busyFraction)}`
        : 'not measured',
    }),
    row({
      target: '21 · async+keep, production',
      figure: 'slots filled',
      value: kept ? 100 * kept.production.slotFill : null,
      limit: 90,
      kind: 'min',
      unit: ' %',
      digits: 1,
      detail: kept
        ? `${kept.production.meanRunning.toFixed(0)} of ${o.slots} running on average; async+partial ${pct(partial?.production.slotFill)}, sync ${pct(sync?.production.slotFill)}`
        : 'not measured',
    }),
    row({
      target: '21 · async+keep, each weight sync',
      figure: 'server idle beyond the load ÷ step time',
      value: syncShare(kept),
      limit: 1,
      kind: 'max',
      unit: ' %',
      digits: 2,
      detail: kept
        ? `${kept.syncs.idleBeyondLoadMs.toFixed(0)} GPU ms beyond a ${o.loadMs} ms load (worst ${kept.syncs.maxIdleBeyondLoadMs.toFixed(0)}) per ${o.asyncSyncEvery} steps of ${kept.stepSeconds.toFixed(1)} s; pause p50 ${kept.syncs.pauseMsP50.toFixed(1)} real ms; aborting (async+partial): ${syncShare(partial)?.toFixed(2).concat(' %') ?? 'n/a'}`
        : 'not measured',
    }),
  ];
}

const isMain = process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1];
if (isMain) {
  const numeric = [
    'steps',
    'speedup',
    'servers',
    'groups',
    'max-tokens',
    'over-sample',
    'response-tokens',
    'length-sigma',
    'load-ms',
    'async-sync-every',
    'max-staleness',
    'episode-slots',
    'message-cut',
    'strict-over-sample',
    'strict-quantile',
    'strict-max-staleness',
    'warmup-steps',
  ] as const;
  const INTEGER_FLAGS: ReadonlySet<string> = new Set([
    'steps',
    'servers',
    'groups',
    'max-tokens',
    'async-sync-every',
    'max-staleness',
    'episode-slots',
    'message-cut',
    'strict-max-staleness',
    'warmup-steps',
  ]);
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean' },
      sides: { type: 'string' },
      profile: { type: 'string' },
      'train-ms-per-token': { type: 'string' },
      'take-order': { type: 'string' },
      'strict-priority': { type: 'string' },
      'strict-admission': { type: 'string' },
      ...Object.fromEntries(numeric.map((k) => [k, { type: 'string' as const }])),
    },
  });
  const o = trainingBenchDefaults(values.quick ?? false);
  const key = (flag: string) => flag.replace(/-(.)/g, (_, c: string) => c.toUpperCase()) as keyof TrainingBenchOptions;
  for (const flag of numeric) {
    const v = (values as Record<string, string | undefined>)[flag];
    if (v === undefined) continue;
    const n = Number(v);
    if (!Number.isFinite(n) || n < 0) throw new Error(`--${flag} must be a number ≥ 0 (got ${JSON.stringify(v)})`);
    if (INTEGER_FLAGS.has(flag) && !Number.isInteger(n))
      throw new Error(`--${flag} must be a whole number (got ${JSON.stringify(v)})`);
    (o as unknown as Record<string, number>)[key(flag)] = n;
  }
  if (values['take-order'] !== undefined) {
    if (values['take-order'] !== 'fifo' && values['take-order'] !== 'stalest')
      throw new Error(`--take-order must be fifo or stalest (got ${JSON.stringify(values['take-order'])})`);
    o.takeOrder = values['take-order'];
  }
  if (values['strict-priority'] !== undefined) {
    if (values['strict-priority'] !== 'on' && values['strict-priority'] !== 'off')
      throw new Error(`--strict-priority must be on or off (got ${JSON.stringify(values['strict-priority'])})`);
    o.strictPriority = values['strict-priority'] === 'on';
  }
  if (values['strict-admission'] !== undefined) {
    if (values['strict-admission'] !== 'eager' && values['strict-admission'] !== 'deadline')
      throw new Error(
        `--strict-admission must be eager or deadline (got ${JSON.stringify(values['strict-admission'])})`,
      );
    o.strictAdmission = values['strict-admission'];
  }
  if (values.profile !== undefined) {
    if (!(GPU_PROFILE_NAMES as string[]).includes(values.profile))
      throw new Error(
        `--profile must be one of ${GPU_PROFILE_NAMES.join(', ')} (got ${JSON.stringify(values.profile)})`,
      );
    o.profile = values.profile as GpuProfileName;
  }
  if (values['train-ms-per-token'] !== undefined) {
    const speeds = values['train-ms-per-token'].split(',').map(Number);
    if (speeds.length === 0 || speeds.some((x) => !Number.isFinite(x) || x < 0))
      throw new Error(
        `--train-ms-per-token must be numbers ≥ 0, comma-separated (got ${JSON.stringify(values['train-ms-per-token'])})`,
      );
    o.trainerSpeeds = speeds;
  }
  const results = await trainingBenches(o, values.sides?.split(',') ?? TRAINING_SIDES);
  for (const result of results) printTrainingBench(result);
  const { printTargets } = await import('./targets.ts');
  printTargets(results.flatMap((r, i) => trainingTargets(r, i > 0)));
}

/**
 * Issue 31, item 4: trajectory-aware scheduling against FIFO on a GPU-like mock, in one run, side by
 * side. Both sides run the same asynchronous production with the staleness bound held strictly
 * (maxStaleness 1, weights synced every step, partial rollouts, in-place pauses, stale rollouts reset:
 * nothing past the bound is trained), against a mock with priority scheduling on
 * (`--capacity-scheduling priority`, vLLM's reading: admission by priority, no preemption):
 *
 *   fifo        llm.priority off: no field is sent, so the queue is first come, first served
 *   trajectory  llm.priority trajectory: each call's urgency from its trajectory (llm/priority.ts)
 *
 * The trainer is fast (a tenth of the default time per token), so production sets the pace: steps per
 * GPU hour measure rollout throughput at the same staleness bound. Figures: groups and tokens taken per
 * GPU hour, tokens thrown away, the staleness of what was taken, and the time from a group's first
 * start to its last member's end (p50 / p99, GPU seconds), with the ratios beside them.
 *
 *   node --import tsx test/bench/priority.ts            # ≈ 3 min
 *   node --import tsx test/bench/priority.ts --quick    # a smoke run
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { fileURLToPath } from 'node:url';
import { createEngine } from '../../src/index.ts';
import { startMockProcess } from '../../src/loadtest/mock-process.ts';
import { percentile } from '../../src/loadtest/stats.ts';
import { staleThreshold } from '../../src/buffer/staleness.ts';
import { noDiscards, runTrainingLoop, type TrainingFigures } from '../../src/loadtest/training.ts';
import {
  capacityArgs,
  tokensPerHour,
  trainingBenchDefaults,
  writeDataset,
  type TrainingBenchOptions,
} from './training-loop.ts';
import { row, type TargetRow } from './targets.ts';

export interface PrioritySide {
  side: 'fifo' | 'trajectory';
  figures: TrainingFigures;
  /** GPU seconds from each taken group's first start to its last member's end. */
  groupSeconds: number[];
  /** Running sequences the mock preempted (0 under vLLM's reading). */
  preempted: number;
}

export interface PriorityBenchResult {
  options: TrainingBenchOptions;
  sides: PrioritySide[];
}

export function priorityBenchDefaults(quick: boolean): TrainingBenchOptions {
  const o = trainingBenchDefaults(quick);
  return {
    ...o,
    steps: quick ? 3 : 8,
    groups: quick ? 16 : 32,
    trainMsPerToken: o.trainMsPerToken / 10,
    asyncSyncEvery: 1,
    maxStaleness: 1,
    // Enough rollouts in flight that calls queue at the server: with its slots not full (the training
    // loop's 1.5 fills about 60 % here) there is no queue to order, and both sides are the same.
    overSample: 4,
  };
}

async function side(o: TrainingBenchOptions, dataset: string, which: PrioritySide['side']): Promise<PrioritySide> {
  const mock = await startMockProcess([...capacityArgs(o), '--capacity-scheduling', 'priority', '--seed', '0']);
  const rollouts = o.groups * o.groupSize;
  const discarded = noDiscards();
  const groupSeconds: number[] = [];
  const engine = createEngine(
    {
      logLevel: 'warn',
      llm: {
        url: mock.url,
        abortPath: '/admin/abort',
        connections: 2 * rollouts * (1 + o.overSample) + 16,
        priority: which === 'fifo' ? 'off' : 'trajectory',
      },
      batchSize: o.groups,
      workers: { threads: 1, groupsPerWorker: Math.ceil(o.groups * (2 + o.overSample)) },
      tasks: [
        {
          name: 'guess',
          env: { module: 'builtin:guess-number', params: { maxTurns: o.turns } },
          dataset,
          groupSize: o.groupSize,
          maxSteps: o.turns,
          maxTokens: o.maxTokens,
        },
      ],
      producer: {
        strategy: 'async',
        maxStaleness: o.maxStaleness,
        syncWeightsInterval: o.asyncSyncEvery,
        partialRollout: true,
        overSampleThreshold: o.overSample,
        takeOrder: o.takeOrder,
        staleRollouts: 'reset',
      },
      pause: { mode: 'in-place' },
    },
    { observer: { discarded: (tokens, cause) => (discarded[cause] += tokens) } },
  );
  // Each taken group's span, from the batches the trainer gets.
  const getBatch = engine.getBatch.bind(engine);
  engine.getBatch = async (step?: number) => {
    const batch = await getBatch(step);
    for (const g of batch.groups) {
      const start = Math.min(...g.rollouts.map((r) => r.timings.startedAt).filter((t) => t > 0));
      const end = Math.max(...g.rollouts.map((r) => r.timings.finishedAt));
      if (Number.isFinite(start) && end > start) groupSeconds.push(((end - start) * o.speedup) / 1000);
    }
    return batch;
  };
  try {
    await engine.start();
    const figures = await runTrainingLoop({
      engine,
      servers: [mock.url],
      strategy: 'async',
      steps: o.steps,
      // As the training loop's async sides (training-loop.ts): the bound's steps before measuring.
      warmupSteps: o.warmupSteps ?? staleThreshold(o.maxStaleness, o.asyncSyncEvery),
      discarded: () => discarded,
      trainer: { trainMsPerToken: o.trainMsPerToken, loadMs: o.loadMs, speedup: o.speedup, syncEvery: 1 },
    });
    const gpu = (await (await fetch(`${mock.url}/admin/gpu`)).json()) as { preempted?: number };
    return { side: which, figures: { ...figures, strategy: which }, groupSeconds, preempted: gpu.preempted ?? 0 };
  } finally {
    await engine.close();
    await mock.close();
  }
}

export async function priorityBench(o: TrainingBenchOptions): Promise<PriorityBenchResult> {
  const dir = mkdtempSync(join(tmpdir(), 'rollout-priority-bench-'));
  try {
    const dataset = writeDataset(dir, 4096);
    const sides: PrioritySide[] = [];
    for (const which of ['fifo', 'trajectory'] as const) sides.push(await side(o, dataset, which));
    return { options: o, sides };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export function printPriorityBench(r: PriorityBenchResult): void {
  const o = r.options;
  console.log(
    `\ntrajectory-aware scheduling on a GPU-like mock (priority scheduling on, vLLM's reading): ${o.slots}-slot replica, ${o.groups} groups × ${o.groupSize}, guess-number ≤ ${o.turns} turns, response length log-normal (median ${o.responseTokens}, σ ${o.lengthSigma}, max ${o.maxTokens}); async, maxStaleness ${o.maxStaleness}, sync every step, stale rollouts reset (strict); trainer ${o.trainMsPerToken.toFixed(4)} ms/token; GPU time at ${o.speedup}× speed`,
  );
  const h = [
    'side',
    'steps/h',
    'tok taken/h',
    'wasted %',
    'busy %',
    'slots %',
    'stale mean/max',
    'group p50 s',
    'group p99 s',
    'preempted',
  ];
  const w = [12, 9, 13, 10, 8, 9, 16, 13, 13, 11];
  const line = (cells: string[]): string => cells.map((x, i) => (i === 0 ? x.padEnd(w[i]) : x.padStart(w[i]))).join('');
  console.log(line(h));
  for (const s of r.sides) {
    const f = s.figures;
    const taken = f.tokensTakenPerStep;
    const wasted =
      taken + f.wastedTokensPerStep > 0 ? (100 * f.wastedTokensPerStep) / (taken + f.wastedTokensPerStep) : 0;
    console.log(
      line([
        s.side,
        f.stepsPerHour.toFixed(0),
        (tokensPerHour(f) / 1e6).toFixed(2).concat('M'),
        wasted.toFixed(1),
        (100 * f.production.busyFraction).toFixed(1),
        (100 * f.production.slotFill).toFixed(1),
        `${f.staleness.mean.toFixed(2)} / ${f.staleness.max}`,
        percentile(s.groupSeconds, 50).toFixed(1),
        percentile(s.groupSeconds, 99).toFixed(1),
        String(s.preempted),
      ]),
    );
  }
  const [fifo, traj] = r.sides;
  if (fifo && traj) {
    const ratio = (a: number, b: number) => (b > 0 ? `${(a / b).toFixed(2)}×` : 'n/a');
    console.log(
      `  trajectory ÷ fifo: steps/h ${ratio(traj.figures.stepsPerHour, fifo.figures.stepsPerHour)}, tokens taken/h ${ratio(tokensPerHour(traj.figures), tokensPerHour(fifo.figures))}, group p99 ${ratio(percentile(traj.groupSeconds, 99), percentile(fifo.groupSeconds, 99))}`,
    );
  }
  console.log(
    '  wasted: tokens thrown away (members reset past the bound, groups dropped) ÷ generated; group: first start of a taken group’s members to its last end, GPU s (pauses included)',
  );
}

/** The target: trajectory-aware rollout throughput ≥ 1.25× FIFO at the same staleness bound. */
export function priorityTargets(r: PriorityBenchResult): TargetRow[] {
  const fifo = r.sides.find((s) => s.side === 'fifo');
  const traj = r.sides.find((s) => s.side === 'trajectory');
  const measured = fifo !== undefined && traj !== undefined && fifo.figures.stepsPerHour > 0;
  return [
    row({
      target: `31.4 · trajectory priority vs FIFO, staleness ${r.options.maxStaleness} strict`,
      figure: 'training steps/hour ÷ FIFO',
      value: measured ? traj.figures.stepsPerHour / fifo.figures.stepsPerHour : null,
      limit: 1.25,
      kind: 'min',
      unit: '×',
      detail: measured
        ? `${traj.figures.stepsPerHour.toFixed(0)} vs ${fifo.figures.stepsPerHour.toFixed(0)} steps/h; stale taken ${traj.figures.staleness.mean.toFixed(2)} vs ${fifo.figures.staleness.mean.toFixed(2)}; group p99 ${percentile(traj.groupSeconds, 99).toFixed(1)} vs ${percentile(fifo.groupSeconds, 99).toFixed(1)} GPU s`
        : 'not measured',
    }),
  ];
}

const isMain = process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1];
if (isMain) {
  const numeric = ['steps', 'slots', 'over-sample', 'groups', 'train-scale'] as const;
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean' },
      ...Object.fromEntries(numeric.map((k) => [k, { type: 'string' as const }])),
    },
  });
  const o = priorityBenchDefaults(values.quick ?? false);
  const num = (k: (typeof numeric)[number]): number | undefined => {
    const v = (values as Record<string, string | undefined>)[k];
    if (v === undefined) return undefined;
    const n = Number(v);
    if (!Number.isFinite(n) || n <= 0) throw new Error(`--${k} must be a number > 0 (got ${JSON.stringify(v)})`);
    return n;
  };
  o.steps = num('steps') ?? o.steps;
  o.slots = num('slots') ?? o.slots;
  o.overSample = num('over-sample') ?? o.overSample;
  o.groups = num('groups') ?? o.groups;
  o.trainMsPerToken *= num('train-scale') ?? 1;
  const result = await priorityBench(o);
  printPriorityBench(result);
  const { printTargets } = await import('./targets.ts');
  printTargets(priorityTargets(result));
}

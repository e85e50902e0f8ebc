/**
 * Issue 31, items 2 and 3: the agentic long-tail workloads (workloads/long-tail.ts) through the
 * training-loop bench — sync, async in place (stale rollouts reset: nothing past the bound trained),
 * async strict (the same, paced: deadline admission, trajectory priority, stalest first — item 3's
 * mechanisms) and async keep (stale rollouts kept) — each with its own ceiling (sync step ÷ the larger
 * of training time and generation at full slots) and the CPU the engine and the mocks used, to show
 * the engine is not what limits the run. Item 3's targets (`longTailTargets`) are read from the
 * strict side: ≥ 85 % of the ceiling, ≤ 3 % of the generated tokens thrown away, mean staleness ≤ 1,
 * nothing past the bound.
 *
 *   node --import tsx test/bench/long-tail.ts                          # both workloads (≈ 10 min)
 *   node --import tsx test/bench/long-tail.ts --workload agentic-swe   # one
 *   node --import tsx test/bench/long-tail.ts --quick                  # a smoke run, too short to quote
 *
 * One knob over every workload's defaults: --strict-quantile, --strict-over-sample, --max-staleness,
 * --episode-slots (workers.rolloutsPerWorker on the async sides; 0 = off), --message-cut,
 * --strict-max-staleness, --warmup-steps (default: each async side's own bound in train steps),
 * --steps (measured, after the warm-up).
 */
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import type { TargetRow } from './targets.ts';
import {
  describeCeiling,
  longTailOptions,
  printTrainingBench,
  strictTargets,
  tokensPerHourRatio,
  trainingBench,
  type TrainingBenchOptions,
  type TrainingBenchResult,
} from './training-loop.ts';
import { LONG_TAIL_WORKLOADS, longTailWorkload, type LongTailWorkload } from './workloads/long-tail.ts';

/** The sides each long-tail workload runs: sync, async in place (reset), async strict (paced), async keep. */
export const LONG_TAIL_SIDES = ['sync', 'async+in-place', 'async+strict', 'async+keep'] as const;

/** One workload: its sides (`sides`, default LONG_TAIL_SIDES) with the training loop's options for it. */
export async function longTailBench(
  w: LongTailWorkload,
  quick: boolean,
  overrides: Partial<TrainingBenchOptions> = {},
  sides: readonly string[] = LONG_TAIL_SIDES,
): Promise<TrainingBenchResult> {
  return trainingBench({ ...longTailOptions(w, quick), ...overrides }, sides);
}

export interface LongTailBenchOptions {
  quick: boolean;
  /** Workload names (workloads/long-tail.ts); default every one. */
  workloads?: readonly string[];
  /** Options for every workload over its own (e.g. `{ strictQuantile: 0.75 }`). */
  overrides?: Partial<TrainingBenchOptions>;
  /** Called with each workload's result as it is done (to print it). */
  onResult?: (result: TrainingBenchResult) => void;
}

/** Every workload (or those named) one after the other; what `npm run bench` calls. */
export async function longTailBenches(o: LongTailBenchOptions): Promise<TrainingBenchResult[]> {
  const workloads = o.workloads === undefined ? LONG_TAIL_WORKLOADS : o.workloads.map((name) => longTailWorkload(name));
  const results: TrainingBenchResult[] = [];
  for (const w of workloads) {
    const r = await longTailBench(w, o.quick, o.overrides);
    o.onResult?.(r);
    results.push(r);
  }
  return results;
}

/**
 * Issue 31.3's rows for one workload, from its async+strict side: speed-up ÷ ceiling ≥ 85 % (the
 * ceiling printed beside it), generated tokens thrown away ≤ 3 %, mean staleness ≤ 1, nothing past
 * the bound; each row's detail says what limits it (the servers' rate, slot fill, the trainer's wait).
 */
export function longTailTargets(r: TrainingBenchResult): TargetRow[] {
  return strictTargets(r, `long tail ${r.options.workload?.name ?? 'workload'}`, false);
}

/** One line per side: speed-up, its share of the ceiling, the engine's and the servers' load. */
export function printLongTailSummary(r: TrainingBenchResult): void {
  const sync = r.sides.find((s) => s.side === 'sync')?.figures ?? null;
  console.log(`  ${r.options.workload?.name}: ${describeCeiling(r.ceiling)}`);
  for (const s of r.sides) {
    const f = s.figures;
    // In tokens trained per hour, as issue 31.3's rows (training-loop.ts, strictTargets).
    if (f === null || sync === null) continue;
    const x = tokensPerHourRatio(f, sync);
    if (x === null) continue; // sync trained nothing (and so ran no step)
    const share =
      r.ceiling && r.ceiling.value > 0 ? `${((100 * x) / r.ceiling.value).toFixed(0)} % of the ceiling` : '';
    console.log(
      `    ${s.side.padEnd(15)} ${x.toFixed(2)}× sync in tokens/h (${(f.stepsPerHour / sync.stepsPerHour).toFixed(2)}× in steps/h), ${share}; servers busy ${(100 * f.production.busyFraction).toFixed(1)} %, slots ${(100 * f.production.slotFill).toFixed(1)} %; engine process ${s.engineCores?.toFixed(2) ?? 'n/a'} cores, mocks ${s.mockCores?.toFixed(2) ?? 'n/a'}; infrastructure failures ${s.maskedFailures ?? 'n/a'}`,
    );
  }
}

const isMain = process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1];
if (isMain) {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean' },
      workload: { type: 'string' },
      sides: { type: 'string' },
      'strict-quantile': { type: 'string' },
      'strict-over-sample': { type: 'string' },
      'max-staleness': { type: 'string' },
      'episode-slots': { type: 'string' },
      'message-cut': { type: 'string' },
      'strict-max-staleness': { type: 'string' },
      'warmup-steps': { type: 'string' },
      steps: { type: 'string' },
    },
  });
  const workloads = values.workload === undefined ? LONG_TAIL_WORKLOADS : [longTailWorkload(values.workload)];
  const overrides: Partial<TrainingBenchOptions> = {};
  // [flag, option, whole numbers only, least value]
  for (const [flag, key, whole, least] of [
    ['strict-quantile', 'strictQuantile', false, Number.MIN_VALUE],
    ['strict-over-sample', 'strictOverSample', false, Number.MIN_VALUE],
    ['max-staleness', 'maxStaleness', true, 0],
    ['episode-slots', 'episodeSlots', true, 0],
    ['message-cut', 'messageCut', true, 0],
    ['strict-max-staleness', 'strictMaxStaleness', true, 0],
    ['warmup-steps', 'warmupSteps', true, 0],
    ['steps', 'steps', true, 2],
  ] as const) {
    const v = values[flag];
    if (v === undefined) continue;
    const n = Number(v);
    if (!Number.isFinite(n) || n < least || (whole && !Number.isInteger(n)))
      throw new Error(
        `--${flag} must be ${whole ? 'a whole number' : 'a number'} ${least === Number.MIN_VALUE ? '> 0' : `≥ ${least}`} (got ${JSON.stringify(v)})`,
      );
    overrides[key] = n;
  }
  const sides = values.sides?.split(',') ?? LONG_TAIL_SIDES;
  const results: TrainingBenchResult[] = [];
  for (const w of workloads) {
    console.log(`\n${w.name}: ${w.about}`);
    const r = await longTailBench(w, values.quick ?? false, overrides, sides);
    printTrainingBench(r);
    results.push(r);
  }
  console.log('\nlong-tail workloads, summary:');
  for (const r of results) printLongTailSummary(r);
  const { printTargets } = await import('./targets.ts');
  printTargets(results.flatMap(longTailTargets));
}

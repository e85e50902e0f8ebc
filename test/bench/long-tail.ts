/**
 * Issue 31, item 2: the agentic long-tail workloads (workloads/long-tail.ts) through the training-loop
 * bench — sync, async strict (weights loaded in place, stale rollouts reset: nothing past the bound
 * trained) and async keep (stale rollouts kept) — each with its own ceiling (sync step ÷ the larger of
 * training time and generation at full slots) and the CPU the engine and the mocks used, to show the
 * engine is not what limits the run.
 *
 *   node --import tsx test/bench/long-tail.ts                          # both workloads (≈ 10 min)
 *   node --import tsx test/bench/long-tail.ts --workload agentic-swe   # one
 *   node --import tsx test/bench/long-tail.ts --quick                  # a smoke run, too short to quote
 */
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import {
  describeCeiling,
  longTailOptions,
  printTrainingBench,
  trainingBench,
  type TrainingBenchResult,
} from './training-loop.ts';
import { LONG_TAIL_WORKLOADS, longTailWorkload, type LongTailWorkload } from './workloads/long-tail.ts';

/** The sides each long-tail workload runs: sync, async strict, async keep. */
export const LONG_TAIL_SIDES = ['sync', 'async+in-place', 'async+keep'] as const;

export async function longTailBench(
  w: LongTailWorkload,
  quick: boolean,
  overrides: Partial<ReturnType<typeof longTailOptions>> = {},
): Promise<TrainingBenchResult> {
  return trainingBench({ ...longTailOptions(w, quick), ...overrides }, LONG_TAIL_SIDES);
}

/** One line per side: speed-up, its share of the ceiling, the engine's and the servers' load. */
export function printLongTailSummary(r: TrainingBenchResult): void {
  const sync = r.sides.find((s) => s.side === 'sync')?.figures ?? null;
  console.log(`  ${r.options.workload?.name}: ${describeCeiling(r.ceiling)}`);
  for (const s of r.sides) {
    const f = s.figures;
    if (f === null || sync === null || sync.stepsPerHour <= 0) continue;
    const x = f.stepsPerHour / sync.stepsPerHour;
    const share =
      r.ceiling && r.ceiling.value > 0 ? `${((100 * x) / r.ceiling.value).toFixed(0)} % of the ceiling` : '';
    console.log(
      `    ${s.side.padEnd(15)} ${x.toFixed(2)}× sync ${share}; servers busy ${(100 * f.production.busyFraction).toFixed(1)} %, slots ${(100 * f.production.slotFill).toFixed(1)} %; engine process ${s.engineCores?.toFixed(2) ?? 'n/a'} cores, mocks ${s.mockCores?.toFixed(2) ?? 'n/a'}; infrastructure failures ${s.maskedFailures ?? 'n/a'}`,
    );
  }
}

const isMain = process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1];
if (isMain) {
  const { values } = parseArgs({ options: { quick: { type: 'boolean' }, workload: { type: 'string' } } });
  const workloads = values.workload === undefined ? LONG_TAIL_WORKLOADS : [longTailWorkload(values.workload)];
  const results: TrainingBenchResult[] = [];
  for (const w of workloads) {
    console.log(`\n${w.name}: ${w.about}`);
    const r = await longTailBench(w, values.quick ?? false);
    printTrainingBench(r);
    results.push(r);
  }
  console.log('\nlong-tail workloads, summary:');
  for (const r of results) printLongTailSummary(r);
}

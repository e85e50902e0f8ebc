/**
 * What holds async + partial rollouts below the anchors' speed-up on this workload: the training loop
 * (./training-loop.ts) with the async side's knobs moved one at a time, against one sync run. At
 * staleness 1 over-sampling trades slots filled against tokens thrown away (groups that outlive the
 * bound are reset); at staleness 2 (in the runs recorded in docs/PERFORMANCE-HISTORY.md) nothing was thrown away and
 * what is left is the prefill of every continued rollout after a sync (new weights empty the servers'
 * prefix caches) — unless the weights are loaded in place (pause.mode in-place), which keeps it.
 * Stale rollouts kept (producer.staleRollouts keep) throw nothing away for its age: the rows say how
 * stale what the trainer took was instead.
 *
 *   node --import tsx test/bench/training-sweep.ts            # 8 steps a run, ≈ 20 min
 *   node --import tsx test/bench/training-sweep.ts --steps 6  # shorter
 */
import { parseArgs } from 'node:util';
import { trainingBench, trainingBenchDefaults, type TrainingBenchOptions } from './training-loop.ts';

interface Variant {
  label: string;
  options: Partial<TrainingBenchOptions>;
  /** async+partial aborts on a sync; async+in-place loads the weights in place; async+keep also keeps stale rollouts. */
  side?: 'async+in-place' | 'async+keep';
}

const VARIANTS: Variant[] = [
  { label: 'staleness 1, over-sample 0.25', options: { overSample: 0.25 } },
  { label: 'staleness 1, over-sample 0.5', options: { overSample: 0.5 } },
  { label: 'staleness 1, over-sample 1', options: { overSample: 1 } },
  { label: 'staleness 1, over-sample 1.5 (the default)', options: {} },
  { label: 'staleness 1, over-sample 2, 288 episode slots', options: { overSample: 2, episodeSlots: 288 } },
  { label: 'staleness 2, over-sample 1', options: { maxStaleness: 2, overSample: 1 } },
  { label: 'staleness 2, over-sample 1.5', options: { maxStaleness: 2 } },
  { label: 'staleness 1, over-sample 1.5, in place', options: {}, side: 'async+in-place' },
  { label: 'staleness 2, over-sample 1.5, in place', options: { maxStaleness: 2 }, side: 'async+in-place' },
  { label: 'staleness 1, over-sample 1, in place, kept', options: { overSample: 1 }, side: 'async+keep' },
  { label: 'staleness 1, over-sample 1.5, in place, kept', options: {}, side: 'async+keep' },
  { label: 'staleness 1, over-sample 2, in place, kept', options: { overSample: 2 }, side: 'async+keep' },
];

const { values } = parseArgs({ options: { steps: { type: 'string' } } });
const base = trainingBenchDefaults(false);
if (values.steps !== undefined) {
  const steps = Number(values.steps);
  if (!Number.isInteger(steps) || steps < 3) throw new Error(`--steps must be an integer ≥ 3 (got ${values.steps})`);
  base.steps = steps;
}

const sync = (await trainingBench(base, ['sync'])).sides[0].figures;
if (sync === null) throw new Error('the sync side measured nothing');
const syncTokensPerHour = sync.stepsPerHour * sync.tokensTakenPerStep;
const head = [
  'async + partial',
  'steps/h',
  '× sync',
  'step s',
  'slots %',
  'prefill %',
  'taken tok/step',
  'wasted tok/step',
  'tokens/h × sync',
  'stale mean/max',
  'past bound %',
];
const widths = [48, 9, 8, 8, 9, 11, 16, 17, 17, 16, 14];
const line = (cells: string[]) => cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('');
const rows: string[] = [];
for (const v of VARIANTS) {
  const f = (await trainingBench({ ...base, ...v.options }, [v.side ?? 'async+partial'])).sides[0].figures;
  if (f === null) {
    rows.push(`${v.label.padEnd(widths[0])}measured nothing`);
    continue;
  }
  rows.push(
    line([
      v.label,
      f.stepsPerHour.toFixed(0),
      `${(f.stepsPerHour / sync.stepsPerHour).toFixed(2)}×`,
      f.stepSeconds.toFixed(1),
      (100 * f.production.slotFill).toFixed(1),
      (100 * f.production.prefillFraction).toFixed(1),
      f.tokensTakenPerStep.toFixed(0),
      f.wastedTokensPerStep.toFixed(0),
      `${((f.stepsPerHour * f.tokensTakenPerStep) / syncTokensPerHour).toFixed(2)}×`,
      `${f.staleness.mean.toFixed(2)} / ${f.staleness.max}`,
      (100 * f.staleness.pastThresholdFraction).toFixed(1),
    ]),
  );
  console.error(`done: ${v.label}`);
}
console.log(
  `\nsync: ${sync.stepsPerHour.toFixed(0)} steps/h, ${sync.stepSeconds.toFixed(1)} s a step, ${sync.tokensTakenPerStep.toFixed(0)} tokens a step, slots ${(100 * sync.production.slotFill).toFixed(1)} % filled; ${base.steps} steps a run, GPU time at ${base.speedup}× speed`,
);
console.log(line(head));
for (const r of rows) console.log(r);

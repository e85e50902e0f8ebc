import type { AuditStats } from '../coordinator/audit.ts';
import { noFailures, type FailureKind } from '../domain/failure.ts';
import { existsSync, rmdirSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import type { Batch } from '../domain/batch.ts';
import { createEngine } from '../engine.ts';
import { emptyStatusCounts } from '../coordinator/producer.ts';
import { BatchFileWriter } from '../formats/batch-file.ts';
import { readCheckpoint } from '../coordinator/checkpoint.ts';
import { describeError } from '../errors.ts';
import type { Status } from '../domain/rollout.ts';
import { intFlag, UsageError } from './args.ts';
import { ProgressLine } from './progress.ts';
import { lockRunDir, newRunDir } from './run-dir.ts';
import {
  addTotals,
  batchTotals,
  cutToLastStep,
  emptyTotals,
  scanWrittenSteps,
  type WrittenTotals,
} from './written-steps.ts';
import { CONFIG_FLAGS, configFromFlags } from './config-flags.ts';

export const RUN_HELP = `Usage: rollout run [options]

Produce training batches and write them as JSONL (one group per line).
With no --config and no --llm-url it runs on embedded defaults: a built-in mock inference server on a
free loopback port and the shipped synthetic environments (guess-number, arithmetic).

Options:
  --config <file>      JSON engine config (see docs/CONFIGURATION.md); paths in it are relative to it
  --llm-url <url>      OpenAI-compatible inference server, e.g. http://127.0.0.1:8000/v1 (overrides llm.url)
  --model <name>       model name to request (overrides llm.model)
  --server <kind>      auto | vllm | sglang | llamacpp | openai | generic (overrides llm.server)
  --api <api>          chat | tokens: send token ids rendered with --tokenizer (overrides llm.api)
  --tokenizer <name>   qwen2.5, or a directory with tokenizer.json (overrides llm.tokenizer)
  --steps <n>          train steps (batches) the run produces (default 3); resumed, counted from its first
  --batch-size <n>     groups per batch (overrides batchSize)
  --threads <n>        worker threads (overrides workers.threads)
  --seed <n>           run seed (overrides seed)
  --strategy <s>       sync | async (overrides producer.strategy)
  --nats <url>         run groups on worker nodes (\`rollout node\`) over NATS JetStream (sets workers.nats.url)
  --run-dir <dir>      where to write batches.jsonl, summary.json, steps/ and engine.ckpt (default
                       runs/<timestamp>-<random>, a new dir); locked for the life of the process: a second
                       process on the same dir is refused
  --resume             continue the run in --run-dir after its last written batch (after a crash or a stop)
  --out <file>         batches file (default <run-dir>/batches.jsonl)
  --compact            turns that begin a later turn's conversation name it instead of repeating it
                       (messagesPrefixOf / promptIdsPrefixOf, as POST /batch {"compact": true})
  -h, --help           show this help

Logs go to stderr (LOG_LEVEL=debug|info|warn|error); the summary goes to stdout.`;

/** `rollout run`'s flags, as node:util parseArgs takes them (also read by test/readme-launch.test.ts). */
export const RUN_OPTIONS = {
  ...CONFIG_FLAGS,
  steps: { type: 'string' },
  'run-dir': { type: 'string' },
  resume: { type: 'boolean' },
  out: { type: 'string' },
  compact: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
} as const;

type RunFlags = ReturnType<typeof parseArgs<{ options: typeof RUN_OPTIONS; strict: true }>>['values'];

export async function runCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({ args: argv, options: RUN_OPTIONS, strict: true });
  if (values.help) {
    console.log(RUN_HELP);
    return 0;
  }
  const steps = intFlag('steps', values.steps, { min: 1 }) ?? 3;
  const { config, configPath } = configFromFlags(values);
  // On a terminal the live progress line replaces the per-batch info logs.
  if (process.stderr.isTTY && process.env.LOG_LEVEL === undefined && config.logLevel === undefined)
    config.logLevel = 'warn';

  if (values.resume && values['run-dir'] === undefined && typeof config.runDir !== 'string')
    throw new UsageError('--resume needs --run-dir (the directory of the run to continue)');
  const named = values['run-dir'] ?? (typeof config.runDir === 'string' ? config.runDir : null);
  // A run to continue is there: a missing dir is a typo, and starting a new run in it would not say so.
  if (values.resume && !existsSync(resolve(named!)))
    throw new UsageError(
      `--resume: run dir ${resolve(named!)} does not exist; give the dir of the run to continue, or drop --resume to start one`,
    );
  // Made by this process (a default name, or a --run-dir not there yet): removed again if the run fails before writing in it.
  const madeHere = named === null || !existsSync(resolve(named));
  const runDir = named === null ? newRunDir(resolve('runs')) : resolve(named);
  // Held until this process exits, taken before anything in the dir is read or cut: a second run, or a
  // second --resume of this one, is refused here instead of writing the same run (run-dir.ts).
  await lockRunDir(runDir);
  try {
    return await runLocked(values, steps, config, configPath, runDir);
  } catch (err) {
    // Failed or refused before writing in a dir it made (nothing is there, or it would stay): not left behind.
    if (madeHere) rmEmptyDir(runDir);
    throw err;
  }
}

/** `rollout run` once its run dir is locked: what `runCommand` checked is in `values` and `config`. */
async function runLocked(
  values: RunFlags,
  steps: number,
  config: Record<string, unknown>,
  configPath: string | undefined,
  runDir: string,
): Promise<number> {
  config.runDir = runDir; // step records go to <runDir>/steps/, the per-batch checkpoint to <runDir>/engine.ckpt
  if (values.resume) config.resume = true;
  const checkpointPath = join(runDir, 'engine.ckpt');
  // The run's own checkpoint, whatever checkpointEachBatch says (a signal stop writes one too), and not
  // the checkpoint the run may have started from (a config's resumeFrom).
  if (values.resume && existsSync(checkpointPath)) config.resumeFrom = checkpointPath;
  const batchesPath = resolve(values.out ?? join(runDir, 'batches.jsonl'));
  const holdsBatches = existsSync(batchesPath) && statSync(batchesPath).size > 0;
  // Appending a new run to an old file would give the trainer the same steps (and group ids) twice.
  if (!values.resume && holdsBatches)
    throw new UsageError(
      `${batchesPath} already holds batches: pass --resume to continue that run, or choose another --run-dir / --out`,
    );
  if (values.resume && holdsBatches && !existsSync(checkpointPath)) {
    throw new UsageError(
      `--resume: ${checkpointPath} is missing, so the run in ${batchesPath} cannot continue without producing its groups again; start a new --run-dir instead`,
    );
  }
  const engine = createEngine(config, { baseDir: configPath === undefined ? process.cwd() : dirname(configPath) });
  // Resuming: the batches file is the trainer's record of what it received; continue after its last
  // step. Only read here: a cut tail is cut when the first batch is written, so a refusal writes nothing.
  const written = values.resume ? await scanWrittenSteps(batchesPath, engine.config.batchSize) : null;
  if (written !== null && existsSync(checkpointPath)) {
    // The checkpoint is written after a batch is taken and before it is written out: the file ends at
    // the checkpoint's last step, or one before it (that batch is delivered again). Anything else is
    // another run's checkpoint, or an older one.
    const handedOut = readCheckpoint(checkpointPath, engine.config).progress.nextTrainStep - 1;
    if (written.last !== handedOut && written.last !== handedOut - 1) {
      throw new UsageError(
        `--resume: ${batchesPath} ends at step ${written.last} but ${checkpointPath} handed out step ${handedOut}: they are not of the same run, or the checkpoint is older than the batches`,
      );
    }
  }
  // Opened at the first batch: a run that fails before it leaves no empty file.
  let writer: BatchFileWriter | null = null;
  const write = async (batch: Batch) => {
    if (writer === null) {
      if (written !== null) cutToLastStep(batchesPath, written);
      writer = new BatchFileWriter(batchesPath, { compact: values.compact ?? false });
    }
    await writer.write(batch);
  };
  // SIGINT / SIGTERM: stop taking batches, let groups in flight come back, checkpoint, exit 0.
  let stopping = false;
  const stopOnSignal = () => {
    stopping = true;
    void engine.pauseForWeightUpdate().catch(() => undefined);
  };
  process.once('SIGINT', stopOnSignal);
  process.once('SIGTERM', stopOnSignal);

  const started = performance.now();
  // Batches earlier processes of this run wrote (a --resume): the progress line and summary count the whole run.
  const earlier = written?.totals ?? emptyTotals();
  // Only the batches' stats are kept for the summary, never a batch: a long run's batches outgrow the heap.
  const here = emptyTotals();
  let landed: Record<Status, number> | null = null;
  let failure: unknown = null;
  let failures = noFailures();
  let audit: AuditStats | null = null;
  const progress = new ProgressLine(engine, steps, { batches: earlier.batches });
  try {
    await engine.start();
    progress.start();
    // A checkpoint named in the config (resumeFrom) carries its own next step: its batches were handed out already.
    const nextTrainStep = (await engine.stats()).nextTrainStep;
    const firstStep = written !== null ? written.last + 1 : nextTrainStep;
    // Resumed, the run still began at its first written step: the command that crashed is the one that finishes it.
    const lastStep = (written !== null && written.first > 0 ? written.first : firstStep) + steps - 1;
    for (let step = firstStep; step <= lastStep && !stopping; ) {
      const batch = await engine.getBatch(step);
      if (stopping) break;
      if (batch.status !== 'NORMAL') {
        // No trainer is attached: stand in for one by "syncing" weights to the step just trained.
        await engine.pauseForWeightUpdate();
        await engine.resume({ modelStep: Math.max(engine.config.modelStep, step - 1) });
        continue;
      }
      await write(batch);
      addTotals(here, batchTotals(batch.stats));
      progress.batch(batch.groups.length, batch.stats.meanReward);
      step++;
    }
    landed = (await engine.stats()).groups.landed;
    if (stopping) {
      await engine.pauseForWeightUpdate();
      await engine.checkpoint(join(runDir, 'engine.ckpt'));
      console.error(
        `rollout run: stopped by a signal after ${earlier.batches + here.batches} batches; continue with --resume --run-dir ${runDir}`,
      );
    }
  } catch (err) {
    failure = err;
    landed = await engine.stats().then(
      (s) => s.groups.landed,
      () => null,
    );
  } finally {
    progress.stop();
    const stats = await engine.stats().catch(() => null);
    failures = stats?.failures ?? noFailures();
    audit = stats?.audit ?? null;
    await (writer as BatchFileWriter | null)?.close();
    await engine.close();
    process.off('SIGINT', stopOnSignal);
    process.off('SIGTERM', stopOnSignal);
  }
  // Failed before writing a batch: nothing to summarise, so nothing is written — an earlier summary
  // stays as it was. The error is printed once, by the caller.
  if (failure !== null && here.batches === 0) throw failure;
  const seconds = (performance.now() - started) / 1000;
  const summary = summarize(
    earlier,
    here,
    landed ?? emptyStatusCounts(),
    failures,
    seconds,
    batchesPath,
    failure === null ? null : describeError(failure),
    engine.config.audit.fraction > 0 || audit?.rollouts ? audit : null,
  );
  writeFileSync(join(runDir, 'summary.json'), `${JSON.stringify(summary, null, 2)}\n`);
  console.log(formatSummary(summary));
  if (failure !== null) throw failure;
  return 0;
}

/** Removes `dir` if it is empty; anything in it (step records of the groups that failed) keeps it. */
function rmEmptyDir(dir: string): void {
  try {
    rmdirSync(dir);
  } catch {
    // not empty, or gone: either way nothing of the failed run is lost
  }
}

interface RunSummary {
  /** Batches of the whole run, earlier processes' too (a --resume); so are the counts below, to `responseTokens`. */
  batches: number;
  /** Of `batches`, those this process wrote. */
  batchesThisProcess: number;
  groups: number;
  rollouts: number;
  meanReward: number;
  turns: number;
  responseTokens: number;
  /** Groups landed by status over the whole run (the checkpoint carries the counts across a resume). */
  produced: Record<Status, number>;
  /** Episodes that failed in this process, by kind; infrastructure ones ran again in their slot, never trained. */
  failures: Record<FailureKind, number>;
  /** This process's time, and its agent steps per second. */
  seconds: number;
  stepsPerSecond: number;
  output: string;
  /** Why the run stopped before its last step; null when it finished (or was stopped by a signal). */
  error: string | null;
  /** The consistency audit of this process (audit.fraction > 0): |Δ logprob| by segment, flagged rollouts, cost. */
  audit?: AuditStats;
}

function summarize(
  earlier: WrittenTotals,
  here: WrittenTotals,
  produced: Record<Status, number>,
  failures: Record<FailureKind, number>,
  seconds: number,
  output: string,
  error: string | null,
  audit: AuditStats | null,
): RunSummary {
  const run = emptyTotals();
  addTotals(run, earlier);
  addTotals(run, here);
  return {
    batches: run.batches,
    batchesThisProcess: here.batches,
    groups: run.groups,
    rollouts: run.rollouts,
    meanReward: run.meanReward,
    turns: run.turns,
    responseTokens: run.responseTokens,
    produced,
    failures,
    seconds,
    stepsPerSecond: seconds > 0 ? here.turns / seconds : 0,
    output,
    error,
    ...(audit !== null ? { audit } : {}),
  };
}

/** The summary on stdout. A failure is not repeated here: the error is printed once, on stderr. */
function formatSummary(s: RunSummary): string {
  const produced = Object.entries(s.produced)
    .filter(([, n]) => n > 0)
    .map(([status, n]) => `${status} ${n}`)
    .join(', ');
  const failed = Object.entries(s.failures)
    .filter(([, n]) => n > 0)
    .map(([kind, n]) => `${kind} ${n}`)
    .join(', ');
  const resumed = s.batchesThisProcess === s.batches ? '' : ` (${s.batchesThisProcess} by this process)`;
  return [
    `rollout run: ${s.batches} batches written to ${s.output}${resumed}`,
    `  groups      ${s.groups} in batches (produced: ${produced || 'none'})`,
    `  rollouts    ${s.rollouts}, mean reward ${s.meanReward.toFixed(3)}`,
    `  steps       ${s.turns} agent steps, ${s.responseTokens} response tokens`,
    ...(failed === ''
      ? []
      : [`  failed      episodes by kind: ${failed} (infrastructure ones ran again, never trained)`]),
    `  time        ${s.seconds.toFixed(2)} s, ${s.stepsPerSecond.toFixed(1)} steps/s${resumed === '' ? '' : ' (this process)'}`,
    ...(s.audit === undefined ? [] : [auditLine(s.audit)]),
  ].join('\n');
}

/** The audit in one line: what was compared, how far it drifted, what was flagged, what it cost. */
function auditLine(a: AuditStats): string {
  const share = `${(a.cost.tokenShare * 100).toFixed(1)}% of generated tokens re-scored, ${a.cost.seconds.toFixed(2)} s`;
  return `  audit       ${a.rollouts} rollouts, ${a.tokens} tokens: mean |Δ logprob| ${a.meanAbsDelta.toExponential(2)}, max ${a.maxAbsDelta.toExponential(2)}, ${a.flagged} flagged (${share})`;
}

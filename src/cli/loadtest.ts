import { join } from 'node:path';
import { parseArgs } from 'node:util';
import {
  defaultLoadtestOptions,
  formatTable,
  LOADTEST_ENVS,
  runLoadtest,
  type LoadtestEnv,
  type LoadtestOptions,
} from '../loadtest/index.ts';
import { intFlag, numberFlag, UsageError } from './args.ts';

export const LOADTEST_HELP = `Usage: rollout loadtest [options]

Size a deployment before spending GPUs: run the engine on the built-in synthetic environments against
the mock inference server (started in its own process, so its CPU is not counted as the engine's),
take batches like a trainer for --duration seconds, and report throughput, latency per phase, pause
timings, memory per in-flight rollout and the engine's CPU per agent step. Prints a table and writes
report.json and a self-contained report.html (open it in any browser).

Load:
  --rollouts <n>           rollouts in flight, rounded up to whole groups (default 256)
  --group-size <n>         rollouts per group (default 4)
  --episode-slots          count episodes playing, not rollouts held: a rollout that ends before its
                           siblings hands its slot to another group's (workers.rolloutsPerWorker)
  --workers <n>            worker threads (default: available CPUs)
  --envs <list>            comma-separated: ${LOADTEST_ENVS.join(', ')} (default guess-number,arithmetic; guess-number is multi-turn, tool-lookup calls tools)
  --env-cpu-us <µs>        CPU each environment step burns (default 0)
Mock inference server:
  --latency-ms <ms>        fixed latency per request (default 20)
  --tokens-per-second <n>  generation rate per request; 0 = instant (default 0)
  --think-tokens <n>       filler tokens in every answer, to size responses (default 16)
  --max-tokens <n>         max_tokens per turn (default max(512, think tokens + 64))
  --stream                 streamed replies (llm.stream): an aborting pause holds each call with the
                           tokens it has instead of waiting for the server's aborted replies
  --stream-interval-ms <ms>  how often a streamed reply sends its new tokens (default 20)
  --capacity <slots>       the GPU-like mock instead (rollout mock-llm --capacity): sequence slots,
                           continuous batching, prefix cache; replaces --latency-ms and
                           --tokens-per-second, and the report shows the servers' busy fraction
  --capacity-response-tokens <n>  median response length, log-normal (default: --think-tokens)
  --capacity-length-sigma <σ>     σ of log(response length) (default 1)
  --capacity-speedup <x>   GPU ms per real ms; trainer and load times below are GPU time (default 1)
Run:
  --duration <s>           measured seconds, after start-up (default 10)
  --train-ms <ms>          time the stand-in trainer spends per batch, so async production overlaps it (default 0)
  --train-ms-per-token <ms>  and per response token of the batch: training proportional to its tokens (default 0)
  --sync-every <n>         sync weights after every n batches: pause, --load-ms, resume (default: only
                           when a batch would be too stale, and --pause-every)
  --load-ms <ms>           time a weight sync spends loading the weights, servers idle (default 0)
  --strategy <s>           sync | async (default async; async syncs weights when a batch would be too stale)
  --max-staleness <n>      async: weight syncs a sample may lag (default 1)
  --stale-rollouts <m>     async: reset | keep: a rollout past that bound is generated again, or
                           trained as it is (the bound then only limits production; default reset)
  --pause-every <s>        also pause for a weight update every <s> seconds, to measure pauses (default off)
  --pause-mode <m>         abort | drain | in-place: what a pause does to calls in flight (default abort)
  --seed <n>               run seed (default 0)
  --out <dir>              where report.json and report.html go (default runs/loadtest-<timestamp>)
  -h, --help               show this help

Example:
  rollout loadtest --rollouts 1024 --workers 4 --latency-ms 200 --tokens-per-second 50 --think-tokens 200 --duration 30 --pause-every 5`;

export async function loadtestCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      rollouts: { type: 'string' },
      'group-size': { type: 'string' },
      'episode-slots': { type: 'boolean' },
      workers: { type: 'string' },
      envs: { type: 'string' },
      'env-cpu-us': { type: 'string' },
      'latency-ms': { type: 'string' },
      'tokens-per-second': { type: 'string' },
      'think-tokens': { type: 'string' },
      'max-tokens': { type: 'string' },
      stream: { type: 'boolean' },
      'stream-interval-ms': { type: 'string' },
      duration: { type: 'string' },
      'train-ms': { type: 'string' },
      'train-ms-per-token': { type: 'string' },
      'sync-every': { type: 'string' },
      'load-ms': { type: 'string' },
      capacity: { type: 'string' },
      'capacity-response-tokens': { type: 'string' },
      'capacity-length-sigma': { type: 'string' },
      'capacity-speedup': { type: 'string' },
      strategy: { type: 'string' },
      'max-staleness': { type: 'string' },
      'stale-rollouts': { type: 'string' },
      'pause-every': { type: 'string' },
      'pause-mode': { type: 'string' },
      seed: { type: 'string' },
      out: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
  if (values.help) {
    console.log(LOADTEST_HELP);
    return 0;
  }
  const options = loadtestOptions(values);
  const workers = `${options.workers} worker${options.workers === 1 ? '' : 's'}`;
  console.error(
    `rollout loadtest: ${options.rollouts} rollouts in flight on ${workers} (${options.envs.join('+')}), ${options.strategy}, ${options.durationS} s…`,
  );
  // Ctrl-C or a kill mid-run: exit through process.exit so the mock server's process is ended too.
  const interrupted = (signal: NodeJS.Signals) => {
    console.error(`rollout loadtest: ${signal}, stopping without a report`);
    process.exit(128 + (signal === 'SIGINT' ? 2 : 15));
  };
  process.once('SIGINT', interrupted);
  process.once('SIGTERM', interrupted);
  try {
    const { report, files } = await runLoadtest(options);
    console.log(formatTable(report, files));
    return 0;
  } finally {
    process.off('SIGINT', interrupted);
    process.off('SIGTERM', interrupted);
  }
}

/** Flags → options; every error names the flag and the value. */
function loadtestOptions(values: Record<string, string | boolean | undefined>): LoadtestOptions {
  const str = (name: string) => values[name] as string | undefined;
  const defaults = defaultLoadtestOptions(str('out') ?? join('runs', `loadtest-${timestamp()}`));
  const thinkTokens = intFlag('think-tokens', str('think-tokens')) ?? defaults.thinkTokens;
  const workers = intFlag('workers', str('workers'), { min: 1 }) ?? defaults.workers;
  return {
    ...defaults,
    rollouts: intFlag('rollouts', str('rollouts'), { min: 1 }) ?? defaults.rollouts,
    groupSize: intFlag('group-size', str('group-size'), { min: 1 }) ?? defaults.groupSize,
    episodeSlots: values['episode-slots'] === true,
    workers,
    envs: envsFlag(str('envs')) ?? defaults.envs,
    envCpuUs: numberFlag('env-cpu-us', str('env-cpu-us'), { max: 60_000_000 }) ?? defaults.envCpuUs,
    latencyMs: numberFlag('latency-ms', str('latency-ms')) ?? defaults.latencyMs,
    tokensPerSecond: numberFlag('tokens-per-second', str('tokens-per-second')) ?? defaults.tokensPerSecond,
    thinkTokens,
    maxTokens: intFlag('max-tokens', str('max-tokens'), { min: 1 }) ?? Math.max(defaults.maxTokens, thinkTokens + 64),
    durationS: positiveFlag('duration', str('duration')) ?? defaults.durationS,
    trainMs: numberFlag('train-ms', str('train-ms')) ?? defaults.trainMs,
    trainMsPerToken: numberFlag('train-ms-per-token', str('train-ms-per-token')) ?? defaults.trainMsPerToken,
    syncEvery: intFlag('sync-every', str('sync-every'), { min: 1 }) ?? defaults.syncEvery,
    loadMs: numberFlag('load-ms', str('load-ms')) ?? defaults.loadMs,
    capacity: capacityFlags(values),
    strategy: choiceFlag('strategy', str('strategy'), ['sync', 'async'] as const) ?? defaults.strategy,
    maxStaleness: intFlag('max-staleness', str('max-staleness')) ?? defaults.maxStaleness,
    staleRollouts: staleRolloutsFlag(str('stale-rollouts'), str('strategy')) ?? defaults.staleRollouts,
    pauseEveryS: positiveFlag('pause-every', str('pause-every')) ?? defaults.pauseEveryS,
    pauseMode:
      choiceFlag('pause-mode', str('pause-mode'), ['abort', 'drain', 'in-place'] as const) ?? defaults.pauseMode,
    stream: values.stream === true,
    streamIntervalMs:
      numberFlag('stream-interval-ms', str('stream-interval-ms'), { min: 1, max: 60_000 }) ?? defaults.streamIntervalMs,
    seed: intFlag('seed', str('seed')) ?? defaults.seed,
  };
}

/** --stale-rollouts: only an async run has stale rollouts to keep. */
function staleRolloutsFlag(
  value: string | undefined,
  strategy: string | undefined,
): LoadtestOptions['staleRollouts'] | undefined {
  const mode = choiceFlag('stale-rollouts', value, ['reset', 'keep'] as const);
  if (mode === 'keep' && strategy === 'sync')
    throw new UsageError('--stale-rollouts keep needs --strategy async (got --strategy sync)');
  return mode;
}

/** The GPU-like mock's flags; its sub-flags without --capacity, or beside a fixed latency, are refused. */
function capacityFlags(values: Record<string, string | boolean | undefined>): LoadtestOptions['capacity'] {
  const str = (name: string) => values[name] as string | undefined;
  const sub = ['capacity-response-tokens', 'capacity-length-sigma', 'capacity-speedup'].find(
    (k) => values[k] !== undefined,
  );
  if (values.capacity === undefined) {
    if (sub !== undefined)
      throw new UsageError(
        `--${sub} needs --capacity <slots> (got --${sub} ${JSON.stringify(values[sub])} without it)`,
      );
    return null;
  }
  const fixed = ['latency-ms', 'tokens-per-second'].find((k) => values[k] !== undefined);
  if (fixed !== undefined)
    throw new UsageError(
      `--${fixed} does not apply with --capacity: the GPU-like mock sets the timing (got --${fixed} ${JSON.stringify(values[fixed])})`,
    );
  return {
    slots: intFlag('capacity', str('capacity'), { min: 1, max: 65_536 })!,
    responseTokens: intFlag('capacity-response-tokens', str('capacity-response-tokens'), { min: 1 }) ?? null,
    lengthSigma: numberFlag('capacity-length-sigma', str('capacity-length-sigma'), { max: 4 }) ?? 1,
    speedup: numberFlag('capacity-speedup', str('capacity-speedup'), { min: 0.001, max: 1_000 }) ?? 1,
  };
}

/** A duration: zero would measure nothing, so it is rejected along with negatives. */
function positiveFlag(name: string, value: string | undefined): number | undefined {
  const n = numberFlag(name, value);
  if (n === 0) throw new UsageError(`--${name} must be a number > 0 (got ${JSON.stringify(value)})`);
  return n;
}

function choiceFlag<T extends string>(name: string, value: string | undefined, choices: readonly T[]): T | undefined {
  if (value === undefined) return undefined;
  if (!(choices as readonly string[]).includes(value))
    throw new UsageError(`--${name} must be one of ${choices.join(', ')} (got ${JSON.stringify(value)})`);
  return value as T;
}

function envsFlag(value: string | undefined): LoadtestEnv[] | undefined {
  if (value === undefined) return undefined;
  const names = value.split(',').map((s) => s.trim());
  const envs: LoadtestEnv[] = [];
  for (const name of names) {
    if (!(LOADTEST_ENVS as readonly string[]).includes(name)) {
      throw new UsageError(
        `--envs: unknown environment ${JSON.stringify(name)} (known: ${LOADTEST_ENVS.join(', ')}; got ${JSON.stringify(value)})`,
      );
    }
    if (envs.includes(name as LoadtestEnv))
      throw new UsageError(`--envs: ${JSON.stringify(name)} is listed twice (got ${JSON.stringify(value)})`);
    envs.push(name as LoadtestEnv);
  }
  return envs;
}

function timestamp(): string {
  return new Date().toISOString().replace(/[-:]/g, '').replace(/\..*$/, '').replace('T', '-');
}

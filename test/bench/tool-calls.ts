/**
 * What a tool call costs the engine: builtin:tool-lookup (the mock policy looks two keys up with
 * real tool calls, then answers) beside builtin:arithmetic (one call, no tools), against the same
 * mock process, one worker, the same rollouts in flight, in one run.
 *
 * Steps, inference calls and tool calls are counted from the turn records of the batches taken in
 * the window (a turn is an inference call; its `toolCalls` the calls it made), never assumed from
 * the policy. CPU is process.cpuUsage() over the window (coordinator + worker, not the mock). The CPU
 * per tool call is what a tool-lookup step costs beyond its inference calls, priced at arithmetic's
 * CPU per inference call, divided by its tool calls: running the call, its tool message, its record.
 *
 *   node --import tsx test/bench/tool-calls.ts [seconds] [repeats]
 */
import { pathToFileURL } from 'node:url';
import { createEngine, type Batch } from '../../src/index.ts';
import { startMockProcess } from '../../src/loadtest/mock-process.ts';

const WARM_UP_MS = 1_000;

export interface ToolEnvSample {
  env: 'tool-lookup' | 'arithmetic';
  seconds: number;
  cpuMs: number;
  steps: number;
  inferenceCalls: number;
  toolCalls: number;
}

export interface ToolCallFigures {
  /** Median over repeats, per env: µs of engine CPU per step and per inference call, calls per step. */
  perEnv: Record<
    ToolEnvSample['env'],
    { cpuUsPerStep: number; cpuUsPerInferenceCall: number; inferenceCallsPerStep: number; toolCallsPerStep: number }
  >;
  /** (tool-lookup CPU per step − its inference calls × arithmetic's CPU per call) ÷ its tool calls per step. */
  cpuUsPerToolCall: number;
  samples: ToolEnvSample[];
  concurrency: number;
}

async function run(
  url: string,
  env: ToolEnvSample['env'],
  concurrency: number,
  seconds: number,
): Promise<ToolEnvSample> {
  const groupSize = 4;
  const groups = Math.max(1, Math.round(concurrency / groupSize));
  const engine = createEngine({
    logLevel: 'warn',
    llm: { url, connections: concurrency + 8 },
    batchSize: groups,
    workers: { threads: 1, groupsPerWorker: groups },
    producer: { strategy: 'async', maxStaleness: 1_000_000, overSampleThreshold: 1 },
    tasks: [{ name: env, env: { module: `builtin:${env}` }, groupSize, maxSteps: 1, maxTokens: 64 }],
  });
  await engine.start();
  try {
    const warmUntil = performance.now() + WARM_UP_MS;
    do await engine.getBatch();
    while (performance.now() < warmUntil);
    const counted = { steps: 0, inferenceCalls: 0, toolCalls: 0 };
    const count = (batch: Batch) => {
      for (const g of batch.groups)
        for (const r of g.rollouts) {
          counted.steps += new Set(r.turns.map((t) => t.step)).size;
          for (const t of r.turns) {
            counted.inferenceCalls++;
            counted.toolCalls += t.toolCalls?.length ?? 0;
          }
        }
    };
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    while (performance.now() - t0 < seconds * 1000) count(await engine.getBatch());
    const elapsed = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    return { env, seconds: elapsed, cpuMs: (cpu.user + cpu.system) / 1000, ...counted };
  } finally {
    await engine.close();
  }
}

export async function toolCallCost(o: {
  seconds: number;
  repeats: number;
  concurrency?: number;
  latencyMs?: number;
}): Promise<ToolCallFigures> {
  const concurrency = o.concurrency ?? 64;
  const mock = await startMockProcess(['--latency-ms', String(o.latencyMs ?? 5)]);
  const samples: ToolEnvSample[] = [];
  try {
    // Alternated, so a drift of the machine's speed falls on both sides alike.
    for (let i = 0; i < o.repeats; i++)
      for (const env of ['tool-lookup', 'arithmetic'] as const)
        samples.push(await run(mock.url, env, concurrency, o.seconds));
  } finally {
    await mock.close();
  }
  const perEnv = (env: ToolEnvSample['env']) => {
    const of = samples.filter((s) => s.env === env);
    return {
      cpuUsPerStep: median(of.map((s) => (s.cpuMs * 1000) / Math.max(1, s.steps))),
      cpuUsPerInferenceCall: median(of.map((s) => (s.cpuMs * 1000) / Math.max(1, s.inferenceCalls))),
      inferenceCallsPerStep: median(of.map((s) => s.inferenceCalls / Math.max(1, s.steps))),
      toolCallsPerStep: median(of.map((s) => s.toolCalls / Math.max(1, s.steps))),
    };
  };
  const tools = perEnv('tool-lookup');
  const plain = perEnv('arithmetic');
  return {
    perEnv: { 'tool-lookup': tools, arithmetic: plain },
    cpuUsPerToolCall:
      (tools.cpuUsPerStep - tools.inferenceCallsPerStep * plain.cpuUsPerInferenceCall) /
      Math.max(Number.EPSILON, tools.toolCallsPerStep),
    samples,
    concurrency,
  };
}

export function describeToolCallCost(f: ToolCallFigures): string {
  const line = (env: ToolEnvSample['env']) => {
    const e = f.perEnv[env];
    return `  ${env.padEnd(12)} ${e.cpuUsPerStep.toFixed(0).padStart(6)} µs per step, ${e.inferenceCallsPerStep.toFixed(2)} inference calls (${e.cpuUsPerInferenceCall.toFixed(0)} µs each) and ${e.toolCallsPerStep.toFixed(2)} tool calls per step`;
  };
  return [
    `tool calls: engine CPU, 1 worker, ${f.concurrency} rollouts in flight, counted from the turn records (${f.samples.length / 2} runs each, medians)`,
    line('tool-lookup'),
    line('arithmetic'),
    `  CPU per tool call beyond its inference calls: ${f.cpuUsPerToolCall.toFixed(0)} µs`,
  ].join('\n');
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[sorted.length >> 1];
}

if (process.argv[1] && pathToFileURL(process.argv[1]).href === import.meta.url) {
  const figures = await toolCallCost({ seconds: Number(process.argv[2] ?? 5), repeats: Number(process.argv[3] ?? 3) });
  console.log(describeToolCallCost(figures));
}

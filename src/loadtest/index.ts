/**
 * `rollout loadtest` as a library call: the mock inference server in its own process, the engine on
 * the built-in synthetic environments in this one, a trainer-like loop for `durationS`, then a report
 * written as report.json and report.html.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { renderHtml } from './html.ts';
import { startMockProcess } from './mock-process.ts';
import type { LoadtestOptions } from './options.ts';
import { buildReport, type LoadtestReport } from './report.ts';
import { runEngine } from './runner.ts';

export interface LoadtestResult {
  report: LoadtestReport;
  files: { json: string; html: string };
}

export async function runLoadtest(options: LoadtestOptions): Promise<LoadtestResult> {
  const outDir = resolve(options.outDir);
  // Fail on an unwritable --out before spending the run.
  mkdirSync(outDir, { recursive: true });
  const startedAt = new Date();
  const c = options.capacity;
  const timing =
    c === null
      ? ['--latency-ms', String(options.latencyMs), '--tokens-per-second', String(options.tokensPerSecond)]
      : [
          '--capacity',
          String(c.slots),
          '--capacity-length-sigma',
          String(c.lengthSigma),
          '--capacity-speedup',
          String(c.speedup),
          ...(c.responseTokens === null ? [] : ['--capacity-response-tokens', String(c.responseTokens)]),
        ];
  const mock = await startMockProcess([
    ...timing,
    '--think-tokens',
    String(options.thinkTokens),
    '--stream-interval-ms',
    String(options.streamIntervalMs),
    '--seed',
    String(options.seed),
  ]);
  let report: LoadtestReport;
  try {
    report = buildReport(options, await runEngine(options, mock), startedAt);
  } finally {
    await mock.close();
  }
  const files = { json: join(outDir, 'report.json'), html: join(outDir, 'report.html') };
  writeFileSync(files.json, `${JSON.stringify(report, null, 2)}\n`);
  writeFileSync(files.html, renderHtml(report));
  return { report, files };
}

export { defaultLoadtestOptions, LOADTEST_ENVS, type LoadtestEnv, type LoadtestOptions } from './options.ts';
export type { LoadtestReport } from './report.ts';
export { formatTable } from './table.ts';
export { startMockProcess, type MockProcess } from './mock-process.ts';

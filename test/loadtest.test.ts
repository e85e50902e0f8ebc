import { rollout } from './support/cli.ts';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { before, describe, it } from 'node:test';

const CHROMIUM = '/usr/bin/chromium';

describe('rollout loadtest', () => {
  const out = mkdtempSync(join(tmpdir(), 'rollout-loadtest-'));
  let run: { code: number | null; stdout: string; stderr: string };
  // One short run (3 s measured, a pause every second) shared by the checks below.
  before(async () => {
    run = await rollout([
      'loadtest',
      '--duration',
      '3',
      '--rollouts',
      '32',
      '--workers',
      '2',
      '--pause-every',
      '1',
      '--latency-ms',
      '5',
      '--think-tokens',
      '8',
      '--env-cpu-us',
      '20',
      '--out',
      out,
    ]);
  });

  it('exits 0 and prints a table of throughput, latency, pauses, memory and CPU', () => {
    assert.equal(run.code, 0, run.stderr);
    assert.match(run.stdout, /32 rollouts in flight \(8 groups × 4\), 2 workers/);
    assert.match(run.stdout, /agent steps\/s\s+\d/);
    assert.match(run.stdout, /rollouts\/s\s+\d/);
    assert.match(run.stdout, /tokens\/s\s+\d/);
    for (const phase of [
      'rollout queue',
      'rollout inference',
      'rollout environment',
      'rollout total',
      'turn inference',
      'turn environment',
    ]) {
      assert.match(run.stdout, new RegExp(`${phase}\\s+\\d+\\s+[\\d.]+ ms\\s+[\\d.]+ ms\\s+[\\d.]+ ms`), phase);
    }
    assert.match(run.stdout, /workers stopped\s+\d+\s+[\d.]+ ms/);
    assert.match(run.stdout, /all groups back\s+\d+\s+[\d.]+ ms/);
    assert.match(run.stdout, /memory per in-flight rollout\s+heap -?[\d.]+ [KMG]?i?B, RSS -?[\d.]+ [KMG]?i?B/);
    assert.match(run.stdout, /engine CPU\s+[\d.]+ µs per agent step/);
    assert.ok(run.stdout.includes(join(out, 'report.json')));
  });

  it('writes report.json with throughput, latency percentiles, pause timings, memory and CPU figures', () => {
    const report = JSON.parse(readFileSync(join(out, 'report.json'), 'utf8'));
    assert.ok(report.window.seconds >= 2.9 && report.window.seconds < 4, `window ${report.window.seconds} s`);
    for (const key of ['stepsPerSecond', 'rolloutsPerSecond', 'groupsPerSecond', 'tokensPerSecond']) {
      assert.ok(report.throughput[key] > 0, `throughput.${key} = ${report.throughput[key]}`);
    }
    assert.ok(report.timeSeries.length >= 2, 'a point per second');
    assert.ok(report.timeSeries.some((p: { stepsPerSecond: number }) => p.stepsPerSecond > 0));
    const phases = [
      report.latency.rollout.queueMs,
      report.latency.rollout.inferenceMs,
      report.latency.rollout.envMs,
      report.latency.rollout.totalMs,
      report.latency.turn.inferenceMs,
      report.latency.turn.envMs,
    ];
    for (const d of phases) {
      assert.ok(d.count > 0);
      assert.ok(d.p50 <= d.p90 && d.p90 <= d.p99 && d.p99 <= d.max, JSON.stringify(d));
      assert.equal(
        d.histogram.counts.reduce((a: number, b: number) => a + b, 0),
        d.count,
        'every value lands in a histogram bin',
      );
    }
    assert.ok(report.latency.rollout.inferenceMs.p50 >= 5, 'inference takes at least the mock latency');
    assert.ok(report.latency.turn.envMs.p50 >= 0.02, 'each env step burns its 20 µs');
    assert.ok(report.pauses.byReason.scheduled >= 2, `scheduled pauses: ${JSON.stringify(report.pauses.byReason)}`);
    assert.ok(report.pauses.allBackMs.p50 > 0 && report.pauses.allBackMs.p99 >= report.pauses.allBackMs.p50);
    assert.ok(
      report.pauses.workersStoppedMs.count > 0 &&
        report.pauses.workersStoppedMs.p99 >= report.pauses.workersStoppedMs.p50,
    );
    assert.equal(report.pauses.events.length, report.pauses.count);
    assert.ok(report.memory.samplesUsed > 0);
    assert.ok(Number.isFinite(report.memory.perRolloutHeapBytes) && Number.isFinite(report.memory.perRolloutRssBytes));
    assert.ok(report.memory.baseline.rssBytes > 0 && report.memory.inFlightRollouts > 0);
    assert.ok(report.cpu.perStepUs > 0 && report.cpu.engineMs > 0);
    assert.equal(report.settings.rolloutsInFlight, 32);
    assert.equal(report.settings.envCpuUs, 20);
  });

  it('writes a self-contained report.html with SVG charts and the figures', () => {
    const html = readFileSync(join(out, 'report.html'), 'utf8');
    assert.doesNotMatch(html, /<script\b/i, 'no script at all');
    assert.doesNotMatch(html, /https?:\/\//i, 'no external URL');
    assert.doesNotMatch(html, /<link\b/i, 'no external stylesheet');
    assert.match(html, /<style>/);
    assert.ok(
      (html.match(/<svg\b/g) ?? []).length >= 3 + 6 + 2,
      'throughput charts, six latency histograms, two pause charts',
    );
    assert.match(html, /Steps, rollouts and groups per second/);
    assert.match(html, /rollout: total/);
    assert.match(html, /Workers stopped, per pause/);
    const report = JSON.parse(readFileSync(join(out, 'report.json'), 'utf8'));
    assert.ok(
      html.includes('agent steps / s') &&
        html.includes('CPU per agent step') &&
        html.includes('heap per in-flight rollout'),
    );
    assert.equal((html.match(/<svg\b/g) ?? []).length, (html.match(/<\/svg>/g) ?? []).length, 'every chart is closed');
    assert.ok(html.includes(`${report.pauses.count} pauses`));
  });

  it('renders report.html in headless chromium when it is installed', {
    skip: !existsSync(CHROMIUM) && process.env.CI !== 'true' && `${CHROMIUM} is not installed (.ci/run installs it)`,
  }, () => {
    const result = spawnSync(
      CHROMIUM,
      ['--headless', '--no-sandbox', '--disable-gpu', '--dump-dom', pathToFileURL(join(out, 'report.html')).href],
      { encoding: 'utf8', timeout: 60_000 },
    );
    assert.equal(result.status, 0, result.stderr);
    assert.match(result.stdout, /<svg/);
    assert.match(result.stdout, /rollout loadtest/);
  });

  it('rejects a bad flag with exit code 2, naming the flag and the value', async () => {
    const bad = await rollout(['loadtest', '--rollouts', 'many'], { timeoutMs: 20_000 });
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--rollouts must be an integer >= 1 \(got "many"\)/);
    const strategy = await rollout(['loadtest', '--strategy', 'eager'], { timeoutMs: 20_000 });
    assert.equal(strategy.code, 2);
    assert.match(strategy.stderr, /--strategy must be one of sync, async \(got "eager"\)/);
    const duration = await rollout(['loadtest', '--duration', '0'], { timeoutMs: 20_000 });
    assert.equal(duration.code, 2);
    assert.match(duration.stderr, /--duration must be a number > 0 \(got "0"\)/);
    const keep = await rollout(['loadtest', '--strategy', 'sync', '--stale-rollouts', 'keep'], { timeoutMs: 20_000 });
    assert.equal(keep.code, 2);
    assert.match(keep.stderr, /--stale-rollouts keep needs --strategy async \(got --strategy sync\)/);
    const interval = await rollout(['loadtest', '--stream', '--stream-interval-ms', '0.5'], { timeoutMs: 20_000 });
    assert.equal(interval.code, 2);
    assert.match(interval.stderr, /--stream-interval-ms must be a number in \[1, 60000\] \(got "0.5"\)/);
  });

  it('explains its options with --help', async () => {
    const help = await rollout(['loadtest', '--help'], { timeoutMs: 20_000 });
    assert.equal(help.code, 0);
    for (const flag of [
      '--rollouts',
      '--latency-ms',
      '--tokens-per-second',
      '--think-tokens',
      '--env-cpu-us',
      '--workers',
      '--duration',
      '--strategy',
      '--pause-every',
      '--stream',
      '--out',
    ]) {
      assert.ok(help.stdout.includes(flag), flag);
    }
  });
});

describe('rollout loadtest --stream', () => {
  it('runs on streamed replies, holding calls at each pause, and accounts for every group', async () => {
    const out = mkdtempSync(join(tmpdir(), 'rollout-loadtest-stream-'));
    // Slow generations (100 tokens/s, 5 ms events) so the pauses catch calls mid-stream.
    const run = await rollout([
      'loadtest',
      '--duration',
      '2',
      '--rollouts',
      '32',
      '--workers',
      '2',
      '--pause-every',
      '0.5',
      '--stream',
      '--stream-interval-ms',
      '5',
      '--latency-ms',
      '5',
      '--tokens-per-second',
      '100',
      '--think-tokens',
      '20',
      '--out',
      out,
    ]);
    assert.equal(run.code, 0, run.stderr);
    const report = JSON.parse(readFileSync(join(out, 'report.json'), 'utf8'));
    assert.deepEqual([report.settings.stream, report.settings.streamIntervalMs], [true, 5]);
    assert.ok(report.throughput.stepsPerSecond > 0);
    assert.ok(report.pauses.byReason.scheduled >= 2, JSON.stringify(report.pauses.byReason));
    assert.ok(
      report.outcomes.groups.landed.ABORTED > 0,
      `pauses brought groups back ABORTED: ${JSON.stringify(report.outcomes.groups.landed)}`,
    );
    assert.equal(report.outcomes.groups.landed.FAILED, 0);
    assert.match(
      readFileSync(join(out, 'report.html'), 'utf8'),
      /streamed, an event every 5 ms \(pauses hold calls with their tokens\)/,
    );
  });
});

describe('rollout loadtest --capacity', () => {
  it('trains on a GPU-like mock, syncing weights each batch, and reports the servers busy beside the engine', async () => {
    const out = mkdtempSync(join(tmpdir(), 'rollout-loadtest-gpu-'));
    const run = await rollout([
      'loadtest',
      '--duration',
      '3',
      '--rollouts',
      '32',
      '--workers',
      '1',
      '--envs',
      'arithmetic',
      '--capacity',
      '16',
      '--capacity-response-tokens',
      '30',
      '--capacity-speedup',
      '20',
      '--train-ms-per-token',
      '0.5',
      '--sync-every',
      '1',
      '--load-ms',
      '100',
      '--out',
      out,
    ]);
    assert.equal(run.code, 0, run.stderr);
    assert.match(run.stdout, /GPU-like mock: 16 slots, responses median 30 tokens, σ 1, 20× speed/);
    assert.match(run.stdout, /inference servers\s+busy [\d.]+ %, slots filled [\d.]+ %/);
    const report = JSON.parse(readFileSync(join(out, 'report.json'), 'utf8'));
    assert.ok(report.gpu.busyFraction > 0 && report.gpu.busyFraction <= 1, JSON.stringify(report.gpu));
    assert.ok(report.gpu.slotFill > 0 && report.gpu.slotFill <= 1);
    assert.ok(report.pauses.byReason.scheduled >= 1, JSON.stringify(report.pauses.byReason));
    assert.ok(report.timeSeries.some((p: { gpuBusyFraction: number | null }) => p.gpuBusyFraction !== null));
    assert.ok(report.inFlight.mean > 0 && report.inFlight.mean <= report.inFlight.capacity);
    assert.match(
      readFileSync(join(out, 'report.html'), 'utf8'),
      /Inference servers \(GPU-like mock\): busy and slots filled/,
    );
  });

  it('refuses a fixed latency beside --capacity, naming the flag', async () => {
    const run = await rollout(['loadtest', '--capacity', '16', '--latency-ms', '5']);
    assert.equal(run.code, 2);
    assert.match(
      run.stderr,
      /--latency-ms does not apply with --capacity: the GPU-like mock sets the timing \(got --latency-ms "5"\)/,
    );
  });
});

describe('rollout loadtest --stale-rollouts', () => {
  it('runs the engine with stale rollouts kept when asked, and reports how stale the rollouts taken were', async () => {
    // maxStaleness 0: every batch needs the weights of the step before it, so each one is an
    // EXPIRED_BATCH and a sync. What keeping does to the buffer is pinned in staleness-expiry and
    // producer-property tests; here, that the flag reaches the engine and the figures the report.
    const out = mkdtempSync(join(tmpdir(), 'rollout-loadtest-keep-'));
    const run = await rollout([
      'loadtest',
      ...['--duration', '2', '--rollouts', '16', '--workers', '1', '--latency-ms', '5', '--train-ms', '20'],
      ...['--max-staleness', '0', '--stale-rollouts', 'keep', '--out', out],
    ]);
    assert.equal(run.code, 0, run.stderr);
    assert.match(
      run.stdout,
      /staleness taken: mean [\d.]+, max \d+, [\d.]+ % at or past the bound \(stale rollouts keep\)/,
    );
    const report = JSON.parse(readFileSync(join(out, 'report.json'), 'utf8'));
    assert.equal(report.settings.staleRollouts, 'keep'); // as the engine resolved it, not the flag echoed
    assert.ok(report.window.batches >= 1, JSON.stringify(report.window));
    const { mean, max, pastThresholdFraction } = report.outcomes.staleness;
    assert.ok(mean >= 0 && mean <= max && pastThresholdFraction >= 0 && pastThresholdFraction <= 1);
    assert.match(readFileSync(join(out, 'report.html'), 'utf8'), /staleness of taken rollouts/);
  });
});

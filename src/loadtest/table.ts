/** The report as a plain-text table for the terminal (stdout). */
import { bytes, ms, num, us } from './format.ts';
import type { LoadtestReport, Spread } from './report.ts';
import { percentile } from './stats.ts';

export function formatTable(r: LoadtestReport, files: { json: string; html: string }): string {
  const s = r.settings;
  const lines: string[] = [];
  const row = (cells: string[], widths: number[]) =>
    cells
      .map((c, i) => (i === 0 ? c.padEnd(widths[0]) : c.padStart(widths[i])))
      .join('')
      .trimEnd();

  lines.push(
    `rollout loadtest: ${num(r.window.seconds)} s measured, ${s.strategy} strategy, ${s.rolloutsInFlight} rollouts in flight (${s.batchSize} groups × ${s.groupSize}), ${s.workers} worker${s.workers === 1 ? '' : 's'}, envs ${s.envs.join('+')}`,
    s.capacity === null
      ? `  mock server: latency ${s.latencyMs} ms, ${s.tokensPerSecond === 0 ? 'instant generation' : `${s.tokensPerSecond} tokens/s`}, ${s.thinkTokens} think tokens; env CPU ${s.envCpuUs} µs/step${s.trainMs > 0 ? `; trainer ${s.trainMs} ms/batch` : ''}`
      : `  GPU-like mock: ${s.capacity.slots} slots, responses ${s.capacity.responseTokens === null ? `of ${s.thinkTokens} think tokens` : `median ${s.capacity.responseTokens} tokens, σ ${s.capacity.lengthSigma}`}, ${s.capacity.speedup}× speed; env CPU ${s.envCpuUs} µs/step` +
          `${s.trainMs > 0 || s.trainMsPerToken > 0 ? `; trainer ${s.trainMs} ms/batch + ${s.trainMsPerToken} ms/token` : ''}${s.syncEvery === null ? '' : `; sync every ${s.syncEvery} batches, load ${s.loadMs} ms`}`,
    `  rollouts in flight: ${num(r.inFlight.mean)} on average, peak ${r.inFlight.peak}, at most ${r.inFlight.capacity}`,
    '',
  );

  const tw = [22, 12, 12, 12, 12];
  const perSecond = (key: 'stepsPerSecond' | 'rolloutsPerSecond' | 'groupsPerSecond' | 'tokensPerSecond') =>
    r.timeSeries.map((p) => p[key]);
  lines.push(`throughput over ${r.slidingWindowS}-s sliding windows:`);
  lines.push(row(['throughput', 'overall', 'p50', 'min', 'max'], tw));
  const tput: [string, number, ReturnType<typeof perSecond>][] = [
    ['  agent steps/s', r.throughput.stepsPerSecond, perSecond('stepsPerSecond')],
    ['  rollouts/s', r.throughput.rolloutsPerSecond, perSecond('rolloutsPerSecond')],
    ['  groups/s', r.throughput.groupsPerSecond, perSecond('groupsPerSecond')],
    ['  tokens/s', r.throughput.tokensPerSecond, perSecond('tokensPerSecond')],
  ];
  for (const [label, overall, series] of tput) {
    lines.push(
      row([label, num(overall), num(percentile(series, 50)), num(Math.min(...series)), num(Math.max(...series))], tw),
    );
  }
  lines.push(
    `  taken: ${r.window.batches} batches, ${r.window.groups} groups, ${r.window.rollouts} rollouts, ${r.window.turns} turns, ${r.window.tokens} tokens; mean reward ${num(r.outcomes.meanReward)}`,
    `  staleness taken: mean ${num(r.outcomes.staleness.mean)}, max ${r.outcomes.staleness.max}, ${(100 * r.outcomes.staleness.pastThresholdFraction).toFixed(1)} % at or past the bound (stale rollouts ${r.settings.staleRollouts})`,
    '',
  );

  const lw = [22, 9, 12, 12, 12, 12];
  lines.push(row(['latency', 'count', 'p50', 'p90', 'p99', 'max'], lw));
  const phases: [string, LoadtestReport['latency']['rollout']['totalMs']][] = [
    ['  rollout queue', r.latency.rollout.queueMs],
    ['  rollout inference', r.latency.rollout.inferenceMs],
    ['  rollout environment', r.latency.rollout.envMs],
    ['  rollout total', r.latency.rollout.totalMs],
    ['  turn inference', r.latency.turn.inferenceMs],
    ['  turn environment', r.latency.turn.envMs],
  ];
  for (const [label, d] of phases)
    lines.push(row([label, String(d.count), ms(d.p50), ms(d.p90), ms(d.p99), ms(d.max)], lw));
  lines.push('');

  const pw = [22, 9, 16, 16, 16];
  const reasons = Object.entries(r.pauses.byReason)
    .map(([k, n]) => `${n} ${k}`)
    .join(', ');
  lines.push(
    row(
      [`pauses${reasons ? ` (${reasons})` : ''}`, 'count', 'p50', 'p99', 'max'],
      [Math.max(22, 8 + reasons.length + 3), ...pw.slice(1)],
    ),
  );
  if (r.pauses.count === 0) lines.push('  none (set --pause-every to measure pauses)');
  else {
    const spans: [string, Spread][] = [
      ['  workers stopped', r.pauses.workersStoppedMs],
      ['  workers acked', r.pauses.workersAckedMs],
      ['  all groups back', r.pauses.allBackMs],
      ['  resume', r.pauses.resumeMs],
    ];
    for (const [label, d] of spans) lines.push(row([label, String(d.count), ms(d.p50), ms(d.p99), ms(d.max)], pw));
  }
  lines.push('');

  const m = r.memory;
  lines.push(
    `memory per in-flight rollout   heap ${bytes(m.perRolloutHeapBytes)}, RSS ${bytes(m.perRolloutRssBytes)}  (median of ${m.samplesUsed} samples at ~${Math.round(m.inFlightRollouts)} in flight${m.full ? '' : ', never full'})`,
    `engine CPU                     ${us(r.cpu.perStepUs)} per agent step, ${us(r.cpu.perTakenTurnUs)} per taken turn, ${num(r.cpu.coresBusy)} cores busy` +
      (r.cpu.mockCoresBusy === null ? '' : ` (mock server: ${num(r.cpu.mockCoresBusy)} cores)`),
  );
  if (r.gpu !== null) {
    lines.push(
      `inference servers              busy ${num(100 * r.gpu.busyFraction)} %, slots filled ${num(100 * r.gpu.slotFill)} % (${num(r.gpu.meanRunning)} running), queue ${num(r.gpu.meanQueue)}, ${num(r.gpu.tokensPerSecond)} tokens/s GPU time, prefix cache ${num(100 * r.gpu.cacheHitFraction)} % of prompt tokens`,
    );
  }
  for (const note of r.notes) lines.push(`note: ${note}`);
  lines.push('', `report: ${files.json}`, `        ${files.html}`);
  return lines.join('\n');
}

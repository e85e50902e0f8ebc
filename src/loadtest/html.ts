/**
 * report.html: one self-contained page (inline CSS, inline SVG, no script, no external URL) that a
 * person can open from disk or attach to a ticket. Drawn from the report object alone.
 */
import { bytes, ms, num, us } from './format.ts';
import type { LoadtestReport } from './report.ts';
import type { Distribution } from './stats.ts';
import { barChart, escapeXml as esc, histogramChart, lineChart } from './svg.ts';

const COLORS = {
  steps: '#2563eb',
  rollouts: '#16a34a',
  groups: '#d97706',
  tokens: '#7c3aed',
  inFlight: '#0891b2',
  p50: '#15803d',
  p90: '#b45309',
  p99: '#b91c1c',
};

const CSS = `
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1320px;padding:0 16px;color:#1f2937;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #e5e7eb;padding-bottom:4px}
.sub{color:#6b7280;margin:0 0 16px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(190px,1fr));gap:10px}
.card{border:1px solid #e5e7eb;border-radius:8px;padding:10px 12px}.card .v{font-size:20px;font-weight:600}.card .k{color:#6b7280;font-size:12px}
table{border-collapse:collapse;margin:6px 0}th,td{padding:3px 10px;border-bottom:1px solid #f3f4f6;text-align:right}th:first-child,td:first-child{text-align:left}th{color:#374151;font-weight:600;background:#f9fafb}
.charts{display:flex;flex-wrap:wrap;gap:12px}
svg.chart{border:1px solid #e5e7eb;border-radius:8px;background:#fff;max-width:100%;height:auto}
.chart-title{font-size:13px;font-weight:600;fill:#111827}.tick,.legend{font-size:10px;fill:#4b5563}.axis-label{font-size:11px;fill:#6b7280}
.grid{stroke:#eef0f3}.line{fill:none;stroke-width:2}.bar{fill:#60a5fa}.marker{stroke:#ef4444;stroke-opacity:.45;stroke-dasharray:3 3;stroke-width:1}
.pct{stroke-width:1.5;stroke-dasharray:4 2}.pct-label{font-size:10px;font-weight:600}.empty{font-size:12px;fill:#9ca3af}
.note{background:#fffbeb;border:1px solid #fde68a;border-radius:6px;padding:6px 10px;margin:4px 0}
code{background:#f3f4f6;padding:0 4px;border-radius:4px}
`;

export function renderHtml(r: LoadtestReport): string {
  const s = r.settings;
  const title = `rollout loadtest — ${num(r.throughput.stepsPerSecond)} steps/s, ${num(r.inFlight.mean)} rollouts in flight`;
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${esc(title)}</title>
<style>${CSS}</style>
</head>
<body>
<h1>rollout loadtest</h1>
<p class="sub">${esc(r.startedAt)} · ${num(r.window.seconds)} s measured · ${esc(s.strategy)} strategy · ${s.rolloutsInFlight} rollouts in flight (${s.batchSize} groups × ${s.groupSize}) · ${s.workers} worker${s.workers === 1 ? '' : 's'} · envs ${esc(s.envs.join(', '))} · Node ${esc(r.machine.node)} on ${r.machine.cpus} × ${esc(r.machine.cpuModel)}</p>
${r.notes.map((n) => `<p class="note">${esc(n)}</p>`).join('\n')}
${cards(r)}
<h2>Throughput over time</h2>
${throughputCharts(r)}
<h2>Latency per phase</h2>
${latencyTable(r)}
${r.gpu === null ? '' : `<p>Beside them, the inference servers over the window: busy ${num(100 * r.gpu.busyFraction)} % of the time, ${num(100 * r.gpu.slotFill)} % of their slots filled (${num(r.gpu.meanRunning)} sequences running), ${num(r.gpu.meanQueue)} requests queued on average (time queued at the server counts as inference above), ${num(100 * r.gpu.cacheHitFraction)} % of prompt tokens from the prefix cache.</p>`}
${latencyCharts(r)}
<h2>Pauses for weight updates</h2>
${pauseSection(r)}
<h2>Memory and CPU</h2>
${resourceTable(r)}
<h2>Settings</h2>
${settingsTable(r)}
</body>
</html>
`;
}

function cards(r: LoadtestReport): string {
  const card = (value: string, key: string) =>
    `<div class="card"><div class="v">${esc(value)}</div><div class="k">${esc(key)}</div></div>`;
  return `<div class="cards">
${card(num(r.throughput.stepsPerSecond), 'agent steps / s')}
${card(num(r.throughput.rolloutsPerSecond), 'rollouts / s (taken)')}
${card(num(r.throughput.groupsPerSecond), 'groups / s (taken)')}
${card(num(r.throughput.tokensPerSecond), 'tokens / s (taken)')}
${card(us(r.cpu.perStepUs), 'engine CPU per agent step')}
${card(bytes(r.memory.perRolloutHeapBytes), 'heap per in-flight rollout')}
${card(bytes(r.memory.perRolloutRssBytes), 'RSS per in-flight rollout')}
${card(r.pauses.count === 0 ? '—' : `${num(r.pauses.allBackMs.p50)} / ${num(r.pauses.allBackMs.p99)} ms`, 'pause: all back p50 / p99')}
${card(`${num(r.inFlight.mean)} of ${r.inFlight.capacity}`, 'rollouts in flight (mean of max)')}
${
  r.gpu === null
    ? ''
    : `${card(`${num(100 * r.gpu.busyFraction)} %`, 'inference servers busy')}
${card(`${num(100 * r.gpu.slotFill)} %`, 'server slots filled')}
${card(num(r.gpu.tokensPerSecond), 'server tokens / s (GPU time)')}`
}
</div>`;
}

function throughputCharts(r: LoadtestReport): string {
  // Each point ends its sliding window.
  const pts = (
    key: 'stepsPerSecond' | 'rolloutsPerSecond' | 'groupsPerSecond' | 'tokensPerSecond' | 'inFlightRollouts',
  ) => r.timeSeries.map((p): [number, number] => [p.t, p[key]]);
  const pct = (key: 'gpuBusyFraction' | 'gpuSlotFill') =>
    r.timeSeries.flatMap((p): [number, number][] => (p[key] === null ? [] : [[p.t, 100 * p[key]!]]));
  const markers = r.pauses.events.map((e) => ({
    x: e.t,
    label: `pause (${e.reason}) at ${num(e.t)} s: all back in ${num(e.allBackMs)} ms`,
  }));
  const xMax = r.window.seconds;
  return `<div class="charts">
<p>Rates over a sliding window of ${r.slidingWindowS} s, a point a second.</p>
${lineChart({
  title: 'Steps, rollouts and groups per second (dashed: pauses)',
  xLabel: 'seconds',
  yLabel: 'per second',
  xMax,
  markers,
  series: [
    { name: 'agent steps/s', color: COLORS.steps, points: pts('stepsPerSecond') },
    { name: 'rollouts/s', color: COLORS.rollouts, points: pts('rolloutsPerSecond') },
    { name: 'groups/s', color: COLORS.groups, points: pts('groupsPerSecond') },
  ],
})}
${lineChart({ title: 'Response tokens per second (taken)', xLabel: 'seconds', yLabel: 'tokens/s', xMax, markers, series: [{ name: 'tokens/s', color: COLORS.tokens, points: pts('tokensPerSecond') }] })}
${lineChart({ title: `Rollouts in flight on the workers (at most ${r.inFlight.capacity})`, xLabel: 'seconds', yLabel: 'rollouts', xMax, markers, series: [{ name: 'in flight', color: COLORS.inFlight, points: pts('inFlightRollouts') }] })}
${
  r.gpu === null
    ? ''
    : lineChart({
        title: 'Inference servers (GPU-like mock): busy and slots filled',
        xLabel: 'seconds',
        yLabel: '%',
        xMax,
        markers,
        series: [
          { name: 'busy %', color: COLORS.steps, points: pct('gpuBusyFraction') },
          { name: 'slots filled %', color: COLORS.rollouts, points: pct('gpuSlotFill') },
        ],
      })
}
</div>`;
}

const PHASES: [string, (r: LoadtestReport) => Distribution][] = [
  ['rollout: queue', (r) => r.latency.rollout.queueMs],
  ['rollout: inference', (r) => r.latency.rollout.inferenceMs],
  ['rollout: environment', (r) => r.latency.rollout.envMs],
  ['rollout: total', (r) => r.latency.rollout.totalMs],
  ['turn: inference', (r) => r.latency.turn.inferenceMs],
  ['turn: environment', (r) => r.latency.turn.envMs],
];

function latencyTable(r: LoadtestReport): string {
  const rows = PHASES.map(([name, pick]) => {
    const d = pick(r);
    return `<tr><td>${esc(name)}</td><td>${d.count}</td><td>${ms(d.mean)}</td><td>${ms(d.p50)}</td><td>${ms(d.p90)}</td><td>${ms(d.p99)}</td><td>${ms(d.max)}</td></tr>`;
  }).join('\n');
  const excluded = r.latency.startedBeforeWindow;
  return `<p>Rollouts the trainer took that started inside the measured window, and their turns${excluded > 0 ? ` (${excluded} taken rollouts that started during start-up are left out)` : ''}. Queue: from the coordinator handing the group to the pool until a worker started it; a rollout interrupted by a pause adds up every attempt.</p>
<table><thead><tr><th>phase</th><th>count</th><th>mean</th><th>p50</th><th>p90</th><th>p99</th><th>max</th></tr></thead><tbody>
${rows}
</tbody></table>`;
}

function latencyCharts(r: LoadtestReport): string {
  const charts = PHASES.map(([name, pick]) => {
    const d = pick(r);
    return histogramChart({
      title: `${name} (${d.count})`,
      unit: 'ms',
      histogram: d.histogram,
      markers: [
        { label: 'p50', value: d.p50, color: COLORS.p50 },
        { label: 'p90', value: d.p90, color: COLORS.p90 },
        { label: 'p99', value: d.p99, color: COLORS.p99 },
      ],
    });
  });
  return `<div class="charts">\n${charts.join('\n')}\n</div>`;
}

function pauseSection(r: LoadtestReport): string {
  const p = r.pauses;
  if (p.count === 0)
    return '<p>No pause in this run. Run with <code>--pause-every &lt;seconds&gt;</code> (or the async strategy, which pauses when the weights are too stale) to measure pauses.</p>';
  const reasons = Object.entries(p.byReason)
    .map(([k, n]) => `${n} ${esc(k)}`)
    .join(', ');
  const spreadRow = (name: string, x: LoadtestReport['pauses']['allBackMs']) =>
    `<tr><td>${esc(name)}</td><td>${x.count}</td><td>${ms(x.p50)}</td><td>${ms(x.p99)}</td><td>${ms(x.max)}</td></tr>`;
  const bars = (key: 'workersStoppedMs' | 'allBackMs') =>
    p.events.map((e, i) => ({
      label: String(i + 1),
      value: e[key] ?? 0,
      tip: `pause ${i + 1} (${e.reason}) at ${num(e.t)} s, ${e.inFlightBefore} rollouts in flight: ${num(e[key] ?? NaN)} ms`,
    }));
  const events = p.events
    .map(
      (e, i) =>
        `<tr><td>${i + 1}</td><td>${num(e.t)} s</td><td>${esc(e.reason)}</td><td>${e.inFlightBefore}</td><td>${e.groupsBack}</td><td>${e.workersStoppedMs === null ? '—' : ms(e.workersStoppedMs)}</td><td>${ms(e.allBackMs)}</td><td>${ms(e.resumeMs)}</td><td>${e.modelStep}</td><td>${e.serverAbort ? 'server' : e.cancelled ? 'client' : '—'}</td></tr>`,
    )
    .join('\n');
  return `<p>${p.count} pauses (${reasons}). “Workers stopped”: from the request until the last inference call any worker sent (0 when none was sent after it — workers read the pause flag in the same tick as they send); “workers acked”: until every worker’s event loop ran its pause watcher; “all back”: until every group in flight was back on the main thread; “resume”: loading the weight version into the mock and resuming.</p>
<table><thead><tr><th></th><th>count</th><th>p50</th><th>p99</th><th>max</th></tr></thead><tbody>
${spreadRow('workers stopped', p.workersStoppedMs)}
${spreadRow('workers acked', p.workersAckedMs)}
${spreadRow('all groups back', p.allBackMs)}
${spreadRow('resume', p.resumeMs)}
</tbody></table>
<div class="charts">
${barChart({ title: 'Workers stopped, per pause', unit: 'ms', color: '#60a5fa', bars: bars('workersStoppedMs') })}
${barChart({ title: 'All groups back, per pause', unit: 'ms', color: '#f59e0b', bars: bars('allBackMs') })}
</div>
<table><thead><tr><th>#</th><th>at</th><th>reason</th><th>in flight</th><th>groups back</th><th>workers stopped</th><th>all back</th><th>resume</th><th>model step</th><th>abort</th></tr></thead><tbody>
${events}
</tbody></table>`;
}

function resourceTable(r: LoadtestReport): string {
  const m = r.memory;
  const c = r.cpu;
  const rows: [string, string][] = [
    ['heap per in-flight rollout', bytes(m.perRolloutHeapBytes)],
    ['RSS per in-flight rollout', bytes(m.perRolloutRssBytes)],
    [
      'samples used (rollouts in flight)',
      `${m.samplesUsed} (~${Math.round(m.inFlightRollouts)}${m.full ? '' : ', never full'})`,
    ],
    ['baseline heap / RSS (idle, workers loaded)', `${bytes(m.baseline.heapBytes)} / ${bytes(m.baseline.rssBytes)}`],
    ['peak heap / RSS', `${bytes(m.peak.heapBytes)} / ${bytes(m.peak.rssBytes)}`],
    ['engine CPU per agent step', us(c.perStepUs)],
    ['engine CPU per taken turn', us(c.perTakenTurnUs)],
    ['engine CPU (user + system)', `${ms(c.engineMs)} (${num(c.coresBusy)} cores busy)`],
    [
      'mock server CPU (own process)',
      c.mockMs === null ? 'not measured' : `${ms(c.mockMs)} (${num(c.mockCoresBusy ?? 0)} cores busy)`,
    ],
  ];
  return `<p>Memory: the engine's heap (main thread + workers) and this process's RSS, minus an idle baseline, divided by rollouts in flight, median over samples taken while production was full. CPU: <code>process.cpuUsage()</code> of the engine process over the window (the mock server runs in its own process and is not counted).</p>
<table><tbody>
${rows.map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(v)}</td></tr>`).join('\n')}
</tbody></table>`;
}

function settingsTable(r: LoadtestReport): string {
  const s = r.settings;
  const rows: [string, string][] = [
    ['strategy', s.strategy],
    [
      'rollouts in flight: at most (requested → effective), mean',
      `${s.rollouts} → ${s.rolloutsInFlight}, ${num(r.inFlight.mean)}`,
    ],
    ['group size / batch size (groups)', `${s.groupSize} / ${s.batchSize}`],
    [
      'workers × groups per worker, connections per worker',
      `${s.workers} × ${s.groupsPerWorker}, ${s.connectionsPerWorker}${s.episodeSlots ? ' (episode slots: rollouts in flight = episodes playing)' : ''}`,
    ],
    ['environments', s.envs.join(', ')],
    ['environment CPU per step', `${s.envCpuUs} µs`],
    s.capacity === null
      ? [
          'mock latency / token rate / think tokens',
          `${s.latencyMs} ms / ${s.tokensPerSecond === 0 ? 'instant' : `${s.tokensPerSecond} tokens/s`} / ${s.thinkTokens}`,
        ]
      : [
          'GPU-like mock: slots / median response / σ / speed-up',
          `${s.capacity.slots} / ${s.capacity.responseTokens ?? `${s.thinkTokens} think tokens`} / ${s.capacity.lengthSigma} / ${s.capacity.speedup}×`,
        ],
    ['max tokens per turn', String(s.maxTokens)],
    ['pause every / mode', `${s.pauseEveryS === null ? 'off' : `${s.pauseEveryS} s`} / ${s.pauseMode}`],
    [
      'replies',
      s.stream
        ? `streamed, an event every ${s.streamIntervalMs} ms${s.pauseMode === 'abort' ? ' (pauses hold calls with their tokens)' : ''}`
        : 'whole',
    ],
    [
      'trainer time per batch, per token; sync every / load',
      `${s.trainMs} ms, ${s.trainMsPerToken} ms; ${s.syncEvery === null ? 'off' : `${s.syncEvery} batches`} / ${s.loadMs} ms`,
    ],
    [
      'max staleness (async), stale rollouts, partial rollouts',
      `${s.maxStaleness}, ${s.staleRollouts}, ${s.partialRollout ? 'on' : 'off'}`,
    ],
    ['seed', String(s.seed)],
    [
      'groups: scheduled / retried / taken',
      `${r.outcomes.groups.scheduled} / ${r.outcomes.groups.retried} / ${r.outcomes.groups.taken}`,
    ],
    [
      'groups landed by status',
      Object.entries(r.outcomes.groups.landed)
        .filter(([, n]) => n > 0)
        .map(([k, n]) => `${k} ${n}`)
        .join(', ') || 'none',
    ],
    [
      'episodes failed by kind (infrastructure: run again, never trained)',
      Object.entries(r.outcomes.failures)
        .filter(([, n]) => n > 0)
        .map(([k, n]) => `${k} ${n}`)
        .join(', ') || 'none',
    ],
    [
      'rollouts taken by environment',
      Object.entries(r.outcomes.rolloutsByTask)
        .map(([k, n]) => `${k} ${n}`)
        .join(', ') || 'none',
    ],
    ['mean reward of taken rollouts', num(r.outcomes.meanReward)],
    [
      'staleness of taken rollouts: mean / max / at or past the bound',
      `${num(r.outcomes.staleness.mean)} / ${r.outcomes.staleness.max} / ${(100 * r.outcomes.staleness.pastThresholdFraction).toFixed(1)} %`,
    ],
  ];
  return `<table><tbody>
${rows.map(([k, v]) => `<tr><td>${esc(k)}</td><td>${esc(v)}</td></tr>`).join('\n')}
</tbody></table>`;
}

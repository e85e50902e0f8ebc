/**
 * Inline SVG charts for the HTML report, drawn here so the page needs no script, library or network:
 * it opens from disk anywhere, and still shows its charts years later.
 */
import { num } from './format.ts';
import type { Histogram } from './stats.ts';

export function escapeXml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

interface Frame {
  width: number;
  height: number;
  left: number;
  right: number;
  top: number;
  bottom: number;
}

const FRAME: Frame = { width: 640, height: 250, left: 56, right: 16, top: 40, bottom: 36 };

/** About `count` round tick values covering [0, max]. */
function ticks(max: number, count = 5): number[] {
  if (!(max > 0)) return [0];
  const raw = max / count;
  const base = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * base).find((s) => s >= raw) ?? 10 * base;
  const out: number[] = [];
  for (let v = 0; v <= max + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

/** Axis tick text: short (15M, 2.5k) so it never runs into the axis label. */
function tick(n: number): string {
  const abs = Math.abs(n);
  if (abs >= 1e6) return `${Number((n / 1e6).toPrecision(3))}M`;
  if (abs >= 1e4) return `${Number((n / 1e3).toPrecision(3))}k`;
  return String(Number(n.toPrecision(4)));
}

function svgOpen(title: string, f: Frame): string {
  return `<svg class="chart" role="img" viewBox="0 0 ${f.width} ${f.height}" width="${f.width}" height="${f.height}"><title>${escapeXml(title)}</title><text class="chart-title" x="${f.left}" y="16">${escapeXml(title)}</text>`;
}

/** Horizontal grid lines and y labels for [0, yMax]; returns the markup and the y scale. */
function yAxis(f: Frame, yMax: number, unit: string): { markup: string; y: (v: number) => number; top: number } {
  const ts = ticks(yMax);
  const top = Math.max(ts[ts.length - 1], yMax) || 1;
  const plotH = f.height - f.top - f.bottom;
  const y = (v: number) => f.top + plotH - (v / top) * plotH;
  let markup = '';
  for (const t of ts) {
    markup += `<line class="grid" x1="${f.left}" x2="${f.width - f.right}" y1="${y(t).toFixed(1)}" y2="${y(t).toFixed(1)}"/>`;
    markup += `<text class="tick" x="${f.left - 6}" y="${(y(t) + 4).toFixed(1)}" text-anchor="end">${escapeXml(tick(t))}</text>`;
  }
  markup += `<text class="axis-label" x="12" y="${(f.top + plotH / 2).toFixed(1)}" transform="rotate(-90 12 ${(f.top + plotH / 2).toFixed(1)})" text-anchor="middle">${escapeXml(unit)}</text>`;
  return { markup, y, top };
}

export interface LineSeries {
  name: string;
  color: string;
  points: [number, number][];
}

/** Lines over a shared x axis (seconds), with optional vertical markers (pauses). */
export function lineChart(options: {
  title: string;
  xLabel: string;
  yLabel: string;
  series: LineSeries[];
  xMax: number;
  markers?: { x: number; label: string }[];
}): string {
  const f = FRAME;
  const yMax = Math.max(0, ...options.series.flatMap((s) => s.points.map((p) => p[1])));
  const axis = yAxis(f, yMax, options.yLabel);
  const xMax = options.xMax > 0 ? options.xMax : 1;
  const plotW = f.width - f.left - f.right;
  const x = (v: number) => f.left + (v / xMax) * plotW;
  let body = axis.markup;
  for (const t of ticks(xMax, 8)) {
    body += `<text class="tick" x="${x(t).toFixed(1)}" y="${f.height - f.bottom + 14}" text-anchor="middle">${escapeXml(tick(t))}</text>`;
  }
  body += `<text class="axis-label" x="${(f.left + plotW / 2).toFixed(1)}" y="${f.height - 4}" text-anchor="middle">${escapeXml(options.xLabel)}</text>`;
  for (const m of options.markers ?? []) {
    body += `<line class="marker" x1="${x(m.x).toFixed(1)}" x2="${x(m.x).toFixed(1)}" y1="${f.top}" y2="${f.height - f.bottom}"><title>${escapeXml(m.label)}</title></line>`;
  }
  for (const s of options.series) {
    if (s.points.length === 0) continue;
    const d = s.points
      .map(([px, py], i) => `${i === 0 ? 'M' : 'L'}${x(px).toFixed(1)},${axis.y(py).toFixed(1)}`)
      .join('');
    body += `<path class="line" d="${d}" stroke="${s.color}"/>`;
    for (const [px, py] of s.points)
      body += `<circle cx="${x(px).toFixed(1)}" cy="${axis.y(py).toFixed(1)}" r="2.5" fill="${s.color}"><title>${escapeXml(`${s.name}: ${num(py)} at ${num(px)} s`)}</title></circle>`;
  }
  let lx = f.left + 4;
  let legend = '';
  for (const s of options.series) {
    legend += `<rect x="${lx}" y="${f.top - 14}" width="10" height="3" fill="${s.color}"/><text class="legend" x="${lx + 14}" y="${f.top - 10}">${escapeXml(s.name)}</text>`;
    lx += 24 + s.name.length * 6.5;
  }
  return `${svgOpen(options.title, f)}${body}${legend}</svg>`;
}

/** Bars for a histogram's bins, with labelled vertical lines at the given values (percentiles). */
export function histogramChart(options: {
  title: string;
  unit: string;
  histogram: Histogram;
  markers: { label: string; value: number; color: string }[];
}): string {
  const f: Frame = { ...FRAME, width: 420, height: 220 };
  const h = options.histogram;
  if (h.counts.length === 0)
    return `${svgOpen(options.title, f)}<text class="empty" x="${f.width / 2}" y="${f.height / 2}" text-anchor="middle">no samples</text></svg>`;
  const axis = yAxis(f, Math.max(...h.counts), 'count');
  const plotW = f.width - f.left - f.right;
  const lo = h.start;
  const hi = h.start + h.binWidth * h.counts.length;
  const x = (v: number) => f.left + ((Math.min(Math.max(v, lo), hi) - lo) / (hi - lo)) * plotW;
  const barW = plotW / h.counts.length;
  let body = axis.markup;
  h.counts.forEach((c, i) => {
    if (c === 0) return;
    const from = lo + i * h.binWidth;
    const last = i === h.counts.length - 1 && h.overflow > 0;
    const label = `${num(from)}–${num(from + h.binWidth)}${last ? '+' : ''} ${options.unit}: ${c}`;
    body += `<rect class="bar" x="${(f.left + i * barW + 0.5).toFixed(1)}" y="${axis.y(c).toFixed(1)}" width="${Math.max(1, barW - 1).toFixed(1)}" height="${(f.height - f.bottom - axis.y(c)).toFixed(1)}"><title>${escapeXml(label)}</title></rect>`;
  });
  for (const t of [lo, (lo + hi) / 2, hi])
    body += `<text class="tick" x="${x(t).toFixed(1)}" y="${f.height - f.bottom + 14}" text-anchor="middle">${escapeXml(tick(t))}</text>`;
  body += `<text class="axis-label" x="${(f.left + plotW / 2).toFixed(1)}" y="${f.height - 4}" text-anchor="middle">${escapeXml(options.unit)}</text>`;
  options.markers.forEach((m, i) => {
    const mx = x(m.value).toFixed(1);
    body += `<line class="pct" x1="${mx}" x2="${mx}" y1="${f.top}" y2="${f.height - f.bottom}" stroke="${m.color}"/>`;
    // Labels near the right edge go on the line's left, so they are not cut off.
    const anchor = x(m.value) > f.left + plotW * 0.7 ? 'end" dx="-3' : 'start" dx="3';
    body += `<text class="pct-label" x="${mx}" y="${f.top + 10 + i * 11}" fill="${m.color}" text-anchor="${anchor}">${escapeXml(`${m.label} ${num(m.value)}`)}</text>`;
  });
  return `${svgOpen(options.title, f)}${body}</svg>`;
}

/** One bar per item (e.g. per pause), labelled underneath. */
export function barChart(options: {
  title: string;
  unit: string;
  color: string;
  bars: { label: string; value: number; tip: string }[];
}): string {
  const f: Frame = { ...FRAME, width: 420, height: 220 };
  if (options.bars.length === 0)
    return `${svgOpen(options.title, f)}<text class="empty" x="${f.width / 2}" y="${f.height / 2}" text-anchor="middle">no pauses</text></svg>`;
  const axis = yAxis(f, Math.max(...options.bars.map((b) => b.value)), options.unit);
  const plotW = f.width - f.left - f.right;
  const slot = plotW / options.bars.length;
  const labelEvery = Math.ceil(options.bars.length / 12);
  let body = axis.markup;
  options.bars.forEach((b, i) => {
    const x = f.left + i * slot;
    body += `<rect class="bar" fill="${options.color}" x="${(x + slot * 0.15).toFixed(1)}" y="${axis.y(b.value).toFixed(1)}" width="${(slot * 0.7).toFixed(1)}" height="${(f.height - f.bottom - axis.y(b.value)).toFixed(1)}"><title>${escapeXml(b.tip)}</title></rect>`;
    if (i % labelEvery === 0)
      body += `<text class="tick" x="${(x + slot / 2).toFixed(1)}" y="${f.height - f.bottom + 14}" text-anchor="middle">${escapeXml(b.label)}</text>`;
  });
  body += `<text class="axis-label" x="${(f.left + plotW / 2).toFixed(1)}" y="${f.height - 4}" text-anchor="middle">pause</text>`;
  return `${svgOpen(options.title, f)}${body}</svg>`;
}

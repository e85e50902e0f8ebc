/** Number formatting shared by the text table and the HTML report, so both show the same figures. */

/** Fixed decimals chosen by magnitude: 12345 → "12345", 123.4 → "123.4", 1.234 → "1.23", 0.01234 → "0.0123". */
export function num(n: number): string {
  if (!Number.isFinite(n)) return '—';
  const abs = Math.abs(n);
  if (abs >= 1000) return Math.round(n).toString();
  if (abs >= 100) return n.toFixed(1);
  if (abs >= 1) return n.toFixed(2);
  if (abs === 0) return '0';
  return n.toPrecision(3);
}

export function ms(n: number): string {
  return `${num(n)} ms`;
}

/** Binary units, signed (a per-rollout memory delta can be negative when GC ran between samples). */
export function bytes(n: number): string {
  if (!Number.isFinite(n)) return '—';
  const sign = n < 0 ? '-' : '';
  let v = Math.abs(n);
  for (const unit of ['B', 'KiB', 'MiB', 'GiB']) {
    if (v < 1024 || unit === 'GiB') return `${sign}${unit === 'B' ? Math.round(v) : num(v)} ${unit}`;
    v /= 1024;
  }
  return `${sign}${num(v)} GiB`;
}

export function us(n: number): string {
  return `${num(n)} µs`;
}

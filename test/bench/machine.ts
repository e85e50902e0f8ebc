/**
 * How busy the machine was during a part of the bench, and how much of that was *other* processes
 * (tests, servers sharing the cores): every figure here is lowered by them, so the bench says so.
 *
 * Linux only (/proc); elsewhere the meter reports nulls. Busy time is /proc/stat's user + nice +
 * system + irq + softirq + steal over all CPUs; the bench's own share is this process plus its
 * children that have exited (/proc/self/stat utime, stime, cutime, cstime): the mock servers, the
 * stall proxy and the Python runs are started and stopped inside each part, so measure a part only
 * after its children are gone.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { statCpuMs } from '../../src/loadtest/mock-process.ts';

/** USER_HZ: 100 on every mainstream Linux configuration. */
const TICKS_PER_SECOND = 100;

export interface CpuShare {
  seconds: number;
  /** Cores busy on average, whole machine. */
  machineCores: number;
  /** Of which this bench (process + exited children). */
  benchCores: number;
  /** Of which other processes. */
  othersCores: number;
}

function machineBusyTicks(): number | null {
  try {
    const line = readFileSync('/proc/stat', 'utf8').split('\n')[0];
    const f = line.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal …
    return f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] ?? 0);
  } catch {
    return null;
  }
}

function benchTicks(): number | null {
  try {
    const stat = readFileSync('/proc/self/stat', 'utf8');
    const f = stat
      .slice(stat.lastIndexOf(')') + 2)
      .split(' ')
      .map(Number);
    // Fields after the name: state is f[0]; utime, stime, cutime, cstime are the 14th–17th fields overall.
    return f[11] + f[12] + f[13] + f[14];
  } catch {
    return null;
  }
}

/** Start measuring; the returned function ends the measure (null where /proc is unreadable). */
export function startCpuMeter(): () => CpuShare | null {
  const m0 = machineBusyTicks();
  const b0 = benchTicks();
  const t0 = performance.now();
  return () => {
    const m1 = machineBusyTicks();
    const b1 = benchTicks();
    if (m0 === null || b0 === null || m1 === null || b1 === null) return null;
    const seconds = (performance.now() - t0) / 1000;
    const machineCores = (m1 - m0) / TICKS_PER_SECOND / seconds;
    const benchCores = (b1 - b0) / TICKS_PER_SECOND / seconds;
    return { seconds, machineCores, benchCores, othersCores: Math.max(0, machineCores - benchCores) };
  };
}

export function describeShare(share: CpuShare | null, cores: number): string {
  if (share === null) return 'machine load: n/a';
  const warn =
    share.othersCores > 0.15 * cores
      ? '  ← other processes shared the CPUs: timings and rates here are unreliable'
      : '';
  return `machine: ${share.machineCores.toFixed(2)} of ${cores} cores busy over ${share.seconds.toFixed(0)} s, ${share.othersCores.toFixed(2)} by other processes${warn}`;
}

/** CPU time (ms) of each thread of this process by Linux thread id, or null where /proc is unreadable. */
export function threadCpuMs(): Map<number, number> | null {
  try {
    const out = new Map<number, number>();
    for (const tid of readdirSync('/proc/self/task')) {
      const ms = statCpuMs(`/proc/self/task/${tid}/stat`);
      if (ms !== null) out.set(Number(tid), ms); // null: the thread ended between the listing and the read
    }
    return out;
  } catch {
    return null;
  }
}

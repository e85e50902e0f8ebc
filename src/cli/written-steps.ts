/**
 * What a batches file holds, read line by line from a stream: a run's file grows without bound, and
 * read into one string it fails past V8's string limit (ERR_STRING_TOO_LONG, about 512 MiB), so a long
 * run could never be resumed. Only one line is held at a time, and a line is held only up to
 * `maxLineBytes`.
 */
import { truncateSync } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import type { BatchStats } from '../coordinator/batch-stats.ts';
import { foldMean } from '../coordinator/mean.ts';
import { UsageError } from './args.ts';

/**
 * The longest line parsed: under V8's string limit (2^29 - 24 characters) with room to spare. A group
 * is far smaller; a longer line cannot be parsed at all.
 */
export const MAX_LINE_BYTES = 256 * 1024 * 1024;

export interface ScanOptions {
  /** Longest line read (tests lower it). */
  maxLineBytes?: number;
  /** Bytes read at a time. */
  chunkBytes?: number;
}

const NEWLINE = 0x0a;

/**
 * What whole steps hold, summed as a batch's stats are (batch-stats.ts): those of a batches file, or
 * those a run wrote. A fixed set of numbers, so a run summarised batch by batch holds no batch.
 */
export interface WrittenTotals {
  /** Whole steps (batches). */
  batches: number;
  groups: number;
  rollouts: number;
  /** Over `rollouts`, a rollout without a numeric reward counting as 0; a mean, not a sum, so it stays finite. */
  meanReward: number;
  turns: number;
  responseTokens: number;
}

export interface WrittenSteps {
  /** The first train step in the file; 0 when there is none. */
  first: number;
  /** The last step fully written (`batchSize` lines); 0 when there is none. */
  last: number;
  /** Totals over the whole steps, first..last: an earlier process's batches, for a resumed run's summary. */
  totals: WrittenTotals;
  /** Bytes up to the end of the last whole step: what is kept when the file is cut (`cutToLastStep`). */
  end: number;
  /** Bytes in the file. */
  size: number;
}

export function emptyTotals(): WrittenTotals {
  return { batches: 0, groups: 0, rollouts: 0, meanReward: 0, turns: 0, responseTokens: 0 };
}

/** `added` into `totals`. */
export function addTotals(totals: WrittenTotals, added: WrittenTotals): void {
  totals.meanReward = foldMean(totals.meanReward, totals.rollouts, added.meanReward, added.rollouts);
  totals.batches += added.batches;
  totals.groups += added.groups;
  totals.rollouts += added.rollouts;
  totals.turns += added.turns;
  totals.responseTokens += added.responseTokens;
}

/** The totals of one batch, from its stats alone: what a summary keeps of it. */
export function batchTotals(stats: BatchStats): WrittenTotals {
  return {
    batches: 1,
    groups: stats.groups,
    rollouts: stats.rollouts,
    meanReward: stats.meanReward,
    turns: stats.turns,
    responseTokens: stats.responseTokens,
  };
}

/**
 * The first train step in a batches file and the last one fully written (`batchSize` lines); 0 when
 * there is none. A crash can leave a batch cut short — a line, or whole lines of its step — so the file
 * is cut back to its last complete step and the step after it is taken (the engine delivers that batch
 * again). A missing file holds no steps.
 */
export async function writtenSteps(
  path: string,
  batchSize: number,
  options: ScanOptions = {},
): Promise<{ first: number; last: number }> {
  const scan = await scanWrittenSteps(path, batchSize, options);
  cutToLastStep(path, scan);
  return { first: scan.first, last: scan.last };
}

/** What follows the last complete step — a cut line, or a step's lines short of a batch — goes. */
export function cutToLastStep(path: string, scan: WrittenSteps): void {
  if (scan.end < scan.size) truncateSync(path, scan.end);
}

/**
 * `writtenSteps` without the cut: the file is only read, so a command that may still refuse to run
 * (`rollout run --resume` finding a checkpoint of another run) has written nothing when it does.
 */
export async function scanWrittenSteps(
  path: string,
  batchSize: number,
  options: ScanOptions = {},
): Promise<WrittenSteps> {
  const maxLineBytes = options.maxLineBytes ?? MAX_LINE_BYTES;
  let complete = { step: 0, end: 0 }; // the last complete step and the byte offset where its last line ends
  let current = { step: 0, lines: 0 };
  // Summed per step, and added to the whole steps' totals only when the step is whole.
  let stepTotals = emptyTotals();
  const totals = emptyTotals();
  let first = 0;
  let line = 0;
  let offset = 0; // bytes of the file before the chunk being read
  let pending: Buffer[] = []; // the start of the line being read, from earlier chunks
  let pendingBytes = 0;
  let overlong = false; // the line being read passed maxLineBytes: its bytes are no longer kept

  const endLine = (tail: Buffer, end: number) => {
    line++;
    if (overlong || pendingBytes + tail.length > maxLineBytes) {
      throw new UsageError(
        `--resume: ${path} line ${line} is longer than ${maxLineBytes} bytes, too long to be a group; the file is the record of what was handed out, so it is left as it is`,
      );
    }
    const text = (pending.length === 0 ? tail : Buffer.concat([...pending, tail])).toString('utf8');
    pending = [];
    pendingBytes = 0;
    let group: { trainStep?: unknown; rollouts?: unknown } | null;
    try {
      group = JSON.parse(text) as { trainStep?: unknown; rollouts?: unknown } | null;
    } catch (err) {
      throw new UsageError(
        `--resume: ${path} line ${line} is not JSON (${(err as Error).message}); the file is the record of what was handed out, so it is left as it is`,
      );
    }
    const step = group?.trainStep;
    if (typeof step !== 'number') return;
    if (first === 0) first = step;
    if (step !== current.step) stepTotals = emptyTotals();
    current = step === current.step ? { step, lines: current.lines + 1 } : { step, lines: 1 };
    addGroup(stepTotals, group!.rollouts);
    if (current.lines === batchSize) {
      complete = { step, end };
      addTotals(totals, { ...stepTotals, batches: 1 });
      stepTotals = emptyTotals();
    }
  };

  let file: FileHandle;
  try {
    file = await open(path, 'r');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { first: 0, last: 0, totals, end: 0, size: 0 };
    throw err;
  }
  try {
    // One buffer, read into again and again: memory stays at one chunk and one line whatever the file's
    // size (a stream allocates a chunk per read and leaves them to the collector).
    const chunk = Buffer.allocUnsafe(options.chunkBytes ?? 1024 * 1024);
    for (;;) {
      const { bytesRead } = await file.read(chunk, 0, chunk.length, null);
      if (bytesRead === 0) break;
      let start = 0;
      for (
        let nl = chunk.indexOf(NEWLINE);
        nl >= 0 && nl < bytesRead;
        start = nl + 1, nl = chunk.indexOf(NEWLINE, start)
      ) {
        endLine(chunk.subarray(start, nl), offset + nl + 1);
        overlong = false;
      }
      if (start < bytesRead && !overlong) {
        const rest = chunk.subarray(start, bytesRead);
        if (pendingBytes + rest.length > maxLineBytes) {
          // Kept no further: if a newline ends it, it is refused; if the file ends first, it is a cut line.
          overlong = true;
          pending = [];
          pendingBytes = 0;
        } else {
          pending.push(Buffer.from(rest)); // a copy: the chunk is read into again
          pendingBytes += rest.length;
        }
      }
      offset += bytesRead;
    }
  } finally {
    await file.close();
  }
  return { first, last: complete.step, totals, end: complete.end, size: offset };
}

/** One line's group into a step's totals; a line of another shape counts as a group and nothing more. */
function addGroup(totals: WrittenTotals, rollouts: unknown): void {
  totals.groups++;
  if (!Array.isArray(rollouts)) return;
  for (const r of rollouts as { reward?: unknown; turns?: unknown }[]) {
    totals.meanReward = foldMean(totals.meanReward, totals.rollouts, typeof r?.reward === 'number' ? r.reward : 0, 1);
    totals.rollouts++;
    if (!Array.isArray(r?.turns)) continue;
    totals.turns += r.turns.length;
    for (const t of r.turns as { responseIds?: unknown }[])
      if (Array.isArray(t?.responseIds)) totals.responseTokens += t.responseIds.length;
  }
}

/**
 * Reading a directory of step-record files (written by StepRecordWriter, one file per worker) back
 * as training data.
 *
 * Files are streamed line by line, never loaded whole. A last line without its `\n` is a write torn
 * by a crash (or one still in flight while we read): it is skipped and counted. Any other bad line
 * means the store is corrupt and is an error naming `file:line` — silently dropping a middle line
 * would silently drop a step of some episode.
 *
 * A session (`rolloutId#attempt`) may span files: a rollout paused on one worker and continued on
 * another appends its continuation steps to the other worker's file. Sessions are therefore
 * assembled across all files; a turn (step index, agent id) written twice (a partial turn, then its
 * continuation) keeps the later write by record time, then by read order (files by name, lines in
 * order).
 */
import { createReadStream } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { RolloutEngineError } from '../protocol/errors.ts';
import { Status } from '../protocol/rollout.ts';
import type { SessionEnd, StepRecord, StepRecordLine } from './step-records.ts';

export class StepRecordFormatError extends RolloutEngineError {
  readonly file: string;
  readonly line: number;
  constructor(file: string, line: number, reason: string) {
    super('ERR_RECORDS_FORMAT', `${file}:${line}: ${reason}`);
    this.name = 'StepRecordFormatError';
    this.file = file;
    this.line = line;
  }
}

export interface TornLine {
  file: string;
  line: number;
  bytes: number;
}

export interface ReadStats {
  files: number;
  records: number;
  /** Last lines missing their newline (crash mid-write, or a write in flight): skipped. */
  tornLines: TornLine[];
}

/** The records of a directory, with counts filled in as it is read. */
export interface StepRecordStream extends AsyncIterable<StepRecordLine> {
  readonly stats: ReadStats;
}

/** A finished attempt: the training sample. */
export interface CompletedSession {
  sessionId: string;
  rolloutId: string;
  groupId: string;
  taskName: string;
  attempt: number;
  /** By step index (then agent id, single agent first), one record per turn: its latest write. */
  steps: StepRecord[];
  totalReward: number;
  end: SessionEnd;
  /** Step indices 1..end.steps with no record (lost in a failed write); empty for a whole session. */
  missingSteps: number[];
  /** Files holding the session's records, sorted. */
  files: string[];
}

export interface SessionIndex {
  /** Sorted by end time, then session id. */
  completed: CompletedSession[];
  /** Sessions with records but no COMPLETED end: in flight, paused, restarted, failed. Sorted. */
  unfinished: string[];
  stats: ReadStats;
}

const NEWLINE = 0x0a;

/** Every record of every `*.jsonl` file in `dir` (files in name order, lines in file order). */
export function readStepRecords(dir: string): StepRecordStream {
  const stats: ReadStats = { files: 0, records: 0, tornLines: [] };
  return {
    stats,
    async *[Symbol.asyncIterator]() {
      for await (const located of readDir(resolve(dir), stats)) yield located.record;
    },
  };
}

interface LocatedRecord {
  record: StepRecordLine;
  file: string;
  line: number;
}

async function* readDir(dir: string, stats: ReadStats): AsyncGenerator<LocatedRecord> {
  const names = (await readdir(dir, { withFileTypes: true }))
    .filter((entry) => entry.isFile() && entry.name.endsWith('.jsonl'))
    .map((entry) => entry.name)
    .sort();
  for (const name of names) {
    stats.files++;
    const file = join(dir, name);
    for await (const [line, text] of readLines(file, stats)) {
      if (text.trim() === '') continue;
      const record = parseRecord(text, file, line);
      stats.records++;
      yield { record, file, line };
    }
  }
}

/**
 * Complete lines of a file with their 1-based numbers. Splits bytes on `\n`, which never occurs
 * inside a multi-byte UTF-8 sequence, so each line decodes on its own.
 */
async function* readLines(file: string, stats: ReadStats): AsyncGenerator<[number, string]> {
  let carry: Buffer = Buffer.alloc(0);
  let line = 0;
  for await (const chunk of createReadStream(file) as AsyncIterable<Buffer>) {
    let data = carry.length > 0 ? Buffer.concat([carry, chunk]) : chunk;
    let at: number;
    while ((at = data.indexOf(NEWLINE)) >= 0) {
      line++;
      yield [line, data.toString('utf8', 0, at)];
      data = data.subarray(at + 1);
    }
    // Copy: a subarray would pin the whole chunk in memory until the next newline.
    carry = Buffer.from(data);
  }
  if (carry.length > 0) stats.tornLines.push({ file, line: line + 1, bytes: carry.length });
}

function parseRecord(text: string, file: string, line: number): StepRecordLine {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new StepRecordFormatError(file, line, `not valid JSON (${(err as Error).message})`);
  }
  const problem = recordProblem(value);
  if (problem !== null) throw new StepRecordFormatError(file, line, problem);
  return value as StepRecordLine;
}

/** Checks the fields the reader relies on; null when the record is usable. */
function recordProblem(value: unknown): string | null {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return 'not a JSON object';
  const rec = value as Record<string, unknown>;
  if (rec.type !== 'step' && rec.type !== 'end') return `unknown record type ${JSON.stringify(rec.type)}`;
  for (const key of ['sessionId', 'rolloutId', 'groupId', 'taskName'] as const) {
    if (typeof rec[key] !== 'string' || rec[key] === '') return `${key} must be a non-empty string`;
  }
  if (!isNonNegativeInteger(rec.attempt)) return 'attempt must be a non-negative integer';
  if (typeof rec.time !== 'number' || !Number.isFinite(rec.time)) return 'time must be a finite number';
  if (rec.type === 'step') {
    if (!isNonNegativeInteger(rec.step) || rec.step === 0) return 'step must be a positive integer';
    if (!Array.isArray(rec.messages)) return 'messages must be an array';
    if (typeof rec.response !== 'string') return 'response must be a string';
    if (typeof rec.stepReward !== 'number') return 'stepReward must be a number';
    if (rec.agentId === undefined)
      rec.agentId = null; // written before multi-agent records existed
    else if (rec.agentId !== null && typeof rec.agentId !== 'string') return 'agentId must be a string or null';
  } else {
    if (typeof rec.status !== 'string') return 'status must be a string';
    if (typeof rec.totalReward !== 'number') return 'totalReward must be a number';
    if (!isNonNegativeInteger(rec.steps)) return 'steps must be a non-negative integer';
  }
  return null;
}

function isNonNegativeInteger(v: unknown): v is number {
  return typeof v === 'number' && Number.isInteger(v) && v >= 0;
}

interface SessionParts {
  /** Latest write of each turn, by `turnKey`. */
  steps: Map<string, StepRecord>;
  stepIndices: Set<number>;
  end: SessionEnd | null;
  files: Set<string>;
}

/**
 * Read `dir` once and assemble sessions. Holds every step of the directory in memory: meant for a
 * directory per run or per batch, not an unbounded archive.
 */
export async function indexSessions(dir: string): Promise<SessionIndex> {
  const stats: ReadStats = { files: 0, records: 0, tornLines: [] };
  const sessions = new Map<string, SessionParts>();
  for await (const { record: rec, file } of readDir(resolve(dir), stats)) {
    let parts = sessions.get(rec.sessionId);
    if (parts === undefined)
      sessions.set(rec.sessionId, (parts = { steps: new Map(), end: null, files: new Set(), stepIndices: new Set() }));
    parts.files.add(file);
    // ≥: on equal times the record read later wins (same file: written later).
    if (rec.type === 'step') {
      const key = turnKey(rec);
      const seen = parts.steps.get(key);
      if (seen === undefined || rec.time >= seen.time) parts.steps.set(key, rec);
      parts.stepIndices.add(rec.step);
    } else if (parts.end === null || rec.time >= parts.end.time) {
      parts.end = rec; // the latest end decides: an ABORTED end followed by a continuation's COMPLETED one
    }
  }

  const completed: CompletedSession[] = [];
  const unfinished: string[] = [];
  for (const [sessionId, parts] of sessions) {
    const end = parts.end;
    if (end === null || end.status !== Status.COMPLETED) {
      unfinished.push(sessionId);
      continue;
    }
    const steps = [...parts.steps.values()].sort(byTurn);
    const missingSteps: number[] = [];
    for (let i = 1; i <= end.steps; i++) if (!parts.stepIndices.has(i)) missingSteps.push(i);
    completed.push({
      sessionId,
      rolloutId: end.rolloutId,
      groupId: end.groupId,
      taskName: end.taskName,
      attempt: end.attempt,
      steps,
      totalReward: end.totalReward,
      end,
      missingSteps,
      files: [...parts.files].sort(),
    });
  }
  completed.sort(
    (a, b) => a.end.time - b.end.time || (a.sessionId < b.sessionId ? -1 : a.sessionId > b.sessionId ? 1 : 0),
  );
  unfinished.sort();
  return { completed, unfinished, stats };
}

function turnKey(rec: StepRecord): string {
  return rec.agentId === null ? `${rec.step}` : `${rec.step}/${rec.agentId}`;
}

function byTurn(a: StepRecord, b: StepRecord): number {
  if (a.step !== b.step) return a.step - b.step;
  if (a.agentId === b.agentId) return 0;
  if (a.agentId === null) return -1;
  if (b.agentId === null) return 1;
  return a.agentId < b.agentId ? -1 : 1;
}

/** Exactly the sessions that finished (an end marker with status COMPLETED), steps by index. */
export async function listCompletedSessions(dir: string): Promise<CompletedSession[]> {
  return (await indexSessions(dir)).completed;
}

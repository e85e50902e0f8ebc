/**
 * Append-only JSONL step records: one line per agent turn and one end marker per finished attempt,
 * the engine's counterpart of the reference Interactor's `data_manager.record_step`.
 *
 * A `StepRecordWriter` lives in one thread (each worker has its own) and owns one file. `record()` is
 * on the agent loop's hot path, so it only serializes and queues: the disk is touched later, in
 * batches, by at most one write in flight. Invariants the reader relies on:
 *   - a writer is the only one appending to its file (default name `steps-<pid>-<threadId>.jsonl`;
 *     two writers of one thread on the same path are refused), so batches never interleave;
 *   - every record is exactly one line ending in `\n` (JSON escapes the newlines inside strings);
 *   - lines of one writer are in `record()` order;
 *   - the only line that can be incomplete is the last one of a file (a crash mid-write); a failed
 *     write is cut back off the file, and a writer reopening a file cuts off a torn tail before
 *     appending, so a torn fragment never ends up in the middle.
 */
import { mkdir, open, type FileHandle } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { threadId } from 'node:worker_threads';
import { RolloutEngineError } from '../protocol/errors.ts';
import type { ChatMessage, FinishReason, Status } from '../protocol/rollout.ts';

/** What the environment / server reported alongside a step; `weightVersion` is the reference's `env_state`. */
export interface EnvState {
  /** Weight version (model step) that generated the response; null when nobody reported one. */
  weightVersion: number | null;
  [key: string]: unknown;
}

/** Fields every record of one session carries. */
export interface SessionKey {
  /** `${rolloutId}#${attempt}`: one attempt of one rollout (see `sessionIdOf`). */
  sessionId: string;
  rolloutId: string;
  groupId: string;
  taskName: string;
  /**
   * 0 for the first run of a rollout; +1 each time it is restarted from its prompt. A rollout
   * continued after a pause keeps its attempt, so its continuation steps land in the same session.
   */
  attempt: number;
}

/** One agent turn, as the reference's `record_step` stores it. */
export interface StepRecord extends SessionKey {
  type: 'step';
  /** 1-based step index within the episode. */
  step: number;
  /** Multi-agent environments record one turn per agent per step; null for a single agent. */
  agentId: string | null;
  /** Messages sent to the inference server (after trimming). */
  messages: ChatMessage[];
  response: string;
  stepReward: number;
  /** Sum of step rewards of this session up to and including this step. */
  cumulativeReward: number;
  envState: EnvState;
  terminated: boolean;
  truncated: boolean;
  trainable: boolean;
  finishReason: FinishReason;
  /** Wall clock (ms since epoch) when the record was made; orders rewrites of a step across files. */
  time: number;
}

/** End-of-attempt marker. Only an attempt whose end says COMPLETED is training data. */
export interface SessionEnd extends SessionKey {
  type: 'end';
  status: Status;
  totalReward: number;
  /** Number of steps the session ended with (its last step index). */
  steps: number;
  time: number;
}

export type StepRecordLine = StepRecord | SessionEnd;

export function sessionIdOf(rolloutId: string, attempt: number): string {
  return `${rolloutId}#${attempt}`;
}

/** Default file of a writer: unique per process and thread, so workers never share a file. */
export function defaultStepFileName(): string {
  return `steps-${process.pid}-${threadId}.jsonl`;
}

export interface StepRecordWriterOptions {
  dir: string;
  /** Defaults to `defaultStepFileName()`. Give each concurrent writer (thread, process) its own. */
  fileName?: string;
  /** A non-empty batch is written at the latest this long after its first record. */
  flushIntervalMs?: number;
  /** A batch this large is written right away instead of waiting for the timer. */
  maxBufferedRecords?: number;
}

export interface FlushOptions {
  /** Also fsync the file, so the records survive a machine crash, not just a process crash. */
  fsync?: boolean;
}

export interface StepRecordWriterStats {
  /** Records accepted by record() / recordEnd(). */
  recorded: number;
  /** Records appended to the file. */
  written: number;
  /** Successful appends (batches); `written / writes` is the batching achieved. */
  writes: number;
  /** Records lost in failed writes. */
  failedRecords: number;
  failedWrites: number;
  /** Records not yet handed to the disk, plus the ones in the write in flight. */
  pending: number;
  bytesWritten: number;
  /** Bytes of a torn last line cut off the file when it was opened. */
  repairedBytes: number;
}

/** Write failures since the last flush()/close() that reported them. */
export class StepRecordWriteError extends RolloutEngineError {
  readonly file: string;
  readonly lostRecords: number;
  readonly errors: unknown[];
  constructor(file: string, lostRecords: number, errors: unknown[]) {
    const first = errors[0];
    const reason = first instanceof Error ? first.message : String(first);
    super(
      'ERR_RECORDS_WRITE',
      `step records: ${lostRecords} record(s) lost in ${errors.length} failed write(s) to ${file}: ${reason}`,
      { cause: first },
    );
    this.name = 'StepRecordWriteError';
    this.file = file;
    this.lostRecords = lostRecords;
    this.errors = errors;
  }
}

/** Files with an open writer in this thread: a second writer would interleave its batches with the first's. */
const openFiles = new Set<string>();

interface FlushWaiter {
  /** Resolved once this many records have been handled (written or failed). */
  target: number;
  resolve: () => void;
}

const NEWLINE = 0x0a;
const TAIL_SCAN_CHUNK = 64 * 1024;

export class StepRecordWriter {
  /** Absolute path of the file this writer appends to. */
  readonly path: string;
  readonly #dir: string;
  readonly #flushIntervalMs: number;
  readonly #maxBufferedRecords: number;
  /** Serialized lines (each ending in `\n`) not yet handed to the disk. */
  #batch: string[] = [];
  #timer: NodeJS.Timeout | null = null;
  /** The drain loop; at most one runs, so at most one write is in flight and lines keep their order. */
  #draining: Promise<void> | null = null;
  #handle: FileHandle | null = null;
  /** Bytes of the file known to hold whole lines: a failed write is truncated back to it. */
  #goodSize = 0;
  /** Set when a failed write could not be cut back: appending more would bury a torn line mid-file. */
  #broken: unknown = null;
  #waiters: FlushWaiter[] = [];
  #unreported: unknown[] = [];
  #unreportedLost = 0;
  #closing: Promise<void> | null = null;
  #recorded = 0;
  #handled = 0;
  #written = 0;
  #writes = 0;
  #failedRecords = 0;
  #failedWrites = 0;
  #bytesWritten = 0;
  #repairedBytes = 0;

  constructor(options: StepRecordWriterOptions) {
    const { dir, fileName = defaultStepFileName(), flushIntervalMs = 200, maxBufferedRecords = 1000 } = options;
    if (!(flushIntervalMs > 0)) throw new RangeError(`flushIntervalMs must be > 0 (got ${flushIntervalMs})`);
    if (!Number.isInteger(maxBufferedRecords) || maxBufferedRecords < 1)
      throw new RangeError(`maxBufferedRecords must be a positive integer (got ${maxBufferedRecords})`);
    // The reader reads `*.jsonl` directly in the directory: any other name would be written, never read.
    if (!/^[^/\\]+\.jsonl$/.test(fileName))
      throw new RangeError(`fileName must be a plain file name ending in .jsonl (got ${JSON.stringify(fileName)})`);
    this.#dir = resolve(dir);
    this.path = join(this.#dir, fileName);
    if (openFiles.has(this.path))
      throw new RolloutEngineError(
        'ERR_RECORDS_FILE_IN_USE',
        `step records: ${this.path} already has an open writer in this thread`,
      );
    openFiles.add(this.path);
    this.#flushIntervalMs = flushIntervalMs;
    this.#maxBufferedRecords = maxBufferedRecords;
  }

  /**
   * Queue one step record. Synchronous and cheap: serializes and appends to the in-memory batch.
   * Write failures are reported by flush()/close(), never here. Throws only for caller bugs: a record
   * after close(), or one that JSON cannot represent.
   */
  record(rec: StepRecord): void {
    this.#append(rec);
  }

  /** Queue the end-of-attempt marker (same contract as record()). */
  recordEnd(end: SessionEnd): void {
    this.#append(end);
  }

  /**
   * Write everything recorded before this call; resolves once it is in the file (and with `fsync`,
   * on stable storage). Rejects with a StepRecordWriteError if writes failed since the last report.
   */
  async flush(options: FlushOptions = {}): Promise<void> {
    const target = this.#recorded;
    this.#startDrain();
    if (this.#handled < target) await new Promise<void>((resolve) => this.#waiters.push({ target, resolve }));
    if (options.fsync && this.#handle !== null) {
      try {
        await this.#handle.sync();
      } catch (err) {
        this.#unreported.push(err);
      }
    }
    this.#report();
  }

  /** Flush, stop the timer and close the file. Idempotent; record() throws afterwards. */
  close(options: FlushOptions = {}): Promise<void> {
    this.#closing ??= this.#close(options);
    return this.#closing;
  }

  get closed(): boolean {
    return this.#closing !== null;
  }

  stats(): StepRecordWriterStats {
    return {
      recorded: this.#recorded,
      written: this.#written,
      writes: this.#writes,
      failedRecords: this.#failedRecords,
      failedWrites: this.#failedWrites,
      pending: this.#recorded - this.#handled,
      bytesWritten: this.#bytesWritten,
      repairedBytes: this.#repairedBytes,
    };
  }

  async #close(options: FlushOptions): Promise<void> {
    this.#clearTimer();
    try {
      // Nothing can be recorded any more (closed is set), so this flush covers every record.
      await this.flush(options);
    } finally {
      const handle = this.#handle;
      this.#handle = null;
      openFiles.delete(this.path);
      if (handle !== null) await handle.close();
    }
  }

  #append(rec: StepRecordLine): void {
    if (this.#closing !== null)
      throw new RolloutEngineError(
        'ERR_RECORDS_CLOSED',
        `step records: ${this.path} is closed; ${rec.type} of ${rec.sessionId} not recorded`,
      );
    this.#batch.push(`${JSON.stringify(rec)}\n`);
    this.#recorded++;
    if (this.#batch.length >= this.#maxBufferedRecords) this.#startDrain();
    // While a drain runs it picks this record up after its current write; no timer needed.
    else if (this.#draining === null) this.#armTimer();
  }

  #startDrain(): void {
    this.#clearTimer();
    if (this.#draining !== null || this.#batch.length === 0) return;
    this.#draining = this.#drain().finally(() => {
      this.#draining = null;
      // Records that arrived during the last write and were not picked up get a timer again.
      if (this.#batch.length > 0 && this.#closing === null) this.#armTimer();
    });
  }

  #armTimer(): void {
    if (this.#timer !== null) return;
    // unref'd: a pending batch never keeps the process alive; close() is what guarantees the write.
    this.#timer = setTimeout(() => {
      this.#timer = null;
      this.#startDrain();
    }, this.#flushIntervalMs).unref();
  }

  #clearTimer(): void {
    if (this.#timer === null) return;
    clearTimeout(this.#timer);
    this.#timer = null;
  }

  /**
   * Write batches until none is left. Records arriving while a write is in flight coalesce into the
   * next batch, so a slow disk means fewer, larger writes rather than a queue of small ones.
   */
  async #drain(): Promise<void> {
    while (this.#batch.length > 0) {
      const lines = this.#batch;
      this.#batch = [];
      await this.#write(lines);
      this.#handled += lines.length;
      this.#wakeWaiters();
    }
  }

  async #write(lines: string[]): Promise<void> {
    const data = Buffer.from(lines.join(''), 'utf8');
    try {
      if (this.#broken !== null) throw this.#broken;
      const handle = await this.#open();
      try {
        await handle.appendFile(data);
      } catch (err) {
        await this.#cutBack(handle, err);
        throw err;
      }
      this.#goodSize += data.length;
      this.#written += lines.length;
      this.#writes++;
      this.#bytesWritten += data.length;
    } catch (err) {
      this.#failedWrites++;
      this.#failedRecords += lines.length;
      this.#unreportedLost += lines.length;
      this.#unreported.push(err);
    }
  }

  /** A failed append may have left part of the batch behind: truncate to the last whole line. */
  async #cutBack(handle: FileHandle, cause: unknown): Promise<void> {
    try {
      await handle.truncate(this.#goodSize);
    } catch (err) {
      this.#broken = new RolloutEngineError(
        'ERR_RECORDS_BROKEN',
        `step records: ${this.path} may end in a torn line after a failed write (${String(cause)}) and could not be truncated (${String(err)}); not appending to it any more`,
        { cause: err },
      );
    }
  }

  /** Open lazily (the constructor cannot await), retrying on the next batch if it fails. */
  async #open(): Promise<FileHandle> {
    if (this.#handle !== null) return this.#handle;
    await mkdir(this.#dir, { recursive: true });
    const handle = await open(this.path, 'a+');
    try {
      this.#goodSize = await this.#repairTail(handle);
    } catch (err) {
      await handle.close().catch(() => {});
      throw err;
    }
    this.#handle = handle;
    return handle;
  }

  /**
   * An existing file (same name after a restart) may end in a torn line from a crash; appending to it
   * would turn that fragment into a corrupt middle line. Cut it off and return the good size.
   */
  async #repairTail(handle: FileHandle): Promise<number> {
    const { size } = await handle.stat();
    if (size === 0) return 0;
    const chunk = Buffer.alloc(Math.min(TAIL_SCAN_CHUNK, size));
    let end = size;
    let first = true;
    while (end > 0) {
      const start = Math.max(0, end - chunk.length);
      const { bytesRead } = await handle.read(chunk, 0, end - start, start);
      if (first && chunk[bytesRead - 1] === NEWLINE) return size;
      first = false;
      const at = chunk.subarray(0, bytesRead).lastIndexOf(NEWLINE);
      if (at >= 0) {
        end = start + at + 1;
        break;
      }
      end = start;
    }
    await handle.truncate(end);
    this.#repairedBytes += size - end;
    return end;
  }

  #wakeWaiters(): void {
    if (this.#waiters.length === 0) return;
    const still: FlushWaiter[] = [];
    for (const waiter of this.#waiters) {
      if (this.#handled >= waiter.target) waiter.resolve();
      else still.push(waiter);
    }
    this.#waiters = still;
  }

  #report(): void {
    if (this.#unreported.length === 0) return;
    const error = new StepRecordWriteError(this.path, this.#unreportedLost, this.#unreported);
    this.#unreported = [];
    this.#unreportedLost = 0;
    throw error;
  }
}

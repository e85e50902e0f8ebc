import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { appendFile, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Worker } from 'node:worker_threads';
import {
  indexSessions,
  listCompletedSessions,
  readStepRecords,
  sessionIdOf,
  StepRecordFormatError,
  StepRecordWriteError,
  StepRecordWriter,
  type SessionEnd,
  type StepRecord,
  type StepRecordLine,
} from '../src/records/index.ts';

let root: string;
let counter = 0;
before(async () => {
  root = await mkdtemp(join(tmpdir(), 'step-records-'));
});
after(async () => {
  await rm(root, { recursive: true, force: true });
});

/** A fresh directory per test, so tests can run in any order. */
function freshDir(): string {
  return join(root, `case-${++counter}`);
}

function stepOf(rolloutId: string, attempt: number, step: number, extra: Partial<StepRecord> = {}): StepRecord {
  return {
    type: 'step',
    sessionId: sessionIdOf(rolloutId, attempt),
    rolloutId,
    groupId: rolloutId.split('/').slice(0, 2).join('/'),
    taskName: rolloutId.split('/')[0],
    attempt,
    step,
    agentId: null,
    messages: [{ role: 'user', content: `prompt ${step}` }],
    response: `response ${step}`,
    stepReward: 1,
    cumulativeReward: step,
    envState: { weightVersion: 1 },
    terminated: false,
    truncated: false,
    trainable: true,
    finishReason: 'stop',
    time: 1_000 + step,
    ...extra,
  };
}

function endOf(rolloutId: string, attempt: number, steps: number, extra: Partial<SessionEnd> = {}): SessionEnd {
  return {
    type: 'end',
    sessionId: sessionIdOf(rolloutId, attempt),
    rolloutId,
    groupId: rolloutId.split('/').slice(0, 2).join('/'),
    taskName: rolloutId.split('/')[0],
    attempt,
    status: 'COMPLETED',
    totalReward: steps,
    steps,
    time: 2_000,
    ...extra,
  };
}

async function linesOf(path: string): Promise<string[]> {
  if (!existsSync(path)) return [];
  const text = await readFile(path, 'utf8');
  return text.split('\n').filter((l) => l !== '');
}

/** Polls the file (real time, no fake clock) until it holds `n` lines or `ms` pass. */
async function waitForLines(path: string, n: number, ms = 30_000): Promise<string[]> {
  const deadline = Date.now() + ms;
  for (;;) {
    const lines = await linesOf(path);
    if (lines.length >= n || Date.now() > deadline) return lines;
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function turns(n: number): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise((r) => setImmediate(r));
}

async function collect(dir: string): Promise<StepRecordLine[]> {
  const out: StepRecordLine[] = [];
  for await (const rec of readStepRecords(dir)) out.push(rec);
  return out;
}

describe('StepRecordWriter', () => {
  it('queues a record synchronously and leaves the disk alone until flush', async () => {
    const dir = freshDir();
    const writer = new StepRecordWriter({ dir, fileName: 'w.jsonl', flushIntervalMs: 60_000 });
    const returned: unknown = writer.record(stepOf('t/0/0', 0, 1));
    assert.equal(returned, undefined, 'record() returns nothing, in particular not a promise');
    writer.recordEnd(endOf('t/0/0', 0, 1));
    // Many event-loop turns later, still nothing written: record() never started I/O itself.
    await turns(20);
    assert.deepEqual(await linesOf(writer.path), []);
    assert.equal(writer.stats().pending, 2);

    await writer.flush();
    const lines = await linesOf(writer.path);
    assert.equal(lines.length, 2);
    assert.deepEqual(JSON.parse(lines[0]), stepOf('t/0/0', 0, 1));
    assert.deepEqual(JSON.parse(lines[1]), endOf('t/0/0', 0, 1));
    const stats = writer.stats();
    assert.equal(stats.bytesWritten, Buffer.byteLength(`${lines.join('\n')}\n`));
    assert.deepEqual(
      { ...stats, bytesWritten: 0 },
      {
        recorded: 2,
        written: 2,
        writes: 1,
        failedRecords: 0,
        failedWrites: 0,
        pending: 0,
        bytesWritten: 0,
        repairedBytes: 0,
      },
    );
    await writer.close();
  });

  it('writes a pending batch on its timer without a flush', async () => {
    const writer = new StepRecordWriter({ dir: freshDir(), fileName: 'w.jsonl', flushIntervalMs: 20 });
    writer.record(stepOf('t/0/0', 0, 1));
    assert.equal((await waitForLines(writer.path, 1)).length, 1);
    await writer.close();
  });

  it('writes a full batch right away, without waiting for the timer', async () => {
    const writer = new StepRecordWriter({
      dir: freshDir(),
      fileName: 'w.jsonl',
      flushIntervalMs: 60_000,
      maxBufferedRecords: 3,
    });
    writer.record(stepOf('t/0/0', 0, 1));
    writer.record(stepOf('t/0/0', 0, 2));
    await turns(20);
    assert.deepEqual(await linesOf(writer.path), [], 'two of three records are not a full batch');
    writer.record(stepOf('t/0/0', 0, 3));
    assert.equal((await waitForLines(writer.path, 3)).length, 3);
    await writer.close();
  });

  it('keeps record order and one record per line across many batches, with newlines and non-ASCII in the text', async () => {
    const writer = new StepRecordWriter({
      dir: freshDir(),
      fileName: 'w.jsonl',
      flushIntervalMs: 1,
      maxBufferedRecords: 4,
    });
    const written: StepRecord[] = [];
    for (let i = 1; i <= 50; i++) {
      const rec = stepOf('t/0/0', 0, i, { response: `line one\nline two — ünïcödé 🚀 ${i}` });
      written.push(rec);
      writer.record(rec);
      if (i % 7 === 0) await turns(1);
    }
    await writer.flush({ fsync: true });
    const lines = await linesOf(writer.path);
    assert.deepEqual(
      lines.map((l) => JSON.parse(l)),
      written,
    );
    await writer.close();
  });

  it('persists everything on close, stops its timer, and refuses records afterwards', async () => {
    const writer = new StepRecordWriter({ dir: freshDir(), fileName: 'w.jsonl', flushIntervalMs: 60_000 });
    const timersBefore = process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
    writer.record(stepOf('t/0/0', 0, 1));
    // The batch timer is unref'd: it is not among the handles that keep the process alive.
    assert.equal(process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length, timersBefore);
    await writer.close();
    assert.equal(writer.closed, true);
    assert.equal((await linesOf(writer.path)).length, 1);
    assert.throws(() => writer.record(stepOf('t/0/0', 0, 2)), { code: 'ERR_RECORDS_CLOSED' });
    await writer.close(); // idempotent
  });

  it('lets a process exit by itself, whether or not the writer was closed', async () => {
    const dir = freshDir();
    const moduleUrl = new URL('../src/records/index.ts', import.meta.url).href;
    const script = (close: boolean) => `
      import { StepRecordWriter } from ${JSON.stringify(moduleUrl)};
      const writer = new StepRecordWriter({ dir: ${JSON.stringify(dir)}, fileName: ${JSON.stringify(close ? 'closed.jsonl' : 'open.jsonl')}, flushIntervalMs: 60000 });
      writer.record({ type: 'step', sessionId: 'r#0', rolloutId: 'r', groupId: 'g', taskName: 't', attempt: 0, step: 1, agentId: null,
        messages: [], response: 'x', stepReward: 0, cumulativeReward: 0, envState: { weightVersion: null }, terminated: true,
        truncated: false, trainable: true, finishReason: 'stop', time: 0 });
      ${close ? 'await writer.close();' : ''}
    `;
    const run = (close: boolean) =>
      new Promise<{ code: number | null; ms: number }>((resolve, reject) => {
        const started = Date.now();
        const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script(close)], {
          stdio: ['ignore', 'ignore', 'inherit'],
        });
        const killer = setTimeout(() => child.kill('SIGKILL'), 30_000);
        child.on('error', reject);
        child.on('exit', (code) => {
          clearTimeout(killer);
          resolve({ code, ms: Date.now() - started });
        });
      });
    const [closed, open] = await Promise.all([run(true), run(false)]);
    assert.equal(closed.code, 0);
    assert.equal(open.code, 0);
    // Well under the 60 s batch timer: neither the timer nor the file handle held the process.
    assert.ok(open.ms < 30_000, `the process without close() took ${open.ms} ms to exit`);
    assert.equal((await linesOf(join(dir, 'closed.jsonl'))).length, 1, 'close() wrote the record before exit');
    assert.equal(
      (await linesOf(join(dir, 'open.jsonl'))).length,
      0,
      'without close() the pending batch is lost (the documented contract)',
    );
  });

  it('reports a failed write from flush, counted, without ever throwing from record', async () => {
    const base = freshDir();
    await writeFile(`${base}.file`, 'not a directory');
    // mkdir under a regular file fails: every write of this writer fails.
    const writer = new StepRecordWriter({
      dir: join(`${base}.file`, 'records'),
      fileName: 'w.jsonl',
      flushIntervalMs: 60_000,
    });
    writer.record(stepOf('t/0/0', 0, 1));
    writer.record(stepOf('t/0/0', 0, 2));
    await assert.rejects(writer.flush(), (err: unknown) => {
      assert.ok(err instanceof StepRecordWriteError);
      assert.equal(err.code, 'ERR_RECORDS_WRITE');
      assert.equal(err.lostRecords, 2);
      assert.match(err.message, /2 record\(s\) lost in 1 failed write\(s\)/);
      return true;
    });
    assert.equal(writer.stats().failedRecords, 2);
    assert.equal(writer.stats().failedWrites, 1);
    await writer.flush(); // reported once: nothing new has failed since
    writer.record(stepOf('t/0/0', 0, 3));
    await assert.rejects(writer.close(), { code: 'ERR_RECORDS_WRITE' });
    assert.equal(writer.stats().failedRecords, 3);
  });

  it('refuses a second writer on a file this thread already writes until the first is closed, and a file name the reader would not read', async () => {
    const dir = freshDir();
    const first = new StepRecordWriter({ dir, fileName: 'same.jsonl' });
    assert.throws(() => new StepRecordWriter({ dir, fileName: 'same.jsonl' }), { code: 'ERR_RECORDS_FILE_IN_USE' });
    assert.throws(() => new StepRecordWriter({ dir, fileName: 'sub/other.jsonl' }), RangeError);
    assert.throws(
      () => new StepRecordWriter({ dir, fileName: 'other.txt' }),
      RangeError,
      'the reader would never see it',
    );
    await first.close();
    const second = new StepRecordWriter({ dir, fileName: 'same.jsonl' });
    await second.close();
  });

  it('cuts a torn last line off an existing file before appending to it', async () => {
    const dir = freshDir();
    const first = new StepRecordWriter({ dir, fileName: 'w.jsonl' });
    first.record(stepOf('t/0/0', 0, 1));
    await first.close();
    await appendFile(first.path, '{"type":"step","sessionId":"t/0/0#0","ste'); // a crash mid-write
    const second = new StepRecordWriter({ dir, fileName: 'w.jsonl' });
    second.record(stepOf('t/0/0', 0, 2));
    await second.close();
    assert.ok(second.stats().repairedBytes > 0);
    const stream = readStepRecords(dir);
    const steps: number[] = [];
    for await (const rec of stream) if (rec.type === 'step') steps.push(rec.step);
    assert.deepEqual(steps, [1, 2]);
    assert.deepEqual(stream.stats.tornLines, []);
  });
});

describe('step records from worker threads', () => {
  /** An eval worker that registers tsx's ESM hooks, then imports the .ts fixture (see the fixture's note). */
  function startWorker(data: { dir: string; name: string; sessions: number; steps: number }): Worker {
    const tsxApi = import.meta.resolve('tsx/esm/api');
    const fixture = new URL('./fixtures/records-worker.ts', import.meta.url).href;
    const code = `import(${JSON.stringify(tsxApi)}).then((api) => { api.register(); return import(${JSON.stringify(fixture)}); });`;
    return new Worker(code, { eval: true, workerData: data, execArgv: process.execArgv });
  }

  function message(worker: Worker): Promise<any> {
    return new Promise((resolve, reject) => {
      worker.once('message', resolve);
      worker.once('error', reject);
    });
  }

  it('lets two workers write concurrently to their own files, and the reader merges them', async () => {
    const dir = freshDir();
    const sessions = 10;
    const steps = 6;
    const workers = [
      startWorker({ dir, name: 'a', sessions, steps }),
      startWorker({ dir, name: 'b', sessions, steps }),
    ];
    try {
      assert.deepEqual(await Promise.all(workers.map(message)), ['ready', 'ready']);
      const done = workers.map(message);
      for (const w of workers) w.postMessage('go');
      const results = await Promise.all(done);

      // One file per worker, named after the process and the worker's thread.
      const files = (await readdir(dir)).sort();
      assert.deepEqual(files, results.map((r) => `steps-${process.pid}-${r.threadId}.jsonl`).sort());
      for (const r of results) {
        assert.equal(r.stats.written, sessions * steps + sessions / 2);
        assert.equal(r.stats.failedRecords, 0);
        assert.ok(r.stats.writes > 1, `the run should span several batch writes, got ${r.stats.writes}`);
      }

      const all = await collect(dir);
      assert.equal(all.length, 2 * (sessions * steps + sessions / 2));
      const completed = await listCompletedSessions(dir);
      assert.deepEqual(
        completed.map((s) => s.sessionId).sort(),
        ['a', 'b'].flatMap((name) => [0, 2, 4, 6, 8].map((i) => `${name}/${i}/0#0`)).sort(),
      );
      for (const session of completed) {
        assert.deepEqual(
          session.steps.map((s) => s.step),
          [1, 2, 3, 4, 5, 6],
        );
        assert.equal(session.totalReward, steps);
        assert.deepEqual(session.missingSteps, []);
        assert.equal(session.files.length, 1);
      }
    } finally {
      await Promise.all(workers.map((w) => w.terminate()));
    }
  });
});

describe('reading step records', () => {
  it('returns exactly the completed sessions: not aborted, failed, in-flight or superseded attempts, and continuations across files', async () => {
    const dir = freshDir();
    const w1 = new StepRecordWriter({ dir, fileName: 'steps-worker-1.jsonl' });
    const w2 = new StepRecordWriter({ dir, fileName: 'steps-worker-2.jsonl' });

    // Completed in one go.
    for (const s of [1, 2, 3]) w1.record(stepOf('math/0/0', 0, s));
    w1.recordEnd(endOf('math/0/0', 0, 3, { totalReward: 3 }));
    // In flight (or lost with a dead worker): steps, no end marker.
    for (const s of [1, 2]) w1.record(stepOf('math/0/1', 0, s));
    // Failed: its end marker says so.
    w2.record(stepOf('math/1/0', 0, 1));
    w2.recordEnd(endOf('math/1/0', 0, 1, { status: 'FAILED' }));
    // Restarted from its prompt: attempt 0 stopped without an end, attempt 1 completed.
    for (const s of [1, 2]) w1.record(stepOf('math/2/0', 0, s));
    for (const s of [1, 2, 3, 4]) w2.record(stepOf('math/2/0', 1, s, { time: 3_000 + s }));
    w2.recordEnd(endOf('math/2/0', 1, 4, { totalReward: 4, time: 4_000 }));
    // Paused on worker 1 in the middle of step 2 (a partial turn), continued on worker 2: step 2 is
    // written again, complete, and that later write is the one kept.
    w1.record(stepOf('code/0/0', 0, 1));
    w1.record(stepOf('code/0/0', 0, 2, { response: 'partial', finishReason: 'abort', time: 1_500 }));
    w2.record(stepOf('code/0/0', 0, 2, { response: 'partial and the rest', time: 2_500 }));
    w2.record(stepOf('code/0/0', 0, 3, { time: 2_600 }));
    w2.recordEnd(endOf('code/0/0', 0, 3, { time: 2_700 }));
    // Multi-agent: two turns per step, told apart by agent id, both kept.
    w1.record(stepOf('duo/0/0', 0, 1, { agentId: 'b' }));
    w1.record(stepOf('duo/0/0', 0, 1, { agentId: 'a' }));
    w1.recordEnd(endOf('duo/0/0', 0, 1, { time: 1_900 }));
    await Promise.all([w1.close(), w2.close()]);

    const index = await indexSessions(dir);
    assert.deepEqual(
      index.completed.map((s) => s.sessionId),
      ['duo/0/0#0', 'math/0/0#0', 'code/0/0#0', 'math/2/0#1'],
    );
    assert.deepEqual(index.unfinished, ['math/0/1#0', 'math/1/0#0', 'math/2/0#0']);
    assert.deepEqual(index.stats, { files: 2, records: 23, tornLines: [] });

    const byId = new Map(index.completed.map((s) => [s.sessionId, s]));
    const math = byId.get('math/0/0#0')!;
    assert.deepEqual(
      {
        rolloutId: math.rolloutId,
        groupId: math.groupId,
        taskName: math.taskName,
        attempt: math.attempt,
        totalReward: math.totalReward,
      },
      { rolloutId: 'math/0/0', groupId: 'math/0', taskName: 'math', attempt: 0, totalReward: 3 },
    );
    assert.deepEqual(
      math.steps.map((s) => s.step),
      [1, 2, 3],
    );

    const restarted = byId.get('math/2/0#1')!;
    assert.equal(restarted.attempt, 1);
    assert.deepEqual(
      restarted.steps.map((s) => [s.attempt, s.step]),
      [
        [1, 1],
        [1, 2],
        [1, 3],
        [1, 4],
      ],
    );

    const continued = byId.get('code/0/0#0')!;
    assert.deepEqual(
      continued.steps.map((s) => [s.step, s.response]),
      [
        [1, 'response 1'],
        [2, 'partial and the rest'],
        [3, 'response 3'],
      ],
    );
    assert.deepEqual(continued.files, [join(dir, 'steps-worker-1.jsonl'), join(dir, 'steps-worker-2.jsonl')]);
    assert.deepEqual(continued.missingSteps, []);

    assert.deepEqual(
      byId.get('duo/0/0#0')!.steps.map((s) => [s.step, s.agentId]),
      [
        [1, 'a'],
        [1, 'b'],
      ],
    );

    assert.deepEqual(await listCompletedSessions(dir), index.completed);
  });

  it('lists step indices a completed session has no record of', async () => {
    const dir = freshDir();
    await writeFile(join(`${dir}.jsonl`), ''); // a sibling file outside dir is not read
    const w = new StepRecordWriter({ dir, fileName: 'w.jsonl' });
    w.record(stepOf('t/0/0', 0, 1));
    w.record(stepOf('t/0/0', 0, 3));
    w.recordEnd(endOf('t/0/0', 0, 3));
    await w.close();
    const [session] = await listCompletedSessions(dir);
    assert.deepEqual(session.missingSteps, [2]);
  });

  it('skips and counts a truncated last line, as left by a crash mid-write', async () => {
    const dir = freshDir();
    const w = new StepRecordWriter({ dir, fileName: 'w.jsonl' });
    w.record(stepOf('t/0/0', 0, 1));
    w.recordEnd(endOf('t/0/0', 0, 1));
    await w.close();
    const torn = JSON.stringify(stepOf('t/1/0', 0, 1)).slice(0, 40);
    await appendFile(w.path, torn);

    const stream = readStepRecords(dir);
    const records: StepRecordLine[] = [];
    for await (const rec of stream) records.push(rec);
    assert.equal(records.length, 2);
    assert.deepEqual(stream.stats.tornLines, [{ file: w.path, line: 3, bytes: Buffer.byteLength(torn) }]);
    assert.deepEqual(
      (await listCompletedSessions(dir)).map((s) => s.sessionId),
      ['t/0/0#0'],
    );
  });

  it('fails on a corrupted middle line, naming the file and line', async () => {
    const dir = freshDir();
    const w = new StepRecordWriter({ dir, fileName: 'w.jsonl' });
    w.record(stepOf('t/0/0', 0, 1));
    await w.close();
    await appendFile(w.path, `{"type":"step", garbage\n${JSON.stringify(stepOf('t/0/0', 0, 2))}\n`);
    await assert.rejects(collect(dir), (err: unknown) => {
      assert.ok(err instanceof StepRecordFormatError);
      assert.equal(err.code, 'ERR_RECORDS_FORMAT');
      assert.equal(err.file, w.path);
      assert.equal(err.line, 2);
      assert.match(err.message, new RegExp(`^${w.path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:2: not valid JSON`));
      return true;
    });
    await assert.rejects(listCompletedSessions(dir), { code: 'ERR_RECORDS_FORMAT' });
  });

  it('fails on a well-formed JSON line that is not a record, naming the file and line', async () => {
    const dir = freshDir();
    const w = new StepRecordWriter({ dir, fileName: 'w.jsonl' });
    w.record(stepOf('t/0/0', 0, 1));
    await w.close();
    const { sessionId: _dropped, ...noSession } = stepOf('t/0/0', 0, 2);
    await appendFile(w.path, `${JSON.stringify(noSession)}\n`);
    await assert.rejects(collect(dir), { message: `${w.path}:2: sessionId must be a non-empty string` });
  });
});

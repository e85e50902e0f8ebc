/**
 * A weight-update pause across worker nodes: every node stops and returns its partial rollouts, the
 * pause report names who answered, a node that joins during the pause starts paused, and the partial
 * rollouts of a node that left continue on another node after the resume.
 */
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { pino } from 'pino';
import { createEngine } from '../../src/index.ts';
import { assertAccounted } from '../support/accounting.ts';
import { requireNatsServer, type NatsServer } from '../support/nats-server.ts';
import { rolloutNode, type LogLine } from './support.ts';

/** The coordinator's log lines, kept in memory, with waits on them (events, not sleeps). */
function capturedLog() {
  const lines: LogLine[] = [];
  let waiters: { pred: (l: LogLine) => boolean; resolve: () => void }[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const text of chunk.toString().split('\n')) {
        if (text === '') continue;
        const line = JSON.parse(text) as LogLine;
        lines.push(line);
        waiters = waiters.filter((w) => (w.pred(line) ? (w.resolve(), false) : true));
      }
      done();
    },
  });
  const until = (pred: (l: LogLine) => boolean): Promise<void> =>
    lines.some(pred) ? Promise.resolve() : new Promise((resolve) => waiters.push({ pred, resolve }));
  return { log: pino({ level: 'debug' }, stream), lines, until };
}

describe('pause and resume across worker nodes', () => {
  let nats: NatsServer;
  before(async () => {
    nats = await requireNatsServer();
  });
  after(async () => {
    await nats.stop();
  });

  it('a pause stops every node and counts their answers; a node joining mid-pause starts paused; partial rollouts continue on another node', async () => {
    const { log, lines, until } = capturedLog();
    const engine = createEngine(
      {
        batchSize: 4,
        mock: { latencyMs: 30, tokensPerSecond: 400, thinkTokens: 8 },
        tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 4, maxSteps: 12 }],
        producer: { strategy: 'async', partialRollout: true, maxStaleness: 2 },
        workers: { nats: { url: nats.url, run: 'pause', ackWaitMs: 5_000 } },
      },
      { log },
    );
    const a = rolloutNode(nats.url, 'pause', 'a');
    const b = rolloutNode(nats.url, 'pause', 'b');
    let c: ReturnType<typeof rolloutNode> | null = null;
    try {
      await engine.start();
      await until((l) => l.msg === 'worker node joined' && l.node === 'a');
      await until((l) => l.msg === 'worker node joined' && l.node === 'b');
      assert.equal((await engine.getBatch(1)).status, 'NORMAL');
      // Both nodes hold groups when the pause lands. Until one of a's comes back with turns played (a
      // pause can land before a group's first turn ends), resume and pause again once more has landed.
      await Promise.all([a, b].map((n) => n.waitFor((l) => l.msg === 'running group', 'running a group')));
      const partialOnA = (l: LogLine) =>
        l.msg === 'group landed' &&
        l.node === 'a' &&
        l.status === 'ABORTED' &&
        (l.turns as number[]).some((t) => t > 0);
      let modelStep = 0;
      for (;;) {
        const report = await engine.pauseForWeightUpdate();
        assert.deepEqual(report.nodes, { answered: ['a', 'b'], missing: [] });
        assert.notEqual(report.workersAckedMs, null, 'every node acknowledged');
        assert.equal(report.stillInFlight, 0);
        if (lines.some(partialOnA) || modelStep === 10) break;
        const landedBefore = lines.filter((l) => l.msg === 'group landed').length;
        await engine.resume({ modelStep: ++modelStep });
        await until(
          (l) => l.msg === 'group landed' && lines.filter((x) => x.msg === 'group landed').length > landedBefore + 1,
        );
      }
      assert.ok(lines.some(partialOnA), 'node a returned a partial rollout on a pause');

      // A node that joins now reads the paused state before it takes anything.
      c = rolloutNode(nats.url, 'pause', 'c', ['--metrics-port', '0']);
      const started = await c.waitFor((l) => l.msg === 'worker node started', 'c started');
      const metrics = await (await fetch(String(started.metrics))).text();
      assert.match(metrics, /rollout_node_state\{field="paused"\} 1/);

      // a leaves: what it started must continue elsewhere.
      assert.equal((await a.kill('SIGTERM')).code, 0);
      await engine.resume({ modelStep: modelStep + 1 });
      for (const step of [2, 3]) assert.equal((await engine.getBatch(step)).status, 'NORMAL');

      const landed = lines.filter((l) => l.msg === 'group landed') as (LogLine & {
        group: string;
        node: string;
        status: string;
        turns: number[];
      })[];
      const continued = landed.filter((early) => {
        if (early.node !== 'a' || early.status !== 'ABORTED' || !early.turns.some((t) => t > 0)) return false;
        return landed.some(
          // Every member keeps the turns it had: continued, not restarted. A member whose last turn was
          // cut mid-generation finishes that turn without adding one, so the counts may stay equal.
          (late) =>
            late.group === early.group &&
            late.node !== 'a' &&
            late.status === 'COMPLETED' &&
            late.turns.every((t, i) => t >= early.turns[i]),
        );
      });
      assert.ok(
        continued.length > 0,
        `a partial rollout started on node a and finished on b or c:\n${JSON.stringify(landed.slice(0, 40))}`,
      );
      const stats = await engine.stats();
      assertAccounted(stats);
      assert.deepEqual((stats.nodes ?? []).map((n) => n.id).sort(), ['b', 'c']);
    } finally {
      await engine.close();
      await Promise.all([a, b, ...(c ? [c] : [])].map((n) => n.kill('SIGTERM')));
    }
  });
});

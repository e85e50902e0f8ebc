/**
 * NATS restarts while worker nodes hold a run. Regression: a resume whose "running" control state
 * could not be written (nats-server down) was never written again; the nodes stayed paused for ever,
 * every group came back ABORTED at once and was sent again — hundreds of thousands of dispatches and
 * `accepted` keys in minutes, and no batch again, with no error.
 */
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { connect } from '@nats-io/transport-node';
import { jetstreamManager } from '@nats-io/jetstream';
import { pino } from 'pino';
import { createEngine } from '../../src/index.ts';
import { runNames } from '../../src/cluster/names.ts';
import { assertAccounted } from '../support/accounting.ts';
import { requireNatsServer, type NatsServer } from '../support/nats-server.ts';
import { rolloutNode, type LogLine } from './support.ts';

function capturedLog() {
  const lines: LogLine[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const text of chunk.toString().split('\n')) if (text !== '') lines.push(JSON.parse(text) as LogLine);
      done();
    },
  });
  return { log: pino({ level: 'debug' }, stream), lines };
}

describe('worker nodes when NATS blinks: a restart, a shared run name', () => {
  let nats: NatsServer;
  before(async () => {
    nats = await requireNatsServer();
  });
  after(async () => {
    await nats.stop();
  });

  it('a resume sent while nats-server is down reaches the nodes once it is back, and no group is sent again in a loop meanwhile', async () => {
    const { log, lines } = capturedLog();
    const engine = createEngine(
      {
        batchSize: 4,
        mock: { latencyMs: 20, tokensPerSecond: 400, thinkTokens: 8 },
        tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 4, maxSteps: 6 }],
        producer: { strategy: 'async', partialRollout: true, maxStaleness: 2 },
        workers: { nats: { url: nats.url, run: 'restart', ackWaitMs: 5_000 } },
      },
      { log },
    );
    const a = rolloutNode(nats.url, 'restart', 'a');
    try {
      await engine.start();
      assert.equal((await engine.getBatch(1)).status, 'NORMAL');
      await engine.pauseForWeightUpdate();
      const ranBefore = a.count((l) => l.msg === 'running group');
      await nats.restart(async () => {
        // The trainer's resume while no NATS server listens: answered, and kept until it is written.
        await engine.resume({ modelStep: 1 });
      });
      await a.waitFor(
        (l) => l.msg === 'control state applied' && l.state === 'running' && l.modelStep === 1,
        'the resume applied on the node',
        30_000,
      );
      for (const step of [2, 3]) assert.equal((await engine.getBatch(step)).status, 'NORMAL');
      // Two batches of 4 groups with over-sampling and a pause's returns: tens of runs, not thousands.
      const ran = a.count((l) => l.msg === 'running group') - ranBefore;
      assert.ok(ran < 100, `node a ran ${ran} groups for two batches of 4`);
      assert.ok(
        lines.some((l) => l.msg === 'control state written to NATS again' && l.state === 'running'),
        'the coordinator said the control state was written once NATS was back',
      );
      assertAccounted(await engine.stats());
    } finally {
      await engine.close();
      await a.kill('SIGTERM');
    }
  });

  it('refuses a second coordinator on a run name a live one holds, naming it, and leaves the first running', async () => {
    const config = {
      batchSize: 2,
      mock: { latencyMs: 5 },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 2, maxSteps: 4 }],
      workers: { nats: { url: nats.url, run: 'shared' } },
    };
    const first = createEngine(config, { log: pino({ level: 'silent' }) });
    const a = rolloutNode(nats.url, 'shared', 'a');
    try {
      await first.start();
      assert.equal((await first.getBatch(1)).status, 'NORMAL');
      const second = createEngine(config, { log: pino({ level: 'silent' }) });
      await assert.rejects(second.start(), (err: Error & { code?: string }) => {
        assert.equal(err.code, 'ERR_NATS_RUN_IN_USE');
        assert.match(
          err.message,
          new RegExp(
            `workers\\.nats\\.run "shared" on ${nats.url} is held by a live coordinator \\(\\S+ pid ${process.pid}, since `,
          ),
        );
        return true;
      });
      await second.close();
      // The refused one touched nothing: the first's streams and groups are as they were.
      assert.equal((await first.getBatch(2)).status, 'NORMAL');
    } finally {
      await first.close();
    }
    // Closed, the run is free again at once.
    const third = createEngine(config, { log: pino({ level: 'silent' }) });
    try {
      await third.start();
      assert.equal((await third.getBatch(1)).status, 'NORMAL');
    } finally {
      await third.close();
      await a.kill('SIGTERM');
    }
  });

  it('keeps the accepted-dispatch bucket bounded in keys, dropping the oldest first', async () => {
    const engine = createEngine(
      {
        batchSize: 1,
        mock: { latencyMs: 1 },
        tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 1, maxSteps: 2 }],
        workers: { nats: { url: nats.url, run: 'bounded' } },
      },
      { log: pino({ level: 'silent' }) },
    );
    await engine.start();
    const nc = await connect({ servers: nats.url });
    try {
      const info = await (await jetstreamManager(nc)).streams.info(`KV_${runNames('bounded').acceptedBucket}`);
      assert.ok(info.config.max_msgs > 0, `max_msgs ${info.config.max_msgs}`);
      assert.equal(info.config.discard, 'old');
    } finally {
      await nc.close();
      await engine.close();
    }
  });
});

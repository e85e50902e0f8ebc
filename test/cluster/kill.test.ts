/**
 * Issue 19's kill test: nats-server, a coordinator (`rollout run --nats`) and three node processes on
 * loopback; one node SIGKILLed mid-group, then the coordinator SIGKILLed mid-run and resumed. Every
 * train step once, every group id once, every group accounted for.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { readCheckpoint } from '../../src/coordinator/checkpoint.ts';
import { resolveConfig } from '../../src/config.ts';
import { assertEveryStepOnce, readBatches } from '../support/batches.ts';
import { requireNatsServer, type NatsServer } from '../support/nats-server.ts';
import { LoggedProcess, rolloutNode, type LogLine } from './support.ts';

const STEPS = 8;
const BATCH = 4;

describe('worker nodes survive kills', () => {
  let nats: NatsServer;
  before(async () => {
    nats = await requireNatsServer();
  });
  after(async () => {
    await nats.stop();
  });

  it('a node SIGKILLed mid-group and a coordinator SIGKILLed mid-run and resumed: every train step once, every group id once, every group accounted for', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rollout-cluster-kill-'));
    const runDir = join(dir, 'run');
    const configPath = join(dir, 'config.json');
    const config = {
      batchSize: BATCH,
      // Slow enough (≈ 30 ms a call, 400 tokens/s) that groups are mid-flight when the kills land.
      mock: { latencyMs: 30, tokensPerSecond: 400, thinkTokens: 8 },
      producer: { strategy: 'async', partialRollout: true, maxStaleness: 1 },
      workers: { nats: { url: nats.url, run: 'kill', ackWaitMs: 1_500, maxDeliver: 6, nodeStaleMs: 3_000 } },
    };
    writeFileSync(configPath, JSON.stringify(config));
    const nodes = ['n1', 'n2', 'n3'].map((id) => rolloutNode(nats.url, 'kill', id));
    const runArgs = ['run', '--config', configPath, '--run-dir', runDir, '--steps', String(STEPS)];
    const isBatch = (l: LogLine) => l.msg === 'batch ready';
    const coordinators: LoggedProcess[] = [];
    try {
      const first = new LoggedProcess(runArgs, { LOG_LEVEL: 'info' });
      coordinators.push(first);
      // n1 takes a group: kill it while it runs it.
      await Promise.race([
        nodes[0].waitFor((l) => l.msg === 'running group', 'n1 running a group'),
        first.waitFor(() => false, 'of any kind'),
      ]);
      await nodes[0].kill('SIGKILL');
      // Its group comes back to another node after the ack wait (a second delivery)...
      await Promise.race(
        nodes
          .slice(1)
          .map((n) =>
            n.waitFor((l) => l.msg === 'running group' && Number(l.delivery) >= 2, 'a group delivered again'),
          ),
      );
      // ...and once a batch was taken after that, the coordinator dies mid-run.
      const batchesBefore = first.count(isBatch);
      await first.waitFor((l) => isBatch(l) && first.count(isBatch) > batchesBefore, 'a batch after the redelivery');
      assert.ok(first.count(isBatch) < STEPS, 'the coordinator is killed before the run ends');
      await first.kill('SIGKILL');
      const resumed = new LoggedProcess([...runArgs, '--resume'], { LOG_LEVEL: 'info' });
      coordinators.push(resumed);
      const { code } = await resumed.exited;
      assert.equal(code, 0, resumed.stderr.slice(-4000));
      for (const node of nodes.slice(1))
        assert.equal(
          (await node.kill('SIGTERM')).code,
          0,
          `a node drains and exits 0 on SIGTERM:\n${node.stderr.slice(-3000)}`,
        );
    } finally {
      await Promise.all([...nodes, ...coordinators].map((p) => p.kill('SIGKILL')));
    }

    const groups = readBatches(runDir);
    assertEveryStepOnce(groups, STEPS, BATCH);
    assert.ok(groups.every((g) => g.status === 'COMPLETED'));
    // The final checkpoint: scheduled = in flight + in the buffer + taken + dropped.
    const snapshot = readCheckpoint(join(runDir, 'engine.ckpt'), resolveConfig(config, { baseDir: dir }));
    const { counts } = snapshot;
    const dropped = Object.values(counts.dropped).reduce((a, b) => a + b, 0);
    assert.equal(counts.taken, STEPS * BATCH);
    assert.equal(
      counts.scheduled,
      snapshot.inFlight.length + snapshot.buffer.groups.length + counts.taken + dropped,
      JSON.stringify(counts),
    );
  });
});

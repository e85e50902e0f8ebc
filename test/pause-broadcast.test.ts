/**
 * The weight-update pause as it travels: the main thread's PauseControl writes the shared control
 * block (src/coordinator/pause-control.ts), each worker's PauseGate reads it (src/worker/pause-gate.ts).
 */
import assert from 'node:assert/strict';
import { describe, it, type TestContext } from 'node:test';
import { PauseControl } from '../src/coordinator/pause-control.ts';
import { PauseSequence } from '../src/coordinator/pause-sequence.ts';
import type { WorkerPool } from '../src/coordinator/worker-pool.ts';
import { resolveConfig } from '../src/config.ts';
import { DIALECTS } from '../src/llm/servers.ts';
import { createLogger } from '../src/log.ts';
import { RunState, wallClockUs } from '../src/protocol/control-block.ts';
import { startMockLlm } from '../src/mock-llm/server.ts';
import { scriptedServer } from './support/http.ts';
import { PauseGate } from '../src/worker/pause-gate.ts';

describe('pause broadcast: the last-send clock', () => {
  it('measures a pause by the last call a worker sent after the request, 0 when none was', () => {
    const control = new PauseControl(0);
    const gate = new PauseGate(control.block);
    gate.noteSend();
    const requested = wallClockUs();
    control.pause();
    assert.equal(control.lastSendAfterMs(requested), 0);
    const later = wallClockUs() - 5_000n; // a send stamped 5 ms after a request made then
    gate.noteSend();
    assert.ok(control.lastSendAfterMs(later) >= 5);
    gate.close();
  });
});

describe('pause broadcast: the worker gate', () => {
  it('gives a call made in the tick of a resume fresh hold and cancel signals, before its watcher has run (regression)', async () => {
    const control = new PauseControl(0);
    const gate = new PauseGate(control.block);
    control.pause();
    control.cancel();
    await control.waitForAcks(1, 5_000);
    assert.ok(gate.hold.aborted && gate.signal.aborted);
    control.resume(1);
    // The watcher has not run yet: the shared state says RUNNING, and the signals follow it.
    assert.equal(gate.paused, false);
    assert.equal(gate.hold.aborted, false);
    assert.equal(gate.signal.aborted, false);
    gate.close();
  });

  it('holds before it cancels when a worker sees the pause and its escalation at once (streamed calls keep their tokens)', async () => {
    const control = new PauseControl(0);
    const gate = new PauseGate(control.block);
    const order: string[] = [];
    gate.hold.addEventListener('abort', () => order.push('hold'));
    gate.signal.addEventListener('abort', () => order.push('cancel'));
    control.pause();
    control.cancel(); // both written before the worker's watcher runs
    await control.waitForAcks(1, 5_000);
    assert.deepEqual(order, ['hold', 'cancel']);
    gate.close();
  });
});

describe('pause sequence: in place, and its fall back to an abort', () => {
  const config = resolveConfig({ logLevel: 'silent', pause: { mode: 'in-place' } });
  const pool = { liveWorkers: 0, flush: async () => {} } as unknown as WorkerPool;
  const watch = { inFlight: () => 0, landedWithin: async () => {}, stillPausing: () => true };
  const routes = DIALECTS.sglang.pauseInPlace!;

  /** A pause sequence for SGLang-style endpoints at `urls`, no abort route, no workers. */
  function inPlaceSequence(t: TestContext, urls: string[]) {
    const control = new PauseControl(0);
    const sequence = new PauseSequence({
      config,
      control,
      pool,
      log: createLogger('silent'),
      abortTargets: [],
      inPlaceTargets: urls.map((url) => ({ url, routes })),
      endpointCount: urls.length,
    });
    t.after(() => sequence.close());
    return { control, sequence };
  }

  it('continues the servers that did pause before aborting, and only them, when another refuses to pause in place (regression: they held their aborted calls)', async (t) => {
    const sglang = await startMockLlm({ port: 0, dialect: 'sglang', latencyMs: 0 });
    t.after(() => sglang.close());
    const refusing = await scriptedServer((req, res) => {
      res.writeHead(req.url === '/pause_generation' ? 500 : 200, { 'content-type': 'application/json' }).end('{}');
    });
    t.after(() => refusing.close());
    const { control, sequence } = inPlaceSequence(t, [sglang.url, refusing.url]);
    const report = await sequence.run(watch);
    assert.equal(report.inPlace, false);
    assert.equal(control.state, RunState.PAUSED, 'an abort-mode pause from then on');
    assert.deepEqual(
      refusing.requests.map((r) => r.path),
      ['/pause_generation'],
      'a server that refused was never paused: it is not continued',
    );
    // The SGLang server generates again: a request is answered instead of waiting for a continue.
    const answer = await fetch(`${sglang.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'Compute 2 + 3.' }] }),
    });
    assert.equal(answer.status, 200);
    await answer.body?.cancel();
    // The next pause aborts at once, without asking again.
    await sequence.run(watch);
    assert.equal(refusing.requests.filter((r) => r.path === '/pause_generation').length, 1);
  });

  it('continues a server that did not answer the pause, which may have paused all the same', async (t) => {
    const silent = await scriptedServer((req, res) => {
      if (req.url === '/pause_generation') res.socket?.destroy();
      else res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
    t.after(() => silent.close());
    const { sequence } = inPlaceSequence(t, [silent.url]);
    assert.equal((await sequence.run(watch)).inPlace, false);
    assert.deepEqual(
      silent.requests.map((r) => r.path),
      ['/pause_generation', '/continue_generation'],
    );
  });

  it('still continues a server left paused by a failed continue when it refuses the next pause (regression: it was dropped from the list)', async (t) => {
    // Pause 1 is answered 200; every continue fails until the third pause has been asked; pause 2 is refused.
    let pauses = 0;
    const flaky = await scriptedServer((req, res) => {
      if (req.url === '/pause_generation') pauses++;
      const ok = req.url === '/pause_generation' ? pauses === 1 : pauses >= 2;
      res.writeHead(ok ? 200 : 500, { 'content-type': 'application/json' }).end('{}');
    });
    t.after(() => flaky.close());
    const { sequence } = inPlaceSequence(t, [flaky.url]);
    assert.equal((await sequence.run(watch)).inPlace, true);
    await sequence.continueServers(); // 3 attempts, all refused: the server stays paused and listed
    assert.equal((await sequence.run(watch)).inPlace, false);
    const paths = flaky.requests.map((r) => r.path);
    assert.deepEqual(paths.slice(paths.lastIndexOf('/pause_generation')), [
      '/pause_generation',
      '/continue_generation',
    ]);
  });

  it('leaves the shared flag running when a resume came while the servers were being asked to pause', async (t) => {
    const refusing = await scriptedServer((_req, res) => res.writeHead(500).end());
    t.after(() => refusing.close());
    const { control, sequence } = inPlaceSequence(t, [refusing.url]);
    let pausing = true;
    const run = sequence.run({ ...watch, stillPausing: () => pausing });
    pausing = false; // the trainer resumed while the pause request was on its way
    control.resume(1);
    await run;
    assert.equal(control.state, RunState.RUNNING);
  });
});

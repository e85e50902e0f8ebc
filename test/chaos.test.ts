/**
 * Chaos: the engine against faulty inference, faulty environments and a worker that dies, with a
 * trainer pausing for weight updates — and at the end every group it ever sampled is accounted for.
 *
 * First the mock inference server's fault knobs themselves (they are what the chaos run relies on),
 * then the run (bounded: well under a minute), then what the faults turned up, then a run through a
 * 30 s inference outage (a proxy answering 503, then refusing connections).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { request } from 'undici';
import { createEngine, Status, type Batch, type Engine, type EngineStats, type PauseReport } from '../src/index.ts';
import { startMockLlm, type MockLlm, type MockLlmOptions } from '../src/mock-llm/server.ts';
import { KILL_EXIT_CODE } from './fixtures/chaos-env.ts';
import { OutageProxy } from './fixtures/outage-proxy.ts';
import { spawnServer, type ChildServer } from './fixtures/flaky-env-server.ts';
import { assertAccounted } from './support/accounting.ts';
import { llmClient } from './support/clients.ts';
import { deferred, within } from './support/waits.ts';

const MAIN = new URL('../src/cli/main.ts', import.meta.url).pathname;
const CHAOS_ENV = new URL('./fixtures/chaos-env.ts', import.meta.url).pathname;
const WORKER_START = new URL('./fixtures/chaos-worker-start.ts', import.meta.url).pathname;
const CHAT_BODY = JSON.stringify({
  model: 'm',
  messages: [{ role: 'user', content: 'Say something.' }],
  max_tokens: 16,
  logprobs: true,
  return_token_ids: true,
});

/**
 * One chat completion with undici; a transport failure comes back as its error code, giving up after
 * `timeoutMs` as 'TimeoutError' (an AbortSignal: undici's own timeouts tick every half second or so),
 * or as soon as `giveUp` aborts.
 */
async function rawChat(
  mock: MockLlm,
  timeoutMs = 30_000,
  giveUp?: AbortSignal,
): Promise<{
  status: number | string;
  headers: Record<string, unknown>;
  body: string | null;
  bodyError: string | null;
}> {
  // undici errors carry a string code; the signal's TimeoutError (a DOMException) a numeric one, so its name.
  const code = (err: unknown) => {
    const c = (err as { code?: unknown }).code;
    return typeof c === 'string' ? c : ((err as Error).name ?? 'unknown');
  };
  try {
    const res = await request(`${mock.url}/v1/chat/completions`, {
      method: 'POST',
      body: CHAT_BODY,
      headers: { 'content-type': 'application/json' },
      signal:
        giveUp === undefined
          ? AbortSignal.timeout(timeoutMs)
          : AbortSignal.any([giveUp, AbortSignal.timeout(timeoutMs)]),
    });
    try {
      return { status: res.statusCode, headers: res.headers, body: await res.body.text(), bodyError: null };
    } catch (err) {
      return { status: res.statusCode, headers: res.headers, body: null, bodyError: code(err) };
    }
  } catch (err) {
    return { status: code(err), headers: {}, body: null, bodyError: null };
  }
}

describe('mock inference server fault knobs', () => {
  const mocks: MockLlm[] = [];
  async function mock(options: MockLlmOptions): Promise<MockLlm> {
    const m = await startMockLlm(options);
    mocks.push(m);
    return m;
  }
  after(async () => {
    await Promise.all(mocks.map((m) => m.close()));
  });

  it('refuses a rate outside [0, 1], a rate that is not a number, and rates that sum to more than 1, naming them', async () => {
    await assert.rejects(startMockLlm({ rateLimitRate: 1.5 }), {
      message: 'mock-llm: option rateLimitRate must be in [0, 1] (got 1.5)',
    });
    await assert.rejects(startMockLlm({ hangRate: '0.1' as never }), {
      message: 'mock-llm: option hangRate must be a finite number (got "0.1")',
    });
    await assert.rejects(startMockLlm({ truncateRate: -0.1 }), /option truncateRate must be in \[0, 1\] \(got -0\.1\)/);
    // One die per request: overlapping bands cannot be honoured, so they are refused rather than skewed.
    await assert.rejects(startMockLlm({ errorRate: 0.6, resetRate: 0.3, malformedRate: 0.2 }), {
      message:
        'mock-llm: fault rates must sum to at most 1 (got errorRate=0.6 + resetRate=0.3 + malformedRate=0.2 = 1.1)',
    });
    const ok = await mock({
      errorRate: 0.5,
      rateLimitRate: 0.1,
      resetRate: 0.1,
      hangRate: 0.1,
      malformedRate: 0.1,
      truncateRate: 0.1,
    });
    assert.equal(ok.options.truncateRate, 0.1);
  });

  it('answers 429 with Retry-After: 0 under rateLimitRate', async () => {
    const m = await mock({ rateLimitRate: 1 });
    const res = await rawChat(m);
    assert.equal(res.status, 429);
    assert.equal(res.headers['retry-after'], '0');
    assert.equal(JSON.parse(res.body!).error.type, 'rate_limit_error');
    assert.equal(m.stats().faults.rateLimit, 1);
  });

  it('resets the connection without an answer under resetRate', async () => {
    const m = await mock({ resetRate: 1 });
    const res = await rawChat(m);
    assert.ok(res.status === 'ECONNRESET' || res.status === 'UND_ERR_SOCKET', `got ${res.status}`);
    assert.equal(m.stats().faults.reset, 1);
  });

  it('answers 200 with a body that is not JSON, its length declared exactly, under malformedRate', async () => {
    const m = await mock({ malformedRate: 1 });
    const res = await rawChat(m);
    assert.equal(res.status, 200);
    assert.equal(Number(res.headers['content-length']), Buffer.byteLength(res.body!));
    assert.throws(() => JSON.parse(res.body!), SyntaxError);
    assert.equal(m.stats().faults.malformed, 1);
  });

  it('declares a longer body than it sends, then cuts the connection mid-body, under truncateRate', async () => {
    const m = await mock({ truncateRate: 1 });
    const res = await rawChat(m);
    assert.equal(res.status, 200);
    assert.ok(Number(res.headers['content-length']) > 0);
    assert.equal(res.bodyError, 'UND_ERR_SOCKET');
    assert.equal(m.stats().faults.truncate, 1);
  });

  it('holds a request under hangRate until the client gives up, ignoring /admin/abort, and close() cuts the held ones', async () => {
    const m = await startMockLlm({ hangRate: 1 });
    try {
      assert.equal((await rawChat(m, 100)).status, 'TimeoutError');
      // The server hears of the hang-up a moment after the client gives up.
      await within(
        5_000,
        'a client that hung up releases its request',
        m.waitForStats((s) => s.hanging === 0),
      );
      assert.equal(m.stats().hanging, 0, 'a client that hung up releases its request');
      const held = rawChat(m, 60_000);
      await within(
        5_000,
        'the second request is held',
        m.waitForStats((s) => s.hanging === 1),
      );
      const abort = await request(`${m.url}/admin/abort`, { method: 'POST' });
      assert.deepEqual(await abort.body.json(), { aborted: 0 });
      assert.equal(m.stats().hanging, 1, 'a stuck request ignores the server-side abort');
      const start = performance.now();
      await m.close();
      // The held request's own timeout is 60 s: a close that waited for it would take that long.
      assert.ok(performance.now() - start < 20_000, 'close() does not wait for held requests');
      const res = await held;
      assert.ok(typeof res.status === 'string', `the held request failed at transport level (got ${res.status})`);
      assert.equal(m.stats().faults.hang, 2);
    } finally {
      await m.close();
    }
  });

  it('faults the same requests for the same seed, other requests for another seed, and draws every kind', async () => {
    const rates = {
      errorRate: 0.1,
      rateLimitRate: 0.1,
      resetRate: 0.1,
      hangRate: 0.1,
      malformedRate: 0.1,
      truncateRate: 0.1,
    };
    const outcomes = async (seed: number) => {
      const m = await mock({ ...rates, seed });
      const seen: string[] = [];
      for (let i = 0; i < 40; i++) {
        // Give up on a request as soon as the server says it holds it, not after a short timer that a
        // loaded machine's ordinary replies can outlast (30 ms was, on a busy 2-core machine).
        const held = new AbortController();
        const hung = m.stats().faults.hang;
        void m
          .waitForStats((s) => s.faults.hang > hung)
          .then(() => held.abort(new DOMException('the mock holds the request', 'TimeoutError')));
        const res = await rawChat(m, 60_000, held.signal);
        seen.push(
          res.bodyError ??
            (res.status === 200 && res.body !== null && !isJson(res.body) ? 'not-json' : String(res.status)),
        );
      }
      return { seen, faults: m.stats().faults };
    };
    const a = await outcomes(7);
    const b = await outcomes(7);
    const c = await outcomes(8);
    assert.deepEqual(a.seen, b.seen);
    assert.notDeepEqual(a.seen, c.seen);
    for (const [kind, n] of Object.entries(a.faults)) assert.ok(n > 0, `no ${kind} fault in 40 requests at 10%`);
    assert.deepEqual(
      new Set(a.seen),
      new Set(['200', '500', '429', 'ECONNRESET', 'TimeoutError', 'not-json', 'UND_ERR_SOCKET']),
    );
  });

  it('becomes a named LlmError in the engine client for each fault, transient ones retried, 429 at once per Retry-After', async () => {
    const expected: [keyof MockLlmOptions, string, boolean][] = [
      ['errorRate', 'ERR_LLM_HTTP', true],
      ['rateLimitRate', 'ERR_LLM_HTTP', true],
      ['resetRate', 'ERR_LLM_UNREACHABLE', true],
      ['truncateRate', 'ERR_LLM_UNREACHABLE', true],
      ['hangRate', 'ERR_LLM_TIMEOUT', false],
      ['malformedRate', 'ERR_LLM_BAD_REPLY', false],
    ];
    for (const [knob, code, retried] of expected) {
      const m = await mock({ [knob]: 1 });
      // A long backoff (30 s, then 60 s): only the 429's Retry-After: 0 lets its retries run at once.
      const client = llmClient(m.url, {
        timeoutMs: 200,
        retries: 2,
        retryBackoffMs: knob === 'rateLimitRate' ? 30_000 : 1,
      });
      const start = performance.now();
      await assert.rejects(
        client.chat({ messages: [{ role: 'user', content: 'hi' }], maxTokens: 8, temperature: 1 }),
        (err: Error & { code?: string }) => {
          assert.equal(err.code, code, `${knob}: ${err.message}`);
          return true;
        },
      );
      if (knob === 'rateLimitRate')
        assert.ok(performance.now() - start < 15_000, 'Retry-After: 0 is honoured over the backoff');
      assert.equal(m.stats().requests, retried ? 3 : 1, `${knob}: attempts`);
      await client.close();
    }
  });
});

function isJson(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

// ── the chaos run ─────────────────────────────────────────────────────────────────────────────────

/** Inference faults per request: transient (500, 429, reset, truncated: retried) and fatal to the rollout (hang, malformed). */
const INFERENCE_FAULTS = {
  errorRate: 0.05,
  rateLimitRate: 0.05,
  resetRate: 0.02,
  hangRate: 0.01,
  malformedRate: 0.02,
  truncateRate: 0.02,
};
const ENV_FAULTS = ['--fail-rate', '0.02', '--hang-rate', '0.005', '--drop-reply-rate', '0.01'];
const STEPS = 14;
/** Dataset line (0-based) of the local task that kills its worker, once. */
const KILL_LINE = 5;
/** Dataset lines of the local task whose step() never settles, every time they are drawn. */
const HANG_LINES = [12, 27];
/** The local task's tasks[].env.timeoutMs: what ends a hung step. */
const ENV_TIMEOUT_MS = 500;

/** The error code of a failure reason (`ERR_LLM_TIMEOUT: …`), or its first words. */
function reasonKey(reason: string | null): string {
  if (reason === null) return '(none)';
  const exit = /exited with code:? ?(\d+)/.exec(reason);
  if (exit !== null) return `worker died (exit code ${exit[1]})`;
  return /ERR_[A-Z_]+/.exec(reason)?.[0] ?? reason.slice(0, 40);
}

// Whole replies, then streamed ones (llm.stream): the faults then hit event streams (half a last
// event, a stream cut before its end), and pauses hold the calls in flight with their tokens.
for (const stream of [false, true])
  describe(`chaos: faulty inference, faulty environments, a hung environment and a dying worker, with weight updates${stream ? ', replies streamed' : ''}`, {
    timeout: 120_000,
  }, () => {
    let mock: MockLlm;
    let envServer: ChildServer;
    let engine: Engine;
    let dir: string;
    /** What the producer told us, group by group (the engine's observer hook). */
    const seen = {
      failureReasons: new Map<string, { count: number; example: string }>(),
      /** Failures that say why, by code: the code alone is shared (an env server's HTTP timeout is ERR_ENV_TIMEOUT too). */
      failureMessages: [] as string[],
      droppedWithoutReason: 0,
      pauses: [] as PauseReport[],
    };

    before(async () => {
      dir = mkdtempSync(join(tmpdir(), 'chaos-'));
      // The kill line, among lines that let the arithmetic env draw its expression from the seed.
      const lines = Array.from({ length: 40 }, (_, i) =>
        JSON.stringify(i === KILL_LINE ? { kill: true } : HANG_LINES.includes(i) ? { hang: true } : {}),
      );
      writeFileSync(join(dir, 'local.jsonl'), lines.join('\n'));
      // Slow enough (prefill 15 ms, 1500 tokens/s) that pauses find generations in flight to abort.
      mock = await startMockLlm({
        port: 0,
        seed: 11,
        latencyMs: 15,
        tokensPerSecond: 1500,
        streamIntervalMs: 5,
        ...INFERENCE_FAULTS,
      });
      envServer = await spawnServer(
        process.execPath,
        [
          '--import',
          'tsx',
          MAIN,
          'env-server',
          '--env',
          'guess-number=builtin:guess-number',
          '--params',
          '{"max": 20}',
          '--port',
          '0',
          ...ENV_FAULTS,
        ],
        /listening on (http:\/\/\S+)/,
      );
    });
    after(async () => {
      await engine?.close();
      await Promise.all([envServer?.stop(), mock?.close()]);
      rmSync(dir, { recursive: true, force: true });
    });

    it('keeps producing NORMAL batches of COMPLETED groups and accounts for every group it sampled', async () => {
      const started = performance.now();
      engine = createEngine(
        {
          logLevel: 'silent',
          seed: 5,
          batchSize: 8,
          llm: { url: mock.url, timeoutMs: 1_000, retries: 3, retryBackoffMs: 5, stream },
          workers: { threads: 2, groupsPerWorker: 12 },
          producer: {
            strategy: 'async',
            partialRollout: true,
            maxStaleness: 1,
            syncWeightsInterval: 2,
            overSampleThreshold: 0.25,
            // With these rates about a third of the groups fail (any member's fatal fault fails its group): a budget
            // sized for that, so the run shows production going on rather than the budget's refusal.
            maxFailedGroupsPerStep: 200,
          },
          pause: { mode: 'abort', resignalIntervalMs: 200, timeoutMs: 2_000 },
          tasks: [
            {
              name: 'remote',
              env: {
                http: {
                  urls: [envServer.url],
                  name: 'guess-number',
                  timeoutMs: 1_000,
                  retries: 2,
                  retryBackoffMs: 5,
                  dedupeSteps: true,
                },
                poolSize: 24,
              },
              groupSize: 4,
              maxSteps: 6,
              maxTokens: 48,
            },
            {
              name: 'local',
              env: { module: CHAOS_ENV, params: { marker: join(dir, 'killed') }, timeoutMs: ENV_TIMEOUT_MS },
              dataset: join(dir, 'local.jsonl'),
              groupSize: 4,
              maxSteps: 1,
              maxTokens: 48,
            },
          ],
        },
        {
          observer: {
            dropped(group, reason) {
              if (reason !== 'FAILED') return;
              const why = group.error ?? group.rollouts.find((r) => r.error !== null)?.error ?? null;
              if (why === null) seen.droppedWithoutReason++;
              const key = reasonKey(why);
              const entry = seen.failureReasons.get(key) ?? { count: 0, example: why ?? '' };
              entry.count++;
              seen.failureReasons.set(key, entry);
              if (why !== null) seen.failureMessages.push(why);
            },
            paused: (report) => void seen.pauses.push(report),
          },
        },
      );
      await engine.start();

      // The trainer: STEPS batches; weights synced every 2 steps, and whenever the engine says they are too stale.
      const taken = new Map<string, number>();
      const notNormal: { step: number; status: Batch['status'] }[] = [];
      let modelStep = 0;
      let continued = 0;
      const sync = async (to: number) => {
        await engine.pauseForWeightUpdate();
        mock.setWeightVersion(to); // "load" the new weights into the inference server
        await engine.resume({ modelStep: to });
        modelStep = to;
      };
      for (let step = 1; step <= STEPS; ) {
        // A hang must show as a failed assertion naming the step, not as the test's timeout.
        const batch = await Promise.race([
          engine.getBatch(step),
          sleep(30_000, undefined, { ref: false }).then(async () =>
            assert.fail(
              `getBatch(${step}) did not answer within 30 s: ${JSON.stringify((await engine.stats()).groups)}`,
            ),
          ),
        ]);
        if (batch.status !== 'NORMAL') {
          notNormal.push({ step, status: batch.status });
          assert.ok(notNormal.length <= STEPS, `too many non-NORMAL answers: ${JSON.stringify(notNormal)}`);
          await sync(Math.max(modelStep, step - 1));
          continue;
        }
        assert.equal(batch.groups.length, 8);
        for (const group of batch.groups) {
          assert.equal(
            taken.has(group.id),
            false,
            `group ${group.id} taken twice (steps ${taken.get(group.id)} and ${step})`,
          );
          taken.set(group.id, step);
          assert.equal(group.status, Status.COMPLETED);
          for (const r of group.rollouts) {
            assert.equal(r.status, Status.COMPLETED, `${r.id}: ${r.status} ${r.error}`);
            if (new Set(r.turns.flatMap((t) => Array.from(t.modelSteps ?? []))).size > 1) continued++;
          }
        }
        assertAccounted(await engine.stats(), `after step ${step}`);
        if (step % 2 === 0) await sync(step);
        step++;
      }

      // Bring everything home, then count once more: nothing in flight, nothing lost.
      const finalPause = await engine.pauseForWeightUpdate();
      const stats = await engine.stats();
      assertAccounted(stats, 'at the end');
      const seconds = (performance.now() - started) / 1000;
      printCounts(stats, { taken: taken.size, continued, notNormal, seconds, stillInFlight: finalPause.stillInFlight });

      assert.equal(taken.size, STEPS * 8);
      assert.ok(existsSync(join(dir, 'killed')), 'the kill line was drawn and its worker died');
      // The env server went through its own faults (hung connections included) and still answers.
      // (its fault injection covers /envs too, so one answer may be an injected 500: ask a few times)
      let envsStatus = 0;
      for (let i = 0; i < 10 && envsStatus !== 200; i++) {
        const res = await request(`${envServer.url}/envs`, { signal: AbortSignal.timeout(2_000) }).catch(() => null);
        envsStatus = res?.statusCode ?? 0;
        await res?.body.dump();
      }
      assert.equal(envsStatus, 200);
      assert.equal(seen.droppedWithoutReason, 0, 'every failed group carries its reason');
      // Exactly one worker died, once: the marker file was claimed, and the groups it held failed naming exit code 86.
      const deaths = [...seen.failureReasons.keys()].filter((k) => k.startsWith('worker died'));
      assert.deepEqual(
        deaths,
        [`worker died (exit code ${KILL_EXIT_CODE})`],
        `failure reasons: ${[...seen.failureReasons.keys()].join(', ')}`,
      );
      // Only the group whose rollout was stepping the kill line failed with it: the others on that worker were sent again.
      const death = seen.failureReasons.get(deaths[0])!;
      assert.equal(death.count, 1, `groups failed by the worker's death: ${death.count} (e.g. ${death.example})`);
      assert.match(death.example, /was in its environment step\(\) when the worker died/);
      // The hung lines failed their groups on the bound, naming it, and production went on. The code is
      // shared with the env server's HTTP timeouts, so the bound is looked for among every message.
      const onBound = new RegExp(
        `task "local": environment step\\(\\) did not settle within ${ENV_TIMEOUT_MS} ms \\(tasks\\[\\]\\.env\\.timeoutMs\\)`,
      );
      assert.ok(
        seen.failureMessages.some((m) => onBound.test(m)),
        `no group failed on tasks[].env.timeoutMs: ${[...seen.failureReasons.keys()].join(', ')}`,
      );
      // The faults did happen (so the run proves something), and production went on through them.
      const faults = mock.stats().faults;
      assert.ok(
        Object.values(faults).every((n) => n > 0),
        `every inference fault was injected: ${JSON.stringify(faults)}`,
      );
      assert.ok(stats.groups.dropped.FAILED > 0);
      assert.ok(seen.pauses.length >= STEPS / 2);
    });

    function printCounts(
      stats: EngineStats,
      run: {
        taken: number;
        continued: number;
        notNormal: { step: number; status: string }[];
        seconds: number;
        stillInFlight: number;
      },
    ): void {
      const g = stats.groups;
      const stored = stats.buffer.completed + stats.buffer.aborted + stats.buffer.expired;
      const reasons = [...seen.failureReasons].sort((a, b) => b[1].count - a[1].count);
      const mockStats = mock.stats();
      const rows: [string, string | number][] = [
        ['scheduled (fresh groups)', g.scheduled],
        ['retried (ABORTED/EXPIRED sent again)', g.retried],
        ['taken by the trainer', g.taken],
        ['failed (dropped)', g.dropped.FAILED],
        ...reasons.slice(0, 6).map(([key, { count }]): [string, number] => [`  ${key}`, count]),
        ['filtered (dropped)', g.dropped.FILTERED],
        ['expired (dropped / landed / stored)', `${g.dropped.EXPIRED} / ${g.landed.EXPIRED} / ${stats.buffer.expired}`],
        ['aborted by pauses (landed)', g.landed.ABORTED],
        ['rollouts continued across a weight update', run.continued],
        [
          'in the buffer (completed + aborted + expired)',
          `${stored} (${stats.buffer.completed} + ${stats.buffer.aborted} + ${stats.buffer.expired})`,
        ],
        ['in flight (still out after the final pause)', `${g.inFlight} (${run.stillInFlight})`],
        [
          'landed by status',
          Object.entries(g.landed)
            .filter(([, n]) => n > 0)
            .map(([s, n]) => `${s} ${n}`)
            .join(', '),
        ],
        ['pauses', seen.pauses.length],
        ['non-NORMAL answers', run.notNormal.map((n) => `${n.step}:${n.status}`).join(' ') || 'none'],
        [
          'inference faults injected',
          `${Object.entries(mockStats.faults)
            .map(([k, n]) => `${k} ${n}`)
            .join(', ')} of ${mockStats.requests} requests`,
        ],
        ['last drop reason', (stats.buffer.lastDropReason ?? '').slice(0, 100)],
        ['run time', `${run.seconds.toFixed(1)} s`],
      ];
      const width = Math.max(...rows.map(([k]) => k.length));
      console.log(
        `\nchaos run${stream ? ' (replies streamed)' : ''}: ${STEPS} steps × ${8} groups\n${rows.map(([k, v]) => `  ${k.padEnd(width)}  ${v}`).join('\n')}`,
      );
      console.log(
        `  identity: scheduled ${g.scheduled} = in flight ${g.inFlight} + stored ${stored} + taken ${g.taken} + dropped ${g.dropped.FAILED + g.dropped.FILTERED + g.dropped.EXPIRED}`,
      );
      for (const [key, { example }] of reasons.slice(0, 6)) console.log(`  e.g. ${key}: ${example.slice(0, 160)}`);
    }
  });

// ── what the faults turned up ─────────────────────────────────────────────────────────────────────

describe('engine problems the faults turned up (regression tests)', () => {
  it('refuses to start when no worker can start, and getBatch and close() answer instead of waiting forever', async () => {
    // In a child process: the hang stays there, and is killed with it.
    const child = spawn(process.execPath, ['--import', 'tsx', WORKER_START, '2000'], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, LOG_LEVEL: 'silent' },
    });
    let out = '';
    child.stdout.on('data', (c) => (out += c));
    const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
    await new Promise((resolve) => child.once('exit', resolve));
    clearTimeout(timer);
    const result = JSON.parse(out.trim().split('\n').at(-1) ?? '{}') as {
      start: string;
      getBatch: string;
      close: string;
      groups: unknown;
    };
    // The start-up check runs each task on a worker: with none able to start, start() itself says so.
    assert.match(result.start, /^rejected ERR_WORKER: tasks\[0\] \(arith\): no worker could check the task: /);
    assert.notEqual(
      result.getBatch,
      'pending',
      `getBatch still pending after 2 s; groups ${JSON.stringify(result.groups)}`,
    );
    assert.notEqual(result.close, 'pending', 'close() still pending after 2 s');
  });

  it('issues no inference call while paused, not even the retry of a call that failed after the pause began', async () => {
    // An inference server whose first completion fails with 503 after 300 ms, when the pause is on.
    const arrivals: number[] = [];
    const firstArrival = deferred();
    const server = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        if (req.url === '/v1/models') return void res.end(JSON.stringify({ data: [{ id: 'mock-policy' }] }));
        if (req.url === '/abort_request') return void res.end('{}'); // "aborted": nothing was generating
        // Only completions count: the start-up probe (GET /props and the like) is not an inference call.
        if (req.method !== 'POST' || req.url !== '/v1/chat/completions')
          return void res.writeHead(404).end('{"error": "not found"}');
        arrivals.push(performance.now());
        firstArrival.resolve();
        if (arrivals.length === 1) setTimeout(() => res.writeHead(503).end('{"error": "overloaded"}'), 300);
        else
          res.end(
            JSON.stringify({ choices: [{ message: { role: 'assistant', content: '42' }, finish_reason: 'stop' }] }),
          );
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 1,
      llm: { url, retries: 3, retryBackoffMs: 5 },
      workers: { threads: 1 },
      tasks: [{ name: 'arith', env: { module: 'builtin:arithmetic' }, groupSize: 1, maxSteps: 1 }],
    });
    try {
      await engine.start();
      const batch = engine.getBatch(1);
      await firstArrival.promise;
      const report = await engine.pauseForWeightUpdate();
      const pausedAt = arrivals[0] + 1; // the pause began right after the first call arrived
      const duringPause = arrivals.filter((t) => t > pausedAt);
      await engine.resume({ modelStep: 1 });
      await batch;
      assert.deepEqual(
        duringPause.length,
        0,
        `${duringPause.length} inference call(s) arrived while paused (workers stopped after ${report.workersStoppedMs?.toFixed(1)} ms)`,
      );
    } finally {
      await engine.close();
      server.close();
    }
  });
});

// ── a 30 s inference outage ───────────────────────────────────────────────────────────────────────

describe('chaos: a 30 s inference outage mid-run (503 for 15 s, then connections refused for 15 s), with weight updates', {
  timeout: 120_000,
}, () => {
  const OUTAGE_STEPS = 8;
  let mock: MockLlm;
  let proxy: OutageProxy;
  let engine: Engine | undefined;
  before(async () => {
    mock = await startMockLlm({ port: 0, seed: 12, latencyMs: 5, tokensPerSecond: 3000 });
    proxy = await OutageProxy.start(mock.url);
  });
  after(async () => {
    await engine?.close();
    await proxy?.close();
    await mock?.close();
  });

  it('holds production through the outage, loses no group and fails none, and completes the run afterwards', async () => {
    const started = performance.now();
    const outage = { began: 0, ended: deferredVoid() };
    // The outage begins at the 60th chat call (inside the second batch) and lasts 30 s.
    proxy.onChat = (n) => {
      if (n !== 60) return;
      proxy.onChat = null;
      outage.began = performance.now();
      void proxy
        .down('503')
        .then(() =>
          setTimeout(
            () =>
              void proxy
                .down('refuse')
                .then(() => setTimeout(() => void proxy.up().then(outage.ended.resolve), 15_000)),
            15_000,
          ),
        );
    };
    engine = createEngine({
      logLevel: 'silent',
      seed: 6,
      batchSize: 8,
      llm: { url: proxy.url, timeoutMs: 2_000, retries: 2, retryBackoffMs: 10 },
      workers: { threads: 2, groupsPerWorker: 8 },
      // One failed group tolerated per batch: before, the outage failed every group in flight and the run.
      producer: {
        strategy: 'async',
        partialRollout: true,
        maxStaleness: 1,
        syncWeightsInterval: 2,
        overSampleThreshold: 0.25,
        maxFailedGroupsPerStep: 1,
      },
      pause: { mode: 'abort', resignalIntervalMs: 200, timeoutMs: 2_000 },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 4, maxSteps: 6, maxTokens: 32 }],
    });
    await engine.start();
    const taken = new Set<string>();
    let modelStep = 0;
    let pausesDuringOutage = 0;
    const sync = async (to: number) => {
      await engine!.pauseForWeightUpdate();
      if (proxy.mode !== null) pausesDuringOutage++;
      mock.setWeightVersion(to);
      await engine!.resume({ modelStep: to });
      modelStep = to;
    };
    let outageSeen = false;
    for (let step = 1; step <= OUTAGE_STEPS; ) {
      const batch: Batch = await Promise.race([
        engine.getBatch(step),
        sleep(90_000, undefined, { ref: false }).then(async () =>
          assert.fail(
            `getBatch(${step}) did not answer within 90 s: ${JSON.stringify((await engine!.stats()).groups)}`,
          ),
        ),
      ]);
      const stats = await engine.stats();
      assertAccounted(stats, `after getBatch(${step})`);
      outageSeen ||= stats.outage.outages > 0;
      if (batch.status !== 'NORMAL') {
        await sync(Math.max(modelStep, step - 1));
        continue;
      }
      for (const group of batch.groups) {
        assert.equal(taken.has(group.id), false, `group ${group.id} taken twice`);
        taken.add(group.id);
        assert.equal(group.status, Status.COMPLETED);
      }
      if (step % 2 === 0) await sync(step);
      step++;
    }
    await outage.ended.promise; // the run finished after the servers came back (not before they went)
    const finalPause = await engine.pauseForWeightUpdate();
    const stats = await engine.stats();
    assertAccounted(stats, 'at the end');
    const g = stats.groups;
    const stored = stats.buffer.completed + stats.buffer.aborted + stats.buffer.expired;
    console.log(
      [
        `\nchaos run through a 30 s inference outage: ${OUTAGE_STEPS} steps × 8 groups in ${((performance.now() - started) / 1000).toFixed(1)} s`,
        `  outage        ${stats.outage.outages} outage of ${(stats.outage.totalMs / 1000).toFixed(1)} s; ${stats.outage.groupsAborted} groups came back ABORTED from it and were retried`,
        `  proxy         ${proxy.refused} requests answered 503 or cut; ${proxy.forwarded} chat calls answered`,
        `  groups        scheduled ${g.scheduled}, retried ${g.retried}, taken ${g.taken}, dropped ${JSON.stringify(g.dropped)}, landed ${JSON.stringify(g.landed)}`,
        `  identity      scheduled ${g.scheduled} = in flight ${g.inFlight} + stored ${stored} + taken ${g.taken} + dropped ${g.dropped.FAILED + g.dropped.FILTERED + g.dropped.EXPIRED}`,
        `  pauses        ${pausesDuringOutage} weight updates during the outage; still in flight after the final pause: ${finalPause.stillInFlight}`,
      ].join('\n'),
    );
    assert.equal(taken.size, OUTAGE_STEPS * 8);
    assert.ok(outageSeen, 'the outage fell inside the run');
    assert.equal(g.dropped.FAILED, 0, `no group failed: ${stats.buffer.lastDropReason}`);
    assert.equal(stats.outage.outages, 1, 'one outage: 503 then refused, with no answer between');
    assert.ok(stats.outage.totalMs >= 29_000, `the outage lasted ${stats.outage.totalMs} ms`);
    assert.ok(stats.outage.groupsAborted > 0);
    assert.ok(proxy.refused > 0);
    assert.equal(stats.outage.state, 'up');
  });
});

function deferredVoid(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

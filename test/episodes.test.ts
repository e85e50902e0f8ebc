/**
 * What the worker runtime does with episodes, in real worker threads against mock or scripted
 * servers: sessions spread across endpoints and kept on one, multi-agent episodes routed per policy,
 * episode hooks, episode slots handed over between groups, and each rollout's own reset params.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { createEngine, Status, type Engine } from '../src/index.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/server.ts';
import { closeServer, listenLoopback } from './support/http.ts';

const fixture = (name: string) => new URL(`./fixtures/${name}`, import.meta.url).pathname;

describe('episodes with several endpoints, several agents and hooks', () => {
  let serverA: MockLlm;
  let serverB: MockLlm;
  const engines: Engine[] = [];
  before(async () => {
    // The weight version each server reports tells which one generated a turn.
    serverA = await startMockLlm({ port: 0, weightVersion: 100, latencyMs: 2, seed: 1 });
    serverB = await startMockLlm({ port: 0, weightVersion: 200, latencyMs: 2, seed: 2 });
  });
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    await Promise.all([serverA.close(), serverB.close()]);
  });
  function engine(config: Parameters<typeof createEngine>[0]): Engine {
    // Model step 200: both servers' versions are steps the engine has reached (a newer one is reported, not tagged).
    const e = createEngine({ logLevel: 'silent', modelStep: 200, ...config });
    engines.push(e);
    return e;
  }

  it('keeps every multi-turn session on one endpoint and spreads sessions across endpoints', async () => {
    const e = engine({
      llm: { url: [serverA.url, serverB.url] },
      batchSize: 8,
      workers: { threads: 1 },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 4, maxSteps: 8 }],
    });
    await e.start();
    const batch = await e.getBatch();
    assert.equal(batch.status, 'NORMAL');
    const perServer = { 100: 0, 200: 0 } as Record<number, number>;
    for (const r of batch.groups.flatMap((g) => g.rollouts)) {
      const servers = new Set(r.turns.map((t) => t.modelStep));
      assert.equal(servers.size, 1, `rollout ${r.id} moved between endpoints: ${[...servers]}`);
      perServer[[...servers][0]]++;
    }
    assert.ok(perServer[100] >= 8 && perServer[200] >= 8, `sessions spread unevenly: ${JSON.stringify(perServer)}`);
  });

  it('routes each agent of a two-agent episode to its own policy and rewards each agent separately', async () => {
    const e = engine({
      llm: { url: serverA.url, policies: { alice: { url: serverA.url }, bob: { url: serverB.url, temperature: 0.5 } } },
      batchSize: 2,
      workers: { threads: 1 },
      tasks: [{ name: 'duo', env: { module: fixture('two-agent-env.ts') }, groupSize: 2, maxSteps: 4 }],
    });
    await e.start();
    const batch = await e.getBatch();
    assert.equal(batch.status, 'NORMAL');
    for (const r of batch.groups.flatMap((g) => g.rollouts)) {
      assert.equal(r.status, Status.COMPLETED);
      assert.deepEqual(
        r.turns.map((t) => [t.step, t.agentId]),
        [
          [1, 'alice'],
          [1, 'bob'],
          [2, 'alice'],
          [2, 'bob'],
        ],
      );
      for (const t of r.turns) assert.equal(t.modelStep, t.agentId === 'alice' ? 100 : 200);
      assert.ok(r.agentRewards !== null);
      const sum = (agent: string) => r.turns.filter((t) => t.agentId === agent).reduce((s, t) => s + t.reward, 0);
      assert.deepEqual(r.agentRewards, { alice: sum('alice'), bob: sum('bob') });
      assert.equal(r.reward, sum('alice') + sum('bob'));
    }
  });

  it('lets a hook rewrite prompts and see each episode end; a hook that throws does not kill the episode', async () => {
    const log = join(mkdtempSync(join(tmpdir(), 'rollout-hooks-')), 'ends.jsonl');
    process.env.ROLLOUT_TEST_HOOK_LOG = log;
    const e = engine({
      llm: { url: serverA.url },
      batchSize: 2,
      workers: { threads: 1 },
      tasks: [
        {
          name: 'guess',
          env: { module: 'builtin:guess-number' },
          hooks: { module: fixture('hooks.ts') },
          groupSize: 2,
          maxSteps: 8,
        },
      ],
    });
    await e.start();
    const batch = await e.getBatch();
    const rollouts = batch.groups.flatMap((g) => g.rollouts);
    for (const r of rollouts) {
      assert.equal(r.status, Status.COMPLETED);
      assert.match(r.turns[0].messages[0].content, /\[hooked\]$/);
      if (r.turns.length > 1)
        assert.doesNotMatch(
          r.turns[1].messages[0].content,
          /\[hooked\]/,
          'the throwing hook on step 2 left the prompt as it was',
        );
    }
    await e.close();
    const ends = readFileSync(log, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    assert.deepEqual(ends.map((x) => x.rolloutId).sort(), rollouts.map((r) => r.id).sort());
    for (const end of ends) {
      const r = rollouts.find((x) => x.id === end.rolloutId)!;
      assert.equal(end.totalReward, r.reward);
      assert.equal(typeof end.lastInfo?.target, 'number');
    }
  });
});

describe('episode slots (workers.rolloutsPerWorker)', () => {
  /**
   * A chat server for sessions routed by path (`/v1/sessions/{task/group/index}/…`): rollout 0 of every
   * group ends at once (finish reason `length`), the others are held until calls from a second group
   * have arrived — which only happens if rollout 0's slot went to another group's rollout. Records the
   * most calls open at once and the groups seen calling while another group's calls were open.
   */
  async function slotServer(): Promise<{
    url: string;
    close(): Promise<void>;
    peak: () => number;
    overlapped: () => boolean;
  }> {
    let open = 0;
    let peak = 0;
    let overlapped = false;
    const openGroups = new Map<string, number>();
    const groupsSeen = new Set<string>();
    let releaseHeld!: () => void;
    const secondGroup = new Promise<void>((r) => (releaseHeld = r));
    const server = createServer((req, res) => {
      req.resume();
      if (req.method === 'GET')
        return void res.writeHead(200, { 'content-type': 'application/json' }).end('{"data":[{"id":"m"}]}');
      const session = decodeURIComponent(/\/sessions\/([^/]+)\//.exec(req.url ?? '')![1]);
      const group = session.slice(0, session.lastIndexOf('/'));
      const index = Number(session.slice(session.lastIndexOf('/') + 1));
      open++;
      peak = Math.max(peak, open);
      if ([...openGroups.keys()].some((g) => g !== group)) overlapped = true;
      openGroups.set(group, (openGroups.get(group) ?? 0) + 1);
      groupsSeen.add(group);
      if (groupsSeen.size >= 2) releaseHeld();
      const answer = (finish: string) => {
        open--;
        const left = openGroups.get(group)! - 1;
        if (left === 0) openGroups.delete(group);
        else openGroups.set(group, left);
        res
          .writeHead(200, { 'content-type': 'application/json' })
          .end(JSON.stringify({ choices: [{ message: { content: '50' }, finish_reason: finish }] }));
      };
      if (index === 0) answer('length');
      else void secondGroup.then(() => answer('stop'));
    });
    return {
      url: await listenLoopback(server),
      close: () => closeServer(server),
      peak: () => peak,
      overlapped: () => overlapped,
    };
  }

  it('runs at most rolloutsPerWorker episodes, and a rollout that ends early hands its slot to another group while its siblings play on', async () => {
    const s = await slotServer();
    const e = createEngine({
      logLevel: 'silent',
      llm: {
        url: s.url,
        model: 'm',
        sessionPath: '/sessions/{session}',
        returnTokenIds: false,
        logprobs: false,
        retries: 0,
      },
      batchSize: 3,
      workers: { threads: 1, groupsPerWorker: 2, rolloutsPerWorker: 4 },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 4, maxSteps: 2 }],
    });
    try {
      await e.start();
      // Without the hand-over the first group's held calls would wait for a second group for ever.
      const batch = await e.getBatch();
      assert.equal(batch.status, 'NORMAL');
      assert.equal(batch.groups.length, 3);
      for (const g of batch.groups) assert.equal(g.status, Status.COMPLETED);
      assert.ok(s.overlapped(), 'calls of two groups were never open at once');
      assert.equal(s.peak(), 4);
    } finally {
      await e.close();
      await s.close();
    }
  });
});

describe('what episodes are given (regression)', () => {
  it('gives every rollout of a group reset params of its own, though the wire shares them', async () => {
    const mock = await startMockLlm({ port: 0 });
    const e = createEngine({
      logLevel: 'silent',
      llm: { url: mock.url },
      batchSize: 2,
      workers: { threads: 1 },
      tasks: [
        {
          name: 'marks',
          env: { module: fixture('params-counting-env.ts'), export: 'createEnv', params: { resets: [] } },
          groupSize: 4,
          maxSteps: 1,
        },
      ],
    });
    try {
      await e.start();
      const batch = await e.getBatch();
      assert.equal(batch.status, 'NORMAL');
      for (const g of batch.groups)
        assert.deepEqual(
          g.rollouts.map((r) => r.reward),
          [1, 1, 1, 1],
        );
    } finally {
      await e.close();
      await mock.close();
    }
  });
});

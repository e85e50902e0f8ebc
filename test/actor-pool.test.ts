import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createActorPool, type ActorPoolOptions } from '../src/env/actor-pool.ts';
import type { Environment } from '../src/env/types.ts';

interface FakeActor extends Environment {
  n: number;
  closed: number;
}

/** Actors numbered in creation order, counting their close() calls. */
function factory(options: { closeThrows?: boolean } = {}) {
  const made: FakeActor[] = [];
  const create = (): FakeActor => {
    const actor: FakeActor = {
      n: made.length + 1,
      closed: 0,
      reset: () => ({ observation: null }),
      getTaskPrompt: () => [],
      step: () => ({ observation: null, reward: 0, terminated: true, truncated: false }),
      close() {
        actor.closed += 1;
        if (options.closeThrows) throw new Error(`actor ${actor.n} close failed`);
      },
    };
    made.push(actor);
    return actor;
  };
  return { made, create };
}

function pool(options: Partial<ActorPoolOptions> & Pick<ActorPoolOptions, 'size'>) {
  return createActorPool({ create: factory().create, ...options });
}

/** Resolves on the next macrotask: lets every already-settled promise chain run first. */
const settle = () => new Promise((r) => setImmediate(r));

describe('actor pool', { timeout: 10_000 }, () => {
  it('hands out a fresh actor per acquire up to its size, then makes callers wait', async () => {
    const { made, create } = factory();
    const actors = createActorPool({ size: 2, create });
    const a = await actors.acquire();
    const b = await actors.acquire();
    assert.notEqual(a, b);
    assert.equal(actors.busy, 2);
    let third: Environment | null | undefined;
    void actors.acquire().then((env) => (third = env));
    await settle();
    assert.equal(third, undefined, 'no slot: the third caller waits');
    assert.equal(actors.waiting, 1);
    await actors.done(a!, false);
    await settle();
    assert.equal((third as FakeActor | undefined)?.n, 3, 'a new actor, never the returned one');
    assert.equal(made[0].closed, 1, 'done closes the actor');
    assert.equal(actors.busy, 2);
    assert.equal(actors.waiting, 0);
  });

  it('serves waiters in arrival order as actors are done', async () => {
    const actors = pool({ size: 1 });
    const first = (await actors.acquire())!;
    const served: string[] = [];
    const waits = ['w1', 'w2', 'w3'].map((name) => actors.acquire().then((env) => (served.push(name), env!)));
    await settle();
    assert.equal(actors.waiting, 3);
    let current = first;
    for (let i = 0; i < 3; i++) {
      await actors.done(current, false);
      current = await waits[i];
    }
    assert.deepEqual(served, ['w1', 'w2', 'w3']);
    assert.equal(actors.handedOut, 4);
  });

  it('is exhausted after maxEpisodes actors: later and waiting acquires resolve null, a clean end', async () => {
    const actors = pool({ size: 1, maxEpisodes: 2 });
    const a = (await actors.acquire())!;
    const waiting = actors.acquire(); // gets the second (last) actor once a is done
    const late = actors.acquire(); // queued behind: will learn there is none
    await actors.done(a, false);
    const b = await waiting;
    assert.ok(b);
    assert.equal(await late, null);
    assert.equal(await actors.acquire(), null);
    assert.equal(actors.handedOut, 2);
    await actors.done(b, false);
    assert.equal(actors.busy, 0);
    assert.equal(await actors.acquire(), null, 'still exhausted with free slots');
  });

  it('wakes every waiter with null on close, and answers null afterwards', async () => {
    const actors = pool({ size: 1 });
    const a = (await actors.acquire())!;
    const waits = [actors.acquire(), actors.acquire()];
    await settle();
    assert.equal(actors.waiting, 2);
    await actors.close();
    assert.deepEqual(await Promise.all(waits), [null, null]);
    assert.equal(actors.waiting, 0);
    assert.equal(await actors.acquire(), null);
    await actors.done(a, false); // an actor still out is ended normally after close
    assert.equal(actors.busy, 0);
  });

  it('counts failed actors as recycled, and a close that throws too, without rejecting', async () => {
    const ok = factory();
    const actors = createActorPool({ size: 2, create: ok.create });
    await actors.done((await actors.acquire())!, true);
    await actors.done((await actors.acquire())!, false);
    assert.equal(actors.recycled, 1);
    assert.deepEqual(
      ok.made.map((m) => m.closed),
      [1, 1],
      'failed or not, every actor is closed',
    );

    const broken = factory({ closeThrows: true });
    const errors: string[] = [];
    const fragile = createActorPool({
      size: 1,
      create: broken.create,
      onCloseError: (err) => errors.push((err as Error).message),
    });
    await fragile.done((await fragile.acquire())!, false);
    assert.equal(fragile.recycled, 1);
    assert.deepEqual(errors, ['actor 1 close failed']);
    assert.equal(fragile.busy, 0, 'the slot is freed anyway');
  });

  it('frees the slot of an actor whose close() never settles once timeoutMs has passed (regression: a hung actor held its slot for ever)', async () => {
    const errors: string[] = [];
    const hung: Environment = {
      reset: () => ({ observation: null }),
      getTaskPrompt: () => [],
      step: () => ({ observation: null, reward: 0, terminated: true, truncated: false }),
      close: () => new Promise<void>(() => {}),
    };
    const actors = createActorPool({
      size: 1,
      create: () => hung,
      timeoutMs: 20,
      timedOut: () => new Error('close() timed out'),
      onCloseError: (err) => errors.push((err as Error).message),
    });
    const first = (await actors.acquire())!;
    const waiter = actors.acquire(); // waits for the one slot
    await actors.done(first, true);
    assert.equal(await waiter, hung, 'the slot went to the waiter');
    assert.deepEqual(errors, ['close() timed out']);
    assert.equal(actors.recycled, 1);
  });

  it('refuses done() twice for one actor', async () => {
    const actors = pool({ size: 1 });
    const a = (await actors.acquire())!;
    await actors.done(a, false);
    await assert.rejects(actors.done(a, false), { code: 'ERR_ACTOR_POOL_MISUSE' });
    assert.equal(actors.busy, 0);
  });

  it('rejects a waiting acquire whose signal aborts, and keeps the queue for the others', async () => {
    const actors = pool({ size: 1 });
    const a = (await actors.acquire())!;
    const controller = new AbortController();
    const cancelled = actors.acquire(controller.signal);
    const next = actors.acquire();
    controller.abort(new Error('paused'));
    await assert.rejects(cancelled, { code: 'ERR_ACTOR_POOL_ABORTED', message: /cancelled: paused/ });
    assert.equal(actors.waiting, 1);
    await actors.done(a, false);
    assert.ok(await next);
    await assert.rejects(
      actors.acquire(controller.signal),
      { code: 'ERR_ACTOR_POOL_ABORTED' },
      'an aborted signal fails at once',
    );
  });

  it('gives the slot and the episode budget back when create() throws', async () => {
    let fail = true;
    const { create } = factory();
    const actors = createActorPool({
      size: 1,
      maxEpisodes: 1,
      create: async () => {
        if (fail) throw new Error('server down');
        return create();
      },
    });
    await assert.rejects(actors.acquire(), /server down/);
    assert.deepEqual([actors.busy, actors.handedOut], [0, 0]);
    fail = false;
    assert.ok(await actors.acquire(), 'the budget was not spent by the failure');
    assert.equal(await actors.acquire(), null);
  });

  it('keeps waiters waiting while the last budgeted actor is being created, and serves one if that creation fails', async () => {
    let release!: (ok: boolean) => void;
    const { create } = factory();
    let calls = 0;
    const actors = createActorPool({
      size: 2,
      maxEpisodes: 1,
      create: () => {
        calls += 1;
        if (calls > 1) return create();
        return new Promise<Environment>(
          (resolve, reject) => (release = (ok) => (ok ? resolve(create()) : reject(new Error('first create failed')))),
        );
      },
    });
    const first = actors.acquire();
    const second = actors.acquire(); // budget reserved by `first`: waits instead of giving up
    await settle();
    assert.equal(actors.waiting, 1);
    release(false);
    await assert.rejects(first, /first create failed/);
    assert.ok(await second, 'the freed reservation goes to the waiter');
    assert.equal(actors.handedOut, 1);
  });

  it('runs prewarm once, and again after a failure', async () => {
    let runs = 0;
    const actors = pool({
      size: 1,
      prewarm: async () => {
        runs += 1;
        if (runs === 1) throw new Error('not yet');
      },
    });
    await assert.rejects(actors.prewarm(), /not yet/);
    await Promise.all([actors.prewarm(), actors.prewarm()]);
    await actors.prewarm();
    assert.equal(runs, 2);
  });
});

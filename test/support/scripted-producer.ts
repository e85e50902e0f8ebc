/**
 * A real `Producer` over a scripted pool (scripted-pool.ts): groups land when the test settles them,
 * and a weight-update pause is acknowledged as a worker would, so producer tests need no thread.
 */
import assert from 'node:assert/strict';
import { Sampler } from '../../src/buffer/sampler.ts';
import { resolveConfig } from '../../src/config.ts';
import { PauseControl } from '../../src/coordinator/pause-control.ts';
import { Producer, type Batch, type ProducerObserver } from '../../src/coordinator/producer.ts';
import { createLogger } from '../../src/log.ts';
import { CONTROL } from '../../src/protocol/control-block.ts';
import { ScriptedPool, type Outcome } from './scripted-pool.ts';

const silent = createLogger('silent');
const NO_LLM = 'http://127.0.0.1:9';

/** A started Producer for one task `t0` over a scripted pool; `producer` is the config's `producer` section. */
export async function scriptedProducer(
  producer: Record<string, unknown>,
  {
    batchSize = 1,
    groupSize = 2,
    observer,
  }: { batchSize?: number; groupSize?: number; observer?: ProducerObserver } = {},
) {
  const config = resolveConfig({
    seed: 7,
    batchSize,
    modelStep: 0,
    logLevel: 'silent',
    tasks: [{ name: 't0', env: { module: 'builtin:arithmetic' }, groupSize, weight: 1, maxSteps: 1 }],
    llm: { url: NO_LLM, abortPath: null },
    workers: { threads: 1 },
    producer,
    pause: { mode: 'abort', timeoutMs: 50, resignalIntervalMs: 10 },
  });
  const samplers = new Map<string, Sampler>();
  for (const task of config.tasks) samplers.set(task.name, await Sampler.create(task, config.seed));
  const pool = new ScriptedPool({ partialRollout: config.producer.partialRollout });
  const control = new PauseControl(0);
  const p = new Producer({ config, pool, control, samplers, log: silent, endpoints: [NO_LLM], hooks: {}, observer });
  p.start();
  return { producer: p, pool, control };
}

/** Three macrotask turns: enough for the producer to react to what the test just settled. */
export async function settled(): Promise<void> {
  for (let i = 0; i < 3; i++) await new Promise(setImmediate);
}

/** A weight-update pause whose in-flight groups come back with `outcome`; the worker's acknowledgement is simulated. */
export async function pauseWith(s: ScriptedProducer, outcome: Outcome): Promise<void> {
  const pausing = s.producer.pause();
  const view = new Int32Array(s.control.block);
  Atomics.add(view, CONTROL.ACKS, 1);
  Atomics.notify(view, CONTROL.ACKS);
  await settled();
  for (const id of s.pool.heldIds()) s.pool.settle(id, outcome);
  await pausing;
}

/** getBatch(step), settling each group the producer sends with `outcome` until the batch is answered. */
export async function batchOf(
  s: ScriptedProducer,
  step: number,
  outcome: Outcome = { kind: 'completed' },
): Promise<Batch> {
  let answer: Batch | null = null;
  const asking = s.producer.getBatch(step).then((b) => (answer = b));
  for (let i = 0; i < 50 && answer === null; i++) {
    await settled();
    if (answer !== null) break;
    const [id] = s.pool.heldIds();
    assert.ok(id !== undefined, `getBatch(${step}) waits with nothing in flight`);
    s.pool.settle(id, outcome);
  }
  return asking;
}

export type ScriptedProducer = Awaited<ReturnType<typeof scriptedProducer>>;

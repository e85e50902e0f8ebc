/**
 * A do-nothing episode-hooks module (`tasks[].hooks`) that the memory figure (./memory.ts) loads into
 * every worker thread, only for what it does at import: it listens on a BroadcastChannel and, when
 * asked, runs a full garbage collection of its thread's V8 heap and answers with the thread's
 * `process.memoryUsage()` (heap used, plus the off-heap `arrayBuffers` where typed arrays such as token
 * ids and logprobs keep their bytes — engine.stats() reports the heap only).
 *
 * The engine is not changed for this: the hooks object exports no hook, so the agent loop only awaits
 * an absent `beforeInference` per step. GC is exposed at run time (`--expose-gc` through
 * v8.setFlagsFromString, then `gc` taken from a fresh context), so the bench needs no Node flag.
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { BroadcastChannel, isMainThread, threadId } from 'node:worker_threads';

export const PROBE_CHANNEL = 'rollout-engine-bench:memory-probe';

export interface ThreadMemory {
  threadId: number;
  heapUsed: number;
  arrayBuffers: number;
  external: number;
}

export type ProbeRequest = { type: 'gc'; id: number };
export type ProbeReply = { type: 'memory'; id: number; memory: ThreadMemory };

let gcFn: (() => void) | null = null;

/** A full, synchronous GC of this thread's heap (twice: the second pass collects what finalisers freed). */
export function collectGarbage(): void {
  if (gcFn === null) {
    setFlagsFromString('--expose-gc');
    gcFn = runInNewContext('gc') as () => void;
  }
  gcFn();
  gcFn();
}

export function threadMemory(): ThreadMemory {
  const m = process.memoryUsage();
  return { threadId, heapUsed: m.heapUsed, arrayBuffers: m.arrayBuffers, external: m.external };
}

if (!isMainThread) {
  const channel = new BroadcastChannel(PROBE_CHANNEL);
  channel.unref(); // never keeps a worker alive
  let answered = -1;
  channel.onmessage = (event) => {
    const data = (event as { data: ProbeRequest | ProbeReply }).data;
    if (data?.type !== 'gc' || data.id === answered) return; // other workers' replies, or asked again
    answered = data.id;
    collectGarbage();
    channel.postMessage({ type: 'memory', id: data.id, memory: threadMemory() } satisfies ProbeReply);
  };
}

export default {};

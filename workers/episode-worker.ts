/**
 * Piscina worker entry: decode a task's bytes, run the group, send the result back as transferred
 * bytes. All the work lives in src/rollout/worker-runtime.ts; this file only wires it to the pool.
 */
import { MessageChannel, parentPort, threadId } from 'node:worker_threads';
import * as Comlink from 'comlink';
import { move, workerData } from 'piscina';
import { decodeMessage, encodeMessage } from '../src/protocol/codec.ts';
import type { WorkerRegistration } from '../src/protocol/messages.ts';
import { WorkerRuntime } from '../src/rollout/worker-runtime.ts';

const runtime = new WorkerRuntime(workerData);

// Register the control port from this side: piscina re-emits unknown worker messages on the pool.
const { port1, port2 } = new MessageChannel();
Comlink.expose(runtime, port1 as unknown as Comlink.Endpoint);
const registration: WorkerRegistration = { type: 'rollout-engine:register-control', workerId: threadId, port: port2 };
parentPort?.postMessage(registration, [port2]);

export default async function runTask(bytes: Uint8Array): Promise<unknown> {
  const message = decodeMessage(bytes);
  if (message.type !== 'run-group') throw new Error(`worker expects run-group messages, got ${message.type}`);
  const result = await runtime.runGroup(message);
  return move(encodeMessage(result));
}

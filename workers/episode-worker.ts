/**
 * Piscina worker entry: decode a task's bytes, run the group, send the result back as transferred
 * bytes. All the work lives in src/rollout/worker-runtime.ts; this file only wires it to the pool.
 */
import { MessageChannel, parentPort, threadId } from 'node:worker_threads';
import * as Comlink from 'comlink';
import { move, workerData } from 'piscina';
import { decodeMessage, encodeMessage } from '../src/protocol/codec.ts';
import type { TaskBox, WorkerRegistration } from '../src/protocol/messages.ts';
import { WorkerRuntime, type PromptLine, type TaskCheck } from '../src/rollout/worker-runtime.ts';

const runtime = new WorkerRuntime(workerData);

// Register the control port from this side: piscina re-emits unknown worker messages on the pool.
const { port1, port2 } = new MessageChannel();
Comlink.expose(runtime, port1 as unknown as Comlink.Endpoint);
const registration: WorkerRegistration = { type: 'rollout-engine:register-control', workerId: threadId, port: port2 };
parentPort?.postMessage(registration, [port2]);

export default async function runTask(box: TaskBox): Promise<unknown> {
  if (box?.bytes == null) throw new Error('worker expects a task box with the run-group bytes');
  const message = decodeMessage(box.bytes);
  box.bytes = null; // piscina keeps the task until it settles: the group, not its bytes, is what plays
  if (message.type !== 'run-group') throw new Error(`worker expects run-group messages, got ${message.type}`);
  const result = await runtime.runGroup(message);
  return move(encodeMessage(result));
}

/** The start-up check of one task (piscina's `name: 'checkTask'`): see WorkerRuntime.checkTask. */
export function checkTask(request: { task: string; prompts: PromptLine[] }): Promise<TaskCheck> {
  return runtime.checkTask(request.task, request.prompts);
}

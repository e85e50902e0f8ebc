/**
 * Piscina worker entry: decode a task's bytes, run the group, send the result back as transferred
 * bytes. All the work lives in src/worker/worker-runtime.ts; this file only wires it to the pool.
 *
 * It stays at the package root, outside src/: it is the file piscina loads by path
 * (`projectModuleUrl('workers/episode-worker')`, and `workerUrl` in tests), one per thread.
 */
import { MessageChannel, parentPort, threadId } from 'node:worker_threads';
import { move, workerData } from 'piscina';
import { decodeRunGroup, encodeMessage } from '../src/protocol/codec.ts';
import { exposeControl } from '../src/protocol/control-port.ts';
import type { WorkerRegistration, WorkerTasks } from '../src/protocol/messages.ts';
import { WorkerRuntime } from '../src/worker/worker-runtime.ts';

const runtime = new WorkerRuntime(workerData);

// Register the control port from this side: piscina re-emits unknown worker messages on the pool.
const { port1, port2 } = new MessageChannel();
exposeControl(runtime, port1);
const registration: WorkerRegistration = { type: 'rollout-engine:register-control', workerId: threadId, port: port2 };
parentPort?.postMessage(registration, [port2]);

const runTask: WorkerTasks['default'] = async (box) => {
  if (box?.bytes == null) throw new Error('worker expects a task box with the run-group bytes');
  const message = decodeRunGroup(box.bytes);
  box.bytes = null; // piscina keeps the task until it settles: the group, not its bytes, is what plays
  const result = await runtime.runGroup(message);
  return move(encodeMessage(result)) as Uint8Array; // piscina unwraps the moved value: the pool gets the bytes
};
export default runTask;

/** The start-up check of one task (piscina's `name: 'checkTask'`): see WorkerRuntime.checkTask. */
export const checkTask: WorkerTasks['checkTask'] = (request) => runtime.checkTask(request.task, request.prompts);

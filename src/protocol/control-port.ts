/**
 * The control channel between the coordinator and one worker: comlink over a MessagePort, typed by
 * `WorkerControl` at both ends (./messages.ts).
 *
 * Only the `WorkerControl` calls are exposed, not the object behind them: the port is for stats,
 * flushes and close; groups travel as task bytes and never through it. comlink is written against
 * the DOM's MessagePort; Node's has the same methods (an EventTarget since Node 15) under other
 * type names, so the one cast between them is here.
 */
import * as Comlink from 'comlink';
import type { MessagePort } from 'node:worker_threads';
import type { WorkerControl } from './messages.ts';

export type ControlProxy = Comlink.Remote<WorkerControl>;

/** Worker side: answer the coordinator's control calls on `port`. */
export function exposeControl(control: WorkerControl, port: MessagePort): void {
  const calls: WorkerControl = {
    stats: () => control.stats(),
    flush: () => control.flush(),
    close: () => control.close(),
    setEndpoints: (update) => control.setEndpoints(update),
  };
  Comlink.expose(calls, port as unknown as Comlink.Endpoint);
}

/** Coordinator side: the worker's control calls, each answered as a promise. */
export function connectControl(port: MessagePort): ControlProxy {
  return Comlink.wrap<WorkerControl>(port as unknown as Comlink.Endpoint);
}

/** Stop listening on the proxy's port (the worker is gone or closing). */
export function releaseControl(proxy: ControlProxy): void {
  proxy[Comlink.releaseProxy]();
}

/**
 * A worker node (`rollout node`): a Piscina pool of the same worker code as the coordinator's local
 * threads, pulling groups from a run's WORK stream and publishing their results (see ./nats-pool.ts
 * for the coordinator's side and the delivery rules).
 *
 * Order that keeps a group from being lost or landing twice: run it, heartbeat (`working()`) while it
 * runs, store the result in the RESULTS stream (publish deduplicated by the dispatch id), and only
 * then ack the work message. A node that dies before the ack has its group delivered to another node
 * after the ack wait; one that dies after it has delivered.
 *
 * Pause: the node owns a control block for its own threads (their PauseGate reads it, as local workers
 * read the coordinator's) and writes into it every control state the coordinator publishes, whichever
 * way it arrives first: the core request (answered once every thread acknowledged) or the `control`
 * key's watch. A node that joins reads `control` before it takes a group. States are applied in
 * (incarnation, epoch) order, each once.
 *
 * Slots: the node takes at most `threads × groupsPerWorker` groups at once, pulling only as many as it
 * has free slots, so a group never waits on a busy node while its ack wait runs out.
 */
import { createServer, type Server } from 'node:http';
import { availableParallelism, hostname } from 'node:os';
import type { Msg } from '@nats-io/transport-node';
import type { ConsumerMessages, JsMsg } from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import { Counter, Gauge, Registry } from 'prom-client';
import { Notifier } from '../coordinator/notifier.ts';
import { PauseControl } from '../coordinator/pause-control.ts';
import { PiscinaWorkerPool } from '../coordinator/worker-pool.ts';
import { listen } from '../http-server.ts';
import type { Logger } from '../log.ts';
import { decodeRunGroup, encodeMessage } from '../protocol/codec.ts';
import { LAST_SEND, RunState } from '../protocol/control-block.ts';
import { describeError } from '../errors.ts';
import { PROTOCOL_VERSION } from '../protocol/messages.ts';
import { omitKeptTurns, receivedTurns } from '../protocol/result-delta.ts';
import type { RolloutGroup } from '../domain/rollout.ts';
import { chunkMessage, headHeaders, publishTail, readMessage, type ChunkedMessage } from './chunks.ts';
import { isNotFound, openNats, type NatsLink } from './connect.ts';
import { HEADER, KEY, runNames, type RunNames } from './names.ts';
import {
  applyControl,
  encodeJson,
  parseControl,
  parseRunSettings,
  type ControlAnswer,
  type ControlState,
  type NodeRecord,
  type RunSettings,
} from './state.ts';

export interface RolloutNodeOptions {
  url: string;
  run: string;
  /** Unique among the run's nodes; default `<host>-<pid>`. */
  id?: string;
  /** Worker threads; default this machine's cores. */
  threads?: number | null;
  log: Logger;
  /** Serve /metrics on this port (0: any free one); null: none. */
  metricsPort?: number | null;
  metricsHost?: string;
  heartbeatMs?: number;
  /** On drain (SIGTERM), groups still running after this long are stopped and returned ABORTED. */
  drainMs?: number;
  /** Overrides the worker entry file (tests). */
  workerUrl?: URL;
  /** Stops the wait for a run (start() then resolves with null). */
  signal?: AbortSignal;
}

/** How often a node looks for its run while the coordinator has not published it. */
const RUN_POLL_MS = 500;
const PULL_EXPIRES_MS = 1_000;
/** How often a node that holds groups while paused reads the control state again (see #untilRunning). */
const CONTROL_POLL_MS = 1_000;

export class RolloutNode {
  readonly id: string;
  readonly #options: RolloutNodeOptions;
  readonly #link: NatsLink;
  readonly #names: RunNames;
  readonly #log: Logger;
  readonly #state: KV;
  readonly #settings: RunSettings;
  readonly #control: PauseControl;
  readonly #pool: PiscinaWorkerPool;
  readonly #capacity: number;
  readonly #threads: number;
  readonly #startedAt = Date.now();
  readonly #slotFreed = new Notifier();
  readonly #controlChanged = new Notifier();
  #controlRead: Promise<void> | null = null;
  readonly #registry = new Registry();
  readonly #metrics;
  /** The newest control state applied: older ones (a late request, a watch replaying) are ignored. */
  #applied: { incarnation: number; epoch: number } = { incarnation: -1, epoch: -1 };
  #inFlight = 0;
  #groupsDone = 0;
  #draining = false;
  #fetch: ConsumerMessages | null = null;
  #heartbeat: NodeJS.Timeout | null = null;
  #metricsServer: Server | null = null;
  #metricsUrl: string | null = null;
  #serving: Promise<void> = Promise.resolve();
  #closed = false;
  #stopped!: (why: NodeExit) => void;
  /** Resolves once close() has finished: the node is out of the run. */
  readonly #done = new Promise<NodeExit>((resolve) => (this.#stopped = resolve));
  #exit: NodeExit = 'stopped';
  /** The run settings this node started its threads with, as stored. */
  #runBytes: Uint8Array;

  private constructor(options: RolloutNodeOptions, link: NatsLink, state: KV, found: FoundRun) {
    const { settings, control } = found;
    this.#runBytes = found.runBytes;
    this.#options = options;
    this.#link = link;
    this.#names = runNames(options.run);
    this.id = options.id ?? `${hostname()}-${process.pid}`;
    this.#log = options.log.child({ node: this.id });
    this.#state = state;
    this.#settings = settings;
    this.#threads = options.threads ?? availableParallelism();
    const config = {
      ...settings.config,
      // Step records stay with the coordinator's run dir; a node has none (docs/SCALE-OUT.md, "Worker nodes").
      runDir: null,
      workers: { ...settings.config.workers, threads: this.#threads },
    };
    this.#capacity = this.#threads * config.workers.groupsPerWorker;
    this.#control = new PauseControl(control.modelStep);
    this.#applyState(control);
    this.#pool = new PiscinaWorkerPool({
      config,
      llmUrls: settings.llmUrls,
      control: this.#control.block,
      log: this.#log,
      gatewayUrl: settings.gatewayUrl,
      servers: settings.servers,
      workerUrl: options.workerUrl,
    });
    const registers = [this.#registry];
    this.#metrics = {
      groups: new Counter({
        name: 'rollout_node_groups_total',
        help: 'Groups this node ran, by the status they came back with',
        labelNames: ['status'],
        registers,
      }),
      redelivered: new Counter({
        name: 'rollout_node_groups_redelivered_total',
        help: 'Groups this node took that another node had taken before (it died or went silent)',
        registers,
      }),
      resultBytes: new Counter({
        name: 'rollout_node_result_bytes_total',
        help: 'Bytes of results published',
        registers,
      }),
    };
    const node = this;
    new Gauge({
      name: 'rollout_node_state',
      help: 'groups_in_flight, slots, threads, paused (1/0), model_step',
      labelNames: ['field'],
      registers,
      collect() {
        this.set({ field: 'groups_in_flight' }, node.#inFlight);
        this.set({ field: 'slots' }, node.#capacity);
        this.set({ field: 'threads' }, node.#threads);
        this.set({ field: 'paused' }, node.#control.state === 0 ? 0 : 1);
        this.set({ field: 'model_step' }, node.#control.modelStep);
      },
    });
    new Gauge({
      name: 'rollout_node_worker_rollouts_in_flight',
      help: 'Rollouts held by each worker thread',
      labelNames: ['worker'],
      registers,
      async collect() {
        for (const s of await node.#pool.stats()) this.set({ worker: String(s.workerId) }, s.inFlightRollouts);
      },
    });
  }

  /**
   * Connects and waits for the run (a node may start before its coordinator), then starts its worker
   * threads, answers control requests, heartbeats and pulls groups. `serve()` resolves when it drained.
   */
  static async start(options: RolloutNodeOptions): Promise<RolloutNode | null> {
    const names = runNames(options.run);
    const link = await openNats(options.url, `rollout-node ${options.id ?? `${hostname()}-${process.pid}`}`, '--nats');
    try {
      const kvm = new Kvm(link.nc);
      let said = false;
      for (;;) {
        if (options.signal?.aborted) {
          await link.nc.close();
          return null;
        }
        const found = await findRun(kvm, names);
        if (found !== null) {
          const node = new RolloutNode(options, link, found.state, found);
          await node.#begin();
          return node;
        }
        if (!said)
          options.log.info({ url: options.url, run: options.run }, 'waiting for the coordinator to publish the run');
        said = true;
        await new Promise((resolve) => setTimeout(resolve, RUN_POLL_MS));
      }
    } catch (err) {
      await link.nc.close().catch(() => undefined);
      throw err;
    }
  }

  async #begin(): Promise<void> {
    const { nc } = this.#link;
    nc.subscribe(this.#names.controlSubject, {
      callback: (err, msg) => {
        if (err === null) void this.#onControlRequest(msg);
      },
    });
    // A restarted coordinator may start with other settings (its embedded mock on another port): the
    // node leaves and joins again with them. Two watches: 2.9 has no consumer with two filters.
    const runWatch = await this.#state.watch({ key: KEY.RUN });
    void (async () => {
      for await (const entry of runWatch) {
        if (this.#closed) break;
        if (entry.operation === 'PUT' && Buffer.compare(entry.value, this.#runBytes) === 0) continue;
        this.#log.info(
          { operation: entry.operation },
          'the run settings changed (a new coordinator): joining again with them',
        );
        this.#exit = 'run-changed';
        void this.close();
        break;
      }
    })();
    const watch = await this.#state.watch({ key: KEY.CONTROL });
    void (async () => {
      for await (const entry of watch) {
        if (this.#closed) break;
        if (entry.operation !== 'PUT') continue;
        try {
          this.#applyState(parseControl(entry.value));
        } catch (err) {
          this.#log.warn({ err: describeError(err) }, 'unreadable control state ignored');
        }
      }
    })();
    if (this.#options.metricsPort != null)
      await this.#serveMetrics(this.#options.metricsPort, this.#options.metricsHost ?? '127.0.0.1');
    await this.#beat();
    this.#heartbeat = setInterval(() => void this.#beat(), this.#options.heartbeatMs ?? 2_000);
    this.#heartbeat.unref();
    // The run's streams gone (the coordinator closed it) ends the pull loop: the node leaves too.
    this.#serving = this.#pull()
      .then(() => {
        if (this.#draining) return;
        this.#exit = 'run-ended';
        return this.close();
      })
      .catch((err: unknown) => {
        this.#log.error({ err: describeError(err) }, 'pulling groups stopped');
        return this.close();
      });
    this.#log.info(
      {
        run: this.#options.run,
        threads: this.#threads,
        slots: this.#capacity,
        metrics: this.#metricsUrl,
        modelStep: this.#control.modelStep,
      },
      'worker node started',
    );
  }

  /** Resolves when the node has left the run, saying why. */
  serve(): Promise<NodeExit> {
    return this.#done;
  }

  get metricsUrl(): string | null {
    return this.#metricsUrl;
  }

  get groupsInFlight(): number {
    return this.#inFlight;
  }

  #applyState(state: ControlState): boolean {
    const applied = this.#applied;
    if (
      state.incarnation < applied.incarnation ||
      (state.incarnation === applied.incarnation && state.epoch <= applied.epoch)
    )
      return false;
    this.#applied = { incarnation: state.incarnation, epoch: state.epoch };
    applyControl(this.#control, state);
    this.#controlChanged.notify();
    this.#log.debug({ state: state.state, epoch: state.epoch, modelStep: state.modelStep }, 'control state applied');
    return true;
  }

  /**
   * Waits until this node is not paused, reading the `control` key again every CONTROL_POLL_MS: the
   * watch may have missed a state while NATS restarted. False: the node drains meanwhile.
   */
  async #untilRunning(): Promise<boolean> {
    while (this.#control.state === RunState.PAUSED) {
      if (this.#draining) return false;
      await Promise.race([this.#controlChanged.wait(), delay(CONTROL_POLL_MS)]);
      if (this.#control.state === RunState.PAUSED && !this.#draining) await this.#readControl();
    }
    return !this.#draining;
  }

  /** One read of the `control` key at a time, however many groups wait on it. */
  #readControl(): Promise<void> {
    this.#controlRead ??= this.#state
      .get(KEY.CONTROL)
      .then((entry) => {
        if (entry?.operation === 'PUT') this.#applyState(parseControl(entry.value));
      })
      .catch((err: unknown) => this.#log.debug({ err: describeError(err) }, 'control state not read'))
      .finally(() => (this.#controlRead = null));
    return this.#controlRead;
  }

  async #onControlRequest(msg: Msg): Promise<void> {
    let state: ControlState;
    try {
      state = parseControl(msg.data);
    } catch (err) {
      this.#log.warn({ err: describeError(err) }, 'unreadable control request ignored');
      return;
    }
    const since = performance.now();
    this.#applyState(state);
    const ackedMs = await this.#control.waitForAcks(this.#pool.liveWorkers, 1_000, since);
    const lastSendUs = Number(Atomics.load(new BigInt64Array(this.#control.block), LAST_SEND));
    const answer: ControlAnswer = { node: this.id, epoch: state.epoch, lastSendUs, ackedMs };
    msg.respond(encodeJson(answer));
  }

  async #beat(): Promise<void> {
    const record: NodeRecord = {
      id: this.id,
      host: hostname(),
      pid: process.pid,
      threads: this.#threads,
      groupsInFlight: this.#inFlight,
      groupsDone: this.#groupsDone,
      startedAt: this.#startedAt,
      heartbeatAt: Date.now(),
      metricsUrl: this.#metricsUrl,
    };
    await this.#state
      .put(`${KEY.NODE_PREFIX}${this.id}`, encodeJson(record))
      .catch((err: unknown) => this.#log.warn({ err: describeError(err) }, 'heartbeat not written'));
  }

  async #pull(): Promise<void> {
    let consumer;
    try {
      consumer = await this.#link.js.consumers.get(this.#names.workStream, this.#names.workConsumer);
    } catch (err) {
      // The run closed between finding it and pulling (regression: the rejection ended the process).
      this.#log.info({ err: describeError(err) }, "the run's work queue is gone: leaving");
      return;
    }
    while (!this.#draining) {
      const free = this.#capacity - this.#inFlight;
      if (free <= 0) {
        await this.#slotFreed.wait();
        continue;
      }
      try {
        this.#fetch = await consumer.fetch({ max_messages: free, expires: PULL_EXPIRES_MS });
        for await (const msg of this.#fetch) {
          // Taken after the drain began: straight back to the stream for another node.
          if (this.#draining) msg.nak();
          else void this.#run(msg);
        }
      } catch (err) {
        if (this.#draining) break;
        if (await this.#runGone()) {
          this.#log.info("the run's work stream is gone (the coordinator closed the run): leaving");
          break;
        }
        this.#log.warn({ err: describeError(err) }, 'pulling groups failed; trying again');
        await new Promise((resolve) => setTimeout(resolve, 500));
      } finally {
        this.#fetch = null;
      }
    }
  }

  async #runGone(): Promise<boolean> {
    try {
      await this.#link.jsm.streams.info(this.#names.workStream);
      return false;
    } catch (err) {
      return isNotFound(err);
    }
  }

  async #run(msg: JsMsg): Promise<void> {
    this.#inFlight++;
    const dispatch = msg.headers?.get(HEADER.DISPATCH) ?? '';
    const ackWaitMs = this.#settings.config.workers.nats?.ackWaitMs ?? 30_000;
    // Heartbeats well inside the ack wait: a node busy on a long group is not taken for dead.
    const heartbeat = setInterval(() => msg.working(), Math.max(100, Math.floor(ackWaitMs / 3)));
    if (msg.info.deliveryCount > 1) this.#metrics.redelivered.inc();
    try {
      // Run while paused, the group would come back ABORTED at once and be sent again at once, in a
      // loop for as long as the pause: it waits here for the resume instead, heartbeating.
      if (!(await this.#untilRunning())) {
        msg.nak();
        return;
      }
      let group: RolloutGroup;
      let modelStep: number;
      let data: Uint8Array | null;
      try {
        data = await readMessage(this.#link.jsm, this.#names, msg.data, msg.headers);
      } catch (err) {
        this.#log.warn(
          { dispatch, err: describeError(err) },
          "the group's chunks could not be read yet: it comes again",
        );
        msg.nak(1_000);
        return;
      }
      try {
        if (data === null)
          throw new Error("its chunks are gone (the group settled meanwhile, or past the CHUNKS stream's max age)");
        const message = decodeRunGroup(data);
        group = message.group;
        modelStep = message.modelStep;
      } catch (err) {
        // Sending it again would fail again: out of the stream (no max-deliver advisory comes for it), and
        // the coordinator is told why, so that the group is accounted for as FAILED.
        const reason = `unreadable group: ${describeError(err)}`;
        this.#log.error({ dispatch, err: describeError(err) }, 'unreadable group terminated');
        if (
          await this.#publishResult(
            dispatch,
            chunkMessage(new Uint8Array(0), this.#link.maxPayload, 'a failure'),
            reason,
          )
        )
          msg.term(reason);
        return;
      }
      this.#log.debug(
        { dispatch, delivery: msg.info.deliveryCount, chunks: Number(msg.headers?.get(HEADER.CHUNKS) || 1) },
        'running group',
      );
      const received = receivedTurns(group);
      const result = await this.#pool.runGroup(group, modelStep);
      const keptTurns = omitKeptTurns(result, received);
      const bytes = encodeMessage({ v: PROTOCOL_VERSION, type: 'group-result', group: result, keptTurns, workerId: 0 });
      let message: ChunkedMessage;
      let failure: string | undefined;
      try {
        message = chunkMessage(bytes, this.#link.maxPayload, "the group's result");
      } catch (err) {
        // Past the chunk cap: the coordinator fails the group with the reason (a body-less result).
        failure = `ERR_NATS_TOO_LARGE: ${describeError(err)}`;
        message = chunkMessage(new Uint8Array(0), this.#link.maxPayload, 'a failure');
      }
      // Closed before it could: the group goes to another node.
      if (!(await this.#publishResult(dispatch, message, failure))) return;
      this.#metrics.groups.inc({ status: failure === undefined ? result.status : 'FAILED' });
      this.#metrics.resultBytes.inc(bytes.byteLength);
      this.#groupsDone++;
      await msg.ackAck().catch(() => false); // acked late (taken for dead meanwhile): the coordinator drops the duplicate
    } finally {
      clearInterval(heartbeat);
      this.#inFlight--;
      this.#slotFreed.notify();
    }
  }

  /** Stores the result in the RESULTS stream; retried (deduplicated by the dispatch id) until stored or the node closes. */
  async #publishResult(dispatch: string, message: ChunkedMessage, failure?: string): Promise<boolean> {
    const headers = headHeaders(message);
    headers.set(HEADER.DISPATCH, dispatch);
    headers.set(HEADER.NODE, this.id);
    if (failure !== undefined) headers.set(HEADER.ERROR, failure);
    for (let attempt = 1; !this.#closed; attempt++) {
      try {
        // The tail first: the coordinator that reads the head must find every chunk.
        await publishTail(this.#link.js, this.#names, message);
        await this.#link.js.publish(this.#names.resultSubject, message.head, { msgID: `result.${dispatch}`, headers });
        return true;
      } catch (err) {
        if (isNotFound(err) || /no responders/i.test(describeError(err))) return false; // the run is gone
        this.#log.warn({ dispatch, attempt, err: describeError(err) }, 'result not stored yet; trying again');
        await new Promise((resolve) => setTimeout(resolve, Math.min(5_000, 250 * attempt)));
      }
    }
    return false;
  }

  async #serveMetrics(port: number, host: string): Promise<void> {
    const server = createServer((req, res) => {
      if (req.method === 'GET' && req.url === '/metrics') {
        this.#registry.metrics().then(
          (text) => res.writeHead(200, { 'content-type': this.#registry.contentType }).end(text),
          (err: unknown) => res.writeHead(500).end(describeError(err)),
        );
      } else if (req.method === 'GET' && req.url === '/health')
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"status":"ok"}');
      else res.writeHead(404).end();
    });
    await listen(server, host, port, 'node metrics');
    const address = server.address();
    const bound = typeof address === 'object' && address !== null ? address.port : port;
    this.#metricsServer = server;
    this.#metricsUrl = `http://${host.includes(':') ? `[${host}]` : host}:${bound}/metrics`;
  }

  /**
   * Leave the run: take no more groups, let those running finish for `drainMs` (their results are
   * delivered), then stop the rest — they come back ABORTED with their partial turns and are delivered
   * as results too, so the coordinator sends them again elsewhere. Nothing is left to an ack wait.
   */
  async drain(): Promise<void> {
    if (this.#draining) return;
    this.#draining = true;
    this.#slotFreed.notify();
    this.#controlChanged.notify();
    this.#fetch?.stop();
    const drainMs = this.#options.drainMs ?? 30_000;
    this.#log.info({ groupsInFlight: this.#inFlight, drainMs }, 'draining: no new groups; finishing those running');
    const deadline = performance.now() + drainMs;
    while (this.#inFlight > 0 && performance.now() < deadline)
      await Promise.race([this.#slotFreed.wait(), new Promise((r) => setTimeout(r, 250).unref())]);
    if (this.#inFlight > 0) {
      this.#log.info({ groupsInFlight: this.#inFlight }, 'drain time is up: returning the groups still running');
      this.#control.cancel();
      const returned = performance.now() + 10_000;
      while (this.#inFlight > 0 && performance.now() < returned)
        await Promise.race([this.#slotFreed.wait(), new Promise((r) => setTimeout(r, 250).unref())]);
    }
    await this.#serving;
    await this.close();
  }

  /** Stops at once: groups still running are left to the ack wait (another node takes them). */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#draining = true;
    this.#slotFreed.notify();
    this.#controlChanged.notify();
    this.#fetch?.stop();
    if (this.#heartbeat !== null) clearInterval(this.#heartbeat);
    await this.#state.delete(`${KEY.NODE_PREFIX}${this.id}`).catch(() => undefined);
    await this.#pool.close();
    await new Promise<void>((resolve) =>
      this.#metricsServer === null ? resolve() : this.#metricsServer.close(() => resolve()),
    );
    await this.#link.nc.drain().catch(() => undefined);
    this.#log.info({ groupsDone: this.#groupsDone }, 'worker node stopped');
    this.#stopped(this.#exit);
  }
}

/** Why a node left its run: told to stop (drain, close), the run's streams were removed, or its settings changed. */
export type NodeExit = 'stopped' | 'run-ended' | 'run-changed';

interface FoundRun {
  state: KV;
  settings: RunSettings;
  runBytes: Uint8Array;
  control: ControlState;
}

/**
 * The run's bucket, settings and control state, or null while there is no run (not yet, or being
 * removed: any failure to read it is looked at again on the next poll). Bad settings are an error.
 */
async function findRun(kvm: Kvm, names: RunNames): Promise<FoundRun | null> {
  let state: KV;
  let run;
  let control;
  try {
    state = await kvm.open(names.stateBucket);
    run = await state.get(KEY.RUN);
    control = await state.get(KEY.CONTROL);
  } catch {
    return null;
  }
  if (run?.operation !== 'PUT' || control?.operation !== 'PUT') return null;
  return {
    state,
    settings: parseRunSettings(run.value),
    runBytes: run.value.slice(),
    control: parseControl(control.value),
  };
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

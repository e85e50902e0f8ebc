/**
 * The coordinator's side of worker nodes: a `WorkerPool` whose groups run on `rollout node`
 * processes, reached through NATS JetStream (names in ./names.ts, the node in ./node.ts).
 *
 * A dispatch is one message on the WORK stream, its id `<group id>.<incarnation>.<n>` (HEADER.DISPATCH),
 * also its publish msgID: a publish retried after a lost PubAck is deduplicated by the stream. A node
 * acks it only once its result is stored in the RESULTS stream; while it runs the group it sends
 * `working()` heartbeats, so a node that dies stops heartbeating and the group is delivered again after
 * `ackWaitMs`, to another node. Past `maxDeliver` deliveries the server says so in an advisory: the
 * group comes back FAILED with the reason and its message is deleted from the stream.
 *
 * Invariant: a dispatch lands at most once. A result is accepted by creating `<dispatch>` in the
 * accepted bucket (an atomic create, in NATS, so it outlives this process): the second result of a
 * dispatch — a zombie node's that was taken for dead, a result stream redelivery — finds the key and is
 * dropped. A dispatch not in `#pending` (an earlier coordinator's, or one already landed) is dropped too.
 *
 * A group or result larger than the server's max_payload is sent in chunks (./chunks.ts): its head is
 * the dispatch above, so none of this changes; a dispatch's chunks are purged when it settles.
 *
 * A restarted coordinator (a new incarnation, counted in the state bucket) purges both streams: the
 * checkpoint it resumes from sends again every group that was in flight, under new dispatch ids.
 *
 * Pause: this pool watches the coordinator's control block as a worker thread does. Each epoch is
 * written to the `control` key (a node that joins, or missed a request, reads it) and sent as a core
 * request every live node answers once its own threads have applied it: each answer counts as one
 * acknowledgement in the block (`liveWorkers` = live nodes), and raises LAST_SEND to the node's.
 */
import { hostname } from 'node:os';
import type { Msg } from '@nats-io/transport-node';
import {
  AckPolicy,
  DeliverPolicy,
  DiscardPolicy,
  RetentionPolicy,
  StorageType,
  type ConsumerMessages,
  type JsMsg,
} from '@nats-io/jetstream';
import { Kvm, type KV } from '@nats-io/kv';
import type { ResolvedConfig } from '../config.ts';
import type { ServerInfo } from '../llm/servers.ts';
import type { Logger } from '../log.ts';
import { CONTROL, LAST_SEND } from '../protocol/control-block.ts';
import { decodeGroupResult, encodeRunGroup } from '../protocol/codec.ts';
import { describeError } from '../errors.ts';
import { PROTOCOL_VERSION, type WorkerStats } from '../protocol/messages.ts';
import type { RolloutGroup } from '../domain/rollout.ts';
import {
  abortedGroup,
  failedGroup,
  type NodeStatus,
  type PauseNodes,
  type WorkerPool,
} from '../coordinator/worker-pool.ts';
import {
  chunkMessage,
  CHUNKS_MAX_AGE_MS,
  headHeaders,
  publishTail,
  purgeChunks,
  readMessage,
  type ChunkedMessage,
} from './chunks.ts';
import { isKeyExists, isNotFound, openNats, type NatsLink } from './connect.ts';
import { ClusterError } from './errors.ts';
import { HEADER, KEY, runNames, type RunNames } from './names.ts';
import {
  encodeJson,
  parseControlAnswer,
  parseNodeRecord,
  readControl,
  type ControlState,
  type NodeRecord,
  type RunSettings,
} from './state.ts';

export type NatsSettings = NonNullable<ResolvedConfig['workers']['nats']>;

export interface NatsWorkerPoolOptions {
  config: ResolvedConfig;
  llmUrls: string[];
  log: Logger;
  gatewayUrl?: string | null;
  /** The coordinator's pause broadcast block (coordinator/pause-control.ts). */
  control: SharedArrayBuffer;
  servers?: readonly ServerInfo[];
}

interface Pending {
  sent: RolloutGroup;
  /** The chunks id of the run-group message when it was cut in chunks (./chunks.ts), else null. */
  chunks: string | null;
  resolve: (group: RolloutGroup) => void;
  /** A result is being accepted (its KV create is on its way): a second one waits its turn, then is dropped. */
  accepting: boolean;
}

/**
 * Accepted dispatches are kept this long (the bucket's max age; 2.9 has no per-key TTL). A late
 * duplicate is also dropped by `#pending`; the key matters while two results of one dispatch race,
 * and is what outlives this process. Bounded because the bucket holds one key per group landed.
 */
const ACCEPTED_TTL_MS = 15 * 60_000;
/** Publish attempts of one dispatch (the stream deduplicates a retried one by its msgID). */
const PUBLISH_ATTEMPTS = 4;
/** The coordinator's heartbeat on its record (`coordinator` key), and how long one may go unseen before it is taken for dead. */
const COORDINATOR_BEAT_MS = 2_000;
const COORDINATOR_STALE_MS = 3 * COORDINATOR_BEAT_MS;
/** Replies to one control request are waited for this long. */
const CONTROL_ANSWER_MS = 2_000;
/** A control state that could not be written is tried again at most this often once NATS is down a while. */
const CONTROL_RETRY_MAX_MS = 2_000;
/** At close, the cancel state is tried this many times, then left (nodes see the streams go instead). */
const CLOSE_WRITE_ATTEMPTS = 3;
/**
 * Accepted dispatches the bucket keeps at most, the oldest dropped first (besides its max age): a key
 * matters only while two results of one dispatch race, so the newest ones are those worth keeping.
 */
const ACCEPTED_MAX_KEYS = 100_000;

export class NatsWorkerPool implements WorkerPool {
  readonly #link: NatsLink;
  readonly #names: RunNames;
  readonly #settings: NatsSettings;
  readonly #log: Logger;
  readonly #state: KV;
  readonly #accepted: KV;
  readonly #incarnation: number;
  readonly #block: SharedArrayBuffer;
  readonly #view: Int32Array;
  /** Dispatch id → the group as sent; deleted when its result is accepted or it fails past maxDeliver. */
  readonly #pending = new Map<string, Pending>();
  /** Node id → its last heartbeat and when it reached us (our clock: nodes' clocks may differ). */
  readonly #nodes = new Map<string, { record: NodeRecord; seenAt: number }>();
  #seq = 0;
  #closed = false;
  #results: ConsumerMessages | null = null;
  /**
   * The newest control state, to be in the `control` key. Invariant: once NATS answers, the key holds
   * it — a put that fails is retried (only the newest state: an older one is never written over it),
   * or nodes that missed the request would stay paused for ever on a resume written while NATS was down.
   */
  #controlWanted: ControlState | null = null;
  /** The loop writing `#controlWanted`; null when the key holds it. */
  #controlWriter: Promise<void> | null = null;
  #pause: { expected: Set<string>; answered: Set<string> } | null = null;
  #lonelySince: number | null = null;
  readonly #timer: NodeJS.Timeout;
  readonly #beat: NodeJS.Timeout;
  /** This coordinator's record in the state bucket and its revision: each heartbeat is a compare-and-swap on it. */
  #claim: { record: CoordinatorRecord; revision: number };
  #lostRun = false;
  /** One heartbeat at a time: a put that waits out a NATS restart must not race the next one's revision. */
  #beating = false;
  readonly #loops: Promise<void>[] = [];

  private constructor(
    link: NatsLink,
    state: KV,
    accepted: KV,
    claim: { record: CoordinatorRecord; revision: number },
    options: NatsWorkerPoolOptions,
  ) {
    this.#link = link;
    this.#settings = options.config.workers.nats!;
    this.#names = runNames(this.#settings.run);
    this.#log = options.log.child({ nats: this.#settings.run });
    this.#state = state;
    this.#accepted = accepted;
    this.#incarnation = claim.record.incarnation;
    this.#claim = claim;
    this.#beat = setInterval(() => void this.#heartbeat(), COORDINATOR_BEAT_MS);
    this.#beat.unref();
    this.#block = options.control;
    this.#view = new Int32Array(options.control);
    this.#timer = setInterval(() => this.#checkNodes(), Math.min(this.#settings.nodeStaleMs, 5_000));
    this.#timer.unref();
  }

  /** Connects, makes the run's streams, consumers and buckets (purged: see the header), and publishes the run settings. */
  static async create(options: NatsWorkerPoolOptions): Promise<NatsWorkerPool> {
    const settings = options.config.workers.nats;
    if (settings === null) throw new ClusterError('ERR_NATS', 'workers.nats is not set');
    const names = runNames(settings.run);
    const link = await openNats(settings.url, `rollout-coordinator ${hostname()}:${process.pid}`, 'workers.nats.url');
    try {
      const { jsm } = link;
      const kvm = new Kvm(link.nc);
      const state = await kvm.create(names.stateBucket, { history: 1 });
      const accepted = await kvm.create(names.acceptedBucket, { history: 1, ttl: ACCEPTED_TTL_MS });
      // A KV bucket discards new writes when full, which would refuse every result: its stream is
      // bounded by count and drops the oldest key instead.
      const acceptedStream = `KV_${names.acceptedBucket}`;
      const { config: acceptedConfig } = await link.jsm.streams.info(acceptedStream);
      if (acceptedConfig.max_msgs !== ACCEPTED_MAX_KEYS || acceptedConfig.discard !== DiscardPolicy.Old)
        await link.jsm.streams.update(acceptedStream, {
          ...acceptedConfig,
          max_msgs: ACCEPTED_MAX_KEYS,
          discard: DiscardPolicy.Old,
        });
      const claim = await claimRun(state, settings);
      const incarnation = claim.record.incarnation;
      await ensureStream(jsm, {
        name: names.workStream,
        subjects: [names.workSubject],
        retention: RetentionPolicy.Workqueue,
        duplicate_window: 120_000_000_000,
      });
      await ensureStream(jsm, {
        name: names.resultStream,
        subjects: [names.resultSubject],
        retention: RetentionPolicy.Workqueue,
        duplicate_window: 120_000_000_000,
      });
      await ensureStream(jsm, {
        name: names.chunkStream,
        subjects: [`${names.chunkSubject}.>`],
        retention: RetentionPolicy.Limits,
        duplicate_window: 120_000_000_000,
        max_age: CHUNKS_MAX_AGE_MS * 1_000_000,
      });
      // Earlier coordinators' dispatches: the checkpoint this one resumes from sends their groups again.
      await jsm.streams.purge(names.workStream);
      await jsm.streams.purge(names.resultStream);
      await jsm.streams.purge(names.chunkStream);
      await ensureConsumer(jsm, names.workStream, {
        durable_name: names.workConsumer,
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
        ack_wait: settings.ackWaitMs * 1_000_000,
        max_deliver: settings.maxDeliver,
        // Bounded by the nodes' own slots (threads × groupsPerWorker each), not by the server's default 1000.
        max_ack_pending: -1,
        max_waiting: 4096,
      });
      await ensureConsumer(jsm, names.resultStream, {
        durable_name: names.resultConsumer,
        ack_policy: AckPolicy.Explicit,
        deliver_policy: DeliverPolicy.All,
        ack_wait: 30_000_000_000,
        max_ack_pending: -1,
      });
      const run: RunSettings = {
        v: PROTOCOL_VERSION,
        config: options.config,
        llmUrls: options.llmUrls,
        servers: [...(options.servers ?? [])],
        gatewayUrl: options.gatewayUrl ?? null,
        maxPayload: link.maxPayload,
      };
      const bytes = encodeJson(run);
      if (bytes.byteLength > link.maxPayload)
        throw new ClusterError(
          'ERR_NATS_TOO_LARGE',
          `the run settings (the resolved config) are ${bytes.byteLength} bytes, over the NATS server's max_payload (${link.maxPayload}); raise max_payload in its config`,
        );
      await state.put(KEY.RUN, bytes);
      const pool = new NatsWorkerPool(link, state, accepted, claim, options);
      await pool.#start();
      options.log.info(
        {
          url: settings.url,
          run: settings.run,
          incarnation,
          ackWaitMs: settings.ackWaitMs,
          maxDeliver: settings.maxDeliver,
        },
        'worker nodes: run published on NATS; waiting for `rollout node`',
      );
      return pool;
    } catch (err) {
      await link.nc.close().catch(() => undefined);
      if (err instanceof ClusterError) throw err;
      throw new ClusterError(
        'ERR_NATS',
        `workers.nats: cannot set up run ${settings.run} on ${settings.url}: ${describeError(err)}`,
        { cause: err },
      );
    }
  }

  async #start(): Promise<void> {
    await this.#writeControl(this.#controlState());
    this.#link.nc.subscribe(this.#names.maxDeliveriesAdvisory, {
      callback: (err, msg) => {
        if (err === null) void this.#onMaxDeliveries(msg);
      },
    });
    const consumer = await this.#link.js.consumers.get(this.#names.resultStream, this.#names.resultConsumer);
    this.#results = await consumer.consume({ max_messages: 1024 });
    this.#loops.push(this.#readResults(this.#results));
    const watch = await this.#state.watch({ key: `${KEY.NODE_PREFIX}>` });
    this.#loops.push(
      (async () => {
        for await (const entry of watch) {
          if (this.#closed) break;
          const id = entry.key.slice(KEY.NODE_PREFIX.length);
          if (entry.operation !== 'PUT') {
            if (this.#nodes.delete(id)) this.#log.info({ node: id }, 'worker node left');
            continue;
          }
          try {
            const record = parseNodeRecord(entry.value);
            if (!this.#nodes.has(id))
              this.#log.info({ node: id, host: record.host, threads: record.threads }, 'worker node joined');
            // The server's time of the write, not ours: a dead node's old record must not look fresh.
            this.#nodes.set(id, { record, seenAt: Math.min(Date.now(), entry.created.getTime()) });
          } catch (err) {
            this.#log.warn({ node: id, err: describeError(err) }, 'unreadable node record ignored');
          }
        }
      })(),
    );
    this.#loops.push(this.#watchControl());
  }

  // ── groups ────────────────────────────────────────────────────────────────────────────────────

  runGroup(group: RolloutGroup, modelStep: number): Promise<RolloutGroup> {
    if (this.#closed) return Promise.resolve(failedGroup(group, 'the worker-node pool is closed'));
    const dispatch = `${group.id}.${this.#incarnation}.${++this.#seq}`;
    // 0: not watched here (the node's own pool numbers the run for its env watch).
    const bytes = encodeRunGroup(group, modelStep, 0);
    let message: ChunkedMessage;
    try {
      message = chunkMessage(bytes, this.#link.maxPayload, 'the group');
    } catch (err) {
      return Promise.resolve(failedGroup(group, `ERR_NATS_TOO_LARGE: ${describeError(err)}`, 'environment'));
    }
    return new Promise<RolloutGroup>((resolve) => {
      this.#pending.set(dispatch, { sent: group, chunks: message.id, resolve, accepting: false });
      void this.#publish(dispatch, message);
    });
  }

  async #publish(dispatch: string, message: ChunkedMessage): Promise<void> {
    const headers = headHeaders(message);
    headers.set(HEADER.DISPATCH, dispatch);
    let last: unknown = null;
    for (let attempt = 1; attempt <= PUBLISH_ATTEMPTS && !this.#closed; attempt++) {
      try {
        // The tail first: a node that takes the head must find every chunk.
        await publishTail(this.#link.js, this.#names, message);
        await this.#link.js.publish(this.#names.workSubject, message.head, { msgID: dispatch, headers });
        return;
      } catch (err) {
        last = err;
        await delay(250 * attempt);
      }
    }
    this.#settle(dispatch, (sent) =>
      failedGroup(sent, `could not hand the group to NATS after ${PUBLISH_ATTEMPTS} attempts: ${describeError(last)}`),
    );
  }

  async #readResults(messages: ConsumerMessages): Promise<void> {
    try {
      for await (const msg of messages) void this.#onResult(msg);
    } catch (err) {
      if (!this.#closed) this.#log.error({ err: describeError(err) }, 'worker nodes: reading results stopped');
    }
  }

  async #onResult(msg: JsMsg): Promise<void> {
    const dispatch = msg.headers?.get(HEADER.DISPATCH) ?? '';
    const node = msg.headers?.get(HEADER.NODE) ?? 'unknown';
    const entry = this.#pending.get(dispatch);
    if (entry === undefined || entry.accepting) {
      this.#log.debug(
        { dispatch, node },
        'result of a dispatch not in flight dropped (a node taken for dead, or an earlier coordinator)',
      );
      msg.ack();
      void purgeChunks(this.#link.jsm, this.#names, msg.headers?.get(HEADER.CHUNKS_ID) ?? null);
      return;
    }
    entry.accepting = true;
    const failure = msg.headers?.get(HEADER.ERROR) ?? '';
    let data: Uint8Array | null;
    try {
      // Read before the accept: once accepted, a nak would bring this result back only to be dropped.
      data = failure === '' ? await readMessage(this.#link.jsm, this.#names, msg.data, msg.headers) : null;
    } catch (err) {
      this.#log.warn({ dispatch, node, err: describeError(err) }, "a result's chunks could not be read yet");
      entry.accepting = false;
      msg.nak(1_000);
      return;
    }
    try {
      await this.#accepted.create(dispatch, new TextEncoder().encode(node));
    } catch (err) {
      if (isKeyExists(err)) {
        this.#log.warn({ dispatch, node }, 'a second result of one dispatch dropped: another was accepted');
        msg.ack();
        void purgeChunks(this.#link.jsm, this.#names, msg.headers?.get(HEADER.CHUNKS_ID) ?? null);
        return;
      }
      // NATS did not answer: leave the result in the stream, it comes again.
      entry.accepting = false;
      msg.nak(1_000);
      return;
    }
    this.#settle(dispatch, (sent) => {
      if (failure !== '') return failedGroup(sent, `node ${node} could not run the group: ${failure}`);
      if (data === null)
        return failedGroup(sent, `node ${node} sent a result whose chunks are gone (past the CHUNKS stream's max age)`);
      try {
        const group = decodeGroupResult(data, sent);
        this.#log.debug(
          {
            group: group.id,
            dispatch,
            node,
            status: group.status,
            turns: group.rollouts.map((r) => r.turns.length),
            chunks: Number(msg.headers?.get(HEADER.CHUNKS) || 1),
          },
          'group landed',
        );
        return group;
      } catch (err) {
        return failedGroup(sent, `node ${node} sent a result that cannot be read: ${describeError(err)}`);
      }
    });
    msg.ack();
    void purgeChunks(this.#link.jsm, this.#names, msg.headers?.get(HEADER.CHUNKS_ID) ?? null);
  }

  /** The server gave up on a dispatch after `maxDeliver` deliveries: fail the group and take it out of the stream. */
  async #onMaxDeliveries(msg: Msg): Promise<void> {
    let seq: number;
    let deliveries: number;
    try {
      const advisory = JSON.parse(msg.string()) as { stream_seq?: unknown; deliveries?: unknown };
      seq = Number(advisory.stream_seq);
      deliveries = Number(advisory.deliveries);
    } catch {
      return;
    }
    try {
      const stored = await this.#link.jsm.streams.getMessage(this.#names.workStream, { seq });
      const dispatch = stored?.header.get(HEADER.DISPATCH) ?? '';
      const entry = this.#pending.get(dispatch);
      if (entry !== undefined && !entry.accepting) {
        const { ackWaitMs, maxDeliver } = this.#settings;
        this.#settle(dispatch, (sent) =>
          failedGroup(
            sent,
            `ERR_NATS: no worker node returned a result in ${deliveries} deliveries (workers.nats.maxDeliver = ${maxDeliver}): each node that took it died or went silent for workers.nats.ackWaitMs (${ackWaitMs} ms)`,
          ),
        );
      }
      await this.#link.jsm.streams.deleteMessage(this.#names.workStream, seq);
    } catch (err) {
      if (!isNotFound(err))
        this.#log.warn(
          { seq, err: describeError(err) },
          'a group past maxDeliver could not be removed from the stream',
        );
    }
  }

  #settle(dispatch: string, result: (sent: RolloutGroup) => RolloutGroup): void {
    const entry = this.#pending.get(dispatch);
    if (entry === undefined) return;
    this.#pending.delete(dispatch);
    // A node still holding the head (taken for dead) finds the set gone and leaves the group.
    if (!this.#closed) void purgeChunks(this.#link.jsm, this.#names, entry.chunks);
    entry.resolve(result(entry.sent));
  }

  // ── nodes and pauses ──────────────────────────────────────────────────────────────────────────

  #liveNodes(now = Date.now()): string[] {
    const live: string[] = [];
    for (const [id, { seenAt }] of this.#nodes) if (now - seenAt <= this.#settings.nodeStaleMs) live.push(id);
    return live;
  }

  /**
   * Keeps the claim fresh (a coordinator started on this run meanwhile sees it live and refuses). A
   * failed compare-and-swap is looked at again: a put whose answer was lost in a NATS restart landed.
   */
  async #heartbeat(record: CoordinatorRecord = { ...this.#claim.record, heartbeatAt: Date.now() }): Promise<void> {
    if (this.#lostRun || this.#beating) return;
    this.#beating = true;
    try {
      this.#claim = {
        record,
        revision: await this.#state.update(KEY.COORDINATOR, encodeJson(record), this.#claim.revision),
      };
    } catch (err) {
      if (!isKeyExists(err)) return; // NATS is away: the next beat tries again
      const now = await this.#state.get(KEY.COORDINATOR).catch(() => null);
      const held = now?.operation === 'PUT' ? (now.json() as Partial<CoordinatorRecord>) : null;
      const mine = this.#claim.record;
      if (held?.incarnation === mine.incarnation && held.pid === mine.pid && held.host === mine.host) {
        this.#claim = { record: mine, revision: now!.revision };
        return;
      }
      this.#lostRun = true;
      this.#log.error(
        { holder: held },
        `another coordinator holds run ${this.#settings.run} now (this one was taken for dead): stop one of them`,
      );
    } finally {
      this.#beating = false;
    }
  }

  /** Says so when groups wait with no node to take them (once, then again when that changes). */
  #checkNodes(): void {
    const waiting = this.#pending.size > 0 && this.#liveNodes().length === 0;
    if (!waiting) {
      this.#lonelySince = null;
      return;
    }
    if (this.#lonelySince !== null) return;
    this.#lonelySince = Date.now();
    this.#log.warn(
      { groupsWaiting: this.#pending.size, url: this.#settings.url, run: this.#settings.run },
      `groups wait for a worker node: start one with \`rollout node --nats ${this.#settings.url} --run ${this.#settings.run}\``,
    );
  }

  #controlState(): ControlState {
    return readControl(this.#block, this.#incarnation);
  }

  /** Forwards every epoch of the coordinator's control block to the nodes (see the header). */
  async #watchControl(): Promise<void> {
    let epoch = Atomics.load(this.#view, CONTROL.EPOCH);
    while (!this.#closed) {
      const wait = Atomics.waitAsync(this.#view, CONTROL.EPOCH, epoch, 500);
      if (wait.async) await wait.value;
      const now = Atomics.load(this.#view, CONTROL.EPOCH);
      if (now === epoch || this.#closed) continue;
      epoch = now;
      const state = this.#controlState();
      if (state.state === 'running') this.#pause = null;
      else this.#pause ??= { expected: new Set(this.#liveNodes()), answered: new Set() };
      void this.#writeControl(state);
      void this.#askNodes(state);
    }
  }

  /** Resolves once `state` (or a newer one) is in the `control` key, or the pool closed. */
  #writeControl(state: ControlState): Promise<void> {
    this.#controlWanted = state;
    this.#controlWriter ??= this.#writeControlUntilDone();
    return this.#controlWriter;
  }

  async #writeControlUntilDone(): Promise<void> {
    let failures = 0;
    // The loop's last look at `#controlWanted` and the writer's reset happen in one tick (no await
    // between): a state set meanwhile would otherwise find a writer about to stop, and never be written.
    try {
      for (let wanted = this.#controlWanted; wanted !== null; wanted = this.#controlWanted) {
        try {
          await this.#state.put(KEY.CONTROL, encodeJson(wanted));
          if (failures > 0)
            this.#log.info(
              { state: wanted.state, epoch: wanted.epoch, failures },
              'control state written to NATS again',
            );
          failures = 0;
          if (this.#controlWanted === wanted) this.#controlWanted = null;
        } catch (err) {
          if (failures++ === 0)
            this.#log.warn(
              { state: wanted.state, epoch: wanted.epoch, err: describeError(err) },
              'control state not written to NATS; trying again until it is',
            );
          // At close only a few tries: a coordinator must be able to stop without NATS.
          if (this.#closed && failures >= CLOSE_WRITE_ATTEMPTS) return;
          await delay(Math.min(CONTROL_RETRY_MAX_MS, 100 * 2 ** failures));
        }
      }
    } finally {
      this.#controlWriter = null;
    }
  }

  async #askNodes(state: ControlState): Promise<void> {
    const live = this.#liveNodes().length;
    if (live === 0) return;
    const pause = this.#pause;
    try {
      const answers = await this.#link.nc.requestMany(this.#names.controlSubject, encodeJson(state), {
        maxMessages: live,
        maxWait: CONTROL_ANSWER_MS,
      });
      for await (const reply of answers) {
        let answer;
        try {
          answer = parseControlAnswer(reply.data);
        } catch {
          continue;
        }
        pause?.answered.add(answer.node);
        // An answer to an older epoch must not count for the newest (its ACKS were reset since).
        if (answer.epoch !== Atomics.load(this.#view, CONTROL.EPOCH)) continue;
        if (answer.lastSendUs > 0) raiseLastSend(this.#block, BigInt(Math.round(answer.lastSendUs)));
        Atomics.add(this.#view, CONTROL.ACKS, 1);
        Atomics.notify(this.#view, CONTROL.ACKS);
      }
    } catch (err) {
      if (!this.#closed) this.#log.debug({ err: describeError(err) }, 'control request: no node answered');
    }
  }

  /** Nodes that answered the latest pause, and live ones that did not; null when no pause happened. */
  pauseNodes(): PauseNodes | null {
    const pause = this.#pause;
    if (pause === null) return null;
    return {
      answered: [...pause.answered].sort(),
      missing: [...pause.expected].filter((id) => !pause.answered.has(id)).sort(),
    };
  }

  nodes(): NodeStatus[] {
    const now = Date.now();
    return this.#liveNodes(now).map((id) => {
      const { record, seenAt } = this.#nodes.get(id)!;
      return {
        id,
        host: record.host,
        threads: record.threads,
        groupsInFlight: record.groupsInFlight,
        groupsDone: record.groupsDone,
        lastHeartbeatMsAgo: now - seenAt,
        metricsUrl: record.metricsUrl,
      };
    });
  }

  /** Each live node acknowledges a pause once, for all of its threads. */
  get liveWorkers(): number {
    return this.#liveNodes().length;
  }

  /** Dispatches handed to NATS whose result has not been accepted yet. */
  get pendingGroups(): number {
    return this.#pending.size;
  }

  async stats(): Promise<WorkerStats[]> {
    return []; // nodes report on their own /metrics; /status lists them (nodes())
  }

  async flush(): Promise<void> {
    // Nodes write no step records (src/cluster/node.ts).
  }

  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    clearInterval(this.#timer);
    clearInterval(this.#beat);
    for (const dispatch of [...this.#pending.keys()])
      this.#settle(dispatch, (sent) => abortedGroup(sent, 'the worker-node pool closed while the group was out'));
    // Nodes stop their groups before the streams go (the producer has cancelled them already).
    await this.#writeControl({ ...this.#controlState(), state: 'cancel' });
    this.#results?.stop();
    if (!this.#settings.cleanup)
      await this.#heartbeat({ ...this.#claim.record, heartbeatAt: Date.now(), closed: true }).catch(() => undefined);
    else {
      const { jsm } = this.#link;
      // The state bucket first: a node leaving the run must not find its settings again and rejoin it.
      for (const stream of [
        `KV_${this.#names.stateBucket}`,
        this.#names.workStream,
        this.#names.resultStream,
        this.#names.chunkStream,
        `KV_${this.#names.acceptedBucket}`,
      ]) {
        await jsm.streams.delete(stream).catch((err: unknown) => {
          if (!isNotFound(err)) this.#log.warn({ stream, err: describeError(err) }, 'NATS stream not deleted at close');
        });
      }
    }
    await this.#link.nc.close().catch(() => undefined);
    await Promise.allSettled(this.#loops);
  }
}

/** `coordinator`: who holds the run, kept fresh by its heartbeat (COORDINATOR_BEAT_MS). */
interface CoordinatorRecord {
  incarnation: number;
  host: string;
  pid: number;
  startedAt: number;
  heartbeatAt: number;
  /** Written at close when the run's streams are kept (`cleanup: false`): the next one need not wait. */
  closed?: boolean;
}

/**
 * Takes the run for this process, with the next incarnation, or refuses: two coordinators on one run
 * would purge each other's streams and both stall. The holder is live when its record changes within
 * COORDINATOR_STALE_MS (it heartbeats); a record that does not — a killed coordinator's — is taken over
 * after that wait, at once when it names a process of this host that is gone.
 */
async function claimRun(state: KV, settings: NatsSettings): Promise<{ record: CoordinatorRecord; revision: number }> {
  for (;;) {
    const current = await state.get(KEY.COORDINATOR);
    const held = current?.operation === 'PUT' ? (current.json() as Partial<CoordinatorRecord>) : null;
    if (held !== null && held.closed !== true && (await heartbeats(state, current!.revision, held)))
      throw new ClusterError(
        'ERR_NATS_RUN_IN_USE',
        `workers.nats.run ${JSON.stringify(settings.run)} on ${settings.url} is held by a live coordinator (${String(held.host)} pid ${String(held.pid)}, since ${new Date(Number(held.startedAt)).toISOString()}): stop it, or give this one another workers.nats.run`,
      );
    const now = Date.now();
    const record: CoordinatorRecord = {
      incarnation: (Number(held?.incarnation) || 0) + 1,
      host: hostname(),
      pid: process.pid,
      startedAt: now,
      heartbeatAt: now,
    };
    try {
      const revision =
        current === null
          ? await state.create(KEY.COORDINATOR, encodeJson(record))
          : await state.update(KEY.COORDINATOR, encodeJson(record), current.revision);
      return { record, revision };
    } catch (err) {
      if (!isKeyExists(err)) throw err; // another coordinator wrote it meanwhile: look again
    }
  }
}

/** Whether the coordinator that wrote `held` at `revision` still heartbeats. */
async function heartbeats(state: KV, revision: number, held: Partial<CoordinatorRecord>): Promise<boolean> {
  if (held.host === hostname() && typeof held.pid === 'number' && !processExists(held.pid)) return false;
  const deadline = performance.now() + COORDINATOR_STALE_MS;
  while (performance.now() < deadline) {
    await delay(COORDINATOR_BEAT_MS / 4);
    if ((await state.get(KEY.COORDINATOR))?.revision !== revision) return true;
  }
  return false;
}

function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

type StreamSpec = {
  name: string;
  subjects: string[];
  retention: RetentionPolicy;
  duplicate_window: number;
  max_age?: number;
};

async function ensureStream(jsm: NatsLink['jsm'], spec: StreamSpec): Promise<void> {
  const config = { ...spec, storage: StorageType.File };
  try {
    await jsm.streams.info(spec.name);
    await jsm.streams.update(spec.name, config);
  } catch (err) {
    if (!isNotFound(err)) throw err;
    await jsm.streams.add(config);
  }
}

async function ensureConsumer(
  jsm: NatsLink['jsm'],
  stream: string,
  config: Parameters<NatsLink['jsm']['consumers']['add']>[1] & { durable_name: string },
): Promise<void> {
  try {
    await jsm.consumers.info(stream, config.durable_name);
    await jsm.consumers.update(stream, config.durable_name, config);
  } catch (err) {
    if (!isNotFound(err)) throw err;
    await jsm.consumers.add(stream, config);
  }
}

/** LAST_SEND only moves forward (several nodes answer in any order). */
function raiseLastSend(block: SharedArrayBuffer, us: bigint): void {
  const clock = new BigInt64Array(block);
  for (;;) {
    const current = Atomics.load(clock, LAST_SEND);
    if (current >= us || Atomics.compareExchange(clock, LAST_SEND, current, us) === current) return;
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

/**
 * What a run is called in NATS, in one place: the coordinator creates these, nodes find them by the
 * run name alone (`workers.nats.run`, `rollout node --run`).
 *
 * - WORK: a work-queue stream of run-group messages; every node pulls from its one durable consumer
 *   (a work-queue stream takes a single unfiltered consumer), so a group goes to whichever node asks.
 * - RESULTS: a work-queue stream of group results, read by the coordinator's durable consumer.
 * - CHUNKS: a limits stream (bounded by age) of the chunks past the first of messages larger than
 *   max_payload, one subject per chunk (./chunks.ts).
 * - the state bucket (KV): `run` (what a node needs to start its workers), `control` (running / paused,
 *   epoch, model step, weight version), `coordinator` (its incarnation), `nodes.<id>` (heartbeats).
 * - the accepted bucket (KV): `<dispatch>` created once per accepted result. Its own bucket because
 *   2.9 has no per-key TTL: the bucket's max age bounds it.
 * - CONTROL: a core subject; a pause is also sent there as a request every node answers.
 *
 * The run name's and the NATS URL's patterns, and the default run name, live in src/config.ts, which
 * validates them: the configuration sits below cluster/ and imports nothing of it.
 */

export interface RunNames {
  workStream: string;
  workSubject: string;
  /** The durable pull consumer every node shares. */
  workConsumer: string;
  resultStream: string;
  resultSubject: string;
  resultConsumer: string;
  chunkStream: string;
  /** Chunk i of a message is on `<chunkSubject>.<chunks id>.<i>`. */
  chunkSubject: string;
  stateBucket: string;
  acceptedBucket: string;
  controlSubject: string;
  /** Published by the server when a group has been delivered `maxDeliver` times without an ack. */
  maxDeliveriesAdvisory: string;
}

export function runNames(run: string): RunNames {
  const workStream = `ROLLOUT_${run}_WORK`;
  return {
    workStream,
    workSubject: `rollout.${run}.work`,
    workConsumer: 'nodes',
    resultStream: `ROLLOUT_${run}_RESULTS`,
    resultSubject: `rollout.${run}.results`,
    resultConsumer: 'coordinator',
    chunkStream: `ROLLOUT_${run}_CHUNKS`,
    chunkSubject: `rollout.${run}.chunks`,
    stateBucket: `rollout_${run}`,
    acceptedBucket: `rollout_${run}_accepted`,
    controlSubject: `rollout.${run}.control`,
    maxDeliveriesAdvisory: `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.${workStream}.nodes`,
  };
}

/** Message headers. */
export const HEADER = {
  /** `<group id>.<coordinator incarnation>.<dispatch number>`: one run of one group, unique for the run's life. */
  DISPATCH: 'Rollout-Dispatch',
  /** The node that ran it (results). */
  NODE: 'Rollout-Node',
  /** A message cut in chunks (./chunks.ts): its random id, and how many chunks it has. */
  CHUNKS_ID: 'Rollout-Chunks-Id',
  CHUNKS: 'Rollout-Chunks',
  /** A result with no body: the node could not run the group, for this reason (the coordinator fails it). */
  ERROR: 'Rollout-Error',
} as const;

export const KEY = {
  RUN: 'run',
  CONTROL: 'control',
  COORDINATOR: 'coordinator',
  NODE_PREFIX: 'nodes.',
} as const;

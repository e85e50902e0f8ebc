/**
 * Long episodes with the whole conversation sent (messageCut 0): what a rollout's prompt ids cost.
 *
 * The server returns each turn's prompt ids whole, so kept as they come a rollout holds Σ prompt
 * lengths — quadratic in its turns. The engine keeps each prompt that extends the previous one as a
 * view into the last (src/rollout/prompt-prefix.ts). This runs one batch of guess-number played to
 * many turns against a mock of its own (`thinkTokens` filler tokens per answer) and reports, per rollout, the prompt ids as the server sent
 * them (Σ over turns) against the bytes the rollout's turns actually hold, a group result's size on
 * the thread wire, and the batch's size per rollout as the control API sends it (msgpack), in full
 * and compact (src/protocol/compact.ts).
 */
import { createEngine, type RolloutState } from '../../src/index.ts';
import { startMockProcess } from '../../src/loadtest/mock-process.ts';
import { compactGroup } from '../../src/protocol/compact.ts';
import { encodeForPeer, encodeMessage } from '../../src/protocol/codec.ts';
import { PROTOCOL_VERSION } from '../../src/protocol/messages.ts';

export interface LongEpisodeFigures {
  groups: number;
  turnsPerRollout: number;
  /** Per rollout: Σ over its turns of the prompt ids' bytes, as the server sent them. */
  promptIdsSentBytes: number;
  /** Per rollout: the bytes under its turns' prompt ids, each byte once. */
  promptIdsHeldBytes: number;
  /** A group's result message between threads (protocol/codec.ts), mean bytes. */
  wireBytesPerGroup: number;
  /** Per rollout: the batch as the control API sends it with msgpack, in full and compact (`{"compact": true}`). */
  batchBytesFull: number;
  batchBytesCompact: number;
}

export async function longEpisodes(o: {
  groups: number;
  maxTurns: number;
  thinkTokens: number;
}): Promise<LongEpisodeFigures> {
  const mock = await startMockProcess(['--latency-ms', '0', '--think-tokens', String(o.thinkTokens)]);
  const engine = createEngine({
    logLevel: 'warn',
    llm: { url: mock.url },
    batchSize: o.groups,
    workers: { threads: 1, groupsPerWorker: o.groups },
    tasks: [
      {
        name: 'long',
        // Numbers up to 10^6 take ~20 bisection guesses: episodes run to maxTurns or close to it.
        env: { module: 'builtin:guess-number', params: { max: 1_000_000, maxTurns: o.maxTurns } },
        groupSize: 4,
        maxSteps: o.maxTurns,
        maxTokens: o.thinkTokens + 64,
        messageCut: 0,
      },
    ],
  });
  try {
    await engine.start();
    const batch = await engine.getBatch();
    if (batch.status !== 'NORMAL') throw new Error(`long-episode run: batch status ${batch.status}`);
    const rollouts = batch.groups.flatMap((g) => g.rollouts);
    let wire = 0;
    for (const group of batch.groups)
      wire += encodeMessage({
        v: PROTOCOL_VERSION,
        type: 'group-result',
        group,
        keptTurns: group.rollouts.map(() => 0),
        workerId: 0,
      }).byteLength;
    const n = Math.max(1, rollouts.length);
    return {
      groups: batch.groups.length,
      turnsPerRollout: rollouts.reduce((s, r) => s + r.turns.length, 0) / n,
      promptIdsSentBytes:
        rollouts.reduce((s, r) => s + r.turns.reduce((t, turn) => t + (turn.promptIds?.byteLength ?? 0), 0), 0) / n,
      promptIdsHeldBytes: rollouts.reduce((s, r) => s + heldPromptBytes(r), 0) / n,
      wireBytesPerGroup: wire / Math.max(1, batch.groups.length),
      batchBytesFull: encodeForPeer(batch).byteLength / n,
      batchBytesCompact: encodeForPeer({ ...batch, groups: batch.groups.map(compactGroup) }).byteLength / n,
    };
  } finally {
    await engine.close();
    await mock.close();
  }
}

/** The bytes under a rollout's prompt ids, each byte once (views of one buffer may overlap). */
function heldPromptBytes(rollout: RolloutState): number {
  const spans = new Map<ArrayBufferLike, [number, number][]>();
  for (const turn of rollout.turns) {
    const ids = turn.promptIds;
    if (ids === null) continue;
    const list = spans.get(ids.buffer) ?? [];
    list.push([ids.byteOffset, ids.byteOffset + ids.byteLength]);
    spans.set(ids.buffer, list);
  }
  let bytes = 0;
  for (const list of spans.values()) {
    list.sort((a, b) => a[0] - b[0]);
    let [from, to] = list[0];
    for (const [start, end] of list.slice(1)) {
      if (start > to) {
        bytes += to - from;
        [from, to] = [start, end];
      } else to = Math.max(to, end);
    }
    bytes += to - from;
  }
  return bytes;
}

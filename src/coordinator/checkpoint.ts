/**
 * Checkpoint files: the producer's whole state (progress, buffer contents including ABORTED partial
 * rollouts, groups in flight, sampler cursors, model step) in one file, its groups in the compact
 * form, written atomically — write a temporary file, fsync it, rename it over the target, fsync the
 * directory — so a crash leaves either the old checkpoint or the new one, never a torn file.
 */
import { closeSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import type { ResolvedConfig } from '../config.ts';
import { decodeCheckpoint, encodeCheckpoint } from '../formats/checkpoint-file.ts';
import { preview, RolloutEngineError } from '../errors.ts';
import { compactGroup, expandGroup } from '../formats/compact.ts';
import { sharedMessageCount, Status, type ChatMessage, type RolloutGroup } from '../domain/rollout.ts';
import { sharePromptPrefix } from '../worker/prompt-prefix.ts';
import type { ProducerSnapshot } from './producer.ts';

/**
 * 3: the progress counters under the names the code uses (nextTrainStep, consumedGroups, targetGroups).
 * 2: groups in the compact form (formats/compact.ts), so a long episode's conversation is written
 * once, not once per turn. 1 (groups whole) and 2 are still read.
 */
const CHECKPOINT_VERSION = 3;
const COMPACT_GROUPS_VERSION = 2;
/** Version 1 wrote each group whole. */
const WHOLE_GROUPS_VERSION = 1;
/** Progress fields versions 1 and 2 wrote under another name: name now → name then. */
const FORMER_PROGRESS_NAMES: Readonly<Record<string, string>> = {
  nextTrainStep: 'nextConsumerStep',
  consumedGroups: 'consumedSamples',
  targetGroups: 'targetSamples',
};

/** The config fields a checkpoint's contents depend on; resuming with other values would mix runs. */
export function configFingerprint(config: ResolvedConfig): Record<string, unknown> {
  const fp: Record<string, unknown> = {
    seed: config.seed,
    batchSize: config.batchSize,
    'producer.strategy': config.producer.strategy,
  };
  config.tasks.forEach((t, i) => {
    fp[`tasks[${i}].name`] = t.name;
    fp[`tasks[${i}].groupSize`] = t.groupSize;
    fp[`tasks[${i}].weight`] = t.weight;
    fp[`tasks[${i}].dataset`] = t.dataset;
    fp[`tasks[${i}].env.module`] = t.env?.module ?? t.env?.http?.name ?? null;
    fp[`tasks[${i}].agent.module`] = t.agent?.module ?? null;
  });
  fp['tasks.length'] = config.tasks.length;
  return fp;
}

export function writeCheckpoint(path: string, config: ResolvedConfig, snapshot: ProducerSnapshot): number {
  const producer = {
    ...snapshot,
    buffer: { ...snapshot.buffer, groups: snapshot.buffer.groups.map(compactGroup) },
    inFlight: snapshot.inFlight.map(compactGroup),
    lastBatch:
      snapshot.lastBatch === null
        ? null
        : { ...snapshot.lastBatch, groups: snapshot.lastBatch.groups.map(compactGroup) },
  };
  const bytes = encodeCheckpoint({
    v: CHECKPOINT_VERSION,
    writtenAt: new Date().toISOString(),
    fingerprint: configFingerprint(config),
    producer,
  });
  const tmp = `${path}.tmp-${process.pid}`;
  try {
    // A path under a directory not made yet (a trainer's first `runs/<name>/engine.ckpt`) is what the
    // caller asked for, not a mistake: make it, as the batches file and step records do.
    mkdirSync(dirname(path), { recursive: true });
    const fd = openSync(tmp, 'w');
    try {
      let off = 0;
      while (off < bytes.byteLength) off += writeSync(fd, bytes, off);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
  } catch (err) {
    try {
      rmSync(tmp, { force: true });
    } catch {
      // the path itself was unusable: there is no temporary file to remove
    }
    throw new RolloutEngineError(
      'ERR_CHECKPOINT',
      `cannot write a checkpoint to ${JSON.stringify(path)}: ${(err as Error).message}`,
      { cause: err },
    );
  }
  const dir = openSync(dirname(path), 'r');
  try {
    fsyncSync(dir); // the rename itself must survive a crash
  } finally {
    closeSync(dir);
  }
  return bytes.byteLength;
}

const fail = (message: string) => new RolloutEngineError('ERR_CHECKPOINT', message);

const STATUSES: readonly unknown[] = Object.values(Status);
const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);
const isCount = (value: unknown): value is number => Number.isInteger(value) && (value as number) >= 0;

/**
 * What restoring relies on outside the groups: the numbers the producer counts and steps with, for
 * every task of the config. A file that passes the version and fingerprint checks but was cut or
 * edited is refused here, naming the field, instead of failing later (a TypeError, a count of null).
 */
function checkSnapshotShape(state: Record<string, unknown>, path: string, tasks: readonly string[]): ProducerSnapshot {
  const at = (field: string) => `${path}: ${field}`;
  const need = (ok: boolean, field: string, value: unknown, expected: string) => {
    if (!ok) throw fail(`${at(field)} must be ${expected}, got ${preview(value)}`);
  };
  const producer = state.producer;
  need(isObject(producer), 'producer', producer, 'an object');
  const p = producer as Record<string, unknown>;
  need(isCount(p.modelStep), 'producer.modelStep', p.modelStep, 'a non-negative integer');
  const progress = p.progress as Record<string, unknown>;
  need(isObject(progress), 'producer.progress', progress, 'an object');
  for (const field of ['nextTrainStep', 'producerFutureStep'])
    need(
      isCount(progress[field]) && (progress[field] as number) >= 1,
      `producer.progress.${field}`,
      progress[field],
      'a positive integer',
    );
  need(
    isCount(progress.targetUptoFutureStep),
    'producer.progress.targetUptoFutureStep',
    progress.targetUptoFutureStep,
    'a non-negative integer',
  );
  for (const field of [
    'consumedGroups',
    'targetGroups',
    'rewardSum',
    'rewardCount',
    'producedSamples',
    'producedTokens',
  ]) {
    const perTask = progress[field] as Record<string, unknown>;
    need(isObject(perTask), `producer.progress.${field}`, perTask, 'an object by task');
    for (const task of tasks)
      need(Number.isFinite(perTask[task]), `producer.progress.${field}.${task}`, perTask[task], 'a finite number');
  }
  const samplers = p.samplers as Record<string, unknown>;
  need(isObject(samplers), 'producer.samplers', samplers, 'an object by task');
  for (const task of tasks)
    need(
      isCount(samplers[task]),
      `producer.samplers.${task}`,
      samplers[task],
      "a non-negative integer (the task's sampler cursor)",
    );
  const counts = p.counts as Record<string, unknown>;
  need(isObject(counts), 'producer.counts', counts, 'an object');
  for (const field of ['scheduled', 'retried', 'inFlight', 'taken'])
    need(isCount(counts[field]), `producer.counts.${field}`, counts[field], 'a non-negative integer');
  // landed is kept by status, dropped by drop reason
  for (const field of ['landed', 'dropped']) {
    const byKey = counts[field] as Record<string, unknown>;
    need(isObject(byKey), `producer.counts.${field}`, byKey, 'an object of counts');
    for (const [key, n] of Object.entries(byKey))
      need(isCount(n), `producer.counts.${field}.${key}`, n, 'a non-negative integer');
  }
  const buffer = p.buffer as Record<string, unknown>;
  need(
    isObject(buffer) && Array.isArray(buffer.groups),
    'producer.buffer.groups',
    isObject(buffer) ? buffer.groups : buffer,
    'an array',
  );
  need(Array.isArray(p.inFlight), 'producer.inFlight', p.inFlight, 'an array');
  const last = p.lastBatch as Record<string, unknown> | null | undefined;
  if (last != null) {
    need(isObject(last), 'producer.lastBatch', last, 'an object or null');
    need(
      isCount(last.trainStep) && (last.trainStep as number) >= 1,
      'producer.lastBatch.trainStep',
      last.trainStep,
      'a positive integer',
    );
    need(Array.isArray(last.groups), 'producer.lastBatch.groups', last.groups, 'an array');
  }
  return producer as unknown as ProducerSnapshot;
}

/** What expanding and restoring rely on: a known task and status, rollouts and turns as arrays of objects, rewards as numbers. */
function checkGroupShape(group: RolloutGroup, where: string, tasks: readonly string[]): void {
  if (!isObject(group)) throw fail(`${where} must be a group object, got ${preview(group)}`);
  if (!tasks.includes(group.taskName))
    throw fail(`${where}.taskName must be a task of the config (${tasks.join(', ')}), got ${preview(group.taskName)}`);
  if (!STATUSES.includes(group.status))
    throw fail(`${where}.status must be one of ${STATUSES.join(', ')}, got ${preview(group.status)}`);
  const rollouts: unknown = group.rollouts;
  if (!Array.isArray(rollouts)) throw fail(`${where}.rollouts must be an array, got ${preview(rollouts)}`);
  rollouts.forEach((rollout: { turns?: unknown; status?: unknown; reward?: unknown } | null, r) => {
    if (!STATUSES.includes(rollout?.status))
      throw fail(
        `${where}.rollouts[${r}].status must be one of ${STATUSES.join(', ')}, got ${preview(rollout?.status)}`,
      );
    if (!Number.isFinite(rollout?.reward))
      throw fail(`${where}.rollouts[${r}].reward must be a finite number, got ${preview(rollout?.reward)}`);
    const turns = rollout?.turns;
    if (!Array.isArray(turns)) throw fail(`${where}.rollouts[${r}].turns must be an array, got ${preview(turns)}`);
    turns.forEach((turn: unknown, t) => {
      if (typeof turn !== 'object' || turn === null)
        throw fail(`${where}.rollouts[${r}].turns[${t}] must be an object, got ${preview(turn)}`);
    });
  });
}

/** What sharing conversations again relies on, once expanded: a messages array and Int32Array-or-null prompt ids per turn. */
function checkTurnFields(group: RolloutGroup, where: string): void {
  group.rollouts.forEach((rollout, r) =>
    rollout.turns.forEach((turn, t) => {
      const at = `${where}.rollouts[${r}].turns[${t}]`;
      if (!Array.isArray(turn.messages)) throw fail(`${at}.messages must be an array, got ${preview(turn.messages)}`);
      if (turn.promptIds !== null && !(turn.promptIds instanceof Int32Array))
        throw fail(`${at}.promptIds must be an Int32Array or null, got ${preview(turn.promptIds)}`);
    }),
  );
}

/**
 * What the file did not keep shared (it holds no shared objects; version 1 wrote every turn whole) is
 * shared again, as the run that wrote it held it, in place: prompt ids as the agent loop shares them
 * (worker/prompt-prefix.ts), and each message equal to the one at its place in the agent's previous
 * turn becomes that very object again.
 */
function shareConversations(group: RolloutGroup): void {
  for (const rollout of group.rollouts) {
    const previous = new Map<string | null, ChatMessage[]>();
    for (let i = 0; i < rollout.turns.length; i++) {
      const { messages, agentId } = rollout.turns[i];
      const before = previous.get(agentId) ?? [];
      const shared = sharedMessageCount(before, messages);
      for (let k = 0; k < shared; k++) messages[k] = before[k];
      previous.set(agentId, messages);
      if (i > 0) sharePromptPrefix(rollout.turns, 0, i);
    }
  }
}

/** Versions before 3: the progress counters under the names they had then, renamed in place. */
function renameFormerProgressFields(state: Record<string, unknown>): void {
  const progress = isObject(state.producer) ? state.producer.progress : undefined;
  if (!isObject(progress)) return; // checkSnapshotShape names what is missing
  for (const [now, then] of Object.entries(FORMER_PROGRESS_NAMES)) {
    if (now in progress || !(then in progress)) continue;
    progress[now] = progress[then];
    delete progress[then];
  }
}

export function readCheckpoint(path: string, config: ResolvedConfig): ProducerSnapshot {
  let bytes: Uint8Array;
  try {
    bytes = readFileSync(path);
  } catch (err) {
    throw new RolloutEngineError('ERR_CHECKPOINT', `resumeFrom: cannot read ${path}: ${(err as Error).message}`);
  }
  const state = decodeCheckpoint(bytes, path);
  if (state.v !== CHECKPOINT_VERSION && state.v !== COMPACT_GROUPS_VERSION && state.v !== WHOLE_GROUPS_VERSION) {
    throw fail(
      `${path}: checkpoint version ${String(state.v)} is not supported (expected ${WHOLE_GROUPS_VERSION}, ${COMPACT_GROUPS_VERSION} or ${CHECKPOINT_VERSION})`,
    );
  }
  if (state.v !== CHECKPOINT_VERSION) renameFormerProgressFields(state);
  const saved = state.fingerprint;
  if (!isObject(saved)) throw fail(`${path}: fingerprint must be an object, got ${preview(saved)}`);
  const current = configFingerprint(config);
  const differences = [...new Set([...Object.keys(saved), ...Object.keys(current)])]
    .filter((k) => JSON.stringify(saved[k]) !== JSON.stringify(current[k]))
    .map((k) => `${k}: checkpoint has ${JSON.stringify(saved[k])}, config has ${JSON.stringify(current[k])}`);
  if (differences.length > 0) {
    throw new RolloutEngineError(
      'ERR_CHECKPOINT_MISMATCH',
      `${path} was written by a run with a different config:\n  - ${differences.join('\n  - ')}`,
    );
  }
  const tasks = config.tasks.map((t) => t.name);
  const producer = checkSnapshotShape(state, path, tasks);
  // Written before the batch stats counted the rollouts past the stale threshold, the inexact
  // tokens or the history rewrites: none were counted then.
  const stats = producer.lastBatch?.stats;
  if (stats && stats.staleness.pastThreshold === undefined) stats.staleness.pastThreshold = 0;
  if (stats && stats.inexactTokens === undefined) stats.inexactTokens = 0;
  if (stats && stats.historyRewrites === undefined) stats.historyRewrites = 0;
  if (stats && stats.historySplits === undefined) stats.historySplits = 0;
  const groups: [RolloutGroup, string][] = [
    ...producer.buffer.groups.map((g, i): [RolloutGroup, string] => [g, `${path}: producer.buffer.groups[${i}]`]),
    ...producer.inFlight.map((g, i): [RolloutGroup, string] => [g, `${path}: producer.inFlight[${i}]`]),
    ...(producer.lastBatch?.groups ?? []).map((g, i): [RolloutGroup, string] => [
      g,
      `${path}: producer.lastBatch.groups[${i}]`,
    ]),
  ];
  for (const [group, where] of groups) {
    checkGroupShape(group, where, tasks);
    if (state.v !== WHOLE_GROUPS_VERSION) expandGroup(group, where);
    checkTurnFields(group, where);
    shareConversations(group);
  }
  return producer;
}

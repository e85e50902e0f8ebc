/**
 * The JSON values a run keeps in its state bucket and sends on its control subject (./names.ts), with
 * the checks a node applies to what it reads: a value from the bucket is input from another process.
 */
import type { ResolvedConfig } from '../config.ts';
import type { ServerInfo } from '../llm/servers.ts';
import { PauseControl } from '../coordinator/pause-control.ts';
import { CONTROL, readWeightVersion, RunState } from '../protocol/control-block.ts';
import { ProtocolError } from '../errors.ts';
import { PROTOCOL_VERSION } from '../protocol/messages.ts';

/** `run`: what a node needs to start workers like the coordinator's own. */
export interface RunSettings {
  v: typeof PROTOCOL_VERSION;
  config: ResolvedConfig;
  llmUrls: string[];
  servers: ServerInfo[];
  gatewayUrl: string | null;
  /** The largest message the server takes (its max_payload), as the coordinator saw it. */
  maxPayload: number;
}

export type ControlStateName = 'running' | 'paused' | 'cancel';

/**
 * `control`, and the body of a control request: the coordinator's control block (protocol/control-block.ts)
 * as data. `epoch` is the coordinator's; a node applies a state once per epoch, whichever way it came.
 */
export interface ControlState {
  state: ControlStateName;
  /** The coordinator's (nextIncarnation): a restarted coordinator's epochs start again from 0. */
  incarnation: number;
  epoch: number;
  modelStep: number;
  weightVersion: string | null;
}

/** A node's answer to a control request: it applied `epoch` and every one of its threads acknowledged. */
export interface ControlAnswer {
  node: string;
  epoch: number;
  /** Wall-clock µs of the last inference call the node's threads sent (0: none yet). */
  lastSendUs: number;
  /** Milliseconds from the request's arrival until its threads acknowledged; null: not all did in time. */
  ackedMs: number | null;
}

/** `nodes.<id>`: a node's heartbeat. */
export interface NodeRecord {
  id: string;
  host: string;
  pid: number;
  threads: number;
  groupsInFlight: number;
  groupsDone: number;
  startedAt: number;
  /** The node's wall clock when it wrote this. */
  heartbeatAt: number;
  /** Where its /metrics answer, or null. */
  metricsUrl: string | null;
}

const STATE_NAMES: Record<number, ControlStateName> = {
  [RunState.RUNNING]: 'running',
  [RunState.PAUSED]: 'paused',
  [RunState.CANCEL]: 'cancel',
};

/** The coordinator's control block as it is now. */
export function readControl(block: SharedArrayBuffer, incarnation: number): ControlState {
  const view = new Int32Array(block);
  return {
    state: STATE_NAMES[Atomics.load(view, CONTROL.STATE)] ?? 'paused',
    incarnation,
    epoch: Atomics.load(view, CONTROL.EPOCH),
    modelStep: Atomics.load(view, CONTROL.MODEL_STEP),
    weightVersion: readWeightVersion(block),
  };
}

/** Writes `state` into a node's own control block; its threads see it as they see a local pause. */
export function applyControl(control: PauseControl, state: ControlState): void {
  if (state.state === 'running') control.resume(state.modelStep, state.weightVersion);
  else if (state.state === 'cancel') control.cancel();
  else control.pause();
}

const decoder = new TextDecoder();

export function encodeJson(value: unknown): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(value));
}

function parseJson(bytes: Uint8Array, what: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(decoder.decode(bytes));
  } catch (err) {
    throw new ProtocolError(`${what}: not JSON (${(err as Error).message})`);
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    throw new ProtocolError(`${what}: expected an object`);
  return value as Record<string, unknown>;
}

export function parseControl(bytes: Uint8Array): ControlState {
  const v = parseJson(bytes, 'control state');
  if (v.state !== 'running' && v.state !== 'paused' && v.state !== 'cancel')
    throw new ProtocolError(`control state.state must be running, paused or cancel (got ${JSON.stringify(v.state)})`);
  if (!Number.isInteger(v.incarnation))
    throw new ProtocolError(`control state.incarnation must be an integer (got ${JSON.stringify(v.incarnation)})`);
  if (!Number.isInteger(v.epoch))
    throw new ProtocolError(`control state.epoch must be an integer (got ${JSON.stringify(v.epoch)})`);
  if (!Number.isInteger(v.modelStep))
    throw new ProtocolError(`control state.modelStep must be an integer (got ${JSON.stringify(v.modelStep)})`);
  if (v.weightVersion !== null && typeof v.weightVersion !== 'string')
    throw new ProtocolError(
      `control state.weightVersion must be a string or null (got ${JSON.stringify(v.weightVersion)})`,
    );
  return v as unknown as ControlState;
}

export function parseRunSettings(bytes: Uint8Array): RunSettings {
  const v = parseJson(bytes, 'run settings');
  if (v.v !== PROTOCOL_VERSION)
    throw new ProtocolError(
      `run settings are of protocol ${JSON.stringify(v.v)}; this node speaks ${PROTOCOL_VERSION}: run the same rollout-engine version on the coordinator and the nodes`,
    );
  if (typeof v.config !== 'object' || v.config === null || !Array.isArray(v.llmUrls))
    throw new ProtocolError('run settings: config and llmUrls are missing');
  return v as unknown as RunSettings;
}

export function parseNodeRecord(bytes: Uint8Array): NodeRecord {
  const v = parseJson(bytes, 'node record');
  if (typeof v.id !== 'string' || typeof v.heartbeatAt !== 'number')
    throw new ProtocolError('node record: id and heartbeatAt are missing');
  return v as unknown as NodeRecord;
}

export function parseControlAnswer(bytes: Uint8Array): ControlAnswer {
  const v = parseJson(bytes, 'control answer');
  if (typeof v.node !== 'string' || !Number.isInteger(v.epoch))
    throw new ProtocolError('control answer: node and epoch are missing');
  return v as unknown as ControlAnswer;
}

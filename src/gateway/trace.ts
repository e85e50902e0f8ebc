/**
 * What a session keeps: one token buffer for its main conversation, one trace per main call, and one
 * trace per side call.
 *
 * Invariant (main calls): `tokens` is the last main call's prompt followed by its completion, and
 * every earlier main call's prompt is a prefix of it (delta tokenization only ever appends). So a
 * main trace stores where its prompt ends instead of a copy of it — memory stays O(context) per
 * session instead of O(turns × context) — plus a hash of the prompt it sent and its own copy of the
 * completion, which is what stitching checks the buffer against.
 *
 * A side call (prompt.ts) is by definition not a prefix of `tokens`, so its trace holds its own
 * prompt ids and never touches the buffer or the main traces. There are at most `maxSideCalls` of
 * them per session, which bounds a session at O((1 + maxSideCalls) × context).
 */
import type { RoutedExperts, SamplingMask } from '../domain/routing.ts';

export interface CallTimings {
  /** Chat-template rendering of the whole conversation. */
  renderMs: number;
  /** Prefix check plus tokenization of the new text. */
  tokenizeMs: number;
  /** The backend round trip (generation included). */
  backendMs: number;
  /** From the body being parsed to the answer being ready: gateway overhead = totalMs − backendMs. */
  totalMs: number;
}

/** A call of the session's main conversation. */
export interface CallTrace {
  /** 0-based position of the call among the session's calls, main and side (a retry takes the place of the call it replaces). */
  index: number;
  /** The call's prompt is `tokens[0, promptLength)` of its session. */
  promptLength: number;
  /** Ids the gateway tokenized for this call: the new part of the conversation (all of it on the first call). */
  deltaLength: number;
  /** FNV-1a of the prompt ids as sent to the backend. */
  promptHash: number;
  completionIds: Int32Array;
  /** Logprob of each completion token under the policy that sampled it. */
  logprobs: Float32Array;
  finishReason: string;
  /** Weight version that generated the completion (the backend's report, else the gateway's model step). */
  modelStep: number;
  timings: CallTimings;
  /**
   * Experts each position of the call's prompt ++ completion was routed to, as the backend reported
   * them (gateway option `routedExperts`): a main call extending the session asks only from where
   * the session's rows end, so its rows start there; a side call's start at 0. Absent when not sent.
   */
  routedExperts?: RoutedExperts;
  /** Each completion token's sampling support (gateway option `samplingMasks`), when sent. */
  samplingMask?: SamplingMask;
}

/** A call that did not extend the main conversation: its whole render tokenized, its prompt ids its own. */
export interface SideCallTrace extends Omit<CallTrace, 'promptLength' | 'promptHash'> {
  promptIds: Int32Array;
}

/**
 * A trace with its prompt ids materialised (for main calls, views into one copy of the session's
 * tokens); `promptLength` is `promptIds.length` for either kind.
 */
export interface CallRecord extends Omit<CallTrace, 'promptHash'> {
  /** `main`: a call of the session's conversation (an action of the stitched sample); `side`: a side call, a sample of its own. */
  kind: 'main' | 'side';
  promptIds: Int32Array;
}

/**
 * Every call of a session with its prompt ids, in call order. The main calls' views share one buffer,
 * so this costs O(context) plus the side calls' own prompts, not O(calls × context).
 */
export function callRecords(
  tokens: ArrayLike<number>,
  traces: readonly CallTrace[],
  sideCalls: readonly SideCallTrace[] = [],
): CallRecord[] {
  const all = Int32Array.from(tokens);
  const main = traces.map(
    ({ promptHash: _hash, ...trace }): CallRecord => ({
      ...trace,
      kind: 'main',
      promptIds: all.subarray(0, trace.promptLength),
    }),
  );
  if (sideCalls.length === 0) return main;
  const side = sideCalls.map((trace): CallRecord => ({ ...trace, kind: 'side', promptLength: trace.promptIds.length }));
  return main.concat(side).sort((a, b) => a.index - b.index);
}

const FNV_OFFSET = 0x811c9dc5;
const FNV_PRIME = 0x01000193;

/** FNV-1a over 32-bit ids, continuing from `hash` (so a prefix hash can be extended). */
export function hashIds(ids: ArrayLike<number>, from = 0, to = ids.length, hash = FNV_OFFSET): number {
  let h = hash;
  for (let i = from; i < to; i++) {
    const v = ids[i];
    h = Math.imul(h ^ (v & 0xff), FNV_PRIME);
    h = Math.imul(h ^ ((v >>> 8) & 0xff), FNV_PRIME);
    h = Math.imul(h ^ ((v >>> 16) & 0xff), FNV_PRIME);
    h = Math.imul(h ^ (v >>> 24), FNV_PRIME);
  }
  return h >>> 0;
}

export const EMPTY_HASH = FNV_OFFSET >>> 0;

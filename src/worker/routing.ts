/**
 * Keeping a turn's routed experts and sampling mask on the tokens they belong to (domain/routing.ts,
 * docs/ROUTING-REPLAY.md) at the two splices the agent loop makes:
 *
 * - a new turn whose prompt extends the previous turn's sequence keeps only the rows after that
 *   turn's (a token-in call asked only for those; a chat call got them all, and the extra are let go);
 * - a continued partial reply (a generation cut by a pause, continued after the weight update) gets
 *   the partial's rows followed by the continuation's — when the continuation's prompt is exactly
 *   the partial's prompt and tokens (token-in, always); a chat continuation whose prompt came back
 *   tokenized otherwise keeps the partial's rows only. Its sampling masks are joined likewise.
 *
 * Rows that would not line up are dropped, never moved: every row kept is for the token at its
 * position. A reply whose rows or mask do not fit its own tokens is a bad reply.
 */
import { extendsSequence, type TurnRecord } from '../domain/rollout.ts';
import {
  concatMasks,
  concatRouted,
  maskTokens,
  routedFrom,
  routedProblem,
  type RoutedExperts,
} from '../domain/routing.ts';
import { LlmError } from '../llm/errors.ts';

/** Where a turn's rows end (the next position lacking one); 0 without rows. */
export function routedEnd(turn: TurnRecord | null | undefined): number {
  const r = turn?.routedExperts;
  return r === undefined ? 0 : r.start + r.rows;
}

/** A reply's rows and mask against its own tokens; a mismatch is the server's fault. */
function checkReply(turn: TurnRecord): void {
  const length = (turn.promptIds?.length ?? 0) + (turn.responseIds?.length ?? 0);
  const r = turn.routedExperts;
  if (r !== undefined) {
    const problem = turn.promptIds === null ? 'the reply has no prompt ids to place them on' : routedProblem(r, length);
    if (problem !== null) throw new LlmError('ERR_LLM_BAD_REPLY', `inference reply: routed experts: ${problem}`);
  }
  const m = turn.samplingMask;
  if (m !== undefined && maskTokens(m) !== (turn.responseIds?.length ?? -1))
    throw new LlmError(
      'ERR_LLM_BAD_REPLY',
      `inference reply: sampling mask covers ${maskTokens(m)} tokens, the reply has ${turn.responseIds?.length ?? 0}`,
    );
}

/** A new turn (not a continuation): its rows checked, and those `previous` already holds let go. */
export function alignTurnRouting(turn: TurnRecord, previous: TurnRecord | undefined): void {
  checkReply(turn);
  const r = turn.routedExperts;
  if (r === undefined || previous === undefined) return;
  const end = routedEnd(previous);
  if (end <= r.start || turn.promptIds === null || previous.promptIds === null || previous.responseIds === null) return;
  if (!extendsSequence(turn.promptIds, previous.promptIds, previous.responseIds)) return;
  const kept = routedFrom(r, end);
  if (kept === null) delete turn.routedExperts;
  else turn.routedExperts = kept;
}

/**
 * `turn` (the continuation's reply, before it is merged) gets the rows and mask of the whole merged
 * turn: the partial's, then its own where they line up.
 */
export function continuationRouting(partial: TurnRecord, turn: TurnRecord): void {
  checkReply(turn);
  const mine = turn.routedExperts;
  const theirs = partial.routedExperts;
  let joined: RoutedExperts | undefined = theirs;
  const samePrompt =
    turn.promptIds !== null &&
    partial.promptIds !== null &&
    partial.responseIds !== null &&
    turn.promptIds.length === partial.promptIds.length + partial.responseIds.length &&
    extendsSequence(turn.promptIds, partial.promptIds, partial.responseIds);
  if (mine !== undefined && samePrompt) {
    if (theirs === undefined) joined = mine;
    else {
      const after = routedFrom(mine, theirs.start + theirs.rows);
      const both = after === null ? theirs : concatRouted(theirs, after);
      // Not contiguous (the continuation began later than the partial's rows end): the longer run stays.
      joined = both ?? (after !== null && after.rows > theirs.rows ? after : theirs);
    }
  }
  if (joined === undefined) delete turn.routedExperts;
  else turn.routedExperts = joined;
  const a = partial.samplingMask;
  const b = turn.samplingMask;
  const partialTokens = partial.responseIds?.length ?? 0;
  if (a !== undefined && b !== undefined) turn.samplingMask = concatMasks(a, b);
  else if (b !== undefined && partialTokens === 0) turn.samplingMask = b;
  else delete turn.samplingMask; // one part without a mask: no mask lines up with every token
}

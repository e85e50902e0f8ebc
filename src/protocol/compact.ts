/**
 * The compact form of groups: turns that do not repeat the conversation. The trainer gets it from
 * `POST /batch {"compact": true}` and `rollout run --compact`; checkpoint files are written in it.
 *
 * With the whole conversation sent (messageCut 0, or until trimming starts), turn k of a multi-turn
 * rollout is sent everything so far: its `messages` and its `promptIds` begin with turn k−1's.
 * Written out per turn, a rollout's batch entry grows with the square of its turns (the bench's 16
 * turns of 200-token answers: 322 KiB of msgpack per rollout, 108 KiB compact). In the compact form a
 * turn whose messages (or prompt ids) are the first `length` of a later turn's of the same agent names
 * that turn instead:
 *
 *   "messages": null,  "messagesPrefixOf":  { "turn": j, "length": n }   →  turns[j].messages[:n]
 *   "promptIds": null, "promptIdsPrefixOf": { "turn": j, "length": n }   →  turns[j].promptIds[:n]
 *
 * (`turn` indexes the rollout's `turns`; turn j carries its field whole; with msgpack the ids are
 * int32 bytes, so the prefix is the first 4·n bytes.) Everything else is as in the full form, and the
 * batch the engine holds for redelivery is not changed.
 */
import { preview, RolloutEngineError } from './errors.ts';
import {
  idsStartWith,
  sharedMessageCount,
  type ChatMessage,
  type RolloutGroup,
  type RolloutState,
  type TurnRecord,
} from './rollout.ts';

interface CompactTurnFields {
  messagesPrefixOf?: { turn: number; length: number };
  promptIdsPrefixOf?: { turn: number; length: number };
}

type CompactTurn = Omit<TurnRecord, 'messages'> & { messages: ChatMessage[] | null } & CompactTurnFields;
type CompactRollout = Omit<RolloutState, 'turns'> & { turns: CompactTurn[] };
/** A group as the compact form writes it: a turn's `messages` / `promptIds` may be null, named by a prefix reference. */
export type CompactGroup = Omit<RolloutGroup, 'rollouts'> & { rollouts: CompactRollout[] };

/** One group in the compact form, a copy; the group given is not changed. */
export function compactGroup(group: RolloutGroup): CompactGroup {
  return { ...group, rollouts: group.rollouts.map(compactRollout) };
}

function compactRollout(rollout: RolloutState): CompactRollout {
  const turns: CompactTurn[] = rollout.turns.slice();
  // Scanning backwards, per agent: the nearest later turn that carries its messages / ids whole.
  const messagesCarrier = new Map<string | null, number>();
  const idsCarrier = new Map<string | null, number>();
  for (let i = turns.length - 1; i >= 0; i--) {
    const turn = rollout.turns[i];
    let compact: CompactTurn = turn;
    // A turn with nothing in a field neither names a carrier nor becomes one: the chain goes past it.
    if (turn.messages.length > 0) {
      const m = messagesCarrier.get(turn.agentId);
      if (m !== undefined && sharedMessageCount(turn.messages, rollout.turns[m].messages) === turn.messages.length) {
        compact = { ...compact, messages: null, messagesPrefixOf: { turn: m, length: turn.messages.length } };
      } else {
        messagesCarrier.set(turn.agentId, i);
      }
    }
    if (turn.promptIds !== null && turn.promptIds.length > 0) {
      const p = idsCarrier.get(turn.agentId);
      const carried = p === undefined ? null : rollout.turns[p].promptIds;
      if (p !== undefined && carried !== null && idsStartWith(carried, turn.promptIds)) {
        compact = { ...compact, promptIds: null, promptIdsPrefixOf: { turn: p, length: turn.promptIds.length } };
      } else {
        idsCarrier.set(turn.agentId, i);
      }
    }
    turns[i] = compact;
  }
  return { ...rollout, turns };
}

/**
 * The full form again, in place (a checkpoint read back): each named prefix becomes the carrier's
 * first messages (the same objects) and a view of its prompt ids. A reference that names no carrier
 * holding enough is an ERR_CHECKPOINT naming the field.
 */
export function expandGroup(group: RolloutGroup, where: string): RolloutGroup {
  group.rollouts.forEach((rollout, r) => {
    rollout.turns.forEach((turn, t) => {
      const compact = turn as CompactTurn;
      const at = `${where}.rollouts[${r}].turns[${t}]`;
      if (compact.messagesPrefixOf !== undefined) {
        turn.messages = prefixOf(
          rollout.turns,
          compact.messagesPrefixOf,
          'messages',
          `${at}.messagesPrefixOf`,
        ) as ChatMessage[];
        delete compact.messagesPrefixOf;
      }
      if (compact.promptIdsPrefixOf !== undefined) {
        turn.promptIds = prefixOf(
          rollout.turns,
          compact.promptIdsPrefixOf,
          'promptIds',
          `${at}.promptIdsPrefixOf`,
        ) as Int32Array;
        delete compact.promptIdsPrefixOf;
      }
    });
  });
  return group;
}

function prefixOf(
  turns: TurnRecord[],
  ref: unknown,
  field: 'messages' | 'promptIds',
  where: string,
): ChatMessage[] | Int32Array {
  const { turn, length } = (ref ?? {}) as { turn?: unknown; length?: unknown };
  const carried: unknown = Number.isInteger(turn)
    ? (turns[turn as number] as CompactTurn | undefined)?.[field]
    : undefined;
  const kindOk = field === 'messages' ? Array.isArray(carried) : carried instanceof Int32Array;
  if (
    !kindOk ||
    !Number.isInteger(length) ||
    (length as number) < 0 ||
    (length as number) > (carried as unknown[] | Int32Array).length
  ) {
    throw new RolloutEngineError(
      'ERR_CHECKPOINT',
      `${where} must name a turn whose ${field} has at least its length, got ${preview(ref)}`,
    );
  }
  return carried instanceof Int32Array
    ? carried.subarray(0, length as number)
    : (carried as ChatMessage[]).slice(0, length as number);
}

/**
 * A multi-turn episode's prompts grow by appending: turn k's prompt is turn k−1's prompt, its reply
 * and the environment's next message. The server returns each prompt's ids whole, so kept as they
 * come an episode holds (and ships to the main thread) Σ prompt lengths — quadratic in its turns: for a
 * prompt that grows steadily, about n/2 times the last prompt after n turns (15× at 30 turns; the
 * bench's 16-turn episodes hold 8.2× less with this).
 *
 * So when a turn's prompt ids begin with the previous turn's (checked token for token, memcmp), the
 * earlier turns' prompt ids become views into the newer array, and the older arrays are dropped: an
 * episode holds its last prompt plus the responses, and the thread codec lays a buffer shared by
 * views out once (protocol/codec.ts). A prompt that is not an extension (trimming with messageCut,
 * a hook rewriting history, a chat template that re-renders earlier turns) is kept as it came.
 *
 * Invariant: a view this makes starts where the array it replaces started and is no longer, so it
 * holds exactly the ids that array held; nothing is ever written through one.
 */
import { idsStartWith, type TurnRecord } from '../protocol/rollout.ts';

/**
 * After `turns[last]` was recorded: share its prompt ids with the earlier turns of the same agent, back
 * to `from` (turns before it arrived from the coordinator and are never changed: result-delta.ts).
 */
export function sharePromptPrefix(turns: TurnRecord[], from: number, last: number): void {
  const current = turns[last];
  const ids = current.promptIds;
  if (ids === null) return;
  let previous: Int32Array | null = null;
  for (let i = last - 1; i >= from; i--) {
    const turn = turns[i];
    if (turn.agentId !== current.agentId) continue;
    const earlier = turn.promptIds;
    if (earlier === null) return;
    if (previous === null) {
      if (!idsStartWith(ids, earlier)) return;
      previous = earlier;
    } else if (
      earlier.buffer !== previous.buffer ||
      earlier.byteOffset !== previous.byteOffset ||
      earlier.length > previous.length
    ) {
      return; // not a prefix view of the previous turn's ids: the chain of shared prompts ends here
    }
    turn.promptIds = ids.subarray(0, earlier.length);
  }
}

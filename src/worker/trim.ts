import type { ChatMessage } from '../domain/rollout.ts';

/**
 * Keep the system message and the last `2 × messageCut − 1` messages: the current user turn plus
 * `messageCut − 1` earlier exchanges. `messageCut <= 0` keeps everything. Bounds prompt size (and the
 * per-turn record) on long episodes.
 */
export function trimMessages(prompt: readonly ChatMessage[], messageCut: number): ChatMessage[] {
  if (prompt.length === 0) return [];
  if (messageCut <= 0) return prompt.slice();
  const hasSystem = prompt[0].role === 'system';
  const tail = prompt.slice(hasSystem ? 1 : 0);
  let kept = tail.slice(-(messageCut * 2 - 1));
  // A tool result whose call was cut would be refused by the server (no assistant tool_calls before it).
  let orphans = 0;
  while (orphans < kept.length && kept[orphans].role === 'tool') orphans++;
  if (orphans > 0) kept = kept.slice(orphans);
  return hasSystem ? [prompt[0], ...kept] : kept;
}

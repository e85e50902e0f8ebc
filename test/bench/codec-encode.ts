/**
 * Thread codec microbenchmark: encode time per group result, for groups built as a worker builds them
 * (every array its own buffer) and as the main thread sends them on (views into one decoded block).
 * Not part of `npm run bench`; for A/B runs of src/protocol/codec.ts changes:
 *
 *   node --import tsx test/bench/codec-encode.ts
 */
import { decodeMessage, encodeMessage } from '../../src/protocol/codec.ts';
import { PROTOCOL_VERSION, type GroupResultMessage } from '../../src/protocol/messages.ts';
import { newGroup, Status, type ChatMessage } from '../../src/protocol/rollout.ts';
// Worker-like groups: 4 rollouts x 7 turns, every array its own buffer (as a worker builds them).
const groups = Array.from({ length: 64 }, (_, g): GroupResultMessage => {
  const group = newGroup({ taskName: 'bench', promptIndex: g, drawIndex: g, seed: g, envParams: {} }, 4);
  const system = { role: 'system' as const, content: 'You are playing a number guessing game.' };
  for (const r of group.rollouts) {
    const messages: ChatMessage[] = [system, { role: 'user', content: 'Make your first guess.' }];
    for (let step = 1; step <= 7; step++) {
      r.turns.push({
        step,
        agentId: null,
        messages: messages.slice(),
        response: 'I guess 50',
        finishReason: 'stop',
        promptIds: Int32Array.from({ length: 90 + 20 * step }, (_, i) => i),
        responseIds: Int32Array.from({ length: 8 }, (_, i) => i),
        logprobs: new Float32Array(8).fill(-0.5),
        modelSteps: null,
        seed: 1,
        modelStep: 0,
        reward: 0,
        terminated: false,
        truncated: false,
        trainable: true,
        timings: { inferenceMs: 1, envMs: 1, totalMs: 2 },
      });
      messages.push({ role: 'assistant', content: 'I guess 50' }, { role: 'user', content: 'higher' });
    }
    r.status = Status.COMPLETED;
  }
  return { v: PROTOCOL_VERSION, type: 'group-result', group, keptTurns: [0, 0, 0, 0], workerId: 0 };
});
const decoded = groups.map((m) => decodeMessage(encodeMessage(m)) as GroupResultMessage);
for (const [name, msgs] of [
  ['worker-built', groups],
  ['decoded (main, sent on)', decoded],
] as const) {
  for (let i = 0; i < 50; i++) for (const m of msgs) encodeMessage(m);
  const t0 = performance.now();
  let n = 0;
  for (let i = 0; i < 100; i++)
    for (const m of msgs) {
      encodeMessage(m);
      n++;
    }
  console.log(`${name}: ${(((performance.now() - t0) * 1000) / n).toFixed(1)} µs per group encode`);
}

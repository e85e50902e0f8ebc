/**
 * The engine end to end against a real inference server: llama.cpp's llama-server (built by setup.ts
 * from the source node-llama-cpp ships), serving a tiny random-weight model with Qwen2.5's tokenizer
 * and chat template (make_model.py). What the engine gets from it, in chat and in tokens mode, is what
 * the inference-server table of docs/INFERENCE-SERVERS.md says for llama.cpp.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { createEngine, Status, type Engine, type EngineConfigInput } from '../../src/index.ts';
import { loadChatModel, type ChatModel } from '../../src/chat-model/model.ts';
import type { RolloutState } from '../../src/domain/rollout.ts';
import OpenAI from 'openai';
import { MODEL_NAME, realServerAvailable, startLlamaServer, type LlamaServer } from '../support/llama-server.ts';
import { spawnServer } from '../fixtures/flaky-env-server.ts';
import { PauseControl } from '../../src/coordinator/pause-control.ts';
import { PauseGate } from '../../src/worker/pause-gate.ts';
import { llmClient } from '../support/clients.ts';

const MAIN = new URL('../../src/cli/main.ts', import.meta.url).pathname;

const available = realServerAvailable();
const skip = available.ok || process.env.CI === 'true' ? false : available.reason;

let qwen: ChatModel;
const engines: Engine[] = [];

function engine(server: LlamaServer, config: EngineConfigInput): Engine {
  const e = createEngine({
    logLevel: 'silent',
    batchSize: 2,
    workers: { threads: 1 },
    ...config,
    llm: { url: server.url, model: MODEL_NAME, timeoutMs: 60_000, ...config.llm },
    tasks: config.tasks ?? [
      {
        name: 'guess',
        env: { module: 'builtin:guess-number' },
        groupSize: 2,
        maxSteps: 4,
        messageCut: 0,
        maxTokens: 48,
      },
    ],
  });
  engines.push(e);
  return e;
}

function rolloutsOf(batch: Awaited<ReturnType<Engine['getBatch']>>): RolloutState[] {
  assert.equal(batch.status, 'NORMAL');
  return batch.groups.flatMap((g) => g.rollouts);
}

/** GET /slots until `test` holds of them, or the bound: the server's own word on what is generating. */
async function slotsWithin(
  server: LlamaServer,
  ms: number,
  test: (slots: { is_processing: boolean }[]) => boolean,
): Promise<boolean> {
  const deadline = performance.now() + ms;
  while (performance.now() < deadline) {
    const slots = (await (await fetch(`${server.url}/slots`, { signal: AbortSignal.timeout(5_000) })).json()) as {
      is_processing: boolean;
    }[];
    if (test(slots)) return true;
    await new Promise((r) => setTimeout(r, 20));
  }
  return false;
}

/** Until no slot is processing: generation stopped. */
const slotsIdleWithin = (server: LlamaServer, ms: number) =>
  slotsWithin(server, ms, (slots) => slots.every((s) => !s.is_processing));

/** Until a slot is processing: a generation began. */
const slotBusyWithin = (server: LlamaServer, ms: number) =>
  slotsWithin(server, ms, (slots) => slots.some((s) => s.is_processing));

/** The server's count of tokens generated since it started (`--metrics`). */
async function tokensPredicted(server: LlamaServer): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
  const m = /^llamacpp:tokens_predicted_total (\S+)$/m.exec(text);
  assert.ok(m, text);
  return Number(m[1]);
}

describe('the engine against a real llama.cpp server', { skip, timeout: 600_000 }, () => {
  let server: LlamaServer;
  before(async () => {
    [server, qwen] = await Promise.all([startLlamaServer({ ctxSize: 8192, slots: 4 }), loadChatModel('qwen2.5')]);
  });
  after(async () => {
    await Promise.all(engines.splice(0).map((e) => e.close()));
    await server?.stop();
  });

  it('chat mode: tells llama.cpp apart at start and keeps each token id (from logprobs.content[].id) with its logprob', async () => {
    const e = engine(server, {});
    await e.start();
    const rollouts = rolloutsOf(await e.getBatch());
    let tokens = 0;
    for (const rollout of rollouts) {
      assert.equal(rollout.status, Status.COMPLETED, rollout.error ?? '');
      for (const turn of rollout.turns) {
        assert.ok(turn.responseIds !== null && turn.logprobs !== null, 'ids and logprobs on every turn');
        assert.equal(turn.responseIds.length, turn.logprobs.length);
        assert.ok(turn.logprobs.every((lp) => lp <= 0));
        assert.ok(
          turn.responseIds.every((id) => qwen.hasToken(id)),
          'ids of the Qwen2.5 vocabulary',
        );
        assert.equal(turn.promptIds, null, 'llama.cpp chat replies carry no prompt ids (tokens mode has them)');
        tokens += turn.responseIds.length;
      }
    }
    assert.ok(tokens > 0);
  });

  it("tokens mode: every turn's prompt ids begin with the previous turn's prompt + response ids, with a logprob per token", async () => {
    // The model ends a reply only when sampled from among its 40 most likely tokens (make_model.py): from
    // its whole distribution, which the engine asks for unless a task truncates, every reply runs to
    // maxTokens and ends the episode. So this task truncates, as a user may (recorded in its groups).
    const e = engine(server, {
      llm: { api: 'tokens' },
      batchSize: 3,
      tasks: [
        {
          name: 'guess',
          env: { module: 'builtin:guess-number' },
          groupSize: 2,
          maxSteps: 4,
          messageCut: 0,
          maxTokens: 48,
          topK: 40,
        },
      ],
    });
    await e.start();
    const batch = await e.getBatch();
    const rollouts = rolloutsOf(batch);
    assert.ok(batch.groups.every((g) => g.sampling?.topK === 40));
    let laterTurns = 0;
    for (const rollout of rollouts) {
      assert.equal(rollout.status, Status.COMPLETED, rollout.error ?? '');
      rollout.turns.forEach((turn, i) => {
        assert.ok(
          turn.promptIds && turn.responseIds && turn.logprobs,
          `turn ${i}: prompt ids, response ids and logprobs`,
        );
        assert.equal(turn.logprobs.length, turn.responseIds.length, `turn ${i}: one logprob per response token`);
        assert.ok(
          turn.logprobs.every((lp) => Number.isFinite(lp) && lp <= 0),
          `turn ${i}: every logprob known, those llama.cpp leaves out computed again`,
        );
        if (i === 0) {
          assert.deepEqual(
            Array.from(turn.promptIds),
            qwen.encode(qwen.render(turn.messages, { addGenerationPrompt: true })),
          );
          return;
        }
        const prev = rollout.turns[i - 1];
        const prefix = [...prev.promptIds!, ...prev.responseIds!];
        assert.deepEqual(
          Array.from(turn.promptIds.subarray(0, prefix.length)),
          prefix,
          `turn ${i} begins with turn ${i - 1}'s prompt + response`,
        );
        laterTurns++;
      });
    }
    assert.ok(laterTurns > 0, 'some episode took several turns (the model ends replies now and then)');
  });

  it('a pause stops generation on the server: streamed calls are cut client-side (llama.cpp has no abort route), every group back at once', async () => {
    const e = engine(server, {
      llm: { stream: true },
      // One step ahead: the next batch's groups are generating when the pause comes.
      producer: { strategy: 'async', partialRollout: true, maxStaleness: 1 },
      batchSize: 4,
      tasks: [
        {
          name: 'guess',
          env: { module: 'builtin:guess-number' },
          groupSize: 4,
          maxSteps: 6,
          messageCut: 0,
          maxTokens: 400,
          // Replies that end now and then (see the tokens-mode test): from the whole distribution every one
          // would run its 400 tokens, and the batch before the pause would take minutes.
          topK: 40,
        },
      ],
    });
    // An async producer runs ahead after the last batch taken: left open, it kept generating on this
    // server through the next test, whose "idle before" could catch a gap between two of its turns and
    // whose "the slot stopped" then saw this engine's slots. Closed here, whatever the test's outcome.
    try {
      await e.start();
      await e.getBatch(1);
      const report = await e.pauseForWeightUpdate();
      assert.equal(report.serverAbort, false, 'no abort route to call');
      assert.ok(report.groupsBack > 0, 'groups were generating when the pause came');
      assert.equal(report.cancelled, true, 'cut client-side');
      assert.equal(report.stillInFlight, 0);
      assert.ok(await slotsIdleWithin(server, 3_000), 'every slot stopped generating');
      await e.resume({ modelStep: 1 });
      const next = rolloutsOf(await e.getBatch(2));
      assert.ok(next.every((r) => r.status === Status.COMPLETED));
    } finally {
      await e.close();
    }
    assert.ok(await slotsIdleWithin(server, 3_000), 'closed, the engine left no slot generating');
  });

  it('a streamed reply whose rollout expires mid-call is cut, and the server stops decoding it (worker/pause-gate.ts signalFor)', async () => {
    const control = new PauseControl(3);
    const gate = new PauseGate(control.block);
    const client = llmClient(server.url, { model: MODEL_NAME, stream: true, timeoutMs: 60_000 });
    try {
      assert.ok(await slotsIdleWithin(server, 30_000), 'idle before');
      control.setOldestUsefulStep(3);
      const before = await tokensPredicted(server);
      // Random weights over the whole vocabulary: end-of-turn is one token in 150 000, so it runs long.
      const call = client.chat(
        { messages: [{ role: 'user', content: 'Hi' }], maxTokens: 1_500, temperature: 1 },
        gate.signalFor(3),
      );
      const outcome = call.then(
        () => null,
        (err: unknown) => err,
      );
      assert.ok(await slotBusyWithin(server, 10_000), 'a slot is generating');
      control.setOldestUsefulStep(4); // the trainer moved on: tokens of weights 3 are too old
      const err = (await outcome) as { code?: string; message?: string } | null;
      assert.equal(err?.code, 'ERR_LLM_ABORTED');
      assert.match(err?.message ?? '', /expired/);
      assert.ok(await slotsIdleWithin(server, 2_000), 'the slot stopped generating');
      const predicted = (await tokensPredicted(server)) - before;
      assert.ok(predicted < 1_500, `stopped after ${predicted} of 1 500 tokens`);
    } finally {
      gate.close();
      await client.close();
    }
  });
});

describe('the engine against a real llama.cpp server with a small context', { skip, timeout: 600_000 }, () => {
  let server: LlamaServer;
  before(async () => {
    [server, qwen] = await Promise.all([startLlamaServer({ ctxSize: 512, slots: 2 }), loadChatModel('qwen2.5')]);
  });
  after(async () => {
    await Promise.all(engines.splice(0).map((e) => e.close()));
    await server?.stop();
  });

  for (const api of ['tokens', 'chat'] as const) {
    it(`${api} mode: episodes that outgrow the context end truncated with their turns, not failed`, async () => {
      const e = engine(server, {
        llm: { api },
        batchSize: 2,
        tasks: [
          {
            name: 'guess',
            env: { module: 'builtin:guess-number' },
            groupSize: 2,
            maxSteps: 40,
            messageCut: 0,
            maxTokens: 64,
          },
        ],
      });
      await e.start();
      const rollouts = rolloutsOf(await e.getBatch());
      // A slot's context, as the server rounds it (640 over 2 slots is not 320 each).
      const slotContext = (server.props.default_generation_settings as { n_ctx: number }).n_ctx;
      for (const rollout of rollouts) {
        assert.equal(rollout.status, Status.COMPLETED, rollout.error ?? '');
        assert.ok(rollout.turns.length > 0);
        // Each episode either ended on its own, hit maxSteps, or outgrew its slot's context: truncated.
        if (rollout.truncated) assert.equal(rollout.turns.at(-1)!.trainable, true);
        if (api === 'tokens') {
          for (const turn of rollout.turns)
            assert.ok(
              turn.promptIds!.length + turn.responseIds!.length <= slotContext,
              `turn ${turn.step}: ${turn.promptIds!.length} + ${turn.responseIds!.length} tokens in a ${slotContext}-token slot`,
            );
        }
      }
      assert.ok(
        rollouts.some((r) => r.truncated && r.finishReason === 'length'),
        'some episode outgrew the context',
      );
    });
  }
});

describe('rollout gateway from the command line in front of the real llama.cpp server', {
  skip,
  timeout: 300_000,
}, () => {
  let server: LlamaServer;
  before(async () => {
    [server, qwen] = await Promise.all([startLlamaServer({ ctxSize: 4096, slots: 1 }), loadChatModel('qwen2.5')]);
  });
  after(async () => {
    await server?.stop();
  });

  it('serves an OpenAI client through llama.cpp /completion and stitches the session into exact tokens', async (t) => {
    const gateway = await spawnServer(
      process.execPath,
      ['--import', 'tsx', MAIN, 'gateway', '--backend', 'llamacpp', '--backend-url', server.url, '--port', '0'],
      /gateway listening on (http:\/\/\S+)/,
    );
    t.after(() => gateway.stop());
    const openai = new OpenAI({
      baseURL: `${gateway.url}/v1/sessions/real`,
      apiKey: 'unused',
      maxRetries: 0,
      timeout: 60_000,
    });
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: 'user', content: 'Guess a number between 1 and 100.' },
    ];
    for (let turn = 0; turn < 2; turn++) {
      const reply = await openai.chat.completions.create({ model: 'qwen2.5', messages, max_tokens: 16 });
      messages.push(
        { role: 'assistant', content: reply.choices[0].message.content ?? '' },
        { role: 'user', content: 'Higher.' },
      );
    }
    const stitched = (await (
      await fetch(`${gateway.url}/v1/sessions/real/stitch`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{}',
      })
    ).json()) as {
      observation_tokens: number[];
      action_ranges: [number, number][];
      rollout_log_probs: number[];
    };
    assert.equal(stitched.action_ranges.length, 2, 'two calls, one action span each');
    assert.ok(stitched.observation_tokens.every((id) => qwen.hasToken(id)));
    for (const [start, end] of stitched.action_ranges) {
      for (let i = start; i < end; i++)
        assert.ok(
          Number.isFinite(stitched.rollout_log_probs[i]) && stitched.rollout_log_probs[i] <= 0,
          `logprob of token ${i}`,
        );
    }
    // The prompt the second call sent begins with the first call's prompt and completion, exactly.
    const firstPrompt = qwen.encode(qwen.render(messages.slice(0, 1) as never, { addGenerationPrompt: true }));
    assert.deepEqual(stitched.observation_tokens.slice(0, firstPrompt.length), firstPrompt);
  });
});

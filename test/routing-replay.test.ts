/**
 * Routing replay and sampling masks kept on their tokens end to end (docs/ROUTING-REPLAY.md).
 *
 * The servers' encodings are read as written from their source (llm/routing-wire.ts names it): vLLM's
 * base64 `.npy` on the choice (vllm/entrypoints/openai/chat_completion/protocol.py
 * @002032ee2b18e1f7bd924ec47b62504ba3866063) and vLLM 0.21's int16 lists split into the response's
 * `prompt_routed_experts` and the choice's `routed_experts` (the same file
 * @0087e005dec9ed37e5564c4d13b38d350ce61992), SGLang's base64 ids in meta_info — int32, or the
 * `meta_info.routed_experts_dtype` it names (python/sglang/srt/state_capturer/routed_experts_wire.py
 * @a6463a1003429d415506fe0d97b4c548b85444e1) — and its per-token support lists.
 * The mock writes each row as a function of its token and position only (mockExpert), so a row that
 * moved to another position or token no longer matches: the property test drives thousands of
 * episodes through aborts, continuations, in-place pauses and kills restored from checkpoints, with
 * replies parsed by the engine's own readers, and checks every row and every support it kept.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { readSglangMask, readSglangRouted, readVllmRouted, npyBase64, sglangBase64 } from '../src/llm/routing-wire.ts';
import { concatRouted, routedFrom, type RoutedExperts } from '../src/domain/routing.ts';
import { TOKEN_WIRES } from '../src/llm/token-wire.ts';
import { parseChatReply, type ChatResult } from '../src/llm/reply.ts';
import type { ChatRequest } from '../src/llm/request.ts';
import { routedStartOf } from '../src/llm/token-chat.ts';
import { runEpisode } from '../src/worker/agent-loop.ts';
import type { ChatClient, EpisodeContext, PauseView } from '../src/worker/episode-context.ts';
import type { Environment, StepResult } from '../src/env/types.ts';
import { newGroup, Status, type RolloutGroup, type RolloutState, type TurnRecord } from '../src/domain/rollout.ts';
import { NO_EXPIRY } from '../src/protocol/control-block.ts';
import { decodeRunGroup, encodeRunGroup } from '../src/protocol/codec.ts';
import { decodeCheckpoint, encodeCheckpoint } from '../src/formats/checkpoint-file.ts';
import { compactGroup, expandGroup } from '../src/formats/compact.ts';
import { startGateway } from '../src/gateway/index.ts';
import { stitchSession } from '../src/llm/gateway-client.ts';
import { startMockLlm } from '../src/mock-llm/server.ts';
import { openaiClient } from './support/clients.ts';
import { assertCallRows, assertRowsOnTokens } from './support/routing.ts';
import {
  mockExpert,
  mockRows,
  mockSupport,
  sglangMaskFields,
  sglangRoutedFields,
  vllmListFields,
  vllmRoutedField,
  type MockRouting,
} from '../src/mock-llm/routing.ts';

const ROUTING: MockRouting = { layers: 3, topK: 2, experts: 64 };
const WIDE: MockRouting = { layers: 2, topK: 2, experts: 300 };

function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const fail = (why: string): Error => new Error(why);

describe('the servers’ routed-expert encodings', () => {
  it('reads a vLLM .npy of uint8 as numpy.save writes it, rows starting at the requested prompt start', () => {
    const b64 = vllmRoutedField([5, 6, 7, 8], 1, ROUTING)!;
    const raw = Buffer.from(b64, 'base64');
    assert.equal(raw.toString('latin1', 0, 6), '\x93NUMPY');
    assert.equal((10 + raw.readUInt16LE(8)) % 64, 0, 'the data starts 64-aligned, as numpy pads the header');
    assert.match(raw.toString('latin1', 10, 10 + raw.readUInt16LE(8)), /'descr': '\|u1'.*'shape': \(2, 3, 2\)/);
    const r = readVllmRouted(b64, 1);
    assert.deepEqual([r.start, r.rows, r.layers, r.topK, r.ids.constructor.name], [1, 2, 3, 2, 'Uint8Array']);
    assert.equal(r.ids[0], mockExpert(6, 1, 0, 0, ROUTING.experts));
    assert.equal(r.ids[6 + 5], mockExpert(7, 2, 2, 1, ROUTING.experts));
  });

  it('reads vLLM int32 and uint16 arrays, keeping ids above 255 in two bytes', () => {
    const values = [1, 2, 300, 4];
    const r = readVllmRouted(npyBase64(values, [1, 2, 2], '<i4'), 0);
    assert.deepEqual([r.ids.constructor.name, [...r.ids]], ['Uint16Array', values]);
    assert.deepEqual([...readVllmRouted(npyBase64(values, [1, 2, 2], '<u2'), 0).ids], values);
  });

  it('keeps binary rows from where they were asked and after leading rows of -1, and names a bad id by its row', () => {
    const lost = readVllmRouted(npyBase64([-1, -1, -1, -1, 3, 4, 5, 6], [4, 1, 2], '<i4'), 2);
    assert.deepEqual(
      [lost.start, lost.rows, lost.ids.constructor.name, [...lost.ids]],
      [4, 2, 'Uint8Array', [3, 4, 5, 6]],
    );
    // Every forwarded position from 0, from a server that does not know the start field: cut at the start asked.
    const all = readSglangRouted(sglangBase64([9, 9, 1, 2, 3, 4], 'int32'), 2, { layers: 1, topK: 2 }, undefined, 4);
    assert.deepEqual([all.start, all.rows, [...all.ids]], [2, 1, [3, 4]]);
    assert.throws(
      () => readVllmRouted(npyBase64([-1, -1, 3, -2], [2, 1, 2], '<i4'), 0),
      /^Error: routed_experts holds -2 at row 1 \(sequence position 1\): not an expert id$/,
    );
  });

  it('refuses a vLLM .npy whose data does not fill its shape, naming the shape', () => {
    const b64 = npyBase64([1, 2, 3], [1, 2, 2], '|u1');
    assert.throws(() => readVllmRouted(b64, 0), /3 bytes of data for shape \(1, 2, 2\)/);
  });

  it('reads SGLang’s base64 int32 with the configured shape, and asks for the shape when none is set', () => {
    const r = readSglangRouted(sglangRoutedFields([9, 10, 11], 0, ROUTING).routed_experts, 0, { layers: 3, topK: 2 });
    assert.equal(r.rows, 2);
    assert.equal(r.ids[6], mockExpert(10, 1, 0, 0, ROUTING.experts));
    assert.throws(() => readSglangRouted('AAAA', 0, null), /set llm.routedExperts to \{"layers"/);
    assert.throws(
      () => readSglangRouted(sglangRoutedFields([9, 10, 11], 0, ROUTING).routed_experts, 0, { layers: 4, topK: 2 }),
      /not whole rows/,
    );
  });

  // vLLM 0.21 (chat_completion/protocol.py @0087e005dec9ed37e5564c4d13b38d350ce61992: the response's
  // prompt_routed_experts [prompt_len, layers, top_k] and the choice's routed_experts [gen_len, …],
  // list[list[list[int]]] of int16; split_routed_experts in fused_moe/routed_experts_capturer.py).
  it('reads vLLM 0.21’s int16 lists as the prompt’s rows from 0 and the generated rows after them', () => {
    const promptIds = [5, 6, 7, 8];
    const ids = [9, 10, 11];
    const sequence = [...promptIds, ...ids];
    const body = {
      ...vllmListFields(promptIds, ids, ROUTING),
      usage: { prompt_tokens: 4, completion_tokens: 3 },
    };
    const choice = { token_ids: ids, logprobs: { token_logprobs: [-1, -1, -1] }, finish_reason: 'stop' };
    const read = (from: number) =>
      TOKEN_WIRES.vllm.parse(
        JSON.parse(JSON.stringify({ ...body, choices: [{ ...choice, routed_experts: body.routed_experts }] })),
        fail,
        { routedFrom: from, routingShape: null, samplingMask: false },
      ).routedExperts!;
    const all = read(0);
    assert.deepEqual([all.start, all.rows, all.layers, all.topK], [0, 6, 3, 2]);
    assert.equal(all.ids[5 * 6 + 3], mockExpert(sequence[5], 5, 1, 1, ROUTING.experts));
    // 0.21 has no routed_experts_prompt_start: every row comes, and those before the asked start go.
    const later = read(3);
    assert.deepEqual([later.start, later.rows], [3, 3]);
    assert.deepEqual([...later.ids], [...all.ids.subarray(3 * 6)]);
  });

  it('keeps vLLM 0.21’s prompt rows when nothing after the first token was forwarded, and reads its chat replies alike', () => {
    const fields = vllmListFields([5, 6, 7], [8], ROUTING);
    assert.equal(fields.routed_experts, null);
    const r = parseChatReply(
      {
        ...fields,
        prompt_token_ids: [5, 6, 7],
        choices: [
          { message: { role: 'assistant', content: 'x' }, finish_reason: 'stop', token_ids: [8], routed_experts: null },
        ],
      },
      { routedExperts: true },
    ).routedExperts!;
    assert.deepEqual([r.start, r.rows], [0, 3]);
    assert.equal(r.ids[2 * 6], mockExpert(7, 2, 0, 0, ROUTING.experts));
  });

  // vLLM 0.21 docs/training/routed_experts_replay.md @0087e005…: "cached positions marked with -1
  // sentinel"; the host cache starts each request's rows at -1 and fills the positions it forwards.
  it('starts a turn’s rows after vLLM 0.21’s leading -1 rows (prefix-cache positions it lost)', () => {
    const unknown = [
      [-1, -1],
      [-1, -1],
    ];
    const body = {
      prompt_routed_experts: [
        unknown,
        unknown,
        [
          [1, 2],
          [3, 4],
        ],
      ],
      choices: [
        {
          token_ids: [7, 8],
          logprobs: { token_logprobs: [-1, -1] },
          finish_reason: 'stop',
          routed_experts: [
            [
              [5, 6],
              [7, 8],
            ],
          ],
        },
      ],
    };
    const r = TOKEN_WIRES.vllm.parse(body, fail, { routedFrom: 0, routingShape: null, samplingMask: false })
      .routedExperts!;
    assert.deepEqual([r.start, r.rows, [...r.ids]], [2, 2, [1, 2, 3, 4, 5, 6, 7, 8]]);
    const torn = {
      ...body,
      prompt_routed_experts: [
        [
          [1, 2],
          [-1, 4],
        ],
        unknown,
        unknown,
      ],
    };
    assert.throws(
      () => TOKEN_WIRES.vllm.parse(torn, fail, { routedFrom: 0, routingShape: null, samplingMask: false }),
      /prompt_routed_experts\[0\] holds -1 \(sequence position 0\): not an expert id/,
    );
  });

  // split_routed_experts clips the generated rows to the generated tokens, not one fewer: with MTP the
  // last token was forwarded (as a draft) and has a row the engine keeps none of.
  it('drops vLLM 0.21’s row for the last generated token, sent when speculative decoding forwarded it', () => {
    const sequence = [5, 6, 7, 8];
    const body = {
      prompt_routed_experts: [[[1]], [[2]]],
      choices: [
        {
          token_ids: [7, 8],
          logprobs: { token_logprobs: [-1, -1] },
          finish_reason: 'stop',
          routed_experts: [[[3]], [[4]]],
        },
      ],
    };
    const r = TOKEN_WIRES.vllm.parse(body, fail, { routedFrom: 0, routingShape: null, samplingMask: false })
      .routedExperts!;
    assert.deepEqual([r.start, r.rows, [...r.ids]], [0, sequence.length - 1, [1, 2, 3]]);
  });

  it('refuses malformed vLLM routed experts naming the field and what it holds', () => {
    const parse = (extra: Record<string, unknown>, routed: unknown) =>
      TOKEN_WIRES.vllm.parse(
        {
          ...extra,
          choices: [
            { token_ids: [7], logprobs: { token_logprobs: [-1] }, finish_reason: 'stop', routed_experts: routed },
          ],
        },
        fail,
        { routedFrom: 0, routingShape: null, samplingMask: false },
      );
    assert.throws(
      () => parse({}, 12),
      /choices\[0\]\.routed_experts must be a base64 \.npy string or a list of \[layers\]\[top_k\] rows \(got 12\)/,
    );
    assert.throws(
      () => parse({ prompt_routed_experts: [[[1, 2]], [[3]]] }, null),
      /prompt_routed_experts\[1\]\[0\] must be a list of 2 integer expert ids \(got \[3\]\)/,
    );
    assert.throws(() => parse({ prompt_routed_experts: [[['a']]] }, null), /got \["a"\]/);
    assert.throws(() => parse({}, [[[1]]]), /without prompt_routed_experts or usage\.prompt_tokens/);
    assert.throws(
      () => parse({ prompt_routed_experts: [[[1]]], usage: { prompt_tokens: 2 } }, null),
      /prompt_routed_experts has 1 rows for a 2-token prompt/,
    );
    assert.throws(() => parse({}, 'bm90IG5weQ=='), /choices\[0\]\.routed_experts is not a base64 \.npy/);
  });

  // SGLang routed_experts_wire.py @a6463a1003429d415506fe0d97b4c548b85444e1: the ids cast to
  // SGLANG_ROUTED_EXPERTS_DTYPE (int32, uint16, uint8; int32 when one does not fit) and the dtype sent
  // as meta_info.routed_experts_dtype (tokenizer_manager.py there); absent = int32, as before it.
  it('reads SGLang’s uint8 and uint16 routed experts by meta_info.routed_experts_dtype, refusing another dtype by name', () => {
    const narrow = sglangRoutedFields([9, 10, 11], 0, { ...ROUTING, sglangDtype: 'uint8' });
    assert.equal(narrow.routed_experts_dtype, 'uint8');
    assert.equal(Buffer.from(narrow.routed_experts, 'base64').length, 2 * 3 * 2);
    const r = readSglangRouted(narrow.routed_experts, 0, { layers: 3, topK: 2 }, narrow.routed_experts_dtype);
    assert.equal(r.ids[6], mockExpert(10, 1, 0, 0, ROUTING.experts));
    // An id past the wire dtype: SGLang sends int32 and says so.
    const wide = sglangRoutedFields([1, 2, 3, 4], 0, { ...WIDE, sglangDtype: 'uint8' });
    assert.ok(mockRows([1, 2, 3, 4], 0, WIDE).some((id) => id > 255));
    assert.equal(wide.routed_experts_dtype, 'int32');
    assert.deepEqual(
      [...readSglangRouted(wide.routed_experts, 0, { layers: 2, topK: 2 }, wide.routed_experts_dtype).ids],
      mockRows([1, 2, 3, 4], 0, WIDE),
    );
    const u16 = readSglangRouted(sglangBase64([1, 300, 2, 65535], 'uint16'), 0, { layers: 1, topK: 2 }, 'uint16');
    assert.deepEqual([u16.rows, [...u16.ids]], [2, [1, 300, 2, 65535]]);
    assert.throws(
      () => readSglangRouted(narrow.routed_experts, 0, { layers: 3, topK: 2 }, 'float16'),
      /meta_info\.routed_experts_dtype is "float16", not "int32", "uint16" or "uint8"/,
    );
  });

  // GenerateReqInput.routed_experts_start_len (python/sglang/srt/managers/io_struct.py): rows
  // [start, seqlen − 1); a server from before the field ignores it and sends [0, seqlen − 1).
  it('places an older SGLang’s rows from 0 when it ignored routed_experts_start_len, keeping those from the asked start', () => {
    const sequence = [9, 10, 11, 12, 13];
    const body = {
      output_ids: [12, 13],
      meta_info: {
        prompt_tokens: 3,
        output_token_logprobs: [
          [-1, 12, null],
          [-1, 13, null],
        ],
        finish_reason: { type: 'stop' },
        routed_experts: sglangRoutedFields(sequence, 0, ROUTING).routed_experts,
      },
    };
    const shape = { layers: 3, topK: 2 };
    const r = TOKEN_WIRES.sglang.parse(body, fail, { routedFrom: 2, routingShape: shape, samplingMask: false })
      .routedExperts!;
    assert.deepEqual([r.start, r.rows], [2, 2]);
    assert.equal(r.ids[0], mockExpert(11, 2, 0, 0, ROUTING.experts));
    const current = {
      ...body,
      meta_info: { ...body.meta_info, routed_experts: sglangRoutedFields(sequence, 2, ROUTING).routed_experts },
    };
    const same = TOKEN_WIRES.sglang.parse(current, fail, { routedFrom: 2, routingShape: shape, samplingMask: false });
    assert.deepEqual(same.routedExperts, r);
  });

  it('reads SGLang’s sampling supports as CSR, refusing a support without its sampled token', () => {
    const m = readSglangMask(sglangMaskFields([4, 9], 10), [4, 9])!;
    assert.deepEqual([...m.offsets], [0, 2, 4]);
    assert.deepEqual([...m.ids], [...mockSupport(4, 10), ...mockSupport(9, 11)]);
    assert.throws(() => readSglangMask({ output_token_sampling_mask: [[5]] }, [4]), /lacks its sampled token 4/);
  });

  it('joins rows only where they meet, and drops the rows before a position', () => {
    const a: RoutedExperts = { start: 0, rows: 2, layers: 1, topK: 1, ids: Uint8Array.of(1, 2) };
    const b: RoutedExperts = { start: 2, rows: 1, layers: 1, topK: 1, ids: Uint16Array.of(700) };
    assert.deepEqual([...concatRouted(a, b)!.ids], [1, 2, 700]);
    assert.equal(concatRouted(a, { ...b, start: 3 }), null);
    assert.deepEqual(routedFrom(a, 1), { start: 1, rows: 1, layers: 1, topK: 1, ids: Uint8Array.of(2) });
  });
});

// --- the property test -------------------------------------------------------------------------------

type Server = 'vllm' | 'vllm-lists' | 'sglang' | 'vllm-chat';

/**
 * A server of `kind` answering the agent loop's calls: its prompt extends the session's sequence
 * (or, now and then, does not: a trimmed or re-rendered prompt), its replies are cut by aborts and
 * kept across in-place pauses, and its body is the server's own, read by the engine's readers.
 */
function fakeServer(kind: Server, random: () => number, routing: MockRouting): ChatClient {
  const token = (): number => Math.floor(random() * 5000);
  return {
    async chat(request: ChatRequest): Promise<ChatResult> {
      let promptIds: number[];
      if (request.continueTokens !== undefined) {
        promptIds = [...request.continueTokens.promptIds, ...request.continueTokens.responseIds];
        // A chat continuation's prompt comes back re-tokenized now and then.
        if (kind === 'vllm-chat' && random() < 0.3) promptIds[promptIds.length - 1] += 1;
      } else if (request.previous?.promptIds != null && request.previous.responseIds !== null && random() < 0.8) {
        promptIds = [...request.previous.promptIds, ...request.previous.responseIds];
        for (let i = 1 + Math.floor(random() * 4); i > 0; i--) promptIds.push(token());
      } else {
        promptIds = Array.from({ length: 2 + Math.floor(random() * 6) }, token);
      }
      const aborted = random() < 0.25;
      const n = Math.min(request.maxTokens, aborted ? Math.floor(random() * 4) : 1 + Math.floor(random() * 6));
      const ids = Array.from({ length: n }, token);
      const finish = aborted ? 'abort' : 'stop';
      const sequence = [...promptIds, ...ids];
      let parsed: {
        routedExperts?: ChatResult['routedExperts'];
        samplingMask?: ChatResult['samplingMask'];
        promptIds: number[];
      };
      const logprobs = ids.map(() => -0.5);
      if (kind === 'vllm') {
        const start = routedStartOf(request, promptIds);
        const body = {
          choices: [
            {
              token_ids: ids,
              logprobs: { token_logprobs: logprobs },
              finish_reason: finish,
              routed_experts: vllmRoutedField(sequence, start, routing),
            },
          ],
        };
        const r = TOKEN_WIRES.vllm.parse(JSON.parse(JSON.stringify(body)), fail, {
          routedFrom: start,
          routingShape: null,
          samplingMask: false,
        });
        parsed = { ...r, promptIds };
      } else if (kind === 'vllm-lists') {
        // vLLM 0.21: every row from 0, the prompt's on the response; the asked start is not read.
        const { prompt_routed_experts, routed_experts } = vllmListFields(promptIds, ids, routing);
        const body = {
          prompt_routed_experts,
          usage: { prompt_tokens: promptIds.length, completion_tokens: n },
          choices: [{ token_ids: ids, logprobs: { token_logprobs: logprobs }, finish_reason: finish, routed_experts }],
        };
        const r = TOKEN_WIRES.vllm.parse(JSON.parse(JSON.stringify(body)), fail, {
          routedFrom: routedStartOf(request, promptIds),
          routingShape: null,
          samplingMask: false,
        });
        parsed = { ...r, promptIds };
      } else if (kind === 'sglang') {
        const start = routedStartOf(request, promptIds);
        const body = {
          output_ids: ids,
          meta_info: {
            output_token_logprobs: ids.map((id) => [-0.5, id, null]),
            finish_reason: { type: finish },
            ...sglangRoutedFields(sequence, start, routing),
            ...sglangMaskFields(ids, promptIds.length),
          },
        };
        const r = TOKEN_WIRES.sglang.parse(JSON.parse(JSON.stringify(body)), fail, {
          routedFrom: start,
          routingShape: { layers: routing.layers, topK: routing.topK },
          samplingMask: true,
        });
        parsed = { ...r, promptIds };
      } else {
        const body = {
          choices: [
            {
              message: { role: 'assistant', content: ids.join(' ') },
              finish_reason: finish,
              token_ids: ids,
              logprobs: { content: ids.map(() => ({ token: 'x', logprob: -0.5 })) },
              routed_experts: vllmRoutedField(sequence, 0, routing),
            },
          ],
          prompt_token_ids: promptIds,
        };
        const r = parseChatReply(JSON.parse(JSON.stringify(body)), { routedExperts: true });
        parsed = { routedExperts: r.routedExperts, promptIds };
      }
      // Now and then a reply kept across an in-place weight update names its weights per span.
      const spans =
        n >= 2 && random() < 0.15
          ? [
              { end: 1, version: '3' },
              { end: n, version: '4' },
            ]
          : undefined;
      return {
        content: ids.join(' '),
        finishReason: finish,
        promptIds: Int32Array.from(parsed.promptIds),
        responseIds: Int32Array.from(ids),
        logprobs: Float32Array.from(logprobs),
        weightVersion: spans === undefined ? '3' : '4',
        promptTokens: promptIds.length,
        completionTokens: n,
        ...(spans !== undefined ? { versionSpans: spans } : {}),
        ...(parsed.routedExperts !== undefined ? { routedExperts: parsed.routedExperts } : {}),
        ...(parsed.samplingMask !== undefined ? { samplingMask: parsed.samplingMask } : {}),
      };
    },
  };
}

/** Ends after `steps` steps; the prompt grows by each action. */
function stepsEnv(steps: number): Environment {
  const actions: string[] = [];
  return {
    reset() {
      actions.length = 0;
      return { observation: null };
    },
    getTaskPrompt: () => [
      { role: 'user', content: 'go' },
      ...actions.map((a) => ({ role: 'assistant' as const, content: a })),
    ],
    step(action): StepResult {
      actions.push(String(action));
      return { observation: null, reward: actions.length, terminated: actions.length >= steps, truncated: false };
    },
  };
}

function gate(): PauseView {
  return {
    paused: false,
    modelStep: 3,
    oldestUsefulStep: NO_EXPIRY,
    signal: new AbortController().signal,
    signalFor() {
      return this.signal;
    },
    stepOfVersion: (v) => (v === null ? 3 : Number(v)),
  };
}

/** The group as another process gets it: through the thread codec, or a checkpoint file in the compact form. */
function restored(group: RolloutGroup, how: number): RolloutGroup {
  if (how < 0.5) return decodeRunGroup(encodeRunGroup(group, 3, 0)).group;
  const bytes = encodeCheckpoint({ v: 1, groups: [compactGroup(group)] });
  const back = decodeCheckpoint(bytes, 'test').groups as RolloutGroup[];
  return expandGroup(back[0], 'groups[0]');
}

interface Tally {
  rows: number;
  forwarded: number;
  covered: number;
  supports: number;
  bytes: number;
}

/**
 * Every kept row is the mock's for the token at its position; every support is the mock's for its
 * response token. The turns are laid out as a trainer's sample builder does (a turn whose prompt
 * extends the sample continues it), counting the forwarded positions that have a row.
 */
function check(rollout: RolloutState, routing: MockRouting, tally: Tally, where: string): void {
  let sample: number[] = [];
  let covered = new Set<number>();
  const flush = (): void => {
    tally.forwarded += Math.max(0, sample.length - 1);
    tally.covered += covered.size;
  };
  rollout.turns.forEach((turn: TurnRecord, t) => {
    const at = `${where} turn ${t}`;
    if (turn.promptIds === null || turn.responseIds === null) return;
    const seq = [...turn.promptIds, ...turn.responseIds];
    const extendsSample = sample.length > 0 && seq.length >= sample.length && sample.every((id, i) => seq[i] === id);
    if (!extendsSample) {
      flush();
      covered = new Set();
    }
    sample = seq;
    const r = turn.routedExperts;
    if (r !== undefined) {
      assert.equal(r.layers, routing.layers, at);
      assert.equal(r.topK, routing.topK, at);
      assert.ok(r.start + r.rows <= seq.length - 1, `${at}: rows past the forwarded positions`);
      tally.bytes = r.ids.BYTES_PER_ELEMENT * r.layers * r.topK;
      for (let row = 0; row < r.rows; row++) {
        const p: number = r.start + row;
        covered.add(p);
        for (let l = 0; l < r.layers; l++)
          for (let k = 0; k < r.topK; k++) {
            const got: number = r.ids[(row * r.layers + l) * r.topK + k];
            const want = mockExpert(seq[p], p, l, k, routing.experts);
            if (got !== want)
              assert.fail(`${at}: position ${p} (token ${seq[p]}) layer ${l} choice ${k}: ${got}, not ${want}`);
          }
        tally.rows++;
      }
    }
    const m = turn.samplingMask;
    if (m !== undefined) {
      assert.equal(m.offsets.length, turn.responseIds.length + 1, at);
      for (let i = 0; i < turn.responseIds.length; i++) {
        const support: number[] = [...m.ids.subarray(m.offsets[i], m.offsets[i + 1])];
        assert.deepEqual(support, mockSupport(turn.responseIds[i], turn.promptIds.length + i), `${at}: support ${i}`);
        tally.supports++;
      }
    }
  });
  flush();
}

async function fuzz(kind: Server, episodes: number, seed: number, routing: MockRouting): Promise<Tally> {
  const tally: Tally = { rows: 0, forwarded: 0, covered: 0, supports: 0, bytes: 0 };
  for (let e = 0; e < episodes; e++) {
    const random = rng(seed * 100_003 + e);
    const steps = 1 + Math.floor(random() * 4);
    const sample = { taskName: 't', promptIndex: e, drawIndex: e, seed: e, envParams: {} };
    let group = newGroup(sample, 1);
    const server = fakeServer(kind, random, routing);
    for (let attempt = 0; ; attempt++) {
      const ctx: EpisodeContext = {
        actors: { acquire: async () => stepsEnv(steps), done: async () => {} },
        llm: server,
        settings: { maxSteps: 6, messageCut: 0, maxTokens: 12, temperature: 1, partialRollout: true, sendSeed: true },
        gate: gate(),
        workerId: 0,
      };
      await runEpisode(group.rollouts[0], ctx);
      const rollout = group.rollouts[0];
      check(rollout, routing, tally, `${kind} episode ${e} attempt ${attempt}`);
      // Killed or handed on between attempts: what comes back is what was sent.
      group = restored(group, random());
      check(group.rollouts[0], routing, tally, `${kind} episode ${e} attempt ${attempt} restored`);
      if (group.rollouts[0].status !== Status.ABORTED) break;
      assert.ok(attempt < 200, `${kind} episode ${e} never finished`);
    }
    assert.equal(group.rollouts[0].status, Status.COMPLETED, group.rollouts[0].error ?? undefined);
  }
  return tally;
}

describe('routing replay through every splice', () => {
  it('keeps every vLLM token-in row on its token over 1500 fuzzed episodes, covering every forwarded position', async () => {
    const t = await fuzz('vllm', 1500, 1, ROUTING);
    assert.ok(t.rows > 10_000, `only ${t.rows} rows checked`);
    assert.equal(t.covered, t.forwarded, 'a forwarded position of a token-in sample has no row');
  });

  it('keeps every SGLang row and sampling support on its token over 1500 fuzzed episodes', async () => {
    const t = await fuzz('sglang', 1500, 2, ROUTING);
    assert.ok(t.supports > 5_000, `only ${t.supports} supports checked`);
    assert.equal(t.covered, t.forwarded);
  });

  it('keeps every row of vLLM 0.21’s int16 lists on its token over 600 fuzzed episodes', async () => {
    const t = await fuzz('vllm-lists', 600, 7, ROUTING);
    assert.ok(t.rows > 4_000, `only ${t.rows} rows checked`);
    // A reply cut before its first token carries no rows in 0.21 (not even the prompt's): the positions
    // only such a reply forwarded have none, as no server reported them.
    assert.ok(t.covered <= t.forwarded && t.covered > 0.95 * t.forwarded, `${t.covered} of ${t.forwarded}`);
  });

  it('keeps every row SGLang sends as uint8 (SGLANG_ROUTED_EXPERTS_DTYPE) on its token over 300 fuzzed episodes', async () => {
    const t = await fuzz('sglang', 300, 8, { ...ROUTING, sglangDtype: 'uint8' });
    assert.equal(t.bytes, ROUTING.layers * ROUTING.topK);
    assert.equal(t.covered, t.forwarded);
  });

  it('keeps vLLM chat rows aligned over 1000 fuzzed episodes, dropping a continuation’s rows when its prompt came back re-tokenized', async () => {
    const t = await fuzz('vllm-chat', 1000, 3, ROUTING);
    assert.ok(t.rows > 5_000);
    assert.ok(t.covered < t.forwarded, 'the re-tokenized continuations lost their rows, as they must');
  });

  it('keeps ids above 255 in two bytes through the same splices', async () => {
    const t = await fuzz('sglang', 200, 4, WIDE);
    assert.equal(t.bytes, 2 * WIDE.layers * WIDE.topK);
    assert.equal(t.covered, t.forwarded);
  });
});

// --- the gateway's splices ---------------------------------------------------------------------------

/**
 * Sessions through the token-trace gateway against the mock over HTTP, each a random run of the
 * gateway's splices — a turn extending the conversation, a retried turn, a side call and its retry,
 * completions cut by their token budget — then stitched: every position of every sample must hold
 * the row of its token there, and every action token its support.
 */
async function fuzzGateway(kind: 'vllm' | 'sglang', sessions: number, seed: number, routing: MockRouting) {
  const mock = await startMockLlm({ dialect: kind, tokenizer: 'qwen2.5', thinkTokens: 3, routedExperts: routing });
  const gateway = await startGateway({
    backend: { kind, url: mock.url },
    routedExperts: kind === 'vllm' ? true : { layers: routing.layers, topK: routing.topK },
    samplingMasks: kind === 'sglang',
  });
  let positions = 0;
  let supports = 0;
  try {
    for (let s = 0; s < sessions; s++) {
      const random = rng(seed * 100_003 + s);
      const id = `fz-${s}`;
      const openai = openaiClient(gateway.sessionBaseURL(id));
      const ask = async (messages: { role: 'user' | 'assistant'; content: string }[]) =>
        (
          await openai.chat.completions.create({
            model: 'q',
            messages,
            max_tokens: 1 + Math.floor(random() * 12),
            top_p: 0.9,
            seed: s,
          })
        ).choices[0].message.content ?? '';
      const messages: { role: 'user' | 'assistant'; content: string }[] = [{ role: 'user', content: `Count ${s}.` }];
      const ops = 1 + Math.floor(random() * 6);
      for (let o = 0; o < ops; o++) {
        const roll = random();
        if (roll < 0.25) {
          const side = [{ role: 'user' as const, content: `Judge ${o} of ${s}.` }];
          await ask(side);
          if (random() < 0.3) await ask(side); // its retry replaces it
          continue;
        }
        if (roll < 0.45) await ask(messages); // then retried below: the retry replaces it
        messages.push({ role: 'assistant', content: await ask(messages) });
        messages.push({ role: 'user', content: `Go on (${o}).` });
      }
      messages.push({ role: 'assistant', content: await ask(messages) });
      const sample = await stitchSession(gateway.url, id, 0);
      assertRowsOnTokens(sample.routedExperts!, sample.observationTokens, routing);
      assert.equal(sample.routedExperts!.ids.BYTES_PER_ELEMENT, routing.experts < 255 ? 1 : 2);
      positions += sample.observationTokens.length;
      for (const side of sample.sideCalls)
        assertCallRows(side.routedExperts!, [...side.promptIds, ...side.completionIds], routing);
      if (kind === 'sglang') {
        const m = sample.samplingMask!;
        for (const [a, b] of sample.actionRanges)
          for (let p = a; p < b; p++) {
            assert.deepEqual(
              [...m.ids.subarray(m.offsets[p], m.offsets[p + 1])],
              mockSupport(sample.observationTokens[p], p),
            );
            supports++;
          }
      }
    }
  } finally {
    await gateway.close();
    await mock.close();
  }
  return { positions, supports };
}

describe('routing replay through the gateway’s splices', () => {
  it('keeps every vLLM row of 80 fuzzed gateway sessions on its token (extensions, retries, side calls)', async () => {
    const t = await fuzzGateway('vllm', 80, 5, ROUTING);
    assert.ok(t.positions > 5_000, `only ${t.positions} positions checked`);
  });

  it('keeps every row of 40 fuzzed gateway sessions on its token against vLLM 0.21’s lists, sent from 0 each call', async () => {
    const t = await fuzzGateway('vllm', 40, 9, { ...ROUTING, vllmWire: 'lists' });
    assert.ok(t.positions > 2_000, `only ${t.positions} positions checked`);
  });

  it('keeps every SGLang row and support of 80 fuzzed gateway sessions on its token, ids above 255 in two bytes', async () => {
    const t = await fuzzGateway('sglang', 80, 6, WIDE);
    assert.ok(t.supports > 500, `only ${t.supports} supports checked`);
  });
});

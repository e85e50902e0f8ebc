/**
 * Tool-calling agents (issue 20): tools from the environment and from MCP servers, calls read from
 * chat replies and from raw text in tokens mode, recorded on the turns, end to end over real HTTP in
 * a worker thread.
 */
import assert from 'node:assert/strict';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { createEngine, type Engine } from '../src/engine.ts';
import type { EngineConfigInput } from '../src/config.ts';
import { loadChatModel } from '../src/chat-model/model.ts';
import { formatToolCalls, parseToolCalls } from '../src/llm/tool-calls.ts';
import { parseChatReply } from '../src/llm/reply.ts';
import type { RolloutState } from '../src/domain/rollout.ts';
import { scriptedServer, type ScriptedServer } from './support/http.ts';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { listCompletedSessions } from '../src/records/reader.ts';
import { importMcpSdk, McpConnection, type McpSdk } from '../src/env/mcp.ts';
import { runToolCalls } from '../src/worker/tools.ts';
import { interrupts } from '../src/worker/episode-end.ts';
import { deferred } from './support/waits.ts';
import { decodeFromPeer, encodeForPeer, toJson } from '../src/formats/peer.ts';

const TOOL_ENV = fileURLToPath(new URL('./fixtures/tool-env.ts', import.meta.url));

const MODELS = JSON.stringify({
  object: 'list',
  data: [{ id: 'm', object: 'model', owned_by: 'vllm', max_model_len: 32768 }],
});

/** The first reply's calls: two lookups, a call that times out, and one whose arguments are bad JSON. */
const FIRST_CALLS = [
  { id: 'chatcmpl-tool-1', type: 'function', function: { name: 'lookup', arguments: '{"key": "a"}' } },
  { id: 'chatcmpl-tool-2', type: 'function', function: { name: 'lookup', arguments: '{"key": "b"}' } },
  { id: 'chatcmpl-tool-3', type: 'function', function: { name: 'slow', arguments: '{}' } },
  { id: 'chatcmpl-tool-4', type: 'function', function: { name: 'lookup', arguments: '{"key": "a"' } },
];

function checkToolRollout(r: RolloutState): void {
  assert.equal(r.status, 'COMPLETED', r.error ?? '');
  assert.equal(r.turns.length, 2, 'the call turn and the answer turn');
  const [call, answer] = r.turns;
  assert.equal(call.step, 1);
  assert.equal(answer.step, 1);
  assert.equal(call.finishReason, 'tool_calls');
  const calls = call.toolCalls!;
  assert.deepEqual(
    calls.map((c) => [c.name, c.error, c.error === null ? c.result : c.result.slice(0, 6)]),
    [
      ['lookup', null, '17'],
      ['lookup', null, '25'],
      ['slow', 'timeout', 'error:'],
      ['lookup', call.toolCalls![3].error, 'error:'],
    ],
  );
  assert.ok(['bad_arguments', 'unparsed'].includes(calls[3].error!), calls[3].error!);
  for (const c of calls.slice(0, 3)) assert.equal(c.source, 'env');
  // A timer may fire up to a millisecond before performance.now() shows its delay (149.84 ms was seen).
  assert.ok(calls[2].ms >= 149, `the timed-out call took ${calls[2].ms} ms`);
  assert.ok(call.timings.toolMs! >= 149 && call.timings.toolMs! < 2_000, 'parallel calls: the span of the slowest');
  assert.deepEqual(r.tools, { calls: 4, errors: 2 });
  // The answer turn was sent the exchange: the assistant's calls, then one tool message per call.
  const sent = answer.messages.slice(-5);
  assert.equal(sent[0].role, 'assistant');
  assert.equal(sent[0].tool_calls!.length, 4);
  assert.deepEqual(
    sent.slice(1).map((m) => [m.role, m.tool_call_id]),
    calls.map((c) => ['tool', c.id]),
  );
  assert.equal(answer.reward, 1);
  assert.equal(call.reward, 0, 'the reward is the step’s, on its final turn');
  assert.equal(r.reward, 1);
  assert.ok(answer.trainable && call.trainable);
}

type ChatModel = Awaited<ReturnType<typeof loadChatModel>>;

/**
 * A tokens-mode policy: each completion's text is `reply(the prompt, decoded)`, sent back as
 * vLLM does with its token ids (ending with <|im_end|>) and a logprob for each.
 */
async function tokensPolicy(model: ChatModel, reply: (prompt: string) => string): Promise<ScriptedServer> {
  const imEnd = model.encode('<|im_end|>')[0];
  return scriptedServer((req, res, body) => {
    res.setHeader('content-type', 'application/json');
    if (req.method === 'GET') return void res.end(req.url === '/v1/models' ? MODELS : '{}');
    const text = reply(model.decode((JSON.parse(body) as { prompt: number[] }).prompt));
    const ids = [...model.encode(text), imEnd];
    res.end(
      JSON.stringify({
        choices: [
          { index: 0, text, token_ids: ids, logprobs: { token_logprobs: ids.map(() => -0.5) }, finish_reason: 'stop' },
        ],
      }),
    );
  });
}

/** An engine playing the tool environment (`TOOL_ENV`): one batch of one group, two steps. */
function toolEngine(
  url: string,
  opts: { api: 'chat' | 'tokens'; groupSize: number; timeoutMs: number; runDir?: string },
): Engine {
  return createEngine({
    logLevel: 'silent',
    ...(opts.runDir === undefined ? {} : { runDir: opts.runDir }),
    llm: { url, model: 'm', server: 'vllm', ...(opts.api === 'tokens' ? { api: 'tokens' as const } : {}) },
    batchSize: 1,
    workers: { threads: 1 },
    tasks: [
      {
        name: 'tools',
        env: { module: TOOL_ENV },
        groupSize: opts.groupSize,
        maxSteps: 2,
        messageCut: 0,
        tools: { timeoutMs: opts.timeoutMs },
      },
    ],
  });
}

describe('tool calls from the environment, end to end in a worker thread', () => {
  const servers: ScriptedServer[] = [];
  const engines: Engine[] = [];
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    await Promise.all(servers.map((s) => s.close()));
  });

  it('runs parallel calls, a bad-JSON call and a timed-out call in chat mode, and records them on the turns', async () => {
    const server = await scriptedServer((req, res, body) => {
      res.setHeader('content-type', 'application/json');
      if (req.method === 'GET') return void res.end(req.url === '/v1/models' ? MODELS : '{}');
      const request = JSON.parse(body) as { messages: { role: string }[]; tools?: unknown[] };
      const answered = request.messages.some((m) => m.role === 'tool');
      // vLLM's shape (entrypoints/openai/protocol.py ChatCompletionResponse, ToolCall): content null,
      // tool_calls with ids "chatcmpl-tool-…", arguments a JSON string, finish_reason "tool_calls".
      const message = answered
        ? { role: 'assistant', content: 'The sum is 42.', tool_calls: [] }
        : { role: 'assistant', content: null, tool_calls: FIRST_CALLS };
      res.end(
        JSON.stringify({
          choices: [{ index: 0, message, finish_reason: answered ? 'stop' : 'tool_calls', token_ids: [1, 2, 3] }],
          prompt_token_ids: [9, 9],
          usage: { prompt_tokens: 2, completion_tokens: 3 },
        }),
      );
    });
    servers.push(server);
    const runDir = await mkdtemp(join(tmpdir(), 'tools-'));
    const e = toolEngine(server.url, { api: 'chat', groupSize: 2, timeoutMs: 200, runDir });
    engines.push(e);
    await e.start();
    const batch = await e.getBatch();
    for (const r of batch.groups[0].rollouts) checkToolRollout(r);
    // The control API's JSON and msgpack carry the calls.
    const turn = batch.groups[0].rollouts[0].turns[0];
    const json = JSON.parse(toJson(batch)) as typeof batch;
    assert.deepEqual(json.groups[0].rollouts[0].turns[0].toolCalls, turn.toolCalls);
    assert.deepEqual(
      (decodeFromPeer(encodeForPeer(batch)) as typeof batch).groups[0].rollouts[0].turns[0].toolCalls,
      turn.toolCalls,
    );
    // Step records: each call of the step is a round of it, the first with its tool calls.
    await e.close();
    const sessions = await listCompletedSessions(join(runDir, 'steps'));
    assert.equal(sessions.length, 2);
    for (const session of sessions) {
      assert.deepEqual(
        session.steps.map((s) => [s.step, s.round, s.toolCalls?.length]),
        [
          [1, 0, 4],
          [1, 1, undefined],
        ],
      );
      assert.deepEqual(session.missingSteps, []);
    }
    await rm(runDir, { recursive: true, force: true });
    const first = JSON.parse(server.requests.find((q) => q.method === 'POST')!.body) as {
      tools: { function: { name: string } }[];
      tool_choice: string;
    };
    assert.deepEqual(
      first.tools.map((t) => t.function.name),
      ['lookup', 'slow'],
    );
    assert.equal(first.tool_choice, 'auto');
  });

  it('reads Hermes <tool_call> blocks from the raw text in tokens mode and keeps the exact token sequence', async () => {
    const model = await loadChatModel('qwen2.5');
    const server = await tokensPolicy(model, (prompt) =>
      prompt.includes('<tool_response>')
        ? 'The sum is 42.'
        : `${formatToolCalls('hermes', [
            { name: 'lookup', arguments: { key: 'a' } },
            { name: 'lookup', arguments: { key: 'b' } },
            { name: 'slow', arguments: {} },
          ])}\n<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}\n</tool_call>`,
    );
    servers.push(server);
    const e = toolEngine(server.url, { api: 'tokens', groupSize: 1, timeoutMs: 200 });
    engines.push(e);
    await e.start();
    const batch = await e.getBatch();
    const r = batch.groups[0].rollouts[0];
    checkToolRollout(r);
    const [call, answer] = r.turns;
    assert.equal(call.toolCalls![3].error, 'unparsed');
    assert.match(call.toolCalls![0].id, /^chatcmpl-tool-[0-9a-f]{32}$/);
    // One sequence: the answer's prompt is the call's prompt + the call's sampled ids + the tool results' tokens.
    const head = [...call.promptIds!, ...call.responseIds!];
    assert.deepEqual(Array.from(answer.promptIds!.subarray(0, head.length)), head);
    const rest = model.decode(Array.from(answer.promptIds!.subarray(head.length)));
    assert.match(
      rest,
      /^\n<\|im_start\|>user\n<tool_response>\n17\n<\/tool_response>\n<tool_response>\n25\n<\/tool_response>/,
    );
    // The tools are in the system prompt, as the chat template writes them.
    assert.match(model.decode(Array.from(call.promptIds!)), /<tools>\n\{"type": ?"function"/);
  });
});

describe('tool calls in tokens mode, the whole episode', () => {
  const servers: ScriptedServer[] = [];
  const engines: Engine[] = [];
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    await Promise.all(servers.map((s) => s.close()));
  });

  it('plays parallel calls, a bad block and a timed-out call over two rounds as one token sequence, every turn recorded', async () => {
    const model = await loadChatModel('qwen2.5');
    const imEnd = model.encode('<|im_end|>')[0];
    // Round 1: two lookups in parallel and a block whose JSON is cut; round 2: `slow` (times out)
    // beside a lookup; then the answer. The reply is chosen by how many results the prompt holds.
    const replies = [
      `Looking both up.\n${formatToolCalls('hermes', [
        { name: 'lookup', arguments: { key: 'a' } },
        { name: 'lookup', arguments: { key: 'b' } },
      ])}\n<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}\n</tool_call>`,
      formatToolCalls('hermes', [
        { name: 'slow', arguments: {} },
        { name: 'lookup', arguments: { key: 'a' } },
      ]),
      'The sum is 42.',
    ];
    const server = await tokensPolicy(model, (prompt) => {
      const results = prompt.split('<tool_response>').length - 1;
      return replies[results === 0 ? 0 : results === 3 ? 1 : 2];
    });
    servers.push(server);
    const e = toolEngine(server.url, { api: 'tokens', groupSize: 1, timeoutMs: 150 });
    engines.push(e);
    await e.start();
    const r = (await e.getBatch()).groups[0].rollouts[0];
    assert.equal(r.status, 'COMPLETED', r.error ?? '');
    assert.equal(r.turns.length, 3, 'two calling rounds and the answer, one step');
    assert.deepEqual(
      r.turns.map((t) => [t.step, t.finishReason, t.toolCalls?.length]),
      [
        [1, 'tool_calls', 3],
        [1, 'tool_calls', 2],
        [1, 'stop', undefined],
      ],
    );
    const [first, second, answer] = r.turns;
    assert.deepEqual(
      first.toolCalls!.map((c) => [c.name, c.error, c.error === null ? c.result : c.result.slice(0, 6)]),
      [
        ['lookup', null, '17'],
        ['lookup', null, '25'],
        ['lookup', 'unparsed', 'error:'],
      ],
    );
    assert.deepEqual(
      second.toolCalls!.map((c) => [c.name, c.error, c.error === null ? c.result : c.result.slice(0, 6)]),
      [
        ['slow', 'timeout', 'error:'],
        ['lookup', null, '17'],
      ],
    );
    // A timer may fire up to a millisecond before performance.now() shows its delay.
    assert.ok(second.toolCalls![0].ms >= 149, `the timed-out call took ${second.toolCalls![0].ms} ms`);
    const ids = new Set([...first.toolCalls!, ...second.toolCalls!].map((c) => c.id));
    assert.equal(ids.size, 5, 'every call has its own id');
    assert.deepEqual(r.tools, { calls: 5, errors: 2 });
    assert.equal(r.reward, 1);
    assert.equal(answer.reward, 1);
    // One token sequence: each turn's prompt is the previous prompt + its sampled ids (ending with
    // <|im_end|>) + the tool results, rendered with the template's tool role, errors included.
    for (const [prev, next, calls] of [
      [first, second, first.toolCalls!],
      [second, answer, second.toolCalls!],
    ] as const) {
      assert.equal(prev.responseIds!.at(-1), imEnd);
      assert.equal(prev.logprobs!.length, prev.responseIds!.length);
      const head = [...prev.promptIds!, ...prev.responseIds!];
      assert.deepEqual(Array.from(next.promptIds!.subarray(0, head.length)), head);
      const rest = model.decode(Array.from(next.promptIds!.subarray(head.length)));
      assert.ok(rest.startsWith('\n<|im_start|>user\n<tool_response>\n'), rest);
      assert.ok(rest.endsWith('<|im_start|>assistant\n'), rest);
      const shown = [...rest.matchAll(/<tool_response>\n([\s\S]*?)\n<\/tool_response>/g)].map((m) => m[1]);
      assert.deepEqual(
        shown,
        calls.map((c) => c.result),
        'the model sees every result, the errors too',
      );
    }
    // The sampled ids hold no tool result: the loss (response tokens) never covers one.
    for (const t of r.turns) assert.ok(!model.decode(Array.from(t.responseIds!)).includes('<tool_response>'));
  });
});

describe('tool-call parsing', () => {
  it('reads Hermes blocks, a bad block as an unparsed call, and Llama 3 JSON calls', () => {
    const hermes = parseToolCalls(
      'hermes',
      'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": \n</tool_call>',
    );
    assert.equal(hermes.content, 'Let me look.');
    assert.deepEqual(
      hermes.calls.map((c) => [c.name, c.arguments, c.invalid === undefined]),
      [
        ['f', '{"x":1}', true],
        ['g', '{"name": "g", "arguments":', false],
      ],
    );
    const llama = parseToolCalls(
      'llama3_json',
      '<|python_tag|>{"name": "f", "parameters": {"q": "a;b"}}; {"name": "g", "parameters": {}}',
    );
    assert.deepEqual(
      llama.calls.map((c) => [c.name, c.arguments]),
      [
        ['f', '{"q":"a;b"}'],
        ['g', '{}'],
      ],
    );
    assert.deepEqual(parseToolCalls('llama3_json', 'The answer is 4.').calls, []);
  });

  it('reads a chat reply’s tool_calls as vLLM sends them, and refuses a call without an id naming the field', () => {
    const reply = parseChatReply({
      choices: [
        {
          message: { role: 'assistant', content: null, tool_calls: FIRST_CALLS.slice(0, 1) },
          finish_reason: 'tool_calls',
        },
      ],
    });
    assert.deepEqual(reply.toolCalls, [{ id: 'chatcmpl-tool-1', name: 'lookup', arguments: '{"key": "a"}' }]);
    assert.equal(reply.content, '');
    assert.throws(
      () =>
        parseChatReply({
          choices: [
            {
              message: { content: null, tool_calls: [{ function: { name: 'f', arguments: '{}' } }] },
              finish_reason: 'tool_calls',
            },
          ],
        }),
      { code: 'ERR_LLM_BAD_REPLY', message: /tool_calls\[0\]\.id must be a non-empty string/ },
    );
  });
});

const MCP_ENV = fileURLToPath(new URL('./fixtures/mcp-env.ts', import.meta.url));
const MCP_SERVER = fileURLToPath(new URL('./fixtures/mcp-server.ts', import.meta.url));
const REPO = fileURLToPath(new URL('..', import.meta.url));

/**
 * A policy that calls the MCP tools: each episode's first call is `add(2, 3)` — and, on the episodes
 * `dieOn` picks, `die()` beside it — then it answers with the tool's result.
 */
async function mcpPolicy(dieOn: (episode: number) => boolean): Promise<ScriptedServer> {
  let episodes = 0;
  return scriptedServer((req, res, body) => {
    res.setHeader('content-type', 'application/json');
    if (req.method === 'GET') return void res.end(req.url === '/v1/models' ? MODELS : '{}');
    const request = JSON.parse(body) as {
      messages: { role: string; content: string }[];
      tools?: { function: { name: string } }[];
    };
    const results = request.messages.filter((m) => m.role === 'tool');
    let message: object;
    if (results.length > 0) message = { role: 'assistant', content: `It is ${results[0].content}.` };
    else {
      const calls = [
        {
          id: `chatcmpl-tool-add-${episodes}`,
          type: 'function',
          function: { name: 'add', arguments: '{"a": 2, "b": 3}' },
        },
      ];
      if (dieOn(episodes))
        calls.push({
          id: `chatcmpl-tool-die-${episodes}`,
          type: 'function',
          function: { name: 'die', arguments: '{}' },
        });
      episodes++;
      message = { role: 'assistant', content: null, tool_calls: calls };
    }
    res.end(
      JSON.stringify({
        choices: [{ index: 0, message, finish_reason: results.length > 0 ? 'stop' : 'tool_calls' }],
        tools: request.tools?.length,
      }),
    );
  });
}

describe('tools from MCP servers', () => {
  const servers: ScriptedServer[] = [];
  const engines: Engine[] = [];
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    await Promise.all(servers.map((s) => s.close()));
  });

  /** One single-step MCP episode per group, `batchSize` groups, against the scripted `policy`. */
  function mcpEngine(
    policy: ScriptedServer,
    batchSize: number,
    tools: NonNullable<EngineConfigInput['tasks']>[number]['tools'],
  ): Engine {
    const e = createEngine({
      logLevel: 'silent',
      llm: { url: policy.url, model: 'm', server: 'vllm' },
      batchSize,
      workers: { threads: 1, groupsPerWorker: 1 },
      tasks: [{ name: 'mcp', env: { module: MCP_ENV }, groupSize: 1, maxSteps: 1, tools }],
    });
    engines.push(e);
    return e;
  }

  // Regression: a pause that cancelled an MCP call in flight failed the rollout, and its group was
  // dropped. The SDK rejects an aborted request with its own McpError, code ErrorCode.RequestTimeout
  // (-32001), not the abort reason (@modelcontextprotocol/sdk 1.32.2, dist/esm/shared/protocol.js,
  // Protocol.request's cancel), and that number was not a code the agent loop reads as a cancellation.
  // The cancel now also ends the call's wait itself (tools.ts), whatever the tool does.
  it('brings a tool round that a weight update cut on an MCP call back as a cancellation, not a failure', async () => {
    const { McpServer } = await import('@modelcontextprotocol/sdk/server/mcp.js');
    const { InMemoryTransport } = await import('@modelcontextprotocol/sdk/inMemory.js');
    const sdk = await importMcpSdk();
    const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
    const reached = deferred();
    const server = new McpServer({ name: 'held', version: '1' });
    server.registerTool('hold', { description: 'never answers', inputSchema: {} }, () => {
      reached.resolve();
      return new Promise(() => undefined);
    });
    await server.connect(serverSide);
    // The worker's own connection and the real SDK client; only the stdio transport is the in-memory one.
    class InMemoryStdio {
      constructor() {
        // biome-ignore lint/correctness/noConstructorReturn: stands in for the SDK's transport class, built with `new`
        return clientSide;
      }
    }
    const inMemory = InMemoryStdio as unknown as McpSdk['StdioClientTransport'];
    const connection = new McpConnection({ command: 'in-memory', args: [] }, async () => ({
      ...sdk,
      StdioClientTransport: inMemory,
    }));
    const cancel = new AbortController();
    const running = runToolCalls([{ id: 'c1', name: 'hold', arguments: '{}' }], {
      tools: { schemas: [], env: new Set(), mcp: new Map([['hold', connection]]) },
      budget: 4,
      callEnv: null,
      timeoutMs: 60_000,
      cancel: cancel.signal,
    });
    await reached.promise;
    cancel.abort(new Error('inference cancelled for a weight update'));
    const err = (await running.then(
      () => null,
      (e: unknown) => e,
    )) as { code?: unknown; cause?: { code?: unknown } } | null;
    assert.equal(err?.code, 'ERR_ENV_CANCELLED');
    assert.ok(interrupts(err), 'the agent loop brings the rollout back ABORTED, to continue after the resume');
    assert.match(String(err?.cause), /cancelled for a weight update/, "the pause's reason is the cause");
    await connection.close();
    await server.close();
  });

  it('serves a stdio MCP server’s tools to episodes; the server dying mid-call fails only the calls in flight, and it is started again', async () => {
    const policy = await mcpPolicy((n) => n === 1);
    servers.push(policy);
    const e = mcpEngine(policy, 4, {
      mcp: [{ command: process.execPath, args: ['--import', 'tsx', MCP_SERVER], cwd: REPO }],
      timeoutMs: 20_000,
    });
    await e.start();
    const batch = await e.getBatch();
    const rollouts = batch.groups.flatMap((g) => g.rollouts);
    assert.equal(rollouts.length, 4, 'every group accounted for');
    for (const r of rollouts) assert.equal(r.status, 'COMPLETED', r.error ?? '');
    const calls = rollouts.flatMap((r) => r.turns.flatMap((t) => t.toolCalls ?? []));
    const died = calls.filter((c) => c.name === 'die');
    assert.equal(died.length, 1);
    assert.equal(died[0].error, 'tool_error');
    assert.match(died[0].result, /MCP server .*mcp-server\.ts: .*closed/i);
    assert.match(died[0].source!, /^mcp:/);
    // Episodes after the death reach a server started again.
    const adds = calls.filter((c) => c.name === 'add' && c.error === null);
    assert.ok(adds.length >= 3, `${adds.length} add calls answered`);
    for (const c of adds) assert.equal(c.result, '5');
    const sent = JSON.parse(policy.requests.find((q) => q.method === 'POST')!.body) as {
      tools: { function: { name: string } }[];
    };
    assert.deepEqual(sent.tools.map((t) => t.function.name).sort(), ['add', 'die']);
  });

  it('serves a streamable-HTTP MCP server’s tools; killed between batches, its calls fail with the reason and every group still lands', async () => {
    const { spawn } = await import('node:child_process');
    const child = spawn(process.execPath, ['--import', 'tsx', MCP_SERVER, '--http'], {
      cwd: REPO,
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const url = await new Promise<string>((resolve) =>
      child.stdout.once('data', (d: Buffer) => resolve(d.toString().trim())),
    );
    const policy = await mcpPolicy(() => false);
    servers.push(policy);
    try {
      const e = mcpEngine(policy, 2, { mcp: [{ url }], mcpSessions: 'episode', timeoutMs: 5_000 });
      await e.start();
      const first = (await e.getBatch()).groups.flatMap((g) => g.rollouts);
      for (const r of first) assert.equal(r.turns[0].toolCalls?.[0].result, '5');
      child.kill('SIGKILL');
      await new Promise((resolve) => child.once('exit', resolve));
      const second = (await e.getBatch()).groups.flatMap((g) => g.rollouts);
      assert.equal(second.length, 2, 'every group accounted for');
      for (const r of second) assert.equal(r.status, 'COMPLETED', r.error ?? '');
      // An episode that listed the tools before the kill has its call fail with the server's reason;
      // one that could not list them was offered none, and its call is to an unknown tool.
      const calls = second.flatMap((r) => r.turns.flatMap((t) => t.toolCalls ?? []));
      assert.ok(calls.length >= 2);
      for (const c of calls) {
        if (c.error === 'tool_error') assert.match(c.result, /MCP server http:\/\/127\.0\.0\.1:\d+\/mcp: /);
        else assert.equal(c.error, 'unknown_tool', c.result);
      }
    } finally {
      child.kill('SIGKILL');
    }
  });
});

describe('the synthetic tool environment played by the mock policy', () => {
  const engines: Engine[] = [];
  const mocks: { close(): Promise<void> }[] = [];
  after(async () => {
    await Promise.all(engines.map((e) => e.close()));
    await Promise.all(mocks.map((m) => m.close()));
  });

  it('streams a reply’s tool calls as vLLM does — id and name first, arguments in pieces, finish_reason tool_calls — and the engine’s reader joins them', async () => {
    const { startMockLlm } = await import('../src/mock-llm/server.ts');
    const { ChatStream } = await import('../src/llm/stream-reply.ts');
    const mock = await startMockLlm({ port: 0, seed: 3, mistakeRate: 0, tokensPerSecond: 20_000, streamIntervalMs: 1 });
    mocks.push(mock);
    const ask = async (body: object): Promise<string> => {
      const res = await fetch(`${mock.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          messages: [
            {
              role: 'user',
              content: 'Look up the values of "amber" and "birch" with the lookup tool and answer with their sum.',
            },
          ],
          tools: [{ type: 'function', function: { name: 'lookup', parameters: { type: 'object' } } }],
          seed: 7,
          ...body,
        }),
      });
      return res.text();
    };
    const events = (await ask({ stream: true, return_token_ids: true }))
      .split('\n\n')
      .filter((e) => e.startsWith('data: {'))
      .map(
        (e) =>
          JSON.parse(e.slice(6)) as {
            choices: {
              delta: {
                content?: string;
                tool_calls?: {
                  index: number;
                  id?: string;
                  type?: string;
                  function: { name?: string; arguments: string };
                }[];
              };
              finish_reason: string | null;
            }[];
          },
      );
    const deltas = events.flatMap((e) => e.choices[0].delta.tool_calls ?? []);
    for (const index of [0, 1]) {
      const [first, ...rest] = deltas.filter((d) => d.index === index);
      assert.match(first.id!, /^chatcmpl-tool-[0-9a-f]{32}$/);
      assert.equal(first.type, 'function');
      assert.equal(first.function.name, 'lookup');
      for (const d of rest) assert.deepEqual(Object.keys(d).sort(), ['function', 'index']);
    }
    assert.ok(
      events.every((e) => !(e.choices[0].delta.content ?? '').includes('<tool_call>')),
      'no block markup as content',
    );
    assert.equal(events.at(-1)!.choices[0].finish_reason, 'tool_calls');
    // Paced by the text generated: a call opens once its name is out, its arguments follow in pieces.
    const { ToolCallDeltas } = await import('../src/mock-llm/stream-tools.ts');
    const text = 'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"key":"amber"}}\n</tool_call>';
    const plan = new ToolCallDeltas(text, [{ name: 'lookup', arguments: '{"key":"amber"}' }], (i) => `id-${i}`);
    const pieces = Array.from({ length: text.length }, (_, i) => plan.advance(i + 1)).filter((d) => d !== '');
    assert.equal(pieces[0], '"content":"L"');
    const calls = pieces.filter((d) => d.startsWith('"tool_calls"'));
    assert.equal(
      calls[0],
      '"tool_calls":[{"index":0,"id":"id-0","type":"function","function":{"name":"lookup","arguments":""}}]',
    );
    assert.ok(calls.length > 5);
    const args = calls.map(
      (d) =>
        (JSON.parse(`{${d}}`) as { tool_calls: { function: { arguments: string } }[] }).tool_calls[0].function
          .arguments,
    );
    assert.equal(args.join(''), '{"key": "amber"}', 'json.dumps of the parsed arguments, as vLLM sends them');
    // The engine's reader joins the pieces to the calls of the whole reply.
    const reader = new ChatStream({ tokenIds: true, logprobs: false });
    assert.ok(reader.write(new TextEncoder().encode(await ask({ stream: true, return_token_ids: true }))));
    const streamed = reader.result();
    const whole = parseChatReply(JSON.parse(await ask({ return_token_ids: true })));
    assert.equal(streamed.finishReason, 'tool_calls');
    assert.deepEqual(
      streamed.toolCalls!.map((c) => [c.name, c.arguments]),
      whole.toolCalls!.map((c) => [c.name, c.arguments]),
    );
    assert.deepEqual(
      streamed.toolCalls!.map((c) => c.arguments),
      ['{"key": "amber"}', '{"key": "birch"}'],
    );
    assert.deepEqual(Array.from(streamed.responseIds!), Array.from(whole.responseIds!));
  });

  for (const [api, stream] of [
    ['chat', false],
    ['chat', true],
    ['tokens', false],
  ] as const) {
    it(`plays builtin:tool-lookup with real tool calls in ${api} mode${stream ? ' with streamed replies' : ''}, imperfectly, so rewards vary`, async () => {
      const { startMockLlm } = await import('../src/mock-llm/server.ts');
      const mock = await startMockLlm({
        port: 0,
        seed: 3,
        mistakeRate: 0.3,
        ...(api === 'tokens' ? { tokenizer: 'qwen2.5' as const } : {}),
        // Streamed: a few tokens per event, so each call's arguments arrive in pieces.
        ...(stream ? { tokensPerSecond: 20_000, streamIntervalMs: 1 } : {}),
      });
      mocks.push(mock);
      const e = createEngine({
        logLevel: 'silent',
        llm: { url: mock.url, api, stream },
        batchSize: 8,
        workers: { threads: 1 },
        tasks: [{ name: 'lookup', env: { module: 'builtin:tool-lookup' }, groupSize: 4, maxSteps: 1 }],
      });
      engines.push(e);
      await e.start();
      const rollouts = (await e.getBatch()).groups.flatMap((g) => g.rollouts);
      for (const r of rollouts) assert.equal(r.status, 'COMPLETED', r.error ?? '');
      const rewards = new Set(rollouts.map((r) => r.reward));
      assert.deepEqual([...rewards].sort(), [0, 1], 'some right, some wrong');
      const calls = rollouts.flatMap((r) => r.turns.flatMap((t) => t.toolCalls ?? []));
      const ok = calls.filter((c) => c.error === null);
      assert.ok(ok.length >= 8, `${ok.length} calls answered`);
      for (const c of ok) assert.match(c.result, /^\d+$/);
      // Each reply's calls ran together, and the answer followed them in the same step.
      const withCalls = rollouts.filter((r) => r.turns[0].toolCalls !== undefined);
      assert.ok(withCalls.some((r) => r.turns[0].toolCalls!.length === 2 && r.turns.length === 2));
      if (api === 'chat') for (const c of calls) assert.match(c.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
      for (const r of withCalls) assert.equal(r.turns[0].finishReason, 'tool_calls');
      const mistakes = new Set(calls.map((c) => c.error).filter((k) => k !== null));
      assert.ok(mistakes.size >= 1, 'the policy errs now and then: bad JSON or an unknown tool');
    });
  }
});

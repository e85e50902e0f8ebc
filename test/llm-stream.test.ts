import assert from 'node:assert/strict';
import { createServer, type Server, type ServerResponse } from 'node:http';
import { after, before, describe, it } from 'node:test';
import { Pool } from 'undici';
import { Exchanges } from '../src/llm/exchange.ts';
import { ChatStream } from '../src/llm/stream-reply.ts';
import { startMockLlm, type MockLlm } from '../src/mock-llm/server.ts';
import { llmClient } from './support/clients.ts';
import { listenLoopback } from './support/http.ts';

const request = {
  messages: [{ role: 'user' as const, content: 'Guess a number between 1 and 100.' }],
  maxTokens: 200,
  temperature: 1,
  seed: 5,
};

/** One chunk event of a streamed completion (the shape vLLM sends). */
function event(choice: Record<string, unknown> | null, extra: Record<string, unknown> = {}): string {
  return `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', choices: choice === null ? [] : [{ index: 0, ...choice }], ...extra })}\n\n`;
}
const ROLE = event(
  { delta: { role: 'assistant', content: '' }, finish_reason: null, logprobs: null },
  { prompt_token_ids: [1, 2, 3] },
);
const tokens = (content: string, ids: number[], finish: string | null = null, extra: Record<string, unknown> = {}) =>
  event(
    {
      delta: { content },
      token_ids: ids,
      logprobs: { content: ids.map((id) => ({ token: String(id), logprob: -id / 100 })) },
      finish_reason: finish,
    },
    extra,
  );

/** A server on 127.0.0.1:0 that answers the n-th request with `script(res, n)`; it counts requests and connections. */
async function scripted(
  script: (res: ServerResponse, index: number) => void,
): Promise<{ url: string; server: Server; requests: number; connections: number }> {
  const state = { url: '', server: null as unknown as Server, requests: 0, connections: 0 };
  state.server = createServer((req, res) => {
    req.resume();
    req.on('end', () => script(res, state.requests++));
  });
  state.server.on('connection', () => state.connections++);
  state.url = await listenLoopback(state.server);
  return state;
}

describe('streamed replies (stream: true)', () => {
  let mock: MockLlm;
  const servers: Server[] = [];
  before(async () => {
    mock = await startMockLlm({ tokensPerSecond: 5000, thinkTokens: 80, streamIntervalMs: 2, seed: 4 });
  });
  after(async () => {
    servers.forEach((s) => s.closeAllConnections());
    servers.forEach((s) => s.close());
    await mock.close();
  });

  it('reads a streamed reply of the mock into exactly the result of the whole reply', async () => {
    const whole = llmClient(mock.url);
    const streamed = llmClient(mock.url, { stream: true });
    const [a, b] = [await whole.chat(request), await streamed.chat(request)];
    assert.ok(b.responseIds!.length > 20);
    assert.deepEqual(b, a);
    await Promise.all([whole.close(), streamed.close()]);
  });

  it('reads events however the bytes are cut: one byte at a time, CRLF line ends, comments, a character split in two', () => {
    const text = `: keep-alive\r\n\r\n${ROLE.replaceAll('\n', '\r\n')}${tokens('é', [7])}id: 3\nevent: message\n${tokens('ü!', [8, 9], 'stop', { metadata: { weight_version: 6 } })}${event(null, { usage: { prompt_tokens: 3, completion_tokens: 3 } })}data: [DONE]\n\n`;
    const bytes = new TextEncoder().encode(text);
    const whole = new ChatStream({ tokenIds: true, logprobs: true });
    whole.write(bytes);
    const byByte = new ChatStream({ tokenIds: true, logprobs: true });
    for (let i = 0; i < bytes.length; i++) byByte.write(bytes.subarray(i, i + 1));
    const expected = {
      content: 'éü!',
      finishReason: 'stop',
      promptIds: Int32Array.of(1, 2, 3),
      responseIds: Int32Array.of(7, 8, 9),
      logprobs: Float32Array.of(-0.07, -0.08, -0.09),
      weightVersion: '6',
      promptTokens: 3,
      completionTokens: 3,
    };
    assert.deepEqual(whole.result(), expected);
    assert.deepEqual(byByte.result(), expected);
  });

  it('names the event and the field of a bad event, and reads nothing after it', () => {
    const stream = new ChatStream({ tokenIds: true, logprobs: true });
    stream.write(
      new TextEncoder().encode(
        `${ROLE}${tokens('a', [1])}${event({ delta: { content: 'b' }, token_ids: [2, -1], finish_reason: null })}${tokens('c', [3], 'stop')}data: [DONE]\n\n`,
      ),
    );
    assert.throws(() => stream.result(), {
      code: 'ERR_LLM_BAD_REPLY',
      message:
        /inference stream event 3: choices\[0\]\.token_ids\[1\] must be a non-negative integer token id \(got -1\)/,
    });
    const notJson = new ChatStream({ tokenIds: false, logprobs: false });
    notJson.write(new TextEncoder().encode(`${ROLE}data: {"choices": [\n\n`));
    assert.throws(() => notJson.result(), {
      code: 'ERR_LLM_BAD_REPLY',
      message: /inference stream event 2 is not JSON/,
    });
    const serverError = new ChatStream({ tokenIds: false, logprobs: false });
    serverError.write(new TextEncoder().encode(`${ROLE}data: {"error": {"message": "CUDA out of memory"}}\n\n`));
    assert.throws(() => serverError.result(), { message: /event 2: the server reported an error: CUDA out of memory/ });
  });

  it('takes an event in only once all its fields are checked: a pause after a bad event reports that event, not a partial reply', () => {
    const stream = new ChatStream({ tokenIds: true, logprobs: false });
    const ok = stream.write(
      new TextEncoder().encode(
        `${ROLE}${event({ delta: { content: 'a' }, token_ids: [5] })}${event({ delta: { content: 'b' }, token_ids: [6, -1] })}`,
      ),
    );
    assert.equal(ok, false, 'the exchange is told to stop reading');
    assert.throws(() => stream.held(), {
      code: 'ERR_LLM_BAD_REPLY',
      message:
        /inference stream event 3: choices\[0\]\.token_ids\[1\] must be a non-negative integer token id \(got -1\)/,
    });
    const reported = new ChatStream({ tokenIds: false, logprobs: false });
    reported.write(new TextEncoder().encode(`${ROLE}data: {"error": {"message": "engine dead"}}\n\n`));
    assert.throws(() => reported.held(), { message: /the server reported an error: engine dead/ });
  });

  it('ends an event at a bare CR that ends a chunk, so a pause right after it holds that event (regression)', () => {
    const stream = new ChatStream({ tokenIds: true, logprobs: true });
    stream.write(new TextEncoder().encode(`${ROLE}${tokens('ab', [1, 2])}`.replaceAll('\n', '\r')));
    assert.deepEqual([...stream.held().responseIds!], [1, 2]);
    stream.write(new TextEncoder().encode(`\n${tokens('c', [3], 'stop')}data: [DONE]\r\n\r\n`));
    assert.deepEqual([stream.result().content, [...stream.result().responseIds!]], ['abc', [1, 2, 3]]);
  });

  it('cuts a stream at its first bad event instead of reading it to the end', async () => {
    let closed!: () => void;
    const cut = new Promise<void>((r) => (closed = r));
    const { url, server } = await scripted((res) => {
      res.once('close', () => closed());
      res.writeHead(200, { 'content-type': 'text/event-stream' }).write(`${ROLE}data: {"choices": 7}\n\n`); // and never ends
    });
    servers.push(server);
    const llm = llmClient(url, { stream: true });
    await assert.rejects(llm.chat(request), {
      code: 'ERR_LLM_BAD_REPLY',
      message: /inference stream event 2: choices must be an array \(got 7\)/,
    });
    await cut; // the server saw the client hang up
    await llm.close();
  });

  it('fails a stream that ends without a finish reason with ERR_LLM_BAD_REPLY, and one of the mock cut mid-way as a transport error', async () => {
    const { url, server } = await scripted((res) =>
      res.writeHead(200, { 'content-type': 'text/event-stream' }).end(`${ROLE}${tokens('a', [1])}`),
    );
    servers.push(server);
    const llm = llmClient(url, { stream: true });
    await assert.rejects(llm.chat(request), {
      code: 'ERR_LLM_BAD_REPLY',
      message: /inference stream ended after 2 events without a finish_reason/,
    });
    await llm.close();
    const cutting = await startMockLlm({
      truncateRate: 1,
      tokensPerSecond: 5000,
      thinkTokens: 40,
      streamIntervalMs: 2,
    });
    const cut = llmClient(cutting.url, { stream: true });
    await assert.rejects(cut.chat(request), { code: 'ERR_LLM_UNREACHABLE' });
    await cut.close();
    await cutting.close();
  });

  it('reads a non-streamed answer to a streamed request as a whole reply (a server that ignores stream)', async () => {
    const body = {
      choices: [
        { message: { content: 'hi' }, finish_reason: 'stop', token_ids: [4], logprobs: { content: [{ logprob: -1 }] } },
      ],
    };
    const { url, server } = await scripted((res) =>
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body)),
    );
    servers.push(server);
    const llm = llmClient(url, { stream: true });
    const reply = await llm.chat(request);
    assert.deepEqual([reply.content, [...reply.responseIds!]], ['hi', [4]]);
    await llm.close();
  });

  it('a hold settles an exchange at once with what it has, while the server has not answered, and the connection is reused after', async () => {
    const open: ServerResponse[] = [];
    const state = await scripted((res, index) => {
      if (index > 0)
        return void res
          .writeHead(200, { 'content-type': 'text/event-stream' })
          .end(`${ROLE}${tokens('x', [5], 'stop')}data: [DONE]\n\n`);
      res.writeHead(200, { 'content-type': 'text/event-stream' }).write(`${ROLE}${tokens('ab', [1, 2])}`);
      open.push(res);
    });
    const { url } = state;
    servers.push(state.server);
    const pool = new Pool(url, { connections: 1 });
    const exchanges = new Exchanges();
    const stream = new ChatStream({ tokenIds: true, logprobs: true });
    let twoEvents!: () => void;
    const arrived = new Promise<void>((r) => (twoEvents = r));
    let chunks = 0;
    const sink = {
      write(chunk: Uint8Array) {
        chunks++;
        const ok = stream.write(chunk);
        if (stream.held().responseIds!.length === 2) twoEvents();
        return ok;
      },
    };
    const hold = new AbortController();
    const call = exchanges.run(
      pool,
      url,
      { method: 'POST', path: '/', headers: {}, body: '{}', events: sink },
      undefined,
      hold.signal,
    );
    await arrived;
    hold.abort();
    const result = await call;
    assert.deepEqual([result.held, result.streamed, result.statusCode], [true, true, 200]);
    assert.deepEqual(stream.held(), {
      content: 'ab',
      finishReason: 'abort',
      promptIds: Int32Array.of(1, 2, 3),
      responseIds: Int32Array.of(1, 2),
      logprobs: Float32Array.of(-0.01, -0.02),
      weightVersion: null,
      promptTokens: null,
      completionTokens: null,
    });
    // The server's aborted answer ends the exchange; what it sends after the hold is dropped.
    const before = chunks;
    open[0].end(`${tokens('c', [3], 'abort')}data: [DONE]\n\n`);
    const next = await exchanges.run(pool, url, { method: 'POST', path: '/', headers: {}, body: '{}' });
    assert.equal(next.statusCode, 200);
    assert.equal(chunks, before);
    assert.deepEqual([state.requests, state.connections], [2, 1]); // the second call went out on the same connection
    await pool.close();
  });

  it('cuts a held exchange that the server does not end within holdDrainMs (no abort route, or an abort that missed it)', async () => {
    let closed!: () => void;
    const cut = new Promise<void>((r) => (closed = r));
    let started!: () => void;
    const streaming = new Promise<void>((r) => (started = r));
    const { url, server } = await scripted((res) => {
      res.once('close', () => closed());
      res.writeHead(200, { 'content-type': 'text/event-stream' }).write(ROLE, () => started()); // generates on, never ends
    });
    servers.push(server);
    const pool = new Pool(url, { connections: 1 });
    const exchanges = new Exchanges({ holdDrainMs: 20 });
    const hold = new AbortController();
    const call = exchanges.run(
      pool,
      url,
      {
        method: 'POST',
        path: '/',
        headers: {},
        body: '{}',
        events: new ChatStream({ tokenIds: true, logprobs: true }),
      },
      undefined,
      hold.signal,
    );
    await streaming;
    hold.abort();
    assert.equal((await call).held, true);
    await cut; // 20 ms later the connection is cut, and the server stops generating for it
    await pool.close();
  });

  it('a pause holds a streamed call of the client: it comes back at once as an aborted generation', async () => {
    let inServer!: () => void;
    const arrived = new Promise<void>((r) => (inServer = r));
    const open: ServerResponse[] = [];
    const { url, server } = await scripted((res) => {
      open.push(res);
      inServer(); // prefill: nothing sent yet
    });
    servers.push(server);
    const hold = new AbortController();
    const llm = llmClient(url, { stream: true, holdOnPause: true, hold: () => hold.signal });
    const call = llm.chat(request);
    await arrived;
    hold.abort();
    const reply = await call;
    assert.deepEqual(
      [reply.finishReason, reply.content, [...reply.responseIds!], [...reply.logprobs!]],
      ['abort', '', [], []],
    );
    open.forEach((res) => res.destroy());
    await llm.close();
  });

  it('drain mode does not hold: without holdOnPause a streamed call waits for its finish reason', async () => {
    const { url, server } = await scripted((res) => {
      res.writeHead(200, { 'content-type': 'text/event-stream' }).write(ROLE);
      setImmediate(() => res.end(`${tokens('done', [9], 'stop')}data: [DONE]\n\n`));
    });
    servers.push(server);
    const hold = new AbortController();
    hold.abort();
    const llm = llmClient(url, { stream: true, holdOnPause: false, hold: () => hold.signal });
    const reply = await llm.chat(request);
    assert.deepEqual([reply.finishReason, reply.content], ['stop', 'done']);
    await llm.close();
  });
});

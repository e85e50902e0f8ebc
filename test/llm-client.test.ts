import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { after, describe, it } from 'node:test';
import type { LlmClient, LlmClientOptions } from '../src/llm/client.ts';
import { probeServer } from '../src/llm/servers.ts';
import { llmClient } from './support/clients.ts';
import { scriptedServer, type ScriptedHandler, type ScriptedServer } from './support/http.ts';

type Handler = ScriptedHandler;

/** A scripted server whose n-th request is answered by `handlers[n]`, with a 500 once they run out. */
function queuedServer(handlers: Handler[]): Promise<ScriptedServer> {
  return scriptedServer((req, res, body) =>
    (handlers.shift() ?? ((_q, r) => r.writeHead(500).end('no more handlers')))(req, res, body),
  );
}

const ok =
  (extra: Record<string, unknown> = {}): Handler =>
  (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' }).end(
      JSON.stringify({
        prompt_token_ids: [1, 2, 3],
        choices: [
          {
            message: { role: 'assistant', content: 'hello' },
            finish_reason: 'stop',
            token_ids: [7, 8],
            logprobs: { content: [{ logprob: -0.5 }, { logprob: -1 }] },
          },
        ],
        usage: { prompt_tokens: 3, completion_tokens: 2 },
        metadata: { weight_version: 4 },
        ...extra,
      }),
    );
  };
const status =
  (code: number, body = '', headers: Record<string, string> = {}): Handler =>
  (_req, res) =>
    res.writeHead(code, headers).end(body);

function client(url: string, overrides: Partial<LlmClientOptions> = {}): LlmClient {
  return llmClient(url, { timeoutMs: 2000, retries: 2, connections: 4, ...overrides });
}
const request = { messages: [{ role: 'user' as const, content: 'hi' }], maxTokens: 16, temperature: 1 };

describe('inference client', () => {
  const servers: ScriptedServer[] = [];
  after(() => Promise.all(servers.map((s) => s.close())));
  async function serve(handlers: Handler[]) {
    const s = await queuedServer(handlers);
    servers.push(s);
    return s;
  }

  it('parses content, finish reason, vLLM token ids, logprobs and the weight version', async () => {
    const { url, requests } = await serve([ok()]);
    const llm = client(`${url}/v1`);
    const reply = await llm.chat(request);
    assert.equal(reply.content, 'hello');
    assert.equal(reply.finishReason, 'stop');
    assert.deepEqual(reply.promptIds, Int32Array.from([1, 2, 3]));
    assert.deepEqual(reply.responseIds, Int32Array.from([7, 8]));
    assert.deepEqual(reply.logprobs, Float32Array.from([-0.5, -1]));
    assert.equal(reply.weightVersion, '4');
    const sent = JSON.parse(requests[0].body);
    assert.equal(sent.return_token_ids, true);
    assert.equal(sent.logprobs, true);
    assert.equal(sent.max_tokens, 16);
    await llm.close();
  });

  it('reads a reply that starts with a UTF-8 byte order mark, as undici request() did', async () => {
    const { url } = await serve([
      (_req, res) => {
        const json = JSON.stringify({ choices: [{ message: { content: 'héllo' }, finish_reason: 'stop' }] });
        res
          .writeHead(200, { 'content-type': 'application/json' })
          .end(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(json)]));
      },
    ]);
    const llm = client(url);
    assert.equal((await llm.chat(request)).content, 'héllo');
    await llm.close();
  });

  it('retries a 503 and a 429 with backoff, then returns the success', async () => {
    const { url, requests } = await serve([status(503, 'busy'), status(429, '', { 'retry-after': '0' }), ok()]);
    const llm = client(url);
    const reply = await llm.chat(request);
    assert.equal(reply.content, 'hello');
    assert.equal(requests.length, 3);
    await llm.close();
  });

  it('does not retry a 400 and reports the server message with ERR_LLM_HTTP', async () => {
    const { url, requests } = await serve([
      status(400, JSON.stringify({ error: { message: 'max_tokens too large' } })),
      ok(),
    ]);
    const llm = client(url);
    await assert.rejects(llm.chat(request), { code: 'ERR_LLM_HTTP', message: /answered 400: max_tokens too large/ });
    assert.equal(requests.length, 1);
    await llm.close();
  });

  it('gives up after the configured retries on persistent 5xx', async () => {
    const { url, requests } = await serve([status(500), status(502), status(500), ok()]);
    const llm = client(url, { retries: 2 });
    await assert.rejects(llm.chat(request), { code: 'ERR_LLM_HTTP', message: /answered 500/ });
    assert.equal(requests.length, 3);
    await llm.close();
  });

  it('turns a malformed body or a reply missing fields into ERR_LLM_BAD_REPLY naming the field', async () => {
    const { url } = await serve([
      status(200, '{"choices": [ not json'),
      ok({ choices: [{ message: { content: 3 }, finish_reason: 'stop' }] }),
      ok({
        choices: [
          {
            message: { content: 'x' },
            finish_reason: 'stop',
            token_ids: [1, 2],
            logprobs: { content: [{ logprob: -1 }] },
          },
        ],
      }),
    ]);
    const llm = client(url);
    await assert.rejects(llm.chat(request), { code: 'ERR_LLM_BAD_REPLY', message: /not JSON/ });
    await assert.rejects(llm.chat(request), {
      code: 'ERR_LLM_BAD_REPLY',
      message: /choices\[0\]\.message\.content must be a string or null \(got 3\)/,
    });
    await assert.rejects(llm.chat(request), {
      code: 'ERR_LLM_BAD_REPLY',
      message: /logprobs\.content has 1 entries but choices\[0\]\.token_ids has 2/,
    });
    await llm.close();
  });

  it('refuses a logprob above 0 or beyond float32, naming the entry (regression: -1e39 reached the batch as null)', async () => {
    const reply = (logprob: number) =>
      ok({
        choices: [
          {
            message: { content: 'x' },
            finish_reason: 'stop',
            token_ids: [1, 2],
            logprobs: { content: [{ logprob: -1 }, { logprob }] },
          },
        ],
      });
    const { url } = await serve([reply(5), reply(-1e39), reply(1e-7)]);
    const llm = client(url);
    await assert.rejects(llm.chat(request), {
      code: 'ERR_LLM_BAD_REPLY',
      message: /logprobs\.content\[1\]\.logprob must be a log-probability: a finite number ≤ 0 \(got 5\)/,
    });
    await assert.rejects(llm.chat(request), {
      code: 'ERR_LLM_BAD_REPLY',
      message: /logprobs\.content\[1\]\.logprob must be a log-probability.*\(got -1e\+39\)/,
    });
    const rounded = await llm.chat(request); // a hair above 0 is the server's rounding
    assert.equal(rounded.logprobs?.length, 2);
    await llm.close();
  });

  it('says once, not per call, that a server answers without the token ids and logprobs it was asked for (regression: text-only turns went unnoticed)', async () => {
    const textOnly = ok({
      prompt_token_ids: undefined,
      choices: [{ message: { content: 'x' }, finish_reason: 'stop' }],
    });
    const { url } = await serve([textOnly, textOnly]);
    const warnings: string[] = [];
    const llm = client(url, { warn: (message) => warnings.push(message) });
    for (let i = 0; i < 2; i++) {
      const reply = await llm.chat(request);
      assert.deepEqual([reply.responseIds, reply.logprobs], [null, null]);
    }
    assert.equal(warnings.length, 2, warnings.join('\n'));
    assert.match(warnings[0], /answers without token ids though llm\.returnTokenIds/);
    assert.match(warnings[1], /answers without logprobs though llm\.logprobs/);
    await llm.close();
  });

  it('fails with ERR_LLM_UNREACHABLE naming the URL when nothing listens, after its retries', async () => {
    const { url, close } = await queuedServer([]);
    await close();
    const llm = client(url, { retries: 1 });
    await assert.rejects(llm.chat(request), {
      code: 'ERR_LLM_UNREACHABLE',
      message: new RegExp(`${url}/v1/chat/completions unreachable: ECONNREFUSED`),
    });
    await assert.rejects(probeServer(url, { server: 'auto' }), {
      code: 'ERR_LLM_UNREACHABLE',
      message: /ECONNREFUSED.*check llm\.url/,
    });
    await llm.close();
  });

  it('bounds a hanging request by llm.timeoutMs (ERR_LLM_TIMEOUT) and does not retry it', async () => {
    const { url, requests } = await serve([() => {}, ok()]);
    const llm = client(url, { timeoutMs: 100 });
    await assert.rejects(llm.chat(request), { code: 'ERR_LLM_TIMEOUT', message: /timed out after 100 ms/ });
    assert.equal(requests.length, 1);
    await llm.close();
  });

  /** Answers 200 and keeps writing `chunk` every `everyMs` until the client hangs up; resolves `closed` then. */
  function endless(chunk: string, everyMs: number): { handler: Handler; closed: Promise<void> } {
    let hungUp!: () => void;
    const closed = new Promise<void>((r) => (hungUp = r));
    const handler: Handler = (_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' }).write('{"choices":[');
      const timer = setInterval(() => res.write(chunk), everyMs);
      res.on('close', () => {
        clearInterval(timer);
        hungUp();
      });
    };
    return { handler, closed };
  }

  it('cuts a reply larger than llm.maxReplyBytes with ERR_LLM_BAD_REPLY naming the option, and does not retry it (regression: an endless body grew the worker to 16 GB)', async () => {
    const body = endless(' '.repeat(4096), 1);
    const { url, requests } = await serve([body.handler, ok()]);
    const llm = client(url, { maxReplyBytes: 64 * 1024 });
    await assert.rejects(llm.chat(request), {
      code: 'ERR_LLM_BAD_REPLY',
      message: /larger than llm\.maxReplyBytes = 65536 bytes/,
    });
    await body.closed; // the connection was cut, so the server stops writing
    assert.equal(requests.length, 1);
    await llm.close();
  });

  it('cuts a whole reply still trickling in after llm.timeoutMs with ERR_LLM_TIMEOUT, though no gap between chunks reaches it (regression)', async () => {
    const body = endless(' ', 10);
    const { url, requests } = await serve([body.handler, ok()]);
    const llm = client(url, { timeoutMs: 150 });
    await assert.rejects(llm.chat(request), {
      code: 'ERR_LLM_TIMEOUT',
      message: /still arriving after \d+ ms \(llm\.timeoutMs = 150\)/,
    });
    await body.closed;
    assert.equal(requests.length, 1);
    await llm.close();
  });

  it('rejects with ERR_LLM_ABORTED when the caller cancels', async () => {
    let arrived!: () => void;
    const inServer = new Promise<void>((r) => (arrived = r));
    const { url } = await serve([() => arrived()]);
    const llm = client(url);
    const controller = new AbortController();
    const pending = llm.chat(request, controller.signal);
    await inServer;
    controller.abort(new Error('pause'));
    await assert.rejects(pending, { code: 'ERR_LLM_ABORTED', message: /pause/ });
    await llm.close();
  });

  it('cancels every call under one signal through a single listener, calls queued for a connection included', async () => {
    const held: ServerResponse[] = [];
    let arrived!: () => void;
    const bothInServer = new Promise<void>((r) => (arrived = r));
    const hold: Handler = (_req, res) => {
      held.push(res);
      if (held.length === 2) arrived();
    };
    const { url, requests } = await serve([hold, hold, hold]);
    const llm = client(url, { connections: 2, retries: 0 }); // the third call waits for a connection
    const controller = new AbortController();
    let listeners = 0;
    const signal = {
      get aborted() {
        return controller.signal.aborted;
      },
      get reason() {
        return controller.signal.reason;
      },
      addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }) {
        listeners++;
        controller.signal.addEventListener(type, listener, options);
      },
      removeEventListener(type: 'abort', listener: () => void) {
        controller.signal.removeEventListener(type, listener);
      },
    };
    const calls = [llm.chat(request, signal), llm.chat(request, signal), llm.chat(request, signal)];
    await bothInServer;
    controller.abort(new Error('pause'));
    for (const call of calls) await assert.rejects(call, { code: 'ERR_LLM_ABORTED', message: /pause/ });
    assert.equal(listeners, 1);
    assert.equal(requests.length, 2); // the queued one never left
    held.forEach((res) => res.destroy());
    await llm.close();
  });

  it('does not send a retry once paused, even when the pause came during an earlier attempt (regression)', async () => {
    let paused = false;
    const { url, requests } = await serve([
      (_req, res) => {
        paused = true; // the weight update starts while the first attempt is out
        res.writeHead(503).end('busy');
      },
      ok(),
    ]);
    const llm = client(url, { paused: () => paused, retryBackoffMs: 1 });
    await assert.rejects(llm.chat(request), { code: 'ERR_LLM_ABORTED', message: /not retried while paused.*503/ });
    assert.equal(requests.length, 1);
    await llm.close();
  });

  it('sends nothing once the pause flag is set, though the caller decided to call before the pause', async () => {
    const { url, requests } = await serve([ok({ choices: [{ message: { content: '1' }, finish_reason: 'stop' }] })]);
    let paused = false;
    let sends = 0;
    const llm = client(url, { paused: () => paused, onSend: () => sends++ });
    paused = true; // e.g. set while the episode awaited its environment, after its step-boundary check
    await assert.rejects(llm.chat(request), { code: 'ERR_LLM_ABORTED', message: /not sent: paused/ });
    assert.equal(requests.length, 0);
    assert.equal(sends, 0);
    paused = false;
    await llm.chat(request);
    assert.equal(sends, 1);
    await llm.close();
  });
});

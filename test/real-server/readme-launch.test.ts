/**
 * The README's llama.cpp lines, run as written: llama-server launched with exactly the flags of the
 * README section "With vLLM / SGLang / llama.cpp" (read from README.md, not copied here), and the
 * README's `npx rollout run … --server llamacpp --api tokens --tokenizer qwen2.5` against it.
 *
 * Substituted, and only these: `--model` is the tests' tiny Qwen2.5-tokenizer model (make_model.py, not
 * the README's 7B GGUF); `--port 0` lets the OS pick a free port on 127.0.0.1 (llama-server's default
 * host), and the engine's `--llm-url` gets that port; `npx rollout` is `node --import tsx
 * src/cli/main.ts`; `--config my.json` is a small config (one batch of two short guess-number groups)
 * and `--steps 1 --run-dir <tmp>` bound the run. `--ctx-size 32768 --parallel 4 --jinja
 * --no-prefill-assistant` are the README's, unchanged: 4 slots of 32 768 / 4 tokens, each capped at the
 * tiny model's 4 096-token training context (llama.cpp warns and caps; the episodes stay far shorter).
 *
 * The flags are llama.cpp's at de3ff815ea7d559ee917f063901b8986f038abc6 (the source node-llama-cpp 3.22.1
 * ships, which setup.ts builds): common/arg.cpp `--model`, `--port`, `--ctx-size`, `--parallel`,
 * `--jinja`, `--no-prefill-assistant`; the routes the engine uses, tools/server/server.cpp
 * `/completion` (with `return_tokens`, tools/server/server-schema.cpp) and `/props` — as cited in
 * test/fixtures/server-launch-facts.json.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { rollout } from '../support/cli.ts';
import { realServerAvailable, startLlamaServer, type LlamaServer } from '../support/llama-server.ts';
import { engineRunArgs, readmeServersSection, sectionParts, serverLaunchWords } from '../support/readme-launch.ts';

const RUN_TIMEOUT_MS = 240_000;

const available = realServerAvailable();
const skip = available.ok || process.env.CI === 'true' ? false : available.reason;

const LLAMA = sectionParts(readmeServersSection()).servers.llamacpp;

/** The README's llama-server flags with the model and the port substituted (nothing else). */
function readmeServerArgs(model: string): string[] {
  const ws = serverLaunchWords(LLAMA);
  assert.equal(ws[0], 'llama-server', 'the README launches llama-server');
  const args = ws.slice(1);
  for (const [flag, value] of [
    ['--model', model],
    ['--port', '0'],
  ] as const) {
    const i = args.indexOf(flag);
    assert.ok(i >= 0 && i + 1 < args.length, `the README gives ${flag} a value`);
    args[i + 1] = value;
  }
  return args;
}

interface Turn {
  promptIds: number[];
  responseIds: number[];
  logprobs: number[];
}
interface Group {
  trainStep: number;
  status: string;
  rollouts: { status: string; error: string | null; turns: Turn[] }[];
}

describe('the README llama.cpp launch, run as written', { skip, timeout: 600_000 }, () => {
  let server: LlamaServer;
  let dir: string;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'readme-llamacpp-'));
    if (!available.ok) return;
    server = await startLlamaServer({ args: readmeServerArgs(available.model) });
  });
  after(async () => {
    await server?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it("serves the README's 4 slots, each a quarter of --ctx-size at most the training context, as /props says", async () => {
    const settings = server.props.default_generation_settings as { n_ctx: number };
    const models = (await (await fetch(`${server.url}/v1/models`)).json()) as {
      data: { meta: { n_ctx_train: number } }[];
    };
    const trained = models.data[0].meta.n_ctx_train;
    assert.equal(server.props.total_slots, 4);
    // llama-server caps a slot at the model's training context (server-context.cpp n_ctx_slot): the
    // tests' model was trained on 4 096, so its slots hold 4 096, not 32 768 / 4.
    assert.equal(trained, 4096);
    assert.equal(settings.n_ctx, Math.min(32768 / 4, trained));
  });

  it("gives the README's rollout run command a batch with each turn's token ids and logprobs", async () => {
    const config = join(dir, 'my.json');
    writeFileSync(
      config,
      JSON.stringify({
        batchSize: 2,
        workers: { threads: 1 },
        tasks: [
          {
            name: 'guess',
            env: { module: 'builtin:guess-number' },
            groupSize: 2,
            maxSteps: 2,
            maxTokens: 24,
          },
        ],
      }),
    );
    const args = engineRunArgs(LLAMA).map((a) => {
      if (a === 'my.json') return config;
      if (a.startsWith('http://127.0.0.1:')) return a.replace(/:\d+\//, `:${server.port}/`);
      return a;
    });
    assert.deepEqual(
      args.filter((a) => a.startsWith('--')),
      ['--config', '--llm-url', '--server', '--api', '--tokenizer'],
      "the README's engine flags",
    );
    const runDir = join(dir, 'run');
    const result = await rollout(['run', ...args, '--steps', '1', '--run-dir', runDir], {
      timeoutMs: RUN_TIMEOUT_MS,
    });
    assert.equal(result.code, 0, `rollout run exited ${result.code}:\n${result.stderr.slice(-3000)}`);

    const groups = readFileSync(join(runDir, 'batches.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Group);
    assert.equal(groups.length, 2, 'one batch of two groups');
    let tokens = 0;
    for (const group of groups) {
      assert.equal(group.trainStep, 1);
      assert.equal(group.status, 'COMPLETED');
      for (const rollout of group.rollouts) {
        assert.equal(rollout.status, 'COMPLETED', rollout.error ?? '');
        assert.ok(rollout.turns.length > 0);
        for (const turn of rollout.turns) {
          assert.ok(turn.promptIds.length > 0, 'prompt ids');
          assert.ok(turn.responseIds.length > 0, 'response ids');
          assert.equal(turn.logprobs.length, turn.responseIds.length, 'one logprob per response token');
          for (const id of [...turn.promptIds, ...turn.responseIds]) assert.ok(Number.isInteger(id) && id >= 0);
          for (const lp of turn.logprobs) assert.ok(Number.isFinite(lp) && lp <= 0, `logprob ${lp}`);
          tokens += turn.responseIds.length;
        }
      }
    }
    assert.ok(tokens > 0);
  });
});

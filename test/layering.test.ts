/**
 * The layering of src/ (test/support/layering.ts): no import cycle, the worker side never reaches the
 * main thread's modules or the gateway, protocol/ and chat-model/ stay at the bottom, formats/ and
 * config.ts import nothing above them, only the engine's shell, cli/ and loadtest/ import the mock,
 * nothing imports the package entry. A checker
 * that passes everything proves nothing, so it is also shown catching each kind of problem in a
 * scratch tree.
 */
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { after, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { checkLayering, findCycles, importGraph, layeringViolations } from './support/layering.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

describe('layering of src/', () => {
  const edges = importGraph(ROOT);

  it('reads the imports of every module (a regex that matched nothing would pass anything)', () => {
    assert.ok(edges.length > 300, `only ${edges.length} imports found`);
    assert.ok(edges.some((e) => e.from === 'workers/episode-worker.ts' && e.to.startsWith('src/')));
  });

  it('has no import cycle, type-only imports included', () => {
    assert.deepEqual(
      findCycles(edges).map((c) => c.join(' → ')),
      [],
    );
  });

  it('keeps the worker side off the main thread and the gateway, protocol/, chat-model/, formats/ and config.ts low, the mock kept to its users and the package entry unimported', () => {
    assert.deepEqual(layeringViolations(edges), []);
  });
});

describe('the layering checker', () => {
  const scratch = mkdtempSync(join(tmpdir(), 'layering-'));
  after(() => rmSync(scratch, { recursive: true, force: true }));
  const tree = (name: string, files: Record<string, string>): string => {
    const root = join(scratch, name);
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(root, path)), { recursive: true });
      writeFileSync(join(root, path), text);
    }
    return root;
  };

  it('names a cycle module by module, a type-only import closing it', () => {
    const root = tree('cycle', {
      'src/gateway/a.ts': "import { b } from './b.ts';\nexport const a = b;\n",
      'src/gateway/b.ts': "export {\n  c,\n} from './c.ts';\nexport const b = 1;\n",
      'src/gateway/c.ts': "import type { a } from './a.ts';\nexport const c = 2;\n",
    });
    assert.deepEqual(checkLayering(root), [
      'import cycle: src/gateway/a.ts → src/gateway/b.ts → src/gateway/c.ts → src/gateway/a.ts',
    ]);
  });

  it('does not count a dynamic import as a cycle, but does as a forbidden edge', () => {
    const root = tree('dynamic', {
      'src/coordinator/engine.ts': "import { x } from '../llm/x.ts';\nexport const y = x;\n",
      'src/llm/x.ts': "export const x = 1;\nexport const load = () => import('../coordinator/engine.ts');\n",
    });
    assert.deepEqual(checkLayering(root), [
      "src/llm/x.ts:2 imports src/coordinator/engine.ts: the worker side (worker/, workers/, env/, llm/) never imports the main thread's coordinator/, buffer/, control/ or cli/",
    ]);
  });

  it("names each forbidden edge with its file and line, type-only imports of the worker side's settings allowed in protocol/", () => {
    const root = tree('edges', {
      'src/index.ts': "export { run } from './cli/run.ts';\n",
      'src/cli/run.ts': "import { Engine } from '../index.ts';\nexport const run = Engine;\n",
      'src/protocol/codec.ts':
        "// a comment: import { nope } from '../config.ts';\nimport { z } from '../config.ts';\nexport const codec = z;\n",
      'src/protocol/messages.ts':
        "import type { A } from '../llm/a.ts';\nimport { type B } from '../env/b.ts';\nimport { type C, d } from '../env/b.ts';\nimport type { Z } from '../config.ts';\n",
      'src/llm/a.ts': 'export type A = 1;\n',
      'src/env/b.ts': 'export type B = 1;\nexport type C = 1;\nexport const d = 1;\n',
      'src/domain/rollout.ts': "import { e } from '../errors.ts';\nimport { z } from '../config.ts';\n",
      'src/errors.ts': "import { codes } from './error-codes.ts';\nexport const e = codes;\n",
      'src/error-codes.ts': "import { z } from './config.ts';\nexport const codes = z;\n",
      'src/worker/runtime.ts': "\nimport type { Buffer } from '../buffer/replay-buffer.ts';\n",
      'src/buffer/replay-buffer.ts': 'export type Buffer = number;\n',
      'src/formats/batch-file.ts': "import type { Batch } from '../coordinator/producer.ts';\n",
      'src/coordinator/producer.ts': 'export type Batch = 1;\n',
      'src/config.ts': "import { RUN_NAME } from './cluster/names.ts';\nexport const z = RUN_NAME;\n",
      'src/cluster/names.ts': 'export const RUN_NAME = 1;\n',
      'src/llm/token-chat.ts': "import type { ChatModel } from '../gateway/model.ts';\n",
      'src/gateway/model.ts': 'export type ChatModel = 1;\n',
      'src/chat-model/prompt.ts':
        "import { GatewayError } from '../gateway/errors.ts';\nimport { e } from '../errors.ts';\n",
      'src/gateway/errors.ts': 'export class GatewayError {}\n',
      'src/coordinator/engine-core.ts': "import type { MockLlm } from '../mock-llm/server.ts';\n",
      'src/gateway/server.ts': "export const load = () => import('../mock-llm/server.ts');\n",
      'src/mock-llm/server.ts': "import { planPrompt } from '../chat-model/prompt.ts';\nexport type MockLlm = 1;\n",
      // Allowed: the engine's shell, cli/ and loadtest/ import the mock; the gateway builds on llm/ and chat-model/.
      'src/engine.ts': "export const start = () => import('./mock-llm/server.ts');\n",
      'src/cli/mock-llm.ts': "import type { MockLlm } from '../mock-llm/server.ts';\n",
      'src/loadtest/report.ts': "import type { MockLlm } from '../mock-llm/server.ts';\n",
      'src/gateway/backend.ts':
        "import type { A } from '../llm/a.ts';\nimport { planPrompt } from '../chat-model/prompt.ts';\n",
    });
    assert.deepEqual(checkLayering(root).sort(), [
      'import cycle: src/cli/run.ts → src/index.ts → src/cli/run.ts',
      'src/chat-model/prompt.ts:1 imports src/gateway/errors.ts: src/chat-model/ imports only src/errors.ts, src/error-codes.ts',
      'src/cli/run.ts:1 imports src/index.ts: import from the module that defines it, not the package entry',
      'src/config.ts:1 imports src/cluster/names.ts: config.ts is below the layers it configures: what it validates lives in it (or below it)',
      'src/coordinator/engine-core.ts:1 imports src/mock-llm/server.ts: mock-llm/ is imported only by src/engine.ts (the embedded mock, an EmbeddedLlm to coordinator/), cli/ and loadtest/',
      'src/domain/rollout.ts:2 imports src/config.ts: src/domain/ imports only src/errors.ts, src/error-codes.ts',
      'src/error-codes.ts:1 imports src/config.ts: src/error-codes.ts imports nothing of src/',
      'src/formats/batch-file.ts:1 imports src/coordinator/producer.ts: formats/ writes and reads data: the types it writes live in src/domain/',
      'src/gateway/server.ts:1 imports src/mock-llm/server.ts: mock-llm/ is imported only by src/engine.ts (the embedded mock, an EmbeddedLlm to coordinator/), cli/ and loadtest/',
      'src/llm/token-chat.ts:1 imports src/gateway/model.ts: the worker side (worker/, workers/, env/, llm/) never imports gateway/: a server built on llm/, reached over HTTP; the tokenizer both use is in chat-model/',
      "src/protocol/codec.ts:2 imports src/config.ts: src/protocol/ imports only src/domain/, src/errors.ts, src/error-codes.ts (and, type-only, the worker side's settings)",
      "src/protocol/messages.ts:3 imports src/env/b.ts: src/protocol/ imports only src/domain/, src/errors.ts, src/error-codes.ts (and, type-only, the worker side's settings)",
      "src/protocol/messages.ts:4 imports src/config.ts: src/protocol/ imports only src/domain/, src/errors.ts, src/error-codes.ts (and, type-only, the worker side's settings)",
      "src/worker/runtime.ts:2 imports src/buffer/replay-buffer.ts: the worker side (worker/, workers/, env/, llm/) never imports the main thread's coordinator/, buffer/, control/ or cli/",
    ]);
  });
});

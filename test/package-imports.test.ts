/**
 * Which modules of src/ and workers/ may import undici, piscina and msgpackr: each package stays behind
 * the few modules whose job it is, so swapping or upgrading one touches those and nothing else. A new
 * importer fails here naming the file; if it belongs, add it below with what it uses the package for.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative, sep } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** Package → the modules allowed to import it (sorted), each with why. */
const ALLOWED: Record<string, Record<string, string>> = {
  undici: {
    'src/coordinator/audit.ts': 'the consistency audit re-scores rollouts on the inference servers',
    'src/coordinator/outage.ts': 'asks the inference servers (GET /v1/models) whether an outage is over',
    'src/env/gym-http.ts': 'the Gym HTTP environment client',
    'src/env/http-env.ts': 'the HTTP environment client (rollout env-server)',
    'src/env/nemo-gym.ts': 'the NeMo Gym environment client',
    'src/env/openenv.ts': 'the OpenEnv environment client',
    'src/gateway/backend.ts': "the gateway's calls to its inference backends",
    'src/llm/client.ts': 'the inference client',
    'src/llm/exchange.ts': "one inference call's request and reply",
    'src/llm/gateway-client.ts': 'the client of the token-trace gateway',
    'src/llm/servers.ts': 'the start-up probe of inference servers and their pause routes',
  },
  piscina: {
    'src/coordinator/worker-pool.ts': 'the pool of worker threads (the only Piscina user on the main thread)',
    'workers/episode-worker.ts': 'the worker entry Piscina loads',
  },
  msgpackr: {
    'src/env/verifiers.ts': 'the env-serve v1 wire to verifiers environments',
    'src/formats/checkpoint-file.ts': 'the checkpoint envelope',
    'src/formats/peer.ts': "msgpack for peers (the control API's application/msgpack)",
    'src/protocol/codec.ts': 'the messages across the thread boundary',
  },
};

/** Static `import … from 'pkg'` / `export … from 'pkg'`, `import 'pkg'`, `import('pkg')`, subpaths included. */
function importPattern(pkg: string): RegExp {
  const name = pkg.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  const spec = `['"]${name}(?:/[^'"]*)?['"]`;
  return new RegExp(
    `^(?:import|export)\\s[^;'"]*?\\sfrom\\s*${spec}|^import\\s*${spec}|\\bimport\\(\\s*${spec}\\s*\\)`,
    'm',
  );
}

function importers(pkg: string): string[] {
  const pattern = importPattern(pkg);
  return ['src', 'workers']
    .flatMap((dir) =>
      readdirSync(join(ROOT, dir), { recursive: true, withFileTypes: true })
        .filter((e) => e.isFile() && e.name.endsWith('.ts'))
        .map((e) => relative(ROOT, join(e.parentPath, e.name)).split(sep).join('/')),
    )
    .filter((file) => pattern.test(readFileSync(join(ROOT, file), 'utf8')))
    .sort();
}

describe('modules that may import undici, piscina and msgpackr', () => {
  for (const [pkg, allowed] of Object.entries(ALLOWED)) {
    it(`only the listed modules import ${pkg}, and each of them does`, () => {
      assert.deepEqual(importers(pkg), Object.keys(allowed).sort());
    });
  }

  it('finds an import in each of its forms (a pattern that matched nothing would pass anything)', () => {
    const matches = (text: string): boolean => importPattern('undici').test(text);
    assert.ok(matches("import { request } from 'undici';"));
    assert.ok(matches("import {\n  Pool,\n  request,\n} from 'undici';"));
    assert.ok(matches("export { Agent } from 'undici/lib/agent';"));
    assert.ok(matches("const { Pool } = await import('undici');"));
    assert.ok(!matches(' * Next to src/llm, the only module that knows undici.'));
    assert.ok(!matches("import { x } from 'undici-types';"));
  });
});

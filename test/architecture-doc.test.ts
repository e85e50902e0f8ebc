/**
 * docs/ARCHITECTURE.md names, for each invariant, the tests that hold it: a renamed or removed test
 * would leave the table pointing at nothing, so every name it quotes must be a test of that file.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { describe, it } from 'node:test';

const ROOT = new URL('../', import.meta.url);
const DOC = readFileSync(new URL('docs/ARCHITECTURE.md', ROOT), 'utf8');

/** `[file, name]` for every `` `test/x.test.ts`: "name"; "name" `` of the invariants table. */
function citedTests(doc: string): [string, string][] {
  const table = doc.slice(doc.indexOf('## Invariants and where each is tested'), doc.indexOf('## Source map'));
  const out: [string, string][] = [];
  for (const row of table.split('\n').filter((l) => l.startsWith('| '))) {
    for (const part of row.split(' · ')) {
      const file = /`(test\/[^`]+\.test\.ts)`:/.exec(part)?.[1];
      if (file === undefined) continue;
      for (const m of part.slice(part.indexOf(file)).matchAll(/"([^"]+)"/g)) out.push([file, m[1]]);
    }
  }
  return out;
}

describe('docs/ARCHITECTURE.md', () => {
  it('quotes only tests that exist in the files it names', () => {
    const cited = citedTests(DOC);
    assert.ok(cited.length >= 10, `read ${cited.length} test names: the table's shape changed`);
    const missing = cited.filter(([file, name]) => {
      const source = readFileSync(new URL(file, ROOT), 'utf8').replaceAll("\\'", "'");
      return !source.includes(name);
    });
    assert.deepEqual(missing, [], missing.map(([f, n]) => `${f}: "${n}"`).join('\n'));
  });

  it('names every folder of src/ and of the repository in its source map', () => {
    const map = DOC.slice(DOC.indexOf('## Source map'), DOC.indexOf('### Layers'));
    const dirs = (path: string) =>
      readdirSync(new URL(path, ROOT), { withFileTypes: true })
        .filter(
          (d) =>
            d.isDirectory() &&
            !d.name.startsWith('.') &&
            !['node_modules', 'dist', 'runs', 'bench-results', 'scratch', '__pycache__'].includes(d.name),
        )
        .map((d) => `${path}${d.name}/`);
    const missing = [...dirs('src/'), ...dirs('')].filter((dir) => !map.includes(`\`${dir}\``));
    assert.deepEqual(missing, [], `not in the source map: ${missing.join(', ')}`);
  });
});

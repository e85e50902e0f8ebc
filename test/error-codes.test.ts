/**
 * The error-code table (src/error-codes.ts) is the one list of codes: every `ERR_…` the source uses is
 * in it, every row is used, and docs/ERROR-CODES.md is the table, row for row. Codes are
 * added often; without this the page drifts and a code used in a message goes undocumented.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { ERROR_CODES } from '../src/error-codes.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
/** Node's own codes the source names (it branches on them, or explains them); not the engine's. */
const NODE_CODES = new Set([
  'ERR_UNKNOWN_FILE_EXTENSION',
  'ERR_STRING_TOO_LONG',
  'ERR_PARSE_ARGS',
  'ERR_MODULE_NOT_FOUND',
]);
/** Prefixes the source matches codes by (`code.startsWith('ERR_ENV_')`), not codes. */
const PREFIX = /_$/;

/** `| \`CODE\` | meaning |` for each row, in the table's order: what docs/ERROR-CODES.md shows. */
function errorCodesMarkdown(): string {
  return [
    '| code | meaning |',
    '|---|---|',
    ...Object.entries(ERROR_CODES).map(([code, meaning]) => `| \`${code}\` | ${meaning} |`),
  ].join('\n');
}

function codesInSource(): Map<string, string> {
  const found = new Map<string, string>();
  const dir = join(ROOT, 'src');
  for (const entry of readdirSync(dir, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile() || !entry.name.endsWith('.ts') || entry.name === 'error-codes.ts') continue;
    const file = join(entry.parentPath, entry.name);
    for (const [code] of readFileSync(file, 'utf8').matchAll(/\bERR_[A-Z0-9_]+/g)) {
      if (!PREFIX.test(code) && !found.has(code)) found.set(code, relative(ROOT, file));
    }
  }
  return found;
}

describe('error codes', () => {
  const used = codesInSource();

  it('every code the source uses has a row in src/error-codes.ts', () => {
    const missing = [...used]
      .filter(([code]) => !(code in ERROR_CODES) && !NODE_CODES.has(code))
      .map(([code, file]) => `${code} (${file})`);
    assert.deepEqual(missing, []);
  });

  it('every row of src/error-codes.ts is a code the source uses', () => {
    assert.deepEqual(
      Object.keys(ERROR_CODES).filter((code) => !used.has(code)),
      [],
    );
  });

  it('every meaning is one line', () => {
    assert.deepEqual(
      Object.entries(ERROR_CODES)
        .filter(([, meaning]) => meaning.includes('\n') || meaning.includes('|') || meaning.length > 120)
        .map(([code]) => code),
      [],
    );
  });

  it('docs/ERROR-CODES.md is the table, row for row', () => {
    const page = readFileSync(join(ROOT, 'docs', 'ERROR-CODES.md'), 'utf8');
    const section = /^# Error codes\n[\s\S]*?\n(\| code \| meaning \|\n[\s\S]*?)\n(?:\n|$)/.exec(page)?.[1];
    assert.ok(section !== undefined, 'docs/ERROR-CODES.md has no "# Error codes" title and | code | meaning | table');
    assert.equal(
      section,
      errorCodesMarkdown(),
      "docs/ERROR-CODES.md's error-code table differs from src/error-codes.ts: replace it with the expected text",
    );
  });
});

/**
 * What `npx rollout` runs. In the package's own folder npm does not link its `bin` into
 * node_modules/.bin: npx executes the file package.json names, as it is on disk. tsc writes that
 * file without the executable bit, so the build (run by `npm ci` through `prepare`) sets it.
 */
import assert from 'node:assert/strict';
import { readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

test('every command package.json names is built executable with a node shebang (regression: `npx rollout` was refused with Permission denied on a fresh clone)', {
  skip: process.platform === 'win32' ? 'no executable bit on Windows' : false,
}, () => {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { bin: Record<string, string> };
  const bins = Object.entries(pkg.bin);
  assert.ok(bins.length > 0, 'package.json names no bin');
  for (const [name, rel] of bins) {
    const path = join(ROOT, rel);
    const mode = statSync(path).mode;
    assert.ok((mode & 0o111) !== 0, `${name}: ${rel} is not executable (mode ${(mode & 0o777).toString(8)})`);
    assert.match(readFileSync(path, 'utf8').slice(0, 32), /^#!\/usr\/bin\/env node\n/, `${name}: ${rel}`);
  }
});

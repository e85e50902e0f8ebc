/**
 * The source files that comments and docs name exist: a module moved or renamed leaves behind every
 * "see llm/token-chat.ts" that pointed at it, and nothing else notices. Read in src/ and workers/
 * (comments and strings), test/support/, docs/*.md and README.md:
 * - a path to a .ts or .mjs file (`src/llm/client.ts`, `coordinator/producer.ts`, `support/x.ts`)
 *   names a file from the repository root, from src/, or from the naming file's folder;
 * - a folder of src/ named as one (`src/gateway/`) exists;
 * - one of our pages (`docs/CONFIGURATION.md`: ours are upper case; other projects' docs, quoted at
 *   a commit, are not) exists;
 * - in a .ts file, a bare file name (`(prompt.ts)`) is a module of src/, workers/ or test/support/.
 * Import specifiers (`./x.ts`, `../llm/x.ts`) are the layering test's (test/support/layering.ts), and
 * URLs are not paths.
 */
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join, posix, relative, sep } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** Not after a word, a path, a `./`, a scheme or a package scope: only paths as written in prose. */
const START = String.raw`(?<![\w./@:-])`;
const END = String.raw`(?![\w/-])`;
const FILE_PATH = new RegExp(`${START}((?:[\\w-]+/)+[\\w.-]+\\.(?:ts|mjs))${END}`, 'g');
const SRC_FOLDER = new RegExp(`${START}(src/[\\w-]+/)(?![\\w.-])`, 'g');
const OUR_PAGE = new RegExp(`${START}(docs/[A-Z][A-Z0-9-]*\\.md)${END}`, 'g');
const BARE_NAME = new RegExp(`${START}([\\w-]+\\.(?:ts|mjs))${END}`, 'g');

function listFiles(dir: string, suffixes: string[]): string[] {
  return readdirSync(join(ROOT, dir), { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && suffixes.some((s) => e.name.endsWith(s)))
    .map((e) => relative(ROOT, join(e.parentPath, e.name)).split(sep).join('/'))
    .sort();
}

/** File names of the modules a bare name may mean. */
const MODULE_NAMES = new Set(
  [
    ...listFiles('src', ['.ts']),
    ...listFiles('workers', ['.ts', '.mjs']),
    ...listFiles('test/support', ['.ts', '.mjs']),
  ].map((f) => posix.basename(f)),
);

/** `file:line: what` for each name in `text` (of the repository file `file`) that names nothing. */
function unresolvedNames(file: string, text: string, exists: (path: string) => boolean): string[] {
  const problems: string[] = [];
  const code = file.endsWith('.ts');
  text.split('\n').forEach((line, i) => {
    const at = `${file}:${i + 1}`;
    for (const [, path] of line.matchAll(FILE_PATH)) {
      const candidates = [path, `src/${path}`, posix.join(posix.dirname(file), path)];
      if (!candidates.some(exists)) problems.push(`${at}: ${path} names no file`);
    }
    for (const [, folder] of line.matchAll(SRC_FOLDER))
      if (!exists(folder)) problems.push(`${at}: ${folder} names no folder`);
    for (const [, page] of line.matchAll(OUR_PAGE)) if (!exists(page)) problems.push(`${at}: ${page} names no page`);
    if (code)
      for (const [, name] of line.matchAll(BARE_NAME))
        if (!MODULE_NAMES.has(name)) problems.push(`${at}: ${name} is no module of src/, workers/ or test/support/`);
  });
  return problems;
}

describe('paths named in comments and docs', () => {
  it('name files and folders that exist', () => {
    const files = [
      ...listFiles('src', ['.ts']),
      ...listFiles('workers', ['.ts', '.mjs']),
      ...listFiles('test/support', ['.ts', '.mjs']),
      ...listFiles('docs', ['.md']),
      'README.md',
    ];
    const exists = (path: string): boolean => existsSync(join(ROOT, path));
    const problems = files.flatMap((file) => unresolvedNames(file, readFileSync(join(ROOT, file), 'utf8'), exists));
    assert.deepEqual(problems, []);
  });

  it('reads each form of name, and leaves imports, URLs and other projects alone (a pattern that matched nothing would pass anything)', () => {
    const exists = (path: string): boolean => ['src/llm/client.ts', 'src/gateway/', 'docs/CLI.md'].includes(path);
    const text = [
      '/** As src/llm/client.ts does (llm/client.ts, and src/llm/gone.ts, and rollout/engine.ts). */',
      "import { x } from './client.ts';",
      "import { y } from '../gateway/model.ts';",
      ' * src/gateway/ and src/testing/; docs/CLI.md, docs/GONE.md, docs/training/async_rl.md @006ebac',
      ' * https://github.com/x/y/blob/main/src/z.ts, @scope/pkg/index.ts',
      ' * (client.ts, and gone.ts)',
    ].join('\n');
    assert.deepEqual(unresolvedNames('src/llm/x.ts', text, exists), [
      'src/llm/x.ts:1: src/llm/gone.ts names no file',
      'src/llm/x.ts:1: rollout/engine.ts names no file',
      'src/llm/x.ts:4: src/testing/ names no folder',
      'src/llm/x.ts:4: docs/GONE.md names no page',
      'src/llm/x.ts:6: gone.ts is no module of src/, workers/ or test/support/',
    ]);
  });
});

/**
 * Every ```ts block of README.md and docs/*.md compiles, as shown, under the project's strict
 * settings: a snippet that does not type-check teaches a user an API that does not exist (the
 * EnvironmentFactory and trainer-loop snippets did not, and EpisodeHooks was not exported).
 *
 * Each block is written to a file of its own in a scratch directory under test/ (a dot directory:
 * tsconfig.json's `test/**` globs skip it, so a leftover never enters the project's type-check), with
 * 'rollout-engine' and 'rollout-engine/mock-llm' mapped to the source by `paths`, and the whole set is
 * checked by one run of the project's own tsc. A fragment that uses names it does not define declares
 * them in an HTML comment right above its fence, which the rendered page does not show:
 *
 *   <!-- snippet-prelude: declare const url: string; -->
 *
 * The prelude goes on the file's first line and the block after it line for line, so an error is
 * reported at its line in the markdown file.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const TSC = join(ROOT, 'node_modules', '.bin', 'tsc');
const TSC_TIMEOUT_MS = 90_000;

interface Snippet {
  /** The markdown file, relative to the repository root. */
  file: string;
  /** 1-based line of the block's first code line in the markdown file. */
  line: number;
  prelude: string;
  code: string;
}

const PRELUDE = /^<!--\s*snippet-prelude:([\s\S]*?)-->$/;

/** The ```ts blocks of one markdown file, each with the prelude written above its fence, if any. */
function extractSnippets(file: string, text: string): Snippet[] {
  const lines = text.split('\n');
  const snippets: Snippet[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (!/^```ts\s*$/.test(lines[i])) continue;
    const end = lines.findIndex((l, j) => j > i && /^```\s*$/.test(l));
    if (end < 0) throw new Error(`${file}:${i + 1}: a \`\`\`ts block that is never closed`);
    // The comment may span lines: gather back from the fence to its opening `<!--`.
    let prelude = '';
    if (lines[i - 1]?.trimEnd().endsWith('-->')) {
      let start = i - 1;
      while (start > 0 && !lines[start].startsWith('<!--')) start--;
      const match = PRELUDE.exec(lines.slice(start, i).join('\n').trim());
      if (match) prelude = match[1].replace(/\s+/g, ' ').trim();
    }
    snippets.push({ file, line: i + 2, prelude, code: lines.slice(i + 1, end).join('\n') });
    i = end;
  }
  return snippets;
}

function markdownFiles(): string[] {
  const docs = readdirSync(join(ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => join('docs', f));
  return ['README.md', ...docs];
}

/** `rollout-engine[/subpath]` → its source module, from package.json `exports`: a snippet imports what a user can. */
function packageEntries(src: (path: string) => string[]): Record<string, string[]> {
  const { exports } = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
    exports: Record<string, string | { types: string }>;
  };
  const paths: Record<string, string[]> = {};
  for (const [subpath, target] of Object.entries(exports)) {
    if (typeof target === 'string') continue; // ./package.json
    paths[`rollout-engine${subpath.slice(1)}`] = src(
      target.types.replace(/^\.\/dist\//, '').replace(/\.d\.ts$/, '.ts'),
    );
  }
  return paths;
}

function tsc(project: string): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    execFile(
      TSC,
      ['-p', project, '--pretty', 'false'],
      { timeout: TSC_TIMEOUT_MS, cwd: ROOT },
      (err, stdout, stderr) => {
        if (err !== null && (err as { killed?: boolean }).killed)
          reject(new Error(`tsc did not finish within ${TSC_TIMEOUT_MS} ms`));
        else
          resolve({
            code: err === null ? 0 : typeof err.code === 'number' ? err.code : 1,
            output: `${stdout}${stderr}`,
          });
      },
    );
  });
}

describe('documentation snippets', () => {
  it('finds a prelude above a fence and keeps each block with its markdown line', () => {
    const md = [
      'text',
      '<!-- snippet-prelude:',
      'declare const url: string;',
      '-->',
      '```ts',
      'url;',
      '```',
      '```ts',
      'let a = 1;',
      '```',
    ].join('\n');
    assert.deepEqual(extractSnippets('x.md', md), [
      { file: 'x.md', line: 6, prelude: 'declare const url: string;', code: 'url;' },
      { file: 'x.md', line: 9, prelude: '', code: 'let a = 1;' },
    ]);
  });

  it('every TypeScript block in README.md and docs/*.md type-checks under the strict settings of tsconfig.json', {
    timeout: TSC_TIMEOUT_MS + 10_000,
  }, async () => {
    const snippets = markdownFiles().flatMap((file) => extractSnippets(file, readFileSync(join(ROOT, file), 'utf8')));
    assert.ok(snippets.length >= 5, `expected the README's snippets, found ${snippets.length}`);
    const dir = mkdtempSync(join(ROOT, 'test', '.snippets-'));
    try {
      const names = snippets.map((s, i) => {
        const name = `snippet-${i}.ts`;
        // `export {}` makes every file a module: top-level await works and names do not clash across files.
        writeFileSync(join(dir, name), `${s.prelude}\n${s.code}\nexport {};\n`);
        return name;
      });
      const base = relative(dir, join(ROOT, 'tsconfig.json'));
      const src = (path: string) => [relative(dir, join(ROOT, path))];
      writeFileSync(
        join(dir, 'tsconfig.json'),
        JSON.stringify({
          extends: base,
          compilerOptions: { noEmit: true, rootDir: relative(dir, ROOT), paths: packageEntries(src) },
          include: names,
        }),
      );
      const { code, output } = await tsc(join(dir, 'tsconfig.json'));
      // file(line,col): → the markdown file and line the snippet came from.
      const located = output.replace(/^.*?snippet-(\d+)\.ts\((\d+),(\d+)\)/gm, (_, n: string, l: string, c: string) => {
        const s = snippets[Number(n)];
        const line = Number(l);
        return line === 1
          ? `${s.file}:${s.line - 1} (the snippet-prelude above the block at line ${s.line}):${c}`
          : `${s.file}:${s.line + line - 2}:${c}`;
      });
      assert.equal(code, 0, `the documentation's TypeScript does not compile:\n${located}`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

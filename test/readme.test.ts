/**
 * The README is the front door: a newcomer reads it in ten minutes, so it stays short (at most 5 000
 * words, everything else on docs/ pages), opens with a table of contents whose every link lands on
 * one of its headings, links only to files that exist, and its library example really plays — an
 * environment that yields rollouts of 0 turns and reward 0 taught nothing and went unnoticed.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { libraryExampleSample, sampleBlock } from '../scripts/doc-samples.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
const MAX_WORDS = 5000;
const EXAMPLE_TIMEOUT_MS = 60_000;

/** As `wc -w` counts: runs of non-space characters. */
function wordCount(text: string): number {
  return text.split(/\s+/).filter((w) => w.length > 0).length;
}

/** The text outside fenced code blocks, where headings and links are. */
function prose(text: string): string {
  return text.replace(/^```[\s\S]*?^```$/gm, '');
}

/** GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`. */
function headingSlug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/ /g, '-');
}

function headings(text: string): string[] {
  return [...prose(text).matchAll(/^#{1,6} (.+)$/gm)].map((m) => headingSlug(m[1]));
}

/** The link targets of `[text](target)` outside code. */
function links(text: string): string[] {
  return [...prose(text).matchAll(/\]\(([^)\s]+)\)/g)].map((m) => m[1]);
}

/** The bullet list right under `## Contents`. */
function tableOfContents(text: string): string[] {
  const section = /^## Contents\n([\s\S]*?)\n## /m.exec(text)?.[1];
  assert.ok(section !== undefined, 'README.md has no "## Contents" section before its next heading');
  return [...section.matchAll(/^- \[[^\]]+\]\((#[^)]+)\)$/gm)].map((m) => m[1].slice(1));
}

describe('README.md', () => {
  it(`is at most ${MAX_WORDS} words`, () => {
    const words = wordCount(README);
    assert.ok(words <= MAX_WORDS, `README.md has ${words} words: move detail to a docs/ page and link it`);
  });

  it('makes anchors as GitHub does', () => {
    assert.equal(headingSlug('With vLLM / SGLang / llama.cpp'), 'with-vllm--sglang--llamacpp');
    assert.equal(
      headingSlug('Python trainers (the `rollout_engine` package)'),
      'python-trainers-the-rollout_engine-package',
    );
  });

  it('has a table of contents whose every link is one of its headings, and lists every ## heading', () => {
    const toc = tableOfContents(README);
    const all = new Set(headings(README));
    assert.ok(toc.length >= 5, `the table of contents has ${toc.length} entries`);
    assert.deepEqual(
      toc.filter((a) => !all.has(a)),
      [],
      'table-of-contents links with no heading',
    );
    const sections = [...prose(README).matchAll(/^## (.+)$/gm)]
      .map((m) => headingSlug(m[1]))
      .filter((s) => s !== 'contents');
    assert.deepEqual(sections, toc, 'the table of contents is the ## headings, in order');
  });

  it('starts with the set-up commands and `npx rollout run`', () => {
    const first = /```sh\n([\s\S]*?)```/.exec(README)?.[1] ?? '';
    assert.match(first, /^npm ci\b/m);
    assert.match(first, /^npm test\b/m);
    const run = README.indexOf('npx rollout run\n');
    assert.ok(run > 0 && run < README.indexOf('## The main job'), '`npx rollout run` comes in the quick start');
  });

  it('links only to files that exist, every docs/ page among them, and never outside the repository', () => {
    const local = links(README).filter((l) => !/^[a-z]+:/.test(l) && !l.startsWith('#'));
    assert.ok(
      local.some((l) => l.startsWith('docs/')),
      'the README links no docs/ page',
    );
    const missing = local.filter((l) => !existsSync(join(ROOT, l.split('#')[0])));
    assert.deepEqual(missing, [], 'README links to files that do not exist');
    const outside = local.filter((l) => relative(ROOT, join(ROOT, l)).startsWith('..'));
    assert.deepEqual(outside, [], 'README links outside the repository');
    // Nor in prose or commands: a path climbing out of the clone names files a clone does not have
    // (the clone itself, as a user's project installs it, aside).
    assert.doesNotMatch(
      README,
      /(^|[\s`(])\.\.\/(?!rollout-engine\b)/m,
      'the README names a path outside the repository',
    );
  });

  it('has its anchors, within the page and on the docs pages it links, resolve', () => {
    const problems: string[] = [];
    for (const link of links(README).filter((l) => !/^[a-z]+:/.test(l) && l.includes('#'))) {
      const [file, anchor] = link.split('#');
      const text = file === '' ? README : readFileSync(join(ROOT, file), 'utf8');
      if (!headings(text).includes(anchor)) problems.push(link);
    }
    assert.deepEqual(problems, []);
  });

  it('runs its library example: the environment plays turns and earns rewards', {
    timeout: EXAMPLE_TIMEOUT_MS + 10_000,
  }, async () => {
    const block = /## Library: a complete example\n[\s\S]*?```ts\n([\s\S]*?)```/.exec(README)?.[1];
    assert.ok(block !== undefined, 'no ```ts block under "## Library: a complete example"');
    const dir = mkdtempSync(join(ROOT, 'test', '.readme-example-'));
    try {
      const file = join(dir, 'example.ts');
      const entry = relative(dir, join(ROOT, 'src', 'index.ts')).replaceAll('\\', '/');
      writeFileSync(file, block.replace(`from 'rollout-engine'`, `from '${entry}'`));
      const stdout = await new Promise<string>((resolve, reject) => {
        execFile(
          process.execPath,
          ['--import', 'tsx', file],
          { cwd: ROOT, timeout: EXAMPLE_TIMEOUT_MS, env: { ...process.env, LOG_LEVEL: 'silent' } },
          (err, out, errOut) => (err ? reject(new Error(`${err.message}\n${errOut}`)) : resolve(out)),
        );
      });
      const lines = [...stdout.matchAll(/^step (\d+) \S+: turns ([\d ]+), rewards ([-\d. ]+)$/gm)];
      assert.equal(lines.length, 8, `expected 2 steps × 4 groups, got:\n${stdout}`);
      const turns = lines.flatMap((m) => m[2].split(' ').map(Number));
      const rewards = lines.flatMap((m) => m[3].split(' ').map(Number));
      assert.ok(
        turns.every((t) => t >= 1),
        `a rollout played no turn: ${turns.join(' ')}`,
      );
      assert.ok(
        turns.some((t) => t > 1),
        `no rollout played more than one turn: ${turns.join(' ')}`,
      );
      assert.ok(
        rewards.some((r) => r > 0),
        `no rollout earned a reward: ${rewards.join(' ')}`,
      );
      // And the README shows what it printed (scripts/doc-samples.ts: sorted, the middle elided).
      assert.equal(
        sampleBlock(README, 'library-example', 'README.md'),
        libraryExampleSample(stdout),
        "the README's sample of the library example's output is out of date: run `npm run docs:samples`",
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

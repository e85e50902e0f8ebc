/**
 * Sample outputs in README.md and docs/*.md, produced by running the commands they show, so they stay
 * true. A sample is the fenced block right under a marker:
 *
 *   <!-- sample: run-summary (npm run docs:samples) -->
 *
 * `npm run docs:samples` runs every sample's command and writes its output into its block;
 * test/doc-samples.test.ts (and, for the library example, test/readme.test.ts) runs them again and
 * compares, with the figures that change from run to run (times, rates, run dir names) masked.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('..', import.meta.url));
const CLI_MAIN = join(ROOT, 'src', 'cli', 'main.ts');
/** tsx by URL: a sample may run with another working directory (the run's, whose runs/ it shows). */
const TSX = import.meta.resolve('tsx');
const RUN_TIMEOUT_MS = 120_000;

export interface DocSample {
  id: string;
  /** The page, relative to the repository root. */
  page: string;
  /** Runs the command; resolves to the block's text as the page shows it. */
  produce(): Promise<string>;
  /** The text with what changes from run to run replaced, for comparing. */
  mask(text: string): string;
  /** The test that checks it, when not test/doc-samples.test.ts (one that runs the command anyway). */
  checkedBy?: string;
}

interface Output {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `node --import tsx <file> …args`, bounded; resolves whatever the exit code. */
function runNode(args: string[], cwd = ROOT): Promise<Output> {
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      ['--import', TSX, ...args],
      { cwd, timeout: RUN_TIMEOUT_MS, env: { ...process.env, LOG_LEVEL: 'silent' } },
      (err, stdout, stderr) => {
        if (err !== null && (err as { killed?: boolean }).killed)
          reject(new Error(`node ${args.join(' ')} did not finish within ${RUN_TIMEOUT_MS} ms`));
        else resolve({ code: err === null ? 0 : typeof err.code === 'number' ? err.code : 1, stdout, stderr });
      },
    );
  });
}

/** `$ rollout …args` and what it prints (stdout, then stderr), as a terminal shows it. */
async function terminal(args: string[]): Promise<string> {
  const { stdout, stderr } = await runNode([CLI_MAIN, ...args]);
  return `$ rollout ${args.join(' ')}\n${stdout}${stderr}`.trimEnd();
}

const unchanged = (text: string) => text;

/** The README's library example, as a program: its import of the package pointed at the source. */
export function libraryExample(readme: string, dir: string): string {
  const block = /## Library: a complete example\n[\s\S]*?```ts\n([\s\S]*?)```/.exec(readme)?.[1];
  if (block === undefined) throw new Error('README.md: no ```ts block under "## Library: a complete example"');
  const entry = relative(dir, join(ROOT, 'src', 'index.ts')).replaceAll('\\', '/');
  return block.replace(`from 'rollout-engine'`, `from '${entry}'`);
}

/**
 * The library example's lines as the README shows them: the groups of a step land in any order, so
 * they are sorted by step and group; the first two and the last, the rest elided.
 */
export function libraryExampleSample(stdout: string): string {
  const key = (line: string) => {
    const m = /^step (\d+) \S+?\/(\d+):/.exec(line);
    return m === null ? [0, 0] : [Number(m[1]), Number(m[2])];
  };
  const lines = stdout
    .split('\n')
    .filter((l) => l.startsWith('step '))
    .sort((a, b) => {
      const [sa, ga] = key(a);
      const [sb, gb] = key(b);
      return sa - sb || ga - gb;
    });
  return lines.length <= 3 ? lines.join('\n') : [lines[0], lines[1], '…', lines.at(-1)].join('\n');
}

export const SAMPLES: DocSample[] = [
  {
    id: 'run-summary',
    page: 'README.md',
    // Run where its default run dir (runs/<timestamp>-<random>) can be made and thrown away.
    async produce() {
      const dir = mkdtempSync(join(tmpdir(), 'doc-sample-'));
      try {
        const { code, stdout, stderr } = await runNode([CLI_MAIN, 'run'], dir);
        if (code !== 0) throw new Error(`rollout run exited ${code}:\n${stderr}`);
        return stdout.replaceAll(dir, '/…').trimEnd();
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
    mask: (text) =>
      text.replace(/\d{8}-\d{6}-[0-9a-f]{8}/g, '<run>').replace(/^( {2}time {8}).*$/m, '$1<seconds>, <steps/s>'),
  },
  {
    id: 'library-example',
    page: 'README.md',
    checkedBy: 'test/readme.test.ts',
    async produce() {
      const dir = mkdtempSync(join(ROOT, 'test', '.readme-example-'));
      try {
        const file = join(dir, 'example.ts');
        writeFileSync(file, libraryExample(readFileSync(join(ROOT, 'README.md'), 'utf8'), dir));
        const { code, stdout, stderr } = await runNode([file]);
        if (code !== 0) throw new Error(`the library example exited ${code}:\n${stderr}`);
        return libraryExampleSample(stdout);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
    mask: unchanged,
  },
  {
    id: 'mistyped-flag',
    page: 'docs/CLI.md',
    produce: () => terminal(['run', '--bach-size', '4']),
    mask: unchanged,
  },
  {
    id: 'help-run',
    page: 'docs/CLI.md',
    produce: () => terminal(['help', 'run']),
    mask: unchanged,
  },
];

const MARKER = /^<!-- sample: ([a-z0-9-]+) \(npm run docs:samples\) -->$/;

/** Where sample `id`'s block is in `page`: the lines between its fences. */
function locate(text: string, id: string, page: string): { start: number; end: number; lines: string[] } {
  const lines = text.split('\n');
  const marker = lines.findIndex((l) => MARKER.exec(l)?.[1] === id);
  if (marker < 0) throw new Error(`${page}: no marker <!-- sample: ${id} (npm run docs:samples) -->`);
  if (!/^```/.test(lines[marker + 1] ?? ''))
    throw new Error(`${page}:${marker + 1}: the sample marker is not right above a fenced block`);
  const end = lines.findIndex((l, i) => i > marker + 1 && /^```\s*$/.test(l));
  if (end < 0) throw new Error(`${page}:${marker + 2}: the sample's block is never closed`);
  return { start: marker + 2, end, lines };
}

/** The text of sample `id`'s block in `text` (the page `page`). */
export function sampleBlock(text: string, id: string, page = 'the page'): string {
  const { start, end, lines } = locate(text, id, page);
  return lines.slice(start, end).join('\n');
}

/** `text` with sample `id`'s block replaced by `block`. */
export function withSample(text: string, id: string, block: string, page = 'the page'): string {
  const { start, end, lines } = locate(text, id, page);
  return [...lines.slice(0, start), block, ...lines.slice(end)].join('\n');
}

/** The ids of every sample marker on a page. */
export function markersOn(text: string): string[] {
  return text.split('\n').flatMap((l) => {
    const id = MARKER.exec(l)?.[1];
    return id === undefined ? [] : [id];
  });
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  const only = process.argv.slice(2);
  for (const sample of SAMPLES) {
    if (only.length > 0 && !only.includes(sample.id)) continue;
    const path = join(ROOT, sample.page);
    const block = await sample.produce();
    writeFileSync(path, withSample(readFileSync(path, 'utf8'), sample.id, block, sample.page));
    console.log(`${sample.page}: sample ${sample.id}`);
  }
}

/**
 * The import graph of src/ and workers/, and the layering it must keep (docs/ARCHITECTURE.md, "Layers").
 *
 * A regex over `import … from`, `export … from`, `import '…'` and `import('…')` is enough: the code is
 * formatted so that a statement starts at column 0, and a doc comment's example never does. Only
 * relative specifiers are edges; packages are not ours to layer.
 *
 * Rules, each failing with the file, line and edge (or the whole cycle):
 * - no import cycle, type-only imports included: a cycle is two modules that cannot be read (or
 *   moved) one without the other, whatever the runtime makes of it. A dynamic `import()` is not part
 *   of a cycle (it runs after both modules are evaluated, and is how the coordinator loads the
 *   gateway, and src/engine.ts the mock, on demand), but it is an edge for the rules below;
 * - the worker side (worker/, workers/) and what it runs (env/, llm/) never import the main thread's
 *   coordinator/, buffer/, control/ or cli/: that code is not loaded into a worker thread;
 * - nor gateway/: the gateway is a server beside the engine (on the main thread, or `rollout
 *   gateway`) built on llm/'s wire code, which workers reach over HTTP (llm/gateway-client.ts). What
 *   both need of a model's tokenizer and chat template is in chat-model/, below both;
 * - the bottom of the stack imports only what is below it: the error codes nothing, errors.ts the
 *   codes, domain/ (the data) errors, protocol/ (what crosses threads) the data and errors — it is
 *   what both sides of the thread boundary share. One exception, type-only: the worker's start-up
 *   message (WorkerInit) carries the settings of the worker-side modules that read them (env/, llm/,
 *   worker/), typed by those modules. chat-model/ (a tokenizer and its template, and the prompt ids
 *   they make) is a leaf beside them: it imports the errors and nothing else of src/;
 * - formats/ (the files and wire forms of batches, checkpoints and peers' messages) reads and writes
 *   data: it imports domain/ and the errors, never the coordinator that makes a batch;
 * - config.ts is read by every layer that is configured, so it imports none of them: not cluster/,
 *   coordinator/, control/, cli/, gateway/, buffer/, worker/ (the patterns it validates live in it);
 * - mock-llm/ (the mock inference server the package ships) is imported only by src/engine.ts, which
 *   starts it when `llm.url` is null (the coordinator sees an EmbeddedLlm), cli/, which serves it, and
 *   loadtest/, a tool over it (its GPU metrics); never by the coordinator or the parts a real run uses;
 * - nothing in src/ imports a package entry (src/index.ts): the entry re-exports, it is not a library
 *   to build with, and an import of it drags every module into a cycle with the importer.
 *
 * Run it alone with `node --import tsx test/support/layering.ts`; test/layering.test.ts runs it in `npm test`.
 */
import { readdirSync, readFileSync, existsSync } from 'node:fs';
import { dirname, join, posix, relative, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

export interface ImportEdge {
  /** Both repository-relative, with `/`: `src/worker/agent-loop.ts`. */
  from: string;
  to: string;
  line: number;
  /** `dynamic`: an `import('…')` expression, loaded on demand. */
  kind: 'static' | 'dynamic';
  /** `import type …`, or every name imported is `type X`: erased, nothing is loaded. */
  typeOnly: boolean;
}

/** Folders (under the repository root) whose modules make up the graph. */
const ROOTS = ['src', 'workers'];

/** Layers of src/ that must not reach the main thread's code, and that code. */
const WORKER_SIDE = ['src/worker/', 'workers/', 'src/env/', 'src/llm/'];
const MAIN_THREAD_ONLY = ['src/coordinator/', 'src/buffer/', 'src/control/', 'src/cli/'];
/** The bottom of the stack, lowest first: what each imports besides itself. */
const FOUNDATION: [layer: string, below: string[]][] = [
  ['src/error-codes.ts', []],
  ['src/errors.ts', ['src/error-codes.ts']],
  ['src/domain/', ['src/errors.ts', 'src/error-codes.ts']],
  ['src/protocol/', ['src/domain/', 'src/errors.ts', 'src/error-codes.ts']],
  ['src/chat-model/', ['src/errors.ts', 'src/error-codes.ts']],
];
/** What the start-up message may name the settings of, type-only (see the module comment). */
const WORKER_SETTINGS = ['src/env/', 'src/llm/', 'src/worker/'];
const PACKAGE_ENTRY = 'src/index.ts';
/** Modules that must not import the layers above them, besides the foundation: [modules or folders, forbidden, why]. */
const BELOW: [from: string[], forbidden: string[], why: string][] = [
  [
    WORKER_SIDE,
    ['src/gateway/'],
    'the worker side (worker/, workers/, env/, llm/) never imports gateway/: a server built on llm/, reached over HTTP; the tokenizer both use is in chat-model/',
  ],
  [
    ['src/formats/'],
    ['src/coordinator/', 'src/control/', 'src/cli/', 'src/buffer/', 'src/cluster/', 'src/gateway/', 'src/worker/'],
    'formats/ writes and reads data: the types it writes live in src/domain/',
  ],
  [
    ['src/config.ts'],
    ['src/cluster/', 'src/coordinator/', 'src/control/', 'src/cli/', 'src/gateway/', 'src/buffer/', 'src/worker/'],
    'config.ts is below the layers it configures: what it validates lives in it (or below it)',
  ],
];

/** Folders only some modules may import, besides their own: [folder, its importers, why]. */
const IMPORTED_ONLY_BY: [target: string, importers: string[], why: string][] = [
  [
    'src/mock-llm/',
    ['src/engine.ts', 'src/cli/', 'src/loadtest/'],
    'mock-llm/ is imported only by src/engine.ts (the embedded mock, an EmbeddedLlm to coordinator/), cli/ and loadtest/',
  ],
];

const STATIC = /^(?:import|export)\s([^;'"]*?)\sfrom\s*['"]([^'"]+)['"]|^import\s*['"]([^'"]+)['"]/gm;
const DYNAMIC = /\bimport\(\s*['"]([^'"]+)['"]\s*\)/g;

export function importGraph(root: string): ImportEdge[] {
  const edges: ImportEdge[] = [];
  for (const file of ROOTS.flatMap((dir) => tsFiles(root, dir))) {
    const text = readFileSync(join(root, file), 'utf8');
    const lineOf = (index: number): number => text.slice(0, index).split('\n').length;
    const add = (specifier: string, index: number, kind: ImportEdge['kind'], typeOnly = false): void => {
      if (!specifier.startsWith('.')) return;
      const to = posix.normalize(posix.join(posix.dirname(file), specifier));
      if (!existsSync(join(root, to)))
        throw new Error(`${file}:${lineOf(index)}: import of ${specifier} names no file (${to})`);
      edges.push({ from: file, to, line: lineOf(index), kind, typeOnly });
    };
    for (const m of text.matchAll(STATIC)) add(m[2] ?? m[3], m.index, 'static', m[1] !== undefined && isTypeOnly(m[1]));
    for (const m of text.matchAll(DYNAMIC)) add(m[1], m.index, 'dynamic');
  }
  return edges;
}

/** `type { A }`, or `{ type A, type B }`: the clause between `import` / `export` and `from`. */
function isTypeOnly(clause: string): boolean {
  if (/^type\s/.test(clause)) return true;
  const names = /^\{([^}]*)\}$/
    .exec(clause.trim())?.[1]
    .split(',')
    .map((n) => n.trim())
    .filter((n) => n !== '');
  return names !== undefined && names.length > 0 && names.every((n) => n.startsWith('type '));
}

function tsFiles(root: string, dir: string): string[] {
  if (!existsSync(join(root, dir))) return [];
  return readdirSync(join(root, dir), { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => relative(root, join(e.parentPath, e.name)).split(sep).join('/'))
    .sort();
}

/** Every import cycle over static edges, one per strongly connected component, as the modules in order (first repeated last). */
export function findCycles(edges: readonly ImportEdge[]): string[][] {
  const next = new Map<string, string[]>();
  for (const e of edges)
    if (e.kind === 'static' && e.from !== e.to) next.set(e.from, [...(next.get(e.from) ?? []), e.to]);
  const selfLoops = edges.filter((e) => e.kind === 'static' && e.from === e.to).map((e) => [e.from, e.from]);
  return [
    ...selfLoops,
    ...stronglyConnected(next)
      .filter((c) => c.length > 1)
      .map((component) => cycleThrough(component, next)),
  ];
}

/** Tarjan's algorithm, iterative (a recursion per module is fine at 150 files, but not worth the risk). */
function stronglyConnected(next: Map<string, string[]>): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const components: string[][] = [];
  let counter = 0;
  const nodes = [...new Set([...next.keys(), ...[...next.values()].flat()])].sort();
  for (const start of nodes) {
    if (index.has(start)) continue;
    const work: { node: string; i: number }[] = [{ node: start, i: 0 }];
    index.set(start, counter);
    low.set(start, counter++);
    stack.push(start);
    onStack.add(start);
    while (work.length > 0) {
      const frame = work[work.length - 1];
      const targets = next.get(frame.node) ?? [];
      if (frame.i < targets.length) {
        const to = targets[frame.i++];
        if (!index.has(to)) {
          index.set(to, counter);
          low.set(to, counter++);
          stack.push(to);
          onStack.add(to);
          work.push({ node: to, i: 0 });
        } else if (onStack.has(to)) {
          low.set(frame.node, Math.min(low.get(frame.node)!, index.get(to)!));
        }
        continue;
      }
      work.pop();
      if (work.length > 0) {
        const parent = work[work.length - 1].node;
        low.set(parent, Math.min(low.get(parent)!, low.get(frame.node)!));
      }
      if (low.get(frame.node) === index.get(frame.node)) {
        const component: string[] = [];
        let node: string;
        do {
          node = stack.pop()!;
          onStack.delete(node);
          component.push(node);
        } while (node !== frame.node);
        components.push(component.sort());
      }
    }
  }
  return components;
}

/** A shortest cycle through the component's first module (breadth-first inside it): the one to name. */
function cycleThrough(component: string[], next: Map<string, string[]>): string[] {
  const inside = new Set(component);
  const start = component[0];
  const cameFrom = new Map<string, string>();
  const queue = [start];
  for (let i = 0; i < queue.length; i++) {
    for (const to of next.get(queue[i]) ?? []) {
      if (!inside.has(to)) continue;
      if (to === start) {
        const path: string[] = [];
        for (let at = queue[i]; at !== start; at = cameFrom.get(at)!) path.unshift(at);
        return [start, ...path, start];
      }
      if (!cameFrom.has(to)) {
        cameFrom.set(to, queue[i]);
        queue.push(to);
      }
    }
  }
  return [...component, start]; // unreachable for a true component; still names its modules
}

/** Each import that crosses a layer it must not, as `file:line imports target (why)`. */
export function layeringViolations(edges: readonly ImportEdge[]): string[] {
  const problems: string[] = [];
  const under = (file: string, dirs: readonly string[]): boolean => dirs.some((d) => file.startsWith(d));
  for (const e of edges) {
    const at = `${e.from}:${e.line} imports ${e.to}`;
    if (under(e.from, WORKER_SIDE) && under(e.to, MAIN_THREAD_ONLY)) {
      problems.push(
        `${at}: the worker side (worker/, workers/, env/, llm/) never imports the main thread's coordinator/, buffer/, control/ or cli/`,
      );
    }
    const foundation = FOUNDATION.find(([layer]) => e.from.startsWith(layer));
    if (foundation !== undefined) {
      const [layer, below] = foundation;
      const settings = layer === 'src/protocol/' && e.typeOnly && under(e.to, WORKER_SETTINGS);
      if (!e.to.startsWith(layer) && !under(e.to, below) && !settings) {
        problems.push(
          `${at}: ${layer} imports ${below.length === 0 ? 'nothing of src/' : `only ${below.join(', ')}`}${layer === 'src/protocol/' ? " (and, type-only, the worker side's settings)" : ''}`,
        );
      }
    }
    for (const [layers, forbidden, why] of BELOW)
      if (under(e.from, layers) && under(e.to, forbidden)) problems.push(`${at}: ${why}`);
    for (const [target, importers, why] of IMPORTED_ONLY_BY)
      if (e.to.startsWith(target) && !e.from.startsWith(target) && !under(e.from, importers))
        problems.push(`${at}: ${why}`);
    if (e.to === PACKAGE_ENTRY && e.from.startsWith('src/')) {
      problems.push(`${at}: import from the module that defines it, not the package entry`);
    }
  }
  return problems;
}

/** Every problem with the graph under `root`: each cycle named module by module, then each forbidden edge. */
export function checkLayering(root: string): string[] {
  const edges = importGraph(root);
  return [...findCycles(edges).map((cycle) => `import cycle: ${cycle.join(' → ')}`), ...layeringViolations(edges)];
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  const problems = checkLayering(join(dirname(fileURLToPath(import.meta.url)), '..', '..'));
  process.stdout.write(
    problems.length === 0 ? 'layering: no cycle, no forbidden import\n' : `${problems.join('\n')}\n`,
  );
  process.exitCode = problems.length === 0 ? 0 : 1;
}

/**
 * The config reference (docs/CONFIGURATION.md) is generated from the schema (scripts/config-docs.ts,
 * `npm run schema`): the page must be what the script writes, so it cannot drift from src/config.ts.
 * And the generator, which reads the JSON Schema, is checked against the zod schema itself, option
 * for option: every option EngineConfigSchema accepts has a row, every row names an option that
 * exists, and every default a row shows is the one zod fills in (`resume` once had no row).
 *
 * A default cell is a literal in backticks (compared as JSON), `required`, `—` (no default), "its
 * fields'" (a section), or words for a default computed at run time (the schema's default is then
 * absent, or the option is in COMPUTED_DEFAULTS).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';
import { describe, it } from 'node:test';
import {
  BEGIN_MARKER,
  CONFIGURATION_PATH,
  END_MARKER,
  type ReferenceRow,
  referenceMarkdown,
  referenceRows,
  withReference,
} from '../scripts/config-docs.ts';
import { EngineConfigSchema } from '../src/config.ts';

const PAGE = readFileSync(CONFIGURATION_PATH, 'utf8');

/**
 * Options whose default the reference says in words: computed from the machine or the environment,
 * or a list of whole tasks.
 */
const COMPUTED_DEFAULTS = new Set(['workers.threads', 'logLevel', 'tasks']);

interface Option {
  /** As the reference writes it: `llm.url`, `tasks[].env.http.urls`, `llm.policies.<agent>.model`. */
  path: string;
  hasDefault: boolean;
  defaultValue: unknown;
  /** Fields of an object option (an array of objects: its element's; a map: its values'); null for a leaf. */
  children: Option[] | null;
}

/** The part of zod's internals the walk reads: every schema has `_zod.def` with its `type`. */
interface Def {
  type: string;
  innerType?: Schema;
  in?: Schema;
  element?: Schema;
  valueType?: Schema;
  options?: Schema[];
  shape?: Record<string, Schema>;
  defaultValue?: unknown;
}
interface Schema {
  _zod: { def: Def };
}

/** Strips defaults, optional, nullable and transforms down to the schema that says what the option is. */
function unwrap(schema: Schema): { def: Def; hasDefault: boolean; defaultValue: unknown } {
  let def = schema._zod.def;
  let hasDefault = false;
  let defaultValue: unknown;
  for (;;) {
    if (def.type === 'default' && !hasDefault) {
      hasDefault = true;
      defaultValue = def.defaultValue;
    }
    const next =
      def.type === 'pipe' ? def.in : ['default', 'optional', 'nullable'].includes(def.type) ? def.innerType : undefined;
    if (next === undefined) return { def, hasDefault, defaultValue };
    def = next._zod.def;
  }
}

/** The object shapes below a field: itself, its array's element, its map's values, a union's objects. */
function shapesOf(def: Def, path: string): { shape: Record<string, Schema>; prefix: string }[] {
  if (def.type === 'object') return [{ shape: def.shape!, prefix: `${path}.` }];
  if (def.type === 'array')
    return shapesOf(unwrap(def.element!).def, path).map((s) => ({ ...s, prefix: s.prefix.replace(path, `${path}[]`) }));
  if (def.type === 'record')
    return shapesOf(unwrap(def.valueType!).def, path).map((s) => ({
      ...s,
      prefix: s.prefix.replace(path, `${path}.<agent>`),
    }));
  if (def.type === 'union') return def.options!.flatMap((o) => shapesOf(unwrap(o).def, path));
  return [];
}

function optionsOf(shape: Record<string, Schema>, prefix: string): Option[] {
  return Object.entries(shape).map(([key, schema]) => {
    const { def, hasDefault, defaultValue } = unwrap(schema);
    const path = `${prefix}${key}`;
    const shapes = shapesOf(def, path);
    const children = shapes.length === 0 ? null : shapes.flatMap((s) => optionsOf(s.shape, s.prefix));
    return { path, hasDefault, defaultValue, children };
  });
}

/** What is wrong with `row`'s default cell as the default of `option`, or null. */
function defaultProblem(option: Option, row: Pick<ReferenceRow, 'defaultText' | 'kind'>): string | null {
  const shown = row.defaultText.trim();
  if (shown === '—' || shown === 'required')
    return option.hasDefault
      ? `the reference shows no default, src/config.ts has ${JSON.stringify(option.defaultValue)}`
      : null;
  if (row.kind === 'object' && shown === "its fields'") return null;
  const literal = /^`([^`]*)`$/.exec(shown)?.[1];
  let value: unknown;
  let isLiteral = literal !== undefined;
  try {
    if (isLiteral) value = JSON.parse(literal!);
  } catch {
    isLiteral = false;
  }
  if (!isLiteral) {
    // Words: a default computed at run time (the dialect's route, the number of cores).
    if (COMPUTED_DEFAULTS.has(option.path) || !option.hasDefault) return null;
    return `the reference describes the default as ${JSON.stringify(shown)}, src/config.ts has ${JSON.stringify(option.defaultValue)}`;
  }
  if (!option.hasDefault) return `the reference shows default ${literal}, src/config.ts has none`;
  return isDeepStrictEqual(value, option.defaultValue)
    ? null
    : `the reference shows default ${literal}, src/config.ts has ${JSON.stringify(option.defaultValue)}`;
}

/** Every problem between the reference's rows and the zod schema, one line each. */
function tableProblems(options: Option[], rows: Pick<ReferenceRow, 'path' | 'defaultText' | 'kind'>[]): string[] {
  const problems: string[] = [];
  const byPath = new Map(rows.map((row) => [row.path, row]));
  const known = new Set<string>();
  const visit = (option: Option) => {
    known.add(option.path);
    const row = byPath.get(option.path);
    if (row === undefined)
      problems.push(
        `\`${option.path}\` has no row in the config reference (default: ${option.hasDefault ? JSON.stringify(option.defaultValue) : 'none'})`,
      );
    else {
      const problem = defaultProblem(option, row);
      if (problem !== null) problems.push(`\`${option.path}\`: ${problem}`);
    }
    option.children?.forEach(visit);
  };
  options.forEach(visit);
  for (const path of byPath.keys())
    if (!known.has(path)) problems.push(`row \`${path}\` names no option of EngineConfigSchema (src/config.ts)`);
  return problems;
}

describe('config reference (docs/CONFIGURATION.md)', () => {
  const options = optionsOf((EngineConfigSchema as unknown as Schema)._zod.def.shape!, '');

  it('finds the nested options of the schema: llm.url, tasks[].env.http.urls', () => {
    const paths: string[] = [];
    const collect = (o: Option) => (paths.push(o.path), o.children?.forEach(collect));
    options.forEach(collect);
    assert.ok(
      paths.includes('llm.url') &&
        paths.includes('tasks[].env.http.urls') &&
        paths.includes('producer.maxSkippedSteps'),
      paths.join(', '),
    );
  });

  it('names a missing option, a row for no option and a wrong default, each on its own line', () => {
    const rows = [
      { path: 'a', defaultText: '`1`', kind: 'leaf' as const },
      { path: 'gone', defaultText: '`0`', kind: 'leaf' as const },
    ];
    const fake: Option[] = [
      { path: 'a', hasDefault: true, defaultValue: 2, children: null },
      { path: 'b', hasDefault: true, defaultValue: false, children: null },
    ];
    assert.deepEqual(tableProblems(fake, rows), [
      '`a`: the reference shows default 1, src/config.ts has 2',
      '`b` has no row in the config reference (default: false)',
      'row `gone` names no option of EngineConfigSchema (src/config.ts)',
    ]);
  });

  it("has a row for every option of EngineConfigSchema, no row for an option that does not exist, and the schema's defaults", () => {
    const problems = tableProblems(options, referenceRows());
    assert.deepEqual(problems, [], `the generated reference and src/config.ts disagree:\n${problems.join('\n')}`);
  });

  it('describes every option (a `.describe()` text in src/config.ts)', () => {
    const bare = referenceRows()
      .filter((row) => row.description === '')
      .map((row) => row.path);
    assert.deepEqual(bare, [], 'add .describe() to these options in src/config.ts, then run `npm run schema`');
  });

  it('is what `npm run schema` writes: the page between its markers is the generated reference', () => {
    assert.ok(PAGE.includes(BEGIN_MARKER) && PAGE.includes(END_MARKER), 'docs/CONFIGURATION.md lost its markers');
    assert.equal(
      PAGE,
      withReference(PAGE, referenceMarkdown()),
      'docs/CONFIGURATION.md differs from the schema: run `npm run schema` and commit docs/CONFIGURATION.md',
    );
  });

  it('keeps the hand-written prose outside the markers, and fails on a hand edit inside them', () => {
    const edited = PAGE.replace('| `batchSize` |', '| `batchSize` (edited) |');
    assert.notEqual(edited, PAGE);
    assert.notEqual(withReference(edited), edited);
    assert.ok(
      withReference(`intro\n${BEGIN_MARKER}\nold\n${END_MARKER}\noutro`, 'NEW').startsWith('intro\nNEW\noutro'),
    );
  });
});

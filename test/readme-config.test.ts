/**
 * The config reference (docs/CONFIGURATION.md) is the schema's, option for option: every option EngineConfigSchema
 * (src/config.ts) accepts has a row, every row names an option that exists, and every default the
 * table shows is the one the schema fills in. Options are added often; without this the table drifts
 * silently (`resume` had no row).
 *
 * A row names one option or several (`a` / `b`, with one default each or one for all). A row may name
 * an object option whole (`tasks[].env.http`, `tasks[].hooks`): it must then name each of its fields.
 * A default cell is a literal in backticks (compared as JSON), `—` (no default: required or absent),
 * or words for a default computed at run time (the schema's default is then null or absent, or the
 * option is in COMPUTED_DEFAULTS).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { isDeepStrictEqual } from 'node:util';
import { describe, it } from 'node:test';
import { EngineConfigSchema } from '../src/config.ts';

/** The config reference moved out of the README into a page of its own (docs/CONFIGURATION.md). */
const REFERENCE = readFileSync(new URL('../docs/CONFIGURATION.md', import.meta.url), 'utf8');

/** Options whose schema default depends on the machine or the environment, described in words. */
const COMPUTED_DEFAULTS = new Set(['workers.threads', 'logLevel']);

interface Option {
  /** As the table writes it: `llm.url`, `tasks[].env.http.urls`. */
  path: string;
  hasDefault: boolean;
  defaultValue: unknown;
  /** Fields of an object option (an array of objects: its element's); null for a leaf. */
  children: Option[] | null;
}

/** The part of zod's internals the walk reads: every schema has `_zod.def` with its `type`. */
interface Def {
  type: string;
  innerType?: Schema;
  in?: Schema;
  element?: Schema;
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

function optionsOf(shape: Record<string, Schema>, prefix: string): Option[] {
  return Object.entries(shape).map(([key, schema]) => {
    const { def, hasDefault, defaultValue } = unwrap(schema);
    const path = `${prefix}${key}`;
    let children: Option[] | null = null;
    if (def.type === 'object') children = optionsOf(def.shape!, `${path}.`);
    else if (def.type === 'array') {
      const element = unwrap(def.element!).def;
      if (element.type === 'object') children = optionsOf(element.shape!, `${path}[].`);
    }
    return { path, hasDefault, defaultValue, children };
  });
}

interface Row {
  names: string[];
  defaults: string;
  text: string;
}

function configTable(readme: string): Row[] {
  const section = readme.split(/^#{1,2} /m).find((s) => s.startsWith('Config reference'));
  assert.ok(section !== undefined, 'docs/CONFIGURATION.md has no "# Config reference" section');
  return section
    .split('\n')
    .filter((line) => line.startsWith('| `'))
    .map((line) => {
      const [field, defaults] = line
        .split(/(?<!\\)\|/)
        .slice(1)
        .map((c) => c.trim());
      return { names: [...field.matchAll(/`([^`]+)`/g)].map((m) => m[1]), defaults, text: line };
    });
}

/** What is wrong with `cell` as the default of `option`, or null. */
function defaultProblem(option: Option, cell: string): string | null {
  const shown = cell.trim();
  if (shown === '—')
    return option.hasDefault
      ? `the reference shows no default, src/config.ts has ${JSON.stringify(option.defaultValue)}`
      : null;
  const literal = /^`([^`]*)`/.exec(shown)?.[1];
  let value: unknown;
  let isLiteral = literal !== undefined;
  try {
    if (isLiteral) value = JSON.parse(literal!);
  } catch {
    isLiteral = false;
  }
  if (!isLiteral) {
    // Words: a default computed at run time (the dialect's route, 2 × batchSize, the number of cores).
    if (COMPUTED_DEFAULTS.has(option.path) || !option.hasDefault || option.defaultValue === null) return null;
    return `the reference describes the default as ${JSON.stringify(shown)}, src/config.ts has ${JSON.stringify(option.defaultValue)}`;
  }
  if (!option.hasDefault) return `the reference shows default ${literal}, src/config.ts has none`;
  return isDeepStrictEqual(value, option.defaultValue)
    ? null
    : `the reference shows default ${literal}, src/config.ts has ${JSON.stringify(option.defaultValue)}`;
}

/** Every problem between the table and the schema, one line each. */
function tableProblems(options: Option[], rows: Row[]): string[] {
  const problems: string[] = [];
  const byName = new Map<string, { row: Row; index: number }>();
  for (const row of rows) row.names.forEach((name, index) => byName.set(name, { row, index }));
  const known = new Set<string>();
  const visit = (option: Option) => {
    known.add(option.path);
    const found = byName.get(option.path);
    if (found === undefined) {
      if (option.children === null)
        problems.push(
          `\`${option.path}\` has no row in the config reference (default: ${option.hasDefault ? JSON.stringify(option.defaultValue) : 'none'})`,
        );
      else option.children.forEach(visit);
      return;
    }
    const { row, index } = found;
    const cells = row.defaults.split(/ \/ /);
    const cell = cells.length === row.names.length ? cells[index] : cells.length === 1 ? cells[0] : null;
    if (cell === null)
      problems.push(`row \`${row.names.join('` / `')}\`: ${cells.length} defaults for ${row.names.length} options`);
    else {
      const problem = defaultProblem(option, cell);
      if (problem !== null) problems.push(`\`${option.path}\`: ${problem}`);
    }
    // A row for a whole object names each of its fields.
    const walk = (o: Option) => {
      known.add(o.path);
      o.children?.forEach(walk);
    };
    for (const child of option.children ?? []) {
      walk(child);
      const field = child.path.slice(option.path.length).replace(/^(\[\])?\./, '');
      if (!new RegExp(`\\b${field}\\b`).test(row.text))
        problems.push(`\`${option.path}\`: its row does not name the field \`${field}\``);
      // `field: value` inside the row (`{ urls, timeoutMs: 30000, … }`) is a default too, when a JSON literal.
      const inline = new RegExp(`\\b${field}: ([^\\s,}]+)`).exec(row.text)?.[1].trim();
      if (inline !== undefined) {
        const problem = defaultProblem(child, `\`${inline}\``);
        if (problem !== null) problems.push(`\`${child.path}\`: ${problem}`);
      }
    }
  };
  options.forEach(visit);
  for (const name of byName.keys())
    if (!known.has(name)) problems.push(`row \`${name}\` names no option of EngineConfigSchema (src/config.ts)`);
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
    const rows: Row[] = [
      { names: ['a'], defaults: '`1`', text: '| `a` | `1` | |' },
      { names: ['gone'], defaults: '`0`', text: '| `gone` | `0` | |' },
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
    const problems = tableProblems(options, configTable(REFERENCE));
    assert.deepEqual(problems, [], `docs/CONFIGURATION.md and src/config.ts disagree:\n${problems.join('\n')}`);
  });
});

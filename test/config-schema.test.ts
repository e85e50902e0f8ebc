/**
 * schema/config.schema.json is what an editor checks a config file against (`"$schema"`). It is
 * generated from the zod schema (scripts/config-schema.ts, `npm run schema`); these tests keep the
 * committed file equal to a fresh generation, and check the configs the package ships and the docs
 * show against the file itself (test/support/json-schema.ts), so neither can drift from the other.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { describe, it } from 'node:test';
import { configJsonSchemaText, SCHEMA_PATH } from '../scripts/config-schema.ts';
import { parseJsonWithComments } from '../src/cli/config-flags.ts';
import { resolveConfig } from '../src/config.ts';
import { validate } from './support/json-schema.ts';

const ROOT = new URL('../', import.meta.url);
const schemaText = readFileSync(SCHEMA_PATH, 'utf8');
const schema = JSON.parse(schemaText) as Record<string, unknown> & {
  properties: { tasks: { items: Record<string, unknown> } };
};

/** Every ```json / ```jsonc block of the README and docs/ that parses (comments allowed), with where it is. */
function docSnippets(): { where: string; value: unknown }[] {
  const pages = ['README.md', ...readdirSync(new URL('docs/', ROOT)).map((name) => `docs/${name}`)].filter((page) =>
    page.endsWith('.md'),
  );
  const found: { where: string; value: unknown }[] = [];
  for (const page of pages) {
    const text = readFileSync(new URL(page, ROOT), 'utf8');
    for (const match of text.matchAll(/```jsonc?\n([\s\S]*?)```/g)) {
      try {
        found.push({
          where: `${page}:${text.slice(0, match.index).split('\n').length}`,
          value: parseJsonWithComments(match[1]),
        });
      } catch {
        // A fragment (a field, `…` for elided parts): not a whole config or task.
      }
    }
  }
  return found;
}

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

describe('config JSON Schema', () => {
  it('the committed schema/config.schema.json is what `npm run schema` generates from the zod schema', () => {
    assert.equal(schemaText, configJsonSchemaText(), 'run `npm run schema` and commit schema/config.schema.json');
  });

  it('the package ships the schema file', () => {
    const pkg = JSON.parse(readFileSync(new URL('package.json', ROOT), 'utf8')) as { files: string[] };
    assert.ok(pkg.files.includes('schema'));
  });

  it('every example config validates against the schema file and names it with $schema', () => {
    const examples = readdirSync(new URL('examples/', ROOT)).filter((name) => name.endsWith('.json'));
    assert.ok(examples.length > 0);
    for (const name of examples) {
      const config = parseJsonWithComments(readFileSync(new URL(`examples/${name}`, ROOT), 'utf8')) as Record<
        string,
        unknown
      >;
      assert.deepEqual(validate(schema, config), [], `examples/${name}`);
      assert.equal(config.$schema, '../schema/config.schema.json', `examples/${name}`);
      assert.doesNotThrow(() => resolveConfig(config), 'and the engine takes it, $schema included');
    }
  });

  it('every whole config and every task the docs show as JSON validates against the schema file', () => {
    let checked = 0;
    for (const { where, value } of docSnippets()) {
      if (!isObject(value)) continue;
      if ('tasks' in value && Array.isArray(value.tasks)) {
        assert.deepEqual(validate(schema, value), [], where);
        checked++;
      } else if ('name' in value && 'env' in value) {
        assert.deepEqual(validate(schema.properties.tasks.items, value), [], where);
        checked++;
      }
    }
    assert.ok(checked >= 3, `only ${checked} config snippets found in the docs`);
  });

  it('the schema file refuses what the engine refuses: an unknown key, a wrong type, a value out of range', () => {
    const problems = (config: unknown) => validate(schema, config);
    assert.deepEqual(problems({}), []);
    assert.deepEqual(problems({ batchSize: 8, llm: { url: 'http://127.0.0.1:8000/v1' } }), []);
    assert.match(problems({ batchSise: 8 }).join('\n'), /unknown key batchSise/);
    assert.match(problems({ batchSize: '8' }).join('\n'), /\$\.batchSize: expected integer/);
    assert.match(problems({ batchSize: 0 }).join('\n'), /\$\.batchSize: not above 0/);
    assert.match(problems({ producer: { strategy: 'later' } }).join('\n'), /\$\.producer\.strategy: not one of/);
    for (const bad of [{ batchSise: 8 }, { batchSize: '8' }, { batchSize: 0 }, { producer: { strategy: 'later' } }])
      assert.throws(() => resolveConfig(bad), { code: 'ERR_INVALID_CONFIG' });
  });
});

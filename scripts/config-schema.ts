/**
 * The JSON Schema of a config file, generated from the zod schema (EngineConfigSchema, src/config.ts)
 * so it cannot say anything the engine does not check. `npm run schema` writes it to
 * schema/config.schema.json, which the package ships; test/config-schema.test.ts fails when the
 * committed file and a fresh generation differ.
 *
 * `npm run schema` (scripts/schema.ts) also writes docs/CONFIGURATION.md's option reference
 * (scripts/config-docs.ts).
 *
 * A config file names it with `"$schema"` so an editor validates and completes it; the engine ignores
 * that key (resolveConfig), and the schema lists it so the editor does not flag it either.
 */
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { EngineConfigSchema } from '../src/config.ts';

export const SCHEMA_PATH = fileURLToPath(new URL('../schema/config.schema.json', import.meta.url));

/** Where the shipped file is found from a config in a project that installed the package. */
export const SCHEMA_ID = 'https://unpkg.com/rollout-engine/schema/config.schema.json';

/** Options whose default depends on the machine or the environment (as in test/readme-config.test.ts). */
const COMPUTED_DEFAULTS = new Set(['workers.threads', 'logLevel']);

function isObjectish(value: unknown): boolean {
  if (Array.isArray(value)) return value.some(isObjectish);
  return typeof value === 'object' && value !== null;
}

/**
 * `allDefaults`: keep the defaults of sections and objects too (for the reference of
 * scripts/config-docs.ts, which shows `{}` and `[]` defaults); the shipped file leaves them out.
 */
export function configJsonSchema(options: { allDefaults?: boolean } = {}): Record<string, unknown> {
  const generated = z.toJSONSchema(EngineConfigSchema, {
    target: 'draft-2020-12',
    // What a user writes: fields with a default are optional, and the default is shown.
    io: 'input',
    override: (ctx) => {
      // zod leaves out the default of a field whose schema transforms its input (tasks[].env): put it back.
      const def = (ctx.zodSchema as unknown as { _zod: { def: { type: string; defaultValue?: unknown } } })._zod.def;
      if (def.type === 'default' && !('default' in ctx.jsonSchema) && !isObjectish(def.defaultValue))
        ctx.jsonSchema.default = def.defaultValue;
      const value = ctx.jsonSchema.default;
      const where = ctx.path.filter((step) => step !== 'properties').join('.');
      // A section's default is its fields' defaults, shown on each field; a default computed from the
      // machine or the environment (workers.threads, logLevel) is not frozen into the file.
      if ((isObjectish(value) && options.allDefaults !== true) || COMPUTED_DEFAULTS.has(where))
        delete ctx.jsonSchema.default;
    },
  }) as Record<string, unknown> & { properties: Record<string, unknown> };
  const { $schema, properties, ...rest } = generated;
  return {
    $schema,
    $id: SCHEMA_ID,
    title: 'rollout-engine config',
    description:
      'A config file for `rollout run --config` / `rollout serve --config` and createEngine(); see docs/CONFIG-SCHEMA.md.',
    ...rest,
    properties: {
      $schema: {
        type: 'string',
        description: 'The JSON Schema this file follows (for editors; ignored by the engine).',
      },
      ...properties,
    },
  };
}

export function configJsonSchemaText(): string {
  return `${JSON.stringify(configJsonSchema(), null, 2)}\n`;
}

/**
 * `npm run schema`: writes what is generated from the zod schema (EngineConfigSchema, src/config.ts):
 * schema/config.schema.json (scripts/config-schema.ts) and the option reference of
 * docs/CONFIGURATION.md (scripts/config-docs.ts). test/config-schema.test.ts and
 * test/readme-config.test.ts fail when either differs from what this writes.
 */
import { writeFileSync } from 'node:fs';
import { CONFIGURATION_PATH, writeConfigurationDoc } from './config-docs.ts';
import { configJsonSchemaText, SCHEMA_PATH } from './config-schema.ts';

writeFileSync(SCHEMA_PATH, configJsonSchemaText());
console.log(`wrote ${SCHEMA_PATH}`);
writeConfigurationDoc();
console.log(`wrote ${CONFIGURATION_PATH}`);

/**
 * A small JSON Schema validator over exactly the keywords schema/config.schema.json uses. A keyword
 * it does not know is an error, not a pass: when the generator starts emitting one, this file must
 * learn it before the config-schema test can pass again.
 */

type Schema = Record<string, unknown>;

const ANNOTATIONS = new Set(['$schema', '$id', 'title', 'description', 'default']);

/** The problems with `value` against `schema`, one line each naming its path; empty when it validates. */
export function validate(schema: Schema, value: unknown, path = '$'): string[] {
  const problems: string[] = [];
  for (const [keyword, arg] of Object.entries(schema)) {
    if (ANNOTATIONS.has(keyword)) continue;
    const fail = (what: string) => problems.push(`${path}: ${what}`);
    switch (keyword) {
      case 'type':
        if (!typeMatches(arg as string, value)) fail(`expected ${arg as string}, got ${JSON.stringify(value)}`);
        break;
      case 'enum':
        if (!(arg as unknown[]).some((option) => option === value)) fail(`not one of ${JSON.stringify(arg)}`);
        break;
      case 'const':
        if (value !== arg) fail(`not ${JSON.stringify(arg)}`);
        break;
      case 'anyOf':
        if (!(arg as Schema[]).some((option) => validate(option, value, path).length === 0))
          fail(`matches none of ${(arg as Schema[]).length} alternatives`);
        break;
      case 'allOf':
        for (const part of arg as Schema[]) problems.push(...validate(part, value, path));
        break;
      case 'properties':
        if (isObject(value))
          for (const [name, sub] of Object.entries(arg as Record<string, Schema>))
            if (name in value) problems.push(...validate(sub, value[name], `${path}.${name}`));
        break;
      case 'required':
        if (isObject(value)) for (const name of arg as string[]) if (!(name in value)) fail(`missing ${name}`);
        break;
      case 'additionalProperties':
        if (isObject(value)) {
          const known = (schema.properties ?? {}) as Record<string, unknown>;
          for (const [name, sub] of Object.entries(value)) {
            if (name in known) continue;
            if (arg === false) fail(`unknown key ${name}`);
            else if (typeof arg === 'object') problems.push(...validate(arg as Schema, sub, `${path}.${name}`));
          }
        }
        break;
      case 'propertyNames':
        if (isObject(value))
          for (const name of Object.keys(value))
            problems.push(...validate(arg as Schema, name, `${path}[key ${name}]`));
        break;
      case 'items':
        if (Array.isArray(value))
          value.forEach((item, i) => problems.push(...validate(arg as Schema, item, `${path}[${i}]`)));
        break;
      case 'minItems':
        if (Array.isArray(value) && value.length < (arg as number)) fail(`fewer than ${arg as number} items`);
        break;
      case 'maxItems':
        if (Array.isArray(value) && value.length > (arg as number)) fail(`more than ${arg as number} items`);
        break;
      case 'minimum':
        if (typeof value === 'number' && value < (arg as number)) fail(`below ${arg as number}`);
        break;
      case 'maximum':
        if (typeof value === 'number' && value > (arg as number)) fail(`above ${arg as number}`);
        break;
      case 'exclusiveMinimum':
        if (typeof value === 'number' && value <= (arg as number)) fail(`not above ${arg as number}`);
        break;
      case 'exclusiveMaximum':
        if (typeof value === 'number' && value >= (arg as number)) fail(`not below ${arg as number}`);
        break;
      case 'minLength':
        if (typeof value === 'string' && [...value].length < (arg as number)) fail(`shorter than ${arg as number}`);
        break;
      case 'maxLength':
        if (typeof value === 'string' && [...value].length > (arg as number)) fail(`longer than ${arg as number}`);
        break;
      case 'pattern':
        if (typeof value === 'string' && !new RegExp(arg as string, 'u').test(value)) fail(`does not match /${arg}/`);
        break;
      case 'format':
        if (arg !== 'uri') throw new Error(`${path}: format ${JSON.stringify(arg)} is not known to this validator`);
        if (typeof value === 'string' && !URL.canParse(value)) fail(`not a URI: ${JSON.stringify(value)}`);
        break;
      default:
        throw new Error(`${path}: keyword ${JSON.stringify(keyword)} is not known to this validator`);
    }
  }
  return problems;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function typeMatches(type: string, value: unknown): boolean {
  switch (type) {
    case 'object':
      return isObject(value);
    case 'array':
      return Array.isArray(value);
    case 'null':
      return value === null;
    case 'integer':
      return Number.isInteger(value);
    case 'number':
      return typeof value === 'number' && Number.isFinite(value);
    case 'string':
    case 'boolean':
      return typeof value === type;
    default:
      throw new Error(`type ${JSON.stringify(type)} is not known to this validator`);
  }
}

/**
 * What `rollout env-server` serves: its `--env` specs resolved to modules and loaded into the
 * environments env/server.ts serves, and its `--params` flags into each one's factory params.
 */
import { existsSync } from 'node:fs';
import { basename, isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { BUILTIN_ENVS } from '../config.ts';
import { loadEnvironmentFactory } from '../env/loader.ts';
import { SERVED_ENV_NAME, type ServedEnv } from '../env/server.ts';
import type { EnvParams } from '../env/types.ts';
import { projectModuleUrl } from '../paths.ts';
import { ConfigError } from '../protocol/errors.ts';
import { UsageError } from './args.ts';

export interface EnvModuleSpec {
  name: string;
  moduleUrl: string;
  exportName: string;
}

/**
 * `name=modulePath[#export]`, `builtin:<name>[#export]` or `name=builtin:<name>`. The name defaults to
 * the builtin's name or the file's base name; the export to `default`; paths are relative to `baseDir`.
 */
export function resolveEnvModuleSpec(spec: string, baseDir = process.cwd()): EnvModuleSpec {
  const fail = (why: string): never => {
    throw new ConfigError([`--env ${JSON.stringify(spec)}: ${why}`]);
  };
  const eq = spec.indexOf('=');
  let name = eq > 0 ? spec.slice(0, eq) : null;
  let target = eq > 0 ? spec.slice(eq + 1) : spec;
  let exportName = 'default';
  const hash = target.lastIndexOf('#');
  if (hash >= 0) {
    exportName = target.slice(hash + 1);
    target = target.slice(0, hash);
    if (exportName === '') fail('the export name after "#" is empty');
  }
  if (target === '') fail('expected name=modulePath[#export] or builtin:<name>');
  let moduleUrl: string;
  if (target.startsWith('builtin:')) {
    const builtin = target.slice('builtin:'.length);
    const file = BUILTIN_ENVS[builtin];
    if (file === undefined)
      fail(
        `unknown built-in environment (expected one of ${Object.keys(BUILTIN_ENVS)
          .map((n) => `builtin:${n}`)
          .join(', ')})`,
      );
    moduleUrl = projectModuleUrl(file).href;
    name ??= builtin;
  } else {
    const file = isAbsolute(target) ? target : resolve(baseDir, target);
    if (!existsSync(file)) fail(`module file does not exist (resolved to ${file})`);
    moduleUrl = pathToFileURL(file).href;
    name ??= basename(file).replace(/\.[cm]?[jt]s$/, '');
  }
  if (!SERVED_ENV_NAME.test(name))
    fail(`environment name must be letters, digits, "_", "." or "-" (got ${JSON.stringify(name)})`);
  return { name, moduleUrl, exportName };
}

/** Resolves and imports each spec; `params` (name → factory params) are attached by name. */
export async function loadServedEnvs(
  specs: string[],
  params: Record<string, EnvParams> = {},
  baseDir?: string,
): Promise<ServedEnv[]> {
  const resolved = specs.map((spec) => resolveEnvModuleSpec(spec, baseDir));
  const unknown = Object.keys(params).filter((name) => !resolved.some((r) => r.name === name));
  if (unknown.length > 0)
    throw new ConfigError(
      unknown.map(
        (name) =>
          `--params: no served environment is named ${JSON.stringify(name)} (serving: ${resolved.map((r) => r.name).join(', ')})`,
      ),
    );
  return Promise.all(
    resolved.map(async (r) => ({
      name: r.name,
      factory: await loadEnvironmentFactory(r.moduleUrl, r.exportName),
      params: params[r.name] ?? {},
    })),
  );
}

/** `{…}` applies to every served environment; `name={…}` to one (and wins over the shared one). */
export function parseEnvParams(flags: string[], names: string[]): Record<string, EnvParams> {
  const shared: EnvParams[] = [];
  const own: Record<string, EnvParams> = {};
  for (const flag of flags) {
    const trimmed = flag.trim();
    const eq = trimmed.startsWith('{') ? -1 : trimmed.indexOf('=');
    const name = eq > 0 ? trimmed.slice(0, eq) : null;
    const text = eq > 0 ? trimmed.slice(eq + 1) : trimmed;
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch {
      throw new UsageError(`--params must be a JSON object or name=<JSON object> (got ${JSON.stringify(flag)})`);
    }
    if (typeof value !== 'object' || value === null || Array.isArray(value))
      throw new UsageError(`--params must be a JSON object (got ${JSON.stringify(flag)})`);
    if (name === null) shared.push(value as EnvParams);
    else if (!names.includes(name))
      throw new UsageError(
        `--params ${JSON.stringify(flag)}: no served environment is named ${JSON.stringify(name)} (serving: ${names.join(', ')})`,
      );
    else own[name] = { ...own[name], ...(value as EnvParams) };
  }
  const base = Object.assign({}, ...shared) as EnvParams;
  return Object.fromEntries(names.map((name) => [name, { ...base, ...own[name] }]));
}

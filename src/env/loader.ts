/**
 * Loads user modules inside a worker (environment factories, episode hooks) from `moduleUrl` + export
 * name. Imports are cached per worker, so a module is evaluated once however many episodes use it.
 */
import type { EnvironmentFactory } from './types.ts';

const exports = new Map<string, Promise<unknown>>();
const TYPESCRIPT_FILE = /\.[cm]?ts$/;
let typescriptLoader: Promise<void> | null = null;

export function loadEnvironmentFactory(moduleUrl: string, exportName: string): Promise<EnvironmentFactory> {
  return loadExport(moduleUrl, exportName, 'env.export', 'function') as Promise<EnvironmentFactory>;
}

/** A user module's export (environment factories, episode hooks), imported once per worker. */
export function loadExport(
  moduleUrl: string,
  exportName: string,
  field: string,
  kind: 'function' | 'object',
): Promise<unknown> {
  const key = `${moduleUrl}#${exportName}`;
  let value = exports.get(key);
  if (value === undefined) {
    value = importExport(moduleUrl, exportName, field, kind);
    // A failed import is not cached: the next episode retries and reports the error again.
    value.catch(() => exports.delete(key));
    exports.set(key, value);
  }
  return value;
}

async function importExport(
  moduleUrl: string,
  exportName: string,
  field: string,
  kind: 'function' | 'object',
): Promise<unknown> {
  const mod = (await importModule(moduleUrl)) as Record<string, unknown>;
  const value = mod[exportName];
  if (typeof value !== kind || value === null) {
    const available = Object.keys(mod).filter((k) => typeof mod[k] === kind);
    throw new Error(
      `${field}: ${JSON.stringify(exportName)} of ${moduleUrl} is not a${kind === 'object' ? 'n' : ''} ${kind} (got ${value === null ? 'null' : typeof value}; ${kind} exports: ${available.join(', ') || 'none'})`,
    );
  }
  return value;
}

/**
 * On Node 20, `--import tsx` in a worker's execArgv does not give the worker tsx's ESM hooks (only
 * its require hook, which is how piscina loads a `.ts` worker file). A TypeScript environment module
 * therefore fails with ERR_UNKNOWN_FILE_EXTENSION; register tsx's ESM hooks once and retry.
 */
async function importModule(moduleUrl: string): Promise<unknown> {
  try {
    return await import(moduleUrl);
  } catch (err) {
    if ((err as { code?: string }).code !== 'ERR_UNKNOWN_FILE_EXTENSION' || !TYPESCRIPT_FILE.test(moduleUrl)) throw err;
    typescriptLoader ??= import('tsx/esm/api').then(
      (tsx) => void tsx.register(),
      () => {
        throw new Error(
          `environment module ${moduleUrl} is TypeScript: compile it to JavaScript, or install tsx so workers can load it`,
        );
      },
    );
    await typescriptLoader;
    // The failed load is cached under the plain URL; a query makes it a fresh module record.
    return import(`${moduleUrl}?ts-loader`);
  }
}

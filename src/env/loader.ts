/**
 * Loads environment factories inside a worker from `moduleUrl` + export name. Imports are cached per
 * worker, so a module is evaluated once however many episodes use it.
 */
import type { EnvironmentFactory } from './types.ts';

const factories = new Map<string, Promise<EnvironmentFactory>>();
const TYPESCRIPT_FILE = /\.[cm]?ts$/;
let typescriptLoader: Promise<void> | null = null;

export function loadEnvironmentFactory(moduleUrl: string, exportName: string): Promise<EnvironmentFactory> {
  const key = `${moduleUrl}#${exportName}`;
  let factory = factories.get(key);
  if (factory === undefined) {
    factory = importFactory(moduleUrl, exportName);
    // A failed import is not cached: the next episode retries and reports the error again.
    factory.catch(() => factories.delete(key));
    factories.set(key, factory);
  }
  return factory;
}

async function importFactory(moduleUrl: string, exportName: string): Promise<EnvironmentFactory> {
  const mod = (await importModule(moduleUrl)) as Record<string, unknown>;
  const factory = mod[exportName];
  if (typeof factory !== 'function') {
    const available = Object.keys(mod).filter((k) => typeof mod[k] === 'function');
    throw new Error(
      `env.export: ${JSON.stringify(exportName)} of ${moduleUrl} is not a function (got ${typeof factory}; function exports: ${available.join(', ') || 'none'})`,
    );
  }
  return factory as EnvironmentFactory;
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
        throw new Error(`environment module ${moduleUrl} is TypeScript: compile it to JavaScript, or install tsx so workers can load it`);
      },
    );
    await typescriptLoader;
    // The failed load is cached under the plain URL; a query makes it a fresh module record.
    return import(`${moduleUrl}?ts-loader`);
  }
}

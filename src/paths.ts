/**
 * Module paths that work both from source (tsx, `.ts`) and from the compiled package (`dist/`, `.js`).
 * Worker files and built-in environments are loaded by URL, so their extension must follow ours.
 */
const OWN_EXTENSION = import.meta.url.endsWith('.ts') ? '.ts' : '.js';

/** URL of a project module given its path from the package root without extension, e.g. `workers/episode-worker`. */
export function projectModuleUrl(pathFromRoot: string): URL {
  // This file sits at <root>/src/paths.{ts,js} (or <root>/dist/src/paths.js): the root is one level up.
  return new URL(`../${pathFromRoot}${OWN_EXTENSION}`, import.meta.url);
}

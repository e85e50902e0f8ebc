/** The resolve hook of record-packages.mjs: runs on Node's loader thread. */
import { appendFileSync } from 'node:fs';

let file = null;

export function initialize(data) {
  file = data.file;
}

export async function resolve(specifier, context, next) {
  const resolved = await next(specifier, context);
  // A package: neither relative, absolute, a URL nor a Node built-in.
  if (file !== null && !/^(\.|\/|[a-z]+:)/.test(specifier) && !resolved.url.startsWith('node:'))
    appendFileSync(file, `${specifier}\n`);
  return resolved;
}

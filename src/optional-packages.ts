/**
 * Packages only an optional feature needs, loaded when that feature is used, never at start: the NATS
 * client (worker nodes, `workers.nats` and `rollout node`) and the MCP SDK (`tasks[].tools.mcp`). A
 * default `rollout run` loads neither (test/optional-packages.test.ts).
 *
 * package.json lists the MCP SDK under optionalDependencies: npm installs it, but a platform where it
 * fails to install still installs the engine. The NATS client stays a dependency: its
 * `@nats-io/nuid` declares node >= 22, and npm silently leaves out an optional dependency whose
 * engines refuse the running Node, so on Node 20 `npm ci` would install no NATS client at all.
 *
 * Where one is missing, using its feature fails with one line that names the feature, the package and
 * the command that installs it (ERR_OPTIONAL_PACKAGE), not with Node's stack of import paths.
 */
import { RolloutEngineError } from './errors.ts';

export const OPTIONAL_PACKAGES = {
  nats: {
    feature: 'worker nodes (workers.nats, rollout node)',
    packages: ['@nats-io/transport-node', '@nats-io/jetstream', '@nats-io/kv'],
    /** A module of the feature that resolves only when it is installed (some packages export no "."). */
    probe: '@nats-io/transport-node',
  },
  mcp: {
    feature: 'MCP tools (tasks[].tools.mcp)',
    packages: ['@modelcontextprotocol/sdk'],
    probe: '@modelcontextprotocol/sdk/client/index.js',
  },
} as const;

export type OptionalFeature = keyof typeof OPTIONAL_PACKAGES;

export class OptionalPackageError extends RolloutEngineError {
  readonly feature: OptionalFeature;
  /** The package Node could not find (the feature's own, or one of its dependencies). */
  readonly missing: string;
  constructor(feature: OptionalFeature, missing: string, cause: unknown) {
    const { feature: what, packages } = OPTIONAL_PACKAGES[feature];
    const own = (packages as readonly string[]).includes(missing);
    super(
      'ERR_OPTIONAL_PACKAGE',
      `${what} need ${packages.join(', ')}, not installed here${own ? '' : ` (${missing} is missing)`}: run \`npm install ${packages.join(' ')}\``,
      { cause },
    );
    this.name = 'OptionalPackageError';
    this.feature = feature;
    this.missing = missing;
  }
}

/** The package a failed import could not find (`Cannot find package 'x'`), or null for any other failure. */
export function missingPackage(err: unknown): string | null {
  if ((err as { code?: unknown } | null)?.code !== 'ERR_MODULE_NOT_FOUND') return null;
  return /Cannot find package '([^']+)'/.exec((err as Error).message)?.[1] ?? null;
}

/** How a feature's modules are imported; a test passes one that misses a package. */
export type OptionalImport<T> = () => Promise<T>;

/**
 * Runs `load` (the feature's dynamic imports); a package it cannot find becomes an
 * OptionalPackageError naming the feature. Callers take `load` as a parameter so a test can make it
 * import a package that does not exist.
 */
export async function loadOptional<T>(feature: OptionalFeature, load: OptionalImport<T>): Promise<T> {
  try {
    return await load();
  } catch (err) {
    throw named(feature, err);
  }
}

/**
 * Refuses, at start, a configured feature whose package is not installed: without it every episode of
 * an MCP task would run with no tools (a server that cannot be reached lists none), which is training
 * data of another task, not a failure anyone sees. Resolving loads nothing.
 */
export function requireInstalled(
  feature: OptionalFeature,
  resolve: (specifier: string) => string = (specifier) => import.meta.resolve(specifier),
): void {
  try {
    resolve(OPTIONAL_PACKAGES[feature].probe);
  } catch (err) {
    throw named(feature, err);
  }
}

/** What to throw for `err`: an OptionalPackageError naming `feature` when a package was not found, else `err`. */
function named(feature: OptionalFeature, err: unknown): unknown {
  const missing = missingPackage(err);
  return missing === null ? err : new OptionalPackageError(feature, missing, err);
}

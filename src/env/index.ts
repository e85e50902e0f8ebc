/**
 * `rollout-engine/env-server`: environments over HTTP — serve them (`startEnvServer`, what
 * `rollout env-server` runs) and reach them from code (`createHttpEnvironments`, what a task's
 * `env.http` uses). The environment interface itself is in the package entry.
 */
export { startEnvServer, SERVED_ENV_NAME } from './server.ts';
export type { EnvServer, EnvServerFaults, EnvServerOptions, EnvServerStats, ServedEnv } from './server.ts';
export { createHttpEnvironments } from './http-env.ts';
export type { EnvWarningLogger, HttpEnvOptions, HttpEnvironment, HttpEnvironments } from './http-env.ts';
export { EnvError } from './errors.ts';
export type { EnvErrorCode } from './errors.ts';
export type { Environment, EnvironmentFactory, EnvParams, ResetOptions, ResetResult, StepResult } from './types.ts';

/**
 * The package entry (`rollout-engine`): what a trainer needs to build an engine, take batches, update
 * weights and read what comes back. Nothing is defined here; each name comes from the module that
 * defines it, and no module of the package imports this file (test/support/layering.ts).
 *
 * The rest has its own entry: `rollout-engine/gateway` (token-trace gateway), `/env-server`
 * (environments over HTTP), `/records` (step records), `/loadtest`, `/testing` (mock inference server).
 */
export { createEngine, Engine } from './engine.ts';
export { resolveConfig, EngineConfigSchema, BUILTIN_ENVS } from './config.ts';
export type { EngineConfigInput, ResolvedConfig, TaskConfig, LlmConfig, MockConfig, ResolveOptions } from './config.ts';
export type { EngineStats, EngineOptions, ResumeOptions } from './coordinator/engine-core.ts';
export type { Batch, BatchStats } from './domain/batch.ts';
export type { GroupCounts, PauseReport, ProducerHooks } from './coordinator/producer.ts';
export { hasRewardSpread } from './coordinator/producer.ts';
export type { ProduceStatus, ShouldContinue } from './coordinator/strategies.ts';
export type { WorkerPool } from './coordinator/worker-pool.ts';
export type { ControlServer, ControlServerOptions } from './control/server.ts';
export { ConfigError, ProtocolError, RolloutEngineError } from './errors.ts';
export { ERROR_CODES } from './error-codes.ts';
export type { ErrorCode } from './error-codes.ts';
export { LlmError } from './llm/errors.ts';
export { EnvError } from './env/errors.ts';
export { Status, groupStatus, statusForFinishReason } from './domain/rollout.ts';
export type {
  RolloutState,
  RolloutGroup,
  TurnRecord,
  ChatMessage,
  PromptSample,
  FinishReason,
  StitchedSession,
} from './domain/rollout.ts';
export type {
  Environment,
  EnvironmentFactory,
  ResetOptions,
  ResetResult,
  StepResult,
  EnvParams,
  StepContext,
  ToolCallRequest,
  ToolOutput,
  ToolSchema,
} from './env/types.ts';
export type { ToolCallRecord, ToolErrorKind } from './domain/rollout.ts';
export { BatchFileWriter, groupToJson } from './formats/batch-file.ts';
export type { BlackBoxAgent, BlackBoxInput, BlackBoxResult } from './worker/blackbox-loop.ts';
export type { EpisodeHooks } from './worker/episode-context.ts';

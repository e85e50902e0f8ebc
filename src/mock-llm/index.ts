/**
 * `rollout-engine/mock-llm`: shipped doubles for demos, tests and load tests — the mock inference
 * server and the synthetic environments it knows how to play.
 */
export { startMockLlm, MOCK_LLM_DEFAULTS } from './server.ts';
export type { MockLlm, MockLlmOptions, MockLlmStats, ResolvedMockLlmOptions } from './server.ts';
export { GPU_DEFAULTS, GPU_PROFILES, decodeStepMs, fullSlotTokensPerSecond, gpuWindow } from './gpu.ts';
export type { CapacityOptions, GpuMetrics, GpuProfile, GpuProfileName, GpuWindow } from './gpu.ts';
export { generateCompletion } from './policy.ts';
export type { Completion, PolicyOptions, PromptMessage, TaskKind } from './policy.ts';
export * from '../env/synthetic/index.ts';

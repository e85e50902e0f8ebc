/**
 * `rollout-engine/testing`: shipped doubles for demos, tests and load tests — the mock inference
 * server and the synthetic environments it knows how to play.
 */
export { startMockLlm, MOCK_LLM_DEFAULTS } from './mock-llm/server.ts';
export type { MockLlm, MockLlmOptions, MockLlmStats, ResolvedMockLlmOptions } from './mock-llm/server.ts';
export { GPU_DEFAULTS, GPU_PROFILES, decodeStepMs, fullSlotTokensPerSecond, gpuWindow } from './mock-llm/gpu.ts';
export type { CapacityOptions, GpuMetrics, GpuProfile, GpuProfileName, GpuWindow } from './mock-llm/gpu.ts';
export { generateCompletion } from './mock-llm/policy.ts';
export type { Completion, PolicyOptions, PromptMessage, TaskKind } from './mock-llm/policy.ts';
export * from '../env/synthetic/index.ts';

/**
 * Token-trace gateway: an OpenAI-compatible server that records the exact tokens and logprobs of every
 * call per session and stitches a session into one training sample. See server.ts for the routes.
 */
export { startGateway } from './server.ts';
export type { Gateway, GatewayStats } from './server.ts';
export { GATEWAY_DEFAULTS, resolveGatewayOptions } from './options.ts';
export type { GatewayOptions, ResolvedGatewayOptions } from './options.ts';
export { stitchTraces, stitchedSampleJson } from './stitch.ts';
export type { StitchedSample, StitchInput } from './stitch.ts';
export { createTokenBackend } from './backend.ts';
export type {
  BackendKind,
  BackendOptions,
  GenerationResult,
  SamplingRequest,
  TokenBackend,
  TopLogprob,
} from './backend.ts';
export { BUILTIN_MODELS, loadChatModel } from '../chat-model/model.ts';
export type { ChatMessageInput, ChatModel, RenderOptions } from '../chat-model/model.ts';
export { GatewayError } from './errors.ts';
export type { GatewayErrorCode } from './errors.ts';
export type { CallRecord, CallTrace, CallTimings, SideCallTrace } from './trace.ts';
export type { SideCallMode } from './prompt.ts';
export type { SideCall } from '../domain/rollout.ts';
export type { ReleaseReason, SessionSummary } from './sessions.ts';

/**
 * A worker's client for the token-trace gateway's session routes: read a session's traces, stitch it
 * into one training sample. Part of llm/: a worker-side HTTP client, beside the inference client.
 */
import { request } from 'undici';
import type { SideCall, StitchedSession } from '../domain/rollout.ts';
import { LlmError } from './errors.ts';
import { maskFromJson, routedFromJson, type MaskJson, type RoutedJson } from './routing-wire.ts';

export interface GatewayCall {
  /** Position among the session's calls, main and side. */
  index: number;
  /** `main`: a call of the session's conversation (an action of the stitched sample); `side`: a side call, a sample of its own. */
  kind: 'main' | 'side';
  promptIds: Int32Array;
  completionIds: Int32Array;
  logprobs: Float32Array;
  finishReason: string;
  modelStep: number;
}

/** The session routes' base, `<gateway>/v1/sessions/<id>`: the one place both sides build it. */
export function sessionBaseUrl(gatewayUrl: string, sessionId: string): string {
  return `${gatewayUrl}/v1/sessions/${encodeURIComponent(sessionId)}`;
}

export async function fetchTraces(gatewayUrl: string, sessionId: string): Promise<GatewayCall[]> {
  const body = (await call('GET', `${sessionBaseUrl(gatewayUrl, sessionId)}/traces`)) as {
    calls: (TracedCall & { index: number; kind: 'main' | 'side' })[];
  } | null;
  if (body === null) return []; // the agent made no inference call in this session
  return body.calls.map((c) => ({
    index: c.index,
    kind: c.kind,
    promptIds: Int32Array.from(c.prompt_token_ids),
    completionIds: Int32Array.from(c.completion_token_ids),
    logprobs: Float32Array.from(c.logprobs),
    finishReason: typeof c.finish_reason === 'string' ? c.finish_reason.toLowerCase() : c.finish_reason, // a gateway may relay a server's "STOP"
    modelStep: c.model_step,
  }));
}

/** The session as one sample, its side calls beside it; the gateway then releases it. */
export async function stitchSession(
  gatewayUrl: string,
  sessionId: string,
  reward: number | null,
): Promise<StitchedSession & { reward: number | null; sideCalls: SideCall[] }> {
  const body = (await call('POST', `${sessionBaseUrl(gatewayUrl, sessionId)}/stitch`, { reward })) as {
    observation_tokens: number[];
    action_ranges: [number, number][];
    rollout_log_probs: number[];
    model_steps: number[];
    truncated: boolean;
    routed_experts?: RoutedJson;
    sampling_mask?: MaskJson;
    reward: number | null;
    side_calls: (TracedCall & { index: number; routed_experts?: RoutedJson; sampling_mask?: MaskJson })[];
  };
  const routed = (json: RoutedJson): ReturnType<typeof routedFromJson> => {
    try {
      return routedFromJson(json);
    } catch (err) {
      throw new LlmError('ERR_LLM_BAD_REPLY', `token-trace gateway stitch of ${sessionId}: ${(err as Error).message}`);
    }
  };
  let routedExperts: StitchedSession['routedExperts'];
  if (body.routed_experts !== undefined) {
    const { fill, ...rows } = routed(body.routed_experts);
    if (fill === undefined)
      throw new LlmError('ERR_LLM_BAD_REPLY', `token-trace gateway stitch of ${sessionId}: routed_experts has no fill`);
    routedExperts = { ...rows, fill };
  }
  return {
    observationTokens: Int32Array.from(body.observation_tokens),
    actionRanges: body.action_ranges,
    rolloutLogprobs: Float32Array.from(body.rollout_log_probs),
    modelSteps: Int32Array.from(body.model_steps),
    truncated: body.truncated,
    ...(routedExperts !== undefined ? { routedExperts } : {}),
    ...(body.sampling_mask !== undefined ? { samplingMask: maskFromJson(body.sampling_mask) } : {}),
    reward: body.reward,
    sideCalls: body.side_calls.map((c) => ({
      index: c.index,
      promptIds: Int32Array.from(c.prompt_token_ids),
      completionIds: Int32Array.from(c.completion_token_ids),
      logprobs: Float32Array.from(c.logprobs),
      finishReason: c.finish_reason,
      modelStep: c.model_step,
      ...(c.routed_experts !== undefined ? { routedExperts: routed(c.routed_experts) } : {}),
      ...(c.sampling_mask !== undefined ? { samplingMask: maskFromJson(c.sampling_mask) } : {}),
    })),
  };
}

/** One call as the gateway's session routes write it. */
interface TracedCall {
  prompt_token_ids: number[];
  completion_token_ids: number[];
  logprobs: number[];
  finish_reason: string;
  model_step: number;
}

/** Drop a session (an interrupted episode that will be played again). */
export async function releaseSession(gatewayUrl: string, sessionId: string): Promise<void> {
  await call('DELETE', sessionBaseUrl(gatewayUrl, sessionId)).catch(() => undefined);
}

async function call(method: 'GET' | 'POST' | 'DELETE', url: string, json?: unknown): Promise<unknown> {
  let res;
  try {
    res = await request(url, {
      method,
      headers: json === undefined ? {} : { 'content-type': 'application/json' },
      body: json === undefined ? undefined : JSON.stringify(json),
      signal: AbortSignal.timeout(30_000),
    });
  } catch (err) {
    throw new LlmError('ERR_LLM_UNREACHABLE', `token-trace gateway ${url} unreachable: ${(err as Error).message}`, {
      cause: err,
    });
  }
  const text = await res.body.text();
  if (res.statusCode === 404 && method === 'GET') return null;
  if (res.statusCode >= 300)
    throw new LlmError(
      'ERR_LLM_HTTP',
      `token-trace gateway ${method} ${url} answered ${res.statusCode}: ${text.slice(0, 300)}`,
      { status: res.statusCode },
    );
  return text === '' ? {} : JSON.parse(text);
}

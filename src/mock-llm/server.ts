/**
 * The mock inference server: OpenAI-compatible chat completions on node:http, with the vLLM/SGLang
 * extras an RL engine relies on (token ids, logprobs, abort, weight version, and per-request `seed`
 * with `continue_final_message` for partial rollouts; replies whole or streamed as server-sent events,
 * stream.ts), and vLLM's token-in `/v1/completions` for
 * clients that tokenize themselves (the token-trace gateway; see vocab.ts for the vocabulary option).
 * Shipped for the demo run, tests, load tests and benchmarks, so the per-request path stays cheap:
 * one JSON.parse, cached tokenisation, timers for latency (never busy-waiting), one JSON.stringify.
 *
 * Option `dialect` swaps the routes and reply shapes for one real server's (vLLM, SGLang or
 * llama.cpp; dialects.ts, dialect-routes.ts, dialect-stream.ts): those paths are separate functions,
 * so the default one stays as it was.
 *
 * This file assembles the parts, each with its state and invariants: routes.ts (the route table and
 * what every route shares; admin-routes.ts), completer.ts (what a generation route answers),
 * scheduler.ts (simulated generation time, in-flight replies, aborts; ticker.ts for streams),
 * faults.ts (fault injection), weight-version.ts, connections.ts (the sockets close() cuts) and
 * http-replies.ts.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { listen } from '../http-server.ts';
import { Completer } from './completer.ts';
import { Connections } from './connections.ts';
import { SGLANG_PRIORITY, VLLM_PRIORITY } from './priority-scheduling.ts';
import type { Dialect } from './dialects.ts';
import { FaultInjector, type MockFault } from './faults.ts';
import { MockLogprobModel, type DriftFault } from './scoring.ts';
import { Gpu, type GpuMetrics } from './gpu.ts';
import { Rejections } from './http-replies.ts';
import { DIALECT_DEFAULT_CONTEXT, MOCK_LLM_DEFAULTS, resolveMockLlmOptions } from './options.ts';
import type { MockLlmOptions, ResolvedMockLlmOptions } from './options.ts';
import { Routes } from './routes.ts';
import { Scheduler } from './scheduler.ts';
import { StatsWaiters } from './stats-waiters.ts';
import { loadVocabulary } from './vocab.ts';
import { WeightVersion } from './weight-version.ts';

export { MOCK_LLM_DEFAULTS };
export type { GpuMetrics, MockFault, MockLlmOptions, ResolvedMockLlmOptions };

export interface MockLlmStats {
  /** Chat completion requests received (valid or not). */
  requests: number;
  /** Completions currently being "generated". */
  inFlight: number;
  promptTokens: number;
  /** Completion tokens returned, partial ones of aborted requests included. */
  completionTokens: number;
  /** Completions answered early with finish_reason abort (abort endpoint, abortAll, close). */
  aborted: number;
  /** Completions whose client went away before the answer. */
  cancelled: number;
  /** Requests answered 500 by `errorRate` (also counted in `faults.error`). */
  errorsInjected: number;
  /** Injected faults by kind (see the rate options): every request that drew one. */
  faults: Record<MockFault, number>;
  /** Requests held unanswered by `hangRate` right now. */
  hanging: number;
  /** Requests answered 4xx (bad body, unknown route, too large). */
  rejected: number;
  /** The GPU-like mock's replica (option capacity): cumulative figures and its state now; null without it. */
  gpu: GpuMetrics | null;
}

export interface MockLlm {
  /** Base URL without a trailing slash, e.g. `http://127.0.0.1:43567` (append `/v1/...`). */
  readonly url: string;
  readonly port: number;
  readonly options: ResolvedMockLlmOptions;
  /**
   * Reported in `metadata.weight_version` of completions that start from now on. The string-versioned
   * dialects report `reportedWeightVersion` instead; this is the last integer version set (0 if none).
   */
  readonly weightVersion: number;
  /** The version as the dialect reports it: the number (default dialect), or the string (SGLang, vLLM). */
  readonly reportedWeightVersion: number | string;
  setWeightVersion(version: number): void;
  /**
   * Turns on exactly these logprob-drift faults (scoring.ts: stale KV, a re-tokenised prompt, a first
   * token dropped after a resume, hidden truncation) for replies that start from now on; [] = none.
   */
  setDriftFaults(faults: readonly DriftFault[]): void;
  /** Answers every in-flight completion now with finish_reason abort; returns how many. */
  abortAll(): number;
  stats(): MockLlmStats;
  /** Resolves once at least `count` completions are in flight (for tests and load shaping; no polling). */
  waitForInFlight(count: number): Promise<void>;
  /** Resolves once at least `count` generation requests have arrived since the start (stats().requests). */
  waitForRequests(count: number): Promise<void>;
  /**
   * Resolves once `test(stats())` holds: checked now, and again whenever a request arrives, starts or
   * stops generating (answered, aborted or cancelled by its client), or is held or released by `hangRate`.
   */
  waitForStats(test: (stats: MockLlmStats) => boolean): Promise<void>;
  /** Aborts in-flight completions, then closes every connection. Idempotent; never hangs. */
  close(): Promise<void>;
}

/** Longer than undici's default client keep-alive, so the server never closes a socket a client is about to reuse. */
const KEEP_ALIVE_MS = 30_000;
/** How long close() waits for requests still being uploaded before cutting their connections. */
const CLOSE_GRACE_MS = 200;

function hostForUrl(host: string): string {
  if (host === '0.0.0.0') return '127.0.0.1';
  if (host === '::') return '[::1]';
  return host.includes(':') ? `[${host}]` : host;
}

export async function startMockLlm(options: MockLlmOptions = {}): Promise<MockLlm> {
  const opts = resolveMockLlmOptions(options);
  const vocab = await loadVocabulary(opts.tokenizer);
  const dialect: Dialect | null = opts.dialect === 'default' ? null : opts.dialect;
  const context = opts.contextLength ?? DIALECT_DEFAULT_CONTEXT;
  // Every part whose counts stats() reads tells the waiters of each change; bound before any request.
  let statsChanged = (): void => {};
  const onChange = (): void => statsChanged();
  // Priority read as the dialect's server reads it (admission.ts); the default mock reads it as vLLM.
  const rule = dialect === 'sglang' ? SGLANG_PRIORITY : VLLM_PRIORITY;
  const gpu = opts.capacity === null ? null : new Gpu(opts.capacity, onChange, undefined, rule);
  const version = new WeightVersion(opts.weightVersion, () => gpu?.flushCache());
  const scheduler = new Scheduler({ ...opts, onChange, gpu });
  const faults = new FaultInjector(opts, onChange);
  const rejections = new Rejections();
  const logprobs = new MockLogprobModel(opts.seed);
  const completer = new Completer({ options: opts, vocab, context, scheduler, faults, rejections, version, logprobs });
  let closed: Promise<void> | null = null;
  const closing = (): boolean => closed !== null;
  const routes = new Routes({
    options: opts,
    dialect,
    context,
    completer,
    scheduler,
    rejections,
    version,
    closing,
    onChange,
    gpu,
  });
  const stats = (): MockLlmStats => {
    const { promptTokens, completionTokens, aborted, cancelled } = scheduler.counts;
    const faultCounts = faults.counts;
    return {
      requests: routes.requests,
      promptTokens,
      completionTokens,
      aborted,
      cancelled,
      errorsInjected: faultCounts.error,
      rejected: rejections.count,
      faults: faultCounts,
      hanging: faults.hanging,
      inFlight: scheduler.inFlight,
      gpu: gpu?.metrics() ?? null,
    };
  };
  const statsWaiters = new StatsWaiters(stats);
  statsChanged = () => statsWaiters.changed();

  const connections = new Connections(closing);
  const server = createServer((req, res) => {
    connections.track(req, res);
    routes.handle(req, res);
  });
  server.keepAliveTimeout = KEEP_ALIVE_MS;
  connections.watch(server);

  await listen(server, opts.host, opts.port, 'mock inference server');
  const port = (server.address() as AddressInfo).port;

  return {
    url: `http://${hostForUrl(opts.host)}:${port}`,
    port,
    options: opts,
    get weightVersion() {
      return version.number;
    },
    get reportedWeightVersion() {
      return dialect === null ? version.number : version.label;
    },
    setWeightVersion(v) {
      version.set(v);
    },
    setDriftFaults: (list) => logprobs.setFaults(list),
    abortAll: () => scheduler.abortAll(),
    stats,
    waitForInFlight: (count) => statsWaiters.wait((s) => s.inFlight >= count),
    waitForRequests: (count) => statsWaiters.wait((s) => s.requests >= count),
    waitForStats: (test) => statsWaiters.wait(test),
    close() {
      closed ??= new Promise<void>((resolve) => {
        scheduler.abortAll();
        scheduler.stop();
        gpu?.stop();
        faults.releaseHung();
        server.close(() => resolve());
        connections.cutIdle();
        // Requests still uploading their body would otherwise hold close() open until they time out.
        setTimeout(() => server.closeAllConnections(), CLOSE_GRACE_MS).unref();
      });
      return closed;
    },
  };
}

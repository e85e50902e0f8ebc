/**
 * Live sessions and their traces, with bounded memory: a session is released when it is stitched,
 * deleted, or idle for `ttlMs` (one unref'd timer per session, re-armed on activity, so an idle
 * gateway process can still exit), and at most `maxSessions` exist at once.
 *
 * Calls within a session are sequential — turn n+1's prompt is built from turn n's completion — so a
 * session is `busy` while a call is in flight, and expiry waits for it to finish.
 */
import { GatewayError } from './errors.ts';
import type { PromptBase } from '../chat-model/prompt.ts';
import type { CallTrace, SideCallTrace } from './trace.ts';

/** The PromptBase fields describe the main conversation only: side calls never change them. */
export interface Session extends PromptBase {
  readonly id: string;
  /** The main conversation's calls (the trace.ts invariant), in call order. */
  traces: CallTrace[];
  /** Calls that did not extend the main conversation, in call order. */
  sideCalls: SideCallTrace[];
  /** The session's latest call was a side call (the side-call retry rule, chat.ts). */
  lastCallSide: boolean;
  busy: boolean;
  /** Date.now() of the last call or creation. */
  lastActivity: number;
  /** The session was created by a call without an id (a session of its own). */
  readonly anonymous: boolean;
}

export interface SessionSummary {
  session_id: string;
  busy: boolean;
  /** Tokens of the main conversation. */
  tokens: number;
  expires_in_ms: number;
  /** Main and side calls in call order. */
  calls: {
    index: number;
    kind: 'main' | 'side';
    prompt_tokens: number;
    delta_tokens: number;
    completion_tokens: number;
    finish_reason: string;
    model_step: number;
    timings: CallTrace['timings'];
  }[];
}

/** Why a session's traces were dropped. `failed`: its first call failed, so it never held a trace. */
export type ReleaseReason = 'stitched' | 'deleted' | 'expired' | 'failed' | 'closed';

interface Entry {
  session: Session;
  timer: NodeJS.Timeout;
}

function callSummary(
  t: CallTrace | SideCallTrace,
  kind: 'main' | 'side',
  promptTokens: number,
): SessionSummary['calls'][number] {
  return {
    index: t.index,
    kind,
    prompt_tokens: promptTokens,
    delta_tokens: t.deltaLength,
    completion_tokens: t.completionIds.length,
    finish_reason: t.finishReason,
    model_step: t.modelStep,
    timings: t.timings,
  };
}

export class SessionStore {
  readonly #entries = new Map<string, Entry>();
  readonly #ttlMs: number;
  readonly #maxSessions: number;
  readonly #onRelease: ((id: string, reason: ReleaseReason) => void) | null;
  #expired = 0;

  constructor(options: {
    ttlMs: number;
    maxSessions: number;
    onRelease?: ((id: string, reason: ReleaseReason) => void) | null;
  }) {
    this.#ttlMs = options.ttlMs;
    this.#maxSessions = options.maxSessions;
    this.#onRelease = options.onRelease ?? null;
  }

  get size(): number {
    return this.#entries.size;
  }

  /** Sessions released by their TTL since start. */
  get expired(): number {
    return this.#expired;
  }

  get(id: string): Session | undefined {
    return this.#entries.get(id)?.session;
  }

  /** The session with this id, created empty if there is none. Throws ERR_GATEWAY_TOO_MANY_SESSIONS. */
  open(id: string, anonymous: boolean): Session {
    const existing = this.#entries.get(id);
    if (existing !== undefined) return existing.session;
    if (this.#entries.size >= this.#maxSessions) {
      throw new GatewayError(
        'ERR_GATEWAY_TOO_MANY_SESSIONS',
        `${this.#entries.size} sessions are live (maxSessions ${this.#maxSessions}); stitch or delete finished sessions, or raise the limit`,
        {
          details: { live: this.#entries.size, max_sessions: this.#maxSessions },
        },
      );
    }
    const session: Session = {
      id,
      traces: [],
      sideCalls: [],
      lastCallSide: false,
      tokens: [],
      coveredText: '',
      lastPromptText: '',
      lastPromptLength: 0,
      busy: false,
      lastActivity: Date.now(),
      anonymous,
    };
    const timer = setTimeout(() => this.#onTimer(id), this.#ttlMs);
    timer.unref();
    this.#entries.set(id, { session, timer });
    return session;
  }

  /** Marks activity: the TTL counts from now. */
  touch(session: Session): void {
    session.lastActivity = Date.now();
    this.#entries.get(session.id)?.timer.refresh();
  }

  /** Forgets a session and its traces. Returns whether it existed. */
  release(id: string, reason: ReleaseReason): boolean {
    const entry = this.#entries.get(id);
    if (entry === undefined) return false;
    clearTimeout(entry.timer);
    this.#entries.delete(id);
    this.#onRelease?.(id, reason);
    return true;
  }

  releaseAll(reason: ReleaseReason): void {
    for (const id of [...this.#entries.keys()]) this.release(id, reason);
  }

  summary(id: string): SessionSummary | undefined {
    const entry = this.#entries.get(id);
    if (entry === undefined) return undefined;
    const s = entry.session;
    return {
      session_id: s.id,
      busy: s.busy,
      tokens: s.tokens.length,
      expires_in_ms: Math.max(0, s.lastActivity + this.#ttlMs - Date.now()),
      calls: [
        ...s.traces.map((t) => callSummary(t, 'main', t.promptLength)),
        ...s.sideCalls.map((t) => callSummary(t, 'side', t.promptIds.length)),
      ].sort((a, b) => a.index - b.index),
    };
  }

  #onTimer(id: string): void {
    const entry = this.#entries.get(id);
    if (entry === undefined) return;
    // A call in flight keeps its session; the call's completion touches it, which re-arms the timer.
    if (entry.session.busy) {
      entry.timer.refresh();
      return;
    }
    this.#expired += 1;
    this.release(id, 'expired');
  }
}

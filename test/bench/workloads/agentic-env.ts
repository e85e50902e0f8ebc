/**
 * The agentic long-tail workloads' environment (long-tail.ts): a tool-using agent's episode as the
 * engine sees it, with no game to win. The mock answers it with its generic reply, whose length the
 * GPU-like mock draws long-tailed (src/mock-llm/lengths.ts), so what this module adds is
 * what a real agentic environment adds around the model:
 *
 * - a shared system prompt (the same tool manual on every episode: the prefix cache's best case) and
 *   a task message per dataset line;
 * - 1 to `maxTurns` turns, drawn per episode (`turnsSkew` > 1 favours short episodes);
 * - an observation after each turn of `observationTokens` words, ± half;
 * - step latency: log-normal (median `stepMs`, σ `stepSigma`) GPU ms, and with probability
 *   `stragglerRate` a straggler of `stragglerMs` [min, max] GPU ms instead (a sandbox cold start, a
 *   test suite, a slow judge); waited for in real time ÷ `speedup`, as the mocks run;
 * - with probability `infraRate` an episode fails at one of its steps with ERR_ENV_INFRA (a sandbox
 *   lost under it): the engine masks it, and the rollout goes on from its last finished step on a
 *   fresh actor (docs/FAILURES.md).
 *
 * Seeded and replayable: an episode's length and each observation are drawn from (its reset seed,
 * the turn, the model's replies so far), so the engine's replay of recorded steps on a fresh actor (a
 * continued rollout) reproduces them. The latencies and the failures come from a seeded stream of the
 * worker thread instead: neither is in a step's record, and a step played again after a failure gets
 * the same reply (the engine sends the same request seeds), so a failure drawn from them would strike
 * every replay again.
 */
import { createRng, mixSeeds } from '../../../src/env/synthetic/rng.ts';
import { fmix32 } from '../../../src/hash.ts';
import type { Environment, EnvironmentFactory, EnvParams } from '../../../src/env/types.ts';

export interface AgenticEnvParams {
  maxTurns: number;
  turnsSkew: number;
  systemPromptWords: number;
  observationTokens: number;
  stepMs: number;
  stepSigma: number;
  stragglerRate: number;
  stragglerMs: [number, number];
  infraRate: number;
  speedup: number;
}

export const AGENTIC_ENV_DEFAULTS: AgenticEnvParams = {
  maxTurns: 8,
  turnsSkew: 1.5,
  systemPromptWords: 800,
  observationTokens: 120,
  stepMs: 400,
  stepSigma: 1,
  stragglerRate: 0.01,
  stragglerMs: [10_000, 40_000],
  infraRate: 0.02,
  speedup: 1,
};

const WORDS = (
  'tool call returns the file path line number test case output error message command exit status ' +
  'repository branch patch diff function class module argument value result search query read write ' +
  'list open close run check build install log trace stack frame config option default field record'
).split(' ');

/** The shared system prompt: the same text for every episode of a workload (`words` words). */
export function agenticSystemPrompt(words: number): string {
  const rng = createRng(0x5e5);
  let text = 'You are a software agent. Use the tools below, one call a turn, and stop when the task is done.';
  for (let i = 0; i < words; i++) text += `${i % 12 === 0 ? '\n- ' : ' '}${WORDS[rng.int(0, WORDS.length - 1)]}`;
  return text;
}

/** The task message a dataset line `{ id }` opens with: differs per prompt, so the mock's per-prompt lengths do. */
export const agenticTaskText = (id: number): string =>
  `Task ${id}: the test suite of package ${id % 97} fails at case ${(id * 7919) % 1009}; find the cause and fix it.`;

function read(params: EnvParams): AgenticEnvParams {
  const p = { ...AGENTIC_ENV_DEFAULTS, ...(params as Partial<AgenticEnvParams>) };
  for (const [k, v] of Object.entries(p)) {
    const ok = k === 'stragglerMs' ? Array.isArray(v) && v.length === 2 && v[0] <= v[1] : typeof v === 'number';
    if (!ok || (typeof v === 'number' && !(Number.isFinite(v) && v >= 0)))
      throw new Error(`agentic-env: params.${k} is not valid (got ${JSON.stringify(v)})`);
  }
  if (!Number.isInteger(p.maxTurns) || p.maxTurns < 1) throw new Error('agentic-env: params.maxTurns must be ≥ 1');
  if (p.speedup <= 0) throw new Error('agentic-env: params.speedup must be > 0');
  return p;
}

/** A standard normal draw. */
function gaussian(rng: { next(): number }): number {
  return Math.sqrt(-2 * Math.log(Math.max(rng.next(), 1e-12))) * Math.cos(2 * Math.PI * rng.next());
}

/** One step's latency in GPU ms: log-normal, or a straggler. */
export function stepLatencyMs(p: AgenticEnvParams, rng: { next(): number }): number {
  if (rng.next() < p.stragglerRate) return p.stragglerMs[0] + rng.next() * (p.stragglerMs[1] - p.stragglerMs[0]);
  return p.stepMs * Math.exp(p.stepSigma * gaussian(rng));
}

/** A 32-bit hash of a reply (FNV-1a). */
function hashText(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  return fmix32(h) >>> 0;
}

const systemPrompts = new Map<number, string>();
/** Latencies and failures: not part of an episode's record. */
const latencies = createRng(0x1a7);

const createEnv: EnvironmentFactory = (params) => {
  const p = read(params);
  let system = systemPrompts.get(p.systemPromptWords);
  if (system === undefined) systemPrompts.set(p.systemPromptWords, (system = agenticSystemPrompt(p.systemPromptWords)));
  let messages: { role: 'system' | 'user' | 'assistant'; content: string }[] = [];
  let episodeSeed = 0;
  let history = 0;
  let turns = 0;
  let turn = 0;
  let failAt = 0;
  const env: Environment = {
    reset({ seed, params: line }) {
      const id = typeof line.id === 'number' ? line.id : seed;
      episodeSeed = seed;
      history = 0;
      turns = 0;
      failAt = 0;
      turn = 0;
      const task = agenticTaskText(id);
      messages = [
        { role: 'system', content: system },
        { role: 'user', content: task },
      ];
      return { observation: task, info: { turns } };
    },
    getTaskPrompt: () => messages.slice(),
    async step(action) {
      turn += 1;
      history = mixSeeds(episodeSeed, history, turn, hashText(action as string));
      const rng = createRng(history);
      if (turn === 1) {
        // The episode's length and its failure, from the first reply: the group's members differ.
        turns = 1 + Math.floor(p.maxTurns * rng.next() ** p.turnsSkew);
        failAt = latencies.next() < p.infraRate ? 1 + Math.floor(latencies.next() * turns) : 0;
      }
      const ms = stepLatencyMs(p, latencies);
      await new Promise((r) => setTimeout(r, ms / p.speedup));
      if (turn === failAt)
        throw Object.assign(new Error(`agentic-env: the sandbox was lost at turn ${turn}`), { code: 'ERR_ENV_INFRA' });
      const done = turn >= turns;
      let observation = `exit status ${rng.int(0, 2)}:`;
      const n = Math.round(p.observationTokens * (0.5 + rng.next()));
      for (let i = 0; i < n; i++) observation += ` ${WORDS[rng.int(0, WORDS.length - 1)]}`;
      messages.push({ role: 'assistant', content: action as string }, { role: 'user', content: observation });
      return {
        observation,
        reward: done ? Math.round(rng.next() * 100) / 100 : 0,
        terminated: done,
        truncated: false,
        info: { turn, turns, stepMs: ms },
      };
    },
  };
  return env;
};
export default createEnv;

/**
 * tool-lookup: a tool-calling task with a verifiable reward. A small key-value store is drawn from
 * the seed; the agent must look up two keys with the `lookup` tool (in parallel, ideally) and answer
 * with the sum of their values: reward 1 for the exact sum, else 0, one step. `cpuCostUs` is burnt per
 * tool call and per step, like the other synthetic environments' knob.
 *
 * Deterministic under the reset seed; the store is the environment's, so the answer cannot be had
 * without the tool (the values are not in the prompt).
 */
import type { ChatMessage } from '../../domain/rollout.ts';
import type { Environment, EnvironmentFactory, EnvParams, StepContext, ToolCallRequest, ToolSchema } from '../types.ts';
import { ParamReader, lastInteger } from './params.ts';
import { burnCpu, createRng } from './rng.ts';

const ENV = 'tool-lookup';
const FACTORY_PARAMS = ['keys', 'maxValue', 'cpuCostUs'] as const;

export const TOOL_LOOKUP_DEFAULTS = { keys: 8, maxValue: 1000, cpuCostUs: 0 } as const;

const KEY_WORDS = [
  'amber',
  'birch',
  'cedar',
  'delta',
  'ember',
  'fjord',
  'grove',
  'heron',
  'iris',
  'juniper',
  'kelp',
  'lotus',
  'maple',
  'nectar',
  'orchid',
  'pine',
];

/** The one tool. The mock policy calls it by this name (mock-llm/policy.ts). */
export const LOOKUP_TOOL: ToolSchema = {
  type: 'function',
  function: {
    name: 'lookup',
    description: 'The integer stored under a key.',
    parameters: { type: 'object', properties: { key: { type: 'string' } }, required: ['key'] },
  },
};

/** The mock policy recognises the task by this sentence; keep them in sync (mock-llm/policy.ts). */
export function toolLookupTaskText(a: string, b: string): string {
  return `Look up the values of "${a}" and "${b}" with the lookup tool and answer with their sum.`;
}

export function createEnv(params: EnvParams = {}): Environment {
  const reader = new ParamReader(ENV, 'params', params);
  reader.rejectUnknown(FACTORY_PARAMS);
  const keys = reader.int('keys', TOOL_LOOKUP_DEFAULTS.keys, 2, KEY_WORDS.length);
  const maxValue = reader.int('maxValue', TOOL_LOOKUP_DEFAULTS.maxValue, 1, 1_000_000);
  const cpuCostUs = reader.number('cpuCostUs', TOOL_LOOKUP_DEFAULTS.cpuCostUs, 0, 60_000_000);

  let store = new Map<string, number>();
  let messages: ChatMessage[] = [];
  let expected = 0;
  let phase: 'idle' | 'running' | 'done' = 'idle';

  return {
    reset({ seed, params: resetParams }) {
      new ParamReader(ENV, 'reset params', resetParams).rejectUnknown([]);
      const rng = createRng(seed);
      store = new Map(KEY_WORDS.slice(0, keys).map((k) => [k, rng.int(1, maxValue)]));
      const names = [...store.keys()];
      const a = rng.pick(names);
      const b = rng.pick(names.filter((n) => n !== a));
      expected = store.get(a)! + store.get(b)!;
      phase = 'running';
      messages = [
        { role: 'system', content: 'You answer with the help of tools.' },
        { role: 'user', content: toolLookupTaskText(a, b) },
      ];
      return { observation: messages[1].content, info: { a, b } };
    },

    checkResetParams(resetParams) {
      new ParamReader(ENV, 'reset params', resetParams).rejectUnknown([]);
    },

    getTaskPrompt: () => (phase === 'running' ? messages.slice() : []),

    tools: () => [LOOKUP_TOOL],

    callTool(call: ToolCallRequest) {
      if (cpuCostUs > 0) burnCpu(cpuCostUs);
      if (call.name !== 'lookup') throw new Error(`${ENV} has no tool ${JSON.stringify(call.name)}`);
      const value = store.get(String(call.arguments.key));
      if (value === undefined)
        return {
          content: `no key ${JSON.stringify(call.arguments.key)}; keys: ${[...store.keys()].join(', ')}`,
          isError: true,
        };
      return String(value);
    },

    step(action, turn?: StepContext) {
      if (phase !== 'running')
        throw new Error(`${ENV}: step called ${phase === 'idle' ? 'before reset' : 'after the episode ended'}`);
      if (cpuCostUs > 0) burnCpu(cpuCostUs);
      messages.push(...(turn?.toolMessages ?? []), { role: 'assistant', content: String(action) });
      const answer = lastInteger(String(action));
      phase = 'done';
      return {
        observation: null,
        reward: answer === expected ? 1 : 0,
        terminated: true,
        truncated: false,
        info: { expected, answer, toolCalls: (turn?.toolMessages ?? []).filter((m) => m.role === 'tool').length },
      };
    },

    close() {
      phase = 'done';
    },
  };
}

createEnv satisfies EnvironmentFactory;

export default createEnv;

/**
 * Engine options: defaults, validation and path resolution, in one place.
 *
 * `resolveConfig` is the only door: everything downstream receives a `ResolvedConfig` whose fields are
 * filled and checked, so no other module re-validates or guesses defaults. Every problem is reported
 * as `path: what was expected (got value)`.
 */
import { existsSync, statSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { z } from 'zod';
import { ENV_PROTOCOLS, GYM_ACTIONS, OPENENV_DEFAULTS, protocolConflicts } from './env/protocol.ts';
import { ConfigError, preview } from './errors.ts';
import { projectModuleUrl } from './paths.ts';
import { SERVER_KINDS, type SamplingUse } from './llm/servers.ts';
import type { SamplingRecord, SamplingShape } from './domain/rollout.ts';

/** A run's name, as `workers.nats.run` and `rollout node --run` take it: it goes into stream and bucket names (cluster/names.ts). */
export const RUN_NAME = /^[A-Za-z0-9_-]{1,64}$/;
/** A NATS server URL, as `workers.nats.url` and `--nats` take it. */
export const NATS_URL = /^(nats|tls):\/\/\S+$/;
/** The default run name: the coordinator's `workers.nats.run` default, and `rollout node --run`'s. */
export const DEFAULT_RUN = 'rollout';

const BUILTIN_PREFIX = 'builtin:';
/** Shipped synthetic environments, addressable as `builtin:<name>` in `tasks[].env.module`. */
export const BUILTIN_ENVS: Record<string, string> = {
  'guess-number': 'src/env/synthetic/guess-number',
  arithmetic: 'src/env/synthetic/arithmetic',
  'tool-lookup': 'src/env/synthetic/tool-lookup',
  'echo-digit': 'src/env/synthetic/echo-digit',
};

const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

const positiveInt = z.number().int().positive();
const nonNegativeInt = z.number().int().min(0);
const params = z.record(z.string(), z.unknown());
/** Seeds are 31-bit everywhere (the sampler's derived ones too): −1 or 1e300 would be cut or rounded. */
const seed = z.number().int().min(0).max(0x7fffffff);
/** Attempts beyond this are a typo, not a policy: 1e9 retries would never give up on a dead server. */
const retries = nonNegativeInt.max(100);

const httpUrl = z.url({ protocol: /^https?$/ });

const HttpEnvSpec = z.strictObject({
  /**
   * Env servers speaking the env-server protocol (`rollout env-server`, Safactory's, or your own); actors
   * spread across them. `tcp://host:port` for `env.protocol: "verifiers"` (and for it only).
   */
  urls: z
    .array(z.url({ protocol: /^(https?|tcp)$/ }))
    .min(1)
    .describe(
      'The env servers (`rollout env-server`, Safactory\'s, or your own); actors spread across them. `tcp://host:port` for `env.protocol: "verifiers"`, and for it only.',
    ),
  name: z.string().min(1).describe('Environment name on the servers: requests go to `/{name}/{id}/…`.'),
  timeoutMs: positiveInt.default(30_000).describe('Bound on one request to an env server (each attempt).'),
  retries: retries
    .default(2)
    .describe('Extra attempts after a 5xx, a timeout or a transport error (never after a 4xx).'),
  retryBackoffMs: nonNegativeInt.default(500).describe('First backoff between attempts.'),
  maxResponseBytes: positiveInt.default(16 * 1024 * 1024).describe('Largest reply read from an env server (16 MiB).'),
  /** The servers deduplicate `step` by the step index the engine sends, so a step may be retried safely. */
  dedupeSteps: z
    .boolean()
    .default(false)
    .describe(
      'The servers deduplicate `step` by the step index the engine sends, so a step may be retried safely (must stay false for Safactory; refused for NeMo Gym).',
    ),
});

/**
 * `env.protocol: "gym-http"` only (docs/ENVIRONMENTS.md): how the model's reply becomes the action,
 * and a system message before the first observation.
 */
const GymSpec = z.strictObject({
  action: z
    .enum(GYM_ACTIONS)
    .default('text')
    .describe("How the model's reply becomes the action: `text` as it is, `integer` its last integer, `json` parsed."),
  system: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe('A system message before the first observation; null = none.'),
});

/** A field of an OpenEnv Action or Observation model (a Python identifier). */
const openEnvField = z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/, 'must be a field name (letters, digits, _)');

/** How an OpenEnv server's observations and actions become the conversation (env/protocol.ts OpenEnvSettings). */
const OpenEnvSpec = z
  .strictObject({
    actionField: openEnvField
      .default(OPENENV_DEFAULTS.actionField)
      .describe("The Action field the model's reply goes into."),
    promptField: openEnvField
      .default(OPENENV_DEFAULTS.promptField)
      .describe('The Observation field holding the chat messages to send.'),
    truncatedField: openEnvField
      .nullable()
      .default(OPENENV_DEFAULTS.truncatedField)
      .describe('An Observation field that marks the episode truncated; null = none. Must not be the promptField.'),
    tools: z
      .boolean()
      .default(OPENENV_DEFAULTS.tools)
      .describe("Whether the environment's MCP tools are offered to the model."),
  })
  .refine((o) => o.truncatedField !== o.promptField, {
    path: ['truncatedField'],
    message: 'must not be the promptField',
  });

const EnvSpec = z
  .strictObject({
    /** `builtin:guess-number`, `builtin:arithmetic`, or a path to an ES module (relative to the config file). */
    module: z
      .string()
      .min(1)
      .optional()
      .describe(
        '`builtin:guess-number`, `builtin:arithmetic`, `builtin:tool-lookup`, `builtin:echo-digit`, or a path to an ES module (relative to the config file). Give exactly one of `module` and `http`.',
      ),
    /** Export holding the EnvironmentFactory. */
    export: z.string().min(1).default('default').describe('Export holding the environment factory.'),
    /** Environment actors behind HTTP instead of an in-process module. */
    http: HttpEnvSpec.optional().describe(
      'Instead of `module`: environment actors behind HTTP, on env servers that speak `env.protocol`; actors spread across the `urls`.',
    ),
    /**
     * The protocol the `env.http` servers speak: `rollout` (rollout env-server's), `safactory`
     * (Safactory's env service: env_param is `{...env.params, dataset: line}`, steps carry no index),
     * `nemo-gym` (a NeMo Gym resources server, `http.name` its config name: env/nemo-gym.ts),
     * `gym-http` (openai/gym-http-api's routes, `env.http.name` the env_id: docs/ENVIRONMENTS.md), or
     * `auto`: each server's GET /envs tells, at start (names, or Safactory's live instances).
     */
    protocol: z
      .enum(ENV_PROTOCOLS)
      .default('auto')
      .describe(
        "What the `env.http` servers speak: `rollout` (rollout env-server's protocol), `safactory` (Safactory's env service; `dedupeSteps` must stay false), `openenv` (an OpenEnv server, one WebSocket session per episode; `env.params` go with every reset), `nemo-gym` (a NeMo Gym resources server, `http.name` its config name; no `env.params`, no `dedupeSteps`), `gym-http` (gym-http-api's REST routes, `http.name` the env_id), `verifiers` (a verifiers env server at `tcp://host:port` runs each episode, its model calls through the gateway), or `auto` (told by each server's `GET /envs` at start: rollout or Safactory). See docs/ENVIRONMENTS.md.",
      ),
    /** `protocol: "openenv"` only: which observation and action fields the conversation uses (docs/ENVIRONMENTS.md). */
    openenv: OpenEnvSpec.optional().describe(
      'With `env.protocol: "openenv"` only: the observation and action fields that make the conversation, and whether the environment\'s MCP tools are the model\'s (docs/ENVIRONMENTS.md#openenv).',
    ),
    /** `protocol: "gym-http"` only: how the model's reply becomes the action, and a system message. */
    gym: GymSpec.optional().describe(
      'With `env.protocol: "gym-http"` only: how the model\'s reply becomes the action, and a system message before the first observation (docs/ENVIRONMENTS.md).',
    ),
    /** Passed to the factory once per episode (in-process), or in every reset's env_param (a Safactory server). */
    params: params
      .default({})
      .describe(
        "Passed to the factory for every episode; with `env.http`, sent in every reset's env_param to a Safactory server (refused for a rollout env-server).",
      ),
    /** Actors of this environment alive at once per worker thread; null = no limit beyond the worker's concurrency. */
    poolSize: positiveInt
      .nullable()
      .default(null)
      .describe("Environment actors alive at once per worker; null = bounded by the worker's concurrency."),
    /**
     * Bound on every call into the environment (the factory call, reset, getTaskPrompt, step, close) and the
     * task's hooks: a call that has not settled by then fails its rollout (ERR_ENV_TIMEOUT) and its
     * actor is discarded (a hook's is logged and ignored). Covers HTTP environments too, retries
     * included (their requests also have `env.http.timeoutMs` each). Max 24 h: a timer's limit.
     */
    timeoutMs: positiveInt
      .max(86_400_000)
      .default(60_000)
      .describe(
        "Bound on every environment call (the factory call — not the module's import —, reset, getTaskPrompt, step, close; in-process or HTTP, retries included) and hook call: a call still pending fails its rollout with ERR_ENV_TIMEOUT and its actor is discarded (a hook's is logged and ignored, ERR_HOOK_TIMEOUT). A pause that cancels in-flight work gives up on pending environment calls at once (the rollout comes back ABORTED). At most 24 h.",
      ),
  })
  .refine((env) => (env.module === undefined) !== (env.http === undefined), {
    message: 'give exactly one of env.module (in-process) or env.http (env servers)',
  })
  .superRefine((env, ctx) => {
    if (env.gym !== undefined && (env.protocol !== 'gym-http' || env.http === undefined))
      ctx.addIssue({
        code: 'custom',
        path: ['gym'],
        message: `applies to env.protocol "gym-http" only (got protocol ${JSON.stringify(env.protocol)})`,
        input: env.gym,
      });
    env.http?.urls.forEach((url, i) => {
      const tcp = url.startsWith('tcp:');
      if (tcp === (env.protocol === 'verifiers')) return;
      ctx.addIssue({
        code: 'custom',
        path: ['http', 'urls', i],
        message: tcp
          ? 'a tcp:// address is for env.protocol "verifiers" (a ZMQ env server); this protocol is spoken over http(s)'
          : 'a verifiers env server is reached over ZMQ: give tcp://host:port',
        input: url,
      });
    });
    if (env.openenv !== undefined && (env.protocol !== 'openenv' || env.http === undefined))
      ctx.addIssue({
        code: 'custom',
        path: ['openenv'],
        message: 'is read only with env.protocol "openenv" and env.http',
        input: env.openenv,
      });
    if (env.http === undefined || env.protocol === 'auto') return;
    for (const c of protocolConflicts(env.protocol, { params: env.params, dedupeSteps: env.http.dedupeSteps })) {
      const path = c.option === 'dedupeSteps' ? ['http', 'dedupeSteps'] : c.option.split('.');
      ctx.addIssue({ code: 'custom', path, message: c.why, input: c.value });
    }
  })
  // Workers are given `env.http` alone: the protocol and the params an HTTP environment sends travel inside it.
  .transform((env) =>
    env.http === undefined
      ? env
      : {
          ...env,
          http: {
            ...env.http,
            protocol: env.protocol,
            params: env.params,
            ...(env.protocol === 'openenv' ? { openenv: env.openenv ?? { ...OPENENV_DEFAULTS } } : {}),
            ...(env.gym !== undefined ? { gym: env.gym } : {}),
          },
        },
  );

/** A user module's export: episode hooks (`beforeInference` / `onEpisodeEnd`) or a black-box agent. */
const ModuleExportSpec = z.strictObject({
  module: z.string().min(1).describe('The module: `builtin:…` or a path to an ES module, relative to the config file.'),
  export: z.string().min(1).default('default').describe("The module's export to use."),
});

/** An MCP server a task's episodes may call: a stdio command the worker starts, or a streamable-HTTP URL. */
const McpServerSpec = z.union([
  z.strictObject({
    command: z
      .string()
      .min(1)
      .describe('Executable of a stdio MCP server, started by each worker (`mcpSessions: worker`) or each episode.'),
    args: z.array(z.string()).default([]).describe('Its arguments.'),
    /** Its environment (default: the SDK's safe subset of the worker's: PATH, HOME, …). */
    env: z
      .record(z.string(), z.string())
      .optional()
      .describe("Its environment; unset = the SDK's safe subset of the worker's (PATH, HOME, …)."),
    cwd: z.string().min(1).optional().describe('Its working directory.'),
  }),
  z.strictObject({
    /** A streamable-HTTP MCP endpoint (`http://host:port/mcp`). */
    url: httpUrl.describe('A streamable-HTTP MCP endpoint (`http://host:port/mcp`), instead of `command`.'),
    headers: z.record(z.string(), z.string()).optional().describe('HTTP headers sent with every request to it.'),
  }),
]);

const ToolsSpec = z.strictObject({
  /** MCP servers whose tools are offered beside the environment's (env/mcp.ts). */
  mcp: z
    .array(McpServerSpec)
    .default([])
    .describe(
      "MCP servers whose tools are offered beside the environment's: `{ command, args?, env?, cwd? }` (stdio, started by the worker) or `{ url, headers? }` (streamable HTTP). See docs/TOOLS.md.",
    ),
  /** `worker`: one session per server per worker, shared by the task's episodes; `episode`: one per episode, closed at its end. */
  mcpSessions: z
    .enum(['worker', 'episode'])
    .default('worker')
    .describe(
      "`worker`: one MCP session per server per worker, shared by the task's episodes; `episode`: one per episode, closed when it ends (a rollout paused after a step that called an MCP server is played again from its prompt: a replay does not call MCP servers again).",
    ),
  /** Tool calls run per step at most; the step ends with the reply that reaches it (later calls are answered `limit`). */
  maxCallsPerTurn: positiveInt
    .max(1024)
    .default(16)
    .describe(
      'Tool calls run per step at most; the reply that reaches it ends the step (calls past it are answered `error: not run`).',
    ),
  /** Bound on one tool call: past it the model is shown a timeout error and the call's signal aborts. */
  timeoutMs: positiveInt
    .max(86_400_000)
    .default(30_000)
    .describe("Bound on one tool call: past it the model is shown a timeout error and the call's signal aborts."),
  toolChoice: z
    .enum(['auto', 'required', 'none'])
    .default('auto')
    .describe('OpenAI `tool_choice` sent with the tools.'),
});

/**
 * Truncation and penalties, beside `temperature` (docs/INFERENCE-SERVERS.md, "Sampling"). Unset, each is sent at the
 * server's neutral value (llm/token-wire.ts samplingFields), so tokens are sampled from the model's whole
 * distribution at the temperature; what a task sets is recorded in its groups (`group.sampling`).
 */
const SamplingShapeSpec = {
  topP: z
    .number()
    .gt(0, 'must be in (0, 1]')
    .max(1, 'must be in (0, 1]')
    .optional()
    .describe(
      "Nucleus sampling, in (0, 1]. Unset = off: each server is sent its neutral value (else llama.cpp samples from its top 40, vLLM and SGLang by the model's generation_config.json), so tokens come from the model's whole distribution at `temperature`; a set one is sent and recorded in the batch (`group.sampling`). Not with a black-box `agent`. See docs/INFERENCE-SERVERS.md#sampling.",
    ),
  topK: z
    .number()
    .int('must be a whole number of tokens, at least 1')
    .min(1, 'must be at least 1')
    .optional()
    .describe('Top-k sampling, at least 1; unset = off (as `topP`).'),
  minP: z
    .number()
    .min(0, 'must be in [0, 1)')
    .lt(1, 'must be in [0, 1)')
    .optional()
    .describe('Min-p sampling, in [0, 1); unset = off (as `topP`).'),
  /** vLLM wants > 0, SGLang [0, 2]. */
  repetitionPenalty: z
    .number()
    .gt(0, 'must be in (0, 2]')
    .max(2, 'must be in (0, 2]')
    .optional()
    .describe('Repetition penalty, in (0, 2] (vLLM wants > 0, SGLang [0, 2]); unset = off (as `topP`).'),
  /** The OpenAI API's range. */
  presencePenalty: z
    .number()
    .min(-2, 'must be in [-2, 2]')
    .max(2, 'must be in [-2, 2]')
    .optional()
    .describe("Presence penalty, in [−2, 2] (the OpenAI API's range); unset = off (as `topP`)."),
  frequencyPenalty: z
    .number()
    .min(-2, 'must be in [-2, 2]')
    .max(2, 'must be in [-2, 2]')
    .optional()
    .describe('Frequency penalty, in [−2, 2]; unset = off (as `topP`).'),
};
export const SAMPLING_SHAPE_KEYS = Object.keys(SamplingShapeSpec) as (keyof typeof SamplingShapeSpec)[];

const TaskSpec = z
  .strictObject({
    name: z
      .string()
      .regex(/^[A-Za-z0-9_.-]+$/, 'must be letters, digits, "_", "." or "-"')
      .describe('Task name (letters, digits, `_ . -`), unique among the tasks.'),
    /** The environment; optional for a black-box `agent`, whose prompts may come from the dataset (`messages`, `label`). */
    env: EnvSpec.nullable()
      .default(null)
      .describe(
        'The environment: an in-process module (`env.module`) or env servers (`env.http`). May be null only for a black-box `agent`, whose prompts then come from the dataset (`messages`, `label`).',
      ),
    /** JSONL file, one JSON object of environment reset params per line; null = the environment draws its own task from the seed. */
    dataset: z
      .string()
      .min(1)
      .nullable()
      .default(null)
      .describe(
        "JSONL, one object of reset params per line (optional `seed`, an integer in [0, 2³¹−1]; at most 64 levels deep), checked at start by the environment's `checkResetParams` if it has one; null = the environment draws its task from the seed.",
      ),
    /** Rollouts per prompt (GRPO's k). */
    groupSize: positiveInt.max(65_536).default(4).describe("Rollouts per prompt (GRPO's k)."),
    /** Share of each batch (largest-remainder split across tasks); 0 switches the task off, keeping it configured. */
    weight: z
      .number()
      .min(0)
      .finite()
      .default(1)
      .describe(
        'Share of each batch (largest-remainder split across tasks); 0 switches the task off, keeping it configured (at least one task needs a share).',
      ),
    maxSteps: positiveInt.default(16).describe('Agent turns per episode at most.'),
    /**
     * Times an episode that failed by infrastructure (a server gone, a session lost, a judge that
     * failed: src/domain/failure.ts) goes on in its slot, on a fresh actor, before its group fails:
     * from its last finished step, replayed, or from its prompt where the replay disagrees. The step
     * the failure cut short is never trained; the group keeps its size.
     */
    infraRetries: retries
      .default(2)
      .describe(
        'Times an episode that failed by infrastructure (a server gone, a session lost, a judge that failed) goes on in its slot, on a fresh actor, before its group fails: its finished steps replayed, the step the failure cut short played again and never trained (docs/FAILURES.md).',
      ),
    /** Keep the system message and the last `2 × messageCut − 1` messages; 0 = send the whole conversation. */
    messageCut: nonNegativeInt
      .default(3)
      .describe(
        'Keep the system message and the last `2 × messageCut − 1` messages; 0 sends the whole conversation (then only the last turn is trainable, and each prompt extends the last so the servers keep its prefix cached: prefer it for multi-turn RL, docs/SCHEDULING.md).',
      ),
    maxTokens: positiveInt
      .default(512)
      .describe('`max_tokens` per inference call; a reply that stops at `length` ends the episode as truncated.'),
    temperature: z.number().min(0).max(2).default(1).describe('Sampling temperature.'),
    ...SamplingShapeSpec,
    hooks: ModuleExportSpec.nullable()
      .default(null)
      .describe('Episode hooks (`beforeInference` / `onEpisodeEnd`): a module and its export.'),
    /**
     * A black-box agent: a module whose export receives `{ baseURL, sessionId, prompt, label, signal }` and
     * talks to the token-trace gateway with any OpenAI client (see docs/GATEWAY.md). null = the
     * built-in agent loop.
     */
    agent: ModuleExportSpec.nullable()
      .default(null)
      .describe(
        "A black-box agent (its own OpenAI client, talking to the token-trace gateway: docs/GATEWAY.md) instead of the built-in agent loop. `env` may then be null (prompts from the dataset's `messages`, `label`); the agent must then return `{ reward }`, or the rollout fails with ERR_AGENT_NO_REWARD.",
      ),
    /** Tool calling (docs/TOOLS.md): MCP servers, and limits on the calls of the environment's tools and theirs. */
    tools: ToolsSpec.default(() => ToolsSpec.parse({})).describe(
      "Tool calling (docs/TOOLS.md): MCP servers, and limits on the calls of the environment's tools and theirs.",
    ),
  })
  .refine((task) => task.env !== null || task.agent !== null, {
    message: 'a task needs an env (or a black-box agent that takes its prompts from the dataset)',
    path: ['env'],
  })
  .superRefine((task, ctx) => {
    if (task.env?.protocol === 'verifiers' && task.agent !== null)
      ctx.addIssue({
        code: 'custom',
        path: ['agent'],
        message: 'a verifiers env server runs the episode itself, calling the model through the gateway: give no agent',
        input: task.agent,
      });
    if (task.env?.protocol === 'gym-http' && task.dataset !== null)
      ctx.addIssue({
        code: 'custom',
        path: ['dataset'],
        message:
          'a gym-http server makes each instance from its env_id and seed alone (POST /v1/envs/): a dataset line would go unsent',
        input: task.dataset,
      });
  })
  .superRefine((task, ctx) => {
    // The gateway passes on the agent's own sampling fields: a task setting here would go unsent and
    // still be recorded as what the tokens were sampled with.
    if (task.agent === null) return;
    for (const key of SAMPLING_SHAPE_KEYS)
      if (task[key] !== undefined)
        ctx.addIssue({
          code: 'custom',
          path: [key],
          message: 'applies to the built-in agent loop; a black-box agent sets its own sampling on its requests',
          input: task[key],
        });
  });

const GatewaySpec = z.strictObject({
  /** Tokenizer + chat template of the policy: `qwen2.5`, or a directory with tokenizer.json and tokenizer_config.json. */
  tokenizer: z
    .string()
    .min(1)
    .default('qwen2.5')
    .describe(
      'Tokenizer and chat template of the policy: `qwen2.5`, or a directory with tokenizer.json and tokenizer_config.json.',
    ),
  /** Token-in API of the inference servers: vLLM's /v1/completions with token ids, SGLang's /generate, llama.cpp's /completion. */
  backend: z
    .enum(['vllm', 'sglang', 'llamacpp'])
    .default('vllm')
    .describe(
      "Token-in API of the inference servers: vLLM's /v1/completions with token ids, SGLang's /generate, llama.cpp's /completion.",
    ),
  maxContext: positiveInt
    .nullable()
    .default(null)
    .describe(
      "Context window; null = the inference server's context length as probed at start (else the tokenizer's).",
    ),
  sessionTtlMs: positiveInt.default(600_000).describe('Idle sessions are released after this long.'),
});

const PolicySpec = z.strictObject({
  /** Endpoints serving this agent's policy; default: `llm.url`. */
  url: z
    .union([httpUrl, z.array(httpUrl).min(1)])
    .optional()
    .describe("Endpoints serving this agent's policy; unset = `llm.url`."),
  model: z.string().min(1).optional().describe('Model name sent for this agent; unset = `llm.model`.'),
  temperature: z
    .number()
    .min(0)
    .max(2)
    .optional()
    .describe("Sampling temperature for this agent's calls; unset = the task's."),
  /** Each set here replaces the task's for this agent's calls. */
  ...SamplingShapeSpec,
  maxTokens: positiveInt.optional().describe("`max_tokens` for this agent's calls; unset = the task's."),
});

const LlmSpec = z
  .strictObject({
    /** OpenAI-compatible base URL (`http://host:8000` or `http://host:8000/v1`); null = start the built-in mock server. */
    url: z
      .union([httpUrl, z.array(httpUrl).min(1)])
      .nullable()
      .default(null)
      .describe(
        'OpenAI-compatible base URL (`http://host:8000` or `…:8000/v1`), or a list of them (a fleet: docs/FLEET.md); null starts the embedded mock.',
      ),
    model: z
      .string()
      .min(1)
      .default('mock-policy')
      .describe(
        'Model name sent in requests; a name the server does not list is an error at start (ERR_LLM_MODEL), except on llama.cpp, which serves its one model whatever is asked.',
      ),
    /**
     * The inference server's dialect (llm/servers.ts): where token ids, prompt ids and the weight version
     * come back, which abort route exists, which token-in route `api: tokens` uses. `auto` tells it from
     * what the server answers at start (`/v1/models` owned_by, llama.cpp's `/props`), and logs it.
     */
    server: z
      .enum(['auto', ...SERVER_KINDS])
      .default('auto')
      .describe(
        "The server's dialect: `vllm`, `sglang`, `llamacpp`, `openai` (no extras), `generic` (vLLM-style extras and `/abort_request`: the shipped mock, routers); `auto` tells it at start from `/v1/models` and `/props`, and logs it with what the server lacks (docs/INFERENCE-SERVERS.md).",
      ),
    /**
     * `chat`: the server renders and tokenizes (OpenAI chat completions). `tokens`: the engine renders the
     * chat template with `llm.tokenizer` and sends token ids (vLLM /v1/completions, SGLang /generate,
     * llama.cpp /completion), so each turn's prompt is the previous prompt + response + the new
     * observation's tokens exactly — no retokenization drift.
     */
    api: z
      .enum(['chat', 'tokens'])
      .default('chat')
      .describe(
        "`chat`: OpenAI chat completions. `tokens`: the engine renders the chat template with `llm.tokenizer` and sends token ids (vLLM `/v1/completions`, SGLang `/generate`, llama.cpp `/completion`): each turn's prompt is exactly the previous prompt + response + the new observation's tokens.",
      ),
    /**
     * With `api: tokens`: how tool calls are read from the model's text (llm/tool-calls.ts), as vLLM's
     * `--tool-call-parser`: `hermes` (Qwen2.5, Hermes: `<tool_call>{json}</tool_call>`) or
     * `llama3_json` (Llama 3.x JSON).
     */
    toolParser: z
      .enum(['hermes', 'llama3_json'])
      .default('hermes')
      .describe(
        "With `api: tokens`, how tool calls are read from the model's text (as vLLM's `--tool-call-parser`): `hermes` (Qwen2.5, Hermes: `<tool_call>{json}</tool_call>`) or `llama3_json` (Llama 3.x JSON).",
      ),
    /** The policy's tokenizer and chat template for `api: tokens`: `qwen2.5`, or a directory with tokenizer.json and tokenizer_config.json. */
    tokenizer: z
      .string()
      .min(1)
      .default('qwen2.5')
      .describe(
        "The policy's tokenizer and chat template for `api: tokens`: `qwen2.5`, or a directory with tokenizer.json and tokenizer_config.json.",
      ),
    /**
     * With `api: tokens`, a turn whose chat template re-renders the history otherwise than it was
     * sampled (Qwen3 drops earlier reasoning; docs/TEMPLATES.md): `keep-sampled` goes on from the sampled
     * ids (one exact sequence per episode), `split` sends the re-rendered history and starts a new
     * training segment there. Either way it is warned of once per task and counted in the batch stats.
     */
    historyMode: z
      .enum(['keep-sampled', 'split'])
      .default('keep-sampled')
      .describe(
        'With `api: tokens`, a turn whose chat template re-renders the history otherwise than it was sampled (Qwen3 drops earlier reasoning): `keep-sampled` goes on from the sampled ids (one sequence per episode); `split` sends the re-rendered history, a new training segment. Warned of once per task, counted in the batch stats (docs/TEMPLATES.md).',
      ),
    apiKey: z.string().nullable().default(null).describe('Sent as `Authorization: Bearer …`.'),
    /** Budget for one inference request, headers and body included (with `stream`: until the first event, then between events). */
    timeoutMs: positiveInt
      .default(120_000)
      .describe(
        'Budget for one inference request (headers, then a whole body still arriving after it is cut); with `stream`, the wait for the first event and between events.',
      ),
    /**
     * Largest reply read (a whole body, or a stream's events together): a bigger one fails the call
     * (ERR_LLM_BAD_REPLY). Far above a 32k-token reply with logprobs and a few top alternatives per token.
     */
    maxReplyBytes: positiveInt
      .default(64 * 1024 * 1024)
      .describe(
        'Largest reply read, whole or streamed (64 MiB); a bigger one fails the rollout with ERR_LLM_BAD_REPLY and its connection is cut.',
      ),
    /** Extra attempts after a 429, a 5xx or a transport error. */
    retries: retries
      .default(3)
      .describe('Extra attempts after a 429, a 5xx or a transport error (exponential backoff, Retry-After honoured).'),
    retryBackoffMs: nonNegativeInt.default(200).describe('First backoff between attempts.'),
    /**
     * How long an inference outage (no endpoint answers: refused, reset, timed out, or 5xx after the
     * retries) may last before groups fail with ERR_LLM_OUTAGE. Until then the groups that meet it come
     * back ABORTED and production waits, probing the endpoints with backoff (coordinator/outage.ts).
     * 0 = no wait: they fail at once. Servers restart and fail over in minutes, hence the default.
     */
    outageBudgetMs: nonNegativeInt
      .max(7 * 24 * 3_600_000)
      .default(300_000)
      .describe(
        'How long an inference outage may last (5 min): when no endpoint answers (refused, reset, timed out, 5xx after the retries), the groups that met it come back ABORTED with their tokens and are retried, new groups are held, and the endpoints are probed (`GET /v1/models`, 0.5 s doubling to 10 s) until one answers; past the budget `getBatch` rejects once with ERR_LLM_OUTAGE naming it. 0: reject at the first outage.',
      ),
    /** Connections per worker thread to the inference server. */
    connections: positiveInt.default(128).describe('Keep-alive connections per worker to the inference server.'),
    /** Ask for vLLM-style token ids (`return_token_ids`) and logprobs. */
    returnTokenIds: z
      .boolean()
      .default(true)
      .describe(
        "Ask for token ids, in the dialect's way (vLLM `return_token_ids`, SGLang `return_token_ids` or, streamed, `return_input_ids_in_sglext` / `return_output_ids_in_sglext`, llama.cpp's ids inside logprobs).",
      ),
    logprobs: z.boolean().default(true).describe('Ask for logprobs.'),
    /**
     * Ask for streamed replies (`stream: true`, server-sent events), read as they arrive. With
     * `pause.mode: abort`, a pause then returns each call in flight at once with the tokens it holds,
     * instead of waiting for the server's aborted answers; costs a little CPU per event.
     */
    stream: z
      .boolean()
      .default(false)
      .describe(
        "Ask for streamed replies (`stream: true`, server-sent events, vLLM's per-event `token_ids` and logprobs) and read them as they arrive; with `pause.mode: abort` a pause returns every call in flight at once with the tokens it holds, without waiting for the server's aborted replies (the server-side abort is still sent).",
      ),
    sendSeed: z
      .boolean()
      .default(true)
      .describe('Send a per-rollout, per-turn `seed`, so a continued generation samples like the one it continues.'),
    /**
     * `trajectory`: each call carries a priority from its trajectory's staleness, progress and age
     * (llm/priority.ts, docs/SCHEDULING.md), in the server's own `priority` field — vLLM with
     * `--scheduling-policy priority`, SGLang with `--enable-priority-scheduling`; nothing is sent to
     * llama.cpp or OpenAI. `off`: no field.
     */
    priority: z
      .enum(['off', 'trajectory'])
      .default('off')
      .describe(
        "`trajectory`: each call carries a priority from its trajectory's staleness, progress and age, in the server's own `priority` field (vLLM `--scheduling-policy priority`, SGLang `--enable-priority-scheduling`; none sent to llama.cpp or OpenAI); `off`: no field. See docs/SCHEDULING.md.",
      ),
    /**
     * Server route that aborts every request in flight; unset = the dialect's (SGLang `/abort_request`,
     * vLLM dev mode `/abort_requests`, none on llama.cpp); null = cancel client-side.
     */
    abortPath: z
      .string()
      .startsWith('/')
      .nullable()
      .optional()
      .describe(
        'Server route that aborts every request in flight on a pause; unset = the dialect\'s (SGLang `/abort_request` `{"abort_all":true}`, vLLM `/abort_requests` `{}` in dev mode only, checked at start; none on llama.cpp); null = cancel client-side.',
      ),
    /** Inference calls one worker has in flight at most (the reference's LLM semaphore); null = no limit. */
    maxConcurrency: positiveInt
      .nullable()
      .default(null)
      .describe('Inference calls in flight per worker at most; null = no limit.'),
    startupJitterMs: nonNegativeInt
      .default(0)
      .describe('The first wave of episodes on a worker waits a random 0..startupJitterMs before its first call.'),
    /**
     * How calls spread over the endpoints of `llm.url` (llm/router.ts): `session` keeps a session (one
     * rollout) on the endpoint it started on, so that server's prefix cache holds its conversation;
     * `round-robin` sends each call to the next endpoint in turn (no affinity: the baseline, whose
     * cache hit rate docs/FLEET.md compares).
     */
    routing: z
      .enum(['session', 'round-robin'])
      .default('session')
      .describe(
        '`session`: a rollout stays on the endpoint it started on (prefix cache); `round-robin`: each call goes to the next endpoint (docs/FLEET.md).',
      ),
    sessionPath: z
      .string()
      .startsWith('/')
      .includes('{session}')
      .nullable()
      .default(null)
      .describe(
        'Path inserted after `/v1` with `{session}` replaced by the rollout id, e.g. `/sessions/{session}` (session-routing gateways).',
      ),
    /** Per-agent policies for multi-agent environments: agent id → endpoints, model, temperature, max tokens. */
    policies: z
      .record(z.string().min(1), PolicySpec)
      .default({})
      .describe(
        "Agent id → its policy, for multi-agent environments: endpoints, model, and sampling settings; each one given replaces the task's for that agent's calls.",
      ),
    /**
     * Routing replay (docs/ROUTING-REPLAY.md): keep the experts each token was routed to, as the server
     * reports them (vLLM and SGLang launched with `--enable-return-routed-experts`). `true` takes the
     * shape from the reply (vLLM's `.npy`); SGLang sends none, so it needs `{layers, topK}`: the model's
     * `num_hidden_layers` and `num_experts_per_tok`.
     */
    routedExperts: z
      .union([
        z.boolean(),
        z.strictObject({
          layers: positiveInt.max(4096).describe("The model's num_hidden_layers."),
          topK: positiveInt.max(4096).describe("The model's num_experts_per_tok."),
        }),
      ])
      .default(false)
      .describe(
        "Routing replay: keep the experts each token was routed to (vLLM / SGLang launched with `--enable-return-routed-experts`); `true` reads the shape from vLLM's reply, SGLang needs `{ layers, topK }` (the model's num_hidden_layers, num_experts_per_tok). Not with `llm.stream`. See docs/ROUTING-REPLAY.md.",
      ),
    /** Keep each response token's sampling support (SGLang /generate `return_sampling_mask`; needs a task's topK, topP or minP). */
    samplingMasks: z
      .boolean()
      .default(false)
      .describe(
        "Keep each response token's sampling support (SGLang `/generate` `return_sampling_mask`, `llm.api: tokens`, a task with `topK`, `topP` or `minP`). Not with `llm.stream`.",
      ),
  })
  .superRefine((llm, ctx) => {
    // vLLM's streamed chat chunks carry no routed_experts, and SGLang refuses a streamed sampling mask.
    for (const key of ['routedExperts', 'samplingMasks'] as const) {
      if (llm[key] !== false && llm.stream)
        ctx.addIssue({
          code: 'custom',
          path: [key],
          message: `needs llm.stream: false (streamed replies carry no ${key === 'routedExperts' ? 'routed experts' : 'sampling masks'})`,
          input: llm[key],
        });
    }
  });

const MockSpec = z.strictObject({
  latencyMs: z.number().min(0).default(0).describe('Fixed latency added to every reply.'),
  tokensPerSecond: z.number().min(0).default(0).describe('Generation speed per request; 0 = no generation time.'),
  /** How often a streamed reply (llm.stream) sends its new tokens. */
  streamIntervalMs: z
    .number()
    .min(1)
    .max(60_000)
    .default(20)
    .describe('How often a streamed reply (`llm.stream`) sends its new tokens.'),
  thinkTokens: nonNegativeInt
    .default(0)
    .describe('Reasoning-like filler tokens (no digits) put before every answer: sets the response size.'),
  mistakeRate: z
    .number()
    .min(0)
    .max(1)
    .default(0.3)
    .describe('How often the mock policy plays imperfectly (a random guess, an answer off by a little).'),
  seed: z.number().int().default(0).describe("The mock's seed."),
});

const WorkersSpec = z.strictObject({
  /** Each is a thread with a V8 heap of its own: far more than the cores is a mistake, not a setting (1e9 ran out of memory). */
  threads: positiveInt
    .max(1024)
    .default(() => availableParallelism())
    .describe(
      'Worker threads. The main thread needs a share of a core too, so where the environment is light and the cores are few (or shared with an inference server), fewer workers than cores can be faster; CPU-costly environments want every core.',
    ),
  /** Groups one worker runs at once on its event loop. */
  groupsPerWorker: positiveInt.default(64).describe('Groups one worker holds at once.'),
  /**
   * Episodes one worker runs at once; null = every rollout of its groups. Set below groupsPerWorker ×
   * groupSize so that a rollout ending early hands its slot to a waiting group's rollout instead of
   * idling until its siblings finish: inference calls in flight then stay at this bound.
   */
  rolloutsPerWorker: positiveInt
    .nullable()
    .default(null)
    .describe(
      "Episodes one worker plays at once; null = every rollout of its groups. Set it below `groupsPerWorker × groupSize` — e.g. 32 with 12 groups of 4 — and a rollout that ends before its siblings hands its slot to a waiting group's rollout, so inference calls in flight stay at the bound instead of sagging while groups wait for their longest episode.",
    ),
  maxOldGenerationSizeMb: positiveInt
    .nullable()
    .default(null)
    .describe("Heap limit per worker (MB); a worker over it fails its groups and is replaced. null = Node's default."),
  /** A worker whose event loop does not answer for this long (a spinning environment) is terminated and replaced; null = never. */
  watchdogMs: positiveInt
    .nullable()
    .default(60_000)
    .describe(
      'A worker whose event loop does not answer for this long (a spinning environment) is replaced, its groups handled as for any worker death (`workers.deathRetries`); null = never.',
    ),
  /**
   * Times a group is sent again after the worker running it died while none of its own rollouts was
   * inside its environment (innocent: it comes back ABORTED); one more such death fails it with the
   * reason. A group whose rollout was inside its environment when the worker died fails at once.
   */
  deathRetries: retries
    .default(2)
    .describe(
      'When a worker dies, only the group whose rollout was inside its environment (or a hook) at that moment fails; the other groups on it come back ABORTED and are sent again, at most this many times each — one more death fails the group with the reason.',
    ),
  /**
   * Run groups on worker nodes (`rollout node`) over NATS JetStream instead of (or beside) local
   * threads; null = local threads only. See src/cluster/ and docs/SCALE-OUT.md, "Worker nodes".
   */
  nats: z
    .strictObject({
      /** The NATS server the coordinator and every node connect to. */
      url: z
        .string()
        .regex(NATS_URL, 'expected nats://host:port (or tls://)')
        .describe('The NATS server (`nats://host:4222`, or `--nats`).'),
      /** Names the run's streams, bucket and subjects: nodes started with the same `--run` serve it. */
      run: z
        .string()
        .regex(RUN_NAME, 'expected 1 to 64 letters, digits, _ or -')
        .default(DEFAULT_RUN)
        .describe("Names the run's streams and bucket: nodes serve the run given to their `--run`."),
      localThreads: z
        .boolean()
        .default(false)
        .describe('Also run groups on `workers.threads` local threads (local first, nodes take the rest).'),
      /** A node that neither returns a result nor heartbeats for this long is taken for dead: its group goes to another node. */
      ackWaitMs: positiveInt
        .min(500)
        .max(3_600_000)
        .default(30_000)
        .describe('A node silent for this long (no result, no heartbeat) has its group sent to another node.'),
      /** Deliveries of one group to nodes (first one included); past it the group fails with the reason. */
      maxDeliver: positiveInt
        .max(100)
        .default(3)
        .describe('Deliveries of one group to nodes (the first one included) before the group fails with the reason.'),
      /** A node whose heartbeat is older than this is left out of /status, pauses and liveWorkers. */
      nodeStaleMs: positiveInt
        .default(10_000)
        .describe('Nodes whose heartbeat is older than this are left out of `/status` and pauses.'),
      /** Delete the run's streams and buckets when the coordinator closes (a restart with --resume makes them again). */
      cleanup: z
        .boolean()
        .default(true)
        .describe(
          "Delete the run's streams and buckets when the coordinator closes (a restart with `--resume` makes them again).",
        ),
    })
    .nullable()
    .default(null)
    .describe(
      'Run groups on worker nodes (`rollout node`) over NATS JetStream, instead of or beside local threads; null = local threads only. See docs/SCALE-OUT.md.',
    ),
});

const ProducerSpec = z
  .strictObject({
    /** sync: produce each batch on demand; async: keep producing in the background between batches. */
    strategy: z
      .enum(['sync', 'async'])
      .default('sync')
      .describe(
        '`sync`: each batch produced on demand; `async`: production runs in the background, ahead of the trainer.',
      ),
    /** Failed groups tolerated while producing one batch before `getBatch` rejects; null = 2 × batchSize. */
    maxFailedGroupsPerStep: positiveInt
      .nullable()
      .default(null)
      .describe(
        'Failed groups tolerated since the last batch before `getBatch` rejects with the last reason; null = 2 × batchSize.',
      ),
    /** async: extra groups scheduled per task, as a fraction of its share of the batch. */
    overSampleThreshold: z
      .number()
      .min(0)
      .max(100)
      .default(0)
      .describe(
        'async: extra groups scheduled per task, as a fraction of its share (`ceil(x × share)`), none in tail-batch mode.',
      ),
    /** Continue interrupted rollouts after a weight update instead of restarting them. */
    partialRollout: z
      .boolean()
      .default(false)
      .describe('Continue interrupted rollouts with the new weights instead of restarting them.'),
    /** async: how many weight syncs behind the trainer a sample may be. */
    maxStaleness: nonNegativeInt
      .default(0)
      .describe(
        'async: stale threshold `(maxStaleness + 1) × syncWeightsInterval` weight updates (sync: always 1, against the served weights).',
      ),
    /**
     * async: what becomes of a rollout that reaches the stale threshold. `reset`: it expires and is
     * generated again. `keep`: it is trained as it is, and the threshold only bounds how far production
     * runs ahead of the trainer (admission, as AReaL's staleness manager); the token-level threshold
     * still masks and expires.
     */
    staleRollouts: z
      .enum(['reset', 'keep'])
      .default('reset')
      .describe(
        'async: `reset` expires a rollout at the stale threshold and generates it again; `keep` trains it as it is, the threshold then only stops production from running ahead of the trainer (the token-level mask still applies).',
      ),
    /** async: train steps between weight syncs. */
    syncWeightsInterval: positiveInt
      .default(1)
      .describe('async: train steps between weight syncs (see `maxStaleness`).'),
    admission: z
      .enum(['eager', 'deadline'])
      .default('eager')
      .describe(
        "async: when a group is started. `eager`: every group up to the targets and over-sampling at once; `deadline`: a group beyond what the trainer's next batch needs starts only when it is predicted to be taken before it passes the stale threshold (the `admissionQuantile` of recent group lifetimes against the trainer's pace; docs/SCHEDULING.md).",
      ),
    admissionQuantile: z
      .number()
      .gt(0, 'must be in (0, 1]')
      .max(1, 'must be in (0, 1]')
      .default(0.9)
      .describe(
        "`admission: deadline`: the quantile of recent group lifetimes (dispatch to landing) taken as a new group's.",
      ),
    /** async: −1 = expired groups are dropped; 0 = retried whenever any exist; N > 0 = tail-batch mode once N are expired. */
    tailBatchTriggerSize: z
      .number()
      .int()
      .min(-1)
      .default(0)
      .describe(
        'async: −1: expired groups dropped; 0: retried whenever any exist; N: tail-batch mode (no over-sampling, EXPIRED first) once N are expired. Sync drops them whatever this says.',
      ),
    /** Group validity filter: `drop-equal-rewards` marks groups whose rewards are all equal FILTERED (no GRPO signal). */
    filter: z
      .enum(['none', 'drop-equal-rewards'])
      .default('none')
      .describe(
        '`drop-equal-rewards`: groups whose rewards are all equal become FILTERED (library users can pass `isValidGroup` / `shouldContinue` functions to `createEngine`).',
      ),
    /**
     * Train steps one `getBatch(t)` may skip past the consumer's next step (`nextTrainStep`): t beyond
     * `nextTrainStep + maxSkippedSteps` is refused (ERR_TRAIN_STEP). Steps only go forward, so without
     * a bound one mistaken or hostile step (2^31 − 1) would refuse every real step for good, checkpoint
     * and restart included.
     */
    maxSkippedSteps: nonNegativeInt
      .max(1_000_000)
      .default(100)
      .describe(
        "Train steps one `getBatch(t)` may skip: `t` beyond the consumer's next step (`nextTrainStep`) + this is refused with ERR_TRAIN_STEP (one stray step far ahead would otherwise refuse every real step for good).",
      ),
    /** Order groups leave the buffer in, for a batch (COMPLETED) and for a retry (EXPIRED, ABORTED): insertion (`fifo`) or stalest first, then oldest. */
    takeOrder: z
      .enum(['fifo', 'stalest'])
      .default('fifo')
      .describe(
        '`stalest`: take the stalest groups first, then the oldest — COMPLETED ones for a batch, EXPIRED / ABORTED ones for a retry; `fifo`: in the order they landed.',
      ),
    /**
     * Memory budget for the buffer plus the groups in flight (approximate bytes). Over it, the producer
     * stops scheduling and waits for the trainer to take batches; nothing is dropped. null = no budget.
     */
    memoryBudgetBytes: positiveInt
      .nullable()
      .default(null)
      .describe(
        'Approximate bytes the buffer and the groups in flight may hold; over it the producer waits for the trainer (nothing is dropped). null = no budget.',
      ),
    /** Token-level mask: tokens this many steps stale (or more) are masked out of the loss; null = off. */
    tokenStalenessThreshold: positiveInt
      .nullable()
      .default(null)
      .describe(
        'Mask tokens this many steps stale out of the loss (`turn.lossMask`); a rollout left with none expires. null = off.',
      ),
  })
  .superRefine((p, ctx) => {
    // Sync production serves nothing older than the weights it runs with: there is no stale rollout to keep.
    if (p.staleRollouts === 'keep' && p.strategy !== 'async')
      ctx.addIssue({
        code: 'custom',
        path: ['staleRollouts'],
        message: `applies to producer.strategy "async" only; the strategy is "${p.strategy}"`,
        input: p.staleRollouts,
      });
    // Sync starts exactly the batch it needs: there is nothing beyond it to pace.
    if (p.admission === 'deadline' && p.strategy !== 'async')
      ctx.addIssue({
        code: 'custom',
        path: ['admission'],
        message: `"deadline" applies to producer.strategy "async" only; the strategy is "${p.strategy}"`,
        input: p.admission,
      });
  });

const PauseSpec = z.strictObject({
  /**
   * abort: in-flight calls are aborted (server-side, else client-side) and return partial tokens;
   * drain: they finish first; in-place: the servers pause with every call kept, KV cache and all, and
   * go on after the resume (SGLang's pause_generation in_place; a server without it is aborted).
   */
  mode: z
    .enum(['abort', 'drain', 'in-place'])
    .default('abort')
    .describe(
      '`abort`: in-flight calls are aborted and return partial tokens; `drain`: they finish, then rollouts stop at the next turn; `in-place`: the servers pause generation with every call kept, KV cache and all, and go on after the resume (SGLang\'s `/pause_generation` `{"mode":"in_place"}` and `/continue_generation`; vLLM\'s dev-mode `/pause?mode=keep&clear_cache=false` and `/resume`). With in-place, load the weights without flushing the cache: calls that go on, and new ones that find a cached prefix, use KV computed with the old weights (turns kept across an update are tagged with the older step), and `llm.timeoutMs` must cover a call\'s generation plus the load. If any server lacks those routes (vLLM without VLLM_SERVER_DEV_MODE=1, llama.cpp; checked at start) or refuses, the pause is an abort from then on.',
    ),
  /** Re-send the pause flag this often while groups drain (a server-side abort is repeated every 50 ms). */
  resignalIntervalMs: positiveInt
    .default(5_000)
    .describe('Re-send the pause (and the server abort) this often while draining (not for an in-place pause).'),
  /** Cancel what is still in flight, client-side, after this long. */
  timeoutMs: positiveInt
    .default(60_000)
    .describe(
      'Cancel what is still in flight, client-side, after this long (not for an in-place pause, which waits for nothing).',
    ),
});

/** The consistency audit (coordinator/audit.ts, docs/AUDIT.md). */
const AuditSpec = z.strictObject({
  /** Share of finished rollouts re-scored on the server as they land; 0 = only on demand (POST /audit). */
  fraction: z
    .number()
    .min(0, 'must be in [0, 1]')
    .max(1, 'must be in [0, 1]')
    .default(0)
    .describe(
      'Share of finished rollouts re-scored on the server that sampled them; 0 = only on demand (`POST /audit`). See docs/OUTPUT-FORMAT.md#consistency-audit.',
    ),
  /** A segment whose mean |Δ logprob| passes this is flagged, with a warning naming the rollout. */
  threshold: z
    .number()
    .gt(0, 'must be > 0')
    .max(100, 'must be at most 100')
    .default(0.05)
    .describe('A segment whose mean |Δ logprob| passes this is flagged and warned of.'),
  concurrency: positiveInt.max(1024).default(2).describe('Scoring calls in flight at most.'),
  /** Tokens sent for scoring stay under this share of the response tokens generated (sampled audits). */
  maxTokenShare: z
    .number()
    .gt(0, 'must be > 0')
    .max(1000, 'must be at most 1000')
    .default(1)
    .describe(
      "Tokens sent for scoring (each turn's prompt and response, one prefill) stay under this multiple of the response tokens generated.",
    ),
});

const DEFAULT_TASKS = [
  { name: 'guess-number', env: { module: 'builtin:guess-number' }, groupSize: 4, weight: 1 },
  { name: 'arithmetic', env: { module: 'builtin:arithmetic' }, groupSize: 4, weight: 1, maxSteps: 1 },
];

export const EngineConfigSchema = z.strictObject({
  seed: seed.default(0).describe('Run seed; prompt seeds derive from (seed, task, prompt index).'),
  /** Groups per train step, summed over tasks. */
  batchSize: positiveInt
    .max(1_000_000)
    .default(8)
    .describe('Groups per train step, split across tasks by weight (largest remainder).'),
  /** Weight version the inference servers start with. */
  modelStep: nonNegativeInt
    .default(0)
    .describe('Weight version the inference servers start with (tags tokens when the server reports none).'),
  tasks: z
    .array(TaskSpec)
    .min(1)
    .default(() => DEFAULT_TASKS.map((t) => TaskSpec.parse(t)))
    .superRefine((tasks, ctx) => {
      if (tasks.length > 0 && tasks.every((t) => t.weight === 0)) {
        ctx.addIssue({
          code: 'custom',
          path: [0, 'weight'],
          message: 'every task has weight 0: at least one task needs a share of the batch',
          input: 0,
        });
      }
      const seen = new Set<string>();
      tasks.forEach((task, i) => {
        if (seen.has(task.name))
          ctx.addIssue({
            code: 'custom',
            path: [i, 'name'],
            message: `duplicate task name "${task.name}"`,
            input: task.name,
          });
        seen.add(task.name);
      });
    })
    .describe(
      'What to produce: each task an environment (or a black-box agent), an optional dataset of prompts, a group size and a share of each batch. Unset: the built-in `guess-number` (multi-turn) and `arithmetic` (one step) tasks, 4 rollouts per group.',
    ),
  llm: LlmSpec.default(() => LlmSpec.parse({})).describe('The inference server(s) and how they are called.'),
  mock: MockSpec.default(() => MockSpec.parse({})).describe(
    "The embedded mock inference server's behaviour (only when `llm.url` is null).",
  ),
  workers: WorkersSpec.default(() => WorkersSpec.parse({})).describe('Worker threads, and worker nodes over NATS.'),
  producer: ProducerSpec.default(() => ProducerSpec.parse({})).describe(
    'How groups are produced and handed to the trainer.',
  ),
  pause: PauseSpec.default(() => PauseSpec.parse({})).describe(
    'What a pause for a weight update does to the calls in flight.',
  ),
  audit: AuditSpec.default(() => AuditSpec.parse({})).describe(
    'The consistency audit: rollouts re-scored on the server that sampled them (docs/AUDIT.md).',
  ),
  /** The token-trace gateway black-box agents talk to (started when a task has `agent`). */
  gateway: GatewaySpec.default(() => GatewaySpec.parse({})).describe(
    'The token-trace gateway black-box agents use (started when a task has `agent` or a verifiers env): tokenizer and chat template, token-in API of the inference servers.',
  ),
  /** Run directory: step records go to `<runDir>/steps/` (one JSONL file per worker); null = not recorded. */
  runDir: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      'Run directory: step records go to `<runDir>/steps/` (one JSONL file per worker), the checkpoint to `<runDir>/engine.ckpt`; null = neither.',
    ),
  /** Record every step of every session (when `runDir` is set). */
  recordSteps: z
    .boolean()
    .default(true)
    .describe('Record every step of every session under `<runDir>/steps/` (with `runDir`).'),
  /**
   * With `runDir`: write `<runDir>/engine.ckpt` atomically after every batch taken, before it is handed
   * out — a run killed at any moment resumes from it (see docs/GUARANTEES.md).
   */
  checkpointEachBatch: z
    .boolean()
    .default(true)
    .describe(
      'With `runDir`: write `<runDir>/engine.ckpt` atomically after every batch taken, before it is handed out (what `rollout run --resume` continues from).',
    ),
  /** Continue from `<runDir>/engine.ckpt` when it exists (a restarted run). */
  resume: z
    .boolean()
    .default(false)
    .describe('With `runDir`: continue from `<runDir>/engine.ckpt` when it exists (what `rollout run --resume` sets).'),
  /** Checkpoint file to resume the run from (written by engine.checkpoint()). */
  resumeFrom: z
    .string()
    .min(1)
    .nullable()
    .default(null)
    .describe(
      "Checkpoint file to continue from; a config that changes seed, batch size, strategy or tasks is refused, naming each field. Checkpoints (version 2) keep groups in the compact form of the control API, so a long episode's conversation is written once; version 1 files are still read.",
    ),
  logLevel: z
    .enum(LOG_LEVELS)
    .default(() => (process.env.LOG_LEVEL as (typeof LOG_LEVELS)[number] | undefined) ?? 'info')
    .describe('Pino log level for the main thread and the workers.'),
});

/** What users write (every field optional where a default exists). */
export type EngineConfigInput = z.input<typeof EngineConfigSchema>;
type ParsedConfig = z.output<typeof EngineConfigSchema>;
type ParsedTask = ParsedConfig['tasks'][number];
export type TaskConfig = Omit<ParsedTask, 'env' | 'hooks' | 'agent'> & {
  /** `moduleUrl` is the resolved in-process module (null for an HTTP environment); no env only with an `agent`. */
  env: (NonNullable<ParsedTask['env']> & { moduleUrl: string | null }) | null;
  hooks: (NonNullable<ParsedTask['hooks']> & { moduleUrl: string }) | null;
  agent: (NonNullable<ParsedTask['agent']> & { moduleUrl: string }) | null;
  /** What its groups record they were sampled with (samplingRecord); null for a black-box agent's task. */
  sampling: SamplingRecord | null;
};
export type LlmConfig = ParsedConfig['llm'];
export type MockConfig = ParsedConfig['mock'];
export type ProducerConfig = ParsedConfig['producer'];
export type PauseConfig = ParsedConfig['pause'];
export type ResolvedConfig = Omit<ParsedConfig, 'tasks'> & { tasks: TaskConfig[] };

export interface ResolveOptions {
  /** Directory relative module and dataset paths are resolved against (the config file's, or cwd). */
  baseDir?: string;
}

export function resolveConfig(input: unknown, options: ResolveOptions = {}): ResolvedConfig {
  if (process.env.LOG_LEVEL !== undefined && !(LOG_LEVELS as readonly string[]).includes(process.env.LOG_LEVEL)) {
    throw new ConfigError([
      `LOG_LEVEL: expected one of ${LOG_LEVELS.join(', ')} (got ${JSON.stringify(process.env.LOG_LEVEL)})`,
    ]);
  }
  // A config file's `$schema` names its JSON Schema for editors (schema/config.schema.json): not an option.
  if (typeof input === 'object' && input !== null && !Array.isArray(input) && '$schema' in input) {
    const { $schema: _, ...options } = input as Record<string, unknown>;
    input = options;
  }
  const parsed = EngineConfigSchema.safeParse(input ?? {}, { reportInput: true });
  const baseDir = options.baseDir ?? process.cwd();
  const problems: string[] = parsed.success ? overflowingWeights(parsed.data) : parsed.error.issues.map(formatIssue);
  // Paths are checked even when other fields are wrong, so one run reports every problem.
  const rawTasks = parsed.success ? parsed.data.tasks : rawTaskPaths(input);
  const located = rawTasks.map((task, i) => ({
    moduleUrl:
      typeof task.env?.module === 'string'
        ? resolveEnvModule(task.env.module, baseDir, `tasks[${i}].env.module`, problems)
        : null,
    dataset:
      typeof task.dataset === 'string' ? resolveDataset(task.dataset, baseDir, `tasks[${i}].dataset`, problems) : null,
    hooksUrl:
      typeof task.hooks?.module === 'string'
        ? resolveEnvModule(task.hooks.module, baseDir, `tasks[${i}].hooks.module`, problems)
        : null,
    agentUrl:
      typeof task.agent?.module === 'string'
        ? resolveEnvModule(task.agent.module, baseDir, `tasks[${i}].agent.module`, problems)
        : null,
  }));
  if (!parsed.success || problems.length > 0) throw new ConfigError(problems);
  const tasks = parsed.data.tasks.map(
    (task, i): TaskConfig => ({
      ...task,
      dataset: located[i].dataset,
      env: task.env === null ? null : { ...task.env, moduleUrl: located[i].moduleUrl },
      hooks: task.hooks === null ? null : { ...task.hooks, moduleUrl: located[i].hooksUrl! },
      agent: task.agent === null ? null : { ...task.agent, moduleUrl: located[i].agentUrl! },
      sampling: task.agent === null ? samplingRecord(task, parsed.data.llm.policies) : null,
    }),
  );
  const resumeFrom =
    parsed.data.resumeFrom === null ? null : resolveDataset(parsed.data.resumeFrom, baseDir, 'resumeFrom', problems);
  const runDir =
    parsed.data.runDir === null
      ? null
      : isAbsolute(parsed.data.runDir)
        ? parsed.data.runDir
        : resolve(baseDir, parsed.data.runDir);
  if (problems.length > 0) throw new ConfigError(problems);
  return { ...parsed.data, tasks, resumeFrom, runDir };
}

/** The tasks' path fields from unvalidated input, where they have the right shape. */
type RawTaskPaths = {
  env?: { module?: unknown };
  dataset?: unknown;
  hooks?: { module?: unknown } | null;
  agent?: { module?: unknown } | null;
};

function rawTaskPaths(input: unknown): RawTaskPaths[] {
  const tasks = (input as { tasks?: unknown } | null)?.tasks;
  if (!Array.isArray(tasks)) return [];
  // A plain loop, not tasks.map: map consults a user-supplied `constructor`, and this runs on unvalidated input.
  const out: RawTaskPaths[] = [];
  for (let i = 0; i < tasks.length; i++)
    out.push(typeof tasks[i] === 'object' && tasks[i] !== null ? (tasks[i] as RawTaskPaths) : {});
  return out;
}

function resolveDataset(spec: string, baseDir: string, path: string, problems: string[]): string {
  const file = isAbsolute(spec) ? spec : resolve(baseDir, spec);
  if (!existsSync(file))
    problems.push(`${path}: file does not exist (got ${JSON.stringify(spec)}, resolved to ${file})`);
  else if (!statSync(file).isFile())
    problems.push(`${path}: is not a file (got ${JSON.stringify(spec)}, resolved to ${file})`);
  return file;
}

function resolveEnvModule(spec: string, baseDir: string, path: string, problems: string[]): string {
  if (spec.startsWith(BUILTIN_PREFIX)) {
    const name = spec.slice(BUILTIN_PREFIX.length);
    const file = BUILTIN_ENVS[name];
    if (file === undefined) {
      problems.push(
        `${path}: unknown built-in environment (got ${JSON.stringify(spec)}; expected one of ${Object.keys(BUILTIN_ENVS)
          .map((n) => BUILTIN_PREFIX + n)
          .join(', ')})`,
      );
      return '';
    }
    return projectModuleUrl(file).href;
  }
  const file = isAbsolute(spec) ? spec : resolve(baseDir, spec);
  if (!existsSync(file)) {
    problems.push(`${path}: module file does not exist (got ${JSON.stringify(spec)}, resolved to ${file})`);
    return '';
  }
  // Importing a device or a FIFO reads it for ever (/dev/zero never ends): the start would hang.
  if (!statSync(file).isFile()) {
    problems.push(`${path}: is not a file (got ${JSON.stringify(spec)}, resolved to ${file})`);
    return '';
  }
  return pathToFileURL(file).href;
}

/**
 * A batch is split as batchSize × weight / Σ weights (coordinator/allocate.ts, the reference's order of
 * operations): weights whose sum times batchSize is no finite double make every share NaN or infinite
 * — regression: `weight: 1e308` spun one task for ever, and two gave batches of 0 groups. Refused
 * here, naming the largest.
 */
function overflowingWeights(config: Pick<ParsedConfig, 'batchSize' | 'tasks'>): string[] {
  const total = config.tasks.reduce((sum, t) => sum + t.weight, 0);
  if (Number.isFinite(config.batchSize * total)) return [];
  let largest = 0;
  config.tasks.forEach((t, i) => {
    if (t.weight > config.tasks[largest].weight) largest = i;
  });
  return [
    `tasks[${largest}].weight: batchSize (${config.batchSize}) × the sum of the tasks' weights overflows a double; weights are ratios between tasks: use small numbers such as 1 and 3 (got ${config.tasks[largest].weight})`,
  ];
}

function formatIssue(issue: z.core.$ZodIssue): string {
  const path = formatPath(issue.path);
  const got = 'input' in issue && issue.code !== 'unrecognized_keys' ? ` (got ${preview(issue.input)})` : '';
  if (issue.code === 'unrecognized_keys') {
    return `${path || '(root)'}: unknown option${issue.keys.length > 1 ? 's' : ''} ${issue.keys.map((k) => JSON.stringify(k)).join(', ')}`;
  }
  return `${path || '(root)'}: ${issue.message}${got}`;
}

function formatPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const key of path) out += typeof key === 'number' ? `[${key}]` : out === '' ? String(key) : `.${String(key)}`;
  return out;
}

/** `llm.url` and policy urls may be one URL or a list. */
export function urlList(url: string | string[]): string[] {
  return Array.isArray(url) ? url : [url];
}

/** Endpoints named by `llm.policies` (beyond the default ones). */
export function policyUrls(config: ResolvedConfig): string[] {
  return Object.values(config.llm.policies).flatMap((p) => (p.url === undefined ? [] : urlList(p.url)));
}

type ShapeSource = { temperature?: number } & Partial<Record<(typeof SAMPLING_SHAPE_KEYS)[number], number>>;

/** The truncating and penalising settings `spec` sets, and only those. */
export function samplingShapeOf(spec: ShapeSource): Omit<SamplingShape, 'temperature'> {
  const out: Omit<SamplingShape, 'temperature'> = {};
  for (const key of SAMPLING_SHAPE_KEYS) if (spec[key] !== undefined) out[key] = spec[key];
  return out;
}

/**
 * What a task's turns are sampled with (its groups' `sampling`): its temperature and settings, and, for
 * each agent whose policy changes any of them, that agent's whole settings — a policy's setting
 * replaces the task's one by one, as the router applies them (llm/router.ts).
 */
export function samplingRecord(
  task: ShapeSource & { temperature: number },
  policies: Record<string, ShapeSource>,
): SamplingRecord {
  const own: SamplingShape = { temperature: task.temperature, ...samplingShapeOf(task) };
  let agents: Record<string, SamplingShape> | undefined;
  for (const [agent, policy] of Object.entries(policies)) {
    const changes = samplingShapeOf(policy);
    if (policy.temperature === undefined && Object.keys(changes).length === 0) continue;
    (agents ??= {})[agent] = { ...own, ...changes, temperature: policy.temperature ?? own.temperature };
  }
  return agents === undefined ? own : { ...own, agents };
}

/**
 * What samples on `url`: the built-in loop's tasks on the default endpoints, and each agent policy on
 * its endpoints (with each task's settings it does not replace).
 */
export function samplingUses(config: ResolvedConfig, url: string): SamplingUse[] {
  const loopTasks = config.tasks.flatMap((task, i) => (task.agent === null ? [{ task, i }] : []));
  const defaults = config.llm.url === null ? null : urlList(config.llm.url);
  const onDefault = defaults === null || defaults.includes(url);
  const fieldsOf = (spec: ShapeSource, at: string): SamplingUse['fields'] =>
    SAMPLING_SHAPE_KEYS.flatMap((key) =>
      spec[key] === undefined ? [] : [{ path: `${at}.${key}`, key, value: spec[key] as number }],
    );
  const uses: SamplingUse[] = [];
  if (onDefault)
    for (const { task, i } of loopTasks)
      uses.push({ where: `tasks[${i}]`, temperature: task.temperature, fields: fieldsOf(task, `tasks[${i}]`) });
  for (const [agent, policy] of Object.entries(config.llm.policies)) {
    if (policy.url === undefined ? !onDefault : !urlList(policy.url).includes(url)) continue;
    const at = `llm.policies.${agent}`;
    const own = fieldsOf(policy, at);
    for (const { task, i } of loopTasks)
      uses.push({
        where: policy.temperature === undefined ? `tasks[${i}]` : at,
        temperature: policy.temperature ?? task.temperature,
        fields: [...fieldsOf(task, `tasks[${i}]`).filter((f) => policy[f.key] === undefined), ...own],
      });
  }
  return uses;
}

/**
 * Whether a task's episodes call the model through the token-trace gateway: a black-box agent's, and
 * a verifiers env server's (which runs the episode itself, env/verifiers.ts).
 */
export function usesGateway(task: { agent: unknown; env: { protocol?: string } | null }): boolean {
  return task.agent !== null || task.env?.protocol === 'verifiers';
}

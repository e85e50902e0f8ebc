/**
 * Every error code the engine uses, each with what it means: one table, as undici keeps its errors.
 * Errors carry one (`RolloutEngineError.code`, typed `ErrorCode`), and so do a FAILED or ABORTED
 * rollout's `error` string (`CODE: message`) and the HTTP APIs' `error.code`: callers branch on codes,
 * never on messages. A new code is a row here first; docs/ERROR-CODES.md is this table
 * (test/error-codes.test.ts checks both ways).
 */
export const ERROR_CODES = {
  // Engine and config
  ERR_INVALID_CONFIG: 'the config (or a CLI flag) has bad fields; the message names each field and value',
  ERR_INVALID_ARGUMENT: 'a call got a bad argument (a train step, a model step, a weight version, an allowed host)',
  ERR_ENGINE_STATE: 'the call does not fit the engine’s state (start() twice, a call before start or after close)',
  ERR_BATCH_STATUS: 'engine.batches() met a batch that is not NORMAL: sync the weights and call getBatch',
  ERR_TRAIN_STEP:
    'getBatch(t) for a step behind the consumer, or more than producer.maxSkippedSteps ahead; nothing moved',
  ERR_PRODUCTION_STALLED: 'production stopped before the batch was complete (memory budget, a shouldContinue hook)',
  ERR_TOO_MANY_FAILED_GROUPS:
    'more groups FAILED since the last batch than producer.maxFailedGroupsPerStep: production stops',
  ERR_CHECKPOINT: 'a checkpoint cannot be written, read or decoded',
  ERR_CHECKPOINT_MISMATCH: 'resumeFrom names a checkpoint written by a run with a different config',
  ERR_WORKER: 'no worker thread can run: workers die while starting, or none could check a task',
  ERR_PROTOCOL: 'bytes between threads, or a msgpack body or checkpoint, do not decode as the protocol says',
  ERR_LISTEN: 'a server the engine ships cannot bind its host and port (the message says why, with the errno)',
  ERR_USAGE: 'the rollout command line is wrong (an unknown command, a missing or bad flag)',
  ERR_OPTIONAL_PACKAGE:
    'a feature needs an optional dependency that is not installed (NATS client, MCP SDK); the message says what to install',
  // Inference
  ERR_LLM_HTTP: 'the inference server answered a status not retried (4xx), or retries ran out on 429 / 5xx',
  ERR_LLM_UNREACHABLE: 'the inference server could not be reached (refused, reset, DNS) through every retry',
  ERR_LLM_TIMEOUT: 'an inference call exceeded llm.timeoutMs',
  ERR_LLM_BAD_REPLY: 'an inference reply is not JSON, not a usable completion, or larger than llm.maxReplyBytes',
  ERR_LLM_ABORTED: 'an inference call was cancelled (a pause that aborts, a shutdown)',
  ERR_LLM_OUTAGE: 'no endpoint answered (an outage) for longer than llm.outageBudgetMs: its groups fail',
  ERR_LLM_MODEL: 'an inference server does not serve llm.model',
  ERR_LLM_API: 'llm.api "tokens" on a server (or the built-in mock’s tokenizer) that cannot take token ids',
  ERR_LLM_FINISH_REASON: 'the server gave a finish reason the engine does not know: the rollout FAILED',
  ERR_CONTEXT_EXCEEDED: 'a rollout’s first prompt does not fit the inference server’s context',
  // Chat model (tokenizer and chat template: token-in calls, the gateway, the mock's vocabulary)
  ERR_CHAT_MODEL: 'the tokenizer or chat template files cannot be loaded',
  ERR_CHAT_TEMPLATE: 'the model’s chat template cannot render these messages',
  // Environments, hooks, agents
  ERR_ENV_HTTP: 'an env server answered a status not retried (4xx), or retries ran out on 5xx',
  ERR_ENV_UNREACHABLE: 'an env server could not be reached (refused, reset, DNS) through every retry',
  ERR_ENV_TIMEOUT:
    'an environment call (factory, reset, getTaskPrompt, step, close) did not settle within tasks[].env.timeoutMs',
  ERR_ENV_CANCELLED:
    'an environment or tool call was pending when a pause or shutdown cancelled in-flight work: ABORTED, its step redone',
  ERR_ENV_BAD_REPLY: 'an environment’s reply is not JSON or not the shape its protocol promises',
  ERR_ENV_STEP_UNCERTAIN: 'a step failed after it may have reached the environment; retried only with dedupeSteps',
  ERR_ENV_TOO_LARGE: 'an env server’s reply exceeded maxResponseBytes',
  ERR_ENV_CLOSED: 'the environment client was closed while a call was pending',
  ERR_ENV_INFRA: 'an env server says the episode failed outside the policy (sandbox, judge, masked sample)',
  ERR_ENV_BAD_ACTION: 'the model’s reply cannot be made into the action a gym-http server takes (env.gym.action)',
  ERR_ENV_REFUSED: 'a verifiers env server refused the request itself (task_data its taskset does not validate)',
  ERR_ENV_EPISODE: 'a verifiers env server ran the episode and reports it failed (ok: false, with its errors)',
  ERR_ENV_POOL_EXHAUSTED: 'no environment actor is available: the task’s actor pool is exhausted or closed',
  ERR_ACTOR_POOL_ABORTED: 'waiting for an environment actor was cancelled',
  ERR_ACTOR_POOL_MISUSE: 'an actor was handed back to a pool it is not out of (twice, or another pool’s)',
  ERR_HOOK_TIMEOUT: 'an episode hook did not settle within tasks[].env.timeoutMs (logged and ignored)',
  ERR_AGENT_BAD_REWARD: 'a black-box agent returned a reward that is not a finite number',
  ERR_AGENT_NO_REWARD: 'a black-box agent returned no reward, and nothing can judge its answer',
  // Step records
  ERR_RECORDS_WRITE: 'step records could not be written; the message counts the records lost',
  ERR_RECORDS_BROKEN: 'a step-record file may end in a torn line that could not be truncated: no more records go to it',
  ERR_RECORDS_CLOSED: 'a record was given to a closed step-record writer',
  ERR_RECORDS_FILE_IN_USE: 'a step-record file already has an open writer in this thread',
  ERR_RECORDS_FORMAT: 'a step-record file has a line that is not a record (file and line named)',
  // Control API
  ERR_BAD_BODY: 'a control API request body is malformed, or a field is bad (named with its value)',
  ERR_BODY_TOO_LARGE: 'a control API request body is over 1 MiB',
  ERR_UNSUPPORTED_MEDIA_TYPE: 'a control API request body is not application/json or application/msgpack',
  ERR_UNAUTHORIZED: 'the control API wants a bearer token, and none or another was given',
  ERR_FORBIDDEN_HOST: 'the request’s Host is not one the control API serves',
  ERR_FORBIDDEN_ORIGIN: 'the request comes from a web page’s origin the control API does not allow',
  ERR_NOT_FOUND: 'no control API route for this path',
  ERR_METHOD_NOT_ALLOWED: 'the control API route does not take this method',
  ERR_RATE_LIMITED: 'too many control API requests from one address',
  ERR_INTERNAL: 'an unexpected failure while serving a control API request',
  // Token-trace gateway
  ERR_GATEWAY_BAD_REQUEST: 'a gateway request field has the wrong type or value (`param` names it)',
  ERR_GATEWAY_TEMPLATE:
    'the model’s chat template cannot render these messages (ERR_CHAT_TEMPLATE, as the gateway answers it)',
  ERR_GATEWAY_PREFIX_MISMATCH: 'with sideCalls "refuse": the conversation no longer starts with what the session sent',
  ERR_GATEWAY_TOO_MANY_SIDE_CALLS: 'the session already keeps maxSideCalls side calls',
  ERR_GATEWAY_CONTEXT_LENGTH: 'the prompt fills the context window',
  ERR_GATEWAY_UNKNOWN_SESSION: 'no live gateway session has that id (never seen, stitched, deleted or expired)',
  ERR_GATEWAY_NOT_FOUND: 'no gateway route for this path',
  ERR_GATEWAY_METHOD: 'the gateway route does not take this method',
  ERR_GATEWAY_SESSION_BUSY: 'the session already has a call in flight (turns are sequential)',
  ERR_GATEWAY_BODY_TOO_LARGE: 'a gateway request body is over maxBodyBytes',
  ERR_GATEWAY_TOO_MANY_SESSIONS: 'maxSessions live sessions already hold traces',
  ERR_GATEWAY_STITCH: 'the traces broke an invariant while stitching (a bug, never the client’s)',
  ERR_GATEWAY_INTERNAL: 'an unexpected failure inside the gateway',
  ERR_GATEWAY_MODEL:
    'the gateway’s tokenizer or chat template files cannot be loaded (ERR_CHAT_MODEL, as it answers it)',
  ERR_GATEWAY_CLOSING: 'the gateway is shutting down',
  ERR_BACKEND_HTTP: 'the gateway’s backend answered an error status',
  ERR_BACKEND_UNREACHABLE: 'the gateway’s backend could not be reached',
  ERR_BACKEND_BAD_REPLY: 'the gateway’s backend answered something that is not a generation',
  ERR_BACKEND_TIMEOUT: 'the gateway’s backend did not answer within its timeout',
  ERR_BACKEND_ABORTED: 'the backend call was cancelled (the client went away, close())',
  // Mock inference server
  ERR_INVALID_OPTION: 'a mock inference server option is unknown or has a bad value',
  // Worker nodes (NATS JetStream)
  ERR_NATS_CONNECT: 'the NATS server cannot be reached, or has no JetStream (`nats-server -js`)',
  ERR_NATS: 'a JetStream or KV call failed after the connection was up (stream, consumer, bucket)',
  ERR_NATS_TOO_LARGE: 'a group or a result is larger than 64 chunks of the NATS server’s max_payload',
  ERR_NATS_RUN_IN_USE: 'another live coordinator holds this `workers.nats.run` on the NATS server',
} as const satisfies Record<`ERR_${string}`, string>;

export type ErrorCode = keyof typeof ERROR_CODES;

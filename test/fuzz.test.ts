/**
 * Fuzz tests (fast-check): whatever a user, a trainer, an inference server, an environment or a peer
 * sends, the engine answers with a named error — never a crash, never an error of another kind.
 *
 * Bounded: ~200 runs per property, the whole file in well under 15 s. Runs are reproducible: the seed
 * is fixed unless FUZZ_SEED is set, and FUZZ_RUNS sets the runs per property for a longer hunt
 * (`FUZZ_SEED=$RANDOM FUZZ_RUNS=5000 node --import tsx --test test/fuzz.test.ts`). fast-check prints
 * the seed, path and shrunk counterexample of any failure; FUZZ_DEBUG=1 logs each control API probe.
 *
 * Inputs that hit a finding already pinned by a `todo` test are skipped (fc.pre) with a comment saying
 * which, so each property keeps checking everything else.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import fc from 'fast-check';
import { request } from 'undici';
import { resolveConfig } from '../src/config.ts';
import { checkAgentPrompts, checkStepResult, checkTaskPrompt, EnvReplyError } from '../src/env/replies.ts';
import { createEngine, type ControlServer, type Engine } from '../src/index.ts';
import { LlmError } from '../src/llm/errors.ts';
import { parseChatReply } from '../src/llm/reply.ts';
import { decodeFromPeer, decodeMessage, encodeForPeer, encodeMessage } from '../src/protocol/codec.ts';
import { ConfigError, ProtocolError } from '../src/protocol/errors.ts';
import { PROTOCOL_VERSION, type WireMessage } from '../src/protocol/messages.ts';

const SEED = process.env.FUZZ_SEED === undefined ? 20261122 : Number(process.env.FUZZ_SEED);
const RUNS = Math.max(1, Number(process.env.FUZZ_RUNS ?? 200));
const params = (numRuns = RUNS): fc.Parameters<unknown> => ({ seed: SEED, numRuns });

/** Values that sit on the edges validators get wrong: signs, non-integers, huge, empty, wrong types. */
const EDGE_VALUES: unknown[] = [
  -1,
  0,
  1,
  2,
  0.5,
  -0,
  1e21,
  2 ** 31,
  2 ** 53,
  Number.MAX_SAFE_INTEGER + 2,
  NaN,
  Infinity,
  -Infinity,
  '',
  ' ',
  '0',
  'x',
  '\u0000',
  'builtin:nope',
  'http://',
  'ftp://host',
  'file:///etc/passwd',
  'http://127.0.0.1:1/v1',
  null,
  undefined,
  true,
  false,
  [],
  [1],
  {},
  { a: 1 },
  [null],
  10n,
];
const edge = fc.constantFrom(...EDGE_VALUES);
/**
 * Any JS value a library user could pass, edge values weighted in. BigInts and null-prototype objects
 * come from separate arbitraries: together they crash the error formatter (a known finding, pinned by
 * the todo test "formats any value in an error message…" below), which would mask everything else.
 */
const anyValue = fc.oneof(
  { weight: 2, arbitrary: edge },
  { weight: 2, arbitrary: fc.anything({ maxDepth: 2, withBigInt: true, withSparseArray: true }) },
  { weight: 1, arbitrary: fc.anything({ maxDepth: 2, withNullPrototype: true }) },
);

/**
 * True when `value`, or any value inside it, is one the error formatter cannot show: JSON.stringify
 * throws (a BigInt inside) and so does String() (a null-prototype object, a non-callable `toString`).
 * That is the pinned preview() finding; such inputs are skipped so the properties check the rest.
 */
function formatterCrasher(value: unknown): boolean {
  const seen = new Set<unknown>();
  const unshowable = (v: unknown): boolean => {
    try {
      JSON.stringify(v);
      return false;
    } catch {
      try {
        String(v);
        return false;
      } catch {
        return true;
      }
    }
  };
  const walk = (v: unknown): boolean => {
    if (typeof v !== 'object' || v === null || seen.has(v)) return false;
    seen.add(v);
    return unshowable(v) || Object.values(v).some(walk);
  };
  return unshowable(value) || walk(value);
}

function containsBigInt(value: unknown, seen = new Set<unknown>()): boolean {
  if (typeof value === 'bigint') return true;
  if (typeof value !== 'object' || value === null || seen.has(value)) return false;
  seen.add(value);
  return Object.values(value).some((v) => containsBigInt(v, seen));
}

// ── config ─────────────────────────────────────────────────────────────────────────────────────────

/** A config that resolves, touching most sections, so mutations land on every kind of field. */
const VALID_CONFIG = {
  seed: 3,
  batchSize: 4,
  modelStep: 0,
  tasks: [
    {
      name: 'local',
      env: { module: 'builtin:arithmetic', params: { terms: 2 } },
      groupSize: 2,
      weight: 1,
      maxSteps: 1,
      messageCut: 3,
      maxTokens: 64,
      temperature: 1,
    },
    {
      name: 'remote',
      env: {
        http: { urls: ['http://127.0.0.1:9000'], name: 'guess-number', timeoutMs: 1000, dedupeSteps: true },
        poolSize: 4,
      },
      groupSize: 4,
    },
  ],
  llm: {
    url: ['http://127.0.0.1:8000/v1'],
    model: 'm',
    timeoutMs: 1000,
    retries: 2,
    retryBackoffMs: 5,
    sessionPath: '/s/{session}',
    policies: { judge: { model: 'j', maxTokens: 8 } },
  },
  mock: { latencyMs: 0, mistakeRate: 0.3 },
  workers: { threads: 2, groupsPerWorker: 8 },
  producer: {
    strategy: 'async',
    overSampleThreshold: 0.25,
    partialRollout: true,
    maxStaleness: 1,
    syncWeightsInterval: 2,
    tailBatchTriggerSize: -1,
    filter: 'drop-equal-rewards',
  },
  pause: { mode: 'drain', resignalIntervalMs: 100, timeoutMs: 1000 },
  gateway: { backend: 'sglang', sessionTtlMs: 1000 },
  runDir: null,
  logLevel: 'silent',
};

/** Every path (key list) in a JSON-like value, containers included. */
function pathsOf(value: unknown, prefix: (string | number)[] = []): (string | number)[][] {
  const out: (string | number)[][] = [prefix];
  if (Array.isArray(value)) value.forEach((v, i) => out.push(...pathsOf(v, [...prefix, i])));
  else if (typeof value === 'object' && value !== null)
    for (const [k, v] of Object.entries(value)) out.push(...pathsOf(v, [...prefix, k]));
  return out;
}
const CONFIG_PATHS = pathsOf(VALID_CONFIG).filter((p) => p.length > 0);

type Mutation =
  | { kind: 'set'; path: (string | number)[]; value: unknown }
  | { kind: 'delete'; path: (string | number)[] }
  | { kind: 'extra'; path: (string | number)[]; key: string; value: unknown };

const mutation: fc.Arbitrary<Mutation> = fc.oneof(
  fc.record({ kind: fc.constant('set' as const), path: fc.constantFrom(...CONFIG_PATHS), value: anyValue }),
  fc.record({ kind: fc.constant('delete' as const), path: fc.constantFrom(...CONFIG_PATHS) }),
  fc.record({
    kind: fc.constant('extra' as const),
    path: fc.constantFrom([], ...CONFIG_PATHS),
    key: fc.oneof(fc.constantFrom('__proto__', 'constructor', 'toString', 'batchsize', ''), fc.string()),
    value: anyValue,
  }),
);

function mutate(base: unknown, mutations: Mutation[]): unknown {
  const root = structuredClone(base) as Record<string, unknown>;
  for (const m of mutations) {
    let parent: unknown = root;
    const path = m.kind === 'extra' ? [...m.path, m.key] : m.path;
    for (const key of path.slice(0, -1)) {
      if (typeof parent !== 'object' || parent === null) break;
      parent = (parent as Record<string | number, unknown>)[key];
    }
    if (typeof parent !== 'object' || parent === null) continue; // an earlier mutation replaced a container
    if (Object.getPrototypeOf(parent) === null) continue; // …with a null-prototype object: see anyValue
    if (m.kind === 'extra' && Array.isArray(parent) && m.key === 'constructor') continue; // pinned by a todo test below
    const last = path.at(-1)!;
    // defineProperty: `__proto__` becomes an own key, as JSON.parse of a config file would make it.
    if (m.kind === 'delete') delete (parent as Record<string | number, unknown>)[last];
    else Object.defineProperty(parent, last, { value: m.value, enumerable: true, writable: true, configurable: true });
  }
  return root;
}

const TOP_LEVEL_KEYS = Object.keys(VALID_CONFIG).concat('recordSteps', 'checkpointEachBatch', 'resume', 'resumeFrom');
/** `(root)`, `LOG_LEVEL`, or a path into the config that starts with one of its top-level fields. */
// Lazy after the first key: a record key (llm.policies, env.params) may itself hold ": ".
const ISSUE_PATH = new RegExp(`^(\\(root\\)|LOG_LEVEL|(${TOP_LEVEL_KEYS.join('|')})([.[].*?)?): `);

/** resolveConfig returns, or throws a ConfigError whose every issue names a field and the value. */
function checkResolve(input: unknown, baseDir: string): void {
  let error: unknown;
  try {
    resolveConfig(input, { baseDir });
    return;
  } catch (err) {
    error = err;
  }
  assert.ok(
    error instanceof ConfigError,
    `resolveConfig threw ${(error as Error)?.name}: ${(error as Error)?.message}`,
  );
  assert.equal(error.code, 'ERR_INVALID_CONFIG');
  assert.ok(error.issues.length > 0, 'a ConfigError names at least one problem');
  for (const issue of error.issues) {
    assert.match(issue, ISSUE_PATH, `issue does not start with a field path: ${issue}`);
    // Unknown keys are named themselves; every other issue shows the value it got.
    assert.ok(/\(got /.test(issue) || /: unknown options? "/.test(issue), `issue does not show the value: ${issue}`);
  }
}

describe('fuzz: resolveConfig', () => {
  // Relative module and dataset paths resolve here; resolveConfig only checks that files exist.
  const baseDir = join(tmpdir(), `fuzz-config-${process.pid}-absent`);

  it('accepts the base config the mutations start from', () => {
    checkResolve(VALID_CONFIG, baseDir);
    assert.doesNotThrow(() => resolveConfig(VALID_CONFIG, { baseDir }));
  });

  it('answers a mutated config (fields replaced, deleted or added) with a config or a ConfigError naming each field and value', () => {
    fc.assert(
      fc.property(fc.array(mutation, { minLength: 1, maxLength: 4 }), (mutations) => {
        const input = mutate(VALID_CONFIG, mutations);
        fc.pre(!formatterCrasher(input));
        checkResolve(input, baseDir);
      }),
      params(),
    );
  });

  it('refuses a tasks array carrying an own `constructor` property with a ConfigError', () => {
    // Never from a JSON file; a library caller can build it.
    const tasks = Object.assign([{ name: 'a', env: { module: 'builtin:arithmetic' } }], { constructor: -1 });
    assert.throws(() => resolveConfig({ seed: 'x', tasks }, { baseDir }), ConfigError);
  });

  it('answers any value at all, and any object of the top-level fields, with a config or a ConfigError', () => {
    const topLevel = fc.dictionary(fc.constantFrom(...TOP_LEVEL_KEYS), anyValue, { maxKeys: 5 });
    fc.assert(
      fc.property(fc.oneof(anyValue, topLevel), (input) => {
        fc.pre(!formatterCrasher(input));
        checkResolve(input, baseDir);
      }),
      params(),
    );
  });
});

// ── inference replies ──────────────────────────────────────────────────────────────────────────────

/** A vLLM-shaped reply like the mock's, with ids, logprobs and a weight version. */
const VALID_REPLY = {
  id: 'chatcmpl-1',
  object: 'chat.completion',
  model: 'm',
  prompt_token_ids: [1, 2, 3],
  choices: [
    {
      index: 0,
      message: { role: 'assistant', content: '42' },
      finish_reason: 'stop',
      token_ids: [19, 17],
      logprobs: {
        content: [
          { token: '4', logprob: -0.1 },
          { token: '2', logprob: -0.2 },
        ],
      },
    },
  ],
  usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
  metadata: { weight_version: 2 },
};
const REPLY_PATHS = pathsOf(VALID_REPLY).filter((p) => p.length > 0);
const replyMutation: fc.Arbitrary<Mutation> = fc.oneof(
  fc.record({ kind: fc.constant('set' as const), path: fc.constantFrom(...REPLY_PATHS), value: anyValue }),
  fc.record({ kind: fc.constant('delete' as const), path: fc.constantFrom(...REPLY_PATHS) }),
);
/** The fields parseChatReply reads: its errors name one of them. */
const REPLY_FIELD =
  /^inference reply: (reply|choices(\[0\](\.message(\.content)?|\.finish_reason|\.token_ids(\[\d+\])?|\.prompt_token_ids(\[\d+\])?|\.logprobs\.content(\[\d+\]\.(logprob|id))?)?)?|prompt_token_ids(\[\d+\])?|metadata\.weight_version) must be .* \(got [^]*\)$|^choices\[0\]\.logprobs\.content has \d+ entries but choices\[0\]\.token_ids has \d+$/;

describe('fuzz: inference replies (parseChatReply)', () => {
  it('parses the reference reply', () => {
    const result = parseChatReply(VALID_REPLY);
    assert.equal(result.content, '42');
    assert.equal(result.weightVersion, '2');
  });

  it('returns a usable result or throws ERR_LLM_BAD_REPLY naming the field, for mutated and arbitrary replies', () => {
    const reply = fc.oneof(
      fc.array(replyMutation, { minLength: 1, maxLength: 3 }).map((ms) => mutate(VALID_REPLY, ms)),
      anyValue,
      fc.jsonValue({ maxDepth: 4 }),
    );
    fc.assert(
      fc.property(reply, (body) => {
        fc.pre(!formatterCrasher(body));
        let result;
        try {
          result = parseChatReply(body);
        } catch (err) {
          assert.ok(
            err instanceof LlmError,
            `parseChatReply threw ${(err as Error)?.name}: ${(err as Error)?.message}`,
          );
          assert.equal(err.code, 'ERR_LLM_BAD_REPLY');
          assert.match(err.message, REPLY_FIELD);
          return;
        }
        // What the agent loop relies on when the parse succeeded.
        assert.equal(typeof result.content, 'string');
        assert.ok(typeof result.finishReason === 'string' && result.finishReason.length > 0);
        assert.ok(result.responseIds === null || result.responseIds instanceof Int32Array);
        assert.ok(result.promptIds === null || result.promptIds instanceof Int32Array);
        assert.ok(result.logprobs === null || result.logprobs instanceof Float32Array);
        if (result.responseIds !== null && result.logprobs !== null)
          assert.equal(result.responseIds.length, result.logprobs.length);
        assert.ok(result.weightVersion === null || typeof result.weightVersion === 'string');
      }),
      params(),
    );
  });
});

// ── environment replies ────────────────────────────────────────────────────────────────────────────

const message = fc.record(
  {
    role: fc.oneof(fc.constantFrom('system', 'user', 'assistant', 'tool'), anyValue),
    content: fc.oneof(fc.string(), anyValue),
  },
  { requiredKeys: [] },
);
const stepReply = fc.oneof(
  fc.record(
    {
      observation: anyValue,
      reward: fc.oneof(
        fc.double(),
        fc.dictionary(fc.string(), fc.oneof(fc.double(), anyValue), { maxKeys: 3 }),
        anyValue,
      ),
      terminated: fc.oneof(fc.boolean(), anyValue),
      truncated: fc.oneof(fc.boolean(), anyValue),
      info: fc.oneof(fc.dictionary(fc.string(), anyValue, { maxKeys: 3 }), anyValue),
    },
    { requiredKeys: [] },
  ),
  anyValue,
);
const prompts = fc.oneof(
  fc.array(fc.oneof(message, anyValue), { maxLength: 4 }),
  fc.dictionary(fc.string(), fc.oneof(fc.array(message, { maxLength: 3 }), anyValue), { maxKeys: 3 }),
  anyValue,
);

/** Runs `fn`; passes when it returns, or throws an EnvReplyError whose message names `field`. */
function returnsOrEnvError(fn: () => unknown, field: RegExp): void {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof EnvReplyError, `threw ${(err as Error)?.name}: ${(err as Error)?.message}`);
    assert.equal(err.code, 'ERR_ENV_BAD_REPLY');
    assert.match(err.message, field);
    assert.match(err.message, /\(got [^]*\)$/);
  }
}

describe('fuzz: environment replies', () => {
  it('checkStepResult returns a typed result or throws EnvReplyError naming the step() field', () => {
    fc.assert(
      fc.property(stepReply, (reply) => {
        fc.pre(!formatterCrasher(reply));
        returnsOrEnvError(() => {
          const out = checkStepResult(reply);
          // A result that passes must be usable as is: the rollout sums rewards and branches on the flags.
          assert.equal(typeof out.terminated, 'boolean');
          assert.equal(typeof out.truncated, 'boolean');
          if (typeof out.reward === 'number') assert.ok(Number.isFinite(out.reward));
          else for (const r of Object.values(out.reward)) assert.ok(Number.isFinite(r));
        }, /^environment step\(\)(\.reward(\..*)?|\.terminated|\.truncated|\.info)? must be /);
      }),
      params(),
    );
  });

  it('checkAgentPrompts and checkTaskPrompt return messages or throw EnvReplyError naming the getTaskPrompt() field', () => {
    fc.assert(
      fc.property(prompts, (value) => {
        fc.pre(!formatterCrasher(value));
        returnsOrEnvError(() => checkAgentPrompts(value), /^environment getTaskPrompt\(\)/);
        returnsOrEnvError(() => checkTaskPrompt(value), /^environment getTaskPrompt\(\)/);
      }),
      params(),
    );
  });
});

describe('error messages for values JSON cannot show', () => {
  // A null-prototype object holding a BigInt: what an in-process environment or a library caller can
  // hand over (never JSON from the wire). preview() falls back to String(value) when JSON.stringify
  // throws, and String() of a null-prototype object throws TypeError itself.
  const value = (): unknown => Object.assign(Object.create(null) as object, { n: 1n });
  // Same failure through a plain object whose own `toString` is not a function.
  const shadowed = (): unknown => ({ toString: false, n: 1n });
  it('formats any value in an error message, so each validator still throws its own named error', () => {
    assert.throws(() => resolveConfig({ tasks: value() }), ConfigError);
    assert.throws(() => parseChatReply({ choices: value() }), LlmError);
    assert.throws(() => checkStepResult({ reward: [value()] }), EnvReplyError);
    assert.throws(() => checkTaskPrompt(value()), EnvReplyError);
    assert.throws(() => resolveConfig({ seed: shadowed() }), ConfigError);
  });
});

// ── msgpack from peers ─────────────────────────────────────────────────────────────────────────────

const GROUP_MESSAGE: WireMessage = {
  v: PROTOCOL_VERSION,
  type: 'group-result',
  keptTurns: [],
  workerId: 1,
  group: {
    id: 't/0',
    taskName: 't',
    status: 'COMPLETED',
    error: null,
    sample: { promptIndex: 0, drawIndex: 0, seed: 1, envParams: {} },
    rollouts: [
      { id: 't/0/0', turns: [{ responseIds: new Int32Array([1, 2]), logprobs: new Float32Array([-0.1, -0.2]) }] },
    ],
  } as never,
};
const VALID_BYTES = encodeMessage(GROUP_MESSAGE);

/** Byte strings: random, valid messages bit-flipped or cut short, and msgpack of random values. */
const peerBytes = fc.oneof(
  fc.uint8Array({ maxLength: 96 }),
  fc
    .tuple(
      fc.array(fc.tuple(fc.nat(), fc.integer({ min: 1, max: 255 })), { minLength: 1, maxLength: 6 }),
      fc.option(fc.nat()),
    )
    .map(([flips, cut]) => {
      const bytes = VALID_BYTES.slice();
      for (const [at, xor] of flips) bytes[at % bytes.length] ^= xor;
      return cut === null ? bytes : bytes.subarray(0, cut % bytes.length);
    }),
  fc
    .record(
      {
        v: fc.oneof(fc.constant(PROTOCOL_VERSION), anyValue),
        type: fc.oneof(fc.constantFrom('run-group', 'group-result'), anyValue),
      },
      { requiredKeys: [] },
    )
    .map((v) => {
      try {
        return encodeForPeer(v);
      } catch {
        return new Uint8Array([0xc1]); // a value msgpack cannot encode: fall back to the never-used byte
      }
    }),
);

/** msgpack whose `v` or `type` decodes to a BigInt (an int64 field): the known decodeMessage finding below. */
function bigintEnvelope(bytes: Uint8Array): boolean {
  try {
    const value = decodeFromPeer(bytes) as { v?: unknown; type?: unknown } | null;
    return typeof value === 'object' && value !== null && (containsBigInt(value.v) || containsBigInt(value.type));
  } catch {
    return false;
  }
}

describe('fuzz: msgpack from peers', () => {
  it('decodes the reference message', () => {
    assert.equal(decodeMessage(VALID_BYTES).type, 'group-result');
  });

  it('decodeMessage returns a message with a known type or throws ProtocolError, for random and corrupted bytes', () => {
    fc.assert(
      fc.property(peerBytes, (bytes) => {
        fc.pre(!bigintEnvelope(bytes));
        try {
          const message = decodeMessage(bytes);
          assert.equal(message.v, PROTOCOL_VERSION);
          assert.ok(message.type === 'run-group' || message.type === 'group-result');
        } catch (err) {
          assert.ok(err instanceof ProtocolError, `threw ${(err as Error)?.name}: ${(err as Error)?.message}`);
          assert.equal(err.code, 'ERR_PROTOCOL');
        }
      }),
      params(),
    );
  });

  it('refuses an envelope whose version is an int64 with a ProtocolError', () => {
    // {"v": int64 1}: what a msgpack library that always writes 64-bit ints sends.
    const bytes = Uint8Array.from([0x81, 0xa1, 0x76, 0xd3, 0, 0, 0, 0, 0, 0, 0, 1]);
    assert.throws(() => decodeMessage(bytes), ProtocolError);
  });

  it('decodeFromPeer returns a value or throws ProtocolError, for random and corrupted bytes', () => {
    fc.assert(
      fc.property(peerBytes, (bytes) => {
        try {
          decodeFromPeer(bytes);
        } catch (err) {
          assert.ok(err instanceof ProtocolError, `threw ${(err as Error)?.name}: ${(err as Error)?.message}`);
          assert.equal(err.code, 'ERR_PROTOCOL');
        }
      }),
      params(),
    );
  });
});

// ── control API bodies ─────────────────────────────────────────────────────────────────────────────

/** Codes the control API documents; anything else (a 500, a code from fs or zod) is a finding. */
const STABLE_CODES = new Set([
  'ERR_BAD_BODY',
  'ERR_BODY_TOO_LARGE',
  'ERR_ENGINE_STATE',
  'ERR_INVALID_ARGUMENT',
  'ERR_CHECKPOINT',
  'ERR_RATE_LIMITED',
  'ERR_UNSUPPORTED_MEDIA_TYPE',
  'ERR_TRAIN_STEP',
]);
const ROUTES = ['/batch', '/resume', '/checkpoint'] as const;
type Route = (typeof ROUTES)[number];

interface Probe {
  route: Route;
  contentType: string | null;
  body: Uint8Array;
}

/**
 * Bodies that hit a finding pinned by a todo test below; skipped here so the property keeps
 * checking everything else: an int64 in a msgpack body (500), a modelStep beyond 2^53 (500).
 */
function knownFinding(probe: Probe): boolean {
  let body: unknown;
  try {
    body =
      probe.contentType === 'application/msgpack'
        ? decodeFromPeer(probe.body)
        : JSON.parse(Buffer.from(probe.body).toString('utf8'));
  } catch {
    return false;
  }
  if (probe.contentType === 'application/msgpack' && containsBigInt(body)) return true;
  const modelStep = (body as { modelStep?: unknown } | null)?.modelStep;
  return (
    probe.route === '/resume' &&
    typeof modelStep === 'number' &&
    Number.isInteger(modelStep) &&
    !Number.isSafeInteger(modelStep)
  );
}

describe('fuzz: control API bodies against a running engine', () => {
  let engine: Engine;
  let server: ControlServer;
  // Named now (the path arbitraries below use it), created in before().
  const dir = join(tmpdir(), `fuzz-control-${process.pid}`);
  const cwd = process.cwd();
  before(async () => {
    mkdirSync(dir, { recursive: true });
    engine = createEngine({
      logLevel: 'silent',
      batchSize: 2,
      workers: { threads: 1, groupsPerWorker: 4 },
      tasks: [{ name: 'arith', env: { module: 'builtin:arithmetic' }, groupSize: 2, maxSteps: 1, maxTokens: 32 }],
      runDir: dir, // where POST /checkpoint paths resolve
    });
    await engine.start();
    // The rate limit has its own tests; here it would only turn bodies into 429s.
    server = await engine.listen({ port: 0, rateLimitPerSecond: 1e6 });
    // One batch first: the worker is up (it resolves `--import tsx` against the cwd at start), then a
    // relative checkpoint path from a random document lands in the scratch directory, not the repository.
    await engine.getBatch();
    process.chdir(dir);
  });
  after(async () => {
    process.chdir(cwd);
    await server?.close();
    await engine?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  async function send(probe: Probe): Promise<{ status: number; text: string; type: string }> {
    const res = await request(`${server.url}${probe.route}`, {
      method: 'POST',
      body: Buffer.from(probe.body),
      headers: probe.contentType === null ? {} : { 'content-type': probe.contentType },
    });
    return { status: res.statusCode, text: await res.body.text(), type: String(res.headers['content-type'] ?? '') };
  }

  const post = (route: Route, value: unknown, contentType = 'application/json') =>
    send({
      route,
      contentType,
      body:
        contentType === 'application/msgpack'
          ? encodeForPeer(value)
          : new Uint8Array(Buffer.from(JSON.stringify(value))),
    });

  /** A JSON error with a documented code and a 4xx, or a 200 whose body fits the route. */
  function checkAnswer(probe: Probe, answer: { status: number; text: string; type: string }): void {
    const where = `${probe.route} ${probe.contentType} ${JSON.stringify(Buffer.from(probe.body).toString('latin1').slice(0, 120))} → ${answer.status} ${answer.text.slice(0, 300)}`;
    assert.match(answer.type, /^application\/json/, where);
    const json = JSON.parse(answer.text) as Record<string, any>;
    if (answer.status === 200) {
      if (probe.route === '/batch')
        assert.ok(
          ['NORMAL', 'EXPIRED_BATCH', 'UPDATE_WEIGHT_AND_ABORT'].includes(json.status) &&
            Number.isInteger(json.trainStep),
          where,
        );
      if (probe.route === '/resume') assert.ok(json.resumed === true && Number.isInteger(json.modelStep), where);
      if (probe.route === '/checkpoint') assert.ok(typeof json.path === 'string' && json.bytes > 0, where);
      return;
    }
    assert.ok(answer.status >= 400 && answer.status < 500, `not a 4xx: ${where}`);
    assert.equal(typeof json.error?.message, 'string', where);
    assert.ok(STABLE_CODES.has(json.error?.code), `undocumented code ${json.error?.code}: ${where}`);
  }

  const utf8 = (text: string) => new Uint8Array(Buffer.from(text, 'utf8'));
  /** Field values as JSON text, so 1e999 (Infinity), 1.0, "2" and 2^53 + 1 all reach the server. */
  const numberText = fc.oneof(
    fc.constantFrom(
      '1',
      '2',
      '0',
      '-1',
      '1.0',
      '1.5',
      '1e0',
      '1e999',
      '-1e999',
      '2147483647',
      '9007199254740993',
      '1e21',
      '"2"',
      'true',
      'null',
      '[]',
      '{}',
      '[1]',
      '0x10',
      '01',
    ),
    fc.integer({ min: -5, max: 1_000_000 }).map(String),
    fc.jsonValue({ maxDepth: 1 }).map((v) => JSON.stringify(v)),
  );
  // Checkpoint names in the run dir (the scratch directory), always writable; '' and absolute paths are refused.
  const safePath = fc
    .oneof(
      fc.constantFrom('', 'ck.ckpt', join(dir, 'ck.ckpt')),
      fc.string({ minLength: 1, maxLength: 12 }).map((name) => `p-${name.replace(/[/\\\0.]/g, '_')}.ckpt`),
    )
    .map((p) => JSON.stringify(p));
  const fieldBody = fc.oneof(
    fc.tuple(fc.constantFrom('trainStep', 'modelStep'), numberText).map(([k, v]) => `{"${k}": ${v}}`),
    fc.oneof(safePath, numberText).map((v) => `{"path": ${v}}`),
    fc.constantFrom(
      '{}',
      '{"trainStep": 1, "trainStep": "x"}',
      '{"__proto__": {"modelStep": 1}}',
      '{"constructor": {"prototype": {"path": "x"}}}',
    ),
  );
  const jsonText = fc.oneof(
    fieldBody,
    fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.stringify(v)),
    fc.string({ maxLength: 40 }),
    fc.constantFrom('', ' ', 'null', '[]', '"x"', '{', '{"trainStep":', '\uFEFF{}', '{"trainStep": 1}garbage'),
  );
  const probe: fc.Arbitrary<Probe> = fc.oneof(
    {
      weight: 5,
      arbitrary: fc.record({
        route: fc.constantFrom(...ROUTES),
        contentType: fc.constantFrom('application/json', null, 'text/plain', 'application/json; charset=latin1'),
        body: jsonText.map(utf8),
      }),
    },
    {
      weight: 2,
      arbitrary: fc.record({
        route: fc.constantFrom(...ROUTES),
        contentType: fc.constantFrom('application/msgpack', 'application/json', null),
        body: fc.uint8Array({ maxLength: 64 }),
      }),
    },
    {
      weight: 2,
      arbitrary: fc.record({
        route: fc.constantFrom(...ROUTES),
        contentType: fc.constant('application/msgpack'),
        // Structured msgpack: trainStep / modelStep values of every type, and random documents.
        body: fc
          .oneof(
            fc.dictionary(fc.constantFrom('trainStep', 'modelStep'), anyValue, { maxKeys: 2 }),
            fc.jsonValue({ maxDepth: 2 }),
          )
          .map((v) => {
            try {
              return encodeForPeer(v);
            } catch {
              return new Uint8Array([0xc1]); // msgpack cannot encode it: send the never-used byte instead
            }
          }),
      }),
    },
  );

  it('answers every body with a documented 4xx error or a 200, and keeps answering /health', async () => {
    await fc.assert(
      fc.asyncProperty(probe, async (p) => {
        fc.pre(!knownFinding(p));
        checkAnswer(p, await send(p));
        const health = await request(`${server.url}/health`);
        assert.equal(health.statusCode, 200);
        assert.deepEqual(await health.body.json(), { status: 'ok' });
      }),
      params(),
    );
    // Production still works after the barrage (the engine state is not wedged).
    const batch = await engine.getBatch();
    assert.equal(batch.status, 'NORMAL');
  });

  it('refuses a body over the limit with 413 ERR_BODY_TOO_LARGE', async () => {
    const big = new Uint8Array(1024 * 1024 + 1).fill(0x20);
    for (const route of ROUTES) {
      const answer = await send({ route, contentType: 'application/json', body: big });
      assert.equal(answer.status, 413);
      assert.equal(JSON.parse(answer.text).error.code, 'ERR_BODY_TOO_LARGE');
    }
  });

  it('answers an int64 in a msgpack body like the same number in JSON, not with a 500', async () => {
    for (const [route, body] of [
      ['/batch', { trainStep: 5n }],
      ['/resume', { modelStep: 2n ** 40n }],
    ] as const) {
      const answer = await post(route, body, 'application/msgpack');
      assert.ok(answer.status < 500, `${route}: ${answer.status} ${answer.text}`);
    }
  });

  it('answers a checkpoint path it cannot write with a 4xx and a documented code, leaving no temporary file', async () => {
    const leftover = join(dir, `taken.ckpt.tmp-${process.pid}`);
    mkdirSync(join(dir, 'taken.ckpt'), { recursive: true }); // a directory where the file would go
    try {
      for (const path of [join(dir, 'missing', 'engine.ckpt'), 'taken.ckpt', 'a\0b.ckpt']) {
        const answer = await post('/checkpoint', { path });
        const json = JSON.parse(answer.text);
        assert.ok(
          answer.status >= 400 && answer.status < 500 && STABLE_CODES.has(json.error?.code),
          `${JSON.stringify(path)} → ${answer.status} ${answer.text}`,
        );
      }
      assert.equal(existsSync(leftover), false, `left ${leftover} behind`);
    } finally {
      rmSync(leftover, { force: true });
    }
  });

  it('refuses a model step beyond int32 with 400 (steps are stored as int32 per token) and leaves the engine as it was', async () => {
    const before = (await engine.stats()).modelStep;
    const answer = await post('/resume', { modelStep: 2 ** 31 });
    assert.equal(answer.status, 400, answer.text);
    assert.match(
      JSON.parse(answer.text).error.message,
      /modelStep must be an integer in \[0, 2147483647\] \(got 2147483648\)/,
    );
    assert.equal((await engine.stats()).modelStep, before);
  });

  it('refuses a model step beyond 2^53 with 400 and leaves the engine as it was', async () => {
    const before = (await engine.stats()).modelStep;
    const answer = await post('/resume', { modelStep: 1e21 });
    assert.equal(answer.status, 400, answer.text);
    assert.equal((await engine.stats()).modelStep, before);
  });
});

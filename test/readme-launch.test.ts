/**
 * The README's launch commands for vLLM, SGLang and llama.cpp are copied as they stand, so each name in
 * them must be one the server really has. test/fixtures/server-launch-facts.json cites, per server, every
 * launch flag, environment variable, route (with its body and query keys) and server-side field the
 * section "With vLLM / SGLang / llama.cpp" names — the file, the commit read and the identifier there:
 *   vLLM    vllm/engine/arg_utils.py @99d7eb5d6a512cfcc5a2b104f24ebf2d6cda772b (--logprobs-mode,
 *           --scheduling-policy), vllm/config/aux_output.py @09155aece6a767b6a816e03a503b08b92cc4bc8e,
 *           vllm/entrypoints/openai/api_server.py @0001948bc76939369ca855c90b36d81256477e85
 *           (VLLM_SERVER_DEV_MODE), vllm/entrypoints/serve/dev/rlhf/api_router.py
 *           @0100a2129224e729af1b3b8ed42a900cdfe9a452 (/abort_requests, /pause, /resume, /weight_info);
 *   SGLang  python/sglang/srt/server_args.py @001067fffe33427bee0ed2f007fb7551a1d76b44,
 *           python/sglang/srt/environ.py @0003215cf1464f44b389cd0b18d0b4c56f2a3da6,
 *           python/sglang/srt/entrypoints/http_server.py @0025436eab0556737d615b36a4dd3e1e26e82f3d,
 *           docs/advanced_features/sglang_for_rl.md @067bfe93626b99d33a934c78ac24c0c71e5e5e17;
 *   llama.cpp common/arg.cpp, tools/server/server.cpp, tools/server/server-schema.cpp
 *           @de3ff815ea7d559ee917f063901b8986f038abc6 (the source test/real-server/ builds and runs).
 * A name the README adds without a citation fails here, as does a value outside the cited choices
 * (`--scheduling-policy`, `mode=keep`, `{"mode": "in_place"}`). The engine's own command lines in the
 * section must parse with `rollout run`'s flags and resolve to a valid config. The server rows of
 * docs/INFERENCE-SERVERS.md are held to the same citations (flags, variables and routes).
 */
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { parseArgs } from 'node:util';
import { configFromFlags } from '../src/cli/config-flags.ts';
import { MOCK_LLM_HELP } from '../src/cli/mock-llm.ts';
import { RUN_HELP, RUN_OPTIONS } from '../src/cli/run.ts';
import { flagsOf } from '../src/cli/suggest.ts';
import { resolveConfig } from '../src/config.ts';
import {
  codeLines,
  codeSpans,
  engineRunArgs,
  readmeServersSection,
  SERVER_LABELS,
  type ServerKey,
  sectionParts,
  words,
} from './support/readme-launch.ts';

interface Fact {
  file: string;
  commit?: string;
  identifier: string;
  readHere?: boolean;
  values?: string[];
  /** Body keys; a key's list (when not null) is the values it takes. */
  body?: Record<string, string[] | null>;
  query?: Record<string, string[] | null>;
}

interface ServerFacts {
  repo: string;
  commands: Record<string, Fact>;
  flags: Record<string, Fact>;
  env: Record<string, Fact>;
  routes: Record<string, Fact>;
  fields: Record<string, Fact>;
}

interface Facts {
  servers: Record<ServerKey, ServerFacts>;
  engine: { routes: Record<string, Fact> };
}

const FACTS = JSON.parse(
  readFileSync(new URL('./fixtures/server-launch-facts.json', import.meta.url), 'utf8'),
) as Facts;
const SERVERS = Object.keys(SERVER_LABELS) as ServerKey[];
const SECTION = readmeServersSection();
const PARTS = sectionParts(SECTION);
const RUN_FLAGS = new Set(flagsOf(RUN_HELP));
const MOCK_LLM_FLAGS = new Set(flagsOf(MOCK_LLM_HELP));

type Kind = 'flag' | 'env' | 'route' | 'field';

/** One name the text uses, with what the check needs to know of it. */
interface Mention {
  kind: Kind;
  name: string;
  /** A flag's value as written, when it has one. */
  value?: string;
  method?: string;
  path?: string;
  /** Body or query keys and the values written for them (undefined: no value written). */
  keys?: Map<string, string | undefined>;
  /** Where it was found, for the failure message. */
  where: string;
}

const FILE_NAME = /\.(json|gguf|py|md|ts|cpp|sh)$/;

/** `--flag value` pairs in a list of words: a value is the next word when it is not itself a flag. */
function flagsIn(ws: string[], where: string): Mention[] {
  const out: Mention[] = [];
  ws.forEach((w, i) => {
    const m = /^(--[a-z][a-z0-9-]*)(?:=(.*))?$/.exec(w);
    if (m === null) return;
    const next = ws[i + 1];
    const value = m[2] ?? (next !== undefined && !next.startsWith('-') && next !== '/' ? next : undefined);
    out.push({ kind: 'flag', name: m[1], value, where });
  });
  return out;
}

/** The keys of a JSON-ish body as the README writes it: `{"a": 1}`, `{"a", "b"}`, `{"mode": "x"}`. */
function bodyKeys(body: string): Map<string, string | undefined> {
  const keys = new Map<string, string | undefined>();
  for (const m of body.matchAll(/(:\s*)?"([^"]*)"(\s*:\s*(?:"([^"]*)"|[^,}\s]+))?/g)) {
    if (m[1] !== undefined) continue; // a value, not a key
    keys.set(m[2], m[4]);
  }
  return keys;
}

/** The route a code span names: `POST /x?a=b {"k": v}`, `GET /y`, `/z`. */
function routeIn(span: string, where: string): Mention | null {
  const m = /^(?:(GET|POST|PUT|DELETE) )?(\/[\w/.-]*)(\?\S*)?(?:\s+(\{.*\}))?$/.exec(span);
  if (m === null || m[2] === '/') return null;
  const keys = new Map<string, string | undefined>();
  if (m[3] !== undefined)
    for (const pair of m[3].slice(1).split('&')) {
      const [k, v] = pair.split('=');
      keys.set(k, v);
    }
  if (m[4] !== undefined) for (const [k, v] of bodyKeys(m[4])) keys.set(k, v);
  return { kind: 'route', name: span, method: m[1], path: m[2], keys, where };
}

/** Every flag, variable, route and server-side field a piece of the README names. */
function mentions(text: string, kinds: readonly Kind[] = ['flag', 'env', 'route', 'field']): Mention[] {
  const out: Mention[] = [];
  for (const line of codeLines(text)) {
    if (line.startsWith('npx rollout ')) continue; // the engine's own: engineCommands
    const ws = words(line);
    for (const w of ws) {
      const env = /^([A-Z][A-Z0-9_]+)=/.exec(w);
      if (env) out.push({ kind: 'env', name: env[1], where: `code: ${line}` });
    }
    out.push(...flagsIn(ws, `code: ${line}`));
  }
  for (const span of codeSpans(text)) {
    const where = `\`${span}\``;
    if (span.startsWith('npx rollout ')) continue; // engineSpans
    const env = /^([A-Z][A-Z0-9_]+)=/.exec(span);
    if (env) {
      out.push({ kind: 'env', name: env[1], where });
      continue;
    }
    const route = routeIn(span, where);
    if (route) {
      out.push(route);
      continue;
    }
    if (/(^|\s)--[a-z]/.test(span)) {
      out.push(...flagsIn(words(span), where));
      continue;
    }
    if (/^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$/.test(span) && span.includes('_') && !FILE_NAME.test(span))
      out.push({ kind: 'field', name: span, where });
  }
  return out.filter((m) => kinds.includes(m.kind));
}

function routeFacts(routes: Record<string, Fact>, m: Mention): Fact | null {
  for (const [key, fact] of Object.entries(routes)) {
    const [method, path] = key.split(' ');
    if (path !== m.path || (m.method !== undefined && m.method !== method)) continue;
    const allowed = { ...fact.body, ...fact.query };
    const fits = [...(m.keys ?? new Map())].every(
      ([k, v]) => k in allowed && (v === undefined || allowed[k] === null || allowed[k]!.includes(v)),
    );
    if (fits) return fact;
  }
  return null;
}

/** Why a mention is not cited for these servers, or null when it is (for every one of them). */
function uncited(m: Mention, servers: readonly ServerKey[]): string | null {
  for (const key of servers) {
    const facts = FACTS.servers[key];
    const label = SERVER_LABELS[key];
    switch (m.kind) {
      case 'env':
        if (!(m.name in facts.env)) return `${label}: environment variable ${m.name} (${m.where}) is not cited`;
        break;
      case 'field':
        if (!(m.name in facts.fields)) return `${label}: field ${m.name} (${m.where}) is not cited`;
        break;
      case 'route':
        if (routeFacts(facts.routes, m) === null && routeFacts(FACTS.engine.routes, m) === null)
          return `${label}: route ${m.name} is not cited (path, method, and every body or query key and value)`;
        break;
      case 'flag': {
        const fact = facts.flags[m.name];
        if (fact === undefined) {
          // Not the server's: then the engine's (`--api tokens --tokenizer <dir>` beside a server's flags).
          if (!RUN_FLAGS.has(m.name))
            return `${label}: flag ${m.name} (${m.where}) is neither cited for the server nor a rollout run flag`;
        } else if (fact.values !== undefined && m.value !== undefined && !fact.values.includes(m.value))
          return `${label}: ${m.name} ${m.value} (${m.where}) is not one of the cited values ${fact.values.join(', ')}`;
        break;
      }
    }
  }
  return null;
}

function problems(text: string, servers: readonly ServerKey[], kinds?: readonly Kind[]): string[] {
  return mentions(text, kinds)
    .map((m) => uncited(m, servers))
    .filter((p): p is string => p !== null);
}

describe('the README launch commands for vLLM, SGLang and llama.cpp', () => {
  for (const key of SERVERS) {
    it(`names for ${SERVER_LABELS[key]} only flags, variables, routes and fields cited from its source`, () => {
      const part = PARTS.servers[key];
      assert.ok(mentions(part).length > 0, `nothing found in the ${SERVER_LABELS[key]} part`);
      assert.deepEqual(problems(part, [key]), []);
    });

    it(`launches ${SERVER_LABELS[key]} with a command the facts cite`, () => {
      const launch = codeLines(PARTS.servers[key]).find((l) => !l.startsWith('npx rollout '));
      assert.ok(launch !== undefined, 'no launch line');
      const command = launch.replace(/^([A-Z][A-Z0-9_]+=\S+\s+)+/, '');
      assert.ok(
        Object.keys(FACTS.servers[key].commands).some((c) => command === c || command.startsWith(`${c} `)),
        `${command} does not start with a cited command (${Object.keys(FACTS.servers[key].commands).join(', ')})`,
      );
    });
  }

  it('names in the text common to every server only routes all three serve and rollout flags', () => {
    assert.deepEqual(problems(PARTS.common, SERVERS), []);
    assert.ok(
      mentions(PARTS.common).some((m) => m.kind === 'route'),
      'the intro names the route every server is asked at start',
    );
  });

  it("gives the engine command lines that parse with rollout run's flags and resolve to a valid config", (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'readme-launch-'));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    const config = join(dir, 'my.json');
    writeFileSync(config, '{}');
    for (const key of SERVERS) {
      const args = engineRunArgs(PARTS.servers[key]).map((a) => (a === 'my.json' ? config : a));
      const { values, positionals } = parseArgs({ args, options: RUN_OPTIONS, strict: true, allowPositionals: true });
      assert.deepEqual(positionals, [], `${SERVER_LABELS[key]}: stray words in ${args.join(' ')}`);
      const resolved = resolveConfig(configFromFlags(values).config);
      assert.equal(resolved.llm.server, key, `${SERVER_LABELS[key]}: --server names it`);
    }
  });

  it('writes rollout commands in its prose with the flags those commands take', () => {
    const spans = codeSpans(SECTION).filter((s) => s.startsWith('npx rollout '));
    assert.ok(spans.length > 0);
    for (const span of spans) {
      const [, , command, ...rest] = words(span);
      const known = command === 'mock-llm' ? MOCK_LLM_FLAGS : command === 'run' ? RUN_FLAGS : null;
      assert.ok(known !== null, `${span}: a command this test does not know`);
      for (const w of rest.filter((x) => x.startsWith('--'))) assert.ok(known.has(w), `${span}: ${w}`);
    }
  });

  it('catches a flag, a route key or a value the facts do not cite', () => {
    const made = [
      '```sh\nllama-server --model m.gguf --made-up-flag 3\n```',
      '- `POST /abort_request {"abort_everything": true}` and `POST /pause_generation {"mode": "sideways"}`',
      '- `--scheduling-policy lifo`, `SGLANG_NO_SUCH_VARIABLE=1`, `meta_info.no_such_field`',
    ].join('\n');
    const found = [...problems(made, ['llamacpp']), ...problems(made, ['sglang']), ...problems(made, ['vllm'])];
    for (const bad of [
      '--made-up-flag',
      'abort_everything',
      'sideways',
      '--scheduling-policy lifo',
      'SGLANG_NO_SUCH_VARIABLE',
      'meta_info.no_such_field',
    ])
      assert.ok(
        found.some((p) => p.includes(bad)),
        `${bad} not caught: ${found.join('; ')}`,
      );
  });
});

describe('the facts fixture', () => {
  it('cites every fact with its file, the commit read and the identifier found there', () => {
    for (const key of SERVERS) {
      const facts = FACTS.servers[key];
      assert.match(facts.repo, /^[\w.-]+\/[\w.-]+$/);
      for (const group of ['commands', 'flags', 'env', 'routes', 'fields'] as const)
        for (const [name, fact] of Object.entries(facts[group])) {
          const what = `${SERVER_LABELS[key]} ${group} ${name}`;
          assert.ok(fact.file.length > 0, `${what}: file`);
          assert.match(fact.commit ?? '', /^[0-9a-f]{40}$/, `${what}: commit`);
          assert.ok(fact.identifier.length > 0, `${what}: identifier`);
        }
    }
  });

  it('cites nothing that neither the README section nor the server rows name any more', () => {
    const stale: string[] = [];
    for (const key of SERVERS) {
      const named = [...mentions(PARTS.servers[key]), ...mentions(PARTS.common), ...mentions(rowsOf(key))];
      const has = (kind: Kind, name: string) => named.some((m) => m.kind === kind && m.name === name);
      const facts = FACTS.servers[key];
      for (const name of Object.keys(facts.flags)) if (!has('flag', name)) stale.push(`${key} ${name}`);
      for (const name of Object.keys(facts.env)) if (!has('env', name)) stale.push(`${key} ${name}`);
      for (const name of Object.keys(facts.fields)) if (!has('field', name)) stale.push(`${key} ${name}`);
      for (const route of Object.keys(facts.routes)) {
        const [method, path] = route.split(' ');
        const used = named.some(
          (m) => m.kind === 'route' && m.path === path && (m.method === undefined || m.method === method),
        );
        if (!used) stale.push(`${key} ${route}`);
      }
    }
    assert.deepEqual(stale, []);
  });
});

/** docs/INFERENCE-SERVERS.md's table rows for each server (the "what a turn carries" and sampling tables). */
const INFERENCE_SERVERS = readFileSync(new URL('../docs/INFERENCE-SERVERS.md', import.meta.url), 'utf8');

function rowsOf(key: ServerKey): string {
  return INFERENCE_SERVERS.split('\n')
    .filter((l) => l.startsWith(`| ${SERVER_LABELS[key]} |`))
    .join('\n');
}

describe('the server rows of docs/INFERENCE-SERVERS.md', () => {
  for (const key of SERVERS) {
    it(`name for ${SERVER_LABELS[key]} only flags, variables and routes cited from its source`, () => {
      const rows = rowsOf(key);
      assert.ok(rows.length > 0, `no ${SERVER_LABELS[key]} row`);
      assert.deepEqual(problems(rows, [key], ['flag', 'env', 'route']), []);
    });
  }
});

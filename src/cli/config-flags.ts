/**
 * The flags `run` and `serve` share: a JSON config file plus overrides, turned into config input.
 */
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import stripJsonComments from 'strip-json-comments';
import { ConfigError } from '../errors.ts';
import { intFlag, UsageError } from './args.ts';

export const CONFIG_FLAGS = {
  config: { type: 'string' },
  'llm-url': { type: 'string' },
  model: { type: 'string' },
  server: { type: 'string' },
  api: { type: 'string' },
  tokenizer: { type: 'string' },
  'batch-size': { type: 'string' },
  threads: { type: 'string' },
  seed: { type: 'string' },
  strategy: { type: 'string' },
  nats: { type: 'string' },
} as const;

export function configFromFlags(values: Record<string, string | boolean | undefined>): {
  config: Record<string, unknown>;
  configPath: string | undefined;
} {
  const configPath = typeof values.config === 'string' ? resolve(values.config) : undefined;
  const config = configPath === undefined ? {} : readJsonConfig(configPath);
  applyOverrides(config, values);
  return { config, configPath };
}

function readJsonConfig(path: string): Record<string, unknown> {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new UsageError(`--config: cannot read ${path}: ${(err as Error).message}`);
  }
  try {
    const value = parseJsonWithComments(text);
    if (typeof value !== 'object' || value === null || Array.isArray(value))
      throw new Error('the top level must be an object');
    return value as Record<string, unknown>;
  } catch (err) {
    throw new ConfigError([`${path}: not a valid JSON config (${(err as Error).message})`]);
  }
}

/**
 * A config file's text: JSON, with `//` and `/* *\/` comments allowed (as the docs' snippets write
 * them). Comments become spaces, so JSON.parse's positions still point into the file; text inside
 * strings (a URL's `//`) is left alone.
 */
export function parseJsonWithComments(text: string): unknown {
  return JSON.parse(stripJsonComments(text));
}

function applyOverrides(config: Record<string, unknown>, values: Record<string, string | boolean | undefined>): void {
  const section = (name: string) => {
    const current = config[name];
    if (current !== undefined && (typeof current !== 'object' || current === null)) return current; // let validation name it
    return (config[name] = { ...(current as object | undefined) }) as Record<string, unknown>;
  };
  if (values['llm-url'] !== undefined) (section('llm') as Record<string, unknown>).url = values['llm-url'];
  if (values.model !== undefined) (section('llm') as Record<string, unknown>).model = values.model;
  // Checked by the config schema, which names llm.server / llm.api and the values it takes.
  if (values.server !== undefined) (section('llm') as Record<string, unknown>).server = values.server;
  if (values.api !== undefined) (section('llm') as Record<string, unknown>).api = values.api;
  if (values.tokenizer !== undefined) (section('llm') as Record<string, unknown>).tokenizer = values.tokenizer;
  const batchSize = intFlag('batch-size', values['batch-size'] as string | undefined, { min: 1 });
  if (batchSize !== undefined) config.batchSize = batchSize;
  const threads = intFlag('threads', values.threads as string | undefined, { min: 1 });
  if (threads !== undefined) (section('workers') as Record<string, unknown>).threads = threads;
  const seed = intFlag('seed', values.seed as string | undefined);
  if (seed !== undefined) config.seed = seed;
  if (values.strategy !== undefined) (section('producer') as Record<string, unknown>).strategy = values.strategy;
  if (values.nats !== undefined) {
    // Keeps the file's other workers.nats fields (run name, ack wait); the schema checks the URL.
    const workers = section('workers') as Record<string, unknown>;
    const nats = workers.nats;
    workers.nats = { ...(typeof nats === 'object' && nats !== null ? nats : {}), url: values.nats };
  }
}

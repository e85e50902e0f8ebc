/**
 * Draws prompts for one task into fresh groups of k rollouts with stable ids.
 *
 * The prompt source is either a JSONL dataset (one object of environment reset params per line,
 * cycled in epochs) or, with no dataset, the environment itself: the sample carries only a seed and
 * the environment draws its task from it. `drawIndex` is cumulative, so group ids never repeat across
 * epochs, and the cursor is a single number to checkpoint.
 */
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import type { TaskConfig } from '../config.ts';
import { fmix32 } from '../hash.ts';
import { ConfigError } from '../errors.ts';
import { newGroup, type PromptSample, type RolloutGroup } from '../domain/rollout.ts';

interface DatasetRow {
  /** Its line in the file (blank lines are skipped, so not its index), for errors that name it. */
  line: number;
  params: Record<string, unknown>;
  seed: number | null;
}

export class Sampler {
  readonly task: TaskConfig;
  readonly #runSeed: number;
  #rows: DatasetRow[] | null = null;
  /** Number of prompts drawn so far; the next draw gets this index. */
  #cursor = 0;

  private constructor(task: TaskConfig, runSeed: number) {
    this.task = task;
    this.#runSeed = runSeed;
  }

  static async create(task: TaskConfig, runSeed: number): Promise<Sampler> {
    const sampler = new Sampler(task, runSeed);
    if (task.dataset !== null) sampler.#rows = await readDataset(task.dataset, task.name);
    return sampler;
  }

  get cursor(): number {
    return this.#cursor;
  }

  set cursor(value: number) {
    if (!Number.isInteger(value) || value < 0)
      throw new RangeError(`sampler cursor must be a non-negative integer, got ${value}`);
    this.#cursor = value;
  }

  /** The dataset's prompts with their line numbers, `start` to `end` (none without a dataset): the start-up check's input. */
  prompts(start: number, end: number): { line: number; params: Record<string, unknown> }[] {
    return (this.#rows ?? []).slice(start, end).map(({ line, params }) => ({ line, params }));
  }

  /** Prompts in the dataset; 0 without one. */
  get size(): number {
    return this.#rows?.length ?? 0;
  }

  /** A new INIT group for the next prompt. */
  draw(): RolloutGroup {
    const drawIndex = this.#cursor++;
    const rows = this.#rows;
    const promptIndex = rows === null ? drawIndex : drawIndex % rows.length;
    const row = rows?.[promptIndex];
    const sample: PromptSample = {
      taskName: this.task.name,
      promptIndex,
      drawIndex,
      // Same prompt → same seed in every epoch, so a dataset line always means the same task.
      seed: row?.seed ?? mixSeed(this.#runSeed, this.task.name, promptIndex),
      envParams: row?.params ?? {},
    };
    return newGroup(sample, this.task.groupSize, this.task.sampling ?? undefined);
  }
}

/** Seeds are 31-bit, as the ones the sampler derives (mixSeed): a larger one would be cut or rounded. */
const MAX_SEED = 0x7fffffff;
/**
 * Nesting a dataset line may have. Environment params are shallow; a deeper line would overflow the
 * stack of the msgpack encoder on its way to a worker (3000 levels did), long after start.
 */
export const MAX_DATASET_DEPTH = 64;

/** Read line by line: a dataset may be larger than the biggest string V8 can hold. */
async function readDataset(path: string, taskName: string): Promise<DatasetRow[]> {
  const where = (line: number) => `task ${taskName} dataset ${path}:${line}`;
  const rows: DatasetRow[] = [];
  const lines = createInterface({ input: createReadStream(path, { encoding: 'utf8' }), crlfDelay: Infinity });
  let n = 0;
  try {
    for await (const raw of lines) {
      n++;
      const line = raw.trim();
      if (line === '') continue;
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch (err) {
        throw new ConfigError([`${where(n)}: not valid JSON (${(err as Error).message})`]);
      }
      if (typeof value !== 'object' || value === null || Array.isArray(value)) {
        throw new ConfigError([
          `${where(n)}: each line must be a JSON object of environment params (got ${line.slice(0, 60)})`,
        ]);
      }
      const deep = deeperThan(value, MAX_DATASET_DEPTH);
      if (deep !== null)
        throw new ConfigError([
          `${where(n)}: nested deeper than ${MAX_DATASET_DEPTH} levels (at ${deep.length > 60 ? `${deep.slice(0, 28)}…${deep.slice(-28)}` : deep}); environment params are not that deep`,
        ]);
      const { seed, ...params } = value as Record<string, unknown>;
      if (seed !== undefined && (!Number.isInteger(seed) || (seed as number) < 0 || (seed as number) > MAX_SEED)) {
        throw new ConfigError([
          `${where(n)}: seed must be an integer in [0, ${MAX_SEED}] (got ${JSON.stringify(seed)})`,
        ]);
      }
      rows.push({ line: n, params, seed: (seed as number | undefined) ?? null });
    }
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    // A directory, a file gone since the config was checked, no permission: one line naming it.
    throw new ConfigError([
      `task ${taskName} dataset ${path}: cannot be read (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`,
    ]);
  }
  if (rows.length === 0) throw new ConfigError([`task ${taskName} dataset ${path}: no prompts (the file is empty)`]);
  return rows;
}

/** The path of a value nested deeper than `max` (e.g. `a.b[0]…`), or null. Iterative: no stack to overflow. */
function deeperThan(root: unknown, max: number): string | null {
  const stack: { value: unknown; depth: number; path: string }[] = [{ value: root, depth: 1, path: '' }];
  while (stack.length > 0) {
    const { value, depth, path } = stack.pop()!;
    if (typeof value !== 'object' || value === null) continue;
    if (depth > max) return path || '(top)';
    for (const [key, child] of Object.entries(value))
      stack.push({
        value: child,
        depth: depth + 1,
        path: Array.isArray(value) ? `${path}[${key}]` : path === '' ? key : `${path}.${key}`,
      });
  }
  return null;
}

/** A 31-bit seed from (run seed, task, prompt): FNV-1a over the parts, then a murmur finaliser. */
export function mixSeed(runSeed: number, taskName: string, promptIndex: number): number {
  let h = 0x811c9dc5 ^ runSeed;
  const text = `${taskName}\u0000${promptIndex}`;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  return fmix32(h) >>> 1;
}

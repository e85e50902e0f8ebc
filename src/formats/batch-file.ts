/**
 * Training batches as JSONL: one group per line, with everything a trainer needs (ids, messages,
 * per-turn token ids / logprobs / model steps as plain arrays, rewards, statuses, timings).
 * A Python trainer reads it with `json.loads` per line; nothing here is engine-specific.
 */
import { createWriteStream, mkdirSync, type WriteStream } from 'node:fs';
import { once } from 'node:events';
import { dirname } from 'node:path';
import type { Batch } from '../domain/batch.ts';
import { compactGroup, type CompactGroup } from './compact.ts';
import { toJson } from './peer.ts';
import type { RolloutGroup } from '../domain/rollout.ts';

/** JSON text of a group, typed arrays written as number arrays. */
export function groupToJson(group: RolloutGroup | CompactGroup, trainStep: number): string {
  return toJson({ trainStep, ...group });
}

export class BatchFileWriter {
  readonly path: string;
  readonly #stream: WriteStream;
  /** Lines in the compact form (formats/compact.ts). */
  readonly #compact: boolean;
  #lines = 0;

  constructor(path: string, options: { compact?: boolean } = {}) {
    this.path = path;
    this.#compact = options.compact ?? false;
    mkdirSync(dirname(path), { recursive: true });
    this.#stream = createWriteStream(path, { flags: 'a' });
  }

  get lines(): number {
    return this.#lines;
  }

  /** Append every group of the batch in one write; resolves once the stream has room again (backpressure). */
  async write(batch: Batch): Promise<void> {
    let text = '';
    for (const group of batch.groups)
      text += `${groupToJson(this.#compact ? compactGroup(group) : group, batch.trainStep)}\n`;
    this.#lines += batch.groups.length;
    if (!this.#stream.write(text)) await once(this.#stream, 'drain');
  }

  async close(): Promise<void> {
    this.#stream.end();
    await once(this.#stream, 'close');
  }
}

/** A whole producer snapshot (what a checkpoint holds) around the groups a test cares about. */
import type { ResolvedConfig } from '../../src/config.ts';
import { emptyGroupCounts, type ProducerSnapshot } from '../../src/coordinator/producer.ts';
import { ProduceProgress } from '../../src/coordinator/progress.ts';
import { emptyDropCounts } from '../../src/buffer/replay-buffer.ts';
import type { RolloutGroup } from '../../src/domain/rollout.ts';

export function producerSnapshot(config: ResolvedConfig, buffered: RolloutGroup[]): ProducerSnapshot {
  const tasks = config.tasks.map((t) => ({ name: t.name, weight: t.weight }));
  return {
    modelStep: 0,
    progress: new ProduceProgress(tasks, config.batchSize).snapshot(),
    buffer: { groups: buffered, dropped: emptyDropCounts(), lastDropReason: null },
    samplers: Object.fromEntries(tasks.map((t) => [t.name, 0])),
    counts: emptyGroupCounts(),
    inFlight: [],
    lastBatch: null,
  };
}

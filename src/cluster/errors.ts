/**
 * Errors of the NATS worker-node cluster (src/cluster/). Stable codes:
 * - ERR_NATS_CONNECT: the NATS server cannot be reached, or has no JetStream (`nats-server -js`);
 * - ERR_NATS: a JetStream or KV call failed after the connection was up (stream, consumer, bucket);
 * - ERR_NATS_TOO_LARGE: a group or a result is larger than MAX_CHUNKS chunks of the server's max_payload
 *   (./chunks.ts);
 * - ERR_NATS_RUN_IN_USE: another live coordinator holds the run (`workers.nats.run`).
 */
import { RolloutEngineError } from '../errors.ts';

export type ClusterErrorCode = 'ERR_NATS_CONNECT' | 'ERR_NATS' | 'ERR_NATS_TOO_LARGE' | 'ERR_NATS_RUN_IN_USE';

export class ClusterError extends RolloutEngineError {
  declare readonly code: ClusterErrorCode;
  constructor(code: ClusterErrorCode, message: string, options?: { cause?: unknown }) {
    super(code, message, options);
    this.name = 'ClusterError';
  }
}

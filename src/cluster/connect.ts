/**
 * One NATS connection per process side (coordinator pool, node), with JetStream checked at once: a
 * wrong URL or a server started without `-js` is one clear error at start, not a hang at the first group.
 */
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { jetstream, jetstreamManager, type JetStreamClient, type JetStreamManager } from '@nats-io/jetstream';
import { describeError } from '../errors.ts';
import { ClusterError } from './errors.ts';

export interface NatsLink {
  nc: NatsConnection;
  js: JetStreamClient;
  jsm: JetStreamManager;
  /** The server's max_payload: no message may be larger. */
  maxPayload: number;
}

export async function openNats(url: string, name: string, field: string): Promise<NatsLink> {
  let nc: NatsConnection;
  try {
    // Reconnects for ever once connected: a NATS restart is waited out, not a reason to stop a run.
    nc = await connect({ servers: url, name, maxReconnectAttempts: -1, reconnectTimeWait: 250 });
  } catch (err) {
    throw new ClusterError(
      'ERR_NATS_CONNECT',
      `${field}: cannot connect to ${url}: ${describeError(err)} (is nats-server running there?)`,
      { cause: err },
    );
  }
  try {
    const jsm = await jetstreamManager(nc, { timeout: 5_000 });
    return { nc, js: jetstream(nc, { timeout: 10_000 }), jsm, maxPayload: nc.info?.max_payload ?? 1024 * 1024 };
  } catch (err) {
    await nc.close().catch(() => undefined);
    throw new ClusterError(
      'ERR_NATS_CONNECT',
      `${field}: ${url} has no JetStream (${describeError(err)}): start nats-server with -js`,
      { cause: err },
    );
  }
}

/** A KV "create" that found the key: the value exists already (compare-and-swap lost). */
export function isKeyExists(err: unknown): boolean {
  const e = err as { code?: unknown; message?: unknown } | null;
  return e?.code === 10071 || (typeof e?.message === 'string' && e.message.includes('wrong last sequence'));
}

/** A stream or consumer that does not exist (deleted: the run ended). */
export function isNotFound(err: unknown): boolean {
  const e = err as { code?: unknown; message?: unknown } | null;
  return e?.code === 10059 || e?.code === 10014 || (typeof e?.message === 'string' && /not found/i.test(e.message));
}

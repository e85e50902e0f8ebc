/**
 * `rollout node`: a worker node serving a run over NATS JetStream (src/cluster/node.ts). Runs until
 * SIGINT / SIGTERM, then drains: takes no more groups, lets running ones finish (`--drain-ms`), returns
 * the rest ABORTED, and exits 0. A second signal stops at once (groups left to the ack wait).
 */
import { parseArgs } from 'node:util';
import { createLogger } from '../log.ts';
import { loadRolloutNode } from '../cluster/index.ts';
import type { RolloutNode } from '../cluster/node.ts';
import { DEFAULT_RUN, NATS_URL, RUN_NAME } from '../config.ts';
import { intFlag, portFlag, UsageError } from './args.ts';

export const NODE_HELP = `Usage: rollout node --nats <url> [options]

Run groups for a coordinator started with workers.nats (or --nats): pulls them from the run's
JetStream work queue, runs them on local worker threads (the same worker code as local runs) and
publishes the results. Start and stop nodes at any time; a node started before its coordinator waits
for it, and one whose run ends waits for the next run of that name. Environment modules and the inference servers must be reachable from this machine at the
paths and URLs the coordinator's config names.

Options:
  --nats <url>         the NATS server (nats://host:4222), the coordinator's workers.nats.url
  --run <name>         the run to serve: the coordinator's workers.nats.run (default ${DEFAULT_RUN})
  --threads <n>        worker threads (default: this machine's cores)
  --id <name>          node id in /status and logs (default <host>-<pid>); unique per run
  --metrics-port <n>   serve /metrics (Prometheus) and /health on this port (0: any free one; default: none)
  --metrics-host <a>   address for /metrics (default 127.0.0.1)
  --drain-ms <n>       on SIGTERM, how long running groups may finish before they are returned (default 30000)
  -h, --help           show this help

Logs go to stderr (LOG_LEVEL=debug|info|warn|error).`;

export async function nodeCommand(argv: string[]): Promise<number> {
  const { values } = parseArgs({
    args: argv,
    options: {
      nats: { type: 'string' },
      run: { type: 'string' },
      threads: { type: 'string' },
      id: { type: 'string' },
      'metrics-port': { type: 'string' },
      'metrics-host': { type: 'string' },
      'drain-ms': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
  });
  if (values.help) {
    console.log(NODE_HELP);
    return 0;
  }
  if (values.nats === undefined || !NATS_URL.test(values.nats))
    throw new UsageError(`--nats must be a nats://host:port URL (got ${JSON.stringify(values.nats ?? null)})`);
  const run = values.run ?? DEFAULT_RUN;
  if (!RUN_NAME.test(run))
    throw new UsageError(`--run must be 1 to 64 letters, digits, _ or - (got ${JSON.stringify(run)})`);
  if (values.id !== undefined && !/^[A-Za-z0-9_-]{1,128}$/.test(values.id))
    throw new UsageError(`--id must be 1 to 128 letters, digits, _ or - (got ${JSON.stringify(values.id)})`);
  const threads = intFlag('threads', values.threads, { min: 1, max: 1024 }) ?? null;
  const metricsPort = values['metrics-port'] === undefined ? null : portFlag(values['metrics-port'])!;
  const drainMs = intFlag('drain-ms', values['drain-ms'], { min: 0 }) ?? 30_000;
  // The NATS client is an optional dependency: loaded here, not when the CLI starts.
  const RolloutNodeClass = await loadRolloutNode();
  const log = createLogger(process.env.LOG_LEVEL ?? 'info', { thread: 'node' });
  // Signals before the node is up stop the start-up; after, the first drains and a second stops at once.
  let stopping: 'drain' | 'now' | null = null;
  let node: RolloutNode | null = null;
  const waiting = new AbortController();
  const onSignal = (): void => {
    stopping = stopping === null ? 'drain' : 'now';
    waiting.abort();
    if (node === null) return;
    if (stopping === 'drain') void node.drain();
    else void node.close();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  try {
    // Serves run after run (a coordinator restarted with --resume, the next run of the same name) until told to stop.
    for (;;) {
      node = await RolloutNodeClass.start({
        url: values.nats,
        run,
        id: values.id,
        threads,
        log,
        metricsPort,
        metricsHost: values['metrics-host'],
        drainMs,
        signal: waiting.signal,
      });
      if (node === null) return 0; // stopped while waiting for a run
      if (stopping !== null) void node.drain();
      const exit = await node.serve();
      if (exit === 'stopped' || stopping !== null) return 0;
      node = null;
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

/**
 * A nats-server with JetStream for one test file: a free loopback port (`-p -1`: the server picks one
 * and logs it), a temporary store dir, stopped and removed after. `hasNatsServer()` tells whether the
 * binary is installed (Debian/Ubuntu: `apt-get install nats-server`).
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export function hasNatsServer(): boolean {
  try {
    execFileSync('nats-server', ['--version'], { stdio: 'ignore', timeout: 10_000 });
    return true;
  } catch {
    return false;
  }
}

export interface NatsServer {
  url: string;
  /**
   * Kills the server (SIGKILL: a crash, not a shutdown) and starts it again on the same port with the
   * same store dir, so JetStream streams and buckets survive as they would on a real restart.
   * `down` runs while no server listens.
   */
  restart(down?: () => Promise<void> | void): Promise<void>;
  stop(): Promise<void>;
  /** The running server's process id (a benchmark reads its CPU from /proc); null while none runs. */
  pid(): number | null;
}

/** `config`: the text of a nats-server config file to start it with (e.g. `max_payload: 65536`). */
export async function startNatsServer(config?: string): Promise<NatsServer> {
  const dir = mkdtempSync(join(tmpdir(), 'rollout-nats-'));
  const args = ['-js', '-a', '127.0.0.1', '-sd', dir];
  if (config !== undefined) {
    writeFileSync(join(dir, 'nats-server.conf'), config);
    args.push('-c', join(dir, 'nats-server.conf'));
  }
  let child: ChildProcess | null = null;
  const kill = async (signal: NodeJS.Signals): Promise<void> => {
    const running = child;
    if (running === null || running.exitCode !== null || running.signalCode !== null) return;
    const exited = new Promise((resolve) => running.once('exit', resolve));
    running.kill(signal);
    await exited;
  };
  const stop = async (): Promise<void> => {
    await kill('SIGTERM');
    rmSync(dir, { recursive: true, force: true });
  };
  let port: string;
  try {
    ({ child, port } = await spawnServer([...args, '-p', '-1']));
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  return {
    url: `nats://127.0.0.1:${port}`,
    stop,
    pid: () => (child !== null && child.exitCode === null && child.signalCode === null ? (child.pid ?? null) : null),
    async restart(down) {
      await kill('SIGKILL');
      await down?.();
      ({ child } = await spawnServer([...args, '-p', port]));
    },
  };
}

/** Starts nats-server and resolves once it is ready, with the port it listens on. */
function spawnServer(args: string[]): Promise<{ child: ChildProcess; port: string }> {
  const child: ChildProcess = spawn('nats-server', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  return new Promise((resolve, reject) => {
    let log = '';
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`nats-server did not start within 10 s:\n${log}`));
    }, 10_000);
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.stderr!.on('data', (chunk: Buffer) => {
      log += chunk.toString();
      const port = /Listening for client connections on 127\.0\.0\.1:(\d+)/.exec(log)?.[1];
      if (port === undefined || !/Server is ready/.test(log)) return;
      clearTimeout(timer);
      child.stderr!.removeAllListeners('data');
      child.stderr!.resume();
      resolve({ child, port });
    });
  });
}

/** For `npm run test:cluster`: a missing nats-server fails the suite, saying how to install it. */
export function requireNatsServer(config?: string): Promise<NatsServer> {
  if (!hasNatsServer())
    throw new Error(
      'nats-server is not installed: the cluster tests need it (Debian/Ubuntu: apt-get install nats-server)',
    );
  return startNatsServer(config);
}

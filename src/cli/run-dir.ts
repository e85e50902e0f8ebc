/**
 * Run directories: default names that cannot collide, and an exclusive lock a process holds on its run
 * dir for its whole life, so two processes never write one run (two seeds' groups in one batches file,
 * step records mixed, one checkpoint; or one run's steps written twice by two `--resume`s).
 *
 * The lock, and why it is a socket. Node has no flock(2). A lock file made with O_EXCL holding a pid
 * outlives a SIGKILL, so it must be broken when its pid is dead — and that cannot be made safe: two
 * contenders can both find it stale, one breaks it and takes the lock, the other then breaks the live
 * lock (check and replace are two steps), and a pid reused by an unrelated process keeps a dead lock
 * held forever. So on Linux the lock is a listening unix socket in the *abstract* namespace, named after
 * the run dir's device and inode:
 *   - bind(2) of an abstract name is atomic: of two racing processes exactly one gets it, the other
 *     EADDRINUSE, and there is no file to find stale and break;
 *   - the kernel frees the name when the last descriptor on it closes, so a process that dies in any
 *     way (SIGKILL, OOM kill, a crash) releases it at once, and nothing is left behind in the dir;
 *   - device and inode name the directory itself: two paths to it (a symlink, `./runs/x` and an
 *     absolute path) take the same lock.
 * The holder answers a connection with its pid, so a refusal names the process in the way.
 * Limit: abstract names belong to a network namespace. Processes in different network namespaces (two
 * containers) sharing one volume do not see each other's lock.
 *
 * Elsewhere (macOS has no abstract namespace) the socket is a file, `<dir>/.rollout.lock`. bind(2) on
 * it is still atomic, but the file outlives a killed holder: a contender that finds nobody listening
 * on it removes it and binds again. Two contenders taking over the same dead lock at the same moment
 * can both succeed there; that narrow case is the price of never staying stuck after a SIGKILL.
 */
import { randomBytes, createHash } from 'node:crypto';
import { mkdirSync, rmSync, statSync } from 'node:fs';
import { connect, createServer, type Server } from 'node:net';
import { join } from 'node:path';
import { UsageError } from './args.ts';

/** A held run-dir lock; `release()` gives it up early (death gives it up too). */
export interface RunDirLock {
  readonly dir: string;
  release(): Promise<void>;
}

/** How long a refused process waits for the holder to say its pid (the refusal itself does not wait). */
const HOLDER_REPLY_MS = 2_000;

/**
 * A new run dir `<parent>/<prefix><timestamp>-<random>`, made here, so it is this process's alone: the
 * leaf is made without `recursive`, which fails on an existing dir, and a taken name draws another
 * suffix. Two runs started in the same second (a seed sweep) get two dirs.
 */
export function newRunDir(parent: string, prefix = ''): string {
  mkdirSync(parent, { recursive: true });
  for (;;) {
    const dir = join(parent, `${prefix}${timestamp()}-${randomBytes(4).toString('hex')}`);
    try {
      mkdirSync(dir);
      return dir;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
  }
}

function timestamp(): string {
  return new Date().toISOString().replace(/[-:]/g, '').replace(/\..*$/, '').replace('T', '-');
}

/**
 * Take the exclusive lock on `dir` (made if missing) for this process's life, or refuse with a
 * UsageError naming the dir and the holder. The socket is unref'd: it never keeps the process alive,
 * and it is held until the process exits or `release()` is called.
 */
export async function lockRunDir(dir: string): Promise<RunDirLock> {
  mkdirSync(dir, { recursive: true });
  const abstract = process.platform === 'linux';
  const address = abstract ? abstractName(dir) : join(dir, '.rollout.lock');
  for (let attempt = 0; ; attempt++) {
    const server = createServer((socket) => socket.end(`${process.pid}\n`));
    const bound = await listen(server, address);
    if (bound === null) {
      server.unref();
      return {
        dir,
        release: () => new Promise<void>((resolve) => server.close(() => resolve())),
      };
    }
    if (bound.code !== 'EADDRINUSE') throw new UsageError(`cannot lock the run dir ${dir}: ${bound.message}`);
    const holder = await askHolder(address);
    if (holder.alive || abstract || attempt > 0) {
      throw new UsageError(
        `run dir ${dir} is in use by another rollout process${holder.pid === null ? '' : ` (pid ${holder.pid})`}: wait for it to exit, or choose another --run-dir`,
      );
    }
    // A socket file nobody listens on: its holder died. Remove it and bind again (once).
    rmSync(address, { force: true });
  }
}

/** The abstract socket name of a directory: its device and inode, hashed to fit the 107-byte limit. */
function abstractName(dir: string): string {
  const { dev, ino } = statSync(dir, { bigint: true });
  return `\0rollout-engine-run-dir-${createHash('sha256').update(`${dev}:${ino}`).digest('hex').slice(0, 40)}`;
}

function listen(server: Server, address: string): Promise<NodeJS.ErrnoException | null> {
  return new Promise((resolve) => {
    server.once('error', (err) => resolve(err));
    server.listen(address, () => resolve(null));
  });
}

/** Whether someone listens on `address`, and the pid it answers with (null if it says nothing in time). */
function askHolder(address: string): Promise<{ alive: boolean; pid: number | null }> {
  return new Promise((resolve) => {
    let reply = '';
    let alive = false;
    const socket = connect(address);
    const done = () => {
      clearTimeout(timer);
      socket.destroy();
      const pid = Number.parseInt(reply, 10);
      resolve({ alive, pid: Number.isInteger(pid) && pid > 0 ? pid : null });
    };
    const timer = setTimeout(done, HOLDER_REPLY_MS);
    socket.on('connect', () => (alive = true));
    socket.on('data', (c) => (reply += c));
    socket.on('end', done);
    socket.on('error', done);
  });
}

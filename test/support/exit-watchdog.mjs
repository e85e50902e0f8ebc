/**
 * Preloaded by `npm test` (--import) into every test file's process. Once a file's tests are all done,
 * its process should end by itself; one that leaks a handle (a server or socket left open) would keep
 * it alive for ever and hang the run. Node's --test-force-exit bounds that too, but it drops results
 * a file already reported (nodejs/node#64833: the run prints fewer tests than ran), so instead: an
 * unref'd timer that fails the file loudly, naming what is still open.
 *
 * Plain JavaScript, and a no-op outside a test file's main thread: worker threads inherit the preload
 * (and cannot import TypeScript through it on Node 20), and so may servers the tests spawn.
 */
import { isMainThread } from 'node:worker_threads';

/** Counted from the first of the file's `after` hooks (this one is registered first), so the file's own get time too. */
const GRACE_MS = 30_000;

if (isMainThread && /\.test\.[cm]?[jt]s$/.test(process.argv[1] ?? '')) {
  const { after } = await import('node:test');
  after(() => {
    setTimeout(() => {
      const open = process._getActiveHandles().map((h) => h.constructor.name);
      process.stderr.write(
        `test file still running ${GRACE_MS / 1000} s after its last test; open handles: ${open.join(', ') || 'none'}\n`,
      );
      process.exit(1);
    }, GRACE_MS).unref();
  });
}

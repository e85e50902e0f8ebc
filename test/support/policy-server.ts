/** The reference policy server (python/rollout_engine/policy/server.py) for the test/python suites. */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { join } from 'node:path';
import { listeningUrl, runToExit } from './cli.ts';

/** The repository's python/ folder, where `rollout_engine` is imported from. */
export const PYTHONPATH = join(new URL('../../', import.meta.url).pathname, 'python');

/** The first Python that imports `modules` (torch and numpy by default), or null when none does. */
export async function pythonWithTorch(modules = 'torch, numpy'): Promise<string | null> {
  for (const python of [
    ...new Set([process.env.PYTHON, '/usr/bin/python3', 'python3'].filter((c): c is string => !!c)),
  ]) {
    const out = await runToExit(python, ['-c', `import ${modules}`], { timeoutMs: 60_000 }).catch(() => null);
    if (out?.code === 0) return python;
  }
  return null;
}

export interface PolicyServer {
  url: string;
  child: ChildProcessWithoutNullStreams;
  stderr(): string;
}

/** Starts the policy server on `modelDir` on a free port, `args` after `--model` and `--port`; resolves once it listens. */
export async function startPolicyServer(python: string, modelDir: string, args: string[] = []): Promise<PolicyServer> {
  const child = spawn(python, ['-m', 'rollout_engine.policy.server', '--model', modelDir, '--port', '0', ...args], {
    env: { ...process.env, PYTHONPATH },
  });
  let stderr = '';
  child.stderr.on('data', (c) => (stderr += c));
  const url = await listeningUrl(child, 'the policy server', () => stderr);
  return { url, child, stderr: () => stderr };
}

/** SIGTERMs the server, if it still runs, and waits for it to exit. */
export async function stopPolicyServer(server: PolicyServer | undefined): Promise<void> {
  if (server === undefined || server.child.exitCode !== null) return;
  const exited = new Promise((r) => server.child.once('exit', r));
  server.child.kill('SIGTERM');
  await exited;
}

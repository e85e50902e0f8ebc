/**
 * The mock inference server in a process of its own (src/loadtest/mock-process.ts): it must never
 * outlive what started it. A bench killed with SIGTERM or SIGKILL runs no 'exit' handler, so the
 * server watches a pipe instead (`rollout mock-llm --stop-with-stdin`), which the kernel closes
 * however its parent dies.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { describe, it } from 'node:test';
import { projectModuleUrl } from '../src/paths.ts';

const CLI = fileURLToPath(projectModuleUrl('src/cli/main'));
const MOCK_PROCESS = fileURLToPath(projectModuleUrl('src/loadtest/mock-process'));

/** The first stdout line matching `re`, or a rejection when the process exits first. */
async function lineMatching(child: ReturnType<typeof spawn>, re: RegExp): Promise<RegExpExecArray> {
  let out = '';
  for await (const chunk of child.stdout!) {
    out += String(chunk);
    const m = re.exec(out);
    if (m) return m;
  }
  throw new Error(`exited before printing ${re}: ${out}`);
}

/**
 * Running, not a zombie: an orphan is reparented to PID 1, which in a container may never reap it,
 * and signal 0 reaches a zombie too.
 */
const alive = (pid: number): boolean => {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
};

describe('the mock server process (loadtest/mock-process.ts)', { timeout: 60_000 }, () => {
  it('rollout mock-llm --stop-with-stdin stops when its standard input ends', async () => {
    const child = spawn(process.execPath, ['--import', 'tsx', CLI, 'mock-llm', '--port', '0', '--stop-with-stdin'], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    const exited = once(child, 'exit');
    await lineMatching(child, /listening on http:\/\/\S+/);
    child.stdin!.end();
    const [code, signal] = await exited;
    assert.deepEqual({ code, signal }, { code: 0, signal: null }, 'it shut down as on SIGTERM');
  });

  // Regression: a bench killed with SIGTERM left its GPU-like mocks running, each spinning a core.
  it('stops a server started by startMockProcess when the process that started it is killed with SIGKILL', {
    skip: !existsSync('/proc/self/stat') && 'reads process states from /proc (Linux)',
  }, async (t) => {
    const script = `
      const { startMockProcess } = await import(${JSON.stringify(MOCK_PROCESS)});
      const m = await startMockProcess(['--capacity', '8']);
      console.log('mock pid ' + m.pid);
      setInterval(() => {}, 1000);
    `;
    // Started with -e, as a script run from a shell might be: its code must not reach the mock's argv.
    const parent = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    t.after(() => parent.kill('SIGKILL'));
    const pid = Number((await lineMatching(parent, /mock pid (\d+)/))[1]);
    assert.ok(alive(pid));
    parent.kill('SIGKILL');
    await once(parent, 'exit');
    // Not a child of this process: nothing to await but its absence, bounded.
    const deadline = Date.now() + 20_000;
    while (alive(pid) && Date.now() < deadline) await sleep(50);
    const gone = !alive(pid);
    if (!gone) process.kill(pid, 'SIGKILL');
    assert.ok(gone, `the mock (pid ${pid}) outlived its parent by 20 s`);
  });
});

/**
 * What the CLI says and leaves behind when it fails or refuses (issue 17, items 9 and 10): one line
 * per error in the same shape for every command, and nothing written that a refused command should
 * not write. Through the real CLI (test/support/cli.ts).
 */
import { rollout } from './support/cli.ts';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';

function mkRunDir(): string {
  return mkdtempSync(join(tmpdir(), 'rollout-cli-errors-'));
}

/** A TCP port on 127.0.0.1 held open by this process, so a command told to listen on it finds it in use. */
async function heldPort(): Promise<{ port: number; server: Server }> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { port: (server.address() as { port: number }).port, server };
}

describe('rollout CLI errors', () => {
  it('a port in use is the same one line from every command that listens, exit 2 (regression: a stack, a raw Node error, "internal")', async () => {
    const { port, server } = await heldPort();
    try {
      const commands: Record<string, string[]> = {
        'mock-llm': ['mock-llm', '--port', String(port)],
        'env-server': ['env-server', '--env', 'builtin:guess-number', '--port', String(port)],
        gateway: ['gateway', '--embedded-mock', '--port', String(port)],
        serve: ['serve', '--port', String(port), '--threads', '1', '--run-dir', mkRunDir()],
      };
      const results = await Promise.all(Object.entries(commands).map(async ([name, args]) => ({ name, ...(await rollout(args)) })));
      for (const { name, code, stderr } of results) {
        assert.equal(code, 2, `${name}: ${stderr}`);
        assert.equal(stderr, `rollout ${name}: cannot listen on 127.0.0.1:${port}: address in use (EADDRINUSE)\n`, name);
      }
    } finally {
      server.close();
    }
  });
});

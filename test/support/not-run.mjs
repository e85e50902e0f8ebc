/**
 * Printed by `npm test` before its suites: what it leaves to other scripts, and why, so a green run is
 * not mistaken for all of them. `.ci/run` installs what they need and runs every one with CI=true.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

const has = (cmd, args) => {
  try {
    execFileSync(cmd, args, { stdio: 'ignore', timeout: 10_000 });
    return true;
  } catch {
    return false;
  }
};
const cache = process.env.ROLLOUT_CACHE_DIR || join(homedir(), '.cache', 'rollout-engine');
const built = existsSync(cache) && has('sh', ['-c', `ls "${cache}"/llama.cpp-*/build.json`]);

const lines = [
  `test/python/*       not run here: they start python3 (${has('python3', ['--version']) ? 'found' : 'not found'}) — npm run test:python`,
  `test/real-server/*  not run here: they build llama.cpp's llama-server (≈10 min the first time, then cached; ${built ? 'a build is cached' : 'none cached yet'}) — npm run test:real-server`,
];
process.stdout.write(
  `npm test runs test/*.test.ts.\n${lines.map((l) => `  ${l}`).join('\n')}\n  .ci/run installs what these need and runs them all.\n\n`,
);

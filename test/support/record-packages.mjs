/**
 * `node --import ./test/support/record-packages.mjs …`: appends every package specifier the process
 * resolves (a bare `import 'x'` or `import('x')`, in any thread that inherits the flag: worker threads
 * do) to the file named by $RECORD_PACKAGES, one per line. test/optional-packages.test.ts reads it to
 * see that a default run never loads an optional dependency.
 */
import { register } from 'node:module';

if (process.env.RECORD_PACKAGES) {
  register('./record-packages-hooks.mjs', import.meta.url, { data: { file: process.env.RECORD_PACKAGES } });
}

/** What an OpenAI-client call that the server refused carries: the HTTP status and the error body. */
import assert from 'node:assert/strict';

export interface Rejection {
  status: number;
  error: { code: string; message: string; details?: Record<string, any>; param: string | null };
}

/** Awaits a call that must fail with an HTTP error and returns its status and error body. */
export async function rejection(promise: Promise<unknown>): Promise<Rejection> {
  try {
    await promise;
  } catch (err) {
    const e = err as { status?: number; error?: unknown };
    assert.ok(typeof e.status === 'number', `expected an HTTP error, got ${String(err)}`);
    return { status: e.status, error: e.error as never };
  }
  assert.fail('the call succeeded but should have been rejected');
}

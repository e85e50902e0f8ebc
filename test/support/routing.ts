/**
 * Checks of stored routed experts against the mock's routing (mockExpert: a function of the token and
 * its position only), for the tests of the gateway's stitched samples.
 */
import assert from 'node:assert/strict';
import type { RoutedExperts, SequenceRouting } from '../../src/domain/routing.ts';
import { mockExpert, type MockRouting } from '../../src/mock-llm/routing.ts';

/** Every position of `tokens` but the last holds the mock's row for its token there; the last the fill. */
export function assertRowsOnTokens(r: SequenceRouting, tokens: ArrayLike<number>, routing: MockRouting): void {
  assert.equal(r.start, 0);
  assert.equal(r.rows, tokens.length, 'one row per observation position');
  assert.deepEqual([r.layers, r.topK], [routing.layers, routing.topK]);
  const width = r.layers * r.topK;
  for (let p = 0; p < tokens.length; p++) {
    for (let l = 0; l < r.layers; l++)
      for (let k = 0; k < r.topK; k++) {
        const got = r.ids[p * width + l * r.topK + k];
        const want = p === tokens.length - 1 ? r.fill : mockExpert(tokens[p], p, l, k, routing.experts);
        if (got !== want)
          assert.fail(
            `position ${p} (token ${tokens[p]}) layer ${l} choice ${k}: expert ${got}, the mock routed ${want}`,
          );
      }
  }
}

/** A call's own rows (from `r.start`) are the mock's for its own sequence. */
export function assertCallRows(r: RoutedExperts, sequence: ArrayLike<number>, routing: MockRouting): void {
  assert.equal(r.start + r.rows, sequence.length - 1, 'rows up to the last token, never forwarded');
  const width = r.layers * r.topK;
  for (let i = 0; i < r.rows; i++)
    for (let j = 0; j < width; j++) {
      const p = r.start + i;
      assert.equal(
        r.ids[i * width + j],
        mockExpert(sequence[p], p, Math.floor(j / r.topK), j % r.topK, routing.experts),
      );
    }
}

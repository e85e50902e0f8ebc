import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { EngineMetrics } from '../src/control/metrics.ts';

describe('wasted tokens in the metrics', () => {
  it('counts the tokens thrown away by cause, and their sum as tokens_total{kind="wasted"} as before', async () => {
    // Only counters are read here: no scrape-time gauge asks the engine for its state.
    const m = new EngineMetrics(() => Promise.reject(new Error('not read in this test')));
    m.discarded(5, 'expired');
    m.discarded(3, 'restarted');
    m.discarded(2, 'restarted');
    m.discarded(0, 'dropped');
    const wasted = await m.registry.getSingleMetricAsString('rollout_engine_wasted_tokens_total');
    assert.match(wasted, /^rollout_engine_wasted_tokens_total\{cause="expired"\} 5$/m);
    assert.match(wasted, /^rollout_engine_wasted_tokens_total\{cause="restarted"\} 5$/m);
    assert.doesNotMatch(wasted, /cause="dropped"/, 'nothing thrown away, no sample');
    const tokens = await m.registry.getSingleMetricAsString('rollout_engine_tokens_total');
    assert.match(tokens, /^rollout_engine_tokens_total\{kind="wasted"\} 10$/m);
  });
});

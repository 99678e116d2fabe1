// Client disconnects free their slot, and a full queue answers 429.
// Server: --parallel 1 --queue 1 --ctx 4096.
import assert from 'node:assert/strict';
import { post, metric, waitMetric, sleep } from './server_sse.mjs';

const long = (extra = {}) => ({ prompt: 'go on', max_tokens: 4000, temperature: 0, ignore_eos: true, ...extra });
const cancelled0 = await metric('glm53_requests_cancelled_total');

// 1. A stream aborted after its first chunks.
{
  const ac = new AbortController();
  const r = await post('/v1/completions', long({ stream: true }), ac.signal);
  assert.equal(r.status, 200);
  const rd = r.body.getReader();
  let got = 0;
  while (got < 3) { const { done } = await rd.read(); if (done) break; got++; }
  assert.equal(await metric('glm53_active_sessions'), 1);
  assert.ok((await metric('glm53_cache_tokens')) > 0, 'the active session holds tokens');
  ac.abort();
  assert.ok(await waitMetric('glm53_active_sessions', 0), 'the aborted stream freed its slot');
  assert.equal(await metric('glm53_cache_tokens'), 0);
}
// 2. A non-stream request abandoned mid-generation.
{
  const ac = new AbortController();
  const p = post('/v1/completions', long(), ac.signal).catch(() => null);
  assert.ok(await waitMetric('glm53_active_sessions', 1, 10000));
  ac.abort();
  await p;
  assert.ok(await waitMetric('glm53_active_sessions', 0), 'the abandoned request freed its slot');
}
assert.ok((await metric('glm53_requests_cancelled_total')) >= cancelled0 + 2);

// 3. Queue full: one active, one queued, the third is refused with 429.
{
  const acs = [new AbortController(), new AbortController()];
  const r1 = await post('/v1/completions', long({ stream: true }), acs[0].signal);
  assert.ok(await waitMetric('glm53_active_sessions', 1, 10000));
  const r2 = await post('/v1/completions', long({ stream: true }), acs[1].signal);
  assert.ok(await waitMetric('glm53_queue_depth', 1, 10000));
  const r3 = await post('/v1/completions', long());
  assert.equal(r3.status, 429);
  const e = (await r3.json()).error;
  assert.equal(e.code, 'queue_full');
  assert.ok((await metric('glm53_requests_rejected_total')) >= 1);
  acs[0].abort(); acs[1].abort();
  void r1; void r2;
  assert.ok(await waitMetric('glm53_active_sessions', 0), 'slots freed after aborting');
  assert.ok(await waitMetric('glm53_queue_depth', 0), 'queue empty after aborting');
}
// 4. The server still answers.
const ok = await post('/v1/completions', { prompt: 'x', max_tokens: 2 });
assert.equal(ok.status, 200);
await sleep(10);
console.log('disconnect / queue: ok');

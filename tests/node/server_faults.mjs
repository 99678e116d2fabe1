// Backend fault injection (server started with GLM53_FAULT=forward:N):
//   mode "fail": the request hit by the fault fails alone (non-stream: 500 +
//     error JSON; stream: an SSE error event then [DONE]); concurrent ones
//     and later ones complete.
//   mode "cpu":  the request is rebuilt on the CPU and completes with the same
//     greedy output as without the fault; the fallback is counted.
//   modes "batch-fail" / "batch-cpu" (forward:40, --parallel 4): the fault
//     lands in a round where 4 streams decode as one batch
//     (glm53_decode_batch_failures_total 1); only the request whose row failed
//     is failed / moved to the CPU, the others go on, and every completed
//     stream equals the same request run alone afterwards (greedy).
//   mode "batch-whole" (GLM53_CPU_BATCH=1, GLM53_FAULT=batch:3): a batched
//     forward fails as a whole; its rows are rebuilt and retried alone, no
//     request fails, every stream equals its solo run.
import assert from 'node:assert/strict';
import { post, readSSE, metric, waitMetric } from './server_sse.mjs';

const mode = process.argv[2];
const q = (p, extra = {}) => ({ prompt: p, max_tokens: 8, temperature: 0, ignore_eos: true, ...extra });

if (mode === 'fail') {
  // forward:6 — 4 concurrent streams, each 1 prefill + 7 decode forwards: one is hit.
  const res = await Promise.all([0, 1, 2, 3].map((i) => post('/v1/completions', q(`stream ${i}`, { stream: true }))));
  let failed = 0, ok = 0;
  for (const r of res) {
    assert.equal(r.status, 200);
    const { events } = await readSSE(r);
    assert.equal(events[events.length - 1], '[DONE]', 'every stream ends with [DONE]');
    const err = events.find((e) => e.error);
    if (err) {
      failed++;
      assert.equal(err.error.type, 'server_error');
      assert.ok(err.error.message.includes('injected fault'), err.error.message);
    } else {
      ok++;
      assert.equal(events.filter((e) => e.choices && e.choices[0]?.finish_reason === 'length').length, 1);
    }
  }
  assert.equal(failed, 1, 'exactly one stream failed');
  assert.equal(ok, 3);
  // a later non-stream request works; the 2nd fault (forward:N+ not set) is not repeated
  const r = await post('/v1/completions', q('after'));
  assert.equal(r.status, 200);
  assert.equal((await r.json()).choices[0].finish_reason, 'length');
  assert.equal(await metric('glm53_backend_errors_total'), 1);
  assert.equal(await metric('glm53_cpu_fallbacks_total'), 0);
  assert.ok(await waitMetric('glm53_active_sessions', 0));
  console.log('fault mode fail: ok');
} else if (mode === 'fail-nonstream') {
  // forward:2 — the first request's decode fails: 500 with an OpenAI error body.
  const r = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0 });
  assert.equal(r.status, 500);
  const e = (await r.json()).error;
  assert.equal(e.type, 'server_error');
  assert.ok(e.message.length > 0);
  const r2 = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, temperature: 0 });
  assert.equal(r2.status, 200);
  console.log('fault mode fail (non-stream): ok');
} else if (mode === 'cpu') {
  // forward:3 — hits the first request mid-decode; it must continue on the CPU.
  const a = await (await post('/v1/completions', q('fallback please'))).json();
  const b = await (await post('/v1/completions', q('fallback please'))).json();
  assert.equal(a.choices[0].finish_reason, 'length');
  assert.equal(a.usage.completion_tokens, 8);
  assert.equal(a.choices[0].text, b.choices[0].text, 'fallback run == clean run (greedy)');
  const s = await post('/v1/completions', q('stream too', { stream: true }));
  const { events } = await readSSE(s);
  assert.ok(!events.some((e) => e.error));
  assert.equal(await metric('glm53_backend_errors_total'), 1);
  assert.equal(await metric('glm53_cpu_fallbacks_total'), 1);
  console.log('fault mode cpu: ok');
} else if (mode === 'batch-fail' || mode === 'batch-cpu') {
  const M = 32;
  const qs = [0, 1, 2, 3].map((i) => q(`batched stream ${i} `.repeat(i + 1), { max_tokens: M, stream: true }));
  const res = await Promise.all(qs.map((b) => post('/v1/completions', b)));
  const got = [];
  for (const r of res) {
    assert.equal(r.status, 200);
    const { events } = await readSSE(r);
    assert.equal(events[events.length - 1], '[DONE]', 'every stream ends with [DONE]');
    const text = events.filter((e) => e.choices).map((e) => e.choices[0]?.text || '').join('');
    const fin = events.find((e) => e.choices && e.choices[0]?.finish_reason)?.choices[0].finish_reason;
    got.push({ err: events.find((e) => e.error)?.error, text, fin });
  }
  // the fault was inside a decode batch of more than one request
  assert.equal(await metric('glm53_decode_batch_failures_total'), 1, 'the fault hit a batched decode step');
  assert.equal(await metric('glm53_backend_errors_total'), 1);
  assert.ok((await metric('glm53_decode_batch_rows_retried_total')) <= 3);
  // references: each request alone (the fault was one-shot, so these are clean)
  for (let i = 0; i < 4; i++) {
    const a = await (await post('/v1/completions', { ...qs[i], stream: false })).json();
    assert.equal(a.choices[0].finish_reason, 'length');
    const g = got[i];
    if (g.err) {
      assert.equal(mode, 'batch-fail', `stream ${i} failed: ${g.err.message}`);
      assert.equal(g.err.type, 'server_error');
      assert.ok(g.err.message.includes('injected fault'), g.err.message);
      assert.ok(a.choices[0].text.startsWith(g.text), `stream ${i}: text before the error is a prefix of its solo run`);
    } else {
      assert.equal(g.fin, 'length', `stream ${i} finished`);
      assert.equal(g.text, a.choices[0].text, `stream ${i}: batched output == solo output (greedy)`);
    }
  }
  const failed = got.filter((g) => g.err).length;
  if (mode === 'batch-fail') {
    assert.equal(failed, 1, 'exactly one stream failed');
    assert.equal(await metric('glm53_cpu_fallbacks_total'), 0);
  } else {
    assert.equal(failed, 0, 'no stream failed');
    assert.equal(await metric('glm53_cpu_fallbacks_total'), 1);
  }
  assert.ok(await waitMetric('glm53_active_sessions', 0));
  console.log(`fault mode ${mode}: ok`);
} else if (mode === 'batch-whole') {
  // GLM53_CPU_BATCH=1 GLM53_FAULT=batch:3, --on-gpu-error fail: the third
  // batched decode forward fails as a whole (as a device error would); every
  // row that did not advance is rebuilt from its history and stepped alone,
  // so no request fails and every stream equals its solo run.
  const M = 24;
  const qs = [0, 1, 2, 3].map((i) => q(`whole batch ${i} `.repeat(i + 1), { max_tokens: M, stream: true }));
  const res = await Promise.all(qs.map((b) => post('/v1/completions', b)));
  const got = [];
  for (const r of res) {
    assert.equal(r.status, 200);
    const { events } = await readSSE(r);
    assert.ok(!events.some((e) => e.error), 'no stream failed');
    got.push(events.filter((e) => e.choices).map((e) => e.choices[0]?.text || '').join(''));
  }
  assert.equal(await metric('glm53_decode_batch_failures_total'), 1, 'one batched forward failed');
  assert.equal(await metric('glm53_backend_errors_total'), 1, 'counted once');
  assert.ok((await metric('glm53_decode_batch_rows_retried_total')) >= 2, 'its rows were rebuilt and retried');
  assert.equal(await metric('glm53_cpu_fallbacks_total'), 0);
  for (let i = 0; i < 4; i++) {
    const a = await (await post('/v1/completions', { ...qs[i], stream: false })).json();
    assert.equal(got[i], a.choices[0].text, `stream ${i}: output after the rebuild == solo output (greedy)`);
  }
  assert.ok(await waitMetric('glm53_active_sessions', 0));
  console.log('fault mode batch-whole: ok');
} else {
  console.error('usage: server_faults.mjs fail|fail-nonstream|cpu|batch-fail|batch-cpu|batch-whole');
  process.exit(2);
}

// A client that goes away while its request decodes in a batch frees the
// slot; the requests batched with it go on and give their solo outputs.
// Server: --parallel 4 (+ any --ctx >= 512).
import assert from 'node:assert/strict';
import { post, readSSE, metric, waitMetric } from './server_sse.mjs';

const q = (p, max_tokens, extra = {}) => ({ prompt: p, max_tokens, temperature: 0, ignore_eos: true, ...extra });
const short = [q('batched neighbour one', 40), q('batched neighbour two, a little longer', 40)];
const ref = [];
for (const b of short) ref.push((await (await post('/v1/completions', b)).json()).choices[0].text);
const cancelled0 = await metric('glm53_requests_cancelled_total');

const acs = [new AbortController(), new AbortController()];
const longs = await Promise.all(acs.map((ac, i) => post('/v1/completions', q(`go on ${i}`, 4000, { stream: true }), ac.signal)));
const shorts = short.map((b) => post('/v1/completions', { ...b, stream: true }));
// the first long stream is decoding (a few chunks out) together with others
const rd = longs[0].body.getReader();
for (let got = 0; got < 4; got++) if ((await rd.read()).done) break;
let batched = false;
for (let k = 0; k < 200 && !batched; k++) {
  batched = (await metric('glm53_decode_batch_size_current')) >= 2;
  if (!batched) await new Promise((r) => setTimeout(r, 20));
}
assert.ok(batched, 'requests decode in one batch');
acs[0].abort();
assert.ok(await waitMetric('glm53_requests_cancelled_total', cancelled0 + 1), 'the aborted request was cancelled');
// its neighbours finish with their solo outputs
for (let i = 0; i < shorts.length; i++) {
  const { events } = await readSSE(await shorts[i]);
  assert.ok(!events.some((e) => e.error));
  const text = events.filter((e) => e.choices).map((e) => e.choices[0]?.text || '').join('');
  assert.equal(text, ref[i], `neighbour ${i}: output == solo output`);
}
acs[1].abort();
assert.ok(await waitMetric('glm53_active_sessions', 0), 'slots freed');
assert.equal(await metric('glm53_cache_tokens'), 0);
assert.equal(await metric('glm53_requests_cancelled_total'), cancelled0 + 2);
console.log('batched disconnect: ok');

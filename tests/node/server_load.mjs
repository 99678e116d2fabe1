// Load test for `glm53 serve` (SRV_URL, SRV_PID): N concurrent streaming
// clients (openai client), three waves. Every stream must end with a
// finish_reason and usage, none lost; greedy outputs under load must equal
// the same requests run alone; server RSS must not grow wave after wave
// (skipped when LOAD_SKIP_RSS=1, e.g. under ASan).
import OpenAI from 'openai';
import fs from 'node:fs';

const N = Number(process.env.LOAD_CLIENTS || 36), MAXTOK = Number(process.env.LOAD_MAX_TOKENS || 12);
const client = new OpenAI({ baseURL: process.env.SRV_URL + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });
const model = (await client.models.list()).data[0].id;
const prompts = Array.from({ length: 6 }, (_, i) => `Prompt number ${i}: ${'lorem ipsum '.repeat(i)}end`);
const req = (i) => ({ model, prompt: prompts[i % prompts.length], max_tokens: MAXTOK, temperature: 0, ignore_eos: true });
const chatReq = (i) => ({ model, messages: [{ role: 'user', content: prompts[i % prompts.length] }], max_tokens: MAXTOK, temperature: 0, ignore_eos: true });
const rss = () => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${process.env.SRV_PID}/status`, 'utf8'))[1]);

// reference: each distinct request alone
const alone = [], aloneChat = [];
for (let i = 0; i < prompts.length; i++) {
  alone.push((await client.completions.create(req(i))).choices[0].text);
  aloneChat.push((await client.chat.completions.create(chatReq(i))).choices[0].message);
}

let fail = 0;
async function one(i) {
  if (i % 8 === 7) { // one in 8 is a chat stream (chat prompts are long with the byte-level fixture tokenizer)
    const s = await client.chat.completions.create({ ...chatReq(i), stream: true, stream_options: { include_usage: true } });
    let r = '', c = '', fin = null, usage = null;
    for await (const ch of s) {
      if (ch.usage) usage = ch.usage;
      for (const x of ch.choices) { r += x.delta.reasoning_content || ''; c += x.delta.content || ''; if (x.finish_reason) fin = x.finish_reason; }
    }
    const ref = aloneChat[i % prompts.length];
    if (fin !== 'length' || !usage || usage.completion_tokens !== MAXTOK) throw new Error(`chat ${i}: finish ${fin} usage ${JSON.stringify(usage)}`);
    if (r.trim() !== (ref.reasoning_content || '').trim() || c.trim() !== (ref.content || '').trim()) throw new Error(`chat ${i}: output differs from the request run alone`);
    return MAXTOK;
  }
  const s = await client.completions.create({ ...req(i), stream: true, stream_options: { include_usage: true } });
  let t = '', fin = null, usage = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    for (const x of ch.choices) { t += x.text; if (x.finish_reason) fin = x.finish_reason; }
  }
  if (fin !== 'length' || !usage || usage.completion_tokens !== MAXTOK) throw new Error(`cmpl ${i}: finish ${fin} usage ${JSON.stringify(usage)}`);
  if (t !== alone[i % prompts.length]) throw new Error(`cmpl ${i}: output differs from the request run alone`);
  return MAXTOK;
}

async function wave(name) {
  const t0 = performance.now();
  const res = await Promise.allSettled(Array.from({ length: N }, (_, i) => one(i)));
  const dt = (performance.now() - t0) / 1000;
  const ok = res.filter((r) => r.status === 'fulfilled').length;
  for (const r of res) if (r.status === 'rejected') { fail++; console.error(`FAIL ${name}:`, r.reason?.message || r.reason); }
  console.log(`${name}: ${ok}/${N} streams complete in ${dt.toFixed(2)} s = ${(N / dt).toFixed(1)} req/s, ${(ok * MAXTOK / dt).toFixed(0)} generated tok/s`);
}

// RSS once the server is idle again (no active session; the scheduler
// returns freed memory to the OS when it goes idle): the lowest of a few
// samples, so a trim still under way does not count as growth.
async function idleRss() {
  for (let i = 0; i < 50; i++) {
    const m = await (await fetch(process.env.SRV_URL + '/metrics')).text();
    if (/^glm53_active_sessions 0$/m.test(m)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  let best = Infinity;
  for (let i = 0; i < 5; i++) { await new Promise((r) => setTimeout(r, 100)); best = Math.min(best, rss()); }
  return best;
}

// Idle RSS must not grow by more than 16 MB over any wave, nor by more than
// 8 MB over each of the last two (a smaller leak repeats every wave: with 32
// requests a wave, that catches 256 kB or more per request).
const r = [];
for (const name of ['wave 1', 'wave 2', 'wave 3']) { await wave(name); r.push(await idleRss()); }
console.log(`server RSS when idle after waves 1-3: ${r.join(' / ')} kB`);
const grow = [r[1] - r[0], r[2] - r[1]];
if (process.env.LOAD_SKIP_RSS !== '1' && (Math.max(...grow) > 16 * 1024 || Math.min(...grow) > 8 * 1024)) {
  console.error(`FAIL: RSS grew by ${grow[0]} then ${grow[1]} kB`);
  fail++;
}
process.exitCode = fail ? 1 : 0;

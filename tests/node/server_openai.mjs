// The official openai client against `glm53 serve` (SRV_URL): completions and
// chat, streaming and not, with logprobs, stop, seed and tools; every
// response must parse and have the OpenAI shape. Exits non-zero on failure.
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const base = process.env.SRV_URL;
const client = new OpenAI({ baseURL: base + '/v1', apiKey: process.env.SRV_KEY || 'none', maxRetries: 0, timeout: 60000 });
let passed = 0;
async function test(name, fn) {
  try { await fn(); passed++; console.log('ok', name); }
  catch (e) { console.error('FAIL', name, e); process.exitCode = 1; }
}
const usageOk = (u, n) => {
  assert.ok(u.prompt_tokens > 0);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  if (n !== undefined) assert.ok(u.completion_tokens <= n);
};

const models = await client.models.list();
const model = models.data[0].id;
await test('models', async () => { assert.equal(models.data.length, 1); assert.equal(models.data[0].object, 'model'); });

await test('completion', async () => {
  const r = await client.completions.create({ model, prompt: 'Hello world', max_tokens: 6, temperature: 0, ignore_eos: true });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 6);
  usageOk(r.usage, 6);
});

if (process.env.SRV_QUICK === '1') { console.log(`${passed} passed (quick)`); process.exit(process.exitCode || 0); }

await test('completion logprobs + seed determinism', async () => {
  const q = { model, prompt: 'abc', max_tokens: 5, temperature: 0.9, seed: 42, logprobs: 3, ignore_eos: true };
  const a = await client.completions.create(q), b = await client.completions.create(q);
  assert.equal(a.choices[0].text, b.choices[0].text);
  const lp = a.choices[0].logprobs;
  assert.equal(lp.tokens.length, 5);
  assert.equal(lp.token_logprobs.length, 5);
  assert.ok(lp.token_logprobs.every((x) => typeof x === 'number' && x <= 0));
  assert.ok(lp.top_logprobs.every((o) => Object.keys(o).length >= 1 && Object.keys(o).length <= 3));
});

await test('completion token-id prompt', async () => {
  const r = await client.completions.create({ model, prompt: [1, 2, 3], max_tokens: 2, temperature: 0 });
  assert.equal(r.usage.prompt_tokens, 3);
});

await test('completion stream', async () => {
  const s = await client.completions.create({ model, prompt: 'Hello', max_tokens: 8, temperature: 0, stream: true, ignore_eos: true,
    stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) { text += ch.text; if (ch.finish_reason) finish = ch.finish_reason; }
  }
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 8);
  const r = await client.completions.create({ model, prompt: 'Hello', max_tokens: 8, temperature: 0, ignore_eos: true });
  assert.equal(text, r.choices[0].text, 'stream text == non-stream text');
});

await test('completion stop string', async () => {
  const r0 = await client.completions.create({ model, prompt: 'xyz', max_tokens: 12, temperature: 0, ignore_eos: true });
  const t = r0.choices[0].text;
  // pick a stop string from the middle of the greedy output (if it has ASCII)
  const m = t.slice(2).match(/[ -~]/);
  if (!m) return;
  const r = await client.completions.create({ model, prompt: 'xyz', max_tokens: 12, temperature: 0, ignore_eos: true, stop: [m[0], 'never-seen'] });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.ok(!r.choices[0].text.includes(m[0]));
  assert.ok(t.startsWith(r.choices[0].text));
});

await test('chat', async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi there' }],
    max_tokens: 6, temperature: 0, top_p: 0.9, top_k: 40, min_p: 0.01, presence_penalty: 0.5, frequency_penalty: 0.5, repetition_penalty: 1.1 });
  assert.equal(r.object, 'chat.completion');
  const m = r.choices[0].message;
  assert.equal(m.role, 'assistant');
  assert.ok(typeof m.content === 'string' || m.content === null);
  assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
  usageOk(r.usage, 6);
});

await test('chat logprobs', async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, temperature: 0,
    logprobs: true, top_logprobs: 2, ignore_eos: true });
  const c = r.choices[0].logprobs.content;
  assert.equal(c.length, 4);
  for (const e of c) {
    assert.equal(typeof e.token, 'string');
    assert.ok(Array.isArray(e.bytes));
    assert.equal(e.top_logprobs.length, 2);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
  }
});

await test('chat with tools + multi-turn tool results', async () => {
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const messages = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' },
  ];
  const r = await client.chat.completions.create({ model, messages, tools, max_tokens: 4, temperature: 0 });
  assert.equal(r.choices[0].message.role, 'assistant');
  const s = await client.chat.completions.create({ model, messages, tools, max_tokens: 4, temperature: 0, stream: true });
  let n = 0;
  for await (const c of s) { n++; assert.equal(c.object, 'chat.completion.chunk'); }
  assert.ok(n >= 2);
});

await test('chat stream', async () => {
  const q = { model, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 10, temperature: 0, ignore_eos: true };
  const s = await client.chat.completions.create({ ...q, stream: true, stream_options: { include_usage: true } });
  let reasoning = '', content = '', finish = null, usage = null, role = null;
  for await (const c of s) {
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta.role) role = ch.delta.role;
      reasoning += ch.delta.reasoning_content || '';
      content += ch.delta.content || '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 10);
  const r = await client.chat.completions.create(q);
  const m = r.choices[0].message;
  // the non-stream fields are trimmed; the streamed ones are raw
  assert.equal((m.reasoning_content || '').trim(), reasoning.trim());
  assert.equal((m.content || '').trim(), content.trim());
});

await test('chat stream logprobs', async () => {
  const s = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], max_tokens: 3, temperature: 0,
    logprobs: true, top_logprobs: 1, stream: true, ignore_eos: true });
  let n = 0;
  for await (const c of s) for (const ch of c.choices) if (ch.logprobs && ch.logprobs.content) n += ch.logprobs.content.length;
  assert.equal(n, 3);
});

await test('error surfaces as APIError', async () => {
  await assert.rejects(client.chat.completions.create({ model, messages: [], max_tokens: 2 }), (e) => e.status === 400 && !!e.error);
});

console.log(`${passed} passed`);

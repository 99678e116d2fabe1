// Malformed and hostile requests against `glm53 serve` (SRV_URL, key SRV_KEY,
// --ctx 256, --max-body 65536): each must get the expected 4xx with an OpenAI
// error body; the server must stay healthy. Exits non-zero on failure.
import http from 'node:http';
import net from 'node:net';

const U = new URL(process.env.SRV_URL), KEY = process.env.SRV_KEY;
function request(method, path, body, headers = {}) {
  return new Promise((resolve) => {
    const h = { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json', ...headers };
    for (const k of Object.keys(h)) if (h[k] === null) delete h[k];
    const r = http.request({ host: U.hostname, port: U.port, method, path, headers: h, timeout: 30000 }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString('utf8') }));
    });
    r.on('error', (e) => resolve({ status: 0, body: String(e) }));
    r.on('timeout', () => { r.destroy(); resolve({ status: 0, body: 'timeout' }); });
    if (body !== undefined) r.write(body);
    r.end();
  });
}
function raw(bytes, waitMs = 2000) { // raw TCP: returns what came back (maybe nothing)
  return new Promise((resolve) => {
    const s = net.connect(Number(U.port), U.hostname);
    let out = '';
    s.on('data', (d) => { out += d.toString('latin1'); });
    s.on('error', () => resolve(out));
    s.on('close', () => resolve(out));
    s.setTimeout(waitMs, () => { s.destroy(); resolve(out); });
    s.write(bytes);
  });
}

const C = '/v1/completions', CH = '/v1/chat/completions';
const msg = (content) => JSON.stringify({ messages: [{ role: 'user', content }], max_tokens: 2 });
const chat = (extra) => JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, ...extra });
const cmpl = (extra) => JSON.stringify({ prompt: 'hi', max_tokens: 2, ...extra });
const badUtf8 = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"a'), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}]}')]);
const badUtf8Prompt = Buffer.concat([Buffer.from('{"prompt":"'), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from('"}')]);

const cases = [
  ['bad JSON', 'POST', CH, '{', 400],
  ['truncated JSON', 'POST', CH, '{"messages":[{"role":"user","content":"hi"}],"max_tok', 400],
  ['huge body', 'POST', CH, '{"prompt":"' + 'a'.repeat(200000) + '"}', 413],
  ['body is an array', 'POST', CH, '[]', 400],
  ['body is a string', 'POST', C, '"hello"', 400],
  ['empty body', 'POST', C, '', 400],
  ['deeply nested JSON', 'POST', C, '['.repeat(20000) + ']'.repeat(20000), 400],
  ['number 1e999', 'POST', C, cmpl({}).replace('"max_tokens":2', '"max_tokens":2,"temperature":1e999'), 400],
  ['prompt wrong type', 'POST', C, JSON.stringify({ prompt: 42 }), 400],
  ['prompt missing', 'POST', C, JSON.stringify({ max_tokens: 3 }), 400],
  ['prompt list of two', 'POST', C, JSON.stringify({ prompt: ['a', 'b'] }), 400],
  ['prompt token id out of range', 'POST', C, JSON.stringify({ prompt: [1, 99999999] }), 400],
  ['prompt token id negative', 'POST', C, JSON.stringify({ prompt: [-1] }), 400],
  ['messages missing', 'POST', CH, JSON.stringify({ max_tokens: 2 }), 400],
  ['messages not an array', 'POST', CH, JSON.stringify({ messages: 'hi' }), 400],
  ['messages empty', 'POST', CH, JSON.stringify({ messages: [] }), 400],
  ['message not an object', 'POST', CH, JSON.stringify({ messages: ['hi'] }), 400],
  ['role missing', 'POST', CH, JSON.stringify({ messages: [{ content: 'hi' }] }), 400],
  ['role unknown', 'POST', CH, JSON.stringify({ messages: [{ role: 'wizard', content: 'hi' }] }), 400],
  ['content a number', 'POST', CH, msg(7), 400],
  ['content parts malformed', 'POST', CH, msg([1, 2]), 400],
  ['tool_calls malformed', 'POST', CH, JSON.stringify({ messages: [{ role: 'assistant', content: null, tool_calls: [{ function: 3 }] }] }), 400],
  ['tools not an array', 'POST', CH, chat({ tools: 'x' }), 400],
  ['invalid UTF-8 in content', 'POST', CH, badUtf8, 400],
  ['invalid UTF-8 (surrogate) in prompt', 'POST', C, badUtf8Prompt, 400],
  ['max_tokens negative', 'POST', C, cmpl({ max_tokens: -5 }), 400],
  ['max_tokens zero', 'POST', C, cmpl({ max_tokens: 0 }), 400],
  ['max_tokens a string', 'POST', C, cmpl({ max_tokens: '10' }), 400],
  ['max_tokens fractional', 'POST', CH, chat({ max_tokens: 2.5 }), 400],
  ['max_completion_tokens negative', 'POST', CH, chat({ max_completion_tokens: -1 }), 400],
  ['temperature too high', 'POST', C, cmpl({ temperature: 5 }), 400],
  ['temperature a string', 'POST', C, cmpl({ temperature: 'hot' }), 400],
  ['top_p zero', 'POST', C, cmpl({ top_p: 0 }), 400],
  ['top_p above 1', 'POST', CH, chat({ top_p: 1.5 }), 400],
  ['top_k fractional', 'POST', C, cmpl({ top_k: 1.5 }), 400],
  ['min_p negative', 'POST', C, cmpl({ min_p: -0.1 }), 400],
  ['presence_penalty out of range', 'POST', CH, chat({ presence_penalty: 3 }), 400],
  ['repetition_penalty zero', 'POST', CH, chat({ repetition_penalty: 0 }), 400],
  ['seed fractional', 'POST', C, cmpl({ seed: 1.5 }), 400],
  ['stop a number', 'POST', C, cmpl({ stop: 5 }), 400],
  ['stop array with a number', 'POST', CH, chat({ stop: ['a', 1] }), 400],
  ['stop empty string', 'POST', C, cmpl({ stop: '' }), 400],
  ['stop too many', 'POST', C, cmpl({ stop: Array.from({ length: 20 }, (_, i) => 's' + i) }), 400],
  ['stream not a bool', 'POST', CH, chat({ stream: 'yes' }), 400],
  ['stream_options not an object', 'POST', CH, chat({ stream: true, stream_options: 1 }), 400],
  ['n = 2', 'POST', C, cmpl({ n: 2 }), 400],
  ['completions logprobs too many', 'POST', C, cmpl({ logprobs: 50 }), 400],
  ['chat top_logprobs too many', 'POST', CH, chat({ logprobs: true, top_logprobs: 30 }), 400],
  ['top_logprobs without logprobs', 'POST', CH, chat({ top_logprobs: 2 }), 400],
  ['chat logprobs not a bool', 'POST', CH, chat({ logprobs: 3 }), 400],
  ['unknown model', 'POST', CH, chat({ model: 'gpt-17' }), 404],
  ['model wrong type', 'POST', CH, chat({ model: 5 }), 400],
  ['prompt longer than ctx', 'POST', C, JSON.stringify({ prompt: 'word '.repeat(400) }), 400],
  ['token prompt longer than ctx', 'POST', C, JSON.stringify({ prompt: Array(300).fill(5) }), 400],
  ['chat longer than ctx', 'POST', CH, msg('long '.repeat(300)), 400],
  ['unknown path', 'POST', '/v1/nope', '{}', 404],
  ['unknown path GET', 'GET', '/admin', undefined, 404],
  ['path traversal', 'GET', '/../../etc/passwd', undefined, 404],
  ['wrong method GET chat', 'GET', CH, undefined, 405],
  ['wrong method DELETE models', 'DELETE', '/v1/models', undefined, 405],
  ['wrong method POST health', 'POST', '/health', '{}', 405],
  ['missing api key', 'POST', CH, chat({}), 401, { Authorization: null }],
  ['bad api key', 'POST', CH, chat({}), 401, { Authorization: 'Bearer nope' }],
  ['malformed auth header', 'GET', '/v1/models', undefined, 401, { Authorization: 'Basic abc' }],
];

let fail = 0;
for (const [name, method, path, body, want, headers] of cases) {
  const r = await request(method, path, body, headers);
  let ok = r.status === want;
  if (ok && path.startsWith('/v1/') || ok && r.status === 405 || ok && r.status === 404) {
    try {
      const e = JSON.parse(r.body).error;
      ok = typeof e.message === 'string' && e.message.length > 0 && typeof e.type === 'string' && 'param' in e && 'code' in e;
    } catch { ok = false; }
  }
  if (!ok) { fail++; console.error(`FAIL ${name}: status ${r.status} (want ${want}) body ${r.body.slice(0, 200)}`); }
  else console.log(`ok ${name}: ${r.status} ${r.body.slice(0, 100)}`);
}

// Raw TCP abuse: the server must not crash or hang (any answer or none).
await raw('HELLO\r\n\r\n', 1000);
await raw(`POST ${C} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\nAuthorization: Bearer ${KEY}\r\n\r\n{"prompt":`, 300); // body cut off
await raw(`POST ${C} HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n`, 1000);
await raw(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(100000)}\r\n\r\n`, 1000);
const crlf = await raw(`GET /health HTTP/1.1\r\nHost: x\r\n\r\n`, 500);
if (!crlf.startsWith('HTTP/1.1 200')) { fail++; console.error('FAIL raw health: ' + crlf.slice(0, 80)); }

const h = await request('GET', '/health');
if (h.status !== 200) { fail++; console.error('FAIL: /health after the bad inputs:', h.status); }
const good = await request('POST', CH, chat({}));
if (good.status !== 200 || !JSON.parse(good.body).choices) { fail++; console.error('FAIL: a good request after the bad ones:', good.status, good.body); }
console.log(`${cases.length} bad requests, ${fail} failures`);
process.exitCode = fail ? 1 : 0;

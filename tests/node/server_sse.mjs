// Small raw-HTTP helpers for the server tests (no openai client: these tests
// look at error events, aborted streams and status codes directly).
export const URL_ = process.env.SRV_URL;

export async function post(path, body, signal) {
  return fetch(URL_ + path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal });
}

// Reads a whole SSE response: { events: [parsed JSON | '[DONE]'], raw }.
export async function readSSE(res) {
  const text = await res.text();
  const events = [];
  for (const block of text.split('\n\n')) {
    const line = block.split('\n').find((l) => l.startsWith('data: '));
    if (!line) continue;
    const d = line.slice(6);
    events.push(d === '[DONE]' ? d : JSON.parse(d));
  }
  return { events, raw: text };
}

export async function metric(name) {
  const t = await (await fetch(URL_ + '/metrics')).text();
  const line = t.split('\n').find((l) => l.startsWith(name + ' '));
  return line ? Number(line.split(' ')[1]) : NaN;
}

export async function waitMetric(name, value, ms = 20000) {
  const t0 = Date.now();
  while (Date.now() - t0 < ms) {
    if ((await metric(name)) === value) return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return false;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

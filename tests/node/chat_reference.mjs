// Renders varied GLM-5.3 conversations with @huggingface/jinja from the
// official template (tests/data/glm5/chat_template.jinja) for the C renderer's
// byte-for-byte comparison: node chat_reference.mjs OUT.json
import { Template } from '@huggingface/jinja';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const src = fs.readFileSync(path.join(here, '..', 'data', 'glm5', 'chat_template.jinja'), 'utf8');
const tpl = new Template(src);

const weather = { type: 'function', function: { name: 'get_weather', description: 'Get the weather — 天气 ☀️',
  parameters: { type: 'object', properties: { city: { type: 'string', description: 'City "name"' },
    days: { type: 'integer', minimum: 1, maximum: 14 }, unit: { type: 'string', enum: ['c', 'f'] },
    ratio: { type: 'number', default: 0.5 } }, required: ['city'] }, strict: true } };
const search = { type: 'function', function: { name: 'search', description: 'Web search\nwith newline',
  parameters: { type: 'object', properties: { q: { type: 'string' }, n: { type: 'integer' } } } } };
const hidden = { type: 'function', function: { name: 'hidden', description: 'deferred', defer_loading: true,
  parameters: {} } };
const bare = { name: 'bare_tool', description: 'no wrapper', parameters: { type: 'object', properties: {} } };
const tc = (id, name, args) => ({ id, type: 'function', function: { name, arguments: args } });

const cases = [];
const add = (name, kwargs) => cases.push({ name, kwargs });
const hi = [{ role: 'user', content: 'Hi' }];
for (const e of ['low', 'high', 'medium', 'max', 'LOW', 'none', '', undefined])
  add(`effort_${e}`, { messages: hi, add_generation_prompt: true, ...(e === undefined ? {} : { reasoning_effort: e }) });
add('empty_messages', { messages: [], add_generation_prompt: true });
add('no_gen_prompt', { messages: hi, add_generation_prompt: false });
add('systems', { messages: [{ role: 'system', content: 'Be brief.' }, { role: 'system', content: 'Second\nsystem' },
  { role: 'user', content: 'Q' }, { role: 'system', content: 'late system' }], add_generation_prompt: true });
add('multi_turn_reasoning', { messages: [{ role: 'user', content: 'a' },
  { role: 'assistant', content: ' A1 \n', reasoning_content: 'r1' }, { role: 'user', content: 'b' },
  { role: 'assistant', content: 'A2', reasoning_content: '' }, { role: 'user', content: 'c' },
  { role: 'assistant', content: '<think>inline r3</think>\n\nA3' }, { role: 'user', content: 'd' }],
  add_generation_prompt: true });
add('multi_turn_clear', { messages: [{ role: 'user', content: 'a' },
  { role: 'assistant', content: 'A1', reasoning_content: 'r1' }, { role: 'user', content: 'b' },
  { role: 'assistant', content: 'A2', reasoning_content: 'r2' }], clear_thinking: true, add_generation_prompt: false });
add('think_split_edge', { messages: [{ role: 'user', content: 'x' },
  { role: 'assistant', content: 'pre<think>one<think>two</think>mid</think>  tail  ' }], add_generation_prompt: true });
add('think_no_open', { messages: [{ role: 'user', content: 'x' }, { role: 'assistant', content: 'just r</think>ans' }] });
add('reasoning_with_think_in_content', { messages: [{ role: 'user', content: 'x' },
  { role: 'assistant', content: '<think>ignored</think>kept', reasoning_content: 'R' }] });
add('tools_basic', { messages: [{ role: 'user', content: 'weather in 北京?' }], tools: [weather, search],
  add_generation_prompt: true });
add('tools_deferred_bare', { messages: hi, tools: [hidden, bare, weather], add_generation_prompt: true,
  reasoning_effort: 'high' });
add('tools_empty_list', { messages: hi, tools: [], add_generation_prompt: true });
add('tool_roundtrip_two_calls_sorted', { messages: [{ role: 'user', content: 'Paris and Rome, also search' },
  { role: 'assistant', content: null, reasoning_content: 'two calls',
    tool_calls: [tc('c1', 'get_weather', { city: 'Paris', days: 2 }), tc('c2', 'search', { q: 'rome "news"', n: 3 })] },
  { role: 'tool', tool_call_id: 'c2', content: 'results: […]' },
  { role: 'tool', tool_call_id: 'c1', content: '{"temp": 20}' },
  { role: 'assistant', content: 'Done.', reasoning_content: 'summarize' }, { role: 'user', content: 'thanks' }],
  tools: [weather, search], add_generation_prompt: true });
add('tool_results_missing_ids', { messages: [{ role: 'user', content: 'q' },
  { role: 'assistant', content: 'calling', tool_calls: [tc('a', 'search', { q: 'x' }), tc('b', 'search', { q: 'y' })] },
  { role: 'tool', content: 'second' }, { role: 'tool', tool_call_id: 'a', content: 'first' }],
  tools: [search], add_generation_prompt: true });
add('tool_results_dup_ids', { messages: [{ role: 'user', content: 'q' },
  { role: 'assistant', content: '', tool_calls: [tc('a', 'search', { q: 'x' }), tc('b', 'search', { q: 'y' })] },
  { role: 'tool', tool_call_id: 'b', content: 'B1' }, { role: 'tool', tool_call_id: 'b', content: 'B2' }],
  add_generation_prompt: true });
add('tool_results_unknown_id', { messages: [{ role: 'user', content: 'q' },
  { role: 'assistant', content: '', tool_calls: [tc('a', 'search', { q: 'x' })] },
  { role: 'tool', tool_call_id: 'zzz', content: 'Z' }], add_generation_prompt: true });
add('tool_first_message', { messages: [{ role: 'tool', content: 'orphan' }, { role: 'user', content: 'q' }],
  add_generation_prompt: true });
add('tool_args_types', { messages: [{ role: 'user', content: 'q' },
  { role: 'assistant', content: 'ok', tool_calls: [tc('t1', 'f', { s: 'line1\nline2 "q" \\ é 😀', i: -7, f: 0.25,
    big: 12345678901, b: false, n: null, arr: [1, 'two', { three: 3 }], obj: { k: 'v', nested: { z: [] } },
    emptyobj: {}, uni: '中文' })] }], add_generation_prompt: true });
add('args_as_string_json', { messages: [{ role: 'user', content: 'q' },
  { role: 'assistant', content: '', tool_calls: [{ id: 'x', type: 'function',
    function: { name: 'f', arguments: { a: 1 } } }] },
  { role: 'tool', tool_call_id: 'x', content: '' }], add_generation_prompt: true });
add('unicode', { messages: [{ role: 'system', content: 'Réponds en français. 日本語も。' },
  { role: 'user', content: '👨‍👩‍👧 مرحبا\t\r\nשלום   ' },
  { role: 'assistant', content: '\u00a0 ciao \u3000', reasoning_content: '思考…' }, { role: 'user', content: '' }],
  add_generation_prompt: true, reasoning_effort: 'low' });
add('assistant_after_assistant', { messages: [{ role: 'user', content: 'q' },
  { role: 'assistant', content: 'one', reasoning_content: 'R1' }, { role: 'assistant', content: 'two' }] });
add('content_parts', { messages: [{ role: 'user', content: [{ type: 'text', text: 'look: ' },
  { type: 'image_url', image_url: { url: 'x' } }, { type: 'text', text: ' ok' }] }], add_generation_prompt: true });
add('special_text_in_content', { messages: [{ role: 'user', content: '<|user|>[gMASK]<sop></think>' }],
  add_generation_prompt: true });

for (const c of cases) c.rendered = tpl.render(c.kwargs);
// Known difference: @huggingface/jinja keeps a `set` from an earlier loop
// iteration (reasoning_content leaks into the next assistant turn); Python
// Jinja2 (transformers, vLLM, SGLang) scopes it to the iteration. The C
// renderer follows Python, so this case carries the Python render.
for (const c of cases) if (c.name === 'assistant_after_assistant')
  c.expected = '[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>q<|assistant|><think>R1</think>one<|assistant|><think></think>two';
const out = process.argv[2];
if (!out) { console.error('usage: node chat_reference.mjs OUT.json'); process.exit(2); }
fs.writeFileSync(out, JSON.stringify({ cases }));
console.error(`chat_reference: ${cases.length} cases -> ${out}`);

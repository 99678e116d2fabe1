// Reference token ids from Hugging Face's own JS tokenizer for the
// conformance test: node tok_reference.mjs CORPUS_DIR OUT.json
// Cases: every corpus file whole, each of its blank-line-separated chunks,
// a few edge strings and seeded random strings; encoded with
// add_special_tokens=false by each of the four tokenizer.json files shipped in
// the @lenml packages, plus Llama-3's with GLM's split regex (written next to OUT).
import { Tokenizer } from '@huggingface/tokenizers';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const [corpusDir, outPath] = process.argv.slice(2);
if (!corpusDir || !outPath) {
  console.error('usage: node tok_reference.mjs CORPUS_DIR OUT.json');
  process.exit(2);
}
const here = path.dirname(fileURLToPath(import.meta.url));
const names = ['llama3', 'gpt35turbo', 'qwen3', 'deepseek_v3'];

const texts = ['', ' ', '  ', '\n', '\r\n', 'a', ' a', 'a ', '<|endoftext|>', '<think>', '<｜User｜>',
  '1234567', "'s", "I'LL", '\t\t', '😀', 'e\u0301', '   x', 'x   '];
for (const f of fs.readdirSync(corpusDir).filter((f) => f.endsWith('.txt')).sort()) {
  const t = fs.readFileSync(path.join(corpusDir, f), 'utf8');
  texts.push(t);
  for (const chunk of t.split(/(?<=\n\n)/)) if (chunk.length) texts.push(chunk);
}

// Random strings from a pool of tricky pieces (fixed seed, so reproducible).
let seed = 12345;
const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };
const pool = ['a', 'Z', 'é', 'e\u0301', 'ß', 'ſ', 'İ', ' ', '  ', '\t', '\n', '\r', '\r\n', '\u00a0', '\u3000', '\u0085',
  '\ufeff', '\u200b', '\u2028', '0', '7', '٣', '１', "'", "'s", "'LL", '’', '.', ',', '!', '?', '-', '_', '(', '"', '<', '>',
  '|', '中', '文', 'の', '한', 'я', 'ع', 'ह', '\u093f', '😀', '👍🏽', '\u200d', '🇯🇵', '\ufe0f', '<|endoftext|>', '<think>',
  '</think>', '<|im_start|>', '<｜User｜>', '<|begin_of_text|>', 'the', ' the', 'ing', '123456', '\\', '{', '}', '#', '$'];
for (let i = 0; i < 400; i++) {
  let t = '';
  const n = 1 + rnd(40);
  for (let k = 0; k < n; k++) t += pool[rnd(pool.length)];
  texts.push(t);
}

// GLM-4/5's split regex (llama.cpp CHATGLM4, docs glm53-architecture.md §11)
// on the Llama-3 vocabulary: checks that exact pattern through PCRE2 vs JS.
const GLM_RE = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
names.push('llama3_glm_regex');

const out = { texts, tokenizers: [] };
for (const name of names) {
  const base = name === 'llama3_glm_regex' ? 'llama3' : name;
  const dir = path.join(here, 'node_modules', '@lenml', `tokenizer-${base}`, 'models');
  let file = path.join(dir, 'tokenizer.json');
  const json = JSON.parse(fs.readFileSync(file, 'utf8'));
  if (name === 'llama3_glm_regex') {
    json.pre_tokenizer.pretokenizers[0].pattern.Regex = GLM_RE;
    file = path.join(path.dirname(outPath), 'llama3_glm_regex.tokenizer.json');
    fs.writeFileSync(file, JSON.stringify(json));
  }
  const cfgFile = path.join(dir, 'tokenizer_config.json');
  const cfg = fs.existsSync(cfgFile) ? JSON.parse(fs.readFileSync(cfgFile, 'utf8')) : {};
  const tok = new Tokenizer(json, cfg);
  const ids = texts.map((t) => tok.encode(t, { add_special_tokens: false }).ids);
  out.tokenizers.push({ name, path: file, ids });
}
fs.writeFileSync(outPath, JSON.stringify(out));
console.error(`tok_reference: ${texts.length} texts x ${names.length} tokenizers -> ${outPath}`);

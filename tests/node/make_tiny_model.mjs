// Writes a small random GLM-5.3 checkpoint (config.json + model.safetensors +
// tokenizer.json) for server/integration tests when models/tiny is absent.
// Usage: node make_tiny_model.mjs OUTDIR
// Tensor names and shapes mirror src/model/bind.c (canonical spellings); the
// tokenizer is tests/data/tokenizer/fixtures/bpe_small.json (ids < 305).
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const out = process.argv[2];
if (!out) { console.error('usage: make_tiny_model.mjs OUTDIR'); process.exit(2); }
const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../..');

const C = {
  vocab_size: 320, hidden_size: 32, intermediate_size: 48, moe_intermediate_size: 16, num_hidden_layers: 4,
  rms_norm_eps: 1e-5, num_attention_heads: 2, num_key_value_heads: 2, q_lora_rank: 24, kv_lora_rank: 16,
  qk_nope_head_dim: 8, qk_rope_head_dim: 0, v_head_dim: 8, index_n_heads: 2, index_head_dim: 8,
  index_topk: 16, index_kpool: 4, index_kpool_always_select_tail: true,
  linear_num_heads: 2, linear_head_dim: 8, linear_conv_kernel_dim: 4, linear_lower_bound: -5.0,
  hc_mult: 2, hc_sinkhorn_iters: 20, hc_eps: 1e-6, n_routed_experts: 4, num_experts_per_tok: 2,
  n_shared_experts: 1, n_group: 1, topk_group: 1, norm_topk_prob: true, routed_scaling_factor: 2.5,
  swiglu_limit: 10.0, tie_word_embeddings: false, max_position_embeddings: 4096,
  layer_types: ['linear_attention', 'linear_attention', 'deepseek_sparse_attention', 'deepseek_sparse_attention'],
  mlp_layer_types: ['dense', 'dense', 'sparse', 'sparse'],
  indexer_types: ['full', 'full', 'full', 'shared'],
  eos_token_id: [300], pad_token_id: 300, bos_token_id: null,
};

// Deterministic normal numbers (xorshift + Box-Muller).
let st = 0x2545F4914F6CDD1Dn;
function u01() {
  st ^= (st << 13n) & 0xFFFFFFFFFFFFFFFFn; st ^= st >> 7n; st ^= (st << 17n) & 0xFFFFFFFFFFFFFFFFn;
  return (Number(st >> 11n) + 0.5) / 2 ** 53;
}
function normal() { return Math.sqrt(-2 * Math.log(u01())) * Math.cos(2 * Math.PI * u01()); }

const tensors = [];
function add(name, shape, mean, sd) {
  const n = shape.reduce((a, b) => a * b, 1);
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = mean + sd * normal();
  tensors.push({ name, shape, a });
}
const mat = (name, r, c) => add(name, [r, c], 0, 1 / Math.sqrt(c));
const D = C.hidden_size, V = C.vocab_size, hc = C.hc_mult, mix = (2 + hc) * hc;
const P = 'model.';
add(P + 'embed_tokens.weight', [V, D], 0, 1);
add(P + 'norm.weight', [D], 1, 0.1);
mat('lm_head.weight', V, D);
for (let l = 0; l < C.num_hidden_layers; l++) {
  const L = `${P}layers.${l}.`;
  add(L + 'input_layernorm.weight', [D], 1, 0.1);
  add(L + 'post_attention_layernorm.weight', [D], 1, 0.1);
  for (const s of ['attn', 'ffn']) {
    add(L + `hc_${s}_fn`, [mix, hc * D], 0, 0.05);
    add(L + `hc_${s}_base`, [mix], 0, 0.5);
    add(L + `hc_${s}_scale`, [3], 1, 0.2);
  }
  if (C.layer_types[l] === 'linear_attention') {
    const H = C.linear_num_heads, hd = C.linear_head_dim, inner = H * hd, K = C.linear_conv_kernel_dim;
    const a = L + 'self_attn.';
    mat(a + 'q_proj.weight', inner, D); mat(a + 'k_proj.weight', inner, D); mat(a + 'v_proj.weight', inner, D);
    add(a + 'conv1d.weight', [3 * inner, 1, K], 0, 0.5);
    mat(a + 'f_a_proj.weight', hd, D); mat(a + 'f_b_proj.weight', inner, hd);
    add(a + 'dt_bias', [inner], 0, 0.5); add(a + 'A_log', [H], 0, 0.5);
    mat(a + 'b_proj.weight', H, D); mat(a + 'g_a_proj.weight', hd, D); mat(a + 'g_b_proj.weight', inner, hd);
    add(a + 'o_norm.weight', [hd], 1, 0.1); mat(a + 'o_proj.weight', D, inner);
  } else {
    const H = C.num_attention_heads, nope = C.qk_nope_head_dim, vd = C.v_head_dim, ql = C.q_lora_rank, kl = C.kv_lora_rank;
    const a = L + 'self_attn.';
    mat(a + 'q_a_proj.weight', ql, D); add(a + 'q_a_layernorm.weight', [ql], 1, 0.1);
    mat(a + 'q_b_proj.weight', H * nope, ql); mat(a + 'kv_a_proj_with_mqa.weight', kl, D);
    add(a + 'kv_a_layernorm.weight', [kl], 1, 0.1); mat(a + 'kv_b_proj.weight', H * (nope + vd), kl);
    mat(a + 'o_proj.weight', D, H * vd);
    if (C.indexer_types[l] === 'full') {
      const nh = C.index_n_heads, hd = C.index_head_dim, x = a + 'indexer.';
      mat(x + 'wq_b.weight', nh * hd, ql); mat(x + 'wk.weight', hd, D);
      add(x + 'k_norm.weight', [hd], 1, 0.1); add(x + 'k_norm.bias', [hd], 0, 0.1);
      mat(x + 'weights_proj.weight', nh, D); mat(x + 'index_kpool_compress_gate', hd, D);
      add(x + 'index_kpool_compress_ape', [C.index_kpool, hd], 0, 0.5);
    }
  }
  const mlp = (b, I) => { mat(b + 'gate_proj.weight', I, D); mat(b + 'up_proj.weight', I, D); mat(b + 'down_proj.weight', D, I); };
  if (C.mlp_layer_types[l] === 'dense') mlp(L + 'mlp.', C.intermediate_size);
  else {
    mat(L + 'mlp.gate.weight', C.n_routed_experts, D);
    add(L + 'mlp.gate.e_score_correction_bias', [C.n_routed_experts], 0, 0.1);
    mlp(L + 'mlp.shared_experts.', C.moe_intermediate_size * C.n_shared_experts);
    for (let e = 0; e < C.n_routed_experts; e++) mlp(L + `mlp.experts.${e}.`, C.moe_intermediate_size);
  }
}

const header = {};
let off = 0;
for (const t of tensors) {
  header[t.name] = { dtype: 'F32', shape: t.shape, data_offsets: [off, off + t.a.byteLength] };
  off += t.a.byteLength;
}
let hjson = JSON.stringify(header);
while ((8 + hjson.length) % 8) hjson += ' ';
const hb = Buffer.from(hjson, 'utf8');
const buf = Buffer.alloc(8 + hb.length + off);
buf.writeBigUInt64LE(BigInt(hb.length), 0);
hb.copy(buf, 8);
let p = 8 + hb.length;
for (const t of tensors) { Buffer.from(t.a.buffer).copy(buf, p); p += t.a.byteLength; }

fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(path.join(out, 'model.safetensors'), buf);
fs.writeFileSync(path.join(out, 'config.json'), JSON.stringify({ model_type: 'glm5_next', text_config: { model_type: 'glm5_next_text', ...C } }, null, 1));
fs.copyFileSync(path.join(root, 'tests/data/tokenizer/fixtures/bpe_small.json'), path.join(out, 'tokenizer.json'));
console.log(`wrote ${out} (${tensors.length} tensors, ${(buf.length / 1024).toFixed(0)} KiB)`);

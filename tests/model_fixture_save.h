/* Saves the random fixture model (model_fixture.h) as a Hugging Face style
 * checkpoint directory (config.json + model.safetensors + tokenizer.json) so
 * that whole-program tests (glm53 run / chat) have a small model on disk.
 *
 * The tokenizer is generated too: byte-level BPE with the 256 byte tokens
 * (ids 0..255, no merges) followed by the GLM chat special tokens (ids 256..),
 * so FX_TOK_VOCAB ids cover every byte string and the whole chat template. */
#ifndef GLM53_TEST_MODEL_FIXTURE_SAVE_H
#define GLM53_TEST_MODEL_FIXTURE_SAVE_H
#include "model_fixture.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <sys/stat.h>

/* GLM-5.3 added tokens used by the template / parser, in GLM's order. The
 * special flag follows the GLM tokenizer (think / tool markup are plain added
 * tokens so they stay visible when decoding with skip_special). */
static const struct { const char *s; int special; } fx_added[] = {
    {"<|endoftext|>", 1}, {"[MASK]", 1},        {"[gMASK]", 1},       {"[sMASK]", 1},        {"<sop>", 1},
    {"<eop>", 1},         {"<|system|>", 1},    {"<|user|>", 1},      {"<|assistant|>", 1},  {"<|observation|>", 1},
    {"<think>", 0},       {"</think>", 0},      {"<tool_call>", 0},   {"</tool_call>", 0},   {"<tool_response>", 0},
    {"</tool_response>", 0}, {"<arg_key>", 0},  {"</arg_key>", 0},    {"<arg_value>", 0},    {"</arg_value>", 0},
};
#define FX_N_ADDED ((int)(sizeof fx_added / sizeof *fx_added))
#define FX_TOK_VOCAB (256 + FX_N_ADDED)
#define FX_ID_EOT 256      /* <|endoftext|> */
#define FX_ID_USER 263     /* <|user|> */
#define FX_ID_OBS 265      /* <|observation|> */

/* GPT-2 bytes_to_unicode: byte b -> code point, as UTF-8 into out (<= 3 bytes + NUL). */
static void fx_byte_char(int b, char *out) {
  int n = 0, cp = -1;
  for (int x = 0; x < 256; x++) {
    int printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255);
    int c = printable ? x : 256 + n++;
    if (x == b) { cp = c; break; }
  }
  if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; }
  else { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 63)); out[2] = 0; }
}

/* malloc'd tokenizer.json text. */
static char *fx_tokenizer_json(void) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "version", "1.0");
  cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
  for (int i = 0; i < FX_N_ADDED; i++) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", 256 + i);
    cJSON_AddStringToObject(a, "content", fx_added[i].s);
    cJSON_AddBoolToObject(a, "single_word", 0);
    cJSON_AddBoolToObject(a, "lstrip", 0);
    cJSON_AddBoolToObject(a, "rstrip", 0);
    cJSON_AddBoolToObject(a, "normalized", 0);
    cJSON_AddBoolToObject(a, "special", fx_added[i].special);
    cJSON_AddItemToArray(added, a);
  }
  cJSON_AddNullToObject(root, "normalizer");
  cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
  cJSON_AddStringToObject(pre, "type", "ByteLevel");
  cJSON_AddBoolToObject(pre, "add_prefix_space", 0);
  cJSON_AddBoolToObject(pre, "trim_offsets", 1);
  cJSON_AddBoolToObject(pre, "use_regex", 1);
  cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
  cJSON_AddStringToObject(dec, "type", "ByteLevel");
  cJSON *model = cJSON_AddObjectToObject(root, "model");
  cJSON_AddStringToObject(model, "type", "BPE");
  cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
  for (int b = 0; b < 256; b++) {
    char s[4];
    fx_byte_char(b, s);
    cJSON_AddNumberToObject(vocab, s, b);
  }
  cJSON_AddArrayToObject(model, "merges");
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return text;
}

/* The chat fixture: fx_config with the tokenizer's vocabulary and GLM's three
 * eos tokens. */
static void fx_chat_config(glm53_config *c) {
  fx_config(c, 8, 2, 1);
  c->vocab_size = FX_TOK_VOCAB;
  c->n_eos = 3;
  c->eos_token_id[0] = FX_ID_EOT; c->eos_token_id[1] = FX_ID_USER; c->eos_token_id[2] = FX_ID_OBS;
  c->pad_token_id = FX_ID_EOT;
  c->max_position_embeddings = 1 << 20;
}

static char *fx_config_json(const glm53_config *c) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "model_type", "glm5_next");
#define FXI(k) cJSON_AddNumberToObject(o, #k, c->k)
  FXI(vocab_size); FXI(hidden_size); FXI(intermediate_size); FXI(moe_intermediate_size); FXI(num_hidden_layers);
  FXI(rms_norm_eps); FXI(num_attention_heads); FXI(num_key_value_heads); FXI(q_lora_rank); FXI(kv_lora_rank);
  FXI(qk_nope_head_dim); FXI(qk_rope_head_dim); FXI(v_head_dim); FXI(index_n_heads); FXI(index_head_dim);
  FXI(index_topk); FXI(index_kpool); FXI(linear_num_heads); FXI(linear_head_dim); FXI(linear_conv_kernel_dim);
  FXI(linear_lower_bound); FXI(hc_mult); FXI(hc_sinkhorn_iters); FXI(hc_eps); FXI(n_routed_experts);
  FXI(num_experts_per_tok); FXI(n_shared_experts); FXI(n_group); FXI(topk_group); FXI(routed_scaling_factor);
  FXI(swiglu_limit); FXI(pad_token_id); FXI(max_position_embeddings);
#undef FXI
  cJSON_AddBoolToObject(o, "norm_topk_prob", c->norm_topk_prob);
  cJSON_AddBoolToObject(o, "index_kpool_always_select_tail", c->index_kpool_always_select_tail);
  cJSON_AddBoolToObject(o, "tie_word_embeddings", 0);
  cJSON_AddNullToObject(o, "bos_token_id");
  cJSON *eos = cJSON_AddArrayToObject(o, "eos_token_id");
  for (int i = 0; i < c->n_eos; i++) cJSON_AddItemToArray(eos, cJSON_CreateNumber(c->eos_token_id[i]));
  static const char *an[] = {"linear_attention", "deepseek_sparse_attention"}, *mn[] = {"dense", "sparse"},
                    *in[] = {"full", "shared"};
  cJSON *lt = cJSON_AddArrayToObject(o, "layer_types"), *mt = cJSON_AddArrayToObject(o, "mlp_layer_types"),
        *it = cJSON_AddArrayToObject(o, "indexer_types");
  for (int l = 0; l < c->num_hidden_layers; l++) {
    cJSON_AddItemToArray(lt, cJSON_CreateString(an[c->layer_types[l]]));
    cJSON_AddItemToArray(mt, cJSON_CreateString(mn[c->mlp_layer_types[l]]));
    cJSON_AddItemToArray(it, cJSON_CreateString(in[c->indexer_types[l]]));
  }
  char *text = cJSON_Print(o);
  cJSON_Delete(o);
  return text;
}

/* ---- a minimal safetensors writer (F32 only) ---- */
typedef struct { char name[256]; const float *data; int ndim; int64_t shape[3]; } fx_tensor;
typedef struct { fx_tensor *t; int n, cap; } fx_tlist;

static void fx_add(fx_tlist *l, const char *name, const float *data, int ndim, int64_t d0, int64_t d1, int64_t d2) {
  if (l->n == l->cap) l->t = xrealloc(l->t, (size_t)(l->cap = l->cap ? 2 * l->cap : 64) * sizeof *l->t);
  fx_tensor *t = &l->t[l->n++];
  snprintf(t->name, sizeof t->name, "%.200s", name);
  t->data = data; t->ndim = ndim; t->shape[0] = d0; t->shape[1] = d1; t->shape[2] = d2;
}
static void fx_addm(fx_tlist *l, const char *pre, const char *name, const wmat *w) {
  char n[256];
  snprintf(n, sizeof n, "%.100s%.150s", pre, name);
  fx_add(l, n, w->data, 2, w->rows, w->cols, 0);
}
static void fx_addv(fx_tlist *l, const char *pre, const char *name, const float *v, int64_t len) {
  char n[256];
  snprintf(n, sizeof n, "%.100s%.150s", pre, name);
  fx_add(l, n, v, 1, len, 0, 0);
}
static void fx_add_mlp(fx_tlist *l, const char *pre, const mlp_weights *m) {
  fx_addm(l, pre, "gate_proj.weight", &m->gate); fx_addm(l, pre, "up_proj.weight", &m->up);
  fx_addm(l, pre, "down_proj.weight", &m->down);
}

static int fx_write_safetensors(const char *path, const fx_tlist *l) {
  cJSON *h = cJSON_CreateObject();
  size_t off = 0;
  for (int i = 0; i < l->n; i++) {
    const fx_tensor *t = &l->t[i];
    int64_t numel = 1;
    cJSON *e = cJSON_CreateObject(), *sh = cJSON_AddArrayToObject(e, "shape"), *of;
    cJSON_AddStringToObject(e, "dtype", "F32");
    for (int d = 0; d < t->ndim; d++) { cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d])); numel *= t->shape[d]; }
    of = cJSON_AddArrayToObject(e, "data_offsets");
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
    off += (size_t)numel * 4;
    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
    cJSON_AddItemToObject(h, t->name, e);
  }
  char *hs = cJSON_PrintUnformatted(h);
  cJSON_Delete(h);
  size_t hl = strlen(hs), padded = (hl + 7) / 8 * 8;
  FILE *f = fopen(path, "wb");
  if (!f) { free(hs); return -1; }
  uint64_t n64 = padded; /* little-endian host assumed (x86 / arm64) */
  fwrite(&n64, 8, 1, f);
  fwrite(hs, 1, hl, f);
  for (size_t i = hl; i < padded; i++) fputc(' ', f);
  for (int i = 0; i < l->n; i++) {
    const fx_tensor *t = &l->t[i];
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
    fwrite(t->data, 4, (size_t)numel, f);
  }
  free(hs);
  return fclose(f) == 0 ? 0 : -1;
}

/* Writes m (an fx_model) as DIR/{config.json, model.safetensors,
 * tokenizer.json} (release tensor names, see src/model/weights.c). */
static int fx_save_dir(const glm53_model *m, const char *dir) {
  const glm53_config *c = &m->cfg;
  mkdir(dir, 0755);
  fx_tlist l = {0};
  char pre[64], path[4096];
  fx_addm(&l, "model.", "embed_tokens.weight", &m->embed);
  fx_addv(&l, "model.", "norm.weight", m->final_norm, c->hidden_size);
  fx_addm(&l, "", "lm_head.weight", &m->lm_head);
  int D = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc;
  for (int i = 0; i < c->num_hidden_layers; i++) {
    const layer_weights *L = &m->layers[i];
    snprintf(pre, sizeof pre, "model.layers.%d.", i);
    fx_addv(&l, pre, "input_layernorm.weight", L->input_norm, D);
    fx_addv(&l, pre, "post_attention_layernorm.weight", L->post_attn_norm, D);
    const mhc_weights *hs[2] = {&L->hc_attn, &L->hc_ffn};
    static const char *site[2] = {"attn", "ffn"};
    for (int k = 0; k < 2; k++) {
      char n[256];
      snprintf(n, sizeof n, "%shc_%s_fn", pre, site[k]);
      fx_add(&l, n, hs[k]->fn, 2, mix, (int64_t)hc * D, 0);
      snprintf(n, sizeof n, "hc_%s_base", site[k]);
      fx_addv(&l, pre, n, hs[k]->base, mix);
      snprintf(n, sizeof n, "hc_%s_scale", site[k]);
      fx_addv(&l, pre, n, hs[k]->scale, 3);
    }
    if (L->attn_kind == ATTN_KDA) {
      const kda_weights *k = &L->kda;
      int H = c->linear_num_heads, hd = c->linear_head_dim, inner = H * hd;
      fx_addm(&l, pre, "self_attn.q_proj.weight", &k->q_proj); fx_addm(&l, pre, "self_attn.k_proj.weight", &k->k_proj);
      fx_addm(&l, pre, "self_attn.v_proj.weight", &k->v_proj);
      char n[256];
      snprintf(n, sizeof n, "%sself_attn.conv1d.weight", pre);
      fx_add(&l, n, k->conv, 3, 3 * (int64_t)inner, 1, c->linear_conv_kernel_dim);
      fx_addm(&l, pre, "self_attn.f_a_proj.weight", &k->f_a); fx_addm(&l, pre, "self_attn.f_b_proj.weight", &k->f_b);
      fx_addv(&l, pre, "self_attn.dt_bias", k->dt_bias, inner); fx_addv(&l, pre, "self_attn.A_log", k->A_log, H);
      fx_addm(&l, pre, "self_attn.b_proj.weight", &k->b_proj); fx_addm(&l, pre, "self_attn.g_a_proj.weight", &k->g_a);
      fx_addm(&l, pre, "self_attn.g_b_proj.weight", &k->g_b); fx_addv(&l, pre, "self_attn.o_norm.weight", k->o_norm, hd);
      fx_addm(&l, pre, "self_attn.o_proj.weight", &k->o_proj);
    } else {
      const mla_weights *a = &L->mla;
      fx_addm(&l, pre, "self_attn.q_a_proj.weight", &a->q_a);
      fx_addv(&l, pre, "self_attn.q_a_layernorm.weight", a->q_a_norm, c->q_lora_rank);
      fx_addm(&l, pre, "self_attn.q_b_proj.weight", &a->q_b);
      fx_addm(&l, pre, "self_attn.kv_a_proj_with_mqa.weight", &a->kv_a);
      fx_addv(&l, pre, "self_attn.kv_a_layernorm.weight", a->kv_a_norm, c->kv_lora_rank);
      fx_addm(&l, pre, "self_attn.kv_b_proj.weight", &a->kv_b); fx_addm(&l, pre, "self_attn.o_proj.weight", &a->o_proj);
      if (a->has_indexer) {
        const indexer_weights *x = &a->idx;
        int hd = c->index_head_dim;
        fx_addm(&l, pre, "self_attn.indexer.wq_b.weight", &x->wq_b); fx_addm(&l, pre, "self_attn.indexer.wk.weight", &x->wk);
        fx_addv(&l, pre, "self_attn.indexer.k_norm.weight", x->k_norm_w, hd);
        fx_addv(&l, pre, "self_attn.indexer.k_norm.bias", x->k_norm_b, hd);
        fx_addm(&l, pre, "self_attn.indexer.weights_proj.weight", &x->weights_proj);
        fx_addm(&l, pre, "self_attn.indexer.index_kpool_compress_gate", &x->gate);
        char n[256];
        snprintf(n, sizeof n, "%sself_attn.indexer.index_kpool_compress_ape", pre);
        fx_add(&l, n, x->ape, 2, c->index_kpool, hd, 0);
      }
    }
    if (L->mlp_kind == MLP_DENSE) {
      char p2[256];
      snprintf(p2, sizeof p2, "%smlp.", pre);
      fx_add_mlp(&l, p2, &L->dense);
    } else {
      const moe_weights *e = &L->moe;
      fx_addm(&l, pre, "mlp.gate.weight", &e->router);
      fx_addv(&l, pre, "mlp.gate.e_score_correction_bias", e->bias, c->n_routed_experts);
      char p2[256];
      snprintf(p2, sizeof p2, "%smlp.shared_experts.", pre);
      fx_add_mlp(&l, p2, &e->shared);
      for (int x = 0; x < c->n_routed_experts; x++) {
        snprintf(p2, sizeof p2, "%smlp.experts.%d.", pre, x);
        fx_add_mlp(&l, p2, &e->experts[x]);
      }
    }
  }
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  int rc = fx_write_safetensors(path, &l);
  free(l.t);
  char *cfg = fx_config_json(c), *tj = fx_tokenizer_json();
  snprintf(path, sizeof path, "%s/config.json", dir);
  if (!rc) rc = write_file_atomic(path, cfg, strlen(cfg));
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  if (!rc) rc = write_file_atomic(path, tj, strlen(tj));
  free(cfg);
  free(tj);
  return rc;
}

#endif

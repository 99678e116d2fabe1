/* Test helper: saves an in-memory model (tests/model_fixture.h) as a Hugging
 * Face style checkpoint directory: config.json + model.safetensors, in F32 or
 * BF16, with the release names or the transformers 5 names (fused 3-D
 * experts, fused conv, attn_hc.*, forget_gate.*). Uses the same binding walk
 * as the loader, so every tensor the loader wants is written. */
#ifndef GLM53_TEST_HF_WRITER_H
#define GLM53_TEST_HF_WRITER_H
#include "model/bind.h"
#include "core/util.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

typedef struct {
  char name[512];
  int ndim;
  int64_t shape[3];
  float *data; /* owned copy */
} hfw_tensor;

typedef struct {
  hfw_tensor *t;
  int n, cap;
  int tf5;       /* transformers 5 names + fused experts */
  const glm53_model *m;
} hfw_ctx;

static void hfw_push(hfw_ctx *c, const char *name, int ndim, const int64_t *shape, const float *src) {
  if (c->n == c->cap) c->t = xrealloc(c->t, (size_t)(c->cap = c->cap ? 2 * c->cap : 64) * sizeof(hfw_tensor));
  hfw_tensor *t = &c->t[c->n++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (t->shape[i] = shape[i]);
  t->data = xmalloc((size_t)n * sizeof(float));
  memcpy(t->data, src, (size_t)n * sizeof(float));
}

static const float *hfw_src(const glm53_model *m, const bind_item *it) {
  /* the walk ran over a scratch model; find the same slot in m by offset */
  (void)m;
  return it->vec ? *it->vec : (const float *)it->mat->data;
}

static int hfw_visit(void *vctx, const bind_item *it) {
  hfw_ctx *c = vctx;
  const float *src = hfw_src(c->m, it);
  if (c->tf5 && it->expert >= 0) {
    if (it->expert != 0 || it->part == 1) return 0; /* whole fused tensors written at expert 0 */
    const moe_weights *mw = &c->m->layers[it->layer].moe;
    const int E = c->m->cfg.n_routed_experts, I = c->m->cfg.moe_intermediate_size, D = c->m->cfg.hidden_size;
    size_t sz = (size_t)I * D;
    float *buf = xmalloc((size_t)E * 2 * sz * sizeof(float));
    char name[256];
    if (it->part == 0) {
      for (int e = 0; e < E; e++) {
        memcpy(buf + e * 2 * sz, mw->experts[e].gate.data, sz * 4);
        memcpy(buf + e * 2 * sz + sz, mw->experts[e].up.data, sz * 4);
      }
      snprintf(name, sizeof name, "model.language_model.layers.%d.mlp.experts.gate_up_proj", it->layer);
      hfw_push(c, name, 3, (int64_t[]){E, 2 * I, D}, buf);
    } else {
      for (int e = 0; e < E; e++) memcpy(buf + e * sz, mw->experts[e].down.data, sz * 4);
      snprintf(name, sizeof name, "model.language_model.layers.%d.mlp.experts.down_proj", it->layer);
      hfw_push(c, name, 3, (int64_t[]){E, D, I}, buf);
    }
    free(buf);
    return 0;
  }
  char name[512];
  const char *alt = it->alts;
  size_t len = strcspn(alt, "|");
  if (c->tf5 && alt[len] == '|') { alt += len + 1; len = strcspn(alt, "|"); }
  const char *pre = it->root ? "" : c->tf5 ? "model.language_model." : "model.";
  if (!c->tf5 && it->conv) { /* release layout: split q/k/v convs */
    static const char *parts[3] = {"q_conv1d", "k_conv1d", "v_conv1d"};
    int64_t inner = it->shape[0] / 3, K = it->shape[2];
    for (int i = 0; i < 3; i++) {
      snprintf(name, sizeof name, "%s%sself_attn.%s.weight", pre, it->base, parts[i]);
      hfw_push(c, name, 3, (int64_t[]){inner, 1, K}, src + i * inner * K);
    }
    return 0;
  }
  snprintf(name, sizeof name, "%s%s%.*s", pre, it->base, (int)len, alt);
  hfw_push(c, name, it->ndim, it->shape, src);
  return 0;
}

/* config.json for g (flat text fields, as transformers accepts them). */
static char *hfw_config_json(const glm53_config *c) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "model_type", "glm5_next");
#define HFW_NUM(k) cJSON_AddNumberToObject(o, #k, c->k)
  HFW_NUM(vocab_size); HFW_NUM(hidden_size); HFW_NUM(intermediate_size); HFW_NUM(moe_intermediate_size);
  HFW_NUM(num_hidden_layers); HFW_NUM(rms_norm_eps); HFW_NUM(num_attention_heads); HFW_NUM(num_key_value_heads);
  HFW_NUM(q_lora_rank); HFW_NUM(kv_lora_rank); HFW_NUM(qk_nope_head_dim); HFW_NUM(qk_rope_head_dim); HFW_NUM(v_head_dim);
  HFW_NUM(index_n_heads); HFW_NUM(index_head_dim); HFW_NUM(index_topk); HFW_NUM(index_kpool); HFW_NUM(linear_num_heads);
  HFW_NUM(linear_head_dim); HFW_NUM(linear_conv_kernel_dim); HFW_NUM(linear_lower_bound); HFW_NUM(hc_mult);
  HFW_NUM(hc_sinkhorn_iters); HFW_NUM(hc_eps); HFW_NUM(n_routed_experts); HFW_NUM(num_experts_per_tok);
  HFW_NUM(n_shared_experts); HFW_NUM(n_group); HFW_NUM(topk_group); HFW_NUM(routed_scaling_factor); HFW_NUM(swiglu_limit);
  HFW_NUM(max_position_embeddings);
#undef HFW_NUM
  cJSON_AddBoolToObject(o, "norm_topk_prob", c->norm_topk_prob);
  cJSON_AddBoolToObject(o, "index_kpool_always_select_tail", c->index_kpool_always_select_tail);
  cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
  if (c->pad_token_id >= 0) cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id);
  else cJSON_AddNullToObject(o, "pad_token_id");
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

/* Saves m (fp32 weights) to dir; bf16 != 0 stores BF16 (rounded). */
static int hfw_save(const glm53_model *m, const char *dir, int bf16, int tf5) {
  mkdir(dir, 0755);
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  char *cfg = hfw_config_json(&m->cfg);
  int rc = write_file_atomic(path, cfg, strlen(cfg));
  free(cfg);
  if (rc) return -1;
  hfw_ctx c = {.tf5 = tf5, .m = m};
  /* walk a shallow copy so the walk's bookkeeping does not touch m */
  glm53_model tmp = *m;
  model_walk(&tmp, hfw_visit, &c);
  char *hdr = xmalloc((size_t)c.n * 400 + 64);
  size_t hl = 0, off = 0;
  hl += (size_t)sprintf(hdr + hl, "{");
  for (int i = 0; i < c.n; i++) {
    int64_t n = 1;
    for (int d = 0; d < c.t[i].ndim; d++) n *= c.t[i].shape[d];
    size_t nb = (size_t)n * (bf16 ? 2 : 4);
    hl += (size_t)sprintf(hdr + hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", c.t[i].name, bf16 ? "BF16" : "F32");
    for (int d = 0; d < c.t[i].ndim; d++) hl += (size_t)sprintf(hdr + hl, "%s%lld", d ? "," : "", (long long)c.t[i].shape[d]);
    hl += (size_t)sprintf(hdr + hl, "],\"data_offsets\":[%zu,%zu]}", off, off + nb);
    off += nb;
  }
  hl += (size_t)sprintf(hdr + hl, "}");
  while (hl % 8) hdr[hl++] = ' ';
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  FILE *f = fopen(path, "wb");
  if (!f) { free(hdr); return -1; }
  uint64_t h64 = hl;
  fwrite(&h64, 8, 1, f);
  fwrite(hdr, 1, hl, f);
  for (int i = 0; i < c.n; i++) {
    int64_t n = 1;
    for (int d = 0; d < c.t[i].ndim; d++) n *= c.t[i].shape[d];
    if (bf16) {
      for (int64_t j = 0; j < n; j++) { uint16_t b = f32_to_bf16(c.t[i].data[j]); fwrite(&b, 2, 1, f); }
    } else {
      fwrite(c.t[i].data, 4, (size_t)n, f);
    }
    free(c.t[i].data);
  }
  rc = fclose(f);
  free(c.t);
  free(hdr);
  return rc ? -1 : 0;
}
#endif

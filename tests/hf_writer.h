/* Test helper: saves an in-memory model (tests/model_fixture.h) as a Hugging
 * Face style checkpoint directory: config.json + model.safetensors, in F32 or
 * BF16, with the release names or the transformers 5 names (fused 3-D
 * experts, fused conv, attn_hc.*, forget_gate.*). Uses the same binding walk
 * as the loader, so every tensor the loader wants is written. */
#ifndef GLM53_TEST_HF_WRITER_H
#define GLM53_TEST_HF_WRITER_H
#include "model/bind.h"
#include "core/util.h"
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

static void hfw_write_config(const char *dir, const glm53_config *g) {
  char path[4096];
  snprintf(path, sizeof path, "%s/config.json", dir);
  FILE *f = fopen(path, "w");
  fprintf(f, "{\"model_type\":\"glm5_next\",\"vocab_size\":%d,\"hidden_size\":%d,\"intermediate_size\":%d,\"moe_intermediate_size\":%d,"
             "\"num_hidden_layers\":%d,\"rms_norm_eps\":%g,\"tie_word_embeddings\":%s,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,"
             "\"q_lora_rank\":%d,\"kv_lora_rank\":%d,\"qk_nope_head_dim\":%d,\"qk_rope_head_dim\":0,\"v_head_dim\":%d,"
             "\"index_n_heads\":%d,\"index_head_dim\":%d,\"index_topk\":%d,\"index_kpool\":%d,\"index_kpool_always_select_tail\":%s,"
             "\"linear_num_heads\":%d,\"linear_head_dim\":%d,\"linear_conv_kernel_dim\":%d,\"linear_lower_bound\":%g,"
             "\"hc_mult\":%d,\"hc_sinkhorn_iters\":%d,\"hc_eps\":%g,\"n_routed_experts\":%d,\"num_experts_per_tok\":%d,"
             "\"n_shared_experts\":%d,\"n_group\":%d,\"topk_group\":%d,\"norm_topk_prob\":%s,\"routed_scaling_factor\":%g,\"swiglu_limit\":%g,",
          g->vocab_size, g->hidden_size, g->intermediate_size, g->moe_intermediate_size, g->num_hidden_layers, g->rms_norm_eps,
          g->tie_word_embeddings ? "true" : "false", g->num_attention_heads, g->num_key_value_heads, g->q_lora_rank, g->kv_lora_rank,
          g->qk_nope_head_dim, g->v_head_dim, g->index_n_heads, g->index_head_dim, g->index_topk, g->index_kpool,
          g->index_kpool_always_select_tail ? "true" : "false", g->linear_num_heads, g->linear_head_dim, g->linear_conv_kernel_dim,
          g->linear_lower_bound, g->hc_mult, g->hc_sinkhorn_iters, g->hc_eps, g->n_routed_experts, g->num_experts_per_tok,
          g->n_shared_experts, g->n_group, g->topk_group, g->norm_topk_prob ? "true" : "false", g->routed_scaling_factor, g->swiglu_limit);
  const char *lt[] = {"linear_attention", "deepseek_sparse_attention"}, *mt[] = {"dense", "sparse"}, *it[] = {"full", "shared"};
  const uint8_t *sch[3] = {g->layer_types, g->mlp_layer_types, g->indexer_types};
  const char **nm[3] = {lt, mt, it}, *key[3] = {"layer_types", "mlp_layer_types", "indexer_types"};
  for (int s = 0; s < 3; s++) {
    fprintf(f, "\"%s\":[", key[s]);
    for (int l = 0; l < g->num_hidden_layers; l++) fprintf(f, "%s\"%s\"", l ? "," : "", nm[s][sch[s][l]]);
    fprintf(f, "]%s", s < 2 ? "," : "}\n");
  }
  fclose(f);
}

/* Saves m (fp32 weights) to dir; bf16 != 0 stores BF16 (rounded). */
static int hfw_save(const glm53_model *m, const char *dir, int bf16, int tf5) {
  mkdir(dir, 0755);
  hfw_write_config(dir, &m->cfg);
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
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  FILE *f = fopen(path, "wb");
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
  fclose(f);
  free(c.t);
  free(hdr);
  return 0;
}
#endif

/* Builds a small random GLM-5.3 model in memory (fp32) for tests that need a
 * whole forward without a checkpoint on disk. */
#ifndef GLM53_TEST_MODEL_FIXTURE_H
#define GLM53_TEST_MODEL_FIXTURE_H
#include "glm53.h"
#include "model/model.h"
#include "model/backend.h"
#include "core/util.h"
#include "test_util.h"

static float *fx_vec(trng *r, int64_t n, double mean, double sd) {
  float *v = aligned_alloc64((size_t)n * sizeof(float));
  for (int64_t i = 0; i < n; i++) v[i] = (float)(mean + sd * trng_normal(r));
  return v;
}
static void fx_mat(trng *r, wmat *w, int rows, int cols, double sd) {
  float *d = fx_vec(r, (int64_t)rows * cols, 0, sd);
  w->fmt = WMAT_F32; w->rows = rows; w->cols = cols; w->data = d; w->owned = d;
}
static void fx_mlp(trng *r, mlp_weights *m, int D, int I) {
  fx_mat(r, &m->gate, I, D, 1 / sqrt(D)); fx_mat(r, &m->up, I, D, 1 / sqrt(D)); fx_mat(r, &m->down, D, I, 1 / sqrt(I));
}

/* A small config: 6 layers KDA,KDA,MLA,KDA,MLA,MLA (last one shared when
 * `shared`), first 2 dense, MoE with 8 experts top-2 in 2 groups. */
static void fx_config(glm53_config *c, int index_topk, int kpool, int shared) {
  memset(c, 0, sizeof *c);
  c->vocab_size = 97; c->hidden_size = 32; c->intermediate_size = 48; c->moe_intermediate_size = 16;
  c->num_hidden_layers = 6; c->rms_norm_eps = 1e-5f;
  c->num_attention_heads = 3; c->num_key_value_heads = 3; c->q_lora_rank = 24; c->kv_lora_rank = 16;
  c->qk_nope_head_dim = 8; c->qk_rope_head_dim = 0; c->v_head_dim = 12;
  c->index_n_heads = 3; c->index_head_dim = 8; c->index_topk = index_topk; c->index_kpool = kpool;
  c->index_kpool_always_select_tail = 1;
  c->linear_num_heads = 2; c->linear_head_dim = 8; c->linear_conv_kernel_dim = 4; c->linear_lower_bound = -5.0f;
  c->hc_mult = 4; c->hc_sinkhorn_iters = 20; c->hc_eps = 1e-6f;
  c->n_routed_experts = 8; c->num_experts_per_tok = 2; c->n_shared_experts = 1; c->n_group = 2; c->topk_group = 1;
  c->norm_topk_prob = 1; c->routed_scaling_factor = 2.5f; c->swiglu_limit = 1.0f;
  c->pad_token_id = -1; c->bos_token_id = -1; c->max_position_embeddings = 1 << 20;
  static const int kinds[6] = {ATTN_KDA, ATTN_KDA, ATTN_MLA, ATTN_KDA, ATTN_MLA, ATTN_MLA};
  for (int l = 0; l < 6; l++) {
    c->layer_types[l] = kinds[l];
    c->mlp_layer_types[l] = l < 2 ? MLP_DENSE : MLP_MOE;
    c->indexer_types[l] = (shared && l == 5) ? INDEX_SHARED : INDEX_FULL;
  }
}

static glm53_model *fx_model(const glm53_config *c, uint64_t seed) {
  trng r = {seed * 0x9E3779B97F4A7C15ull + 1};
  glm53_model *m = xcalloc(1, sizeof *m);
  m->cfg = *c;
  m->dir = xstrdup("(in-memory test model)");
  m->backend = glm53_cpu_backend();
  int D = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc;
  fx_mat(&r, &m->embed, c->vocab_size, D, 1.0);
  fx_mat(&r, &m->lm_head, c->vocab_size, D, 1 / sqrt(D));
  m->final_norm = fx_vec(&r, D, 1, 0.1);
  m->layers = xcalloc((size_t)c->num_hidden_layers, sizeof(layer_weights));
  for (int l = 0; l < c->num_hidden_layers; l++) {
    layer_weights *L = &m->layers[l];
    L->attn_kind = c->layer_types[l]; L->mlp_kind = c->mlp_layer_types[l]; L->index_kind = c->indexer_types[l];
    L->input_norm = fx_vec(&r, D, 1, 0.1); L->post_attn_norm = fx_vec(&r, D, 1, 0.1);
    mhc_weights *hs[2] = {&L->hc_attn, &L->hc_ffn};
    for (int i = 0; i < 2; i++) {
      hs[i]->fn = fx_vec(&r, (int64_t)mix * hc * D, 0, 0.05);
      hs[i]->base = fx_vec(&r, mix, 0, 0.5);
      hs[i]->scale = fx_vec(&r, 3, 1, 0.2);
    }
    if (L->attn_kind == ATTN_KDA) {
      kda_weights *k = &L->kda;
      int H = c->linear_num_heads, hd = c->linear_head_dim, inner = H * hd;
      fx_mat(&r, &k->q_proj, inner, D, 1 / sqrt(D)); fx_mat(&r, &k->k_proj, inner, D, 1 / sqrt(D));
      fx_mat(&r, &k->v_proj, inner, D, 1 / sqrt(D));
      k->conv = fx_vec(&r, (int64_t)3 * inner * c->linear_conv_kernel_dim, 0, 0.5);
      fx_mat(&r, &k->f_a, hd, D, 1 / sqrt(D)); fx_mat(&r, &k->f_b, inner, hd, 1 / sqrt(hd));
      k->dt_bias = fx_vec(&r, inner, 0, 0.5); k->A_log = fx_vec(&r, H, 0, 0.5);
      fx_mat(&r, &k->b_proj, H, D, 1 / sqrt(D)); fx_mat(&r, &k->g_a, hd, D, 1 / sqrt(D));
      fx_mat(&r, &k->g_b, inner, hd, 1 / sqrt(hd)); k->o_norm = fx_vec(&r, hd, 1, 0.1);
      fx_mat(&r, &k->o_proj, D, inner, 1 / sqrt(inner));
    } else {
      mla_weights *a = &L->mla;
      int H = c->num_attention_heads, nope = c->qk_nope_head_dim, vd = c->v_head_dim, ql = c->q_lora_rank, kl = c->kv_lora_rank;
      fx_mat(&r, &a->q_a, ql, D, 1 / sqrt(D)); a->q_a_norm = fx_vec(&r, ql, 1, 0.1);
      fx_mat(&r, &a->q_b, H * nope, ql, 1 / sqrt(ql)); fx_mat(&r, &a->kv_a, kl, D, 1 / sqrt(D));
      a->kv_a_norm = fx_vec(&r, kl, 1, 0.1); fx_mat(&r, &a->kv_b, H * (nope + vd), kl, 1 / sqrt(kl));
      fx_mat(&r, &a->o_proj, D, H * vd, 1 / sqrt(H * vd));
      a->has_indexer = L->index_kind == INDEX_FULL;
      if (a->has_indexer) {
        indexer_weights *x = &a->idx;
        int nh = c->index_n_heads, hd = c->index_head_dim;
        fx_mat(&r, &x->wq_b, nh * hd, ql, 1 / sqrt(ql)); fx_mat(&r, &x->wk, hd, D, 1 / sqrt(D));
        x->k_norm_w = fx_vec(&r, hd, 1, 0.1); x->k_norm_b = fx_vec(&r, hd, 0, 0.1);
        fx_mat(&r, &x->weights_proj, nh, D, 1 / sqrt(D)); fx_mat(&r, &x->gate, hd, D, 1 / sqrt(D));
        x->ape = fx_vec(&r, (int64_t)c->index_kpool * hd, 0, 0.5);
      }
    }
    if (L->mlp_kind == MLP_DENSE) fx_mlp(&r, &L->dense, D, c->intermediate_size);
    else {
      moe_weights *e = &L->moe;
      fx_mat(&r, &e->router, c->n_routed_experts, D, 1.0 / sqrt(D));
      e->bias = fx_vec(&r, c->n_routed_experts, 0, 0.1);
      e->experts = xcalloc((size_t)c->n_routed_experts, sizeof(mlp_weights));
      for (int i = 0; i < c->n_routed_experts; i++) fx_mlp(&r, &e->experts[i], D, c->moe_intermediate_size);
      fx_mlp(&r, &e->shared, D, c->moe_intermediate_size * c->n_shared_experts);
    }
  }
  return m;
}
/* Runs tok[0..n) through a fresh session in chunks (lengths from `chunks`,
 * 0-terminated, the last one repeated) and writes every row's logits. */
static inline void fx_run_chunks(glm53_model *m, const int32_t *tok, int n, const int *chunks, float *out) {
  glm53_session *s = glm53_session_new(m, n);
  CHECK(s != NULL, "session: %s", glm53_last_error());
  if (!s) return;
  int V = glm53_model_vocab_size(m), i = 0, ci = 0;
  while (i < n) {
    int len = chunks[ci] ? chunks[ci] : 1;
    if (chunks[ci + 1]) ci++;
    if (len > n - i) len = n - i;
    CHECK(glm53_forward(s, tok + i, len, out + (size_t)i * V, 1) == 0, "%s", glm53_last_error());
    i += len;
  }
  glm53_session_free(s);
}
#endif

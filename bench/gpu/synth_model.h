/* The synthetic full-dimension GLM-5.3-Flash model of the GPU benchmarks
 * (real hidden/head/expert/vocab sizes, random weights, fewer routed
 * experts so it fits): header-only, included by each bench/gpu program. */
#ifndef GLM53_BENCH_SYNTH_MODEL_H
#define GLM53_BENCH_SYNTH_MODEL_H
#include "glm53.h"
#include "model/model.h"
#include "model/backend.h"
#include "core/util.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
  return x;
}
static uint64_t g_seed = 1;
static int g_q4; /* synthesise Q4 matrices */
/* Q4 (docs/format.md fmt=4): random nibbles, bf16 group scales giving the
 * same standard deviation as bmat */
static void qmat(wmat *w, int rows, int cols) {
  size_t n = (size_t)rows * cols, ng = n / 32;
  uint8_t *d = xmalloc(n / 2 + ng * 2);
  uint16_t *sc = (uint16_t *)(d + n / 2);
  uint64_t seed = mix64(++g_seed);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n / 16; i++) {
    uint64_t h = mix64(seed + i);
    memcpy(d + i * 8, &h, 8);
  }
  const float s = sqrtf(1.0f / cols) / 4.61f; /* nibble - 8 has sd ~4.61 */
  for (size_t g = 0; g < ng; g++) sc[g] = f32_to_bf16(s * (0.75f + 0.5f * (float)(mix64(seed ^ (g + 0x9e37)) >> 40) / 16777216.0f));
  w->fmt = WMAT_Q4; w->rows = rows; w->cols = cols; w->group = 32; w->scale_bf16 = 1;
  w->data = d; w->scales = sc; w->owned = d;
}
/* uniform with the given standard deviation, as bf16 */
static void bmat(wmat *w, int rows, int cols) {
  if (g_q4 && cols % 32 == 0) { qmat(w, rows, cols); return; }
  size_t n = (size_t)rows * cols;
  uint16_t *d = xmalloc(n * 2);
  float a = sqrtf(3.0f / cols);
  uint64_t seed = mix64(++g_seed);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    uint64_t h = mix64(seed + i);
    d[i] = f32_to_bf16(a * (float)((double)(h >> 11) * (2.0 / 9007199254740992.0) - 1.0));
  }
  w->fmt = WMAT_BF16; w->rows = rows; w->cols = cols; w->data = d; w->owned = d;
}
/* the matrices converted checkpoints keep in fp32 (bind.c TIER_FP32: the
 * MoE router, the indexer's head weights), as fp32 with bmat's spread;
 * GLM53_BENCH_BF16_ROUTER=1: bf16 / Q4 like the rest, as the benches built
 * them up to the nineteenth session */
static void fmat(wmat *w, int rows, int cols) {
  const char *e = getenv("GLM53_BENCH_BF16_ROUTER");
  if (e && !strcmp(e, "1")) { bmat(w, rows, cols); return; }
  size_t n = (size_t)rows * cols;
  float *d = xmalloc(n * sizeof(float));
  float a = sqrtf(3.0f / cols);
  uint64_t seed = mix64(++g_seed);
  for (size_t i = 0; i < n; i++) d[i] = a * (float)((double)(mix64(seed + i) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
  w->fmt = WMAT_F32; w->rows = rows; w->cols = cols; w->data = d; w->owned = d;
}
static float *fvec(size_t n, float mean, float amp) {
  float *v = xmalloc(n * sizeof(float));
  uint64_t seed = mix64(++g_seed);
  for (size_t i = 0; i < n; i++) v[i] = mean + amp * (float)((double)(mix64(seed + i) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
  return v;
}
static void bmlp(mlp_weights *m, int D, int I) { bmat(&m->gate, I, D); bmat(&m->up, I, D); bmat(&m->down, D, I); }

/* Distinct routed experts generated per layer at most; beyond that layers
 * reuse host copies (each is still uploaded as its own device matrix, so
 * device memory and bandwidth are as for distinct experts). Keeps a
 * 45-layer model's host memory and build time bounded. */
#define SYNTH_EXPERT_POOL 48

/* nl = 6: KDA, MLA+indexer, KDA, MLA (shared indexer), KDA, KDA; layer 0
 * dense. Otherwise the release schedule of nl layers: MLA+DSA (own
 * indexer) where i mod 4 == 3, KDA elsewhere, dense MLP in layers 0-2. */
static glm53_model *synth(int E, int nl, size_t *decode_bytes, double *active_params) {
  glm53_model *m = xcalloc(1, sizeof *m);
  glm53_config *c = &m->cfg;
  c->vocab_size = 154880; c->hidden_size = 4096; c->intermediate_size = 12288; c->moe_intermediate_size = 2048;
  c->num_hidden_layers = nl; c->rms_norm_eps = 1e-5f;
  c->num_attention_heads = 64; c->num_key_value_heads = 64; c->q_lora_rank = 1536; c->kv_lora_rank = 512;
  c->qk_nope_head_dim = 256; c->qk_rope_head_dim = 0; c->v_head_dim = 256;
  c->index_n_heads = 32; c->index_head_dim = 128; c->index_topk = 2048; c->index_kpool = 4;
  c->index_kpool_always_select_tail = 1;
  c->linear_num_heads = 64; c->linear_head_dim = 128; c->linear_conv_kernel_dim = 4; c->linear_lower_bound = -5.0f;
  c->hc_mult = 4; c->hc_sinkhorn_iters = 20; c->hc_eps = 1e-6f;
  c->n_routed_experts = E; c->num_experts_per_tok = 8; c->n_shared_experts = 1; c->n_group = 1; c->topk_group = 1;
  c->norm_topk_prob = 1; c->routed_scaling_factor = 2.5f; c->swiglu_limit = 10.0f;
  static const int kinds6[6] = {ATTN_KDA, ATTN_MLA, ATTN_KDA, ATTN_MLA, ATTN_KDA, ATTN_KDA};
  mlp_weights *pool = xcalloc(SYNTH_EXPERT_POOL, sizeof(mlp_weights));
  int npool = 0;
  const int D = 4096, hc = 4, mix = (2 + hc) * hc;
  m->dir = xstrdup("(synthetic full-dimension model)");
  m->backend = glm53_cpu_backend();
  bmat(&m->embed, c->vocab_size, D);
  bmat(&m->lm_head, c->vocab_size, D);
  m->final_norm = fvec(D, 1, 0.1f);
  m->layers = xcalloc((size_t)nl, sizeof(layer_weights));
  size_t bytes = wmat_bytes(&m->lm_head), expert = 0;
  for (int l = 0; l < nl; l++) {
    const int kind = nl == 6 ? kinds6[l] : l % 4 == 3 ? ATTN_MLA : ATTN_KDA;
    layer_weights *L = &m->layers[l];
    c->layer_types[l] = kind;
    c->mlp_layer_types[l] = l < (nl == 6 ? 1 : 3) ? MLP_DENSE : MLP_MOE;
    c->indexer_types[l] = nl == 6 && l == 3 ? INDEX_SHARED : INDEX_FULL;
    L->attn_kind = kind; L->mlp_kind = c->mlp_layer_types[l]; L->index_kind = c->indexer_types[l];
    L->input_norm = fvec(D, 1, 0.1f); L->post_attn_norm = fvec(D, 1, 0.1f);
    mhc_weights *hs[2] = {&L->hc_attn, &L->hc_ffn};
    for (int i = 0; i < 2; i++) {
      hs[i]->fn = fvec((size_t)mix * hc * D, 0, 0.01f);
      hs[i]->base = fvec(mix, 0, 0.5f);
      hs[i]->scale = fvec(3, 1, 0.2f);
      bytes += (size_t)mix * hc * D * 4;
    }
    wmat *ws[16];
    int nw = 0;
    if (L->attn_kind == ATTN_KDA) {
      kda_weights *k = &L->kda;
      int H = 64, hd = 128, inner = H * hd;
      bmat(&k->q_proj, inner, D); bmat(&k->k_proj, inner, D); bmat(&k->v_proj, inner, D);
      k->conv = fvec((size_t)3 * inner * 4, 0, 0.5f);
      bmat(&k->f_a, hd, D); bmat(&k->f_b, inner, hd);
      k->dt_bias = fvec(inner, 0, 0.5f); k->A_log = fvec(H, 0, 0.5f);
      bmat(&k->b_proj, H, D); bmat(&k->g_a, hd, D); bmat(&k->g_b, inner, hd);
      k->o_norm = fvec(hd, 1, 0.1f);
      bmat(&k->o_proj, D, inner);
      wmat *x[] = {&k->q_proj, &k->k_proj, &k->v_proj, &k->f_a, &k->f_b, &k->b_proj, &k->g_a, &k->g_b, &k->o_proj};
      for (int i = 0; i < 9; i++) ws[nw++] = x[i];
    } else {
      mla_weights *a = &L->mla;
      bmat(&a->q_a, 1536, D); a->q_a_norm = fvec(1536, 1, 0.1f);
      bmat(&a->q_b, 64 * 256, 1536); bmat(&a->kv_a, 512, D); a->kv_a_norm = fvec(512, 1, 0.1f);
      bmat(&a->kv_b, 64 * 512, 512); bmat(&a->o_proj, D, 64 * 256);
      wmat *x[] = {&a->q_a, &a->q_b, &a->kv_a, &a->kv_b, &a->o_proj};
      for (int i = 0; i < 5; i++) ws[nw++] = x[i];
      a->has_indexer = L->index_kind == INDEX_FULL;
      if (a->has_indexer) {
        indexer_weights *x2 = &a->idx;
        bmat(&x2->wq_b, 32 * 128, 1536); bmat(&x2->wk, 128, D);
        x2->k_norm_w = fvec(128, 1, 0.1f); x2->k_norm_b = fvec(128, 0, 0.1f);
        fmat(&x2->weights_proj, 32, D); bmat(&x2->gate, 128, D);
        x2->ape = fvec(4 * 128, 0, 0.5f);
        wmat *y[] = {&x2->wq_b, &x2->wk, &x2->weights_proj, &x2->gate};
        for (int i = 0; i < 4; i++) ws[nw++] = y[i];
      }
    }
    if (L->mlp_kind == MLP_DENSE) {
      bmlp(&L->dense, D, c->intermediate_size);
      ws[nw++] = &L->dense.gate; ws[nw++] = &L->dense.up; ws[nw++] = &L->dense.down;
    } else {
      moe_weights *e = &L->moe;
      fmat(&e->router, E, D);
      e->bias = fvec(E, 0, 0.01f);
      e->experts = xcalloc((size_t)E, sizeof(mlp_weights));
      for (int i = 0; i < E; i++) {
        if (npool < SYNTH_EXPERT_POOL) {
          bmlp(&e->experts[i], D, 2048);
          pool[npool++] = e->experts[i];
        } else { /* a borrowed host copy: not owned, so freed once */
          e->experts[i] = pool[(i + 7 * l) % SYNTH_EXPERT_POOL];
          e->experts[i].gate.owned = e->experts[i].up.owned = e->experts[i].down.owned = NULL;
        }
      }
      bmlp(&e->shared, D, 2048);
      ws[nw++] = &e->router; ws[nw++] = &e->shared.gate; ws[nw++] = &e->shared.up; ws[nw++] = &e->shared.down;
      expert += 8 * 3 * wmat_bytes(&e->experts[0].gate);
    }
    for (int i = 0; i < nw; i++) bytes += wmat_bytes(ws[i]);
  }
  *decode_bytes = bytes + expert;        /* weights one decode token reads (embedding: one row, ignored) */
  /* bf16 matmul parameters one prefill token multiplies (no LM head: prefill returns the last row only) */
  *active_params = (bytes - wmat_bytes(&m->lm_head) - (size_t)nl * 2 * mix * hc * D * 4) / 2.0 + expert / 2.0;
  free(pool);
  return m;
}


#endif

/* The tensor list of a GLM-5.3 text tower (see bind.h). Aliases cover the
 * release checkpoint names and the transformers 5 save format; the fused
 * HF layouts (3-D experts, fused/split conv) are resolved by the HF reader. */
#include "model/bind.h"
#include "core/util.h"
#include <stdio.h>

typedef struct {
  glm53_model *m;
  bind_fn fn;
  void *ctx;
  int layer, expert, part;
  char lp[128]; /* current base */
} walker;

static int emit(walker *w, const char *alts, int ndim, const int64_t *shape, int tier, float **vec, wmat *mat, int root, int conv) {
  bind_item it;
  memset(&it, 0, sizeof it);
  size_t first = strcspn(alts, "|");
  snprintf(it.base, sizeof it.base, "%s", w->lp);
  snprintf(it.name, sizeof it.name, "%s%.*s", w->lp, (int)first, alts);
  it.alts = alts;
  it.root = root;
  it.ndim = ndim;
  for (int i = 0; i < ndim; i++) it.shape[i] = shape[i];
  it.tier = tier;
  it.layer = w->layer;
  it.expert = w->expert;
  it.part = w->part;
  it.conv = conv;
  it.vec = vec;
  it.mat = mat;
  return w->fn(w->ctx, &it);
}
#define VEC(alts, n, dst) emit(w, alts, 1, (int64_t[]){n}, TIER_FP32, dst, NULL, 0, 0)
#define MAT(alts, r, c, tier, dst) emit(w, alts, 2, (int64_t[]){r, c}, tier, NULL, dst, 0, 0)

static int walk_mhc(walker *w, const glm53_config *g, const char *site, mhc_weights *h) {
  int64_t mix = (2 + g->hc_mult) * g->hc_mult;
  /* names: the release spelling first (canonical), then transformers 5 */
  char a[3][64];
  snprintf(a[0], 64, "hc_%s_fn|%s_hc.fn", site, site);
  snprintf(a[1], 64, "hc_%s_base|%s_hc.base", site, site);
  snprintf(a[2], 64, "hc_%s_scale|%s_hc.scale", site, site);
  return emit(w, a[0], 2, (int64_t[]){mix, (int64_t)g->hc_mult * g->hidden_size}, TIER_FP32, &h->fn, NULL, 0, 0) ||
         VEC(a[1], mix, &h->base) || VEC(a[2], 3, &h->scale);
}

static int walk_kda(walker *w, const glm53_config *g, kda_weights *k) {
  int64_t D = g->hidden_size, H = g->linear_num_heads, hd = g->linear_head_dim, inner = H * hd, K = g->linear_conv_kernel_dim;
  return MAT("self_attn.q_proj.weight", inner, D, TIER_MAT, &k->q_proj) ||
         MAT("self_attn.k_proj.weight", inner, D, TIER_MAT, &k->k_proj) ||
         MAT("self_attn.v_proj.weight", inner, D, TIER_MAT, &k->v_proj) ||
         emit(w, "self_attn.conv1d.weight", 3, (int64_t[]){3 * inner, 1, K}, TIER_FP32, &k->conv, NULL, 0, 1) ||
         MAT("self_attn.f_a_proj.weight|self_attn.forget_gate.f_a_proj.weight", hd, D, TIER_MAT, &k->f_a) ||
         MAT("self_attn.f_b_proj.weight|self_attn.forget_gate.f_b_proj.weight", inner, hd, TIER_MAT, &k->f_b) ||
         VEC("self_attn.dt_bias|self_attn.forget_gate.dt_bias", inner, &k->dt_bias) ||
         VEC("self_attn.A_log|self_attn.forget_gate.A_log", H, &k->A_log) ||
         MAT("self_attn.b_proj.weight", H, D, TIER_MAT, &k->b_proj) ||
         MAT("self_attn.g_a_proj.weight", hd, D, TIER_MAT, &k->g_a) ||
         MAT("self_attn.g_b_proj.weight", inner, hd, TIER_MAT, &k->g_b) ||
         VEC("self_attn.o_norm.weight", hd, &k->o_norm) ||
         MAT("self_attn.o_proj.weight", D, inner, TIER_MAT, &k->o_proj);
}

static int walk_mla(walker *w, const glm53_config *g, int index_kind, mla_weights *a) {
  int64_t D = g->hidden_size, H = g->num_attention_heads, nope = g->qk_nope_head_dim, vd = g->v_head_dim;
  int64_t ql = g->q_lora_rank, kl = g->kv_lora_rank;
  if (MAT("self_attn.q_a_proj.weight", ql, D, TIER_MAT, &a->q_a) || VEC("self_attn.q_a_layernorm.weight", ql, &a->q_a_norm) ||
      MAT("self_attn.q_b_proj.weight", H * nope, ql, TIER_MAT, &a->q_b) ||
      MAT("self_attn.kv_a_proj_with_mqa.weight", kl, D, TIER_MAT, &a->kv_a) ||
      VEC("self_attn.kv_a_layernorm.weight", kl, &a->kv_a_norm) ||
      MAT("self_attn.kv_b_proj.weight", H * (nope + vd), kl, TIER_MAT, &a->kv_b) ||
      MAT("self_attn.o_proj.weight", D, H * vd, TIER_MAT, &a->o_proj))
    return -1;
  a->has_indexer = index_kind == INDEX_FULL;
  if (!a->has_indexer) return 0;
  int64_t nh = g->index_n_heads, hd = g->index_head_dim;
  indexer_weights *x = &a->idx;
  /* weights_proj (head weights) stays fp32: bf16 flips near-tied pools (arch §7.6) */
  return MAT("self_attn.indexer.wq_b.weight", nh * hd, ql, TIER_MAT, &x->wq_b) ||
         MAT("self_attn.indexer.wk.weight", hd, D, TIER_MAT, &x->wk) ||
         VEC("self_attn.indexer.k_norm.weight", hd, &x->k_norm_w) || VEC("self_attn.indexer.k_norm.bias", hd, &x->k_norm_b) ||
         MAT("self_attn.indexer.weights_proj.weight", nh, D, TIER_FP32, &x->weights_proj) ||
         MAT("self_attn.indexer.index_kpool_compress_gate", hd, D, TIER_MAT, &x->gate) ||
         emit(w, "self_attn.indexer.index_kpool_compress_ape", 2, (int64_t[]){g->index_kpool, hd}, TIER_FP32, &x->ape, NULL, 0, 0);
}

static int walk_mlp(walker *w, const char *base, int64_t D, int64_t I, int tier, mlp_weights *m) {
  char save[128];
  snprintf(save, sizeof save, "%s", w->lp);
  snprintf(w->lp, sizeof w->lp, "%s", base);
  w->part = 0;
  int rc = MAT("gate_proj.weight", I, D, tier, &m->gate);
  w->part = 1;
  rc = rc || MAT("up_proj.weight", I, D, tier, &m->up);
  w->part = 2;
  rc = rc || MAT("down_proj.weight", D, I, tier, &m->down);
  w->part = 0;
  snprintf(w->lp, sizeof w->lp, "%s", save);
  return rc;
}

static int walk_moe(walker *w, const glm53_config *g, moe_weights *m) {
  int64_t D = g->hidden_size, E = g->n_routed_experts, I = g->moe_intermediate_size;
  if (MAT("mlp.gate.weight", E, D, TIER_FP32, &m->router) || VEC("mlp.gate.e_score_correction_bias", E, &m->bias)) return -1;
  char base[160];
  snprintf(base, sizeof base, "%smlp.shared_experts.", w->lp);
  if (walk_mlp(w, base, D, I * g->n_shared_experts, TIER_MAT, &m->shared)) return -1;
  if (!m->experts) m->experts = xcalloc((size_t)E, sizeof(mlp_weights));
  for (int e = 0; e < E; e++) {
    snprintf(base, sizeof base, "%smlp.experts.%d.", w->lp, e);
    w->expert = e;
    int rc = walk_mlp(w, base, D, I, TIER_EXPERT, &m->experts[e]);
    w->expert = -1;
    if (rc) return -1;
  }
  return 0;
}

int model_walk(glm53_model *m, bind_fn fn, void *ctx) {
  const glm53_config *g = &m->cfg;
  walker wk = {.m = m, .fn = fn, .ctx = ctx, .layer = -1, .expert = -1}, *w = &wk;
  int64_t D = g->hidden_size, V = g->vocab_size;
  if (MAT("embed_tokens.weight", V, D, TIER_EMBED, &m->embed) || VEC("norm.weight", D, &m->final_norm)) return -1;
  if (!g->tie_word_embeddings && emit(w, "lm_head.weight", 2, (int64_t[]){V, D}, TIER_EMBED, NULL, &m->lm_head, 1, 0)) return -1;
  if (!m->layers) m->layers = xcalloc((size_t)g->num_hidden_layers, sizeof(layer_weights));
  for (int l = 0; l < g->num_hidden_layers; l++) {
    layer_weights *L = &m->layers[l];
    w->layer = l;
    snprintf(w->lp, sizeof w->lp, "layers.%d.", l);
    L->attn_kind = g->layer_types[l];
    L->mlp_kind = g->mlp_layer_types[l];
    L->index_kind = g->indexer_types[l];
    if (VEC("input_layernorm.weight", D, &L->input_norm) || VEC("post_attention_layernorm.weight", D, &L->post_attn_norm) ||
        walk_mhc(w, g, "attn", &L->hc_attn) || walk_mhc(w, g, "ffn", &L->hc_ffn))
      return -1;
    if (L->attn_kind == ATTN_KDA ? walk_kda(w, g, &L->kda) : walk_mla(w, g, L->index_kind, &L->mla)) return -1;
    if (L->mlp_kind == MLP_DENSE) {
      char base[160];
      snprintf(base, sizeof base, "%smlp.", w->lp);
      if (walk_mlp(w, base, D, g->intermediate_size, TIER_MAT, &L->dense)) return -1;
    } else if (walk_moe(w, g, &L->moe)) {
      return -1;
    }
  }
  return 0;
}

void model_tie_lm_head(glm53_model *m) {
  if (!m->cfg.tie_word_embeddings) return;
  m->lm_head = m->embed;
  m->lm_head.owned = NULL;
}

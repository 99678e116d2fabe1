/* Binds checkpoint tensors to layer_weights. Accepts both name layouts:
 *  - release checkpoints: hc_attn_fn, self_attn.f_a_proj, q/k/v_conv1d,
 *    per-expert mlp.experts.N.{gate,up,down}_proj.weight;
 *  - transformers 5 save format: attn_hc.fn, self_attn.forget_gate.*, fused
 *    conv1d [3*inner,1,K], fused 3-D mlp.experts.gate_up_proj / down_proj.
 * The text-tower prefix (model.language_model., model., ...) is taken from
 * the embedding tensor's name. Everything is converted to fp32 here; the
 * .g53 path binds quantized matrices instead. */
#include "model/model.h"
#include "core/err.h"
#include "core/log.h"
#include "core/util.h"
#include "format/safetensors.h"
#include <stdio.h>
#include <stdlib.h>

typedef struct {
  st_set *st;
  char prefix[128]; /* text tower prefix incl. trailing '.' (may be "") */
  char lp[160];     /* current layer prefix */
  size_t bytes;
} bind_ctx;

/* Finds the first existing name among '|'-separated alternatives (each
 * relative to base). Writes the full name to out. */
static const st_tensor *find_alt(bind_ctx *c, const char *base, const char *alts, char *out, size_t cap) {
  const char *p = alts;
  char first[512] = "";
  while (*p) {
    const char *bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    snprintf(out, cap, "%s%.*s", base, (int)n, p);
    if (!first[0]) snprintf(first, sizeof first, "%s", out);
    const st_tensor *t = st_find(c->st, out);
    if (t) return t;
    p += n + (bar ? 1 : 0);
  }
  snprintf(out, cap, "%s", first);
  return NULL;
}

static int load_f32(bind_ctx *c, const char *base, const char *alts, int ndim, const int64_t *shape, float **dst) {
  char name[512];
  const st_tensor *t = find_alt(c, base, alts, name, sizeof name);
  if (!t) return glm53_err("checkpoint: missing tensor '%s'", name);
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  float *buf = aligned_alloc64((size_t)n * sizeof(float));
  if (st_read_f32(c->st, name, ndim, shape, buf) != 0) {
    free(buf);
    return -1;
  }
  c->bytes += (size_t)n * sizeof(float);
  *dst = buf;
  return 0;
}

static int vec(bind_ctx *c, const char *alts, int64_t n, float **dst) {
  return load_f32(c, c->lp, alts, 1, (int64_t[]){n}, dst);
}

static void mat_from(wmat *w, float *buf, int rows, int cols) {
  w->fmt = WMAT_F32;
  w->rows = rows;
  w->cols = cols;
  w->data = buf;
  w->owned = buf;
}

static int mat_at(bind_ctx *c, const char *base, const char *alts, int rows, int cols, wmat *w) {
  float *buf;
  if (load_f32(c, base, alts, 2, (int64_t[]){rows, cols}, &buf)) return -1;
  mat_from(w, buf, rows, cols);
  return 0;
}
static int mat(bind_ctx *c, const char *alts, int rows, int cols, wmat *w) {
  return mat_at(c, c->lp, alts, rows, cols, w);
}

static int bind_mhc(bind_ctx *c, const glm53_config *g, const char *site, mhc_weights *h) {
  int mix = (2 + g->hc_mult) * g->hc_mult;
  char a[256];
  snprintf(a, sizeof a, "hc_%s_fn|%s_hc.fn", site, site);
  if (load_f32(c, c->lp, a, 2, (int64_t[]){mix, (int64_t)g->hc_mult * g->hidden_size}, &h->fn)) return -1;
  snprintf(a, sizeof a, "hc_%s_base|%s_hc.base", site, site);
  if (vec(c, a, mix, &h->base)) return -1;
  snprintf(a, sizeof a, "hc_%s_scale|%s_hc.scale", site, site);
  return vec(c, a, 3, &h->scale);
}

static int bind_kda(bind_ctx *c, const glm53_config *g, kda_weights *k) {
  int D = g->hidden_size, H = g->linear_num_heads, hd = g->linear_head_dim, inner = H * hd;
  int K = g->linear_conv_kernel_dim;
  if (mat(c, "self_attn.q_proj.weight", inner, D, &k->q_proj) || mat(c, "self_attn.k_proj.weight", inner, D, &k->k_proj) ||
      mat(c, "self_attn.v_proj.weight", inner, D, &k->v_proj))
    return -1;
  char name[512];
  if (find_alt(c, c->lp, "self_attn.conv1d.weight", name, sizeof name)) {
    if (load_f32(c, c->lp, "self_attn.conv1d.weight", 3, (int64_t[]){3 * (int64_t)inner, 1, K}, &k->conv)) return -1;
  } else {
    static const char *parts[3] = {"self_attn.q_conv1d.weight", "self_attn.k_conv1d.weight", "self_attn.v_conv1d.weight"};
    k->conv = aligned_alloc64((size_t)3 * inner * K * sizeof(float));
    for (int i = 0; i < 3; i++) {
      float *part;
      if (load_f32(c, c->lp, parts[i], 3, (int64_t[]){inner, 1, K}, &part)) return -1;
      memcpy(k->conv + (size_t)i * inner * K, part, (size_t)inner * K * sizeof(float));
      free(part);
    }
  }
  if (mat(c, "self_attn.f_a_proj.weight|self_attn.forget_gate.f_a_proj.weight", hd, D, &k->f_a) ||
      mat(c, "self_attn.f_b_proj.weight|self_attn.forget_gate.f_b_proj.weight", inner, hd, &k->f_b) ||
      vec(c, "self_attn.dt_bias|self_attn.forget_gate.dt_bias", inner, &k->dt_bias) ||
      vec(c, "self_attn.A_log|self_attn.forget_gate.A_log", H, &k->A_log) ||
      mat(c, "self_attn.b_proj.weight", H, D, &k->b_proj) || mat(c, "self_attn.g_a_proj.weight", hd, D, &k->g_a) ||
      mat(c, "self_attn.g_b_proj.weight", inner, hd, &k->g_b) || vec(c, "self_attn.o_norm.weight", hd, &k->o_norm) ||
      mat(c, "self_attn.o_proj.weight", D, inner, &k->o_proj))
    return -1;
  return 0;
}

static int bind_mla(bind_ctx *c, const glm53_config *g, int index_kind, mla_weights *a) {
  int D = g->hidden_size, H = g->num_attention_heads;
  int nope = g->qk_nope_head_dim, vd = g->v_head_dim, ql = g->q_lora_rank, kl = g->kv_lora_rank;
  if (mat(c, "self_attn.q_a_proj.weight", ql, D, &a->q_a) || vec(c, "self_attn.q_a_layernorm.weight", ql, &a->q_a_norm) ||
      mat(c, "self_attn.q_b_proj.weight", H * nope, ql, &a->q_b) ||
      mat(c, "self_attn.kv_a_proj_with_mqa.weight", kl, D, &a->kv_a) ||
      vec(c, "self_attn.kv_a_layernorm.weight", kl, &a->kv_a_norm) ||
      mat(c, "self_attn.kv_b_proj.weight", H * (nope + vd), kl, &a->kv_b) ||
      mat(c, "self_attn.o_proj.weight", D, H * vd, &a->o_proj))
    return -1;
  a->has_indexer = index_kind == INDEX_FULL;
  if (!a->has_indexer) return 0;
  int nh = g->index_n_heads, hd = g->index_head_dim;
  indexer_weights *x = &a->idx;
  if (mat(c, "self_attn.indexer.wq_b.weight", nh * hd, ql, &x->wq_b) || mat(c, "self_attn.indexer.wk.weight", hd, D, &x->wk) ||
      vec(c, "self_attn.indexer.k_norm.weight", hd, &x->k_norm_w) || vec(c, "self_attn.indexer.k_norm.bias", hd, &x->k_norm_b) ||
      mat(c, "self_attn.indexer.weights_proj.weight", nh, D, &x->weights_proj) ||
      mat(c, "self_attn.indexer.index_kpool_compress_gate", hd, D, &x->gate) ||
      load_f32(c, c->lp, "self_attn.indexer.index_kpool_compress_ape", 2, (int64_t[]){g->index_kpool, hd}, &x->ape))
    return -1;
  return 0;
}

static int bind_mlp(bind_ctx *c, const char *base, int D, int I, mlp_weights *m) {
  return mat_at(c, base, "gate_proj.weight", I, D, &m->gate) || mat_at(c, base, "up_proj.weight", I, D, &m->up) ||
         mat_at(c, base, "down_proj.weight", D, I, &m->down);
}

static int bind_moe(bind_ctx *c, const glm53_config *g, moe_weights *m) {
  int D = g->hidden_size, E = g->n_routed_experts, I = g->moe_intermediate_size;
  if (mat(c, "mlp.gate.weight", E, D, &m->router) ||
      vec(c, "mlp.gate.e_score_correction_bias", E, &m->bias))
    return -1;
  char base[256];
  snprintf(base, sizeof base, "%smlp.shared_experts.", c->lp);
  if (bind_mlp(c, base, D, I * g->n_shared_experts, &m->shared)) return -1;
  m->experts = xcalloc((size_t)E, sizeof(mlp_weights));
  char name[512];
  if (find_alt(c, c->lp, "mlp.experts.gate_up_proj", name, sizeof name)) {
    /* transformers 5 fused layout: gate_up [E][2I][D] (gate rows first), down [E][D][I] */
    float *gu, *dn;
    if (load_f32(c, c->lp, "mlp.experts.gate_up_proj", 3, (int64_t[]){E, 2 * (int64_t)I, D}, &gu)) return -1;
    if (load_f32(c, c->lp, "mlp.experts.down_proj", 3, (int64_t[]){E, D, I}, &dn)) { free(gu); return -1; }
    size_t gsz = (size_t)I * D;
    for (int e = 0; e < E; e++) {
      float *gp = aligned_alloc64(gsz * 4), *up = aligned_alloc64(gsz * 4), *dp = aligned_alloc64(gsz * 4);
      memcpy(gp, gu + (size_t)e * 2 * gsz, gsz * 4);
      memcpy(up, gu + (size_t)e * 2 * gsz + gsz, gsz * 4);
      memcpy(dp, dn + (size_t)e * gsz, gsz * 4);
      mat_from(&m->experts[e].gate, gp, I, D);
      mat_from(&m->experts[e].up, up, I, D);
      mat_from(&m->experts[e].down, dp, D, I);
    }
    free(gu);
    free(dn);
    return 0;
  }
  for (int e = 0; e < E; e++) {
    snprintf(base, sizeof base, "%smlp.experts.%d.", c->lp, e);
    if (bind_mlp(c, base, D, I, &m->experts[e])) return -1;
  }
  return 0;
}

static int find_prefix(bind_ctx *c) {
  static const char *cands[] = {"model.language_model.", "model.", "language_model.model.", "language_model.", ""};
  for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
    char name[256];
    snprintf(name, sizeof name, "%sembed_tokens.weight", cands[i]);
    if (st_find(c->st, name)) {
      snprintf(c->prefix, sizeof c->prefix, "%s", cands[i]);
      return 0;
    }
  }
  return glm53_err("checkpoint: no embed_tokens.weight tensor (is this a GLM-5.3 text checkpoint?)");
}

int model_bind_safetensors(glm53_model *m, const char *dir) {
  bind_ctx c = {0};
  c.st = st_open(dir);
  if (!c.st) return -1;
  m->st = c.st;
  const glm53_config *g = &m->cfg;
  int D = g->hidden_size, V = g->vocab_size;
  if (find_prefix(&c)) return -1;
  snprintf(c.lp, sizeof c.lp, "%s", c.prefix);
  if (mat(&c, "embed_tokens.weight", V, D, &m->embed) || vec(&c, "norm.weight", D, &m->final_norm)) return -1;
  if (g->tie_word_embeddings) {
    m->lm_head = m->embed;
    m->lm_head.owned = NULL;
  } else if (mat_at(&c, "", "lm_head.weight", V, D, &m->lm_head)) {
    return -1;
  }
  m->layers = xcalloc((size_t)g->num_hidden_layers, sizeof(layer_weights));
  for (int l = 0; l < g->num_hidden_layers; l++) {
    layer_weights *L = &m->layers[l];
    snprintf(c.lp, sizeof c.lp, "%slayers.%d.", c.prefix, l);
    L->attn_kind = g->layer_types[l];
    L->mlp_kind = g->mlp_layer_types[l];
    L->index_kind = g->indexer_types[l];
    if (vec(&c, "input_layernorm.weight", D, &L->input_norm) || vec(&c, "post_attention_layernorm.weight", D, &L->post_attn_norm) ||
        bind_mhc(&c, g, "attn", &L->hc_attn) || bind_mhc(&c, g, "ffn", &L->hc_ffn))
      return glm53_err_ctx("layer %d", l);
    int rc = L->attn_kind == ATTN_KDA ? bind_kda(&c, g, &L->kda) : bind_mla(&c, g, L->index_kind, &L->mla);
    if (rc == 0 && L->mlp_kind == MLP_DENSE) {
      char base[256];
      snprintf(base, sizeof base, "%smlp.", c.lp);
      rc = bind_mlp(&c, base, D, g->intermediate_size, &L->dense);
    } else if (rc == 0) {
      rc = bind_moe(&c, g, &L->moe);
    }
    if (rc) return glm53_err_ctx("layer %d", l);
  }
  m->weight_bytes = c.bytes;
  return 0;
}

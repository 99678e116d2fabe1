/* The reference forward of the whole text model over one chunk of tokens
 * (a prefill chunk or a single decode token), layer-major like the
 * reference: embedding -> 4 identical streams -> for each layer two mHC sites
 * (attention, then FFN) -> mean over streams -> final norm -> LM head. */
#include "model/layers.h"
#include "model/ops.h"
#include "core/err.h"
#include "core/util.h"
#include <stdlib.h>

typedef struct {
  float *post, *comb, *u, *y, *a;
} site_buf;

/* One mHC site: collapse streams, norm, run the sublayer, recombine. */
static void run_site(const glm53_config *c, const mhc_weights *hw, const float *norm_w, float *X, int T, site_buf *b,
                     void (*sub)(void *ctx, const float *y, int T, float *out), void *ctx) {
  const int hc = c->hc_mult, D = c->hidden_size;
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++) {
    mhc_pre(hw, c, X + (size_t)t * hc * D, b->post + t * hc, b->comb + t * hc * hc, b->u + (size_t)t * D);
    rmsnorm(b->y + (size_t)t * D, b->u + (size_t)t * D, norm_w, D, c->rms_norm_eps);
  }
  sub(ctx, b->y, T, b->a);
#pragma omp parallel for schedule(static)
  for (int t = 0; t < T; t++) mhc_post(c, b->a + (size_t)t * D, b->post + t * hc, b->comb + t * hc * hc, X + (size_t)t * hc * D);
}

/* One call's tokens: runs of one or more sessions (seq_run, layers.h);
 * ss[i] owns runs[i], whose state pointers are set per layer. */
typedef struct {
  const glm53_model *m;
  glm53_session **ss;
  seq_run *runs;
  int nruns, l;
  dsa_sel *sel;
  int *pool_buf;
} attn_ctx;

static void attn_sub(void *vctx, const float *y, int T, float *out) {
  attn_ctx *x = vctx;
  const glm53_config *c = &x->m->cfg;
  const layer_weights *L = &x->m->layers[x->l];
  for (int i = 0; i < x->nruns; i++) {
    x->runs[i].kda = &x->ss[i]->kda[x->l];
    x->runs[i].mla = &x->ss[i]->mla[x->l];
  }
  if (L->attn_kind == ATTN_KDA) kda_forward_runs(&L->kda, c, x->runs, x->nruns, y, T, out);
  else mla_forward_runs(&L->mla, c, x->runs, x->nruns, y, T, x->sel, x->pool_buf, out);
}

static void ffn_sub(void *vctx, const float *y, int T, float *out) {
  attn_ctx *x = vctx;
  const glm53_config *c = &x->m->cfg;
  const layer_weights *L = &x->m->layers[x->l];
  if (L->mlp_kind == MLP_DENSE) mlp_forward(&L->dense, c->swiglu_limit, y, T, out);
  else moe_forward(&L->moe, c, y, T, out);
}

/* The forward of the T tokens of nruns runs (run i: session ss[i]'s tokens
 * at its positions); logits of rows [first, T). */
static void forward_runs(const glm53_model *m, glm53_session **ss, seq_run *runs, int nruns, const int32_t *tokens, int T,
                         int first, float *logits) {
  const glm53_config *c = &m->cfg;
  const int D = c->hidden_size, hc = c->hc_mult;

  float *X = xmalloc((size_t)T * hc * D * sizeof(float));
  for (int t = 0; t < T; t++) {
    wmat_get_row(&m->embed, tokens[t], X + (size_t)t * hc * D);
    for (int h = 1; h < hc; h++) memcpy(X + ((size_t)t * hc + h) * D, X + (size_t)t * hc * D, D * sizeof(float));
  }
  site_buf b = {
      .post = xmalloc((size_t)T * hc * sizeof(float)),
      .comb = xmalloc((size_t)T * hc * hc * sizeof(float)),
      .u = xmalloc((size_t)T * D * sizeof(float)),
      .y = xmalloc((size_t)T * D * sizeof(float)),
      .a = xmalloc((size_t)T * D * sizeof(float)),
  };
  /* The latest full indexer's selection, reused by "shared" DSA layers. */
  const int K = c->index_topk / c->index_kpool;
  dsa_sel *sel = xcalloc((size_t)T, sizeof(dsa_sel));
  int *pool_buf = xmalloc((size_t)T * (K > 0 ? K : 1) * sizeof(int));
  for (int l = 0; l < c->num_hidden_layers; l++) {
    const layer_weights *L = &m->layers[l];
    attn_ctx ctx = {.m = m, .ss = ss, .runs = runs, .nruns = nruns, .l = l, .sel = sel, .pool_buf = pool_buf};
    run_site(c, &L->hc_attn, L->input_norm, X, T, &b, attn_sub, &ctx);
    run_site(c, &L->hc_ffn, L->post_attn_norm, X, T, &b, ffn_sub, &ctx);
  }
  if (logits) {
    int n = T - first;
    float *h = b.u; /* reuse: collapsed, normed hidden of the requested rows */
    for (int t = first; t < T; t++) {
      float *ht = h + (size_t)(t - first) * D;
      for (int d = 0; d < D; d++) {
        double acc = 0;
        for (int k = 0; k < hc; k++) acc += X[((size_t)t * hc + k) * D + d];
        ht[d] = (float)(acc / hc);
      }
      rmsnorm(ht, ht, m->final_norm, D, c->rms_norm_eps);
    }
    wmat_matmul(&m->lm_head, h, n, logits);
  }
  free(X); free(b.post); free(b.comb); free(b.u); free(b.y); free(b.a); free(sel); free(pool_buf);
}

/* The cpu backend's forward: tokens at positions s->pos.. (the caller
 * validated them and advances pos). */
int cpu_forward(glm53_session *s, const int32_t *tokens, int T, float *logits, int all_rows) {
  seq_run run = {.t0 = 0, .len = T, .pos0 = s->pos};
  forward_runs(s->m, &s, &run, 1, tokens, T, all_rows ? 0 : T - 1, logits);
  return 0;
}

/* One token for each of n sessions of one model (glm53_forward_batch, which
 * validated them and advances pos): every weight product runs once over the
 * n tokens; each token's state work uses its own session. A token gets the
 * bits of its own single-token forward up to CPU_GEMV_MAX_N (8) tokens
 * (the quantized products stay on the decode GEMV); above, the quantized
 * products are the prefill kernel, which rounds differently. */
int cpu_forward_batch(glm53_session **ss, const int32_t *tokens, int n, float *logits) {
  seq_run *runs = xcalloc((size_t)n, sizeof *runs);
  for (int i = 0; i < n; i++) runs[i] = (seq_run){.t0 = i, .len = 1, .pos0 = ss[i]->pos};
  forward_runs(ss[0]->m, ss, runs, n, tokens, n, 0, logits);
  free(runs);
  return 0;
}

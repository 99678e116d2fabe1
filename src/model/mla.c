/* NoPE multi-head latent attention in absorbed form, with the DSA lightning
 * indexer and k-pool compression selecting which cached latents each query
 * may attend to. See docs/architecture.md ("DSA selection") for the causal
 * semantics we implement and how they relate to transformers'. */
#include "model/layers.h"
#include "model/ops.h"
#include "core/util.h"
#include <float.h>
#include <pthread.h>
#include <stdlib.h>

/* (score desc, index asc); NaN sorts as -inf. */
static int pool_before(float a, int ia, float b, int ib) {
  if (isnan(a)) a = -INFINITY;
  if (isnan(b)) b = -INFINITY;
  if (a != b) return a > b;
  return ia < ib;
}

void topk_pools(const float *score, int n, int k, int *out) {
  /* insertion into a sorted k-list: O(n k), fine for the reference */
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (m == k && !pool_before(score[i], i, score[out[m - 1]], out[m - 1])) continue;
    int j = m < k ? m++ : k - 1;
    while (j > 0 && pool_before(score[i], i, score[out[j - 1]], out[j - 1])) {
      out[j] = out[j - 1];
      j--;
    }
    out[j] = i;
  }
}

void indexer_scores(const glm53_config *c, const float *q, const float *w, const float *pool, int npool, float *score) {
  const int nh = c->index_n_heads, hd = c->index_head_dim;
  const double s = 1.0 / sqrt((double)hd);
  for (int p = 0; p < npool; p++) {
    double acc = 0;
    for (int h = 0; h < nh; h++) {
      double d = dotd(q + (size_t)h * hd, pool + (size_t)p * hd, hd) * s;
      if (d > 0) acc += (double)w[h] * d;
    }
    score[p] = (float)acc;
  }
}

/* Pooled key of pool p: per channel, softmax over the kpool slots of
 * (gate + ape), weighting the slots' indexer keys. */
static void pool_key(const glm53_config *c, const indexer_weights *x, const mla_state *st, int p, float *out) {
  const int P = c->index_kpool, hd = c->index_head_dim;
  for (int i = 0; i < hd; i++) {
    float l[64], mx = -INFINITY;
    for (int m = 0; m < P; m++) {
      l[m] = st->is[(size_t)(p * P + m) * hd + i] + x->ape[m * hd + i];
      if (l[m] > mx) mx = l[m];
    }
    double z = 0, acc = 0;
    for (int m = 0; m < P; m++) z += exp((double)l[m] - mx);
    for (int m = 0; m < P; m++) acc += exp((double)l[m] - mx) / z * st->ik[(size_t)(p * P + m) * hd + i];
    out[i] = (float)acc;
  }
}

/* Runs the indexer for the T queries of the runs (each at its sequence's
 * positions pos0..); fills sel[t]. tseg[t]: the run of token t. */
static void indexer_forward(const indexer_weights *x, const glm53_config *c, const seq_run *runs, int nruns, const int *tseg,
                            const float *y, const float *r, int T, dsa_sel *sel, int *pool_buf) {
  const int nh = c->index_n_heads, hd = c->index_head_dim, P = c->index_kpool;
  const int K = c->index_topk / c->index_kpool;
  float *q = xmalloc((size_t)T * nh * hd * sizeof(float));
  float *wt = xmalloc((size_t)T * nh * sizeof(float));
  float *kk = xmalloc((size_t)T * hd * sizeof(float));
  wmat_matmul(&x->wq_b, r, T, q);
  wmat_matmul(&x->weights_proj, y, T, wt);
  for (int i = 0; i < T * nh; i++) wt[i] *= 1.0f / sqrtf((float)nh);
  wmat_matmul(&x->wk, y, T, kk);
  for (int t = 0; t < T; t++) {
    const seq_run *u = &runs[tseg[t]];
    layernorm(u->mla->ik + (size_t)(u->pos0 + t - u->t0) * hd, kk + (size_t)t * hd, x->k_norm_w, x->k_norm_b, hd, 1e-6f);
  }
  float *gs = kk; /* reuse: pool-gate logits */
  wmat_matmul(&x->gate, y, T, gs);
  for (int i = 0; i < nruns; i++) {
    const seq_run *u = &runs[i];
    mla_state *st = u->mla;
    memcpy(st->is + (size_t)u->pos0 * hd, gs + (size_t)u->t0 * hd, (size_t)u->len * hd * sizeof(float));
    /* close every pool completed by this run (keys are always stored, even
     * while selection is dense, so later queries have the history) */
    for (int pos = u->pos0; pos < u->pos0 + u->len; pos++)
      if ((pos + 1) % P == 0) pool_key(c, x, st, pos / P, st->pool + (size_t)(pos / P) * hd);
  }
#pragma omp parallel for schedule(dynamic)
  for (int t = 0; t < T; t++) {
    const seq_run *u = &runs[tseg[t]];
    const mla_state *st = u->mla;
    const int pos = u->pos0 + t - u->t0, n = (pos + 1) / P; /* complete pools visible to this query */
    dsa_sel *s = &sel[t];
    s->pools = pool_buf + (size_t)t * K;
    s->tail_begin = n * P;
    if (n <= K) {
      s->dense = c->index_kpool_always_select_tail;
      s->npools = n;
      for (int p = 0; p < n; p++) s->pools[p] = p;
    } else {
      float *score = xmalloc((size_t)n * sizeof(float));
      indexer_scores(c, q + (size_t)t * nh * hd, wt + (size_t)t * nh, st->pool, n, score);
      topk_pools(score, n, K, s->pools);
      free(score);
      s->dense = 0;
      s->npools = K;
    }
    if (!c->index_kpool_always_select_tail) s->tail_begin = pos + 1; /* no tail */
  }
  free(q);
  free(wt);
  free(kk);
}

/* Visits the token positions selected for query position t. */
#define FOR_SELECTED(s, t, P, tok, BODY)                                          \
  do {                                                                            \
    if ((s)->dense) {                                                             \
      for (int tok = 0; tok <= (t); tok++) { BODY; }                              \
    } else {                                                                      \
      for (int pi = 0; pi < (s)->npools; pi++)                                    \
        for (int tok = (s)->pools[pi] * (P); tok < ((s)->pools[pi] + 1) * (P); tok++) { BODY; } \
      for (int tok = (s)->tail_begin; tok <= (t); tok++) { BODY; }                \
    }                                                                             \
  } while (0)

/* kv_b as fp32 rows. The absorbed form needs W_UK's columns and W_UV's rows
 * of every head for every token, so a quantized kv_b is dequantized once per
 * model (11 x 64 MiB for the full model) rather than once per call, which
 * cost ~250 ms per decoded token at full dimensions (docs/benchmarks.md). */
static const float *kv_b_rows(const mla_weights *w) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  if (w->kv_b.fmt == WMAT_F32) return w->kv_b.data;
  pthread_mutex_lock(&mu);
  mla_weights *mw = (mla_weights *)w; /* a cache owned by the model, filled once */
  if (!mw->kv_b_f32) {
    const int rows = w->kv_b.rows, kl = w->kv_b.cols;
    float *f = xmalloc((size_t)rows * kl * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int i = 0; i < rows; i++) wmat_get_row(&w->kv_b, i, f + (size_t)i * kl);
    mw->kv_b_f32 = f;
  }
  pthread_mutex_unlock(&mu);
  return mw->kv_b_f32;
}

void mla_forward(const mla_weights *w, const glm53_config *c, mla_state *st, const float *y, int T, int pos0,
                 dsa_sel *sel, int *pool_buf, float *out) {
  const seq_run run = {.t0 = 0, .len = T, .pos0 = pos0, .mla = st};
  mla_forward_runs(w, c, &run, 1, y, T, sel, pool_buf, out);
}

void mla_forward_runs(const mla_weights *w, const glm53_config *c, const seq_run *runs, int nruns, const float *y, int T,
                      dsa_sel *sel, int *pool_buf, float *out) {
  const int H = c->num_attention_heads, nope = c->qk_nope_head_dim, vd = c->v_head_dim;
  const int ql = c->q_lora_rank, kl = c->kv_lora_rank, P = c->index_kpool;
  int *tseg = xmalloc((size_t)T * sizeof(int));
  for (int i = 0; i < nruns; i++)
    for (int t = runs[i].t0; t < runs[i].t0 + runs[i].len; t++) tseg[t] = i;
  float *r = xmalloc((size_t)T * ql * sizeof(float));
  float *q = xmalloc((size_t)T * H * nope * sizeof(float));
  float *ckv = xmalloc((size_t)T * kl * sizeof(float));
  wmat_matmul(&w->q_a, y, T, r);
  for (int t = 0; t < T; t++) rmsnorm(r + (size_t)t * ql, r + (size_t)t * ql, w->q_a_norm, ql, c->rms_norm_eps);
  wmat_matmul(&w->q_b, r, T, q);
  wmat_matmul(&w->kv_a, y, T, ckv);
  for (int t = 0; t < T; t++) {
    const seq_run *u = &runs[tseg[t]];
    rmsnorm(u->mla->latent + (size_t)(u->pos0 + t - u->t0) * kl, ckv + (size_t)t * kl, w->kv_a_norm, kl, c->rms_norm_eps);
  }
  if (w->has_indexer) indexer_forward(&w->idx, c, runs, nruns, tseg, y, r, T, sel, pool_buf);

  /* W_UK[h] = rows [h(nope+v), h(nope+v)+nope) of kv_b, W_UV[h] the next vd rows */
  const float *kvb = kv_b_rows(w);
  const double scale = 1.0 / sqrt((double)(nope + c->qk_rope_head_dim));
  float *o = xmalloc((size_t)T * H * vd * sizeof(float));
#pragma omp parallel for schedule(dynamic) collapse(2)
  for (int t = 0; t < T; t++)
    for (int h = 0; h < H; h++) {
      const seq_run *u = &runs[tseg[t]];
      const mla_state *st = u->mla;
      const int pos = u->pos0 + t - u->t0;
      const dsa_sel *s = &sel[t];
      const float *qh = q + ((size_t)t * H + h) * nope;
      const float *WUK = kvb + (size_t)h * (nope + vd) * kl, *WUV = WUK + (size_t)nope * kl;
      /* one scratch block: absorbed query, softmax-weighted latent sum, the
       * scores of the selected tokens (at most pos + 1) */
      double *acc = xmalloc(((size_t)kl + (size_t)pos + 1) * sizeof(double) + (size_t)kl * sizeof(float));
      double *sc = acc + kl;
      float *qt = (float *)(sc + pos + 1);
      /* q~ = W_UK^T q, as a sum of W_UK rows (contiguous reads) */
      for (int j = 0; j < kl; j++) acc[j] = 0;
      for (int i = 0; i < nope; i++) {
        const float *row = WUK + (size_t)i * kl;
        const double qi = qh[i];
        for (int j = 0; j < kl; j++) acc[j] += qi * row[j];
      }
      for (int j = 0; j < kl; j++) qt[j] = (float)acc[j];
      /* scores once, then the softmax-weighted latent sum */
      double mx = -INFINITY;
      int ns = 0;
      FOR_SELECTED(s, pos, P, tok, {
        sc[ns] = dotd(qt, st->latent + (size_t)tok * kl, kl) * scale;
        if (sc[ns] > mx) mx = sc[ns];
        ns++;
      });
      double z = 0;
      for (int j = 0; j < kl; j++) acc[j] = 0;
      ns = 0;
      FOR_SELECTED(s, pos, P, tok, {
        const float *cs = st->latent + (size_t)tok * kl;
        double p = exp(sc[ns++] - mx);
        z += p;
        for (int j = 0; j < kl; j++) acc[j] += p * cs[j];
      });
      float *ob = qt; /* q~ is no longer needed */
      for (int j = 0; j < kl; j++) ob[j] = z > 0 ? (float)(acc[j] / z) : 0.0f;
      float *oh = o + ((size_t)t * H + h) * vd;
      for (int i = 0; i < vd; i++) oh[i] = (float)dotd(WUV + (size_t)i * kl, ob, kl);
      free(acc);
    }
  wmat_matmul(&w->o_proj, o, T, out);
  free(o);
  free(r);
  free(q);
  free(ckv);
  free(tseg);
}

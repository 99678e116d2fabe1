/* MLA + DSA indexer: the engine's absorbed form (latent cache, absorbed
 * query, pooled keys, top-k over pools + tail) against a float64 naive
 * implementation that expands per-head keys/values and selects tokens by a
 * brute-force sort, as transformers does. Also checks topk_pools ties/NaN.
 * Tolerance: 2e-5 relative to the output scale. */
#include "model/layers.h"
#include "model/session.h"
#include "model/ops.h"
#include "core/util.h"
#include "model_fixture.h"

typedef struct { double s; int i; } scored;
static int cmp_scored(const void *a, const void *b) {
  const scored *x = a, *y = b;
  if (x->s != y->s) return x->s > y->s ? -1 : 1;
  return x->i - y->i;
}

static void dmatvec(const wmat *w, const double *x, double *y) {
  const float *W = w->data;
  for (int r = 0; r < w->rows; r++) {
    double a = 0;
    for (int j = 0; j < w->cols; j++) a += W[(size_t)r * w->cols + j] * x[j];
    y[r] = a;
  }
}
static void drms(double *x, const float *w, int n, double eps) {
  double ss = 0;
  for (int i = 0; i < n; i++) ss += x[i] * x[i];
  double r = 1 / sqrt(ss / n + eps);
  for (int i = 0; i < n; i++) x[i] = x[i] * r * w[i];
}

/* float64 naive MLA for all T tokens of y (fresh context) */
static void ref_mla(const mla_weights *w, const glm53_config *c, const float *y, int T, double *out) {
  int D = c->hidden_size, H = c->num_attention_heads, nope = c->qk_nope_head_dim, vd = c->v_head_dim, kl = c->kv_lora_rank;
  int ql = c->q_lora_rank, nh = c->index_n_heads, hd = c->index_head_dim, P = c->index_kpool, K = c->index_topk / P;
  double *yd = xmalloc(D * 8), *r = xmalloc((size_t)T * ql * 8), *q = xmalloc((size_t)T * H * nope * 8);
  double *ck = xmalloc((size_t)T * kl * 8), *kk = xmalloc((size_t)T * H * nope * 8), *vv = xmalloc((size_t)T * H * vd * 8);
  double *qi = xmalloc((size_t)T * nh * hd * 8), *ki = xmalloc((size_t)T * hd * 8), *gi = xmalloc((size_t)T * hd * 8), *wi = xmalloc((size_t)T * nh * 8);
  for (int t = 0; t < T; t++) {
    for (int d = 0; d < D; d++) yd[d] = y[t * D + d];
    dmatvec(&w->q_a, yd, r + t * ql);
    drms(r + t * ql, w->q_a_norm, ql, c->rms_norm_eps);
    dmatvec(&w->q_b, r + t * ql, q + (size_t)t * H * nope);
    dmatvec(&w->kv_a, yd, ck + t * kl);
    drms(ck + t * kl, w->kv_a_norm, kl, c->rms_norm_eps);
    double *kv = xmalloc((size_t)H * (nope + vd) * 8);
    dmatvec(&w->kv_b, ck + t * kl, kv);
    for (int h = 0; h < H; h++) {
      memcpy(kk + ((size_t)t * H + h) * nope, kv + h * (nope + vd), nope * 8);
      memcpy(vv + ((size_t)t * H + h) * vd, kv + h * (nope + vd) + nope, vd * 8);
    }
    free(kv);
    dmatvec(&w->idx.wq_b, r + t * ql, qi + (size_t)t * nh * hd);
    dmatvec(&w->idx.wk, yd, ki + t * hd);
    double mu = 0, var = 0;
    for (int i = 0; i < hd; i++) mu += ki[t * hd + i];
    mu /= hd;
    for (int i = 0; i < hd; i++) var += (ki[t * hd + i] - mu) * (ki[t * hd + i] - mu);
    var /= hd;
    for (int i = 0; i < hd; i++) ki[t * hd + i] = (ki[t * hd + i] - mu) / sqrt(var + 1e-6) * w->idx.k_norm_w[i] + w->idx.k_norm_b[i];
    dmatvec(&w->idx.gate, yd, gi + t * hd);
    dmatvec(&w->idx.weights_proj, yd, wi + t * nh);
    for (int h = 0; h < nh; h++) wi[t * nh + h] /= sqrt(nh);
  }
  int npool = T / P;
  double *pool = xcalloc((size_t)(npool + 1) * hd, 8);
  for (int p = 0; p < npool; p++)
    for (int i = 0; i < hd; i++) {
      double mx = -1e300, z = 0, a = 0;
      for (int m = 0; m < P; m++) mx = fmax(mx, gi[(p * P + m) * hd + i] + w->idx.ape[m * hd + i]);
      for (int m = 0; m < P; m++) z += exp(gi[(p * P + m) * hd + i] + w->idx.ape[m * hd + i] - mx);
      for (int m = 0; m < P; m++) a += exp(gi[(p * P + m) * hd + i] + w->idx.ape[m * hd + i] - mx) / z * ki[(p * P + m) * hd + i];
      pool[p * hd + i] = a;
    }
  double *o = xmalloc((size_t)H * vd * 8);
  char *sel = xmalloc(T);
  scored *sc = xmalloc((size_t)(npool + 1) * sizeof(scored));
  for (int t = 0; t < T; t++) {
    int n = (t + 1) / P;
    memset(sel, 0, T);
    if (n <= K) for (int s = 0; s <= t; s++) sel[s] = 1;
    else {
      for (int p = 0; p < n; p++) {
        double a = 0;
        for (int h = 0; h < nh; h++) {
          double d = 0;
          for (int i = 0; i < hd; i++) d += qi[((size_t)t * nh + h) * hd + i] * pool[p * hd + i];
          d /= sqrt(hd);
          a += wi[t * nh + h] * (d > 0 ? d : 0);
        }
        sc[p].s = (float)a; /* the engine ranks fp32 scores; rank the same values */
        sc[p].i = p;
      }
      qsort(sc, n, sizeof *sc, cmp_scored);
      for (int k = 0; k < K; k++) for (int m = 0; m < P; m++) sel[sc[k].i * P + m] = 1;
      for (int s = n * P; s <= t; s++) sel[s] = 1;
    }
    for (int h = 0; h < H; h++) {
      double mx = -1e300, z = 0;
      double *sco = xmalloc((size_t)(t + 1) * 8);
      for (int s = 0; s <= t; s++) {
        if (!sel[s]) continue;
        double d = 0;
        for (int i = 0; i < nope; i++) d += q[((size_t)t * H + h) * nope + i] * kk[((size_t)s * H + h) * nope + i];
        sco[s] = d / sqrt(nope);
        mx = fmax(mx, sco[s]);
      }
      for (int j = 0; j < vd; j++) o[h * vd + j] = 0;
      for (int s = 0; s <= t; s++) {
        if (!sel[s]) continue;
        double p = exp(sco[s] - mx);
        z += p;
        for (int j = 0; j < vd; j++) o[h * vd + j] += p * vv[((size_t)s * H + h) * vd + j];
      }
      for (int j = 0; j < vd; j++) o[h * vd + j] /= z;
      free(sco);
    }
    dmatvec(&w->o_proj, o, out + (size_t)t * D);
  }
  free(yd); free(r); free(q); free(ck); free(kk); free(vv); free(qi); free(ki); free(gi); free(wi); free(pool); free(o); free(sel); free(sc);
}

static void run(int topk, int kpool, int T, int split, uint64_t seed) {
  glm53_config c;
  fx_config(&c, topk, kpool, 0);
  glm53_model *m = fx_model(&c, seed);
  const mla_weights *w = &m->layers[2].mla;
  int D = c.hidden_size, K = topk / kpool;
  trng r = {seed * 31 + 7};
  float *y = xmalloc((size_t)T * D * 4), *out = xmalloc((size_t)T * D * 4);
  for (int i = 0; i < T * D; i++) y[i] = (float)trng_normal(&r);
  glm53_session *s = glm53_session_new(m, T);
  dsa_sel *sel = xcalloc(T, sizeof(dsa_sel));
  int *pb = xmalloc((size_t)T * K * sizeof(int));
  mla_forward(w, &c, &s->mla[2], y, split, 0, sel, pb, out); /* prefill part, then the rest one by one */
  for (int t = split; t < T; t++) mla_forward(w, &c, &s->mla[2], y + (size_t)t * D, 1, t, sel, pb, out + (size_t)t * D);
  double *ref = xmalloc((size_t)T * D * 8);
  ref_mla(w, &c, y, T, ref);
  double err = 0, scale = 0;
  for (int i = 0; i < T * D; i++) { err = fmax(err, fabs(out[i] - ref[i])); scale = fmax(scale, fabs(ref[i])); }
  CHECK(err <= 2e-5 * scale, "topk %d kpool %d T %d split %d: err %g scale %g", topk, kpool, T, split, err, scale);
  free(y); free(out); free(ref); free(sel); free(pb);
  glm53_session_free(s);
  glm53_model_free(m);
}

int main(void) {
  run(64, 4, 20, 20, 1);  /* dense regime */
  run(8, 4, 40, 40, 2);   /* sparse prefill */
  run(8, 4, 40, 13, 3);   /* sparse, prefill + decode crossing pool boundaries */
  run(8, 2, 33, 1, 4);    /* kpool 2, decode only */
  run(6, 1, 25, 10, 5);   /* kpool 1: no tail */
  run(16, 4, 70, 35, 6);
  /* topk_pools: ties by lower index, NaN last */
  float s[8] = {1, 3, 3, NAN, 0, 3, -1, 0};
  int out[4];
  topk_pools(s, 8, 4, out);
  CHECK(out[0] == 1 && out[1] == 2 && out[2] == 5 && out[3] == 0, "ties: %d %d %d %d", out[0], out[1], out[2], out[3]);
  float z[6] = {0, 0, 0, 0, 0, 0};
  topk_pools(z, 6, 3, out);
  CHECK(out[0] == 0 && out[1] == 1 && out[2] == 2, "all-zero ties choose lowest pools");
  float nn[3] = {NAN, NAN, -INFINITY};
  topk_pools(nn, 3, 3, out);
  CHECK(out[0] == 0 && out[1] == 1 && out[2] == 2, "NaN ranks as -inf, ties by index");
  TEST_DONE();
}

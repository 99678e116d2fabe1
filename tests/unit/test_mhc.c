/* mHC pre/post and Sinkhorn against float64 versions written from the
 * reference's definition. Tolerance: 1e-5 relative (fp32 vs fp64). */
#include "model/layers.h"
#include "core/util.h"
#include "test_util.h"

static void ref_pre(const glm53_config *c, const float *fn, const float *base, const float *scale, const float *X,
                    double *post, double *comb, double *u) {
  int hc = c->hc_mult, D = c->hidden_size, n = hc * D, mix = (2 + hc) * hc;
  double ss = 0;
  for (int i = 0; i < n; i++) ss += (double)X[i] * X[i];
  double r = 1 / sqrt(ss / n + c->rms_norm_eps), mu[400], pre[16];
  for (int k = 0; k < mix; k++) {
    double a = 0;
    for (int i = 0; i < n; i++) a += (double)fn[k * n + i] * (X[i] * r);
    mu[k] = a;
  }
  for (int s = 0; s < hc; s++) {
    pre[s] = 1 / (1 + exp(-(scale[0] * mu[s] + base[s]))) + c->hc_eps;
    post[s] = 2 / (1 + exp(-(scale[1] * mu[hc + s] + base[hc + s])));
  }
  for (int g = 0; g < hc; g++) {
    double mx = -1e300, z = 0, row[16];
    for (int h = 0; h < hc; h++) { row[h] = scale[2] * mu[2 * hc + g * hc + h] + base[2 * hc + g * hc + h]; mx = fmax(mx, row[h]); }
    for (int h = 0; h < hc; h++) z += exp(row[h] - mx);
    for (int h = 0; h < hc; h++) comb[g * hc + h] = exp(row[h] - mx) / z + c->hc_eps;
  }
  for (int it = 0; it < c->hc_sinkhorn_iters; it++) {
    if (it)
      for (int g = 0; g < hc; g++) {
        double s = 0;
        for (int h = 0; h < hc; h++) s += comb[g * hc + h];
        for (int h = 0; h < hc; h++) comb[g * hc + h] /= s + c->hc_eps;
      }
    for (int h = 0; h < hc; h++) {
      double s = 0;
      for (int g = 0; g < hc; g++) s += comb[g * hc + h];
      for (int g = 0; g < hc; g++) comb[g * hc + h] /= s + c->hc_eps;
    }
  }
  for (int d = 0; d < D; d++) {
    u[d] = 0;
    for (int s = 0; s < hc; s++) u[d] += pre[s] * X[s * D + d];
  }
}

static void run(int hc, int D, uint64_t seed) {
  glm53_config c = {0};
  c.hc_mult = hc; c.hidden_size = D; c.rms_norm_eps = 1e-5f; c.hc_eps = 1e-6f; c.hc_sinkhorn_iters = 20;
  trng r = {seed};
  int mix = (2 + hc) * hc, n = hc * D;
  float *fn = xmalloc(mix * n * 4), base[400], scale[3], *X = xmalloc(n * 4), *y = xmalloc(D * 4);
  for (int i = 0; i < mix * n; i++) fn[i] = (float)(0.05 * trng_normal(&r));
  for (int i = 0; i < mix; i++) base[i] = (float)(0.5 * trng_normal(&r));
  for (int i = 0; i < 3; i++) scale[i] = (float)(1 + 0.3 * trng_normal(&r));
  for (int i = 0; i < n; i++) X[i] = (float)(3 * trng_normal(&r));
  for (int i = 0; i < D; i++) y[i] = (float)trng_normal(&r);
  mhc_weights w = {fn, base, scale};
  float post[8], comb[64], *u = xmalloc(D * 4);
  double rpost[8], rcomb[64], *ru = xmalloc(D * 8);
  mhc_pre(&w, &c, X, post, comb, u);
  ref_pre(&c, fn, base, scale, X, rpost, rcomb, ru);
  for (int s = 0; s < hc; s++) CHECK_NEAR(post[s], rpost[s], 1e-5, "post[%d]", s);
  for (int k = 0; k < hc * hc; k++) CHECK_NEAR(comb[k], rcomb[k], 1e-5, "comb[%d] %g vs %g", k, comb[k], rcomb[k]);
  double umax = 0, uerr = 0;
  for (int d = 0; d < D; d++) { umax = fmax(umax, fabs(ru[d])); uerr = fmax(uerr, fabs(u[d] - ru[d])); }
  CHECK(uerr <= 1e-5 * umax, "u err %g (scale %g)", uerr, umax);
  /* Sinkhorn output is (nearly) doubly stochastic: columns sum to 1 exactly-ish, rows close */
  for (int h = 0; h < hc; h++) {
    double cs = 0, rs = 0;
    for (int g = 0; g < hc; g++) { cs += comb[g * hc + h]; rs += comb[h * hc + g]; }
    CHECK_NEAR(cs, 1.0, 1e-4, "column %d sums to %g", h, cs);
    CHECK_NEAR(rs, 1.0, 1e-2, "row %d sums to %g", h, rs);
  }
  /* post: X'[h] = post[h] y + sum_g comb[g][h] X[g] */
  float *X2 = xmalloc(n * 4);
  memcpy(X2, X, n * 4);
  mhc_post(&c, y, post, comb, X2);
  double perr = 0, pmax = 0;
  for (int h = 0; h < hc; h++)
    for (int d = 0; d < D; d++) {
      double e = (double)post[h] * y[d];
      for (int g = 0; g < hc; g++) e += (double)comb[g * hc + h] * X[g * D + d];
      perr = fmax(perr, fabs(e - X2[h * D + d]));
      pmax = fmax(pmax, fabs(e));
    }
  CHECK(perr <= 1e-6 * pmax, "post err %g", perr);
  free(fn); free(X); free(y); free(u); free(ru); free(X2);
}

int main(void) {
  run(4, 64, 1);
  run(4, 257, 2);
  run(2, 96, 3);
  run(8, 32, 4);
  TEST_DONE();
}

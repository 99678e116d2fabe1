/* Manifold-constrained hyper-connections: the 4-stream residual of GLM-5.3. */
#include "model/layers.h"
#include "model/ops.h"
#include "core/util.h"
#include <stdlib.h>

void mhc_sinkhorn(float *L, int n, int iters, float eps) {
  for (int g = 0; g < n; g++) { /* softmax over each row, then + eps */
    float *row = L + g * n, mx = row[0];
    for (int h = 1; h < n; h++) mx = row[h] > mx ? row[h] : mx;
    double s = 0;
    for (int h = 0; h < n; h++) s += (row[h] = expf(row[h] - mx));
    for (int h = 0; h < n; h++) row[h] = (float)(row[h] / s) + eps;
  }
  for (int it = 0; it < iters; it++) {
    if (it > 0) { /* row normalisation */
      for (int g = 0; g < n; g++) {
        float s = 0;
        for (int h = 0; h < n; h++) s += L[g * n + h];
        for (int h = 0; h < n; h++) L[g * n + h] /= s + eps;
      }
    }
    for (int h = 0; h < n; h++) { /* column normalisation */
      float s = 0;
      for (int g = 0; g < n; g++) s += L[g * n + h];
      for (int g = 0; g < n; g++) L[g * n + h] /= s + eps;
    }
  }
}

void mhc_pre(const mhc_weights *w, const glm53_config *c, const float *X, float *post, float *comb, float *u) {
  const int hc = c->hc_mult, D = c->hidden_size, n = hc * D, mix = (2 + hc) * hc;
  double ss = 0;
  for (int i = 0; i < n; i++) ss += (double)X[i] * X[i];
  const double r = 1.0 / sqrt(ss / n + c->rms_norm_eps);
  float mu[(2 + GLM53_MAX_HC) * GLM53_MAX_HC];
  for (int k = 0; k < mix; k++) mu[k] = (float)(dotd(w->fn + (size_t)k * n, X, n) * r);
  float pre[GLM53_MAX_HC];
  for (int s = 0; s < hc; s++) {
    pre[s] = sigmoidf_(w->scale[0] * mu[s] + w->base[s]) + c->hc_eps;
    post[s] = 2.0f * sigmoidf_(w->scale[1] * mu[hc + s] + w->base[hc + s]);
  }
  for (int k = 0; k < hc * hc; k++) comb[k] = w->scale[2] * mu[2 * hc + k] + w->base[2 * hc + k];
  mhc_sinkhorn(comb, hc, c->hc_sinkhorn_iters, c->hc_eps);
  for (int d = 0; d < D; d++) {
    double acc = 0;
    for (int s = 0; s < hc; s++) acc += (double)pre[s] * X[s * D + d];
    u[d] = (float)acc;
  }
}

void mhc_post(const glm53_config *c, const float *y, const float *post, const float *comb, float *X) {
  const int hc = c->hc_mult, D = c->hidden_size;
  float *old = xmalloc((size_t)hc * D * sizeof(float));
  memcpy(old, X, (size_t)hc * D * sizeof(float));
  for (int h = 0; h < hc; h++)
    for (int d = 0; d < D; d++) {
      double acc = (double)post[h] * y[d];
      for (int g = 0; g < hc; g++) acc += (double)comb[g * hc + h] * old[g * D + d];
      X[h * D + d] = (float)acc;
    }
  free(old);
}

/* Scalar building blocks of the fp32 reference forward. Statistics are
 * accumulated in double so the reference stays the more precise side of any
 * comparison. */
#ifndef GLM53_MODEL_OPS_H
#define GLM53_MODEL_OPS_H
#include <math.h>

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float siluf_(float x) { return x / (1.0f + expf(-x)); }

/* y = w * x / sqrt(mean(x^2) + eps); w may be NULL (unweighted). In-place ok. */
static inline void rmsnorm(float *y, const float *x, const float *w, int n, float eps) {
  double ss = 0;
  for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
  float r = (float)(1.0 / sqrt(ss / n + eps));
  for (int i = 0; i < n; i++) y[i] = (w ? w[i] : 1.0f) * (x[i] * r);
}

/* LayerNorm with bias, biased variance. */
static inline void layernorm(float *y, const float *x, const float *w, const float *b, int n, float eps) {
  double mu = 0, var = 0;
  for (int i = 0; i < n; i++) mu += x[i];
  mu /= n;
  for (int i = 0; i < n; i++) var += (x[i] - mu) * (x[i] - mu);
  var /= n;
  float r = (float)(1.0 / sqrt(var + eps));
  for (int i = 0; i < n; i++) y[i] = (float)((x[i] - mu) * r) * w[i] + b[i];
}

/* x / sqrt(sum(x^2) + eps) (eps inside the root, as FLA/transformers). */
static inline void l2norm(float *x, int n, float eps) {
  double ss = 0;
  for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
  float r = (float)(1.0 / sqrt(ss + eps));
  for (int i = 0; i < n; i++) x[i] *= r;
}

static inline double dotd(const float *a, const float *b, int n) {
  double s = 0;
  for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

/* Clamped SwiGLU: silu(min(g, L)) * clamp(u, -L, L); L = NaN means no clamp. */
static inline float swiglu_clamped(float g, float u, float limit) {
  if (!isnan(limit)) {
    if (g > limit) g = limit;
    if (u > limit) u = limit;
    if (u < -limit) u = -limit;
  }
  return siluf_(g) * u;
}

#endif

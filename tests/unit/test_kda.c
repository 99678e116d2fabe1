/* KDA: the chunked (prefill) form and the token (decode) form against a
 * float64 recurrence, for several chunk sizes and splits that carry state
 * across calls. Tolerance: 2e-5 relative to the output scale. */
#include "model/layers.h"
#include "model/ops.h"
#include "test_util.h"
#include "core/util.h"

/* float64 recurrence (the definition): S <- diag(e^g) S; S += k (beta (v - S^T k))^T; o = S^T q */
static void ref_kda(int T, int dk, int dv, const float *q, const float *k, const float *v, const float *g, const float *b,
                    double *S, double *o) {
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < dk; i++)
      for (int j = 0; j < dv; j++) S[i * dv + j] *= exp((double)g[t * dk + i]);
    for (int j = 0; j < dv; j++) {
      double r = 0;
      for (int i = 0; i < dk; i++) r += S[i * dv + j] * k[t * dk + i];
      double d = b[t] * (v[t * dv + j] - r);
      for (int i = 0; i < dk; i++) S[i * dv + j] += k[t * dk + i] * d;
    }
    for (int j = 0; j < dv; j++) {
      double acc = 0;
      for (int i = 0; i < dk; i++) acc += S[i * dv + j] * q[t * dk + i];
      o[t * dv + j] = acc;
    }
  }
}

static double max_err(const float *a, const double *b, int n, double *scale) {
  double e = 0, s = 0;
  for (int i = 0; i < n; i++) { e = fmax(e, fabs(a[i] - b[i])); s = fmax(s, fabs(b[i])); }
  *scale = s;
  return e;
}

static void run_case(int T, int dk, int dv, int chunk, int split, uint64_t seed) {
  trng r = {seed};
  float *q = xmalloc(T * dk * 4), *k = xmalloc(T * dk * 4), *v = xmalloc(T * dv * 4), *g = xmalloc(T * dk * 4), *b = xmalloc(T * 4);
  for (int t = 0; t < T; t++) {
    for (int i = 0; i < dk; i++) {
      q[t * dk + i] = (float)trng_normal(&r);
      k[t * dk + i] = (float)trng_normal(&r);
      g[t * dk + i] = (float)(-5.0 / (1 + exp(-trng_normal(&r) * 2))); /* in (-5, 0) like the model */
    }
    l2norm(q + t * dk, dk, 1e-6f);
    l2norm(k + t * dk, dk, 1e-6f);
    for (int i = 0; i < dk; i++) q[t * dk + i] /= sqrtf((float)dk);
    for (int j = 0; j < dv; j++) v[t * dv + j] = (float)trng_normal(&r);
    b[t] = (float)(1 / (1 + exp(-trng_normal(&r))));
  }
  double *S = xcalloc(dk * dv, 8), *o = xcalloc(T * dv, 8);
  ref_kda(T, dk, dv, q, k, v, g, b, S, o);
  float *Sc = xcalloc(dk * dv, 4), *oc = xcalloc(T * dv, 4), *Ss = xcalloc(dk * dv, 4), *os = xcalloc(T * dv, 4);
  /* chunked: first `split` tokens in one call, the rest in another (state carried) */
  kda_chunked(Sc, split, chunk, q, k, v, g, b, dk, dv, oc);
  kda_chunked(Sc, T - split, chunk, q + split * dk, k + split * dk, v + split * dv, g + split * dk, b + split, dk, dv, oc + split * dv);
  for (int t = 0; t < T; t++) kda_step(Ss, q + t * dk, k + t * dk, v + t * dv, g + t * dk, b[t], dk, dv, os + t * dv);
  double sc, ss;
  double ec = max_err(oc, o, T * dv, &sc), es = max_err(os, o, T * dv, &ss);
  CHECK(ec <= 2e-5 * sc, "chunked T=%d chunk=%d split=%d: err %g scale %g", T, chunk, split, ec, sc);
  CHECK(es <= 2e-5 * sc, "recurrent T=%d: err %g scale %g", T, es, sc);
  double eS = max_err(Sc, S, dk * dv, &ss), eS2 = max_err(Ss, S, dk * dv, &sc);
  CHECK(eS <= 2e-5 * ss && eS2 <= 2e-5 * ss, "final state err chunked %g recurrent %g (scale %g)", eS, eS2, ss);
  free(q); free(k); free(v); free(g); free(b); free(S); free(o); free(Sc); free(oc); free(Ss); free(os);
}

int main(void) {
  run_case(1, 8, 8, 64, 0, 1);
  run_case(5, 16, 8, 64, 2, 2);
  run_case(130, 16, 16, 64, 64, 3);
  run_case(130, 16, 16, 64, 37, 4);
  run_case(100, 32, 24, 16, 50, 5);
  run_case(300, 16, 16, 64, 1, 6);
  run_case(70, 8, 8, 1, 35, 7);
  TEST_DONE();
}

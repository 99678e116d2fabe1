/* Minimal test harness: CHECK records failures and keeps going; TEST_MAIN
 * ends with the line "N passed, N failed" that CI understands. */
#ifndef GLM53_TEST_UTIL_H
#define GLM53_TEST_UTIL_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int t_pass, t_fail;
#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    if (cond) t_pass++;                                                   \
    else {                                                                \
      t_fail++;                                                           \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
      fprintf(stderr, " " __VA_ARGS__);                                   \
      fputc('\n', stderr);                                                \
    }                                                                     \
  } while (0)
#define CHECK_NEAR(a, b, tol, ...) CHECK(fabs((double)(a) - (double)(b)) <= (tol), __VA_ARGS__)
#define TEST_DONE()                                                     \
  do {                                                                  \
    printf("%d passed, %d failed\n", t_pass, t_fail);                   \
    return t_fail ? 1 : 0;                                              \
  } while (0)

/* Logit comparison used by every model test: the worst over rows of
 * max|got - ref| / max|ref| (per row; NaN counts as an infinite difference). */
static inline double rows_rel_diff(const float *ref, const float *got, int rows, int V) {
  double worst = 0;
  for (int r = 0; r < rows; r++) {
    double mx = 0, d = 0;
    for (int v = 0; v < V; v++) {
      double e = fabs((double)ref[(size_t)r * V + v] - got[(size_t)r * V + v]);
      mx = fmax(mx, fabs(ref[(size_t)r * V + v]));
      d = isnan(e) ? INFINITY : fmax(d, e);
    }
    worst = fmax(worst, d / fmax(mx, 1e-30));
  }
  return worst;
}

/* Deterministic random numbers for tests (xorshift64*), fresh per seed. */
typedef struct { uint64_t s; } trng;
static inline uint64_t trng_u64(trng *r) {
  r->s ^= r->s >> 12; r->s ^= r->s << 25; r->s ^= r->s >> 27;
  return r->s * 2685821657736338717ull;
}
static inline double trng_unif(trng *r) { return (trng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }
static inline double trng_normal(trng *r) {
  double u1 = trng_unif(r) + 1e-300, u2 = trng_unif(r);
  return sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2);
}
#endif

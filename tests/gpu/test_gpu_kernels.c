/* Each GPU kernel against the fp32 CPU reference on random non-zero data
 * (three seeds); the tolerances are those of the startup validation and are
 * printed with every check (fp32 kernels 1e-5..1e-4 relative to the largest
 * reference value; the cuBLAS path of bf16/q8/q4 weights, which rounds the
 * activations to bf16, 2e-2; selections exact). Then the decode GEMV in
 * depth: every format (Q4 groups 32/64/128 with bf16 and f16 scales, Q4/Q8
 * groups below the 16-byte chunk, Q8, bf16, f32), odd row counts, columns
 * not a multiple of 256, n = 1..9 and 33, x rows not 16-byte aligned, a
 * misaligned weight base: against wmat_matmul (1e-5 relative) and each
 * token bitwise equal to its n = 1 result; the routed-expert launch with
 * pairs routed to -1 (zeros), against the reference and per-expert launches
 * (bitwise); the previous kernels (versions 1, 2) still within tolerance.
 * No device: SKIP. */
#include "gpu_test.h"
#include "gpu/kernels/gk.h"
#include "model/wmat.h"
#include "core/util.h"
#include "test_util.h"
#include <string.h>

static uint64_t g_s = 88172645463325252ull;
static uint64_t rnd(void) {
  g_s ^= g_s << 13; g_s ^= g_s >> 7; g_s ^= g_s << 17;
  return g_s;
}
static float rf(void) { return (float)((rnd() >> 11) * (2.0 / 9007199254740992.0) - 1.0); }

typedef struct { wmat w; gpu_mat g; void *d; } tmat;
/* host + device matrix; `shift` bytes added to the device base (misaligned) */
static void tmat_new(tmat *m, int fmt, int rows, int cols, int group, int sbf16, int shift) {
  memset(m, 0, sizeof *m);
  wmat *w = &m->w;
  w->fmt = fmt; w->rows = rows; w->cols = cols; w->group = group; w->scale_bf16 = sbf16;
  size_t n = (size_t)rows * cols;
  size_t nb = fmt == WMAT_F32 ? n * 4 : fmt == WMAT_BF16 ? n * 2 : fmt == WMAT_Q8 ? n : n / 2;
  size_t ns = fmt >= WMAT_Q8 ? n / group : 0;
  uint8_t *d = xmalloc(nb + ns * 2 + 4);
  if (fmt == WMAT_F32) for (size_t i = 0; i < n; i++) ((float *)d)[i] = rf();
  else if (fmt == WMAT_BF16) for (size_t i = 0; i < n; i++) ((uint16_t *)d)[i] = f32_to_bf16(rf());
  else for (size_t i = 0; i < nb; i++) d[i] = (uint8_t)rnd();
  if (fmt == WMAT_Q8) for (size_t i = 0; i < nb; i++) if (d[i] == 0x80) d[i] = 0x81; /* the writer's range -127..127 */
  uint16_t *s = (uint16_t *)(d + nb);
  for (size_t i = 0; i < ns; i++) {
    float v = 0.01f + 0.02f * (rf() + 1.0f);
    s[i] = sbf16 ? f32_to_bf16(v) : f32_to_f16(v);
  }
  w->data = d; w->scales = ns ? s : NULL; w->owned = d;
  char *dd = gk_malloc(nb + 16);
  gk_h2d(dd + shift, d, nb);
  m->d = dd;
  m->g = (gpu_mat){.fmt = fmt, .rows = rows, .cols = cols, .group = group, .scale_bf16 = sbf16, .d = dd + shift};
  if (ns) {
    void *ds = gk_malloc(ns * 2);
    gk_h2d(ds, s, ns * 2);
    m->g.s = ds;
  }
}
static void tmat_free(tmat *m) {
  gk_free(m->d);
  gk_free((void *)m->g.s);
  wmat_free(&m->w);
}
static double rel(const float *g, const float *ref, size_t n) {
  double mx = 0, d = 0;
  for (size_t i = 0; i < n; i++) {
    mx = fmax(mx, fabs(ref[i]));
    double e = fabs((double)g[i] - ref[i]);
    d = isnan(g[i]) ? INFINITY : fmax(d, e);
  }
  return d / fmax(mx, 1e-30);
}
static const char *fname(int fmt) { return fmt == WMAT_F32 ? "f32" : fmt == WMAT_BF16 ? "bf16" : fmt == WMAT_Q8 ? "q8" : "q4"; }

/* gk_matmul (GEMV forced) on tokens 0..n-1 for n in ns[]: reference within
 * 1e-5, and bitwise equal per token to n = 1 */
static void gemv_case(int fmt, int rows, int cols, int group, int sbf16, int shift, int ver) {
  enum { NMAX = 33 };
  static const int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 33};
  tmat m;
  tmat_new(&m, fmt, rows, cols, group, sbf16, shift);
  const int ldxu = cols + 1; /* an x whose rows are not 16-byte aligned */
  float *x = xmalloc((size_t)NMAX * cols * 4), *xu = xmalloc((size_t)NMAX * ldxu * 4);
  for (size_t i = 0; i < (size_t)NMAX * cols; i++) x[i] = rf();
  for (int t = 0; t < NMAX; t++) memcpy(xu + (size_t)t * ldxu, x + (size_t)t * cols, (size_t)cols * 4);
  float *ref = xmalloc((size_t)NMAX * rows * 4), *one = xmalloc((size_t)NMAX * rows * 4), *got = xmalloc((size_t)NMAX * rows * 4);
  wmat_matmul(&m.w, x, NMAX, ref);
  float *dx = gk_malloc((size_t)NMAX * cols * 4), *dxu = gk_malloc((size_t)NMAX * ldxu * 4), *dy = gk_malloc((size_t)NMAX * rows * 4);
  gk_h2d(dx, x, (size_t)NMAX * cols * 4);
  gk_h2d(dxu, xu, (size_t)NMAX * ldxu * 4);
  gk_set_gemv_version(ver);
  int rc = 0;
  for (int t = 0; t < NMAX; t++) {
    rc |= gk_matmul(&m.g, dx + (size_t)t * cols, 1, cols, dy + (size_t)t * rows, rows);
  }
  rc |= gk_d2h(one, dy, (size_t)NMAX * rows * 4);
  double worst = rel(one, ref, (size_t)NMAX * rows);
  int bits = 1;
  for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
    const int n = ns[i];
    rc |= gk_matmul(&m.g, (i & 1) ? dxu : dx, n, (i & 1) ? ldxu : cols, dy, rows);
    rc |= gk_d2h(got, dy, (size_t)n * rows * 4);
    worst = fmax(worst, rel(got, ref, (size_t)n * rows));
    bits &= !memcmp(got, one, (size_t)n * rows * 4);
  }
  gk_set_gemv_version(0);
  char nm[96];
  snprintf(nm, sizeof nm, "v%d %s g%d %s %dx%d%s", ver ? ver : 3, fname(fmt), fmt >= WMAT_Q8 ? group : 0,
           fmt >= WMAT_Q8 ? (sbf16 ? "bf16" : "f16") : "-", rows, cols, shift ? " misaligned" : "");
  CHECK(rc == 0, "%s: %s", nm, gk_error());
  CHECK(worst <= 1e-5, "%s: err %g", nm, worst);
  CHECK(bits, "%s: a token's result depends on n or on x's alignment", nm);
  printf("gemv %-40s err %.2g, bits independent of n: %s\n", nm, worst, bits ? "yes" : "NO");
  gk_free(dx); gk_free(dxu); gk_free(dy);
  free(x); free(xu); free(ref); free(one); free(got);
  tmat_free(&m);
}

/* routed experts: T tokens x k slots, some pairs routed to -1 */
static void experts_case(int fmt, int group, int sbf16, int rows, int cols, int xpt) {
  enum { E = 5, K = 3, T = 3, P = T * K };
  tmat m[E];
  gpu_mat h[E * 3];
  memset(h, 0, sizeof h);
  for (int e = 0; e < E; e++) {
    tmat_new(&m[e], fmt, rows, cols, group, sbf16, 0);
    h[e * 3 + 1] = m[e].g; /* "up" slot: which = 1 */
  }
  const int idx[P] = {4, 0, -1, 2, 4, 1, -1, -1, 3};
  const int nx = xpt ? T : P;
  float *x = xmalloc((size_t)nx * cols * 4), *ref = xmalloc((size_t)P * rows * 4), *got = xmalloc((size_t)P * rows * 4);
  float *got2 = xmalloc((size_t)P * rows * 4);
  for (size_t i = 0; i < (size_t)nx * cols; i++) x[i] = rf();
  for (int p = 0; p < P; p++) {
    if (idx[p] < 0) memset(ref + (size_t)p * rows, 0, (size_t)rows * 4);
    else wmat_matmul(&m[idx[p]].w, x + (size_t)(xpt ? p / K : p) * cols, 1, ref + (size_t)p * rows);
  }
  gpu_mat *dset = gk_malloc(sizeof h);
  int *didx = gk_malloc(sizeof idx);
  float *dx = gk_malloc((size_t)nx * cols * 4), *dy = gk_malloc((size_t)P * rows * 4);
  gk_h2d(dset, h, sizeof h);
  gk_h2d(didx, idx, sizeof idx);
  gk_h2d(dx, x, (size_t)nx * cols * 4);
  gk_memset(dy, 0x7f, (size_t)P * rows * 4);
  int rc = gk_matmul_experts(dset, 1, fmt, rows, cols, didx, P, K, xpt, dx, cols, dy, rows);
  rc |= gk_d2h(got, dy, (size_t)P * rows * 4);
  gk_memset(dy, 0x7f, (size_t)P * rows * 4);
  for (int e = 0; e < E; e++) rc |= gk_matmul_expert_only(dset, 1, fmt, rows, cols, didx, P, K, xpt, dx, cols, dy, rows, e);
  rc |= gk_d2h(got2, dy, (size_t)P * rows * 4);
  double err = rel(got, ref, (size_t)P * rows);
  int zeros = 1;
  for (int p = 0; p < P; p++)
    if (idx[p] < 0)
      for (int r = 0; r < rows; r++) zeros &= got[(size_t)p * rows + r] == 0.f && got2[(size_t)p * rows + r] == 0.f;
  int same = !memcmp(got, got2, (size_t)P * rows * 4);
  char nm[80];
  snprintf(nm, sizeof nm, "experts %s g%d %dx%d x_per_token=%d", fname(fmt), fmt >= WMAT_Q8 ? group : 0, rows, cols, xpt);
  CHECK(rc == 0, "%s: %s", nm, gk_error());
  CHECK(err <= 1e-5, "%s: err %g", nm, err);
  CHECK(zeros, "%s: pairs routed to -1 not zero", nm);
  CHECK(same, "%s: per-expert launches differ from the all-pairs launch", nm);
  printf("gemv %-40s err %.2g, -1 pairs zero: %s, per-expert launches bitwise: %s\n", nm, err, zeros ? "yes" : "NO",
         same ? "yes" : "NO");
  gk_free(dset); gk_free(didx); gk_free(dx); gk_free(dy);
  free(x); free(ref); free(got); free(got2);
  for (int e = 0; e < E; e++) tmat_free(&m[e]);
}

int main(void) {
  if (gpu_test_skip()) return 0;
  for (uint64_t seed = 1; seed <= 3; seed++) {
    gpu_check chk[64];
    int n = glm53_gpu_selftest(seed, chk, 64);
    CHECK(n > 0, "selftest seed %llu failed to run", (unsigned long long)seed);
    for (int i = 0; i < n; i++) {
      if (seed == 1 || !chk[i].ok)
        printf("seed %llu  %-40s err %-10.3g tol %-8.3g %s\n", (unsigned long long)seed, chk[i].name, chk[i].err, chk[i].tol,
               chk[i].ok ? "ok" : "FAIL");
      CHECK(chk[i].ok, "%s: %g > %g", chk[i].name, chk[i].err, chk[i].tol);
    }
  }

  gk_set_gemm_min(1 << 30); /* the GEMV for every n */
  /* f32 / bf16: odd rows, cols not a multiple of 256 (nor of the chunk) */
  gemv_case(WMAT_F32, 37, 2060, 0, 1, 0, 0);
  gemv_case(WMAT_F32, 24, 16384, 0, 1, 0, 0);   /* mHC-like: split over blocks */
  gemv_case(WMAT_F32, 5, 66, 0, 1, 0, 0);       /* cols % 4 != 0: per-element path */
  gemv_case(WMAT_BF16, 37, 2056, 0, 1, 0, 0);
  gemv_case(WMAT_BF16, 301, 4104, 0, 1, 0, 0);
  gemv_case(WMAT_BF16, 70, 100, 0, 1, 0, 0);    /* cols % 8 != 0 */
  gemv_case(WMAT_BF16, 37, 2056, 0, 1, 2, 0);   /* misaligned base: per-element path */
  /* Q4: groups 32/64/128, bf16 and f16 scales; groups below the chunk */
  static const int q4[][2] = {{32, 1}, {32, 0}, {64, 1}, {64, 0}, {128, 1}, {128, 0}, {16, 1}, {8, 0}, {96, 1}};
  for (size_t i = 0; i < sizeof q4 / sizeof *q4; i++) {
    const int g = q4[i][0], cols = g == 96 ? 96 * 27 : g * (g >= 64 ? 33 : 129);
    gemv_case(WMAT_Q4, 37, cols, g, q4[i][1], 0, 0);
  }
  gemv_case(WMAT_Q4, 301, 4096, 32, 1, 0, 0);
  gemv_case(WMAT_Q4, 3, 8192, 32, 0, 0, 0);     /* few rows: split over blocks */
  static const int q8[][2] = {{32, 1}, {32, 0}, {64, 0}, {128, 1}, {16, 1}, {8, 1}};
  for (size_t i = 0; i < sizeof q8 / sizeof *q8; i++) gemv_case(WMAT_Q8, 37, q8[i][0] * 65, q8[i][0], q8[i][1], 0, 0);
  gemv_case(WMAT_Q8, 130, 4096, 32, 1, 0, 0);
  /* the earlier kernels, still selectable */
  for (int v = 1; v <= 2; v++) {
    gemv_case(WMAT_BF16, 37, 2056, 0, 1, 0, v);
    gemv_case(WMAT_Q4, 37, 4128, 32, 1, 0, v);
    gemv_case(WMAT_Q8, 37, 2080, 32, 0, 0, v);
  }
  gk_set_gemm_min(0);
  /* routed-expert pair launches */
  experts_case(WMAT_BF16, 0, 1, 70, 4096, 1);
  experts_case(WMAT_BF16, 0, 1, 300, 520, 0);
  experts_case(WMAT_Q4, 32, 1, 70, 4096, 1);
  experts_case(WMAT_Q4, 128, 0, 300, 2048, 0);
  experts_case(WMAT_Q4, 16, 1, 33, 1024, 1);
  experts_case(WMAT_Q8, 32, 1, 70, 4096, 1);
  experts_case(WMAT_Q8, 64, 0, 300, 2048, 0);
  experts_case(WMAT_F32, 0, 1, 40, 1000, 1);
  TEST_DONE();
}

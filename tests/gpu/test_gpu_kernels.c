/* Each GPU kernel against the fp32 CPU reference on random non-zero data
 * (three seeds); the tolerances are those of the startup validation and are
 * printed with every check (fp32 kernels 1e-5..1e-4 relative to the largest
 * reference value; the cuBLAS path of bf16/q8/q4 weights, which rounds the
 * activations to bf16, 2e-2; selections exact). Then the decode GEMV in
 * depth: every format (Q4 groups 32/64/128 with bf16 and f16 scales, Q4/Q8
 * groups below the 16-byte chunk, Q8, bf16, f32), odd row counts, columns
 * not a multiple of 256, n = 1..9 and 33, x rows not 16-byte aligned, a
 * misaligned weight base: against wmat_matmul (1e-5 relative) and each
 * token bitwise equal to its n = 1 result, to the unpipelined v4 and
 * without x staging; the routed-expert launch with
 * pairs routed to -1 (zeros), against the reference and per-expert launches
 * (bitwise); the previous kernels (versions 1, 2) still within tolerance.
 * The fused launches, each bitwise equal to the kernels it replaces, with
 * programmatic dependent launch on and off: multi-product GEMV (formats,
 * own x, fused gate+up), routed experts grouped per expert (every group
 * width, -1 pairs), the KDA recurrence with its gate, the mHC post with the
 * MoE combine (also reading the outputs through erow).
 * The long-chunk (cuBLAS) forms: per-head products as one strided-batched
 * GEMM and per head (1e-4 vs float64 on bf16-rounded x); the expert sort
 * (exactly the stable host order, up to 32768 pairs x 288 experts); the
 * expert GEMMs over sorted, bucket-padded pairs for bf16, Q4 and Q8 (2e-3
 * vs float64 with the bf16 roundings of the GEMM form); the MLA GEMM form
 * over cache prefixes and gathered selections up to 4404 rows, fp32 and
 * bf16x9-emulated fp32 (1e-5) and TF32 (3e-3) against float64; the MLA
 * flash kernel's two wgmma product forms alone (1e-5 vs float64, where the
 * device has wgmma) and the per-head form through each fused kernel
 * (wgmma with 64 keys per tile and with 32 in two stages, mma.sync with 32
 * and 64 keys per tile) and its batched GEMMs.
 * No device: SKIP. */
#include "gpu_test.h"
#include "gpu/kernels/gk.h"
#include "gpu/gpu_internal.h"
#include "model/wmat.h"
#include "model/layers.h"
#include "model/ops.h"
#include "model/model.h"
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
  if (ver == 0) { /* v4 (unpipelined loads) and x read from global memory (no staging) give the same bits */
    gk_set_gemv_version(4);
    rc |= gk_matmul(&m.g, dx, NMAX, cols, dy, rows);
    rc |= gk_d2h(got, dy, (size_t)NMAX * rows * 4);
    bits &= !memcmp(got, one, (size_t)NMAX * rows * 4);
    gk_set_gemv_version(0);
    gk_set_gemv_xs(0);
    for (int n = 1; n <= 2; n++) {
      rc |= gk_matmul(&m.g, dx, n, cols, dy, rows);
      rc |= gk_d2h(got, dy, (size_t)n * rows * 4);
      bits &= !memcmp(got, one, (size_t)n * rows * 4);
    }
    gk_set_gemv_xs(2);
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
  gk_set_gemv_xs(0); /* x from global memory: the same bits */
  rc |= gk_matmul_experts(dset, 1, fmt, rows, cols, didx, P, K, xpt, dx, cols, dy, rows);
  rc |= gk_d2h(got2, dy, (size_t)P * rows * 4);
  gk_set_gemv_xs(2);
  same &= !memcmp(got, got2, (size_t)P * rows * 4);
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

/* ---- fused launches: each bitwise equal to the unfused kernels ---- */
/* a device copy of n host bytes */
static void *dcopy(const void *h, size_t n) {
  void *d = gk_malloc(n);
  if (d) gk_h2d(d, h, n);
  return d;
}
/* allocation callback for gpu_pages_make (the test frees what it gets) */
static void *talloc(void *ctx, size_t n) {
  (void)ctx;
  return gk_malloc(n);
}
/* n uniform values in [lo, hi] on the device (and on the host if asked) */
static float *dvec(size_t n, float lo, float hi, float **host) {
  float *h = xmalloc(n * 4);
  for (size_t i = 0; i < n; i++) h[i] = lo + (hi - lo) * 0.5f * (rf() + 1.0f);
  float *d = dcopy(h, n * 4);
  if (host) *host = h;
  else free(h);
  return d;
}
static int dsame(const float *a, const float *b, size_t n) {
  float *x = xmalloc(n * 4), *y = xmalloc(n * 4);
  int ok = !gk_d2h(x, a, n * 4) && !gk_d2h(y, b, n * 4) && !memcmp(x, y, n * 4);
  free(x); free(y);
  return ok;
}

/* gk_matmul_multi (7 Q4 products: two launches; other formats; a product
 * with its own x; a fused gate+up entry) and gk_gate_up against separate
 * gk_matmul / gk_swiglu, n = 1..9 */
static void multi_case(int NMIN, int NMAX) {
  enum { NP = 12, D = 4096 };
  static const int spec[NP][3] = {{WMAT_Q4, 301, 32}, {WMAT_Q4, 37, 32}, {WMAT_Q4, 3, 64}, {WMAT_Q4, 64, 32},
                                  {WMAT_Q4, 9, 128},  {WMAT_Q4, 130, 32}, {WMAT_Q4, 1, 32}, {WMAT_BF16, 70, 0},
                                  {WMAT_F32, 24, 0},  {WMAT_Q8, 130, 32}, {WMAT_BF16, 5, 0}, {WMAT_Q4, 96, 32}};
  tmat m[NP + 1], own;
  for (int i = 0; i < NP; i++) tmat_new(&m[i], spec[i][0], spec[i][1], D, spec[i][2], i & 1, 0);
  tmat_new(&m[NP], WMAT_Q4, 96, D, 32, 1, 0); /* the up matrix of the fused entry (gate = m[NP-1]) */
  tmat_new(&own, WMAT_Q8, 33, 1000, 8, 0, 0);
  float *dx = dvec((size_t)NMAX * D, -1, 1, NULL), *dxo = dvec((size_t)NMAX * 1001, -1, 1, NULL);
  float *y1[NP + 1], *y2[NP + 1], *du = gk_malloc((size_t)NMAX * 96 * 4);
  for (int i = 0; i <= NP; i++) {
    const int rows = i == NP ? 33 : m[i].g.rows;
    y1[i] = gk_malloc((size_t)NMAX * (rows + 3) * 4);
    y2[i] = gk_malloc((size_t)NMAX * (rows + 3) * 4);
  }
  int rc = 0, bits = 1;
  for (int n = NMIN; n <= NMAX; n += n < 9 ? 1 : 24) {
    gk_prod p[NP + 1];
    for (int i = 0; i < NP; i++) {
      p[i] = (gk_prod){.W = &m[i].g, .y = y1[i], .ldy = m[i].g.rows + (i == NP - 1 ? 0 : 3)};
      rc |= gk_memset(y1[i], 0x7f, (size_t)NMAX * (m[i].g.rows + 3) * 4);
    }
    p[NP - 1].W2 = &m[NP].g;
    p[NP - 1].u = du;
    p[NP - 1].limit = 1.5f;
    p[NP] = (gk_prod){.W = &own.g, .y = y1[NP], .ldy = 33, .x = dxo, .ldx = 1001};
    rc |= gk_matmul_multi(p, NP + 1, dx, n, D);
    for (int i = 0; i < NP - 1; i++) rc |= gk_matmul(&m[i].g, dx, n, D, y2[i], m[i].g.rows + 3);
    rc |= gk_gate_up(&m[NP - 1].g, &m[NP].g, dx, n, D, y2[NP - 1], du, 1.5f);
    rc |= gk_matmul(&own.g, dxo, n, 1001, y2[NP], 33);
    for (int i = 0; i <= NP; i++) {
      const int rows = i == NP ? 33 : m[i].g.rows, ld = i >= NP - 1 ? rows : rows + 3;
      float *a = xmalloc((size_t)n * ld * 4), *b = xmalloc((size_t)n * ld * 4);
      rc |= gk_d2h(a, y1[i], (size_t)n * ld * 4) || gk_d2h(b, y2[i], (size_t)n * ld * 4);
      for (int t = 0; t < n; t++) bits &= !memcmp(a + (size_t)t * ld, b + (size_t)t * ld, (size_t)rows * 4);
      free(a); free(b);
    }
    /* the fused launch against the unfused kernels */
    float *dg = gk_malloc((size_t)n * 96 * 4);
    rc |= gk_matmul(&m[NP - 1].g, dx, n, D, dg, 96) || gk_matmul(&m[NP].g, dx, n, D, du, 96) ||
          gk_swiglu(dg, du, (size_t)n * 96, 1.5f);
    bits &= dsame(dg, y2[NP - 1], (size_t)n * 96);
    gk_free(dg);
  }
  CHECK(rc == 0, "multi-product launch: %s", gk_error());
  CHECK(bits, "multi-product / fused gate+up launches differ from the separate products");
  printf("%s multi-product launch (13 products, 4 formats, own x, fused gate+up), n=%d..%d: bitwise %s\n",
         NMIN >= gk_gemm_min() ? "cuBLAS (one bf16 conversion of the shared x)" : "gemv", NMIN, NMAX, bits ? "yes" : "NO");
  for (int i = 0; i <= NP; i++) { gk_free(y1[i]); gk_free(y2[i]); tmat_free(&m[i]); }
  tmat_free(&own);
  gk_free(dx); gk_free(dxo); gk_free(du);
}

/* gk_matmul_multi's merged GEMM (cuBLAS path): three bf16 matrices stored
 * one after another, writing adjacent column ranges of one output row
 * (the KDA q | k | v), then a fourth whose output is elsewhere (not
 * merged), against one gk_matmul each: 1e-5 of the largest output (fp32
 * accumulation of the same bf16 products in another order), and the merge
 * must have run (gk_gemm_merged) */
static void merge_case(void) {
  enum { C = 200, LD = 171, T = 37 };
  static const int R[4] = {48, 64, 40, 24};
  size_t tot = 0;
  for (int i = 0; i < 4; i++) tot += (size_t)R[i] * C;
  uint16_t *hw = xmalloc(tot * 2);
  for (size_t i = 0; i < tot; i++) hw[i] = f32_to_bf16(rf());
  char *dw = dcopy(hw, tot * 2);
  float *dx = dvec((size_t)T * C, -1, 1, NULL), *y1 = gk_malloc((size_t)T * LD * 4), *y2 = gk_malloc((size_t)T * LD * 4);
  float *o1 = gk_malloc((size_t)T * R[3] * 4), *o2 = gk_malloc((size_t)T * R[3] * 4);
  gpu_mat m[4];
  gk_prod p[4];
  size_t off = 0;
  int col = 0;
  for (int i = 0; i < 4; i++) {
    m[i] = (gpu_mat){.fmt = WMAT_BF16, .rows = R[i], .cols = C, .d = dw + off * 2};
    p[i] = i < 3 ? (gk_prod){.W = &m[i], .y = y1 + col, .ldy = LD} : (gk_prod){.W = &m[i], .y = o1, .ldy = R[3]};
    off += (size_t)R[i] * C;
    col += R[i];
  }
  const unsigned before = gk_gemm_merged();
  gk_set_gemm_merge(1); /* opt-in */
  int rc = gk_memset(y1, 0, (size_t)T * LD * 4) || gk_memset(y2, 0, (size_t)T * LD * 4) || gk_matmul_multi(p, 4, dx, T, C);
  gk_set_gemm_merge(-1);
  const unsigned merged = gk_gemm_merged() - before;
  col = 0;
  for (int i = 0; i < 3; i++) {
    rc |= gk_matmul(&m[i], dx, T, C, y2 + col, LD);
    col += R[i];
  }
  rc |= gk_matmul(&m[3], dx, T, C, o2, R[3]);
  float *a = xmalloc((size_t)T * LD * 4), *b = xmalloc((size_t)T * LD * 4);
  rc |= gk_d2h(a, y1, (size_t)T * LD * 4) || gk_d2h(b, y2, (size_t)T * LD * 4);
  const double e = rc ? INFINITY : rel(a, b, (size_t)T * LD);
  const int same4 = !rc && dsame(o1, o2, (size_t)T * R[3]);
  CHECK(rc == 0, "merged multi-product GEMM: %s", gk_error());
  CHECK(e <= 1e-5, "merged multi-product GEMM differs from the separate products by %g (tol 1e-5)", e);
  CHECK(merged == 3, "merged multi-product GEMM: %u products merged, want 3", merged);
  CHECK(same4, "the product after the merged run differs from its gk_matmul");
  printf("multi-product, 3 adjacent bf16 products as one GEMM (T %d): %u merged, vs separate %.3g (tol 1e-5); "
         "the fourth bitwise %s\n", T, merged, e, same4 ? "yes" : "NO");
  free(hw); free(a); free(b);
  gk_free(dw); gk_free(dx); gk_free(y1); gk_free(y2); gk_free(o1); gk_free(o2);
}

/* The bf16 hand-offs of long chunks, bitwise against the fp32 paths they
 * replace: gk_matmul_xb16 of x rounded to bf16 on the host against
 * gk_matmul's own conversion on the cuBLAS path (8 per thread: contiguous
 * rows; 4: rows apart; 1: cols % 4 != 0); gk_mlp against gk_gate_up +
 * gk_matmul; gk_kda_out into bf16 against the host rounding of its
 * in-place output */
static void xb16_case(void) {
  enum { T = 37, R = 48, I = 96, D = 256, H = 3, HD = 64 };
  static const int shp[3][2] = {{256, 256}, {256, 260}, {254, 255}}; /* cols, ldx */
  for (int v = 0; v < 3; v++) {
    const int cols = shp[v][0], ldx = shp[v][1];
    tmat m;
    tmat_new(&m, WMAT_BF16, R, cols, 0, 0, 0);
    float *hx = NULL, *dx = dvec((size_t)T * ldx, -3, 3, &hx);
    uint16_t *h16 = xmalloc((size_t)T * cols * 2);
    for (int t = 0; t < T; t++)
      for (int c = 0; c < cols; c++) h16[(size_t)t * cols + c] = f32_to_bf16(hx[(size_t)t * ldx + c]);
    uint16_t *d16 = dcopy(h16, (size_t)T * cols * 2);
    float *y1 = gk_malloc((size_t)T * R * 4), *y2 = gk_malloc((size_t)T * R * 4);
    const int rc = !gk_xb16_ok(&m.g, T) || gk_matmul(&m.g, dx, T, ldx, y1, R) || gk_matmul_xb16(&m.g, d16, T, y2, R);
    const int bits = !rc && dsame(y1, y2, (size_t)T * R);
    CHECK(rc == 0, "matmul from bf16 x (cols %d, ldx %d): %s", cols, ldx, gk_error());
    CHECK(bits, "matmul from x rounded on the host differs from the cuBLAS path's conversion (cols %d, ldx %d)", cols, ldx);
    printf("cuBLAS path, x converted on the device (cols %d, ldx %d) vs rounded on the host: bitwise %s\n", cols, ldx,
           bits ? "yes" : "NO");
    if (ldx == cols) { /* gk_xb_alias: products of x read the registered rows (zeros here: so the result shows it), not after a clear */
      uint16_t *z16 = gk_malloc((size_t)T * cols * 2);
      float *hy = xmalloc((size_t)T * R * 4);
      int ra = gk_memset(z16, 0, (size_t)T * cols * 2);
      gk_xb_alias(dx, T, cols, z16);
      ra = ra || gk_matmul(&m.g, dx, T, ldx, y2, R) || gk_d2h(hy, y2, (size_t)T * R * 4);
      int zero = !ra;
      for (size_t i = 0; i < (size_t)T * R && zero; i++) zero = hy[i] == 0.f;
      gk_xb_alias(NULL, 0, 0, NULL);
      ra = ra || gk_matmul(&m.g, dx, T, ldx, y2, R);
      const int back = !ra && dsame(y1, y2, (size_t)T * R);
      CHECK(!ra && zero && back, "gk_xb_alias (cols %d): registered rows %s, after the clear %s", cols, zero ? "read" : "NOT read",
            back ? "converted again" : "NOT the conversion's result");
      printf("gk_xb_alias (cols %d): registered bf16 rows read: %s; after the clear x converted again: %s\n", cols,
             zero ? "yes" : "NO", back ? "yes" : "NO");
      gk_free(z16);
      free(hy);
    }
    tmat_free(&m);
    free(hx); free(h16);
    gk_free(dx); gk_free(d16); gk_free(y1); gk_free(y2);
  }
  {
    tmat g, u, d;
    tmat_new(&g, WMAT_BF16, I, D, 0, 0, 0);
    tmat_new(&u, WMAT_BF16, I, D, 0, 0, 0);
    tmat_new(&d, WMAT_BF16, D, I, 0, 0, 0);
    float *dx = dvec((size_t)T * D, -1, 1, NULL), *g1 = gk_malloc((size_t)T * I * 4), *u1 = gk_malloc((size_t)T * I * 4);
    float *g2 = gk_malloc((size_t)T * I * 4), *u2 = gk_malloc((size_t)T * I * 4);
    float *o1 = gk_malloc((size_t)T * D * 4), *o2 = gk_malloc((size_t)T * D * 4);
    const int rc = gk_gate_up(&g.g, &u.g, dx, T, D, g1, u1, 1.5f) || gk_matmul(&d.g, g1, T, I, o1, D) ||
                   gk_mlp(&g.g, &u.g, &d.g, dx, T, D, g2, u2, 1.5f, o2, D);
    const int bits = !rc && dsame(o1, o2, (size_t)T * D);
    CHECK(rc == 0, "gk_mlp: %s", gk_error());
    CHECK(bits, "gk_mlp differs from gk_gate_up + gk_matmul");
    printf("gk_mlp (SwiGLU straight to bf16) vs gate+up then down (T %d): bitwise %s\n", T, bits ? "yes" : "NO");
    tmat_free(&g); tmat_free(&u); tmat_free(&d);
    gk_free(dx); gk_free(g1); gk_free(u1); gk_free(g2); gk_free(u2); gk_free(o1); gk_free(o2);
  }
  {
    const size_t n = (size_t)T * H * HD;
    float *ho = NULL, *o1 = dvec(n, -2, 2, &ho), *o2 = dcopy(ho, n * 4), *z = dvec(n, -3, 3, NULL), *w = dvec(HD, 0.5f, 1.5f, NULL);
    uint16_t *ob = gk_malloc(n * 2), *hb = xmalloc(n * 2);
    float *got = xmalloc(n * 4);
    const int rc = gk_kda_out(o1, z, w, T, H, HD, 1e-6f, NULL) || gk_kda_out(o2, z, w, T, H, HD, 1e-6f, ob) ||
                   gk_d2h(got, o1, n * 4) || gk_d2h(hb, ob, n * 2);
    int bits = !rc;
    for (size_t i = 0; i < n && bits; i++) bits = hb[i] == f32_to_bf16(got[i]);
    CHECK(rc == 0, "kda out to bf16: %s", gk_error());
    CHECK(bits, "kda out into bf16 differs from the rounding of its in-place output");
    printf("kda out into bf16 vs its in-place output rounded: bitwise %s\n", bits ? "yes" : "NO");
    free(ho); free(hb); free(got);
    gk_free(o1); gk_free(o2); gk_free(z); gk_free(w); gk_free(ob);
  }
}

/* gk_expert_group + gk_experts_grouped (gate+up fused, and down) against
 * the per-pair launches, T tokens x K slots over E experts (pairs per
 * expert 1..8, so every group width), some pairs routed to -1; the same
 * launches carrying a shared expert's T tokens (gk_shared_rows) against
 * the per-pair launch over a set of the shared expert alone (k = 1), with
 * the routed outputs unchanged, and the shared rows alone (no pairs) */
static void grouped_case(int fmt, int group, int I, int D) {
  enum { E = 5, K = 3, TMAX = 14 };
  static const int Ts[] = {1, 2, 5, 12, 14};
  tmat m[E * 3], ms[3];
  gpu_mat h[E * 3], hs[3];
  for (int e = 0; e < E; e++)
    for (int w = 0; w < 3; w++) {
      tmat_new(&m[e * 3 + w], fmt, w == 2 ? D : I, w == 2 ? I : D, group, e & 1, 0);
      h[e * 3 + w] = m[e * 3 + w].g;
    }
  for (int w = 0; w < 3; w++) {
    tmat_new(&ms[w], fmt, w == 2 ? D : I, w == 2 ? I : D, group, 1, 0);
    hs[w] = ms[w].g;
  }
  gpu_mat *dset = dcopy(h, sizeof h), *dsh = dcopy(hs, sizeof hs);
  const int PM = TMAX * K;
  float *dx = dvec((size_t)TMAX * D, -1, 1, NULL);
  float *g1 = gk_malloc((size_t)PM * I * 4), *u1 = gk_malloc((size_t)PM * I * 4), *g2 = gk_malloc((size_t)PM * I * 4);
  float *o1 = gk_malloc((size_t)PM * D * 4), *o2 = gk_malloc((size_t)PM * D * 4);
  float *sg1 = gk_malloc((size_t)TMAX * I * 4), *sg2 = gk_malloc((size_t)TMAX * I * 4);
  float *so1 = gk_malloc((size_t)TMAX * D * 4), *so2 = gk_malloc((size_t)TMAX * D * 4), *so3 = gk_malloc((size_t)TMAX * D * 4);
  int *didx = gk_malloc(PM * 4), *grp = gk_malloc(gk_expert_group_ints(PM, E) * 4);
  int rc = 0, bits = 1, sbits = 1;
  for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
    const int T = Ts[ti], np = T * K;
    int idx[14 * 3];
    for (int t = 0; t < T; t++) /* distinct experts per token, or -1 */
      for (int j = 0; j < K; j++) {
        int e;
        do e = (int)(rnd() % (E + 1)) - 1; while (e >= 0 && ((j > 0 && idx[t * K] == e) || (j > 1 && idx[t * K + 1] == e)));
        idx[t * K + j] = e;
      }
    rc |= gk_h2d(didx, idx, np * 4);
    rc |= gk_memset(g2, 0x7f, (size_t)PM * I * 4) || gk_memset(o2, 0x7f, (size_t)PM * D * 4);
    rc |= gk_matmul_experts(dset, 0, fmt, I, D, didx, np, K, 1, dx, D, g1, I) ||
          gk_matmul_experts(dset, 1, fmt, I, D, didx, np, K, 1, dx, D, u1, I) || gk_swiglu(g1, u1, (size_t)np * I, 1.5f) ||
          gk_matmul_experts(dset, 2, fmt, D, I, didx, np, K, 0, g1, I, o1, D);
    rc |= gk_expert_group(didx, np, E, grp) ||
          gk_experts_grouped(dset, 0, 1, 1.5f, fmt, I, D, grp, didx, np, E, K, 1, dx, D, g2, I, u1, NULL) ||
          gk_experts_grouped(dset, 2, 0, 0.f, fmt, D, I, grp, didx, np, E, K, 0, g2, I, o2, D, NULL, NULL);
    bits &= dsame(g1, g2, (size_t)np * I) && dsame(o1, o2, (size_t)np * D);
    /* the shared expert: reference per token, then inside both grouped launches, then alone */
    rc |= gk_matmul_experts(dsh, 0, fmt, I, D, NULL, T, 1, 1, dx, D, sg1, I) ||
          gk_matmul_experts(dsh, 1, fmt, I, D, NULL, T, 1, 1, dx, D, u1, I) || gk_swiglu(sg1, u1, (size_t)T * I, 1.5f) ||
          gk_matmul_experts(dsh, 2, fmt, D, I, NULL, T, 1, 0, sg1, I, so1, D);
    rc |= gk_memset(g2, 0x7f, (size_t)PM * I * 4) || gk_memset(o2, 0x7f, (size_t)PM * D * 4) ||
          gk_memset(sg2, 0x7f, (size_t)TMAX * I * 4) || gk_memset(so2, 0x7f, (size_t)TMAX * D * 4) ||
          gk_memset(so3, 0x7f, (size_t)TMAX * D * 4);
    const gk_shared_rows shgu = {.W = hs[0], .W2 = hs[1], .x = dx, .ldx = D, .y = sg2, .ldy = I, .n = T};
    const gk_shared_rows shd = {.W = hs[2], .W2 = hs[2], .x = sg1, .ldx = I, .y = so2, .ldy = D, .n = T};
    const gk_shared_rows sha = {.W = hs[2], .W2 = hs[2], .x = sg1, .ldx = I, .y = so3, .ldy = D, .n = T};
    rc |= gk_experts_grouped(dset, 0, 1, 1.5f, fmt, I, D, grp, didx, np, E, K, 1, dx, D, g2, I, u1, &shgu) ||
          gk_experts_grouped(dset, 2, 0, 0.f, fmt, D, I, grp, didx, np, E, K, 0, g2, I, o2, D, NULL, &shd) ||
          gk_experts_grouped(dset, 2, 0, 0.f, fmt, D, I, NULL, NULL, 0, E, K, 0, NULL, I, NULL, D, NULL, &sha);
    bits &= dsame(g1, g2, (size_t)np * I) && dsame(o1, o2, (size_t)np * D);
    sbits &= dsame(sg1, sg2, (size_t)T * I) && dsame(so1, so2, (size_t)T * D) && dsame(so1, so3, (size_t)T * D);
  }
  char nm[64];
  snprintf(nm, sizeof nm, "%s g%d %dx%d", fname(fmt), fmt >= WMAT_Q8 ? group : 0, I, D);
  CHECK(rc == 0, "grouped experts %s: %s", nm, gk_error());
  CHECK(bits, "grouped experts %s: differ from the per-pair launches", nm);
  CHECK(sbits, "grouped experts %s: the shared expert's rows differ from its per-token launch", nm);
  printf("gemv grouped experts %-24s T=1..14 (group widths 1-8, -1 pairs): bitwise %s; shared rows inside / alone: bitwise %s\n",
         nm, bits ? "yes" : "NO", sbits ? "yes" : "NO");
  for (int i = 0; i < E * 3; i++) tmat_free(&m[i]);
  for (int i = 0; i < 3; i++) tmat_free(&ms[i]);
  gk_free(dset); gk_free(dsh); gk_free(dx); gk_free(g1); gk_free(u1); gk_free(g2); gk_free(o1); gk_free(o2);
  gk_free(sg1); gk_free(sg2); gk_free(so1); gk_free(so2); gk_free(so3); gk_free(didx); gk_free(grp);
}

/* gk_rmsnorm2 (the MLA's q_a and kv_a norms in one launch) against two
 * gk_rmsnorm calls (bitwise) and the CPU rmsnorm (1e-6); in place, as the
 * MLA calls it, with ld > n for the second set */
static void rmsnorm2_case(int T, int n1, int n2) {
  const int ld2 = n2 + 3;
  float *h1 = NULL, *h2 = NULL, *hw1 = NULL, *hw2 = NULL;
  float *x1 = dvec((size_t)T * n1, -2, 2, &h1), *x2 = dvec((size_t)T * ld2, -2, 2, &h2);
  float *w1 = dvec(n1, 0.5f, 1.5f, &hw1), *w2 = dvec(n2, 0.5f, 1.5f, &hw2);
  float *y1 = dcopy(h1, (size_t)T * n1 * 4), *y2 = dcopy(h2, (size_t)T * ld2 * 4);
  int rc = gk_rmsnorm(y1, n1, y1, n1, w1, T, n1, 1e-5f) || gk_rmsnorm(y2, ld2, y2, ld2, w2, T, n2, 1e-5f) ||
           gk_rmsnorm2((gk_norm_rows){x1, n1, x1, n1, w1, n1}, (gk_norm_rows){x2, ld2, x2, ld2, w2, n2}, T, 1e-5f);
  const int same = !rc && dsame(x1, y1, (size_t)T * n1) && dsame(x2, y2, (size_t)T * ld2);
  float *g = xmalloc((size_t)T * ld2 * 4 + (size_t)T * n1 * 4), *r = xmalloc((size_t)(n1 > n2 ? n1 : n2) * 4);
  double e = rc || gk_d2h(g, x1, (size_t)T * n1 * 4) ? INFINITY : 0;
  for (int t = 0; t < T && e < INFINITY; t++) {
    rmsnorm(r, h1 + (size_t)t * n1, hw1, n1, 1e-5f);
    const double d = rel(g + (size_t)t * n1, r, (size_t)n1);
    if (d > e) e = d;
  }
  CHECK(rc == 0 && same && e <= 1e-6, "rmsnorm2 (%d rows of %d and %d): rc %d bitwise %d, vs CPU %.3g (tol 1e-6)", T, n1, n2, rc,
        same, e);
  printf("rmsnorm of two row sets in one launch, %d rows of %d and %d: bitwise as two launches %s, vs CPU %.2g (tol 1e-6)\n",
         T, n1, n2, same ? "yes" : "NO", e);
  free(g); free(r); free(h1); free(h2); free(hw1); free(hw2);
  gk_free(x1); gk_free(x2); gk_free(w1); gk_free(w2); gk_free(y1); gk_free(y2);
}

/* gk_moe_route_group (one token: the route launch also groups the pairs)
 * against gk_moe_route_pf + gk_expert_group: the same ids, weights and
 * grouping ints; E experts in G groups, top-k */
static void route_group_case(int E, int k, int G, int topk_group) {
  float *lg = dvec((size_t)E, -4, 4, NULL), *bias = dvec((size_t)E, -0.5f, 0.5f, NULL);
  const size_t ng = gk_expert_group_ints(k, E);
  int *i1 = gk_malloc((size_t)k * 4), *i2 = gk_malloc((size_t)k * 4), *g1 = gk_malloc(ng * 4), *g2 = gk_malloc(ng * 4);
  float *w1 = gk_malloc((size_t)k * 4), *w2 = gk_malloc((size_t)k * 4);
  int rc = gk_memset(g1, 0x5a, ng * 4) || gk_memset(g2, 0x5a, ng * 4); /* same filler: unused ints compare too */
  rc |= gk_moe_route_pf(lg, bias, 1, E, k, G, topk_group, 1, 2.5f, i1, w1, NULL) || gk_expert_group(i1, k, E, g1);
  const int r2 = gk_moe_route_group(lg, bias, 1, E, k, G, topk_group, 1, 2.5f, i2, w2, NULL, g2);
  const int dec2 = gk_moe_route_group(lg, bias, 2, E, k, G, topk_group, 1, 2.5f, i2, w2, NULL, g2); /* 2 tokens: declined */
  gk_set_route_group(0);
  const int off = gk_moe_route_group(lg, bias, 1, E, k, G, topk_group, 1, 2.5f, i2, w2, NULL, g2);
  gk_set_route_group(-1);
  int *h1 = xmalloc(ng * 4), *h2 = xmalloc(ng * 4);
  const int same = !rc && r2 == 0 && dsame((const float *)i1, (const float *)i2, (size_t)k) && dsame(w1, w2, (size_t)k) &&
                   !gk_d2h(h1, g1, ng * 4) && !gk_d2h(h2, g2, ng * 4) && !memcmp(h1, h2, ng * 4);
  CHECK(same, "route + grouping in one launch, E %d top-%d groups %d/%d: differs from route + gk_expert_group (rc %d/%d: %s)",
        E, k, topk_group, G, rc, r2, gk_error());
  CHECK(dec2 == 1 && off == 1, "route + grouping: not declined for 2 tokens (%d) or when off (%d)", dec2, off);
  printf("moe route + grouping in one launch   E %3d top-%d groups %d/%d: groups %d, ints bitwise %s\n", E, k, topk_group, G,
         h1[0], same ? "yes" : "NO");
  free(h1); free(h2);
  gk_free(lg); gk_free(bias); gk_free(i1); gk_free(i2); gk_free(g1); gk_free(g2); gk_free(w1); gk_free(w2);
}

/* gk_matmul_route (the router launch's last block routes) against the
 * router product then the route launch (T = 1: with the grouping; else
 * gk_moe_route_pf + gk_expert_group): the same logits, ids, weights and
 * grouping ints, and the shared gate+up product of the same launch the
 * same; two rounds with fresh x (the done counter resets itself) */
static void route_fuse_case(int fmt, int E, int k, int G, int topk_group, int T, int shared) {
  enum { D = 1024, I = 96 };
  tmat rt, sg, su;
  tmat_new(&rt, fmt, E, D, 32, 0, 0);
  tmat_new(&sg, WMAT_BF16, I, D, 0, 0, 0);
  tmat_new(&su, WMAT_BF16, I, D, 0, 0, 0);
  float *bias = dvec((size_t)E, -0.5f, 0.5f, NULL), *x = gk_malloc((size_t)T * D * 4);
  const size_t ng = gk_expert_group_ints(T * k, E);
  float *l1 = gk_malloc((size_t)T * E * 4), *l2 = gk_malloc((size_t)T * E * 4), *w1 = gk_malloc((size_t)T * k * 4);
  float *w2 = gk_malloc((size_t)T * k * 4), *y1 = gk_malloc((size_t)T * I * 4), *y2 = gk_malloc((size_t)T * I * 4);
  float *u = gk_malloc((size_t)T * I * 4);
  int *i1 = gk_malloc((size_t)T * k * 4), *i2 = gk_malloc((size_t)T * k * 4), *g1 = gk_malloc(ng * 4), *g2 = gk_malloc(ng * 4);
  int *h1 = xmalloc(ng * 4), *h2 = xmalloc(ng * 4);
  int rc = 0, same = 1, fused = 1;
  gk_set_route_fuse(1); /* (opt-in) */
  for (int round = 0; round < 2; round++) {
    float *hx = xmalloc((size_t)T * D * 4);
    for (size_t i = 0; i < (size_t)T * D; i++) hx[i] = rf();
    rc |= gk_h2d(x, hx, (size_t)T * D * 4) || gk_memset(g1, 0x5a, ng * 4) || gk_memset(g2, 0x5a, ng * 4);
    free(hx);
    const int np = shared ? 2 : 1;
    gk_prod p1[2] = {{.W = &rt.g, .y = l1, .ldy = E}, {.W = &sg.g, .y = y1, .ldy = I, .W2 = &su.g, .u = u, .limit = 7.f}};
    gk_prod p2[2] = {{.W = &rt.g, .y = l2, .ldy = E}, {.W = &sg.g, .y = y2, .ldy = I, .W2 = &su.g, .u = u, .limit = 7.f}};
    rc |= gk_matmul_multi(p1, np, x, T, D);
    if (T == 1) rc |= gk_moe_route_group(l1, bias, 1, E, k, G, topk_group, 1, 2.5f, i1, w1, NULL, g1) != 0;
    else rc |= gk_moe_route_pf(l1, bias, T, E, k, G, topk_group, 1, 2.5f, i1, w1, NULL) || gk_expert_group(i1, T * k, E, g1);
    const gk_route_req q = {.bias = bias, .E = E, .k = k, .G = G, .topk_group = topk_group, .norm = 1, .scaling = 2.5f,
                            .idx = i2, .grp = T == 1 ? g2 : NULL, .wt = w2};
    const int r2 = gk_matmul_route(p2, np, x, T, D, 0, &q);
    fused &= r2 == 0;
    if (T > 1) rc |= gk_expert_group(i2, T * k, E, g2);
    same &= !rc && r2 == 0 && dsame(l1, l2, (size_t)T * E) && dsame((const float *)i1, (const float *)i2, (size_t)T * k) &&
            dsame(w1, w2, (size_t)T * k) && (!shared || dsame(y1, y2, (size_t)T * I)) && !gk_d2h(h1, g1, ng * 4) &&
            !gk_d2h(h2, g2, ng * 4) && !memcmp(h1, h2, ng * 4);
  }
  gk_set_route_fuse(0);
  const gk_route_req q = {.bias = bias, .E = E, .k = k, .G = G, .topk_group = topk_group, .norm = 1, .scaling = 2.5f,
                          .idx = i2, .grp = NULL, .wt = w2};
  const gk_prod p = {.W = &rt.g, .y = l2, .ldy = E};
  const int off = gk_matmul_route(&p, 1, x, T, D, 0, &q);
  gk_set_route_fuse(-1);
  CHECK(same && fused, "router + route in one launch (%s, E %d, top-%d, groups %d/%d, %d tokens%s): differs from the router "
        "then the route launch (rc %d: %s)", fname(fmt), E, k, topk_group, G, T, shared ? ", shared gate+up" : "", rc, gk_error());
  CHECK(off == 1, "router + route: not declined when off (%d)", off);
  printf("router + route in one launch %-4s E %3d top-%d groups %d/%d, %d token(s)%s: logits, ids, weights, grouping "
         "bitwise %s\n", fname(fmt), E, k, topk_group, G, T, shared ? " + shared gate+up" : "", same ? "yes" : "NO");
  free(h1); free(h2);
  tmat_free(&rt); tmat_free(&sg); tmat_free(&su);
  gk_free(bias); gk_free(x); gk_free(l1); gk_free(l2); gk_free(w1); gk_free(w2); gk_free(y1); gk_free(y2); gk_free(u);
  gk_free(i1); gk_free(i2); gk_free(g1); gk_free(g2);
}

/* The decode launches of the MLA's state stores: gk_idx_keys (the key
 * norm, both indexer stores and the pooling) and gk_rmsnorm2_at (the norms
 * and the latent store) against the separate kernels, on three one-token
 * segments (positions 11 and 15 complete a pool, 5 does not), each with
 * its own 4-row pages: every page and output bitwise equal */
static void idx_fuse_case(void) {
  enum { NS = 3, HD = 128, P = 4, KL = 512, QL = 64, ROWS = 16 };
  static const int pos[NS] = {11, 5, 15};
  const int whs[4] = {GK_ST_IK, GK_ST_IS, GK_ST_POOL, GK_ST_LATENT}, str[4] = {HD, HD, HD, KL},
            nrow[4] = {ROWS, ROWS, ROWS / P, ROWS};
  float *hst[NS][4], *buf[2][NS][4];
  for (int q = 0; q < NS; q++)
    for (int j = 0; j < 4; j++) {
      hst[q][j] = xcalloc((size_t)nrow[j] * str[j], 4);
      if (j < 2)
        for (int r = 0; r < pos[q]; r++)
          for (int c = 0; c < HD; c++) hst[q][j][(size_t)r * HD + c] = j ? 2 * rf() : rf();
    }
  float *hkk = NULL, *hr = NULL, *hc = NULL;
  float *kk0 = dvec((size_t)NS * HD, -2.5f, 3.5f, &hkk), *kg = dvec((size_t)NS * HD, -2, 2, NULL);
  float *r0 = dvec((size_t)NS * QL, -2, 2, &hr), *c0 = dvec((size_t)NS * KL, -2, 2, &hc);
  float *knw = dvec(HD, 0.5f, 1.5f, NULL), *knb = dvec(HD, -0.2f, 0.2f, NULL), *ape = dvec((size_t)P * HD, -1, 1, NULL);
  float *qw = dvec(QL, 0.5f, 1.5f, NULL), *kw = dvec(KL, 0.5f, 1.5f, NULL);
  float *kk[2], *rr[2], *cc[2];
  int rc = 0, krc[2] = {0, 0};
  gk_lstate ls[2][NS];
  void *tabs[2][NS][4];
  for (int v = 0; v < 2; v++) {
    kk[v] = dcopy(hkk, (size_t)NS * HD * 4), rr[v] = dcopy(hr, (size_t)NS * QL * 4), cc[v] = dcopy(hc, (size_t)NS * KL * 4);
    for (int q = 0; q < NS; q++) {
      memset(&ls[v][q], 0, sizeof ls[v][q]);
      ls[v][q].pshift = 2;
      for (int j = 0; j < 4; j++) {
        tabs[v][q][j] = gpu_pages_make(hst[q][j], nrow[j], str[j], 2, talloc, NULL, &buf[v][q][j]);
        rc |= !tabs[v][q][j];
        ls[v][q].pg[whs[j]] = tabs[v][q][j];
      }
    }
  }
  for (int v = 0; v < 2 && !rc; v++) {
    gk_lstate *dls = dcopy(ls[v], sizeof ls[v]);
    gk_seg seg[NS];
    int ts[NS];
    for (int q = 0; q < NS; q++) seg[q] = (gk_seg){.ls = dls + q, .t0 = q, .len = 1, .pos0 = pos[q]}, ts[q] = q;
    gk_seg *dseg = dcopy(seg, sizeof seg);
    int *tseg = dcopy(ts, sizeof ts);
    const gk_batch b = {.seg = dseg, .tseg = tseg, .nseg = NS, .maxlen = 1};
    const gk_norm_rows na = {rr[v], QL, rr[v], QL, qw, QL}, nb = {cc[v], KL, cc[v], KL, kw, KL};
    gk_set_idx_fuse(v);
    krc[v] = gk_idx_keys(&b, kk[v], kg, knw, knb, ape, NS, P, HD, 1e-6f);
    if (v == 0)
      rc |= gk_layernorm(kk[0], HD, kk[0], HD, knw, knb, NS, HD, 1e-6f) || gk_store_at(&b, GK_ST_IK, HD, kk[0], NS, HD) ||
            gk_store_at(&b, GK_ST_IS, HD, kg, NS, HD) || gk_pool_keys(&b, ape, P, HD) ||
            gk_rmsnorm2(na, nb, NS, 1e-5f) || gk_store_at(&b, GK_ST_LATENT, KL, cc[0], NS, KL);
    else rc |= gk_rmsnorm2_at(na, nb, NS, 1e-5f, &b, GK_ST_LATENT, KL);
    rc |= gk_sync();
    gk_free(dls); gk_free(dseg); gk_free(tseg);
  }
  gk_set_idx_fuse(-1);
  int same = !rc && krc[0] == 1 && krc[1] == 0 && dsame(kk[0], kk[1], (size_t)NS * HD) && dsame(rr[0], rr[1], (size_t)NS * QL) &&
             dsame(cc[0], cc[1], (size_t)NS * KL);
  int pools = 0;
  for (int q = 0; q < NS; q++)
    for (int j = 0; j < 4; j++) {
      const size_t n = (size_t)nrow[j] * str[j];
      float *a = xmalloc(n * 4), *bb = xmalloc(n * 4);
      same &= !gpu_pages_read(a, buf[0][q][j], nrow[j], str[j], 2) && !gpu_pages_read(bb, buf[1][q][j], nrow[j], str[j], 2) &&
              !memcmp(a, bb, n * 4);
      if (whs[j] == GK_ST_POOL && (pos[q] + 1) % P == 0) pools += bb[(size_t)(pos[q] / P) * HD] != 0.f;
      free(a); free(bb);
    }
  CHECK(same && pools == 2, "indexer keys / latent store launches (decode) differ from the separate kernels (rc %d, %d/%d; "
        "pools %d of 2: %s)", rc, krc[0], krc[1], pools, gk_error());
  printf("indexer keys + stores + pooling, norms + latent store, 3 one-token segments: pages bitwise as the separate "
         "kernels %s\n", same ? "yes" : "NO");
  for (int v = 0; v < 2; v++) {
    gk_free(kk[v]); gk_free(rr[v]); gk_free(cc[v]);
    for (int q = 0; q < NS; q++)
      for (int j = 0; j < 4; j++) { gk_free(buf[v][q][j]); gk_free(tabs[v][q][j]); }
  }
  for (int q = 0; q < NS; q++)
    for (int j = 0; j < 4; j++) free(hst[q][j]);
  free(hkk); free(hr); free(hc);
  gk_free(kk0); gk_free(kg); gk_free(r0); gk_free(c0); gk_free(knw); gk_free(knb); gk_free(ape); gk_free(qw); gk_free(kw);
}

/* gk_kda_recur_gated against gk_kda_gate + gk_kda_recur (output and state) */
static void kda_gated_case(float lb, int T) {
  const int H = 3, hd = 64, inner = H * hd, ch = 3 * inner;
  float *hs = NULL;
  float *qkv = dvec((size_t)T * ch, -0.3f, 0.3f, NULL), *graw = dvec((size_t)T * inner, -3, 3, NULL);
  float *dtb = dvec(inner, -0.5f, 0.5f, NULL), *Al = dvec(H, -0.5f, 0.5f, NULL), *bl = dvec((size_t)T * H, -2, 2, NULL);
  float *S1 = dvec((size_t)H * hd * hd, -0.2f, 0.2f, &hs), *S2 = dcopy(hs, (size_t)H * hd * hd * 4);
  float *g = gk_malloc((size_t)T * inner * 4), *o1 = gk_malloc((size_t)T * inner * 4), *o2 = gk_malloc((size_t)T * inner * 4);
  gk_d2d(g, graw, (size_t)T * inner * 4);
  gk_lstate ls[2];
  memset(ls, 0, sizeof ls);
  ls[0].p[GK_ST_S] = S1;
  ls[1].p[GK_ST_S] = S2;
  gk_lstate *dls = dcopy(ls, sizeof ls);
  gk_seg seg[2] = {{.ls = dls, .t0 = 0, .len = T, .pos0 = 5}, {.ls = dls + 1, .t0 = 0, .len = T, .pos0 = 5}};
  gk_seg *dseg = dcopy(seg, sizeof seg);
  int *tseg = gk_malloc((size_t)T * 4);
  gk_memset(tseg, 0, (size_t)T * 4);
  gk_batch b1 = {.seg = dseg, .tseg = tseg, .nseg = 1, .maxlen = T}, b2 = b1;
  b2.seg = dseg + 1;
  int rc = gk_kda_gate(g, dtb, Al, T, H, hd, lb) || gk_kda_recur(&b1, qkv, g, bl, T, H, hd, o1) ||
           gk_kda_recur_gated(&b2, qkv, graw, dtb, Al, lb, bl, T, H, hd, o2);
  const int bits = !rc && dsame(o1, o2, (size_t)T * inner) && dsame(S1, S2, (size_t)H * hd * hd);
  CHECK(rc == 0, "kda gated recurrence: %s", gk_error());
  CHECK(bits, "kda gated recurrence (lower bound %g) differs from gate + recurrence", lb);
  printf("kda recurrence with the gate fused (lower bound %g, %d tokens): output and state bitwise %s\n", lb, T,
         bits ? "yes" : "NO");
  free(hs);
  gk_free(qkv); gk_free(graw); gk_free(dtb); gk_free(Al); gk_free(bl); gk_free(S1); gk_free(S2); gk_free(g);
  gk_free(o1); gk_free(o2); gk_free(dls); gk_free(dseg); gk_free(tseg);
}

/* gk_kda_recur_out (decode: the gated norm done by the recurrence's last
 * block per head) against gk_kda_recur_gated + gk_kda_out: outputs (in
 * place, and bf16 rows) and states bitwise, two segments of 1 and 3
 * tokens; twice (the counters reset themselves); declined when off */
static void kda_out_fuse_case(int hd, int b16) {
  const int H = 3, inner = H * hd, ch = 3 * inner, T = 4;
  float *hs = NULL;
  float *qkv = dvec((size_t)T * ch, -0.3f, 0.3f, NULL), *graw = dvec((size_t)T * inner, -3, 3, NULL);
  float *dtb = dvec(inner, -0.5f, 0.5f, NULL), *Al = dvec(H, -0.5f, 0.5f, NULL), *bl = dvec((size_t)T * H, -2, 2, NULL);
  float *z = dvec((size_t)T * inner, -2, 2, NULL), *nw = dvec(hd, 0.7f, 1.3f, NULL);
  const size_t ns = (size_t)2 * H * hd * hd;
  float *S1 = dvec(ns, -0.2f, 0.2f, &hs), *S2 = dcopy(hs, ns * 4);
  float *o1 = gk_malloc((size_t)T * inner * 4), *o2 = gk_malloc((size_t)T * inner * 4);
  uint16_t *b1 = gk_malloc((size_t)T * inner * 2), *b2 = gk_malloc((size_t)T * inner * 2);
  gk_lstate ls[4];
  memset(ls, 0, sizeof ls);
  for (int q = 0; q < 2; q++) {
    ls[q].p[GK_ST_S] = S1 + (size_t)q * H * hd * hd;
    ls[2 + q].p[GK_ST_S] = S2 + (size_t)q * H * hd * hd;
  }
  gk_lstate *dls = dcopy(ls, sizeof ls);
  gk_seg seg[4] = {{.ls = dls, .t0 = 0, .len = 1, .pos0 = 5}, {.ls = dls + 1, .t0 = 1, .len = 3, .pos0 = 9},
                   {.ls = dls + 2, .t0 = 0, .len = 1, .pos0 = 5}, {.ls = dls + 3, .t0 = 1, .len = 3, .pos0 = 9}};
  gk_seg *dseg = dcopy(seg, sizeof seg);
  const int ts[4] = {0, 1, 1, 1};
  int *tseg = dcopy(ts, sizeof ts);
  gk_batch ba = {.seg = dseg, .tseg = tseg, .nseg = 2, .maxlen = 3}, bb = ba;
  bb.seg = dseg + 2;
  int rc = gk_memset(b1, 0, (size_t)T * inner * 2) || gk_memset(b2, 0, (size_t)T * inner * 2), fused = 1;
  gk_set_kda_out_fuse(1);
  gk_set_kda_layout(GK_KR_G4); /* (the fused form's layout, whatever GLM53_GPU_KDA_LAYOUT says) */
  for (int r = 0; r < 2 && !rc; r++) {
    rc |= gk_kda_recur_gated(&ba, qkv, graw, dtb, Al, -5.0f, bl, T, H, hd, o1) ||
          gk_kda_out(o1, z, nw, T, H, hd, 1e-5f, b16 ? b1 : NULL);
    const int f = gk_kda_recur_out(&bb, qkv, graw, dtb, Al, -5.0f, bl, T, H, hd, o2, z, nw, 1e-5f, b16 ? b2 : NULL);
    fused &= f == 0;
    rc |= f < 0;
  }
  gk_set_kda_layout(0);
  gk_set_kda_out_fuse(0);
  const int off = gk_kda_recur_out(&bb, qkv, graw, dtb, Al, -5.0f, bl, T, H, hd, o2, z, nw, 1e-5f, NULL);
  gk_set_kda_out_fuse(-1);
  const int bits = !rc && fused && dsame(o1, o2, (size_t)T * inner) && dsame(S1, S2, ns) &&
                   dsame((const float *)b1, (const float *)b2, (size_t)T * inner / 2);
  CHECK(bits && off == 1, "kda recurrence + gated norm in one launch (hd %d%s) differs from the two launches (rc %d, fused "
        "%d, declined when off %d: %s)", hd, b16 ? ", bf16 rows" : "", rc, fused, off == 1, gk_error());
  printf("kda recurrence + gated norm in one launch, hd %d, segments of 1 and 3 tokens%s: outputs and states bitwise %s\n",
         hd, b16 ? ", bf16 rows" : "", bits ? "yes" : "NO");
  free(hs);
  gk_free(qkv); gk_free(graw); gk_free(dtb); gk_free(Al); gk_free(bl); gk_free(z); gk_free(nw); gk_free(S1); gk_free(S2);
  gk_free(o1); gk_free(o2); gk_free(b1); gk_free(b2); gk_free(dls); gk_free(dseg); gk_free(tseg);
}

/* gk_kda_chunked (the chunked prefill form) against the token recurrence
 * (gk_kda_recur_gated): segments of several lengths in one launch (a full
 * chunk, partial chunks, one token) through their own states, q and k
 * L2-normalised per head as in the model (an unnormalised delta rule
 * diverges, and so would any two roundings of it). Output and final states
 * within 1e-4 of the largest value (fp32 both; ~1e-6 expected). */
static void kda_chunk_case(int hd, const int *lens, int nseg, float lb, float gshift) {
  const int H = 3, inner = H * hd, ch = 3 * inner;
  int T = 0, maxlen = 0;
  for (int z = 0; z < nseg; z++) T += lens[z], maxlen = lens[z] > maxlen ? lens[z] : maxlen;
  float *hq = xmalloc((size_t)T * ch * 4);
  for (int t = 0; t < T; t++)
    for (int part = 0; part < 3; part++)
      for (int h = 0; h < H; h++) {
        float *v = hq + (size_t)t * ch + part * inner + h * hd;
        double ss = 0;
        for (int i = 0; i < hd; i++) v[i] = rf(), ss += (double)v[i] * v[i];
        const float sc = part == 2 ? 1.0f : (float)(1.0 / sqrt(ss + 1e-6)) * (part == 0 ? 1.0f / sqrtf((float)hd) : 1.0f);
        for (int i = 0; i < hd; i++) v[i] *= sc;
      }
  float *qkv1 = dcopy(hq, (size_t)T * ch * 4), *qkv2 = dcopy(hq, (size_t)T * ch * 4), *hg = NULL, *hb = NULL, *hs = NULL;
  float *g1 = dvec((size_t)T * inner, gshift - 3, gshift + 3, &hg), *g2 = dcopy(hg, (size_t)T * inner * 4);
  float *bl1 = dvec((size_t)T * H, -2, 2, &hb), *bl2 = dcopy(hb, (size_t)T * H * 4);
  float *dtb = dvec(inner, -0.5f, 0.5f, NULL), *Al = dvec(H, -0.5f, 0.5f, NULL);
  const size_t ns = (size_t)H * hd * hd;
  float *S1 = dvec(ns * nseg, -0.2f, 0.2f, &hs), *S2 = dcopy(hs, ns * nseg * 4);
  float *o1 = gk_malloc((size_t)T * inner * 4), *o2 = gk_malloc((size_t)T * inner * 4);
  float *work = gk_malloc(gk_kda_chunk_work(T, H, hd) * 4);
  gk_lstate *ls = calloc(2 * (size_t)nseg, sizeof *ls);
  gk_seg *seg = calloc(2 * (size_t)nseg, sizeof *seg);
  int *ts = xmalloc((size_t)T * 4);
  for (int z = 0, t0 = 0; z < nseg; t0 += lens[z], z++) {
    ls[z].p[GK_ST_S] = S1 + z * ns;
    ls[nseg + z].p[GK_ST_S] = S2 + z * ns;
    for (int t = t0; t < t0 + lens[z]; t++) ts[t] = z;
  }
  gk_lstate *dls = dcopy(ls, 2 * (size_t)nseg * sizeof *ls);
  for (int z = 0, t0 = 0; z < nseg; t0 += lens[z], z++) {
    seg[z] = (gk_seg){.ls = dls + z, .t0 = t0, .len = lens[z], .pos0 = 3};
    seg[nseg + z] = (gk_seg){.ls = dls + nseg + z, .t0 = t0, .len = lens[z], .pos0 = 3};
  }
  gk_seg *dseg = dcopy(seg, 2 * (size_t)nseg * sizeof *seg);
  int *tseg = dcopy(ts, (size_t)T * 4);
  gk_batch b1 = {.seg = dseg, .tseg = tseg, .nseg = nseg, .maxlen = maxlen}, b2 = b1;
  b2.seg = dseg + nseg;
  gk_set_kda_chunked(1);
  const int use = gk_kda_chunk_use(&b2, hd);
  CHECK(use == (maxlen >= 64), "kda chunked: gk_kda_chunk_use %d for a longest segment of %d", use, maxlen);
  int rc = gk_kda_recur_gated(&b1, qkv1, g1, dtb, Al, lb, bl1, T, H, hd, o1) ||
           gk_kda_chunked(&b2, qkv2, g2, dtb, Al, lb, bl2, T, H, hd, work, o2);
  gk_set_kda_chunked(-1);
  CHECK(rc == 0, "kda chunked: %s", gk_error());
  float *r1 = xmalloc((size_t)T * inner * 4), *r2 = xmalloc((size_t)T * inner * 4);
  float *s1 = xmalloc(ns * nseg * 4), *s2 = xmalloc(ns * nseg * 4);
  double eo = INFINITY, es = INFINITY;
  if (!rc && !gk_d2h(r1, o1, (size_t)T * inner * 4) && !gk_d2h(r2, o2, (size_t)T * inner * 4) &&
      !gk_d2h(s1, S1, ns * nseg * 4) && !gk_d2h(s2, S2, ns * nseg * 4)) {
    eo = rel(r2, r1, (size_t)T * inner);
    es = rel(s2, s1, ns * nseg);
  }
  char nm[96];
  int k = snprintf(nm, sizeof nm, "hd %d, lb %g%s, segments", hd, lb, gshift ? " (gates at the bound)" : "");
  for (int z = 0; z < nseg && k < (int)sizeof nm - 8; z++) k += snprintf(nm + k, sizeof nm - k, " %d", lens[z]);
  CHECK(eo <= 1e-4 && es <= 1e-4, "kda chunked (%s): output err %.3g, state err %.3g > 1e-4", nm, eo, es);
  printf("kda chunked form vs token recurrence (%s): output err %.3g, state err %.3g (tol 1e-4)\n", nm, eo, es);
  free(hq); free(hg); free(hb); free(hs); free(ls); free(seg); free(ts); free(r1); free(r2); free(s1); free(s2);
  gk_free(qkv1); gk_free(qkv2); gk_free(g1); gk_free(g2); gk_free(bl1); gk_free(bl2); gk_free(dtb); gk_free(Al);
  gk_free(S1); gk_free(S2); gk_free(o1); gk_free(o2); gk_free(work); gk_free(dls); gk_free(dseg); gk_free(tseg);
}

/* gk_select against a CPU sort (score descending, NaN as -inf, index
 * ascending): n pools per token, scores from 7 values (ties) and NaNs;
 * n <= 4096 takes the shared-memory sort, more the rank count */
static const float *g_sel_sc;
static int sel_cmp(const void *a, const void *b) {
  const int i = *(const int *)a, j = *(const int *)b;
  float x = g_sel_sc[i], y = g_sel_sc[j];
  if (isnan(x)) x = -INFINITY;
  if (isnan(y)) y = -INFINITY;
  return x != y ? (x > y ? -1 : 1) : (i < j ? -1 : 1);
}
static void select_case(int n, int K) {
  const int P = 4, T = 2, maxpool = n;
  float *sc = xmalloc((size_t)T * maxpool * 4);
  for (size_t i = 0; i < (size_t)T * maxpool; i++) {
    const int v = (int)(rnd() % 8);
    sc[i] = v == 7 ? NAN : (float)(v - 3);
  }
  float *dsc = dcopy(sc, (size_t)T * maxpool * 4);
  gk_seg seg = {.ls = NULL, .t0 = 0, .len = T, .pos0 = P * n - 1}; /* both tokens see n complete pools */
  gk_seg *dseg = dcopy(&seg, sizeof seg);
  int *tseg = gk_malloc((size_t)T * 4), *dden = gk_malloc(T * 4), *dnp = gk_malloc(T * 4), *dtail = gk_malloc(T * 4);
  int *dpl = gk_malloc((size_t)T * K * 4);
  gk_memset(tseg, 0, (size_t)T * 4);
  gk_batch b = {.seg = dseg, .tseg = tseg, .nseg = 1, .maxlen = T};
  int *got = xmalloc((size_t)T * K * 4), *ord = xmalloc((size_t)n * 4), np[2] = {0, 0};
  int rc = gk_select(dsc, &b, T, P, K, maxpool, 1, dden, dnp, dtail, dpl) || gk_d2h(got, dpl, (size_t)T * K * 4) ||
           gk_d2h(np, dnp, T * 4);
  int same = !rc;
  for (int t = 0; t < T && same; t++) {
    for (int i = 0; i < n; i++) ord[i] = i;
    g_sel_sc = sc + (size_t)t * maxpool;
    qsort(ord, n, sizeof *ord, sel_cmp);
    same &= np[t] == K && !memcmp(got + (size_t)t * K, ord, (size_t)K * 4);
  }
  CHECK(rc == 0, "select: %s", gk_error());
  CHECK(same, "select of %d of %d pools differs from the sorted order", K, n);
  printf("indexer top-%d of %d pools (ties, NaN): same pools in the same order as a CPU sort: %s\n", K, n,
         same ? "yes" : "NO");
  free(sc); free(got); free(ord);
  gk_free(dsc); gk_free(dseg); gk_free(tseg); gk_free(dden); gk_free(dnp); gk_free(dtail); gk_free(dpl);
}

/* y / post / comb of a gk_mhc_pre call (rc its result) against the CPU
 * ones r*, 1e-4; g* host scratch of the same sizes */
static void mhc_pre_verify(const char *what, int rc, const float *dy, const float *dpost, const float *dcomb, const float *ry,
                           const float *rp, const float *rc_, float *gy, float *gp, float *gc, int T, int hc, int D) {
  rc = rc || gk_d2h(gy, dy, (size_t)T * D * 4) || gk_d2h(gp, dpost, (size_t)T * hc * 4) ||
       gk_d2h(gc, dcomb, (size_t)T * hc * hc * 4);
  const double ey = rc ? INFINITY : rel(gy, ry, (size_t)T * D), ep = rc ? INFINITY : rel(gp, rp, (size_t)T * hc);
  const double ec = rc ? INFINITY : rel(gc, rc_, (size_t)T * hc * hc);
  CHECK(rc == 0, "%s: %s", what, gk_error());
  CHECK(ey <= 1e-4 && ep <= 1e-4 && ec <= 1e-4, "%s D %d: y %.3g post %.3g comb %.3g (tol 1e-4)", what, D, ey, ep, ec);
  printf("%s, %d tokens, D %d: vs CPU y %.2g post %.2g comb %.2g (tol 1e-4)\n", what, T, D, ey, ep, ec);
}

/* gk_mhc_pre (projection from gk_matmul) against the CPU mhc_pre + the
 * sublayer RMSNorm: D = 8196 runs past the rows held in registers, D = 302
 * (D % 4 != 0) takes the scalar path; tolerance 1e-4 as the startup check */
static void mhc_pre_case(int T, int D) {
  glm53_config c = {0};
  c.hc_mult = 4; c.hidden_size = D; c.hc_sinkhorn_iters = 20; c.hc_eps = 1e-6f; c.rms_norm_eps = 1e-5f;
  const int hc = 4, mix = (2 + hc) * hc, n = hc * D;
  float *fn = NULL, *base = NULL, *sc = NULL, *X = NULL, *nw = NULL;
  float *dfn = dvec((size_t)mix * n, -0.02f, 0.02f, &fn), *dbase = dvec(mix, -0.5f, 0.5f, &base);
  float *dsc = dvec(3, 0.8f, 1.2f, &sc), *dX = dvec((size_t)T * n, -1, 1, &X), *dnw = dvec(D, 0.8f, 1.2f, &nw);
  float *dmix = gk_malloc((size_t)T * mix * 4), *dpost = gk_malloc((size_t)T * hc * 4);
  float *dcomb = gk_malloc((size_t)T * hc * hc * 4), *dy = gk_malloc((size_t)T * D * 4);
  gpu_mat g = {.fmt = WMAT_F32, .rows = mix, .cols = n, .d = dfn};
  mhc_weights w = {fn, base, sc};
  float *ry = xmalloc((size_t)T * D * 4), *gy = xmalloc((size_t)T * D * 4), *rp = xmalloc((size_t)T * hc * 4);
  float *gp = xmalloc((size_t)T * hc * 4), *rc_ = xmalloc((size_t)T * hc * hc * 4), *gc = xmalloc((size_t)T * hc * hc * 4);
  for (int t = 0; t < T; t++) {
    mhc_pre(&w, &c, X + (size_t)t * n, rp + t * hc, rc_ + t * hc * hc, ry + (size_t)t * D);
    rmsnorm(ry + (size_t)t * D, ry + (size_t)t * D, nw, D, c.rms_norm_eps);
  }
  uint16_t *dy16 = gk_malloc((size_t)T * D * 2), *hy16 = xmalloc((size_t)T * D * 2);
  int rc = gk_matmul(&g, dX, T, n, dmix, mix) ||
           gk_mhc_pre(dX, dmix, NULL, dbase, dsc, dnw, T, hc, D, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, dpost, dcomb, dy,
                      dy16);
  mhc_pre_verify("mhc pre", rc, dy, dpost, dcomb, ry, rp, rc_, gy, gp, gc, T, hc, D);
  { /* its bf16 copy of y (gk_xb_alias): the rounding of y */
    size_t bad = rc || gk_d2h(hy16, dy16, (size_t)T * D * 2) ? 1 : 0;
    for (size_t i = 0; i < (size_t)T * D && !bad; i++) bad += hy16[i] != f32_to_bf16(gy[i]);
    CHECK(!bad, "mhc pre (T %d, D %d): the bf16 copy of y is not y's rounding", T, D);
    printf("mhc pre, %d tokens, D %d: bf16 copy of y = its rounding: %s\n", T, D, bad ? "NO" : "yes");
  }
  gk_free(dy16);
  free(hy16);
  if (T == 1) { /* one token: the projection's launch runs the pre in its last block (gk_mhc_proj_pre): the same bits
                 * for mixraw, post, comb, y and its bf16 copy, twice (the launch's counter resets itself) */
    float *m2 = gk_malloc((size_t)mix * 4), *p2 = gk_malloc((size_t)hc * 4), *c2 = gk_malloc((size_t)hc * hc * 4);
    float *y2 = gk_malloc((size_t)D * 4);
    uint16_t *a16 = gk_malloc((size_t)D * 2), *b16 = gk_malloc((size_t)D * 2);
    int same = !gk_mhc_pre(dX, dmix, NULL, dbase, dsc, dnw, 1, hc, D, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, dpost,
                           dcomb, dy, a16),
        fused = 1;
    gk_set_mhc_pre_fuse(1); /* (opt-in) */
    for (int r = 0; r < 2; r++) {
      const int f = gk_mhc_proj_pre(&g, dX, 1, hc, D, m2, dbase, dsc, dnw, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, p2,
                                    c2, y2, b16);
      fused &= f == 0;
      same &= f == 0 && dsame(m2, dmix, (size_t)mix) && dsame(p2, dpost, (size_t)hc) && dsame(c2, dcomb, (size_t)hc * hc) &&
              dsame(y2, dy, (size_t)D) && dsame((const float *)b16, (const float *)a16, (size_t)D / 2);
    }
    gk_set_mhc_pre_fuse(0);
    const int off = gk_mhc_proj_pre(&g, dX, 1, hc, D, m2, dbase, dsc, dnw, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, p2,
                                    c2, y2, b16);
    gk_set_mhc_pre_fuse(-1);
    CHECK(same && fused && off == 1, "mhc projection + pre in one launch (D %d) differs from the two launches (fused %d, "
          "declined when off %d: %s)", D, fused, off == 1, gk_error());
    printf("mhc projection + pre in one launch, 1 token, D %d: bitwise as the two launches %s\n", D, same ? "yes" : "NO");
    gk_free(m2); gk_free(p2); gk_free(c2); gk_free(y2); gk_free(a16); gk_free(b16);
  }
  { /* comb on its own (gk_mhc_comb, a decode graph's branch) and the pre
     * without it: the same bits as the pre that does both */
    float *dy2 = gk_malloc((size_t)T * D * 4), *dp2 = gk_malloc((size_t)T * hc * 4), *dc2 = gk_malloc((size_t)T * hc * hc * 4);
    const int rc2 =
        gk_memset(dc2, 0, (size_t)T * hc * hc * 4) ||
        gk_mhc_pre(dX, dmix, NULL, dbase, dsc, dnw, T, hc, D, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, dp2, NULL, dy2, NULL);
    float *hc2 = xmalloc((size_t)T * hc * hc * 4);
    int untouched = !rc2 && !gk_d2h(hc2, dc2, (size_t)T * hc * hc * 4);
    for (int i = 0; i < T * hc * hc && untouched; i++) untouched = hc2[i] == 0.f;
    const int rc3 = rc2 || gk_mhc_comb(dX, dmix, NULL, dbase, dsc, dnw, T, hc, D, c.hc_sinkhorn_iters, c.hc_eps,
                                       c.rms_norm_eps, dc2, dy2, NULL);
    const int same = !rc3 && dsame(dy2, dy, (size_t)T * D) && dsame(dp2, dpost, (size_t)T * hc) &&
                     dsame(dc2, dcomb, (size_t)T * hc * hc);
    CHECK(same && untouched, "mhc pre D %d: comb apart (gk_mhc_comb) differs (rc %d: %s) or the pre wrote comb (%d)", D, rc3,
          gk_error(), !untouched);
    printf("mhc pre, %d tokens, D %d: comb apart + pre without it bitwise as the pre alone: %s\n", T, D,
           same && untouched ? "yes" : "NO");
    free(hc2);
    gk_free(dy2); gk_free(dp2); gk_free(dc2);
  }
  if (T >= 64) { /* long launches (from 1024 tokens) cache the streams in shared memory: the same bits as 2 tokens alone */
    float *dy2 = gk_malloc((size_t)2 * D * 4), *dp2 = gk_malloc((size_t)2 * hc * 4), *dc2 = gk_malloc((size_t)2 * hc * hc * 4);
    const int rc2 =
        gk_mhc_pre(dX, dmix, NULL, dbase, dsc, dnw, 2, hc, D, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, dp2, dc2, dy2, NULL);
    const int same = !rc2 && dsame(dy2, dy, (size_t)2 * D) && dsame(dp2, dpost, (size_t)2 * hc) && dsame(dc2, dcomb, (size_t)2 * hc * hc);
    CHECK(same, "mhc pre D %d: %d tokens differ from 2 alone", D, T);
    printf("mhc pre, %d tokens, D %d: first 2 bitwise as 2 alone: %s\n", T, D, same ? "yes" : "NO");
    gk_free(dy2); gk_free(dp2); gk_free(dc2);
    /* the one-pass projection + sum of squares (gk_mhc_proj) feeding
     * gk_mhc_pre: its tensor-core form (CUDA; steps of 32 columns, then
     * 16), then the SIMT kernel */
    float *dss = gk_malloc((size_t)T * 4);
    for (int tc = 2; tc >= 0; tc--) {
      gk_set_mhc_tc(tc > 0);
      gk_set_mhc_k32(tc == 2);
      if (tc && !gk_mhc_tc_on()) continue;
      int rc3 = gk_mhc_proj(&g, dX, T, hc, D, dmix, dss);
      if (rc3 == 1) printf("mhc proj: not applicable\n");
      else {
        rc3 = rc3 || gk_mhc_pre(dX, dmix, dss, dbase, dsc, dnw, T, hc, D, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps, dpost,
                                dcomb, dy, NULL);
        mhc_pre_verify(tc == 2 ? "mhc proj+pre (tensor cores, 32-column steps)" : tc ? "mhc proj+pre (tensor cores)"
                                                                             : "mhc proj+pre (one pass)",
                       rc3, dy, dpost, dcomb, ry, rp, rc_, gy, gp, gc, T, hc, D);
      }
    }
    gk_set_mhc_tc(-1);
    gk_set_mhc_k32(-1);
    gk_free(dss);
  }
  free(fn); free(base); free(sc); free(X); free(nw); free(ry); free(gy); free(rp); free(gp); free(rc_); free(gc);
  gk_free(dfn); gk_free(dbase); gk_free(dsc); gk_free(dX); gk_free(dnw); gk_free(dmix); gk_free(dpost); gk_free(dcomb);
  gk_free(dy);
}

/* gk_kda_conv_prep against gk_kda_conv + gk_kda_prep, bitwise (outputs and
 * conv states): nseg segments of len tokens each (len <= 4: the one-launch
 * form that also writes the states; longer: conv+prep, with 1, 4 or 8
 * tokens per warp when K = 4, then the state kernel). raw16: the fused
 * form reads the projections in bf16, the reference their fp32 widening. */
static void kda_conv_prep_case(int nseg, int len, int H, int hd, int K, int raw16) {
  const int inner = H * hd, ch = 3 * inner, T = nseg * len;
  float *hs = NULL, *hr = NULL;
  float *raw = dvec((size_t)T * ch, -2, 2, &hr), *w = dvec((size_t)ch * K, -0.5f, 0.5f, NULL);
  uint16_t *r16 = NULL;
  if (raw16) {
    uint16_t *h16 = xmalloc((size_t)T * ch * 2);
    for (size_t i = 0; i < (size_t)T * ch; i++) {
      h16[i] = f32_to_bf16(hr[i]);
      hr[i] = bf16_to_f32(h16[i]);
    }
    r16 = dcopy(h16, (size_t)T * ch * 2);
    gk_h2d(raw, hr, (size_t)T * ch * 4);
    free(h16);
  }
  float *st1 = dvec((size_t)nseg * (K - 1) * ch, -1, 1, &hs), *st2 = dcopy(hs, (size_t)nseg * (K - 1) * ch * 4);
  float *o1 = gk_malloc((size_t)T * ch * 4), *o2 = gk_malloc((size_t)T * ch * 4);
  gk_lstate *ls = xcalloc((size_t)2 * nseg, sizeof *ls);
  for (int q = 0; q < nseg; q++) {
    ls[q].p[GK_ST_CONV] = st1 + (size_t)q * (K - 1) * ch;
    ls[nseg + q].p[GK_ST_CONV] = st2 + (size_t)q * (K - 1) * ch;
  }
  gk_lstate *dls = dcopy(ls, (size_t)2 * nseg * sizeof *ls);
  gk_seg *seg = xcalloc((size_t)2 * nseg, sizeof *seg);
  int *ts = xmalloc((size_t)T * sizeof(int));
  for (int q = 0; q < nseg; q++) {
    seg[q] = (gk_seg){.ls = dls + q, .t0 = q * len, .len = len, .pos0 = 7};
    seg[nseg + q] = (gk_seg){.ls = dls + nseg + q, .t0 = q * len, .len = len, .pos0 = 7};
    for (int t = 0; t < len; t++) ts[q * len + t] = q;
  }
  gk_seg *dseg = dcopy(seg, (size_t)2 * nseg * sizeof *seg);
  int *tseg = dcopy(ts, (size_t)T * sizeof(int));
  gk_batch b1 = {.seg = dseg, .tseg = tseg, .nseg = nseg, .maxlen = len}, b2 = b1;
  b2.seg = dseg + nseg;
  const float qs = 0.125f;
  int rc = gk_kda_conv(raw, &b1, w, T, ch, K, o1) || gk_kda_prep(o1, T, H, hd, qs) ||
           gk_kda_conv_prep(raw16 ? (const void *)r16 : raw, raw16, &b2, w, T, H, hd, K, qs, o2);
  const int bits = !rc && dsame(o1, o2, (size_t)T * ch) && dsame(st1, st2, (size_t)nseg * (K - 1) * ch);
  CHECK(rc == 0, "kda conv+prep: %s", gk_error());
  CHECK(bits, "kda conv+prep (%d x %d tokens, hd %d%s) differs from conv then prep", nseg, len, hd, raw16 ? ", bf16 raw" : "");
  printf("kda conv+prep fused, %d segment(s) of %d token(s), H %d, hd %d, %d taps%s: outputs and conv states bitwise %s\n",
         nseg, len, H, hd, K, raw16 ? ", bf16 projections" : "", bits ? "yes" : "NO");
  free(hs); free(hr); free(ls); free(seg); free(ts);
  gk_free(r16);
  gk_free(raw); gk_free(w); gk_free(st1); gk_free(st2); gk_free(o1); gk_free(o2); gk_free(dls); gk_free(dseg);
  gk_free(tseg);
}

/* The recurrence's staged token tiles (docs/gpu.md, KDA): two sequences of
 * T1 and T2 tokens in one launch (tiles of up to 32 tokens, partial column
 * groups when hd % 16 != 0) against the CPU kda_step (double sums), and
 * bitwise against one launch per token position (decode-style launches,
 * one one-token segment per sequence). */
static void kda_tiles_case(int T1, int T2, int H, int hd) {
  const int inner = H * hd, R = T1 + T2, Tm = T1 > T2 ? T1 : T2;
  const size_t ns = (size_t)H * hd * hd;
  float *hq = NULL, *hg = NULL, *hb = NULL, *hs = NULL;
  float *qkv = dvec((size_t)R * 3 * inner, -0.3f, 0.3f, &hq), *g = dvec((size_t)R * inner, -1.0f, 0.0f, &hg);
  float *bl = dvec((size_t)R * H, -2, 2, &hb), *S = dvec(2 * ns, -0.2f, 0.2f, &hs), *S1 = gk_malloc(2 * ns * 4);
  float *o = gk_malloc((size_t)R * inner * 4), *o1 = gk_malloc((size_t)R * inner * 4);
  gk_d2d(S1, S, 2 * ns * 4);
  gk_lstate ls[4];
  memset(ls, 0, sizeof ls);
  ls[0].p[GK_ST_S] = S; /* one launch */
  ls[1].p[GK_ST_S] = S + ns;
  ls[2].p[GK_ST_S] = S1; /* token by token */
  ls[3].p[GK_ST_S] = S1 + ns;
  gk_lstate *dls = dcopy(ls, sizeof ls);
  const int nseg = 2 + 2 * Tm;
  gk_seg *seg = xmalloc((size_t)nseg * sizeof *seg);
  seg[0] = (gk_seg){.ls = dls, .t0 = 0, .len = T1};
  seg[1] = (gk_seg){.ls = dls + 1, .t0 = T1, .len = T2};
  for (int u = 0; u < Tm; u++) {
    seg[2 + 2 * u] = (gk_seg){.ls = dls + 2, .t0 = u < T1 ? u : 0, .len = u < T1};
    seg[3 + 2 * u] = (gk_seg){.ls = dls + 3, .t0 = T1 + (u < T2 ? u : 0), .len = u < T2};
  }
  gk_seg *dseg = dcopy(seg, (size_t)nseg * sizeof *seg);
  int *tseg = gk_malloc((size_t)R * 4);
  gk_memset(tseg, 0, (size_t)R * 4);
  gk_batch b = {.seg = dseg, .tseg = tseg, .nseg = 2, .maxlen = Tm};
  int rc = gk_kda_recur(&b, qkv, g, bl, R, H, hd, o);
  for (int u = 0; u < Tm && !rc; u++) {
    gk_batch bt = {.seg = dseg + 2 + 2 * u, .tseg = tseg, .nseg = 2, .maxlen = 1};
    rc |= gk_kda_recur(&bt, qkv, g, bl, 2, H, hd, o1);
  }
  CHECK(rc == 0, "kda tiles: %s", gk_error());
  const int bits = !rc && dsame(o, o1, (size_t)R * inner) && dsame(S, S1, 2 * ns);
  /* CPU reference: state [dk][dv] per head */
  float *go = xmalloc((size_t)R * inner * 4), *gs = xmalloc(2 * ns * 4), *ro = xmalloc((size_t)R * inner * 4);
  float *rs = xmalloc(2 * ns * 4), *rsd = xmalloc(2 * ns * 4), a[256];
  for (int q = 0; q < 2; q++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < hd; i++)
        for (int j = 0; j < hd; j++) rs[q * ns + ((size_t)h * hd + i) * hd + j] = hs[q * ns + ((size_t)h * hd + j) * hd + i];
  for (int t = 0; t < R; t++) {
    const int q = t >= T1;
    for (int h = 0; h < H; h++) {
      const float *row = hq + (size_t)t * 3 * inner;
      for (int i = 0; i < hd; i++) a[i] = hg[(size_t)t * inner + h * hd + i];
      kda_step(rs + q * ns + (size_t)h * hd * hd, row + h * hd, row + inner + h * hd, row + 2 * inner + h * hd, a,
               1.0f / (1.0f + expf(-hb[(size_t)t * H + h])), hd, hd, ro + (size_t)t * inner + h * hd);
    }
  }
  for (int q = 0; q < 2; q++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < hd; i++)
        for (int j = 0; j < hd; j++) rsd[q * ns + ((size_t)h * hd + j) * hd + i] = rs[q * ns + ((size_t)h * hd + i) * hd + j];
  rc |= gk_d2h(go, o, (size_t)R * inner * 4) || gk_d2h(gs, S, 2 * ns * 4);
  const double eo = rc ? INFINITY : rel(go, ro, (size_t)R * inner), es = rc ? INFINITY : rel(gs, rsd, 2 * ns);
  CHECK(eo <= 1e-4 && es <= 1e-4, "kda tiles T %d+%d H %d hd %d: output err %.3g, state err %.3g (tol 1e-4)", T1, T2, H,
        hd, eo, es);
  CHECK(bits, "kda tiles T %d+%d hd %d: one launch differs from token-by-token launches", T1, T2, hd);
  printf("kda recurrence, 2 sequences of %d and %d tokens, H %d, hd %d: vs CPU output %.2g state %.2g (tol 1e-4); "
         "vs token by token bitwise %s\n", T1, T2, H, hd, eo, es, bits ? "yes" : "NO");
  free(seg); free(go); free(gs); free(ro); free(rs); free(rsd);
  free(hq); free(hg); free(hb); free(hs);
  gk_free(dseg); gk_free(tseg); gk_free(dls);
  gk_free(qkv); gk_free(g); gk_free(bl); gk_free(S); gk_free(S1); gk_free(o); gk_free(o1);
}

/* gk_mhc_post_moe against gk_moe_combine + gk_mhc_post; blocks of 256
 * threads with four elements each (D % 4 == 0) or one: D = 300 and 512
 * (4 per thread): blocks across tokens (per-element order); D = 302 (1 per
 * thread): blocks within a token (order in shared memory) and across;
 * D = 2048 (4 per thread): every block within a token; a token with a
 * repeated expert id */
static void mhc_post_moe_case(int D) {
  const int T = 5, hc = 4, K = 4;
  float *hX = NULL;
  float *X1 = dvec((size_t)T * hc * D, -1, 1, &hX), *X2 = gk_malloc((size_t)T * hc * D * 4);
  float *a1 = dvec((size_t)T * D, -1, 1, NULL), *a2 = gk_malloc((size_t)T * D * 4);
  float *eo = dvec((size_t)T * K * D, -1, 1, NULL), *wt = dvec((size_t)T * K, 0, 1, NULL);
  float *post = dvec((size_t)T * hc, 0, 2, NULL), *comb = dvec((size_t)T * hc * hc, 0, 1, NULL);
  const int idx[5 * 4] = {7, 2, 9, 0, -1, 3, 1, -1, 5, 4, 5, 8, -1, -1, -1, -1, 11, 10, 2, 12};
  int *didx = dcopy(idx, sizeof idx);
  gk_h2d(X2, hX, (size_t)T * hc * D * 4);
  gk_d2d(a2, a1, (size_t)T * D * 4);
  /* the same outputs stored in another row order, read through erow */
  int erow[5 * 4];
  for (int p = 0; p < T * K; p++) erow[p] = (p * 7 + 3) % (T * K);
  float *heo = xmalloc((size_t)T * K * D * 4), *heo2 = xmalloc((size_t)T * K * D * 4);
  gk_d2h(heo, eo, (size_t)T * K * D * 4);
  for (int p = 0; p < T * K; p++) memcpy(heo2 + (size_t)erow[p] * D, heo + (size_t)p * D, (size_t)D * 4);
  float *eo2 = dcopy(heo2, (size_t)T * K * D * 4), *X3 = dcopy(hX, (size_t)T * hc * D * 4);
  float *a3 = gk_malloc((size_t)T * D * 4);
  int *derow = dcopy(erow, sizeof erow);
  gk_d2d(a3, a2, (size_t)T * D * 4);
  int rc = gk_moe_combine(a1, eo, didx, wt, T, K, D) || gk_mhc_post(X1, a1, post, comb, T, hc, D) ||
           gk_mhc_post_moe(X2, a2, eo, 0, NULL, didx, wt, K, post, comb, T, hc, D) ||
           gk_mhc_post_moe(X3, a3, eo2, 0, derow, didx, wt, K, post, comb, T, hc, D);
  const int bits = !rc && dsame(X1, X2, (size_t)T * hc * D), bits2 = !rc && dsame(X1, X3, (size_t)T * hc * D);
  CHECK(rc == 0, "mhc post + moe: %s", gk_error());
  CHECK(bits, "mhc post with the MoE combine fused differs from combine + post");
  CHECK(bits2, "mhc post with the MoE combine through erow differs from combine + post");
  printf("mhc post with the MoE combine fused (D %d): bitwise %s; outputs read through erow: bitwise %s\n", D,
         bits ? "yes" : "NO", bits2 ? "yes" : "NO");
  { /* up to 64 tokens its latency form (every load ahead of the additions)
     * runs: the same bits as the occupancy form (gk_set_mhc_post_lat(0)) */
    float *X7 = dcopy(hX, (size_t)T * hc * D * 4), *a7 = gk_malloc((size_t)T * D * 4);
    gk_d2d(a7, a3, (size_t)T * D * 4);
    gk_set_mhc_post_lat(0);
    const int r7 = gk_mhc_post_moe(X7, a7, eo2, 0, derow, didx, wt, K, post, comb, T, hc, D);
    gk_set_mhc_post_lat(-1);
    const int b7 = !r7 && dsame(X7, X3, (size_t)T * hc * D);
    CHECK(b7, "mhc post + moe (D %d): the occupancy form differs from the latency form (rc %d: %s)", D, r7, gk_error());
    printf("mhc post with the MoE combine (D %d): latency and occupancy forms bitwise %s\n", D, b7 ? "yes" : "NO");
    gk_free(X7); gk_free(a7);
  }
  /* bf16 outputs (the MoE GEMM form's, gk_moe_bf16_out): the same bits as
   * combine + post of their fp32 widening */
  {
    uint16_t *h16 = xmalloc((size_t)T * K * D * 2);
    float *hw = xmalloc((size_t)T * K * D * 4);
    for (size_t i = 0; i < (size_t)T * K * D; i++) {
      h16[i] = f32_to_bf16(heo2[i]);
      hw[i] = bf16_to_f32(h16[i]);
    }
    float *wide = dcopy(hw, (size_t)T * K * D * 4), *X5 = dcopy(hX, (size_t)T * hc * D * 4),
          *X6 = dcopy(hX, (size_t)T * hc * D * 4), *a5 = gk_malloc((size_t)T * D * 4), *a6 = gk_malloc((size_t)T * D * 4);
    uint16_t *e16 = dcopy(h16, (size_t)T * K * D * 2);
    gk_d2d(a5, a3, (size_t)T * D * 4); /* a3: the shared expert's output, unchanged by the combine */
    gk_d2d(a6, a3, (size_t)T * D * 4);
    const int r16 = gk_mhc_post_moe(X5, a5, wide, 0, derow, didx, wt, K, post, comb, T, hc, D) ||
                    gk_mhc_post_moe(X6, a6, e16, 1, derow, didx, wt, K, post, comb, T, hc, D);
    const int b16 = !r16 && dsame(X5, X6, (size_t)T * hc * D);
    CHECK(r16 == 0, "mhc post + moe (bf16 outputs): %s", gk_error());
    CHECK(b16, "mhc post with bf16 MoE outputs differs from the same with their fp32 widening (D %d)", D);
    printf("mhc post with the MoE combine of bf16 outputs (D %d): bitwise as their fp32 widening %s\n", D, b16 ? "yes" : "NO");
    free(h16); free(hw);
    gk_free(wide); gk_free(X5); gk_free(X6); gk_free(a5); gk_free(a6); gk_free(e16);
  }
  /* the post fused with the next projection (tensor cores): X bitwise as
   * the post alone (MoE through erow, and the plain post of the combined
   * a1), mixraw / ssq within 2e-5 of gk_mhc_proj's (both 3xTF32 with
   * another column grouping; the tensor cores' fp32 accumulation is not
   * IEEE round-to-nearest: on an H100 the two differed by up to 4.2e-6,
   * against ~6e-7 each from float64 in the emulator) */
  const int n = hc * D, mix = 24;
  float *hfn = NULL, *dfn = dvec((size_t)mix * n, -0.02f, 0.02f, &hfn);
  const gpu_mat fn = {.fmt = WMAT_F32, .rows = mix, .cols = n, .d = dfn};
  float *m1 = gk_malloc((size_t)T * mix * 4), *m2 = gk_malloc((size_t)T * mix * 4), *s1 = gk_malloc((size_t)T * 4),
        *s2 = gk_malloc((size_t)T * 4);
  gk_set_mhc_fuse(1); /* opt-in */
  for (int moe = 1; moe >= 0; moe--) {
    float *X4 = dcopy(hX, (size_t)T * hc * D * 4), *a4 = gk_malloc((size_t)T * D * 4);
    gk_d2d(a4, moe ? a2 : a1, (size_t)T * D * 4); /* a2: the shared expert's output before the combine (unchanged by it) */
    const int rf_ = gk_mhc_post_proj(X4, a4, moe ? eo2 : NULL, derow, didx, wt, K, post, comb, T, hc, D, &fn, m2, s2);
    if (rf_ == 1) {
      CHECK(D % 4 || !gk_mhc_tc_on(), "mhc post+proj (D %d): not applicable", D);
      printf("mhc post + proj fused (D %d%s): not applicable (D %% 4 or no tensor-core form)\n", D, moe ? ", moe" : "");
    } else {
      const int rp = gk_mhc_proj(&fn, X1, T, hc, D, m1, s1);
      float hm1[5 * 24], hm2[5 * 24], hs1[5], hs2[5];
      const int ok = rf_ == 0 && rp == 0 && !gk_d2h(hm1, m1, sizeof hm1) && !gk_d2h(hm2, m2, sizeof hm2) &&
                     !gk_d2h(hs1, s1, sizeof hs1) && !gk_d2h(hs2, s2, sizeof hs2);
      const int xb = ok && dsame(X1, X4, (size_t)T * hc * D);
      const double em = ok ? rows_rel_diff(hm1, hm2, T, mix) : INFINITY, es = ok ? rows_rel_diff(hs1, hs2, 1, T) : INFINITY;
      CHECK(ok, "mhc post+proj (D %d): %s", D, gk_error());
      CHECK(xb, "mhc post+proj%s (D %d): X differs from the post alone", moe ? " (moe)" : "", D);
      CHECK(em <= 2e-5 && es <= 2e-5, "mhc post+proj (D %d): mixraw %.3g ssq %.3g from gk_mhc_proj (tol 2e-5)", D, em, es);
      printf("mhc post + proj fused (D %d%s): X bitwise %s, mixraw %.3g, ssq %.3g from gk_mhc_proj (tol 2e-5)\n", D,
             moe ? ", moe through erow" : "", xb ? "yes" : "NO", em, es);
    }
    gk_free(X4); gk_free(a4);
  }
  gk_set_mhc_fuse(-1);
  free(hfn); gk_free(dfn); gk_free(m1); gk_free(m2); gk_free(s1); gk_free(s2);
  free(hX); free(heo); free(heo2);
  gk_free(X1); gk_free(X2); gk_free(a1); gk_free(a2); gk_free(eo); gk_free(wt); gk_free(post); gk_free(comb); gk_free(didx);
  gk_free(eo2); gk_free(X3); gk_free(a3); gk_free(derow);
}

/* gk_matmul_heads on a long chunk (cuBLAS): bf16 heads evenly spaced in one
 * buffer (one strided-batched GEMM) and the same heads listed out of order
 * (per-head GEMMs), against a float64 loop over bf16-rounded x (1e-4) */
static void heads_case(void) {
  enum { H = 5, R = 48, C = 40, T = 37, LX = 44, LY = 50 };
  uint16_t *hw = xmalloc((size_t)H * R * C * 2);
  for (size_t i = 0; i < (size_t)H * R * C; i++) hw[i] = f32_to_bf16(rf());
  char *dw = dcopy(hw, (size_t)H * R * C * 2);
  float *hx = NULL, *dx = dvec((size_t)T * H * LX, -1, 1, &hx);
  float *dy = gk_malloc((size_t)T * H * LY * 4), *got = xmalloc((size_t)T * H * LY * 4);
  gpu_mat m[H];
  for (int order = 0; order < 2; order++) {
    for (int h = 0; h < H; h++) {
      const int src = order ? (h * 2) % H : h; /* order 1: head h's matrix is stored at slot src; the x/y heads follow */
      m[h] = (gpu_mat){.fmt = WMAT_BF16, .rows = R, .cols = C, .d = dw + (size_t)src * R * C * 2};
    }
    gpu_mat *dm = dcopy(m, sizeof m);
    gk_memset(dy, 0, (size_t)T * H * LY * 4);
    int rc = gk_matmul_heads(m, dm, H, dx, T, LX, dy, LY) || gk_d2h(got, dy, (size_t)T * H * LY * 4);
    double err = INFINITY;
    if (!rc) {
      float *want = xcalloc((size_t)T * H * LY, 4);
      for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
          const int src = order ? (h * 2) % H : h;
          for (int r = 0; r < R; r++) {
            double a = 0;
            for (int c = 0; c < C; c++)
              a += (double)bf16_to_f32(hw[((size_t)src * R + r) * C + c]) * round_bf16(hx[((size_t)t * H + h) * LX + c]);
            want[((size_t)t * H + h) * LY + r] = (float)a;
          }
        }
      err = rel(got, want, (size_t)T * H * LY);
      free(want);
    }
    CHECK(rc == 0, "matmul heads: %s", gk_error());
    CHECK(err <= 1e-4, "matmul heads (%s): err %g", order ? "per head" : "strided batch", err);
    printf("matmul heads, %d tokens (cuBLAS), %-13s err %-10.3g tol 1e-4 %s\n", T, order ? "per head" : "strided batch", err,
           err <= 1e-4 ? "ok" : "FAIL");
    gk_free(dm);
  }
  free(hw); free(hx); free(got);
  gk_free(dw); gk_free(dx); gk_free(dy);
}

/* gk_moe_sort: exactly the stable host order (ascending expert, then pair),
 * pairs routed to -1 left out; np spans several 256-pair chunks */
static void moe_sort_case(int np, int E) {
  int *idx = xmalloc((size_t)np * 4), *perm = xmalloc((size_t)np * 4);
  int *off = xmalloc(((size_t)E + 1) * 4), *want = xmalloc((size_t)np * 4), *woff = xcalloc((size_t)E + 1, 4);
  for (int p = 0; p < np; p++) idx[p] = rnd() % 11 == 0 ? -1 : (int)(rnd() % (uint64_t)(E > 3 ? E - 2 : E)); /* some experts unused */
  for (int p = 0; p < np; p++)
    if (idx[p] >= 0) woff[idx[p] + 1]++;
  for (int e = 0; e < E; e++) woff[e + 1] += woff[e];
  int q = 0;
  for (int e = 0; e < E; e++)
    for (int p = 0; p < np; p++)
      if (idx[p] == e) want[q++] = p;
  int *didx = dcopy(idx, (size_t)np * 4), *dperm = gk_malloc((size_t)np * 4), *doff = gk_malloc(((size_t)E + 1) * 4);
  int rc = gk_moe_sort(didx, np, E, dperm, doff) || gk_d2h(perm, dperm, (size_t)np * 4) || gk_d2h(off, doff, ((size_t)E + 1) * 4);
  int bad = rc != 0;
  for (int e = 0; e <= E && !bad; e++) bad |= off[e] != woff[e];
  for (int i = 0; i < q && !bad; i++) bad |= perm[i] != want[i];
  CHECK(rc == 0, "moe sort: %s", gk_error());
  CHECK(!bad, "moe sort %d pairs, %d experts: order differs from the stable host sort", np, E);
  printf("moe sort %5d pairs, %3d experts: %s\n", np, E, bad ? "DIFFERS" : "exact");
  free(idx); free(perm); free(off); free(want); free(woff);
  gk_free(didx); gk_free(dperm); gk_free(doff);
}

/* gk_moe_experts_gemm against a float64 loop that rounds x, the
 * (dequantised) weights and the SwiGLU output to bf16 as the GEMM form
 * does: 2e-3 of the largest output (summation order, and a rounding of h to
 * bf16 that may land one ulp apart). skew: expert counts far apart (bf16:
 * several padded buckets), else nearly even (one bucket). o16: the bf16
 * outputs (gk_moe_bf16_out): the reference also rounds gate and up, and
 * the tolerance takes the output's own rounding too (2e-3 + 2^-9). */
/* n outputs of eo (bf16 rows where o16) as floats on the host */
static int eo_host(const float *eo, size_t n, int o16, float *out) {
  if (!o16) return gk_d2h(out, eo, n * 4);
  uint16_t *t = xmalloc(n * 2);
  const int rc = gk_d2h(t, eo, n * 2);
  for (size_t i = 0; i < n && !rc; i++) out[i] = bf16_to_f32(t[i]);
  free(t);
  return rc;
}
static void moe_gemm_case(int fmt, int group, int skew, int D, int o16) {
  enum { E = 6, K = 3, T = 45, I = 96 };
  const float limit = 1.5f;
  tmat m[E * 3];
  gpu_mat h[E * 3];
  for (int e = 0; e < E; e++)
    for (int w = 0; w < 3; w++) {
      tmat_new(&m[e * 3 + w], fmt, w == 2 ? D : I, w == 2 ? I : D, group, 1, 0);
      h[e * 3 + w] = m[e * 3 + w].g;
    }
  float *hx = NULL, *dx = dvec((size_t)T * D, -1, 1, &hx);
  int idx[T * K];
  for (int t = 0; t < T; t++) /* distinct experts per token, some pairs -1, expert E-1 unused */
    for (int j = 0; j < K; j++)
      idx[t * K + j] = (t + 2 * j) % 5 == 4 ? -1 : skew ? (j + (t % 4 == 0 ? t / 4 % 3 : 0)) % (E - 1) : (t + j) % (E - 1);
  const size_t PR = gk_moe_gemm_rows(T * K);
  int *didx = dcopy(idx, sizeof idx), *perm = gk_malloc(sizeof idx), *erow = gk_malloc(sizeof idx), *doff = gk_malloc((E + 1) * 4);
  float *g = gk_malloc(PR * I * 4), *u = gk_malloc(PR * I * 4), *eo = gk_malloc(PR * D * 4);
  int hoff[E + 1], herow[T * K];
  float *got = xmalloc(PR * D * 4);
  gk_set_moe_bf16_out(o16);
  int rc = gk_moe_sort(didx, T * K, E, perm, doff) || gk_d2h(hoff, doff, sizeof hoff) ||
           gk_moe_experts_gemm(h, E, hoff, doff, perm, didx, K, dx, D, T, D, I, limit, g, u, eo, erow) ||
           eo_host(eo, PR * D, o16, got) || gk_d2h(herow, erow, sizeof herow);
  /* the gather from the fp32 rows instead of their bf16 copy: the same bits */
  float *got2 = xmalloc(PR * D * 4);
  gk_set_moe_x16(0);
  const int rc2 = rc || gk_moe_experts_gemm(h, E, hoff, doff, perm, didx, K, dx, D, T, D, I, limit, g, u, eo, erow) ||
                  eo_host(eo, PR * D, o16, got2);
  gk_set_moe_x16(-1);
  int same16 = !rc2;
  for (int q = 0; q < T * K && same16; q++) /* the pairs' rows (padding rows are never read) */
    if (idx[q] >= 0) same16 = !memcmp(got + (size_t)herow[q] * D, got2 + (size_t)herow[q] * D, (size_t)D * 4);
  CHECK(same16, "moe gemm D %d: the gather from fp32 rows differs from the bf16 copy's", D);
  /* the gather from x's registered bf16 rows (gk_xb_alias, as the mHC pre's
   * y16), where the rows allow it: zeros registered give zero outputs (the
   * rows are read), x's rounding the same bits again */
  if (D % 8 == 0) {
    uint16_t *h16 = xcalloc((size_t)T * D, 2);
    uint16_t *d16 = dcopy(h16, (size_t)T * D * 2);
    int zero = 1, samea = 1;
    for (int pass = 0; pass < 2; pass++) {
      if (pass) {
        for (size_t i = 0; i < (size_t)T * D; i++) h16[i] = f32_to_bf16(hx[i]);
        gk_h2d(d16, h16, (size_t)T * D * 2);
      }
      gk_xb_alias(dx, T, D, d16);
      const int rc3 = rc || gk_moe_experts_gemm(h, E, hoff, doff, perm, didx, K, dx, D, T, D, I, limit, g, u, eo, erow) ||
                      eo_host(eo, PR * D, o16, got2);
      gk_xb_alias(NULL, 0, 0, NULL);
      for (int q = 0; q < T * K; q++) {
        if (idx[q] < 0) continue;
        const float *r3 = got2 + (size_t)herow[q] * D;
        if (pass) samea &= !rc3 && !memcmp(got + (size_t)herow[q] * D, r3, (size_t)D * 4);
        else
          for (int d = 0; d < D; d++) zero &= !rc3 && r3[d] == 0.f;
      }
    }
    CHECK(zero, "moe gemm D %d: the gather did not read x's registered bf16 rows", D);
    CHECK(samea, "moe gemm D %d: the gather from x's registered bf16 rows differs", D);
    free(h16);
    gk_free(d16);
  }
  gk_set_moe_bf16_out(-1);
  free(got2);
  double err = INFINITY;
  if (!rc) {
    float *ref = xcalloc((size_t)T * K * D, 4), *gotp = xcalloc((size_t)T * K * D, 4);
    float *wg = xmalloc((size_t)E * I * D * 4), *wu = xmalloc((size_t)E * I * D * 4), *wd = xmalloc((size_t)E * D * I * 4);
    for (int e = 0; e < E; e++)
      for (int r = 0; r < I; r++) {
        wmat_get_row(&m[e * 3].w, r, wg + ((size_t)e * I + r) * D);
        wmat_get_row(&m[e * 3 + 1].w, r, wu + ((size_t)e * I + r) * D);
      }
    for (int e = 0; e < E; e++)
      for (int r = 0; r < D; r++) wmat_get_row(&m[e * 3 + 2].w, r, wd + ((size_t)e * D + r) * I);
    for (size_t i = 0; i < (size_t)E * I * D; i++) { wg[i] = round_bf16(wg[i]); wu[i] = round_bf16(wu[i]); wd[i] = round_bf16(wd[i]); }
    for (int p = 0; p < T * K; p++) {
      const int e = idx[p];
      if (e < 0) continue;
      double hh[I];
      for (int i = 0; i < I; i++) {
        double a = 0, b = 0;
        for (int d = 0; d < D; d++) {
          const double xv = round_bf16(hx[(size_t)(p / K) * D + d]);
          a += xv * wg[((size_t)e * I + i) * D + d];
          b += xv * wu[((size_t)e * I + i) * D + d];
        }
        if (o16) a = round_bf16((float)a), b = round_bf16((float)b);
        hh[i] = round_bf16(swiglu_clamped((float)a, (float)b, limit));
      }
      for (int d = 0; d < D; d++) {
        double o = 0;
        for (int i = 0; i < I; i++) o += hh[i] * wd[((size_t)e * D + d) * I + i];
        ref[(size_t)p * D + d] = (float)o;
      }
      if (herow[p] >= 0 && (size_t)herow[p] < PR) memcpy(gotp + (size_t)p * D, got + (size_t)herow[p] * D, D * 4);
    }
    err = rel(gotp, ref, (size_t)T * K * D);
    free(ref); free(gotp); free(wg); free(wu); free(wd);
  }
  char nm[64];
  snprintf(nm, sizeof nm, "%s g%d D%d %s counts, %s out", fname(fmt), fmt >= WMAT_Q8 ? group : 0, D,
           skew ? "skewed" : "even", o16 ? "bf16" : "f32");
  const double tol = o16 ? 2e-3 + 1.0 / 512 : 2e-3;
  CHECK(rc == 0, "moe gemm %s: %s", nm, gk_error());
  CHECK(err <= tol, "moe gemm %s: err %g > %g", nm, err, tol);
  printf("moe gemm (sorted pairs, bf16 GEMMs) %-38s err %-10.3g tol %.3g %s\n", nm, err, tol, err <= tol ? "ok" : "FAIL");
  for (int i = 0; i < E * 3; i++) tmat_free(&m[i]);
  free(hx); free(got);
  gk_free(dx); gk_free(didx); gk_free(perm); gk_free(erow); gk_free(doff); gk_free(g); gk_free(u); gk_free(eo);
}

/* the indexer scores of one sequence's chunk, GEMM form and kernel form,
 * against a float64 loop over the tokens that see more than K complete
 * pools (the others are not scored); pos0 > 0 puts the first scored token
 * inside the chunk or before it */
static void idx_gemm_case(int nh, int hd, int P, int K, int pos0, int T) {
  const int ctx = pos0 + T, npool = ctx / P, maxpool = npool + 3;
  float *hq = NULL, *hw = NULL, *hp = NULL;
  float *dq = dvec((size_t)T * nh * hd, -1, 1, &hq), *dw = dvec((size_t)T * nh, -1, 1, &hw);
  float *dp = dvec((size_t)npool * hd, -1, 1, &hp);
  float *ref = xmalloc((size_t)T * maxpool * 4), *got = xmalloc((size_t)T * maxpool * 4);
  const double s = 1.0 / sqrt((double)hd), ws = 1.0 / sqrt((double)nh);
  for (int t = 0; t < T; t++) {
    const int n = (pos0 + t + 1) / P;
    for (int p = 0; p < maxpool; p++) {
      double acc = 0;
      if (n > K && p < n)
        for (int h = 0; h < nh; h++) {
          double d = 0;
          for (int i = 0; i < hd; i++) d += (double)hq[((size_t)t * nh + h) * hd + i] * hp[(size_t)p * hd + i];
          d *= s;
          if (d > 0) acc += hw[(size_t)t * nh + h] * ws * d;
        }
      ref[(size_t)t * maxpool + p] = (float)acc; /* unscored entries stay 0 (the memset below) */
    }
  }
  /* the kernel form reads the pooled keys through a page table: 4 pools a
   * page, the pages in reverse order */
  float *pbuf = NULL;
  void *ptab = gpu_pages_make(hp, npool, hd, 2, talloc, NULL, &pbuf);
  CHECK(ptab != NULL, "paged pool keys: %s", gk_error());
  gk_lstate ls = {0};
  ls.pg[GK_ST_POOL] = ptab;
  ls.pshift = 2;
  gk_lstate *dls = dcopy(&ls, sizeof ls);
  gk_seg seg = {.ls = dls, .t0 = 0, .len = T, .pos0 = pos0};
  gk_seg *dseg = dcopy(&seg, sizeof seg);
  int *tseg = gk_malloc((size_t)T * 4), *dpos = dcopy(&pos0, 4);
  gk_memset(tseg, 0, (size_t)T * 4);
  gk_batch b = {.seg = dseg, .tseg = tseg, .nseg = 1, .maxlen = T};
  float *dsc = gk_malloc((size_t)T * maxpool * 4);
  for (int form = 0; form < 2; form++) {
    gk_memset(dsc, 0, (size_t)T * maxpool * 4);
    int rc = form ? gk_indexer_scores(dq, dw, &b, T, P, nh, hd, K, maxpool, dsc)
                  : gk_indexer_scores_gemm(dq, dw, dp, T, dpos, pos0, P, nh, hd, K, maxpool, dsc);
    if (rc == 1) { printf("indexer gemm form: not in this build\n"); continue; }
    double err = INFINITY;
    if (!rc && !gk_d2h(got, dsc, (size_t)T * maxpool * 4)) err = rel(got, ref, (size_t)T * maxpool);
    CHECK(rc == 0, "indexer scores: %s", gk_error());
    CHECK(err <= 1e-5, "indexer scores %s nh %d hd %d P %d K %d pos0 %d T %d: err %g > 1e-5", form ? "kernel" : "gemm", nh, hd, P, K,
          pos0, T, err);
    printf("indexer scores %-6s nh %-2d hd %-3d P%d K%-3d pos0 %-4d T%-4d err %-10.3g tol 1e-5 %s\n", form ? "kernel" : "gemm", nh,
           hd, P, K, pos0, T, err, err <= 1e-5 ? "ok" : "FAIL");
  }
  free(hq); free(hw); free(hp); free(ref); free(got);
  gk_free(dq); gk_free(dw); gk_free(dp); gk_free(dls); gk_free(dseg); gk_free(tseg); gk_free(dpos); gk_free(dsc);
  gk_free(pbuf); gk_free(ptab);
}

/* gk_mla_attn_gemm on selections of one sequence (the cache prefix while
 * fewer than K pools are complete, K pools + the tail after) in every
 * arithmetic, against a float64 loop (tolerance gk_mla_math_tol); shapes
 * whose padded rows take each softmax variant (256 x 1..16 rows in
 * registers, three passes past 4096; 256 x 1..32 for the splits) and both
 * forms of the splits (masked over every row, gathered) */
static void mla_gemm_case(int H, int kl, int P, int K, int pos0, int T) {
  const int ctx = pos0 + T;
  float *hq = NULL, *hl = NULL, *dq = dvec((size_t)T * H * kl, -1, 1, &hq), *dl = dvec((size_t)ctx * kl, -1, 1, &hl);
  int *dense = xmalloc(T * 4), *np = xmalloc(T * 4), *tail = xmalloc(T * 4), *pools = xmalloc((size_t)T * K * 4);
  for (int t = 0; t < T; t++) {
    const int pos = pos0 + t, n = (pos + 1) / P;
    dense[t] = n <= K;
    np[t] = n <= K ? n : K;
    tail[t] = n * P;
    for (int i = 0; i < K; i++) /* distinct complete pools: t + i * floor(n / K) mod n */
      pools[(size_t)t * K + i] = n <= K ? i : (int)(((uint64_t)t + (uint64_t)i * (n / K)) % (uint64_t)n);
  }
  int *dd = dcopy(dense, T * 4), *dn = dcopy(np, T * 4), *dt = dcopy(tail, T * 4), *dp = dcopy(pools, (size_t)T * K * 4);
  int *dpos = dcopy(&pos0, 4);
  float *ob = gk_malloc((size_t)T * H * kl * 4), *got = xmalloc((size_t)T * H * kl * 4), *ref = xmalloc((size_t)T * H * kl * 4);
  const double scale = 1.0 / sqrt((double)kl);
  int *rows = xmalloc((size_t)ctx * 4);
  double *sc = xmalloc((size_t)ctx * 8), *o = xmalloc((size_t)kl * 8);
  for (int t = 0; t < T; t++) {
    const int pos = pos0 + t;
    int N = 0;
    if (dense[t]) for (int j = 0; j <= pos; j++) rows[N++] = j;
    else {
      for (int i = 0; i < np[t]; i++) for (int q = 0; q < P; q++) rows[N++] = pools[(size_t)t * K + i] * P + q;
      for (int j = tail[t]; j <= pos; j++) rows[N++] = j;
    }
    for (int hh = 0; hh < H; hh++) {
      const float *q = hq + ((size_t)t * H + hh) * kl;
      double mx = -INFINITY, z = 0;
      for (int s = 0; s < N; s++) {
        double a = 0;
        for (int j = 0; j < kl; j++) a += (double)q[j] * hl[(size_t)rows[s] * kl + j];
        sc[s] = a * scale;
        mx = fmax(mx, sc[s]);
      }
      for (int j = 0; j < kl; j++) o[j] = 0;
      for (int s = 0; s < N; s++) {
        const double e = exp(sc[s] - mx);
        z += e;
        for (int j = 0; j < kl; j++) o[j] += e * hl[(size_t)rows[s] * kl + j];
      }
      for (int j = 0; j < kl; j++) ref[((size_t)t * H + hh) * kl + j] = (float)(o[j] / z);
    }
  }
  for (int tf = GK_MLA_NMATH - 1; tf >= GK_MLA_FP32; tf--) { /* bf16x4, bf16x3, bf16x9 emulation, TF32, fp32 */
    gk_set_mla_math(tf);
    gk_memset(ob, 0x7f, (size_t)T * H * kl * 4);
    int rc = gk_mla_attn_gemm(dq, dl, dd, dn, dt, dp, T, dpos, pos0, H, kl, P, K, (float)scale, ob);
    double err = INFINITY;
    if (rc == 1) { printf("mla gemm form: not in this build\n"); break; }
    if (!rc && !gk_d2h(got, ob, (size_t)T * H * kl * 4)) err = rel(got, ref, (size_t)T * H * kl);
    const double tol = gk_mla_math_tol(tf);
    const char *nm = gk_mla_math() == tf ? gk_mla_math_name(tf) : "bf16x9 not offered: fp32";
    CHECK(rc == 0, "mla gemm %s: %s", nm, gk_error());
    CHECK(err <= tol, "mla gemm H%d kl%d P%d K%d pos0 %d T%d %s: err %g > %g", H, kl, P, K, pos0, T, nm, err, tol);
    printf("mla gemm form H%d kl%d P%d K%-4d pos0 %-4d T%-3d %-8s err %-10.3g tol %-6.0e %s\n", H, kl, P, K, pos0, T, nm, err,
           tol, err <= tol ? "ok" : "FAIL");
  }
  gk_set_mla_math(-1);
  free(hq); free(hl); free(dense); free(np); free(tail); free(pools); free(got); free(ref); free(rows); free(sc); free(o);
  gk_free(dq); gk_free(dl); gk_free(dd); gk_free(dn); gk_free(dt); gk_free(dp); gk_free(dpos); gk_free(ob);
}

/* gk_mla_mha_gemm (the per-head form) against a float64 loop of the
 * absorbed math from the same inputs: q rounded to bf16 (the form rounds it
 * as the absorbed W_UK product does), kv_b's values (bf16, or Q8 rounded to
 * bf16 as every prefill GEMM dequantises), the latent and softmax exact.
 * Tolerance gk_mla_math_tol(bf16x3). Shapes: the model's head widths, a
 * masked selection (K pools + tail past K * P positions), a later chunk,
 * odd small widths; then the cases that must decline (1): another
 * arithmetic, the switch off, an f32 kv_b, a context past the row bound. */
/* The fused MLA kernel's two wgmma product forms alone (gk_wgmma_check):
 * scores-like (both operands K-major in shared memory) and output-like (A
 * in registers, B MN-major), against float64 on random bf16 operands. The
 * arithmetic is exact products summed in fp32: tolerance 1e-5 of the
 * largest |D|. Where the device has no wgmma, says so. */
static void wgmma_case(void) {
  uint16_t a[64 * 16], b[16 * 64];
  for (int i = 0; i < 64 * 16; i++) a[i] = f32_to_bf16(rf());
  for (int i = 0; i < 16 * 64; i++) b[i] = f32_to_bf16(rf());
  uint16_t *da = dcopy(a, sizeof a), *db = dcopy(b, sizeof b);
  float *d1 = gk_malloc(64 * 64 * 4), *d2 = gk_malloc(64 * 32 * 4), h1[64 * 64], h2[64 * 32], r1[64 * 64], r2[64 * 32];
  int rc = gk_wgmma_check(da, db, d1, d2, 0);
  if (rc == 1) printf("wgmma check: no wgmma on this device or build\n");
  else {
    for (int r = 0; r < 64; r++)
      for (int n = 0; n < 64; n++) {
        double acc = 0;
        for (int k = 0; k < 16; k++) acc += (double)bf16_to_f32(a[r * 16 + k]) * bf16_to_f32(b[k * 64 + n]);
        r1[r * 64 + n] = (float)acc;
        if (n < 32) r2[r * 32 + n] = (float)acc;
      }
    /* mode 0 the no-swizzle layout, 1 its LBO and SBO exchanged (printed
     * only: a layout diagnostic), 2 the fused kernel's 128-byte swizzle */
    static const char *what[] = {"", " (LBO and SBO swapped, expected wrong)", " (128-byte swizzle)"};
    for (int mode = 0; mode < 3; mode++) {
      if (mode) rc = gk_wgmma_check(da, db, d1, d2, mode);
      CHECK(rc == 0 && !gk_d2h(h1, d1, sizeof h1) && !gk_d2h(h2, d2, sizeof h2), "wgmma check: %s", gk_error());
      const double e1 = rel(h1, r1, 64 * 64), e2 = rel(h2, r2, 64 * 32);
      if (mode != 1) {
        CHECK(e1 <= 1e-5, "wgmma m64n64k16%s, both operands K-major in shared memory: err %g > 1e-5", what[mode], e1);
        CHECK(e2 <= 1e-5, "wgmma m64n32k16%s, A in registers, B MN-major: err %g > 1e-5", what[mode], e2);
      }
      printf("wgmma check%s: K-major smem x smem err %.3g, registers x MN-major smem err %.3g (tol 1e-5) %s\n", what[mode],
             e1, e2, mode == 1 ? "" : e1 <= 1e-5 && e2 <= 1e-5 ? "ok" : "FAIL");
    }
  }
  gk_free(da);
  gk_free(db);
  gk_free(d1);
  gk_free(d2);
}

static void mla_mha_case(int fmt, int H, int nope, int vd, int kl, int P, int K, int pos0, int T) {
  const int ctx = pos0 + T, R = H * (nope + vd);
  tmat W;
  tmat_new(&W, fmt, R, kl, fmt == WMAT_Q8 ? 32 : 0, 1, 0);
  float *hq = NULL, *hl = NULL, *dq = dvec((size_t)T * H * nope, -1, 1, &hq), *dl = dvec((size_t)ctx * kl, -1, 1, &hl);
  float *w = xmalloc((size_t)R * kl * 4);
  for (int r = 0; r < R; r++) {
    wmat_get_row(&W.w, r, w + (size_t)r * kl);
    for (int j = 0; j < kl; j++) w[(size_t)r * kl + j] = round_bf16(w[(size_t)r * kl + j]);
  }
  int *dense = xmalloc(T * 4), *np = xmalloc(T * 4), *tail = xmalloc(T * 4), *pools = xmalloc((size_t)T * K * 4);
  for (int t = 0; t < T; t++) {
    const int pos = pos0 + t, n = (pos + 1) / P;
    dense[t] = n <= K;
    np[t] = n <= K ? n : K;
    tail[t] = n * P;
    for (int i = 0; i < K; i++)
      pools[(size_t)t * K + i] = n <= K ? i : (int)(((uint64_t)t + (uint64_t)i * (n / K)) % (uint64_t)n);
  }
  int *dd = dcopy(dense, T * 4), *dn = dcopy(np, T * 4), *dt = dcopy(tail, T * 4), *dp = dcopy(pools, (size_t)T * K * 4);
  int *dpos = dcopy(&pos0, 4);
  const size_t no = (size_t)T * H * vd;
  float *dout = gk_malloc(no * 4), *got = xmalloc(no * 4), *ref = xmalloc(no * 4);
  const double scale = 1.0 / sqrt((double)nope);
  int *rows = xmalloc((size_t)ctx * 4);
  double *sc = xmalloc((size_t)ctx * 8), *o = xmalloc((size_t)kl * 8), *qt = xmalloc((size_t)kl * 8);
  for (int t = 0; t < T; t++) {
    const int pos = pos0 + t;
    int N = 0;
    if (dense[t]) for (int j = 0; j <= pos; j++) rows[N++] = j;
    else {
      for (int i = 0; i < np[t]; i++) for (int u = 0; u < P; u++) rows[N++] = pools[(size_t)t * K + i] * P + u;
      for (int j = tail[t]; j <= pos; j++) rows[N++] = j;
    }
    for (int h = 0; h < H; h++) {
      const float *q = hq + ((size_t)t * H + h) * nope, *uk = w + (size_t)h * (nope + vd) * kl, *uv = uk + (size_t)nope * kl;
      for (int j = 0; j < kl; j++) qt[j] = 0;
      for (int i = 0; i < nope; i++)
        for (int j = 0; j < kl; j++) qt[j] += (double)round_bf16(q[i]) * uk[(size_t)i * kl + j];
      double mx = -INFINITY, z = 0;
      for (int s = 0; s < N; s++) {
        double a = 0;
        for (int j = 0; j < kl; j++) a += qt[j] * hl[(size_t)rows[s] * kl + j];
        sc[s] = a * scale;
        mx = fmax(mx, sc[s]);
      }
      for (int j = 0; j < kl; j++) o[j] = 0;
      for (int s = 0; s < N; s++) {
        const double e = exp(sc[s] - mx);
        z += e;
        for (int j = 0; j < kl; j++) o[j] += e * hl[(size_t)rows[s] * kl + j];
      }
      for (int d = 0; d < vd; d++) {
        double a = 0;
        for (int j = 0; j < kl; j++) a += uv[(size_t)d * kl + j] * (o[j] / z);
        ref[((size_t)t * H + h) * vd + d] = (float)a;
      }
    }
  }
  gk_set_mla_math(GK_MLA_BF16X3);
  int rc = 0;
  double err = INFINITY;
  const double tol = gk_mla_math_tol(GK_MLA_BF16X3);
  /* the fused kernels where they take the widths (wgmma where the device
   * has it, with 32 keys per tile in two stages and 64 in one; mma.sync
   * with 32, 64 keys per tile), then the batched GEMMs */
  for (int v = -1; v < 4 && rc != 1; v++) {
    const int fl = v < 3;
    if (fl && !gk_mla_flash_fits(nope, vd, P)) continue;
    gk_set_mla_flash(fl);
    gk_set_mla_flash_wg(v <= 0);
    if (v <= 0 && !gk_mla_flash_wg()) continue;
    gk_set_mla_flash_wg_bn(v == -1 ? 32 : 64);
    gk_set_mla_flash_bn(v == 2 ? 64 : 32);
    gk_memset(dout, 0x7f, no * 4);
    rc = gk_mla_mha_gemm(dq, dl, &W.g, dd, dn, dt, dp, T, dpos, pos0, H, nope, vd, kl, P, K, (float)scale, dout);
    err = INFINITY;
    if (!rc && !gk_d2h(got, dout, no * 4)) err = rel(got, ref, no);
    if (rc == 1) break;
    const char *form = !fl ? "gemms" : v == -1 ? "fused-wgmma32x2" : v == 0 ? "fused-wgmma" : v == 2 ? "fused64" : "fused32";
    CHECK(rc == 0, "mla mha %s: %s", form, gk_error());
    CHECK(err <= tol, "mla mha %s %s H%d nope%d vd%d kl%d P%d K%d pos0 %d T%d: err %g > %g", form, fname(fmt), H, nope, vd, kl,
          P, K, pos0, T, err, tol);
    printf("mla mha form %s %-4s H%-2d nope%-3d vd%-3d kl%-3d P%d K%-4d pos0 %-4d T%-3d err %-10.3g tol %-6.0e %s\n", form,
           fname(fmt), H, nope, vd, kl, P, K, pos0, T, err, tol, err <= tol ? "ok" : "FAIL");
    if (rc == 0) { /* bf16 rows asked for: the fused kernels write the fp32 output's rounding, the GEMMs decline */
      int o16 = 1;
      uint16_t *h16 = xmalloc(no * 2);
      const int r16 = gk_mla_mha_gemm_out(dq, NULL, dl, &W.g, dd, dn, dt, dp, T, dpos, pos0, H, nope, vd, kl, P, K,
                                          (float)scale, dout, &o16) ||
                      (o16 ? gk_d2h(h16, dout, no * 2) : gk_d2h(got, dout, no * 4));
      size_t bad = 0;
      for (size_t i = 0; i < no && !r16 && o16; i++) bad += h16[i] != f32_to_bf16(got[i]);
      CHECK(r16 == 0 && o16 == fl && !bad, "mla mha %s with bf16 rows asked for: rc %d, bf16 %d, %zu differ", form, r16, o16,
            bad);
      printf("mla mha form %s, bf16 rows asked for: %s\n", form,
             o16 ? (bad ? "bf16, NOT the fp32 rounding" : "bf16, the fp32 output's rounding") : "fp32 (declined)");
      free(h16);
      /* the queries given in bf16 (gk_mla_q16, the host's rounding of q):
       * the fused kernels give the fp32 queries' bits; the GEMMs are not
       * offered the buffer */
      gk_set_mla_q16(1); /* (whatever the environment says) */
      void *q16 = gk_mla_q16(&W.g, T, pos0, H, nope, vd, kl, P, K);
      gk_set_mla_q16(-1);
      CHECK(!q16 == !fl, "mla mha %s: gk_mla_q16 %s", form, q16 ? "offered for the GEMMs" : "declined for the fused kernel");
      if (q16) {
        const size_t nq = (size_t)T * H * nope;
        uint16_t *hq16 = xmalloc(nq * 2);
        for (size_t i = 0; i < nq; i++) hq16[i] = f32_to_bf16(hq[i]);
        float *o2 = gk_malloc(no * 4);
        int z16 = 0;
        const int rq = gk_h2d(q16, hq16, nq * 2) || gk_memset(o2, 0x7f, no * 4) ||
                       gk_mla_mha_gemm_out(NULL, q16, dl, &W.g, dd, dn, dt, dp, T, dpos, pos0, H, nope, vd, kl, P, K,
                                           (float)scale, o2, &z16);
        float *g2 = xmalloc(no * 4); /* against got: the first call's fp32 output (dout holds bf16 rows now) */
        const int same = !rq && !z16 && !gk_d2h(g2, o2, no * 4) && !memcmp(g2, got, no * 4);
        free(g2);
        CHECK(same, "mla mha %s from bf16 queries: rc %d, differs from the fp32 queries' output", form, rq);
        printf("mla mha form %s from bf16 queries (gk_mla_q16): bitwise as from fp32 queries %s\n", form, same ? "yes" : "NO");
        free(hq16);
        gk_free(o2);
      }
    }
  }
  gk_set_mla_flash(-1);
  gk_set_mla_flash_wg(-1);
  gk_set_mla_flash_wg_bn(-1);
  gk_set_mla_flash_bn(-1);
  if (rc == 1) printf("mla mha form: not in this build\n");
  else {
    /* the cases it declines, leaving the output alone */
    gk_set_mla_math(GK_MLA_BF16X4);
    CHECK(gk_mla_mha_gemm(dq, dl, &W.g, dd, dn, dt, dp, T, dpos, pos0, H, nope, vd, kl, P, K, (float)scale, dout) == 1,
          "mla mha: bf16x4 not declined");
    gk_set_mla_math(GK_MLA_BF16X3);
    gk_set_mla_mha(0);
    CHECK(gk_mla_mha_gemm(dq, dl, &W.g, dd, dn, dt, dp, T, dpos, pos0, H, nope, vd, kl, P, K, (float)scale, dout) == 1,
          "mla mha: switch off not declined");
    gk_set_mla_mha(-1);
    gpu_mat f = W.g;
    f.fmt = WMAT_F32;
    CHECK(gk_mla_mha_gemm(dq, dl, &f, dd, dn, dt, dp, T, dpos, pos0, H, nope, vd, kl, P, K, (float)scale, dout) == 1,
          "mla mha: f32 kv_b not declined");
    const int K1 = 1; /* selections of 2 pools: a context past 4 x 2 P rows */
    CHECK(ctx <= 8 * P || gk_mla_mha_gemm(dq, dl, &W.g, dd, dn, dt, dp, T, dpos, pos0, H, nope, vd, kl, P, K1, (float)scale,
                                          dout) == 1,
          "mla mha: context past the row bound not declined");
    CHECK(gk_d2h(got, dout, no * 4) == 0 && rel(got, ref, no) == err, "mla mha: a declined call wrote its output");
  }
  gk_set_mla_math(-1);
  tmat_free(&W);
  free(hq); free(hl); free(w); free(dense); free(np); free(tail); free(pools); free(got); free(ref); free(rows); free(sc);
  free(o); free(qt);
  gk_free(dq); gk_free(dl); gk_free(dd); gk_free(dn); gk_free(dt); gk_free(dp); gk_free(dpos); gk_free(dout);
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

  gk_set_gemv_xs(2);        /* stage x for Q8 as well as Q4: each staged result is compared with x from global memory */
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
  /* fused launches, with PDL on (the default where supported) and off */
  for (int pdl = 1; pdl >= 0; pdl--) {
    gk_force_pdl_off(!pdl);
    gk_set_gemv_xs(pdl ? 2 : 0);
    printf("-- fused launches, PDL %s, x staging %s\n", pdl && gk_pdl_supported() ? "on" : "off", pdl ? "Q8+Q4" : "off");
    gk_set_gemm_min(1 << 30);
    multi_case(1, 9);
    grouped_case(WMAT_Q4, 32, 256, 1024);
    grouped_case(WMAT_Q4, 128, 70, 2048);
    grouped_case(WMAT_Q8, 32, 96, 1024);
    grouped_case(WMAT_BF16, 0, 130, 520);
    grouped_case(WMAT_F32, 0, 40, 1000);
    rmsnorm2_case(1, 1536, 512);
    rmsnorm2_case(5, 2048, 512);
    route_group_case(16, 8, 1, 1);
    route_group_case(288, 8, 8, 4);
    route_group_case(5, 8, 1, 1); /* top-k above the expert count: pairs routed to -1 */
    route_fuse_case(WMAT_F32, 16, 8, 1, 1, 1, 0);
    route_fuse_case(WMAT_F32, 288, 8, 1, 1, 1, 0);
    route_fuse_case(WMAT_BF16, 288, 8, 1, 1, 1, 1);
    route_fuse_case(WMAT_BF16, 16, 8, 1, 1, 3, 1);
    route_fuse_case(WMAT_F32, 288, 8, 8, 4, 9, 0); /* groups; more tokens than the route's warps */
    route_fuse_case(WMAT_Q8, 5, 8, 1, 1, 2, 0);    /* top-k above the expert count */
    idx_fuse_case();
    gk_set_gemm_min(0);
    kda_gated_case(-5.0f, 6);  /* the gate computed as tiles are read */
    kda_gated_case(NAN, 6);
    kda_gated_case(-5.0f, 70); /* the decay computed first, tiles copied asynchronously */
    kda_gated_case(NAN, 70);
    kda_out_fuse_case(128, 0);
    kda_out_fuse_case(128, 1);
    kda_out_fuse_case(64, 0);
    mhc_post_moe_case(300);
    mhc_post_moe_case(512);
    mhc_post_moe_case(302);
    mhc_post_moe_case(2048);
  }
  gk_force_pdl_off(0);
  gk_set_gemv_xs(-1);
  /* recurrence tiles (cp.async double buffers of 14, 32 and 7 tokens; one
   * synchronous buffer of 32 for hd % 4 != 0); blocks of 32 columns, warps
   * of 8: hd 40 leaves a block with one warp's columns, hd 30 a warp with 6 */
  /* every layout (GLM53_GPU_KDA_LAYOUT): g4, the default, on all shapes
   * (hd 40, 256 and 30 take w4), the others on the model's head dim and
   * one smaller (g: 8 lanes per column with 4, 2, 1 columns per group; x:
   * 16 lanes per column with 4 or 2; y4: 32 lanes with 4; w: 32 lanes per
   * column, 4 or 8 per warp) */
  static const int lay[8] = {GK_KR_G4, GK_KR_G2, GK_KR_G1, GK_KR_X4, GK_KR_X2, GK_KR_Y4, GK_KR_W4, GK_KR_W8};
  static const char *lnm[8] = {"g4", "g2", "g1", "x4", "x2", "y4", "w4", "w8"};
  for (int v = 0; v < 8; v++) {
    gk_set_kda_layout(lay[v]);
    printf("kda recurrence, layout %s:\n", lnm[v]);
    kda_tiles_case(70, 57, 2, 128);
    kda_tiles_case(45, 32, 3, v < 6 ? 64 : 40); /* y4 at hd 64: g4 */
    if (v >= 3 && v <= 5) { /* x / y at head dims they do not take: g4 at 32, w4 at 40 */
      kda_tiles_case(33, 21, 2, 32);
      kda_tiles_case(33, 20, 2, 40);
    }
    if (!v) {
      kda_tiles_case(33, 21, 2, 32);
      kda_tiles_case(45, 32, 3, 40);
      kda_tiles_case(40, 27, 1, 256);
      kda_tiles_case(33, 20, 2, 30);
    }
  }
  gk_set_kda_layout(0);
  {
    static const int l1[] = {200, 64, 1, 130}, l2[] = {150}, l3[] = {97, 65, 3};
    for (int v = 0; v < 4; v++) { /* 64- and 32-token chunks, factorised and exact pair products */
      const int len = v < 2 ? 64 : 32;
      gk_set_kda_chunk_len(len);
      gk_set_kda_pairs(v % 2 == 0);
      printf("kda chunked form, %d-token chunks, %s pair products:\n", len, v % 2 ? "exact" : "factorised (bounded gates)");
      kda_chunk_case(128, l1, 4, -5.0f, 0); /* the model's head dim */
      kda_chunk_case(64, l2, 1, NAN, 0);    /* no lower bound: the softplus gate */
      kda_chunk_case(32, l3, 3, -5.0f, 0);
      kda_chunk_case(128, l3 + 2, 1, -5.0f, 0); /* too short: the token form is kept */
      kda_chunk_case(64, l2, 1, -5.3f, 30); /* the factorised diagonal at exp(79.5) */
    }
    gk_set_kda_chunk_len(0);
    gk_set_kda_pairs(-1);
  }
  kda_conv_prep_case(3, 1, 4, 64, 4, 0);  /* decode: one launch, states written by it */
  kda_conv_prep_case(2, 3, 3, 40, 4, 0);  /* short segments, still one launch */
  /* the prefill form's tokens per warp (GLM53_GPU_KDA_CONV_NT): 1, the
   * default, then 4 and 8, whose groups cross segment boundaries (45 and
   * 347 tokens, 5-token segments: every group of 8 spans two) with partial
   * lanes (hd 40) */
  static const int cnt[3] = {1, 4, 8};
  for (int v = 0; v < 3; v++) {
    gk_set_kda_conv_nt(cnt[v]);
    printf("kda conv+prep, %d tokens per warp:\n", cnt[v]);
    kda_conv_prep_case(2, 37, 2, 128, 4, 0); /* prefill: conv+prep, then the state kernel */
    kda_conv_prep_case(2, 45, 1, 40, 4, 0);
    kda_conv_prep_case(3, 347, 1, 128, 4, 0);
    kda_conv_prep_case(300, 5, 1, 64, 4, 0);
  }
  gk_set_kda_conv_nt(0);
  kda_conv_prep_case(3, 21, 2, 40, 3, 0); /* prefill, 3 taps */
  kda_conv_prep_case(2, 20, 1, 32, 2, 0); /* 2 taps */
  kda_conv_prep_case(2, 9, 1, 64, 6, 0);  /* 6 taps */
  kda_conv_prep_case(1, 2, 1, 256, 4, 0);
  /* bf16 projections (long chunks, gk_kda_raw16): both prefill forms and the one-launch form */
  kda_conv_prep_case(2, 37, 2, 128, 4, 1);
  kda_conv_prep_case(3, 21, 2, 40, 3, 1);
  kda_conv_prep_case(3, 1, 4, 64, 4, 1);
  mhc_pre_case(3, 8196);
  mhc_pre_case(2, 302);
  mhc_pre_case(2, 4096);
  mhc_pre_case(1, 4096); /* also the projection's launch running the pre */
  mhc_pre_case(1030, 4096); /* 64 KB of streams per token: cached in shared memory */
  mhc_pre_case(64, 8196);   /* 128 KB: not cached */
  select_case(1000, 512); /* shared-memory sort, 1024 slots */
  select_case(1024, 512); /* a full power of two */
  select_case(70, 16);
  select_case(5000, 512); /* rank count (past 4096 pools) */
  heads_case();
  multi_case(gk_gemm_min(), 33); /* the cuBLAS path: n = 8, 9 (default crossover) and 33 */
  if (gk_have_blas()) merge_case(), xb16_case();
  moe_sort_case(1000, 37);
  moe_sort_case(32768, 288); /* a 4096-token chunk of the release shape */
  moe_sort_case(7, 5);
  for (int o16 = 1; o16 >= 0; o16--) {
    moe_gemm_case(WMAT_BF16, 0, 0, 256, o16);
    moe_gemm_case(WMAT_BF16, 0, 1, 256, o16);
    moe_gemm_case(WMAT_BF16, 0, 1, 254, o16); /* rows not float4-aligned: the per-element gather */
    moe_gemm_case(WMAT_Q4, 32, 1, 256, o16);
    moe_gemm_case(WMAT_Q8, 64, 0, 256, o16);
  }
  mla_gemm_case(4, 64, 4, 16, 0, 200);   /* prefix rows (no gather), then gathered; 1-row-per-thread softmax */
  mla_gemm_case(2, 32, 4, 150, 0, 620);  /* a long prefix in sub-chunks of 1/8, then gathered */
  mla_gemm_case(3, 32, 4, 100, 37, 400); /* a prefix starting mid-cache */
  mla_gemm_case(2, 64, 4, 150, 700, 30); /* gathered, 604 padded rows */
  mla_gemm_case(2, 32, 4, 300, 1300, 9); /* 1204 */
  mla_gemm_case(2, 32, 4, 600, 2500, 5); /* 2404 */
  mla_gemm_case(1, 32, 4, 1100, 4500, 3); /* 4404: three passes */
  /* the split arithmetics take every row of the chunk (selection as a mask)
   * up to 4 selections' worth of rows, then gather: */
  mla_gemm_case(2, 64, 4, 16, 300, 40);   /* gathered from the start (300 > 4 x 68) */
  mla_gemm_case(2, 32, 4, 16, 200, 150);  /* masked, then gathered within the call */
  mla_gemm_case(2, 32, 2, 40, 0, 150);    /* pools of 2 in the mask */
  mla_gemm_case(1, 32, 4, 2100, 8500, 2); /* selections past the split softmax's 8192 rows: fp32-accurate form */
  /* the per-head form: the model's widths over a prefix in sub-chunks of
   * 1/8, a masked selection, a later chunk, odd small widths, Q8 kv_b */
  wgmma_case();
  mla_mha_case(WMAT_BF16, 4, 256, 256, 512, 4, 512, 0, 300);
  mla_mha_case(WMAT_BF16, 2, 256, 256, 512, 4, 16, 40, 200);  /* the model's widths, masked past 68 positions */
  mla_mha_case(WMAT_BF16, 3, 64, 32, 128, 4, 16, 100, 150); /* pools past K = 16: masked rows (ctx 250 <= 4 x 68) */
  mla_mha_case(WMAT_BF16, 2, 32, 32, 64, 4, 600, 900, 120);
  mla_mha_case(WMAT_BF16, 3, 10, 6, 12, 2, 40, 7, 61);
  mla_mha_case(WMAT_Q8, 2, 64, 64, 96, 4, 100, 0, 90);
  idx_gemm_case(32, 128, 4, 64, 0, 600);  /* scored from token 259 of the chunk */
  idx_gemm_case(8, 64, 4, 16, 300, 90);   /* every token scored */
  idx_gemm_case(4, 32, 2, 40, 50, 40);    /* the first scored token inside, pools of 2 */
  TEST_DONE();
}

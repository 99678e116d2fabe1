/* The optimized Q4/Q8/BF16 matmul kernels (src/cpu) of every ISA this CPU
 * has, GEMV (n=1) and GEMM (n>1, incl. more tokens than one token block),
 * against the generic dequantization (wmat_get_row_generic) with a double
 * dot; the SIMD row dequantizer must equal the generic one bit for bit.
 * Random non-zero data; every Q4 matrix contains nibbles 0 and 15.
 * Tolerance: |y - ref| <= 1e-5 * sum_j |w_j x_j| (fp32 accumulation). */
#include "cpu/qmatmul.h"
#include "core/util.h"
#include "test_util.h"
#include <stdlib.h>

static void fill(trng *r, wmat *w, int fmt, int rows, int cols, int group, int bf16) {
  memset(w, 0, sizeof *w);
  w->fmt = fmt; w->rows = rows; w->cols = cols; w->group = group; w->scale_bf16 = bf16;
  size_t n = (size_t)rows * cols, vb = fmt == WMAT_Q4 ? n / 2 : fmt == WMAT_Q8 ? n : 2 * n;
  uint8_t *d = aligned_alloc64(vb + (fmt == WMAT_BF16 ? 0 : n / group * 2));
  for (size_t i = 0; i < vb; i++) d[i] = (uint8_t)trng_u64(r);
  if (fmt == WMAT_Q4) { d[0] = 0x0F; d[1] = 0xF0; d[vb - 1] = 0x00; d[vb - 2] = 0xFF; } /* nibble edges */
  if (fmt == WMAT_Q8) for (size_t i = 0; i < vb; i++) if (d[i] == 0x80) d[i] = 0x81;  /* -128 is never written */
  if (fmt == WMAT_BF16)
    for (size_t i = 0; i < n; i++) ((uint16_t *)d)[i] = f32_to_bf16((float)trng_normal(r));
  w->data = d;
  w->owned = d;
  if (fmt != WMAT_BF16) {
    uint16_t *s = (uint16_t *)(d + vb);
    for (size_t i = 0; i < n / group; i++) {
      float v = (float)(0.01 + 0.05 * trng_unif(r)) * (trng_u64(r) & 1 ? 1 : -1);
      s[i] = bf16 ? f32_to_bf16(v) : f32_to_f16(v);
    }
    w->scales = s;
  }
}

static void check(int isa, int fmt, int rows, int cols, int group, int bf16, int n, uint64_t seed) {
  trng r = {seed};
  wmat w;
  fill(&r, &w, fmt, rows, cols, group, bf16);
  float *x = xmalloc((size_t)n * cols * 4), *y = xmalloc((size_t)n * rows * 4), *row = xmalloc((size_t)cols * 4);
  for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = (float)trng_normal(&r);
  cpu_isa_force(isa);
  CHECK(cpu_qmatmul(&w, x, n, y) == 0, "unsupported shape");
  double worst = 0;
  float *row2 = xmalloc((size_t)cols * 4);
  int dq_bad = 0;
  for (int rr = 0; rr < rows; rr++) {
    wmat_get_row_generic(&w, rr, row);
    const cpu_kernels *k = isa == CPU_ISA_AVX512 ? cpu_kernels_avx512() : isa == CPU_ISA_AVX2 ? cpu_kernels_avx2() : cpu_kernels_scalar();
    k->dequant_row(&w, rr, row2);
    dq_bad += memcmp(row, row2, (size_t)cols * 4) != 0;
    for (int t = 0; t < n; t++) {
      double ref = 0, mag = 0;
      for (int j = 0; j < cols; j++) { ref += (double)row[j] * x[(size_t)t * cols + j]; mag += fabs((double)row[j] * x[(size_t)t * cols + j]); }
      double e = fabs(y[(size_t)t * rows + rr] - ref) / (mag + 1e-30);
      if (e > worst) worst = e;
    }
  }
  free(row2);
  if (n > 1 && n <= CPU_GEMV_MAX_N) { /* the multi-token GEMV: each token's bits are those of its own product */
    float *y1 = xmalloc((size_t)rows * 4);
    int differ = 0;
    for (int t = 0; t < n; t++) {
      CHECK(cpu_qmatmul(&w, x + (size_t)t * cols, 1, y1) == 0, "unsupported shape");
      differ += memcmp(y1, y + (size_t)t * rows, (size_t)rows * 4) != 0;
    }
    CHECK(differ == 0, "isa %s fmt %d n %d: %d tokens differ from their one-token product", cpu_isa_name(isa), fmt, n, differ);
    free(y1);
  }
  CHECK(dq_bad == 0, "isa %s fmt %d: SIMD dequant differs from generic in %d rows", cpu_isa_name(isa), fmt, dq_bad);
  CHECK(worst <= 1e-5, "isa %s fmt %d %dx%d group %d bf16 %d n %d: rel err %g", cpu_isa_name(isa), fmt, rows, cols, group, bf16, n, worst);
  cpu_isa_force(CPU_ISA_AUTO);
  free(x); free(y); free(row);
  wmat_free(&w);
}

int main(void) {
  int best = cpu_isa();
  printf("best ISA here: %s\n", cpu_isa_name(best));
  uint64_t seed = 1;
  for (int isa = CPU_ISA_SCALAR; isa <= best; isa++) {
    static const int ns[] = {1, 2, 3, 5, 8, 37};
    for (size_t k = 0; k < 6; k++) {
      int n = ns[k];
      check(isa, WMAT_Q4, 37, 256, 32, 0, n, seed++);
      check(isa, WMAT_Q4, 19, 384, 128, 1, n, seed++);
      check(isa, WMAT_Q4, 70, 512, 64, 0, n, seed++);
      check(isa, WMAT_Q4, 13, 160, 32, 1, n, seed++); /* odd number of 32-blocks (tail path) */
      check(isa, WMAT_Q4, 9, 192, 64, 0, n, seed++);
      check(isa, WMAT_Q8, 37, 256, 32, 0, n, seed++);
      check(isa, WMAT_Q8, 21, 384, 128, 1, n, seed++);
      check(isa, WMAT_BF16, 33, 160, 0, 0, n, seed++);
    }
    /* a large row count so the OpenMP path runs */
    check(isa, WMAT_Q4, 600, 1024, 32, 0, 1, seed++);
    check(isa, WMAT_Q8, 300, 1024, 32, 0, 2, seed++);
  }
  /* a row view multiplies like the same rows of the whole matrix */
  {
    trng r = {42};
    static const int fmts[3] = {WMAT_Q4, WMAT_Q8, WMAT_BF16};
    for (int f = 0; f < 3; f++) {
      wmat w;
      fill(&r, &w, fmts[f], 12, 128, fmts[f] == WMAT_BF16 ? 0 : 32, 0);
      float x[128], y[12], yv[5];
      for (int j = 0; j < 128; j++) x[j] = (float)trng_normal(&r);
      wmat_matvec(&w, x, y);
      wmat v = wmat_rows(&w, 5, 5);
      wmat_matvec(&v, x, yv);
      CHECK(v.owned == NULL && memcmp(y + 5, yv, sizeof yv) == 0, "row view fmt %d", fmts[f]);
      wmat_free(&w);
    }
  }
  /* unsupported shapes are refused (generic path takes them) */
  wmat w = {.fmt = WMAT_Q4, .rows = 2, .cols = 48, .group = 16};
  CHECK(!cpu_qmatmul_supported(&w), "group 16 must fall back");
  TEST_DONE();
}

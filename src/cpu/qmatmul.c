/* Dispatch and drivers of the quantized matmul (see qmatmul.h), plus the
 * scalar kernels (the fallback, and the shape every SIMD kernel follows). */
#include "cpu/qmatmul.h"
#include "core/util.h"
#include <stdlib.h>

#define TOKEN_BLOCK 32 /* tokens per pass over the weights in the GEMM path (x block stays in L2) */

static float scale_of(uint16_t s, int bf16) { return bf16 ? bf16_to_f32(s) : f16_to_f32(s); }

static float s_gemv_q4(const uint8_t *q, const uint16_t *sc, int cols, int group, int bf16, const float *xp, const float *xs) {
  float acc = 0, corr = 0;
  for (int g = 0; g < cols / group; g++) {
    float t = 0;
    for (int b = g * group; b < (g + 1) * group; b += 32) {
      const uint8_t *qb = q + b / 2;
      for (int i = 0; i < 16; i++) t += (float)(qb[i] & 15) * xp[b + i] + (float)(qb[i] >> 4) * xp[b + 16 + i];
    }
    float d = scale_of(sc[g], bf16);
    acc += d * t;
    corr += d * xs[g];
  }
  return acc - 8.0f * corr;
}

static float s_gemv_q8(const int8_t *q, const uint16_t *sc, int cols, int group, int bf16, const float *x) {
  float acc = 0;
  for (int g = 0; g < cols / group; g++) {
    float t = 0;
    for (int j = g * group; j < (g + 1) * group; j++) t += (float)q[j] * x[j];
    acc += scale_of(sc[g], bf16) * t;
  }
  return acc;
}

static float s_gemv_bf16(const uint16_t *q, int cols, const float *x) {
  float acc = 0;
  for (int j = 0; j < cols; j++) acc += bf16_to_f32(q[j]) * x[j];
  return acc;
}

static void s_dot_n(const float *a, const float *x, int cols, int nt, float *out) {
  for (int t = 0; t < nt; t++) {
    float acc = 0;
    for (int j = 0; j < cols; j++) acc += a[j] * x[(size_t)t * cols + j];
    out[t] = acc;
  }
}

static const cpu_kernels scalar_k = {s_gemv_q4, s_gemv_q8, s_gemv_bf16, wmat_get_row_generic, s_dot_n, NULL, NULL, NULL};
const cpu_kernels *cpu_kernels_scalar(void) { return &scalar_k; }

/* ---- ISA selection ---- */

static int forced = CPU_ISA_AUTO;

static int detect(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
    return CPU_ISA_AVX512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) return CPU_ISA_AVX2;
  return CPU_ISA_SCALAR;
}

int cpu_isa(void) {
  static int best = -2;
  if (best == -2) best = detect();
  if (forced == CPU_ISA_AUTO) {
    const char *e = getenv("GLM53_CPU_ISA"); /* scalar|avx2|avx512: pin for benchmarks */
    if (e && !strcmp(e, "scalar")) return CPU_ISA_SCALAR;
    if (e && !strcmp(e, "avx2") && best >= CPU_ISA_AVX2) return CPU_ISA_AVX2;
    return best;
  }
  return forced < best ? forced : best;
}
void cpu_isa_force(int isa) { forced = isa; }
const char *cpu_isa_name(int isa) { return isa == CPU_ISA_AVX512 ? "avx512" : isa == CPU_ISA_AVX2 ? "avx2" : "scalar"; }

static const cpu_kernels *kernels(void) {
  switch (cpu_isa()) {
  case CPU_ISA_AVX512: return cpu_kernels_avx512();
  case CPU_ISA_AVX2: return cpu_kernels_avx2();
  default: return cpu_kernels_scalar();
  }
}

int cpu_qmatmul_supported(const wmat *w) {
  if (w->cols % 32) return 0;
  if (w->fmt == WMAT_BF16) return 1;
  return (w->fmt == WMAT_Q4 || w->fmt == WMAT_Q8) && w->group > 0 && w->group % 32 == 0 && w->cols % w->group == 0;
}

/* ---- drivers ---- */

/* n <= CPU_GEMV_MAX_N tokens: y[t][r] = the one-token kernel's result for
 * token t (the _n kernels, when present, give the same bits 4 tokens at a
 * time with each weight block unpacked once) */
static void gemv(const cpu_kernels *k, const wmat *w, const float *x, int n, float *y) {
  const int rows = w->rows, cols = w->cols, group = w->group, bf = w->scale_bf16;
  const size_t ng = w->group ? (size_t)cols / group : 0;
  float *xp = NULL, *xs = NULL;
  if (w->fmt == WMAT_Q4) { /* de-interleave each 32-block: evens then odds; per-group sums */
    xp = aligned_alloc64((size_t)n * cols * sizeof(float));
    xs = xmalloc((size_t)n * ng * sizeof(float));
    for (int t = 0; t < n; t++) {
      const float *xt = x + (size_t)t * cols;
      float *pt = xp + (size_t)t * cols, *st = xs + (size_t)t * ng;
      for (int b = 0; b < cols; b += 32)
        for (int i = 0; i < 16; i++) { pt[b + i] = xt[b + 2 * i]; pt[b + 16 + i] = xt[b + 2 * i + 1]; }
      for (size_t g = 0; g < ng; g++) {
        float s = 0;
        for (int j = 0; j < group; j++) s += xt[g * group + j];
        st[g] = s;
      }
    }
  }
  const uint16_t *sc = w->scales;
#pragma omp parallel for schedule(static) if ((size_t)rows * cols * n > 65536)
  for (int r = 0; r < rows; r++) {
    const uint8_t *q4 = (const uint8_t *)w->data + (size_t)r * cols / 2;
    const int8_t *q8 = (const int8_t *)w->data + (size_t)r * cols;
    const uint16_t *qb = (const uint16_t *)w->data + (size_t)r * cols;
    for (int t0 = 0; t0 < n; t0 += 4) {
      const int nt = n - t0 < 4 ? n - t0 : 4;
      const float *xt[4];
      float o[4];
      for (int i = 0; i < nt; i++) xt[i] = (w->fmt == WMAT_Q4 ? xp : x) + (size_t)(t0 + i) * cols;
      switch (w->fmt) {
      case WMAT_Q4:
        if (k->gemv_q4_n && nt > 1) k->gemv_q4_n(q4, sc + r * ng, cols, group, bf, xt, nt, o);
        else
          for (int i = 0; i < nt; i++) o[i] = k->gemv_q4(q4, sc + r * ng, cols, group, bf, xt[i], xs + (size_t)(t0 + i) * ng);
        break;
      case WMAT_Q8:
        if (k->gemv_q8_n && nt > 1) k->gemv_q8_n(q8, sc + r * ng, cols, group, bf, xt, nt, o);
        else
          for (int i = 0; i < nt; i++) o[i] = k->gemv_q8(q8, sc + r * ng, cols, group, bf, xt[i]);
        break;
      default:
        if (k->gemv_bf16_n && nt > 1) k->gemv_bf16_n(qb, cols, xt, nt, o);
        else
          for (int i = 0; i < nt; i++) o[i] = k->gemv_bf16(qb, cols, xt[i]);
        break;
      }
      for (int i = 0; i < nt; i++) y[(size_t)(t0 + i) * rows + r] = o[i];
    }
  }
  free(xp);
  free(xs);
}

static void gemm(const cpu_kernels *k, const wmat *w, const float *x, int n, float *y) {
  const int rows = w->rows, cols = w->cols;
  for (int t0 = 0; t0 < n; t0 += TOKEN_BLOCK) {
    const int nb = n - t0 < TOKEN_BLOCK ? n - t0 : TOKEN_BLOCK;
#pragma omp parallel if ((size_t)rows * cols * nb > 65536)
    {
      float *row = aligned_alloc64((size_t)cols * sizeof(float));
      float out[4];
#pragma omp for schedule(static)
      for (int r = 0; r < rows; r++) {
        k->dequant_row(w, r, row);
        for (int t = 0; t < nb; t += 4) {
          int nt = nb - t < 4 ? nb - t : 4;
          k->dot_n(row, x + (size_t)(t0 + t) * cols, cols, nt, out);
          for (int i = 0; i < nt; i++) y[(size_t)(t0 + t + i) * rows + r] = out[i];
        }
      }
      free(row);
    }
  }
}

int cpu_dequant_row(const wmat *w, int r, float *out) {
  if (!cpu_qmatmul_supported(w) || cpu_isa() == CPU_ISA_SCALAR) return -1;
  kernels()->dequant_row(w, r, out);
  return 0;
}

int cpu_qmatmul(const wmat *w, const float *x, int n, float *y) {
  if (!cpu_qmatmul_supported(w)) return -1;
  const cpu_kernels *k = kernels();
  if (n <= CPU_GEMV_MAX_N) gemv(k, w, x, n, y);
  else gemm(k, w, x, n, y);
  return 0;
}

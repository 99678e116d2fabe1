/* AVX-512 (F+BW+VL, FMA, F16C) kernels of qmatmul.h. Compiled for that
 * target only here; called only after __builtin_cpu_supports said yes. */
#include "cpu/qmatmul.h"
#include "core/util.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#include <immintrin.h>

static inline float sc(uint16_t s, int bf16) { return bf16 ? bf16_to_f32(s) : _cvtsh_ss(s); }

/* Q4: a 16-entry table (n - 8) * d per group turns nibbles straight into
 * exact dequantized weights with one permute (no int->float convert, no
 * offset fix-up); two 32-blocks per step into four accumulators so the FMA
 * latency is hidden. */
static inline __m512 q4_tab(const uint16_t *scl, int g, int bf16) {
  const __m512 iota8 = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  return _mm512_mul_ps(iota8, _mm512_set1_ps(sc(scl[g], bf16)));
}
/* Q4 for nt <= 4 tokens: per token four accumulators, two 32-blocks per
 * step (a[t][0..3]), the unpacking done once for all tokens; the one-token
 * kernel is nt = 1, so every token gets the bits of its own product */
static void gemv_q4_n(const uint8_t *q, const uint16_t *scl, int cols, int group, int bf16, const float *const *xp, int nt,
                      float *out) {
  const __m512i m15 = _mm512_set1_epi32(15);
  __m512 a[4][4];
  for (int t = 0; t < 4; t++)
    for (int i = 0; i < 4; i++) a[t][i] = _mm512_setzero_ps();
  int b = 0;
  for (; b + 64 <= cols; b += 64) {
    const __m512 t0 = q4_tab(scl, b / group, bf16), t1 = group == 32 ? q4_tab(scl, b / group + 1, bf16) : t0;
    __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + b / 2)));
    __m512i v1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + b / 2 + 16)));
    const __m512 w0 = _mm512_permutexvar_ps(_mm512_and_si512(v0, m15), t0), w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v0, 4), t0);
    const __m512 w2 = _mm512_permutexvar_ps(_mm512_and_si512(v1, m15), t1), w3 = _mm512_permutexvar_ps(_mm512_srli_epi32(v1, 4), t1);
    for (int t = 0; t < nt; t++) {
      a[t][0] = _mm512_fmadd_ps(w0, _mm512_load_ps(xp[t] + b), a[t][0]);
      a[t][1] = _mm512_fmadd_ps(w1, _mm512_load_ps(xp[t] + b + 16), a[t][1]);
      a[t][2] = _mm512_fmadd_ps(w2, _mm512_load_ps(xp[t] + b + 32), a[t][2]);
      a[t][3] = _mm512_fmadd_ps(w3, _mm512_load_ps(xp[t] + b + 48), a[t][3]);
    }
  }
  if (b < cols) {
    const __m512 t0 = q4_tab(scl, b / group, bf16);
    __m512i v0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + b / 2)));
    const __m512 w0 = _mm512_permutexvar_ps(_mm512_and_si512(v0, m15), t0), w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v0, 4), t0);
    for (int t = 0; t < nt; t++) {
      a[t][0] = _mm512_fmadd_ps(w0, _mm512_load_ps(xp[t] + b), a[t][0]);
      a[t][1] = _mm512_fmadd_ps(w1, _mm512_load_ps(xp[t] + b + 16), a[t][1]);
    }
  }
  for (int t = 0; t < nt; t++)
    out[t] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[t][0], a[t][1]), _mm512_add_ps(a[t][2], a[t][3])));
}

static float gemv_q4(const uint8_t *q, const uint16_t *scl, int cols, int group, int bf16, const float *xp, const float *xs) {
  (void)xs;
  float out;
  gemv_q4_n(q, scl, cols, group, bf16, &xp, 1, &out);
  return out;
}

/* Q8 for nt <= 4 tokens (the one-token kernel is nt = 1) */
static void gemv_q8_n(const int8_t *q, const uint16_t *scl, int cols, int group, int bf16, const float *const *x, int nt,
                      float *out) {
  __m512 acc[4];
  for (int t = 0; t < 4; t++) acc[t] = _mm512_setzero_ps();
  for (int g = 0; g < cols / group; g++) {
    __m512 t0[4], t1[4];
    for (int t = 0; t < 4; t++) t0[t] = t1[t] = _mm512_setzero_ps();
    for (int b = g * group; b < (g + 1) * group; b += 32) {
      __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + b))));
      __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + b + 16))));
      for (int t = 0; t < nt; t++) {
        t0[t] = _mm512_fmadd_ps(a, _mm512_loadu_ps(x[t] + b), t0[t]);
        t1[t] = _mm512_fmadd_ps(c, _mm512_loadu_ps(x[t] + b + 16), t1[t]);
      }
    }
    const __m512 d = _mm512_set1_ps(sc(scl[g], bf16));
    for (int t = 0; t < nt; t++) acc[t] = _mm512_fmadd_ps(_mm512_add_ps(t0[t], t1[t]), d, acc[t]);
  }
  for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(acc[t]);
}

static float gemv_q8(const int8_t *q, const uint16_t *scl, int cols, int group, int bf16, const float *x) {
  float out;
  gemv_q8_n(q, scl, cols, group, bf16, &x, 1, &out);
  return out;
}

static inline __m512 bf16x16(const uint16_t *p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* BF16 for nt <= 4 tokens (the one-token kernel is nt = 1) */
static void gemv_bf16_n(const uint16_t *q, int cols, const float *const *x, int nt, float *out) {
  __m512 a0[4], a1[4];
  for (int t = 0; t < 4; t++) a0[t] = a1[t] = _mm512_setzero_ps();
  for (int j = 0; j < cols; j += 32) {
    const __m512 w0 = bf16x16(q + j), w1 = bf16x16(q + j + 16);
    for (int t = 0; t < nt; t++) {
      a0[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x[t] + j), a0[t]);
      a1[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x[t] + j + 16), a1[t]);
    }
  }
  for (int t = 0; t < nt; t++) out[t] = _mm512_reduce_add_ps(_mm512_add_ps(a0[t], a1[t]));
}

static float gemv_bf16(const uint16_t *q, int cols, const float *x) {
  float out;
  gemv_bf16_n(q, cols, &x, 1, &out);
  return out;
}

static void dequant_row(const wmat *w, int r, float *out) {
  const int cols = w->cols;
  if (w->fmt == WMAT_BF16) {
    const uint16_t *p = (const uint16_t *)w->data + (size_t)r * cols;
    for (int j = 0; j < cols; j += 16) _mm512_storeu_ps(out + j, bf16x16(p + j));
    return;
  }
  const int group = w->group;
  const size_t ng = (size_t)cols / group;
  const uint16_t *scl = (const uint16_t *)w->scales + (size_t)r * ng;
  if (w->fmt == WMAT_Q8) {
    const int8_t *p = (const int8_t *)w->data + (size_t)r * cols;
    for (int g = 0; g < cols / group; g++) {
      __m512 d = _mm512_set1_ps(sc(scl[g], w->scale_bf16));
      for (int j = g * group; j < (g + 1) * group; j += 16)
        _mm512_storeu_ps(out + j, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + j))))));
    }
    return;
  }
  /* Q4: byte i of a 32-block holds columns 2i (low) and 2i+1 (high) */
  const uint8_t *p = (const uint8_t *)w->data + (size_t)r * cols / 2;
  const __m128i m15 = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
  for (int g = 0; g < cols / group; g++) {
    __m512 d = _mm512_set1_ps(sc(scl[g], w->scale_bf16));
    for (int b = g * group; b < (g + 1) * group; b += 32) {
      __m128i v = _mm_loadu_si128((const __m128i *)(p + b / 2));
      __m128i lo = _mm_sub_epi8(_mm_and_si128(v, m15), eight), hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m15), eight);
      __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
      _mm512_storeu_ps(out + b, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e0))));
      _mm512_storeu_ps(out + b + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e1))));
    }
  }
}

static void dot_n(const float *a, const float *x, int cols, int nt, float *out) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
  const float *x0 = x, *x1 = x + (nt > 1 ? cols : 0), *x2 = x + (nt > 2 ? 2 * (size_t)cols : 0), *x3 = x + (nt > 3 ? 3 * (size_t)cols : 0);
  for (int j = 0; j < cols; j += 16) {
    __m512 av = _mm512_loadu_ps(a + j);
    s0 = _mm512_fmadd_ps(av, _mm512_loadu_ps(x0 + j), s0);
    s1 = _mm512_fmadd_ps(av, _mm512_loadu_ps(x1 + j), s1);
    s2 = _mm512_fmadd_ps(av, _mm512_loadu_ps(x2 + j), s2);
    s3 = _mm512_fmadd_ps(av, _mm512_loadu_ps(x3 + j), s3);
  }
  float r[4] = {_mm512_reduce_add_ps(s0), _mm512_reduce_add_ps(s1), _mm512_reduce_add_ps(s2), _mm512_reduce_add_ps(s3)};
  for (int t = 0; t < nt; t++) out[t] = r[t];
}

static const cpu_kernels k = {gemv_q4, gemv_q8, gemv_bf16, dequant_row, dot_n, gemv_q4_n, gemv_q8_n, gemv_bf16_n};
#pragma GCC pop_options
const cpu_kernels *cpu_kernels_avx512(void) { return &k; }
#else
const cpu_kernels *cpu_kernels_avx512(void) { return cpu_kernels_scalar(); }
#endif

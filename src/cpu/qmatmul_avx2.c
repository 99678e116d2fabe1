/* AVX2 + FMA + F16C kernels of qmatmul.h (same structure as the AVX-512
 * file, 8 lanes). Called only after __builtin_cpu_supports said yes. */
#include "cpu/qmatmul.h"
#include "core/util.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

static inline float sc(uint16_t s, int bf16) { return bf16 ? bf16_to_f32(s) : _cvtsh_ss(s); }

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline __m256i u8x8(const uint8_t *p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
static inline __m256 i8x8(const int8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }

static float gemv_q4(const uint8_t *q, const uint16_t *scl, int cols, int group, int bf16, const float *xp, const float *xs) {
  const __m256i m15 = _mm256_set1_epi32(15);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  float corr = 0;
  for (int g = 0; g < cols / group; g++) {
    __m256 t0 = _mm256_setzero_ps(), t1 = _mm256_setzero_ps();
    for (int b = g * group; b < (g + 1) * group; b += 32) {
      const uint8_t *qb = q + b / 2;
      __m256i v0 = u8x8(qb), v1 = u8x8(qb + 8);
      t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v0, m15)), _mm256_loadu_ps(xp + b), t0);
      t1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v1, m15)), _mm256_loadu_ps(xp + b + 8), t1);
      t0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)), _mm256_loadu_ps(xp + b + 16), t0);
      t1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4)), _mm256_loadu_ps(xp + b + 24), t1);
    }
    float d = sc(scl[g], bf16);
    __m256 dv = _mm256_set1_ps(d);
    acc0 = _mm256_fmadd_ps(t0, dv, acc0);
    acc1 = _mm256_fmadd_ps(t1, dv, acc1);
    corr += d * xs[g];
  }
  return hsum(_mm256_add_ps(acc0, acc1)) - 8.0f * corr;
}

static float gemv_q8(const int8_t *q, const uint16_t *scl, int cols, int group, int bf16, const float *x) {
  __m256 acc = _mm256_setzero_ps();
  for (int g = 0; g < cols / group; g++) {
    __m256 t0 = _mm256_setzero_ps(), t1 = _mm256_setzero_ps();
    for (int b = g * group; b < (g + 1) * group; b += 16) {
      t0 = _mm256_fmadd_ps(i8x8(q + b), _mm256_loadu_ps(x + b), t0);
      t1 = _mm256_fmadd_ps(i8x8(q + b + 8), _mm256_loadu_ps(x + b + 8), t1);
    }
    acc = _mm256_fmadd_ps(_mm256_add_ps(t0, t1), _mm256_set1_ps(sc(scl[g], bf16)), acc);
  }
  return hsum(acc);
}

static inline __m256 bf16x8(const uint16_t *p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

static float gemv_bf16(const uint16_t *q, int cols, const float *x) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (int j = 0; j < cols; j += 16) {
    a0 = _mm256_fmadd_ps(bf16x8(q + j), _mm256_loadu_ps(x + j), a0);
    a1 = _mm256_fmadd_ps(bf16x8(q + j + 8), _mm256_loadu_ps(x + j + 8), a1);
  }
  return hsum(_mm256_add_ps(a0, a1));
}

static void dequant_row(const wmat *w, int r, float *out) {
  const int cols = w->cols;
  if (w->fmt == WMAT_BF16) {
    const uint16_t *p = (const uint16_t *)w->data + (size_t)r * cols;
    for (int j = 0; j < cols; j += 8) _mm256_storeu_ps(out + j, bf16x8(p + j));
    return;
  }
  const int group = w->group;
  const size_t ng = (size_t)cols / group;
  const uint16_t *scl = (const uint16_t *)w->scales + (size_t)r * ng;
  if (w->fmt == WMAT_Q8) {
    const int8_t *p = (const int8_t *)w->data + (size_t)r * cols;
    for (int g = 0; g < cols / group; g++) {
      __m256 d = _mm256_set1_ps(sc(scl[g], w->scale_bf16));
      for (int j = g * group; j < (g + 1) * group; j += 8) _mm256_storeu_ps(out + j, _mm256_mul_ps(d, i8x8(p + j)));
    }
    return;
  }
  const uint8_t *p = (const uint8_t *)w->data + (size_t)r * cols / 2;
  const __m128i m15 = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
  for (int g = 0; g < cols / group; g++) {
    __m256 d = _mm256_set1_ps(sc(scl[g], w->scale_bf16));
    for (int b = g * group; b < (g + 1) * group; b += 32) {
      __m128i v = _mm_loadu_si128((const __m128i *)(p + b / 2));
      __m128i lo = _mm_sub_epi8(_mm_and_si128(v, m15), eight), hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m15), eight);
      __m128i e0 = _mm_unpacklo_epi8(lo, hi), e1 = _mm_unpackhi_epi8(lo, hi);
      _mm256_storeu_ps(out + b, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0))));
      _mm256_storeu_ps(out + b + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8)))));
      _mm256_storeu_ps(out + b + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1))));
      _mm256_storeu_ps(out + b + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8)))));
    }
  }
}

static void dot_n(const float *a, const float *x, int cols, int nt, float *out) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  const float *x0 = x, *x1 = x + (nt > 1 ? cols : 0), *x2 = x + (nt > 2 ? 2 * (size_t)cols : 0), *x3 = x + (nt > 3 ? 3 * (size_t)cols : 0);
  for (int j = 0; j < cols; j += 8) {
    __m256 av = _mm256_loadu_ps(a + j);
    s0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(x0 + j), s0);
    s1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(x1 + j), s1);
    s2 = _mm256_fmadd_ps(av, _mm256_loadu_ps(x2 + j), s2);
    s3 = _mm256_fmadd_ps(av, _mm256_loadu_ps(x3 + j), s3);
  }
  float r[4] = {hsum(s0), hsum(s1), hsum(s2), hsum(s3)};
  for (int t = 0; t < nt; t++) out[t] = r[t];
}

static const cpu_kernels k = {gemv_q4, gemv_q8, gemv_bf16, dequant_row, dot_n, NULL, NULL, NULL};
#pragma GCC pop_options
const cpu_kernels *cpu_kernels_avx2(void) { return &k; }
#else
const cpu_kernels *cpu_kernels_avx2(void) { return cpu_kernels_scalar(); }
#endif

/* Optimized CPU matmul for the quantized wmat formats (Q4 "fmt=4", Q8,
 * BF16): Y[n][rows] = X[n][cols] W^T with fp32 accumulation.
 *  - n == 1 (decode): GEMV straight from the packed weights, dequantizing in
 *    registers. Q4: x is de-interleaved once per call so the low and high
 *    nibbles of 16 bytes multiply 16 even / 16 odd inputs; AVX-512 maps
 *    nibbles to exact weights with a 16-entry (n-8)*d table (vpermps), AVX2
 *    and scalar convert and fold the -8 offset in as -8 * d * sum(x).
 *  - 2 <= n <= CPU_GEMV_MAX_N (batched decode, short chunks): the GEMV for
 *    up to 4 tokens at a time (AVX-512: each weight block unpacked once),
 *    every token getting the bits of its n == 1 product.
 *  - larger n (prefill): per block of tokens, each row is dequantized once
 *    into an fp32 buffer and dotted with the block's tokens, 4 at a time.
 * ISA: AVX-512 (F+BW+VL), AVX2+FMA+F16C, or scalar, chosen at run time with
 * __builtin_cpu_supports; parallel over rows with OpenMP.
 * Error: fp32 accumulation; |y - y_exact| <= ~cols * 2^-24 * sum_j |w_j x_j|
 * in the worst case (tests use 1e-5 relative to sum|w x|). Activations stay
 * fp32 (an int8-activation VNNI variant was measured slower here, see
 * docs/benchmarks.md).
 */
#ifndef GLM53_CPU_QMATMUL_H
#define GLM53_CPU_QMATMUL_H
#include "model/wmat.h"

#define CPU_GEMV_MAX_N 8 /* token counts up to this take the (multi-token) GEMV */

enum cpu_isa { CPU_ISA_AUTO = -1, CPU_ISA_SCALAR = 0, CPU_ISA_AVX2 = 1, CPU_ISA_AVX512 = 2 };

/* 1 if cpu_qmatmul handles w (Q4/Q8 with group % 32 == 0, BF16 with
 * cols % 32 == 0). */
int cpu_qmatmul_supported(const wmat *w);
/* Returns 0, or -1 (nothing written) when !cpu_qmatmul_supported(w). */
int cpu_qmatmul(const wmat *w, const float *x, int n, float *y);
/* Row r of w as fp32 with the SIMD dequantizer; -1 when unsupported. */
int cpu_dequant_row(const wmat *w, int r, float *out);
/* The ISA in use; cpu_isa_force(CPU_ISA_AUTO) restores detection. Forcing an
 * ISA the CPU lacks falls back to the best supported one (tests). */
int cpu_isa(void);
void cpu_isa_force(int isa);
const char *cpu_isa_name(int isa);

/* Per-ISA kernels (qmatmul_*.c). x4: up to 4 token vectors, stride cols. */
typedef struct {
  float (*gemv_q4)(const uint8_t *q, const uint16_t *sc, int cols, int group, int bf16, const float *xp, const float *xs);
  float (*gemv_q8)(const int8_t *q, const uint16_t *sc, int cols, int group, int bf16, const float *x);
  float (*gemv_bf16)(const uint16_t *q, int cols, const float *x);
  void (*dequant_row)(const wmat *w, int r, float *out);
  void (*dot_n)(const float *a, const float *x, int cols, int nt, float *out); /* nt <= 4 */
  /* optional (NULL: the driver calls the one-token kernel per token): the
   * one-token kernels for nt <= 4 tokens at once, each weight block unpacked
   * once, every token's accumulation exactly that of the one-token kernel
   * (same bits); x[t] / xp[t], xs[t]: token t's inputs */
  void (*gemv_q4_n)(const uint8_t *q, const uint16_t *sc, int cols, int group, int bf16, const float *const *xp, int nt,
                    float *out);
  void (*gemv_q8_n)(const int8_t *q, const uint16_t *sc, int cols, int group, int bf16, const float *const *x, int nt,
                    float *out);
  void (*gemv_bf16_n)(const uint16_t *q, int cols, const float *const *x, int nt, float *out);
} cpu_kernels;
const cpu_kernels *cpu_kernels_scalar(void);
const cpu_kernels *cpu_kernels_avx2(void);
const cpu_kernels *cpu_kernels_avx512(void);

#endif

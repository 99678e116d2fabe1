/* Absorbed MLA attention for long chunks (prefill) through fp32 cuBLAS
 * GEMMs instead of the per-(token, head) kernel of gk_layers.cu, which reads
 * every selected latent row once per head (64 times per token).
 *
 * All heads of a token attend over the same selected latent rows, so per
 * token t with N_t selected rows G_t [N_t][kl]:
 *   S_t [H][N] = q~_t [H][kl] . G_t^T         (one strided-batched SGEMM)
 *   P_t = softmax(scale * S_t) over n < N_t   (fixed-order reductions)
 *   o_t [H][kl] = P_t . G_t                   (one strided-batched SGEMM)
 * Every token of a sub-chunk uses the same padded N (rows past N_t get
 * probability 0). While fewer than K pools are complete, a token's selection
 * is the prefix 0..N_t-1 of the latent cache (select_k picks every pool in
 * order and the tail follows it), so G_t is the cache itself (stride 0, no
 * copy; the padding rows are cache rows of this chunk, finite, weighted 0);
 * otherwise the rows are gathered per token into a scratch buffer.
 * The GEMMs' arithmetic is fp32-accurate by default (gk_mla_math below:
 * results within fp32 rounding of gk_mla_attn; not bitwise: another
 * summation order), or TF32 when asked (within ~1e-3). The softmax
 * holds a row in registers (one read and one write of S). */
#include "gk_common.cuh"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The GEMMs' arithmetic (GLM53_GPU_MLA_MATH=fp32|tf32|bf16x9, or
 * gk_set_mla_math): GK_MLA_BF16X9 (default) fp32 emulated with three bf16
 * terms per input on the tensor cores (cuBLAS
 * CUBLAS_COMPUTE_32F_EMULATED_16BFX9: fp32-level error, 1e-7 in the kernel
 * test; falls back to fp32 where cuBLAS does not offer it); GK_MLA_FP32
 * plain SGEMM; GK_MLA_TF32 TF32 tensor cores (inputs rounded to 10-bit
 * mantissas): fastest, but its ~3e-4 relative error in the attention output
 * flips near-tied routing and top-k choices of the test models (forward
 * test: 0.27 of the logits' range vs the CPU), so opt-in only. */
static int g_math = -1;
extern "C" void gk_set_mla_math(int mode) { g_math = mode < 0 || mode > GK_MLA_BF16X9 ? -1 : mode; }
extern "C" int gk_mla_math(void) {
  if (g_math < 0) {
    const char *e = getenv("GLM53_GPU_MLA_MATH");
    g_math = e && !strcmp(e, "fp32") ? GK_MLA_FP32 : e && !strcmp(e, "tf32") ? GK_MLA_TF32 : GK_MLA_BF16X9;
#if GK_HIP
    if (g_math == GK_MLA_BF16X9) g_math = GK_MLA_FP32; /* no such compute type in hipBLAS */
#endif
  }
  return g_math;
}
extern "C" const char *gk_mla_math_name(int mode) {
  return mode == GK_MLA_TF32 ? "tf32" : mode == GK_MLA_BF16X9 ? "bf16x9" : "fp32";
}

#if GK_HAVE_BLAS
static cublasHandle_t g_h; /* gk_blas_handle(), fetched per call */
static void *g_buf;
static size_t g_buf_n;

static void *buf(size_t n) {
  if (g_buf_n >= n) return g_buf;
  gk_free(g_buf);
  g_buf = gk_malloc(n);
  g_buf_n = g_buf ? n : 0;
  return g_buf;
}

/* G[t][n][:] = latent row of the n-th selected token of t0 + t, zero past
 * N_t: one warp per row (the row's source found once, then kl/4 float4
 * copies spread over the lanes); grid (tokens, ceil(Npad / 8)) */
__global__ void mla_gather_k(const float *latent, const int *dense, const int *npools, const int *tail, const int *pools,
                             const int *dpos, int t0, int P, int K, int kl, int Npad, float *G) {
  GK_PDL_BEGIN();
  const int t = t0 + blockIdx.x, pos = *dpos + t, lane = threadIdx.x & 31;
  const int n = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= Npad) return;
  const int isd = dense[t], np = npools[t], tb = tail[t], N = sel_count(isd, np, tb, pos, P);
  const int q4 = kl / 4;
  float4 *g = (float4 *)(G + ((size_t)blockIdx.x * Npad + n) * kl);
  if (n >= N) {
    for (int c = lane; c < q4; c += 32) g[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    return;
  }
  const float4 *src = (const float4 *)(latent + (size_t)sel_row(isd, np, tb, pools + (size_t)t * K, P, n) * kl);
  for (int c = lane; c < q4; c += 32) g[c] = __ldg(src + c);
}

/* one block of 256 threads per (token, head) row of S, the row held in
 * registers (VPT values per thread, Npad <= 256 * VPT): one read and one
 * write of S. p = exp(scale*s - max) / sum over n < N_t, 0 beyond. */
template <int VPT>
__global__ void __launch_bounds__(256) mla_softmax_reg_k(float *S, const int *dense, const int *npools, const int *tail,
                                                         const int *dpos, int t0, int H, int P, int Npad, float scale) {
  GK_PDL_BEGIN();
  __shared__ float sh[32];
  const int t = t0 + blockIdx.x / H, pos = *dpos + t, N = sel_count(dense[t], npools[t], tail[t], pos, P);
  float *row = S + (size_t)blockIdx.x * Npad;
  float v[VPT], m = -INFINITY;
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int n = threadIdx.x + i * 256;
    v[i] = n < N ? row[n] * scale : -INFINITY;
    m = fmaxf(m, v[i]);
  }
  { /* block max */
    float w = warp_max(m);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = w;
    __syncthreads();
    m = -INFINITY;
    for (int i = 0; i < 8; i++) m = fmaxf(m, sh[i]);
  } /* block_sum synchronises before it reuses sh */
  float z = 0;
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int n = threadIdx.x + i * 256;
    v[i] = n < N ? expf(v[i] - m) : 0.f;
    z += v[i];
  }
  z = block_sum(z, sh);
  const float inv = z > 0 ? 1.0f / z : 0.f;
#pragma unroll
  for (int i = 0; i < VPT; i++) {
    const int n = threadIdx.x + i * 256;
    if (n < Npad) row[n] = v[i] * inv;
  }
}

/* rows longer than 256 * 16: three passes over the row in memory */
__global__ void mla_softmax_k(float *S, const int *dense, const int *npools, const int *tail, const int *dpos, int t0, int H,
                              int P, int Npad, float scale) {
  GK_PDL_BEGIN();
  __shared__ float sh[32];
  const int t = t0 + blockIdx.x / H, pos = *dpos + t, N = sel_count(dense[t], npools[t], tail[t], pos, P);
  float *row = S + (size_t)blockIdx.x * Npad;
  float m = -INFINITY;
  for (int n = threadIdx.x; n < N; n += blockDim.x) m = fmaxf(m, row[n] * scale);
  { /* block max */
    float v = warp_max(m);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    m = -INFINITY;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = fmaxf(m, sh[i]);
  }
  float z = 0;
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    float e = expf(row[n] * scale - m);
    row[n] = e;
    z += e;
  }
  z = block_sum(z, sh);
  const float inv = z > 0 ? 1.0f / z : 0.f;
  for (int n = threadIdx.x; n < Npad; n += blockDim.x) row[n] = n < N ? row[n] * inv : 0.f;
}

static int softmax(float *S, const int *dense, const int *npools, const int *tail, const int *dpos, int t0, int tc, int H,
                   int P, int Npad, float scale) {
  const dim3 g(tc * H);
  if (Npad <= 256) gk_launch(mla_softmax_reg_k<1>, g, 256, 0, S, dense, npools, tail, dpos, t0, H, P, Npad, scale);
  else if (Npad <= 512) gk_launch(mla_softmax_reg_k<2>, g, 256, 0, S, dense, npools, tail, dpos, t0, H, P, Npad, scale);
  else if (Npad <= 1024) gk_launch(mla_softmax_reg_k<4>, g, 256, 0, S, dense, npools, tail, dpos, t0, H, P, Npad, scale);
  else if (Npad <= 2048) gk_launch(mla_softmax_reg_k<8>, g, 256, 0, S, dense, npools, tail, dpos, t0, H, P, Npad, scale);
  else if (Npad <= 4096) gk_launch(mla_softmax_reg_k<16>, g, 256, 0, S, dense, npools, tail, dpos, t0, H, P, Npad, scale);
  else gk_launch(mla_softmax_k, g, 256, 0, S, dense, npools, tail, dpos, t0, H, P, Npad, scale);
  return GK_LAUNCHED("mla softmax");
}

static int blas(void) {
  return (g_h = gk_blas_handle()) ? 0 : gk_fail("mla gemm: cuBLAS not initialised (gk_init)");
}
#endif

extern "C" int gk_mla_attn_gemm(const float *qt, const float *latent, const int *dense, const int *npools, const int *tail,
                                const int *pools, int T, const int *dpos, int pos0, int H, int kl, int P, int K, float scale,
                                float *ob) {
#if !GK_HAVE_BLAS
  (void)qt; (void)latent; (void)dense; (void)npools; (void)tail; (void)pools; (void)T; (void)dpos; (void)pos0; (void)H;
  (void)kl; (void)P; (void)K; (void)scale; (void)ob;
  return 1; /* no BLAS: the caller uses gk_mla_attn */
#else
  if (T <= 0) return 0;
  if (kl % 4) return 1;
  if (blas()) return -1;
  const size_t budget = (size_t)768 << 20; /* scratch bytes for G and S per sub-chunk */
  const int prefix_until = (K + 1) * P - 1; /* positions < this select a cache prefix */
  for (int t0 = 0; t0 < T;) {
    const int last_bound = pos0 + T; /* N_t <= pos + 1 <= pos0 + T */
    int Npad = last_bound < (K + 1) * P ? last_bound : (K + 1) * P; /* rows per token, padded with p = 0 */
    /* tokens whose selection is a cache prefix need no gather */
    const int prefix = pos0 + t0 < prefix_until;
    int tc;
    if (prefix) {
      tc = prefix_until - (pos0 + t0);
      if (tc > T - t0) tc = T - t0;
      /* the rows past a token's own pos + 1 are computed and weighted 0:
       * sub-chunks of at most 1/8 of the prefix (32 tokens at least) keep
       * that padding under ~6% of the work */
      const int most = (pos0 + t0) / 8 > 32 ? (pos0 + t0) / 8 : 32;
      if (tc > most) tc = most;
      Npad = pos0 + t0 + tc; /* pos + 1 rows at most; never past the cache rows written */
    } else {
      tc = T - t0;
    }
    const size_t per_tok = (size_t)H * Npad * 4 + (prefix ? 0 : (size_t)Npad * kl * 4);
    size_t cap = budget / per_tok;
    if (cap < 1) cap = 1;
    if ((size_t)tc > cap) tc = (int)cap;
    const size_t s_bytes = ((size_t)tc * H * Npad * 4 + 255) & ~(size_t)255; /* G is written as float4 */
    char *b = (char *)buf(s_bytes + (prefix ? 0 : (size_t)tc * Npad * kl * 4));
    if (!b) return -1;
    float *S = (float *)b, *G = prefix ? NULL : (float *)(b + s_bytes);
    const float *A = latent;
    long long strideA = 0;
    if (!prefix) {
      gk_launch(mla_gather_k, dim3(tc, (Npad + 7) / 8), 256, 0, latent, dense, npools, tail, pools, dpos, t0, P, K, kl, Npad, G);
      if (GK_LAUNCHED("mla gather")) return -1;
      A = G;
      strideA = (long long)Npad * kl;
    }
    const float one = 1.f, zero = 0.f;
    const int mode = gk_mla_math();
#if GK_HIP
    cublasComputeType_t ct = mode == GK_MLA_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
#else
    cublasComputeType_t ct = mode == GK_MLA_TF32     ? CUBLAS_COMPUTE_32F_FAST_TF32
                             : mode == GK_MLA_BF16X9 ? CUBLAS_COMPUTE_32F_EMULATED_16BFX9
                                                     : CUBLAS_COMPUTE_32F;
#endif
    /* a batch of one GEMM per token; tokens over a shared cache prefix
     * (stride 0) are one GEMM of tc * H columns: the q~ rows, S rows and
     * outputs of consecutive tokens are adjacent */
    const int nb = prefix ? 1 : tc, nh = prefix ? tc * H : H;
    /* column-major: S_t^T [Npad x H] = G_t [Npad x kl] (row-major G is kl x Npad col-major: OP_T) x q~_t^T [kl x H] */
    auto scores = [&]() {
      return cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_T, CUBLAS_OP_N, Npad, nh, kl, &one, A, CUDA_R_32F, kl, strideA,
                                        qt + (size_t)t0 * H * kl, CUDA_R_32F, kl, (long long)H * kl, &zero, S, CUDA_R_32F,
                                        Npad, (long long)H * Npad, nb, ct, CUBLAS_GEMM_DEFAULT);
    };
    cublasStatus_t st = scores();
    if (st != CUBLAS_STATUS_SUCCESS && mode == GK_MLA_BF16X9) { /* emulation not offered here: fp32 from now on */
      fprintf(stderr, "glm53 warn: gpu: cuBLAS has no bf16x9-emulated fp32 GEMM on this device; MLA GEMM form in fp32\n");
      g_math = GK_MLA_FP32;
      ct = CUBLAS_COMPUTE_32F;
      st = scores();
    }
    if (st != CUBLAS_STATUS_SUCCESS) return gk_fail("mla gemm: scores GEMM failed (%d x %d x %d, batch %d)", Npad, nh, kl, nb);
    if (GK_LAUNCHED("mla scores gemm") || softmax(S, dense, npools, tail, dpos, t0, tc, H, P, Npad, scale)) return -1;
    /* o_t^T [kl x H] = G_t^T [kl x Npad] x P_t^T [Npad x H] */
    if (cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, kl, nh, Npad, &one, A, CUDA_R_32F, kl, strideA, S,
                                   CUDA_R_32F, Npad, (long long)H * Npad, &zero, ob + (size_t)t0 * H * kl, CUDA_R_32F, kl,
                                   (long long)H * kl, nb, ct, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      return gk_fail("mla gemm: output GEMM failed (%d x %d x %d, batch %d)", kl, nh, Npad, nb);
    if (GK_LAUNCHED("mla output gemm")) return -1;
    t0 += tc;
  }
  return 0;
#endif
}

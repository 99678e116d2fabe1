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
 * fp32 throughout (SGEMM, no TF32): results match gk_mla_attn to fp32
 * rounding, not bitwise (another summation order). */
#include "gk_common.cuh"
#include <math.h>

#if GK_HAVE_BLAS
static cublasHandle_t g_h;
static int g_h_ok;
static void *g_buf;
static size_t g_buf_n;

static void *buf(size_t n) {
  if (g_buf_n >= n) return g_buf;
  gk_free(g_buf);
  g_buf = gk_malloc(n);
  g_buf_n = g_buf ? n : 0;
  return g_buf;
}

/* G[t][n][:] = latent row of the n-th selected token of t0 + t, zero past N_t */
__global__ void mla_gather_k(const float *latent, const int *dense, const int *npools, const int *tail, const int *pools,
                             const int *dpos, int t0, int P, int K, int kl, int Npad, float *G) {
  GK_PDL_BEGIN();
  const int t = t0 + blockIdx.x, pos = *dpos + t;
  const int isd = dense[t], np = npools[t], tb = tail[t], N = sel_count(isd, np, tb, pos, P);
  const int *pl = pools + (size_t)t * K;
  const int q4 = kl / 4;
  float4 *g = (float4 *)(G + (size_t)blockIdx.x * Npad * kl);
  for (size_t i = blockIdx.y * (size_t)blockDim.x + threadIdx.x; i < (size_t)Npad * q4; i += (size_t)gridDim.y * blockDim.x) {
    int n = (int)(i / q4), c = (int)(i % q4);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (n < N) {
      int tok = sel_row(isd, np, tb, pl, P, n);
      v = ((const float4 *)(latent + (size_t)tok * kl))[c];
    }
    g[i] = v;
  }
}

/* one block per (token, head) row of S: p = exp(scale*s - max) / sum over
 * n < N_t, 0 beyond */
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

static int blas(void) {
  if (g_h_ok) return 0;
  if (cublasCreate(&g_h) != CUBLAS_STATUS_SUCCESS) return gk_fail("mla gemm: cuBLAS initialisation failed");
#if !GK_HIP
  cublasSetStream(g_h, cudaStreamPerThread);
#endif
  g_h_ok = 1;
  return 0;
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
      dim3 gg(tc, 8);
      gk_launch(mla_gather_k, gg, 256, 0, latent, dense, npools, tail, pools, dpos, t0, P, K, kl, Npad, G);
      if (GK_LAUNCHED("mla gather")) return -1;
      A = G;
      strideA = (long long)Npad * kl;
    }
    const float one = 1.f, zero = 0.f;
    /* column-major: S_t^T [Npad x H] = G_t [Npad x kl] (row-major G is kl x Npad col-major: OP_T) x q~_t^T [kl x H] */
    if (cublasSgemmStridedBatched(g_h, CUBLAS_OP_T, CUBLAS_OP_N, Npad, H, kl, &one, A, kl, strideA,
                                  qt + (size_t)t0 * H * kl, kl, (long long)H * kl, &zero, S, Npad, (long long)H * Npad,
                                  tc) != CUBLAS_STATUS_SUCCESS)
      return gk_fail("mla gemm: scores SGEMM failed (%d x %d x %d, batch %d)", Npad, H, kl, tc);
    gk_launch(mla_softmax_k, tc * H, 256, 0, S, dense, npools, tail, dpos, t0, H, P, Npad, scale);
    if (GK_LAUNCHED("mla softmax")) return -1;
    /* o_t^T [kl x H] = G_t^T [kl x Npad] x P_t^T [Npad x H] */
    if (cublasSgemmStridedBatched(g_h, CUBLAS_OP_N, CUBLAS_OP_N, kl, H, Npad, &one, A, kl, strideA, S, Npad,
                                  (long long)H * Npad, &zero, ob + (size_t)t0 * H * kl, kl, (long long)H * kl,
                                  tc) != CUBLAS_STATUS_SUCCESS)
      return gk_fail("mla gemm: output SGEMM failed (%d x %d x %d, batch %d)", kl, H, Npad, tc);
    t0 += tc;
  }
  return 0;
#endif
}

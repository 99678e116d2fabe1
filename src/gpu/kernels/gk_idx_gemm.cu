/* DSA indexer scores for long chunks of one sequence through one fp32
 * cuBLAS GEMM per sub-chunk, instead of idx_scores_k's warp per pool (one
 * dot product per head and pool on the CUDA cores, ~7 TFLOP/s at a
 * 4096-token prefill).
 *
 * Every query that sees more than K complete pools scores them all:
 *   D [t, h][p] = q_t,h . key_p             (SGEMM, every pool of the sub-chunk)
 *   score[t][p] = sum over h of (w_t,h / sqrt(nh)) * relu(D / sqrt(hd))
 * for p below the token's own pool count; the head sum runs in ascending
 * head order (idx_scores_k sums lane partials in a tree: the same terms,
 * another order, so the scores agree to fp32 rounding, not bitwise). */
#include "gk_common.cuh"

#if GK_HAVE_BLAS
static gk_scratch g_buf;

/* one thread per (token, pool): the weighted ReLU sum over heads, pools in
 * consecutive threads (coalesced reads of D's columns) */
__global__ void idx_reduce_k(const float *D, int ldd, const float *w, const int *dpos, int t0, int P, int nh, int K,
                             float s, float ws, int maxpool, float *score) {
  GK_PDL_BEGIN();
  const int tl = blockIdx.x, t = t0 + tl, n = (*dpos + t + 1) / P;
  const int p = blockIdx.y * blockDim.x + threadIdx.x;
  if (n <= K || p >= n) return;
  const float *col = D + (size_t)tl * nh * ldd + p;
  float acc = 0;
  for (int h = 0; h < nh; h++) {
    const float d = col[(size_t)h * ldd] * s;
    if (d > 0) acc += (w[(size_t)t * nh + h] * ws) * d;
  }
  score[(size_t)t * maxpool + p] = acc;
}
#endif

extern "C" int gk_indexer_scores_gemm(const float *q, const float *w, const float *pool, int T, const int *dpos, int pos0,
                                      int P, int nh, int hd, int K, int maxpool, float *score) {
#if !GK_HAVE_BLAS
  (void)q; (void)w; (void)pool; (void)T; (void)dpos; (void)pos0; (void)P; (void)nh; (void)hd; (void)K; (void)maxpool;
  (void)score;
  return 1;
#else
  cublasHandle_t h = gk_blas_handle();
  if (!h) return gk_fail("indexer gemm: cuBLAS not initialised (gk_init)");
  const size_t budget = (size_t)512 << 20; /* bytes of D per sub-chunk */
  int t0 = (K + 1) * P - 1 - pos0;         /* the first token with more than K complete pools */
  if (t0 < 0) t0 = 0;
  const float one = 1.f, zero = 0.f, s = 1.0f / sqrtf((float)hd), ws = 1.0f / sqrtf((float)nh);
  while (t0 < T) {
    const int npool = (pos0 + T) / P;      /* complete pools at the end of the chunk */
    const int ld = (npool + 7) & ~7;
    int tc = (int)(budget / ((size_t)nh * ld * 4));
    if (tc < 1) tc = 1;
    if (tc > T - t0) tc = T - t0;
    const int np = (pos0 + t0 + tc) / P;   /* what this sub-chunk's last token sees */
    float *D = (float *)gk_scratch_grow(&g_buf, (size_t)tc * nh * ld * 4);
    if (!D) return -1;
    /* column-major: D [np x tc * nh] (ld) = pool [hd x np]^T x q [hd x tc * nh] */
    if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, np, tc * nh, hd, &one, pool, CUDA_R_32F, hd, q + (size_t)t0 * nh * hd,
                     CUDA_R_32F, hd, &zero, D, CUDA_R_32F, ld, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) !=
        CUBLAS_STATUS_SUCCESS)
      return gk_fail("indexer gemm: SGEMM failed (%d x %d x %d)", np, tc * nh, hd);
    if (GK_LAUNCHED("indexer scores gemm")) return -1;
    gk_launch(idx_reduce_k, dim3(tc, (np + 255) / 256), 256, 0, (const float *)D, ld, w, dpos, t0, P, nh, K, s, ws, maxpool,
              score);
    if (GK_LAUNCHED("indexer scores reduce")) return -1;
    t0 += tc;
  }
  return 0;
#endif
}

/* Absorbed MLA attention for long chunks (prefill) through cuBLAS GEMMs
 * instead of the per-(token, head) kernel of gk_layers.cu, which reads
 * every selected latent row once per head (64 times per token). Two forms:
 * the fp32 one described here (fp32, bf16x9, tf32), and the split-bf16 one
 * of the default arithmetic (bf16x3, bf16x4; attn_split below).
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
 * The fp32 form's arithmetic is fp32-accurate (bf16x9 or fp32: results
 * within fp32 rounding of gk_mla_attn; not bitwise: another summation
 * order), or TF32 when asked (within ~1e-3). The softmax holds a row in
 * registers (one read and one write of S). */
#include "gk_common.cuh"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The GEMMs' arithmetic (GLM53_GPU_MLA_MATH=bf16x3|bf16x4|bf16x9|fp32|tf32,
 * or gk_set_mla_math): GK_MLA_BF16X3 (default) inputs split into two bf16
 * terms and three of the four products on the bf16 tensor cores (~5e-6 in
 * the kernel test; every forward and golden test passes with it; 4096-token
 * prefill 526 ms vs 699 with bf16x9 on the H200); GK_MLA_BF16X4 all four
 * products (567 ms); GK_MLA_BF16X9 fp32 emulated with three bf16 terms per
 * input by cuBLAS (CUBLAS_COMPUTE_32F_EMULATED_16BFX9: fp32-level error,
 * 1e-7 in the kernel test; fp32 where cuBLAS does not offer it; as fast as
 * plain fp32 on the H200); GK_MLA_FP32 plain SGEMM; GK_MLA_TF32 TF32
 * tensor cores (inputs rounded to 10-bit mantissas): its ~3e-4 relative
 * error in the attention output flips near-tied routing and top-k choices
 * of the test models (forward test: 0.27 of the logits' range vs the CPU),
 * so opt-in only. An unknown value means the default. */
static int g_math = -1;
extern "C" void gk_set_mla_math(int mode) { g_math = mode < 0 || mode >= GK_MLA_NMATH ? -1 : mode; }
extern "C" int gk_mla_math(void) {
  if (g_math < 0) {
    const char *e = getenv("GLM53_GPU_MLA_MATH");
    g_math = !e                      ? GK_MLA_BF16X3
             : !strcmp(e, "fp32")   ? GK_MLA_FP32
             : !strcmp(e, "tf32")   ? GK_MLA_TF32
             : !strcmp(e, "bf16x9") ? GK_MLA_BF16X9
             : !strcmp(e, "bf16x4") ? GK_MLA_BF16X4
                                    : GK_MLA_BF16X3;
#if GK_HIP
    if (g_math == GK_MLA_BF16X9) g_math = GK_MLA_FP32; /* no such compute type in hipBLAS */
#endif
  }
  return g_math;
}
extern "C" const char *gk_mla_math_name(int mode) {
  static const char *nm[GK_MLA_NMATH] = {"fp32", "tf32", "bf16x9", "bf16x3", "bf16x4"};
  return mode >= 0 && mode < GK_MLA_NMATH ? nm[mode] : "fp32";
}
/* the relative error (max |err| / max |ref|) the tests allow each
 * arithmetic against a float64 loop: fp32-level for fp32 and bf16x9, the
 * inputs' 16 significant bits for the splits (plus the dropped lo.lo
 * product of bf16x3), 10-bit mantissas for TF32 */
extern "C" double gk_mla_math_tol(int mode) {
  return mode == GK_MLA_TF32 ? 3e-3 : mode == GK_MLA_BF16X3 ? 1e-4 : mode == GK_MLA_BF16X4 ? 5e-5 : 1e-5;
}

#if GK_HAVE_BLAS
static cublasHandle_t g_h; /* gk_blas_handle(), fetched per call */
static int g_no_x9;        /* cuBLAS refused the bf16x9 emulation: fp32 instead */
/* scratch that grows to the largest request: [0] the per-sub-chunk
 * buffers, [1] the split latent rows of the split arithmetics, [2..4] the
 * per-head form's (gk_mla_mha_gemm) */
static gk_scratch g_buf[6]; /* [2..4]: the per-head form's keys/values, their fp32 block, kv_b as bf16; [5] gk_mla_q16's */
static void *buf(int which, size_t n) { return gk_scratch_grow(&g_buf[which], n); }

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

/* the max over a block of 256 threads (8 warps), to every thread */
__device__ __forceinline__ float block_max256(float m, float *sh) {
  const float w = warp_max(m);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = w;
  __syncthreads();
  m = -INFINITY;
  for (int i = 0; i < 8; i++) m = fmaxf(m, sh[i]);
  return m;
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
  m = block_max256(m, sh); /* block_sum synchronises before it reuses sh */
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

/* ---- split-bf16 arithmetic (GK_MLA_BF16X3, GK_MLA_BF16X4) ----
 * Every fp32 input x is split x = hi + lo, hi = bf16(x), lo = bf16(x - hi)
 * (16 significant bits). A sum over k of a.b is then one bf16 tensor-core
 * GEMM over nt * k with fp32 accumulation, a laid out as nt chunks
 * (hi, hi, lo[, lo]) and b as (hi, lo, hi[, lo]): a_hi.b_hi + a_hi.b_lo +
 * a_lo.b_hi [+ a_lo.b_lo]. The latent rows (nt chunks of kl) are the b
 * side of the scores GEMM; for the output GEMM each chunk is a matrix of
 * its own (leading dimension nt * kl) and the probabilities two planes (hi,
 * lo), so the output is nt GEMMs over N accumulated in fp32. */
#define SPLIT_LO_A(nt) ((nt) == 3 ? 0x4u : 0xcu) /* which chunks hold lo: queries */
#define SPLIT_LO_B(nt) ((nt) == 3 ? 0x2u : 0xau) /* latent rows */
#define SPLIT_MAXROWS 8192                       /* the softmax's register rows (256 threads x 16 pairs) */

__device__ __forceinline__ void split2(float x, uint32_t *hi, uint32_t *lo) {
  *hi = bf16_bits(x);
  *lo = bf16_bits(x - __uint_as_float(*hi << 16));
}
/* a pair of values split: the two hi halves in one word, the lo in another */
__device__ __forceinline__ void split2x2(float2 v, uint32_t *hi, uint32_t *lo) {
  uint32_t hx, lx, hy, ly;
  split2(v.x, &hx, &lx);
  split2(v.y, &hy, &ly);
  *hi = hx | hy << 16;
  *lo = lx | ly << 16;
}

/* dst row r (nt * n bf16) = the split chunks of src row r (n floats, n
 * even, stride lds) for r < rows, zero for rows <= r < rows_pad; a thread
 * per pair of values, one 32-bit store per chunk */
__global__ void split_rows_k(const float *src, size_t lds, int rows, int rows_pad, int n, int nt, unsigned lomask,
                             uint16_t *dst) {
  GK_PDL_BEGIN();
  const int h2 = n / 2;
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)rows_pad * h2) return;
  const size_t r = i / h2;
  const int c = (int)(i % h2);
  uint32_t hi = 0, lo = 0;
  if (r < (size_t)rows) split2x2(*(const float2 *)(src + r * lds + 2 * c), &hi, &lo);
  uint32_t *d = (uint32_t *)(dst + r * nt * n) + c;
  for (int j = 0; j < nt; j++) d[(size_t)j * h2] = lomask >> j & 1 ? lo : hi;
}

/* mla_gather_k for the split arithmetics: G3[t][n] = the split chunks of
 * the n-th selected latent row of t0 + t (zero past N_t); kl even */
__global__ void mla_gather_split_k(const float *latent, const int *dense, const int *npools, const int *tail,
                                   const int *pools, const int *dpos, int t0, int P, int K, int kl, int Npad, int nt,
                                   unsigned lomask, uint16_t *G) {
  GK_PDL_BEGIN();
  const int t = t0 + blockIdx.x, pos = *dpos + t, lane = threadIdx.x & 31;
  const int n = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= Npad) return;
  const int isd = dense[t], np = npools[t], tb = tail[t], N = sel_count(isd, np, tb, pos, P);
  uint32_t *g = (uint32_t *)(G + ((size_t)blockIdx.x * Npad + n) * nt * kl); /* pairs of bf16 */
  const int h2 = kl / 2;
  if (n >= N) {
    for (int c = lane; c < nt * h2; c += 32) g[c] = 0;
    return;
  }
  const float2 *src = (const float2 *)(latent + (size_t)sel_row(isd, np, tb, pools + (size_t)t * K, P, n) * kl);
  for (int c = lane; c < h2; c += 32) {
    uint32_t hi, lo;
    split2x2(__ldg(src + c), &hi, &lo);
    for (int j = 0; j < nt; j++) g[j * h2 + c] = lomask >> j & 1 ? lo : hi;
  }
}

/* softmax of score row (t, h) of S (Npad wide, fp32), written split as two
 * planes of Npad bf16 (P2[row][0][n] = hi, P2[row][1][n] = lo); a thread
 * takes pairs of rows (Npad is even), one 32-bit store per plane (rows'
 * chunks interleaved for a single output GEMM measured slower: 34 ms
 * with strided stores, 46 staged through shared memory, vs 27 + 6 more
 * for the output GEMMs per 4096-token prefill). shared: S holds scores
 * against cache rows 0..Npad-1 and the token's selection masks them (row n
 * is in when n <= pos and the query is dense, n is in the tail or n's pool
 * is one it selected); else S holds its gathered rows, the first N_t in. */
template <int VP>
__global__ void __launch_bounds__(256) mla_softmax_split_k(const float *S, const int *dense, const int *npools,
                                                           const int *tail, const int *pools, const int *dpos, int t0,
                                                           int H, int P, int K, int Npad, float scale, int shared,
                                                           uint32_t *P2) {
  GK_PDL_BEGIN();
  __shared__ float sh[32];
  __shared__ uint32_t bm[SPLIT_MAXROWS / 32]; /* shared: the pools the token selected (fewer than Npad / P) */
  const int t = t0 + blockIdx.x / H, pos = *dpos + t;
  const int isd = dense[t], np = npools[t], tb = tail[t], N = sel_count(isd, np, tb, pos, P);
  const int masked = shared && !isd; /* the same for the whole block */
  if (masked) {
    for (int i = threadIdx.x; i < SPLIT_MAXROWS / 32; i += 256) bm[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < np; i += 256) {
      const int p = pools[(size_t)t * K + i];
      atomicOr(&bm[p >> 5], 1u << (p & 31));
    }
    __syncthreads();
  }
  const float2 *row = (const float2 *)(S + (size_t)blockIdx.x * Npad);
  const int half = Npad / 2;
  float v[2 * VP], m = -INFINITY;
  uint32_t in = 0;
#pragma unroll
  for (int i = 0; i < VP; i++) {
    const int q = threadIdx.x + i * 256;
    const float2 x = q < half ? row[q] : make_float2(0.f, 0.f);
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int n = 2 * q + e, pl = n / P;
      const bool sel = !shared ? n < N : n <= pos && (!masked || n >= tb || (bm[pl >> 5] >> (pl & 31) & 1));
      in |= (uint32_t)sel << (2 * i + e);
      v[2 * i + e] = sel ? (e ? x.y : x.x) * scale : -INFINITY;
      m = fmaxf(m, v[2 * i + e]);
    }
  }
  m = block_max256(m, sh); /* block_sum synchronises before it reuses sh */
  float z = 0;
#pragma unroll
  for (int i = 0; i < 2 * VP; i++) {
    v[i] = in >> i & 1 ? expf(v[i] - m) : 0.f;
    z += v[i];
  }
  z = block_sum(z, sh);
  const float inv = z > 0 ? 1.0f / z : 0.f;
  uint32_t *hi_plane = P2 + (size_t)blockIdx.x * Npad, *lo_plane = hi_plane + half;
#pragma unroll
  for (int i = 0; i < VP; i++) {
    const int q = threadIdx.x + i * 256;
    if (q >= half) break;
    split2x2(make_float2(v[2 * i] * inv, v[2 * i + 1] * inv), &hi_plane[q], &lo_plane[q]);
  }
}

static int softmax_split(const float *S, const int *dense, const int *npools, const int *tail, const int *pools,
                         const int *dpos, int t0, int tc, int H, int P, int K, int Npad, float scale, int shared,
                         uint16_t *P2) {
  const dim3 g(tc * H);
#define SMX(V) gk_launch(mla_softmax_split_k<V>, g, 256, 0, S, dense, npools, tail, pools, dpos, t0, H, P, K, Npad, scale, \
                         shared, (uint32_t *)P2)
  if (Npad <= 512) SMX(1);
  else if (Npad <= 1024) SMX(2);
  else if (Npad <= 2048) SMX(4);
  else if (Npad <= 4096) SMX(8);
  else SMX(16); /* Npad <= SPLIT_MAXROWS (attn_split) */
#undef SMX
  return GK_LAUNCHED("mla softmax");
}

static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }
static int rnd8(int n) { return (n + 7) & ~7; }

/* gk_mla_attn_gemm in the split arithmetics with nt terms: bf16 GEMMs over
 * nt-times-longer sums. Sub-chunks whose rows fit SPLIT_MAXROWS and at
 * most 4 selections' worth take the scores of every cache row of the chunk
 * in one GEMM (the latent split once per call and shared by all heads and
 * tokens, the selection a mask in the softmax: up to ~2x the products of
 * the selected rows, but dense GEMMs and no gather); longer contexts gather
 * each token's rows and run one GEMM per token (batched). Rows per
 * sub-chunk are padded to a multiple of 8 (16-byte leading dimensions). */
static int attn_split(const float *qt, const float *latent, const int *dense, const int *npools, const int *tail,
                      const int *pools, int T, const int *dpos, int pos0, int H, int kl, int P, int K, float scale,
                      float *ob, int nt) {
  const size_t budget = (size_t)768 << 20; /* scratch bytes per sub-chunk */
  const int selmax = (K + 1) * P, ctx = pos0 + T;
  int shared_max = 4 * selmax < SPLIT_MAXROWS ? 4 * selmax : SPLIT_MAXROWS;
  shared_max &= ~7;
  const uint16_t *L3 = NULL;
  int lrows = 0; /* rows of the split latent L3 (zero past ctx) */
  if (pos0 + (T < 32 ? T : 32) <= shared_max) {
    lrows = rnd8(ctx) < shared_max ? rnd8(ctx) : shared_max;
    uint16_t *l3 = (uint16_t *)buf(1, (size_t)lrows * nt * kl * 2);
    if (!l3) return -1;
    const int have = ctx < lrows ? ctx : lrows;
    gk_launch(split_rows_k, (unsigned)(((size_t)lrows * kl / 2 + 255) / 256), 256, 0, latent, (size_t)kl, have, lrows, kl, nt,
              SPLIT_LO_B(nt), l3);
    if (GK_LAUNCHED("mla split latent")) return -1;
    L3 = l3;
  }
  const float one = 1.f, zero = 0.f;
  for (int t0 = 0; t0 < T;) {
    /* rows past a token's own position are masked: sub-chunks of at most
     * 1/8 of the position (32 tokens at least) keep that under ~6% */
    int tc = (pos0 + t0) / 8 > 32 ? (pos0 + t0) / 8 : 32;
    if (tc > T - t0) tc = T - t0;
    int Npad = rnd8(pos0 + t0 + tc);
    const int shared = Npad <= lrows;
    if (!shared) {
      tc = T - t0;
      Npad = rnd8(ctx < selmax ? ctx : selmax);
    }
    const size_t per_tok = (size_t)H * Npad * 4 + (size_t)H * 2 * Npad * 2 + (size_t)H * nt * kl * 2 +
                           (shared ? 0 : (size_t)Npad * nt * kl * 2);
    size_t cap = budget / per_tok;
    if (cap < 1) cap = 1;
    if ((size_t)tc > cap) tc = (int)cap;
    const size_t sb = al256((size_t)tc * H * Npad * 4), pb = al256((size_t)tc * H * 2 * Npad * 2),
                 qb = al256((size_t)tc * H * nt * kl * 2);
    char *b = (char *)buf(0, sb + pb + qb + (shared ? 0 : (size_t)tc * Npad * nt * kl * 2));
    if (!b) return -1;
    float *S = (float *)b;
    uint16_t *P2 = (uint16_t *)(b + sb), *Q3 = (uint16_t *)(b + sb + pb), *G3 = shared ? NULL : (uint16_t *)(b + sb + pb + qb);
    gk_launch(split_rows_k, (unsigned)(((size_t)tc * H * kl / 2 + 255) / 256), 256, 0, qt + (size_t)t0 * H * kl, (size_t)kl,
              tc * H, tc * H, kl, nt, SPLIT_LO_A(nt), Q3);
    if (GK_LAUNCHED("mla split queries")) return -1;
    if (!shared) {
      gk_launch(mla_gather_split_k, dim3(tc, (Npad + 7) / 8), 256, 0, latent, dense, npools, tail, pools, dpos, t0, P, K, kl,
                Npad, nt, SPLIT_LO_B(nt), G3);
      if (GK_LAUNCHED("mla gather")) return -1;
    }
    const int kq = nt * kl;
    cublasStatus_t st;
    /* column-major, as in gk_mla_attn_gemm: S^T [Npad x cols] = L3 (rows of kq) x Q3^T */
    if (shared)
      st = cublasGemmEx(g_h, CUBLAS_OP_T, CUBLAS_OP_N, Npad, tc * H, kq, &one, L3, CUDA_R_16BF, kq, Q3, CUDA_R_16BF, kq,
                        &zero, S, CUDA_R_32F, Npad, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
      st = cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_T, CUBLAS_OP_N, Npad, H, kq, &one, G3, CUDA_R_16BF, kq,
                                      (long long)Npad * kq, Q3, CUDA_R_16BF, kq, (long long)H * kq, &zero, S, CUDA_R_32F,
                                      Npad, (long long)H * Npad, tc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
      return gk_fail("mla gemm %s: scores GEMM failed (%d x %d x %d)", gk_mla_math_name(nt == 3 ? GK_MLA_BF16X3 : GK_MLA_BF16X4),
                     Npad, tc * H, kq);
    if (GK_LAUNCHED("mla scores gemm") ||
        softmax_split(S, dense, npools, tail, pools, dpos, t0, tc, H, P, K, Npad, scale, shared, P2))
      return -1;
    /* o^T [kl x cols] = sum over the term pairs (P plane, latent chunk) of
     * chunk^T x plane^T: chunk j is the j-th kl-slice of every L3 (G3) row,
     * lda = kq; a row's planes (hi, lo) are Npad apart, rows 2 * Npad */
    float *o = ob + (size_t)t0 * H * kl;
    static const int pa[4] = {0, 0, 1, 1}, lb[4] = {0, 1, 2, 3}; /* plane, chunk: hi.hi, hi.lo, lo.hi[, lo.lo] */
    for (int j = 0; j < nt; j++) {
      const float *beta = j ? &one : &zero;
      const uint16_t *Pj = P2 + (size_t)pa[j] * Npad, *Lj = (shared ? L3 : G3) + (size_t)lb[j] * kl;
      if (shared)
        st = cublasGemmEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, kl, tc * H, Npad, &one, Lj, CUDA_R_16BF, kq, Pj, CUDA_R_16BF,
                          2 * Npad, beta, o, CUDA_R_32F, kl, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      else
        st = cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, kl, H, Npad, &one, Lj, CUDA_R_16BF, kq,
                                        (long long)Npad * kq, Pj, CUDA_R_16BF, 2 * Npad, (long long)H * 2 * Npad, beta, o,
                                        CUDA_R_32F, kl, (long long)H * kl, tc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS)
        return gk_fail("mla gemm %s: output GEMM %d failed (%d x %d x %d)",
                       gk_mla_math_name(nt == 3 ? GK_MLA_BF16X3 : GK_MLA_BF16X4), j, kl, tc * H, Npad);
    }
    if (GK_LAUNCHED("mla output gemm")) return -1;
    t0 += tc;
  }
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
  const int mode = gk_mla_math();
  if ((mode == GK_MLA_BF16X3 || mode == GK_MLA_BF16X4) && (K + 1) * P <= SPLIT_MAXROWS)
    return attn_split(qt, latent, dense, npools, tail, pools, T, dpos, pos0, H, kl, P, K, scale, ob,
                      mode == GK_MLA_BF16X3 ? 3 : 4);
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
    char *b = (char *)buf(0, s_bytes + (prefix ? 0 : (size_t)tc * Npad * kl * 4));
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
    /* the split modes get here for selections too long for their softmax: fp32-accurate then */
#if GK_HIP
    cublasComputeType_t ct = mode == GK_MLA_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
#else
    cublasComputeType_t ct = mode == GK_MLA_TF32               ? CUBLAS_COMPUTE_32F_FAST_TF32
                             : mode == GK_MLA_FP32 || g_no_x9 ? CUBLAS_COMPUTE_32F
                                                               : CUBLAS_COMPUTE_32F_EMULATED_16BFX9;
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
#if !GK_HIP
    if (st != CUBLAS_STATUS_SUCCESS && ct == CUBLAS_COMPUTE_32F_EMULATED_16BFX9) { /* not offered here: fp32 from now on */
      fprintf(stderr, "glm53 warn: gpu: cuBLAS has no bf16x9-emulated fp32 GEMM on this device; MLA GEMM form in fp32\n");
      g_no_x9 = 1;
      if (g_math == GK_MLA_BF16X9) g_math = GK_MLA_FP32;
      ct = CUBLAS_COMPUTE_32F;
      st = scores();
    }
#endif
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

/* ---- per-head (MHA) form of the long-chunk attention ----
 * The absorbed form scores and sums over kv_lora-wide latent rows for every
 * head; here each head's keys K_h = latent . W_UK[h]^T and values V_h =
 * latent . W_UV[h]^T (kv_b's rows) are made once per call for the cache
 * rows 0..lrows-1, and the heads attend over nope / vd-wide rows: per
 * (token, head, row) 2 x nope products for the scores (the query rounded
 * to bf16 as the absorbed form's W_UK product rounds it, the keys split hi
 * + lo) and 3 x vd for the output (probabilities and values split, lo.lo
 * dropped), against 3 x kl each in the absorbed bf16x3 form: at the
 * model's shape (nope = vd = 256, kl = 512) ~42% of its products, and the
 * two per-head products of the absorbed form (W_UK^T q, W_UV o) are gone.
 * The softmax and its selection masks are the absorbed split form's. */

#if GK_HAVE_BLAS
/* KV3[r][h] = (K hi, K lo, V hi, V lo) of the fp32 up-projections
 * src[r][h][nope + vd] (kv_b's row order), a thread per pair of values */
__global__ void mha_kv_split_k(const float *src, int rows, int H, int nope, int vd, uint16_t *KV3) {
  GK_PDL_BEGIN();
  const int hw = (nope + vd) / 2, ldh = 2 * (nope + vd);
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)rows * H * hw) return;
  const size_t rh = i / hw; /* r * H + h */
  const int j = 2 * (int)(i % hw);
  uint32_t hi, lo;
  split2x2(*(const float2 *)(src + rh * (nope + vd) + j), &hi, &lo);
  uint16_t *d = KV3 + rh * ldh;
  const int o = j < nope ? j : nope + j; /* K hi at j, K lo at nope + j; V hi at 2 nope + (j - nope), V lo vd further */
  const int w = j < nope ? nope : vd;
  *(uint32_t *)(d + o) = hi;
  *(uint32_t *)(d + o + w) = lo;
}

/* dst row r = (src row r, src row r), rows of n 32-bit words */
__global__ void dup_cols_k(const uint32_t *src, int rows, int n, uint32_t *dst) {
  GK_PDL_BEGIN();
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)rows * n) return;
  const size_t r = i / n;
  const uint32_t v = src[i];
  dst[i + r * n] = v;
  dst[i + r * n + n] = v;
}
#endif

static int g_mha = -1; /* GLM53_GPU_MLA_MHA=0: the absorbed form for every chunk */
extern "C" void gk_set_mla_mha(int on) { g_mha = on < 0 ? -1 : !!on; }
extern "C" int gk_mla_mha_on(void) {
  if (g_mha < 0) g_mha = !(getenv("GLM53_GPU_MLA_MHA") && !strcmp(getenv("GLM53_GPU_MLA_MHA"), "0"));
  return g_mha;
}

extern "C" int gk_mla_mha_gemm(const float *q, const float *latent, const gpu_mat *kvb, const int *dense, const int *npools,
                               const int *tail, const int *pools, int T, const int *dpos, int pos0, int H, int nope,
                               int vd, int kl, int P, int K, float scale, float *out) {
  int o16 = 0;
  return gk_mla_mha_gemm_out(q, NULL, latent, kvb, dense, npools, tail, pools, T, dpos, pos0, H, nope, vd, kl, P, K, scale,
                             out, &o16);
}
#if GK_HAVE_BLAS
/* whether gk_mla_mha_gemm_out takes a call: the bf16x3 arithmetic only,
 * every sub-chunk over the cache rows (no gathered selections), even
 * widths, a bf16 or quantized kv_b of this shape */
static bool mha_takes(const gpu_mat *kvb, int T, int pos0, int H, int nope, int vd, int kl, int P, int K) {
  const int selmax = (K + 1) * P, ctx = pos0 + T;
  int shared_max = 4 * selmax < SPLIT_MAXROWS ? 4 * selmax : SPLIT_MAXROWS;
  shared_max &= ~7;
  return gk_mla_mha_on() && gk_mla_math() == GK_MLA_BF16X3 && rnd8(ctx) <= shared_max && nope % 2 == 0 && vd % 2 == 0 &&
         kl % 2 == 0 && kvb->fmt != GF_F32 && kvb->rows == H * (nope + vd) && kvb->cols == kl;
}
/* mha_takes, and by the fused kernel: the calls that may be given bf16 queries */
static bool fused_takes(const gpu_mat *kvb, int T, int pos0, int H, int nope, int vd, int kl, int P, int K) {
  return mha_takes(kvb, T, pos0, H, nope, vd, kl, P, K) && gk_mla_flash_fits(nope, vd, P);
}
#endif
/* gk_mla_q16 offers its buffer unless GLM53_GPU_MLA_Q16=0 (same bits;
 * 1.2-5.3 ms faster per 4096-token prefill on an H100,
 * docs/gpu-measurements.md, nineteenth session) */
static int g_q16 = -1;
extern "C" void gk_set_mla_q16(int on) { g_q16 = on < 0 ? -1 : !!on; }
extern "C" void *gk_mla_q16(const gpu_mat *kvb, int T, int pos0, int H, int nope, int vd, int kl, int P, int K) {
#if !GK_HAVE_BLAS || GK_HIP
  (void)kvb; (void)T; (void)pos0; (void)H; (void)nope; (void)vd; (void)kl; (void)P; (void)K;
  return NULL;
#else
  if (g_q16 < 0) g_q16 = !(getenv("GLM53_GPU_MLA_Q16") && !strcmp(getenv("GLM53_GPU_MLA_Q16"), "0"));
  if (!g_q16 || T <= 0 || !fused_takes(kvb, T, pos0, H, nope, vd, kl, P, K)) return NULL;
  return buf(5, (size_t)T * H * nope * 2);
#endif
}
extern "C" int gk_mla_mha_gemm_out(const float *q, const void *q16, const float *latent, const gpu_mat *kvb,
                                   const int *dense, const int *npools, const int *tail, const int *pools, int T,
                                   const int *dpos, int pos0, int H, int nope, int vd, int kl, int P, int K, float scale,
                                   void *out_, int *out16) {
  const int want16 = *out16;
  *out16 = 0;
  float *out = (float *)out_; /* the forms other than the fused kernel's write fp32 */
#if !GK_HAVE_BLAS
  (void)q; (void)q16; (void)latent; (void)kvb; (void)dense; (void)npools; (void)tail; (void)pools; (void)T; (void)dpos;
  (void)pos0; (void)H; (void)nope; (void)vd; (void)kl; (void)P; (void)K; (void)scale; (void)out; (void)want16;
  return q16 ? gk_fail("mla mha: bf16 queries without the fused kernel") : 1;
#else
  if (T <= 0) return 0;
  if (q16 && !fused_takes(kvb, T, pos0, H, nope, vd, kl, P, K))
    return gk_fail("mla mha: bf16 queries (gk_mla_q16) for a call the fused kernel does not take");
  if (!q16 && !mha_takes(kvb, T, pos0, H, nope, vd, kl, P, K)) return 1;
  const int ctx = pos0 + T;
  if (blas()) return -1;
  const int lrows = rnd8(ctx), R = kvb->rows, ldh = 2 * (nope + vd);
  const float one = 1.f, zero = 0.f;
  const void *W = kvb->d;  /* bf16 rows */
  /* W2 = [W | W] (R rows of 2 kl): one GEMM against the latent's (hi | lo)
   * rows sums both products (a quantized kv_b dequantised to bf16 first,
   * as the other prefill GEMMs do) */
  uint16_t *W2 = (uint16_t *)buf(4, (size_t)R * kl * 2 * (kvb->fmt != GF_BF16 ? 3 : 2));
  if (!W2) return -1;
  if (kvb->fmt != GF_BF16) {
    gk_dequant_bf16(kvb, (__nv_bfloat16 *)(W2 + (size_t)R * 2 * kl));
    W = W2 + (size_t)R * 2 * kl;
  }
  gk_launch(dup_cols_k, (unsigned)(((size_t)R * kl / 2 + 255) / 256), 256, 0, (const uint32_t *)W, R, kl / 2, (uint32_t *)W2);
  if (GK_LAUNCHED("mla mha kv_b twice")) return -1;
  /* the latent rows split (hi, lo), zero past ctx */
  uint16_t *L2 = (uint16_t *)buf(1, (size_t)lrows * 2 * kl * 2);
  uint16_t *KV3 = (uint16_t *)buf(2, (size_t)lrows * H * ldh * 2);
  if (!L2 || !KV3) return -1;
  gk_launch(split_rows_k, (unsigned)(((size_t)lrows * kl / 2 + 255) / 256), 256, 0, latent, (size_t)kl, ctx, lrows, kl, 2,
            0x2u, L2);
  if (GK_LAUNCHED("mla mha split latent")) return -1;
  /* K and V of every head for blocks of rows: fp32 (hi and lo products of
   * the exact bf16 weights summed), then split */
  const int rb = (int)(((size_t)256 << 20) / ((size_t)R * 4)) & ~7;
  const int rblk = rb < 8 ? 8 : rb;
  float *KVf = (float *)buf(3, (size_t)(rblk < lrows ? rblk : lrows) * R * 4);
  if (!KVf) return -1;
  for (int r0 = 0; r0 < lrows; r0 += rblk) {
    const int n = lrows - r0 < rblk ? lrows - r0 : rblk;
    /* column-major: KVf^T [R x n] = W2 [R x 2 kl] (row-major: OP_T) x L2^T [2 kl x n] */
    if (cublasGemmEx(g_h, CUBLAS_OP_T, CUBLAS_OP_N, R, n, 2 * kl, &one, W2, CUDA_R_16BF, 2 * kl, L2 + (size_t)r0 * 2 * kl,
                     CUDA_R_16BF, 2 * kl, &zero, KVf, CUDA_R_32F, R, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      return gk_fail("mla mha: key/value GEMM failed (%d x %d x %d)", R, n, 2 * kl);
    if (GK_LAUNCHED("mla mha kv gemm")) return -1;
    gk_launch(mha_kv_split_k, (unsigned)(((size_t)n * H * (nope + vd) / 2 + 255) / 256), 256, 0, KVf, n, H, nope, vd,
              KV3 + (size_t)r0 * H * ldh);
    if (GK_LAUNCHED("mla mha kv split")) return -1;
  }
  if (gk_mla_flash_fits(nope, vd, P)) { /* every token in one fused launch: no scores in memory */
    const int nw = gk_mla_flash_map_words(lrows, P);
    const size_t qb = al256((size_t)T * H * nope * 2);
    char *fb = (char *)buf(0, qb + (size_t)T * nw * 4);
    if (!fb) return -1;
    const uint16_t *Q16 = (const uint16_t *)q16;
    if (!Q16) { /* the queries rounded to bf16 (gk_mla_q16: the query product wrote them so) */
      gk_launch(split_rows_k, (unsigned)(((size_t)T * H * nope / 2 + 255) / 256), 256, 0, q, (size_t)nope, T * H, T * H,
                nope, 1, 0u, (uint16_t *)fb);
      if (GK_LAUNCHED("mla mha split queries")) return -1;
      Q16 = (const uint16_t *)fb;
    }
    const int rc = gk_mla_flash_out(Q16, KV3, dense, npools, tail, pools, K, dpos, T, H, nope, vd, P, lrows, scale,
                                    (uint32_t *)(fb + qb), out, want16);
    if (rc == 1 && q16) return gk_fail("mla mha: the fused kernel declined bf16 queries");
    if (rc == 0) *out16 = want16;
    return rc;
  }
  const size_t budget = (size_t)768 << 20; /* scratch bytes per sub-chunk */
  for (int t0 = 0; t0 < T;) {
    /* rows past a token's own position are masked: sub-chunks of at most
     * 1/8 of the position (32 tokens at least) keep that under ~6% */
    int tc = (pos0 + t0) / 8 > 32 ? (pos0 + t0) / 8 : 32;
    if (tc > T - t0) tc = T - t0;
    const int Npad = rnd8(pos0 + t0 + tc);
    const size_t per_tok = (size_t)H * Npad * 4 + (size_t)H * 2 * Npad * 2 + (size_t)H * 2 * nope * 2;
    size_t cap = budget / per_tok;
    if (cap < 1) cap = 1;
    if ((size_t)tc > cap) tc = (int)cap;
    const size_t sb = al256((size_t)tc * H * Npad * 4), pb = al256((size_t)tc * H * 2 * Npad * 2);
    char *b = (char *)buf(0, sb + pb + (size_t)tc * H * 2 * nope * 2);
    if (!b) return -1;
    float *S = (float *)b;
    uint16_t *P2 = (uint16_t *)(b + sb), *Q2 = (uint16_t *)(b + sb + pb);
    /* the queries rounded to bf16, twice: (q, q) against (K hi, K lo) */
    gk_launch(split_rows_k, (unsigned)(((size_t)tc * H * nope / 2 + 255) / 256), 256, 0, q + (size_t)t0 * H * nope,
              (size_t)nope, tc * H, tc * H, nope, 2, 0u, Q2);
    if (GK_LAUNCHED("mla mha split queries")) return -1;
    /* per head, column-major: S_h^T [Npad x tc] = KV3_h (rows of 2 nope, H ldh apart: OP_T) x Q2_h^T [2 nope x tc] */
    if (cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_T, CUBLAS_OP_N, Npad, tc, 2 * nope, &one, KV3, CUDA_R_16BF, H * ldh, ldh,
                                   Q2, CUDA_R_16BF, H * 2 * nope, 2 * nope, &zero, S, CUDA_R_32F, H * Npad, Npad, H,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
      return gk_fail("mla mha: scores GEMM failed (%d x %d x %d, %d heads)", Npad, tc, 2 * nope, H);
    if (GK_LAUNCHED("mla mha scores gemm") ||
        softmax_split(S, dense, npools, tail, pools, dpos, t0, tc, H, P, K, Npad, scale, 1, P2))
      return -1;
    /* out_h^T [vd x tc] = sum over (V plane, P plane) in (hi.hi, lo.hi, hi.lo) of V_h^T [vd x Npad] x P_h^T [Npad x tc] */
    static const int vp[3] = {0, 1, 0}, pp[3] = {0, 0, 1};
    for (int j = 0; j < 3; j++)
      if (cublasGemmStridedBatchedEx(g_h, CUBLAS_OP_N, CUBLAS_OP_N, vd, tc, Npad, &one, KV3 + 2 * nope + vp[j] * vd,
                                     CUDA_R_16BF, H * ldh, ldh, P2 + (size_t)pp[j] * Npad, CUDA_R_16BF, H * 2 * Npad,
                                     2 * Npad, j ? &one : &zero, out + (size_t)t0 * H * vd, CUDA_R_32F, H * vd, vd, H,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        return gk_fail("mla mha: output GEMM %d failed (%d x %d x %d, %d heads)", j, vd, tc, Npad, H);
    if (GK_LAUNCHED("mla mha output gemm")) return -1;
    t0 += tc;
  }
  return 0;
#endif
}

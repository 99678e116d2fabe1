/* Device kernels of one GLM-5.3 layer besides the matrix products: norms,
 * mHC, KDA (conv, gates, delta-rule recurrence, gated norm), the DSA indexer
 * (pooled keys, scores, deterministic top-k), absorbed MLA attention over the
 * latent cache, the MoE router and expert combine. Each mirrors one function
 * of the fp32 reference in src/model (named in the comments); fixed reduction
 * orders keep results bitwise reproducible and independent of how many tokens
 * share a launch. */
#include "gk_common.cuh"
#include "gk_mla_attn.cuh" /* mla_attn_k, mla_merge_k, mla_hs_k */
#include "gk_dsa.cuh"      /* store_at_k, pool_keys_k, idx_scores_k */
#include "gk_kda_recur.cuh" /* kr_load, kda_recur8_k */
#include "gk_mhc_post.cuh"  /* mhc_post_add, mhc_post_mix */
#include "gk_route.cuh"     /* route_token */
#include "gk_mhc_pre.cuh"   /* mhc_pre_tok, mhc_ssq, mhc_sinkhorn_warp */
#if !GK_HIP
#include "gk_mhc_tc.cuh" /* mhc_proj_tc_k, mhc_proj_sum_k */
#endif
#include <stdlib.h>
#include <string.h>


static int batch_ok(const gk_batch *b, const char *what) {
  if (b->nseg < 1 || b->nseg > 65535 || b->maxlen < 1) return gk_fail("%s: bad batch (%d segments, longest %d)", what, b->nseg, b->maxlen);
  return 0;
}

/* ---- embedding ---- */
__global__ void embed_k(gpu_mat E, const int32_t *tok, int T, int hc, float *X) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  int D = E.cols;
  if (i >= (size_t)T * D) return;
  int t = (int)(i / D), d = (int)(i % D);
  float v = wl1_any(E, tok[t], d);
  for (int h = 0; h < hc; h++) X[((size_t)t * hc + h) * D + d] = v;
}
extern "C" int gk_embed(const gpu_mat *E, const int32_t *tok, int T, int hc, float *X) {
  gk_launch(embed_k, gk_blocks((size_t)T * E->cols, 256), 256, 0, *E, tok, T, hc, X);
  return GK_LAUNCHED("embed");
}

/* ---- norms (ops.h rmsnorm / layernorm; rows: gk_device.cuh) ---- */
__global__ void rmsnorm_k(float *y, int ldy, const float *x, int ldx, const float *w, int n, float eps) {
  GK_PDL_BEGIN();
  __shared__ float sh[32];
  rmsnorm_row(y + (size_t)blockIdx.x * ldy, x + (size_t)blockIdx.x * ldx, w, n, eps, sh);
}
extern "C" int gk_rmsnorm(float *y, int ldy, const float *x, int ldx, const float *w, int T, int n, float eps) {
  if (T <= 0) return 0;
  gk_launch(rmsnorm_k, T, 256, 0, y, ldy, x, ldx, w, n, eps);
  return GK_LAUNCHED("rmsnorm");
}
extern "C" int gk_rmsnorm2(gk_norm_rows a, gk_norm_rows b, int T, float eps) {
  if (T <= 0) return 0;
  gk_launch(rmsnorm2_k, 2 * T, 256, 0, a, b, T, eps, gk_batch{}, -1, 0);
  return GK_LAUNCHED("rmsnorm");
}
static int idx_fuse_on(void);
extern "C" int gk_rmsnorm2_at(gk_norm_rows a, gk_norm_rows b, int T, float eps, const gk_batch *bt, int which, int stride) {
  if (T <= 0) return 0;
  if (batch_ok(bt, "rmsnorm2_at")) return -1;
  if (!idx_fuse_on()) { /* (the A/B: the two launches it replaces) */
    if (b.ldy != b.n) return gk_fail("rmsnorm2_at: rows of %d with stride %d", b.n, b.ldy);
    return gk_rmsnorm2(a, b, T, eps) || gk_store_at(bt, which, stride, b.y, T, b.n) ? -1 : 0;
  }
  gk_launch(rmsnorm2_k, 2 * T, 256, 0, a, b, T, eps, *bt, which, stride);
  return GK_LAUNCHED("rmsnorm + store");
}
__global__ void layernorm_k(float *y, int ldy, const float *x, int ldx, const float *w, const float *b, int n, float eps) {
  GK_PDL_BEGIN();
  __shared__ float sh[32];
  layernorm_row(y + (size_t)blockIdx.x * ldy, x + (size_t)blockIdx.x * ldx, w, b, n, eps, sh);
}
extern "C" int gk_layernorm(float *y, int ldy, const float *x, int ldx, const float *w, const float *b, int T, int n, float eps) {
  if (T <= 0) return 0;
  gk_launch(layernorm_k, T, 256, 0, y, ldy, x, ldx, w, b, n, eps);
  return GK_LAUNCHED("layernorm");
}

/* ---- clamped SwiGLU (ops.h swiglu_clamped) ---- */
__global__ void swiglu_k(float *g, const float *u, size_t n, float limit) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  g[i] = swiglu1(g[i], u[i], limit);
}
/* rows p of n elements with idx[p] == only (expert-by-expert streaming) */
__global__ void swiglu_only_k(float *g, const float *u, const int *idx, int npairs, int n, int only, float limit) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)npairs * n || idx[i / n] != only) return;
  g[i] = swiglu1(g[i], u[i], limit);
}
extern "C" int gk_swiglu_only(float *g, const float *u, const int *idx, int npairs, int n, int only, float limit) {
  if (npairs <= 0 || n <= 0) return 0;
  gk_launch(swiglu_only_k, gk_blocks((size_t)npairs * n, 256), 256, 0, g, u, idx, npairs, n, only, limit);
  return GK_LAUNCHED("swiglu_only");
}
extern "C" int gk_swiglu(float *g, const float *u, size_t n, float limit) {
  if (!n) return 0;
  gk_launch(swiglu_k, gk_blocks(n, 256), 256, 0, g, u, n, limit);
  return GK_LAUNCHED("swiglu");
}

/* ---- mHC (mhc.c; the pre's token work in gk_mhc_pre.cuh) ---- */
template <bool VEC, bool CACHE, int HC>
__global__ void mhc_pre_k(const float *X, const float *mixraw, const float *ssq, const float *base, const float *scale,
                          const float *norm_w, int hc_, int D, int iters, float hc_eps, float rms_eps, float *post, float *comb,
                          float *y, uint16_t *y16) {
  GK_PDL_BEGIN();
  mhc_pre_tok<VEC, CACHE, HC>(X, mixraw, ssq, base, scale, norm_w, hc_, D, iters, hc_eps, rms_eps, post, comb, y, y16,
                              blockIdx.x);
}
/* The comb matrix alone (gk_mhc_comb): the sum of squares and the Sinkhorn
 * exactly as mhc_pre_k computes them (same block size, loop and sums, so
 * the same bits), for a decode graph's branch beside the sublayer: the
 * post is the first reader of comb, so the Sinkhorn's latency chain
 * leaves the pre's path. */
#define MHC_PRE_THREADS 256
template <bool VEC, int HC>
__global__ void __launch_bounds__(MHC_PRE_THREADS)
    mhc_comb_k(const float *X, const float *mixraw, const float *ssq, const float *base, const float *scale, int hc_, int D,
               int iters, float hc_eps, float rms_eps, float *comb) {
  GK_PDL_BEGIN();
  __shared__ float sh[32];
  const int hc = HC ? HC : hc_, t = blockIdx.x, n = hc * D, lane = threadIdx.x & 31;
  const float *Xt = X + (size_t)t * n, *mu = mixraw + (size_t)t * (2 + hc) * hc;
  const float ss = mhc_ssq<VEC, false>(Xt, n, ssq, t, sh, NULL);
  if (threadIdx.x >= 32) return;
  const float r = 1.0f / sqrtf(ss / n + rms_eps);
  float sv = 0.f, sb = 0.f, ss2 = 0.f;
  if (HC) {
    if (lane < HC * HC) sv = mu[2 * HC + lane], sb = base[2 * HC + lane];
    ss2 = scale[2];
  }
  mhc_sinkhorn_warp<HC>(mu, base, scale, r, hc, iters, hc_eps, comb + (size_t)t * hc * hc, sv, sb, ss2);
}
static bool mhc_vec(int D, const float *X, const float *y, const float *norm_w, const void *y16) {
  return D % 4 == 0 && (uintptr_t)X % 16 == 0 && (uintptr_t)y % 16 == 0 && (uintptr_t)norm_w % 16 == 0 &&
         (uintptr_t)y16 % 8 == 0;
}
extern "C" int gk_mhc_comb(const float *X, const float *mixraw, const float *ssq, const float *base, const float *scale,
                           const float *norm_w, int T, int hc, int D, int iters, float hc_eps, float rms_eps,
                           float *comb, const float *y, const void *y16) {
  if (hc > MAX_HC) return gk_fail("mhc: hc_mult %d above %d", hc, MAX_HC);
  if (T <= 0) return 0;
  const bool vec = mhc_vec(D, X, y, norm_w, y16); /* the pre's choice of loop: the same sums */
  if (vec && hc == 4)
    gk_launch(mhc_comb_k<true, 4>, T, MHC_PRE_THREADS, 0, X, mixraw, ssq, base, scale, hc, D, iters, hc_eps, rms_eps, comb);
  else if (vec)
    gk_launch(mhc_comb_k<true, 0>, T, MHC_PRE_THREADS, 0, X, mixraw, ssq, base, scale, hc, D, iters, hc_eps, rms_eps, comb);
  else
    gk_launch(mhc_comb_k<false, 0>, T, MHC_PRE_THREADS, 0, X, mixraw, ssq, base, scale, hc, D, iters, hc_eps, rms_eps, comb);
  return GK_LAUNCHED("mhc comb");
}
/* the cached form's dynamic shared memory opt-in (once per size) */
static bool mhc_cache_smem(size_t bytes) {
  static size_t done;
  if (bytes <= done) return true;
  if (cudaFuncSetAttribute((const void *)mhc_pre_k<true, true, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  done = bytes;
  return true;
}
extern "C" int gk_mhc_pre(const float *X, const float *mixraw, const float *ssq, const float *base, const float *scale,
                          const float *norm_w, int T, int hc, int D, int iters, float hc_eps, float rms_eps, float *post,
                          float *comb, float *y, void *y16_) {
  if (hc > MAX_HC) return gk_fail("mhc: hc_mult %d above %d", hc, MAX_HC);
  uint16_t *y16 = (uint16_t *)y16_;
  const bool vec = mhc_vec(D, X, y, norm_w, y16);
  /* long chunks: the streams cached in shared memory between the two passes
   * (at prefill the second pass otherwise rereads X from memory: the blocks
   * in flight hold more than L2; below ~1K tokens it stays in L2); same
   * arithmetic. GLM53_GPU_MHC_CACHE=0: off */
  static int cache_on = -1;
  if (cache_on < 0) cache_on = !(getenv("GLM53_GPU_MHC_CACHE") && !strcmp(getenv("GLM53_GPU_MHC_CACHE"), "0"));
  const size_t xs = (size_t)hc * D * sizeof(float);
  if (vec && !ssq && cache_on && T >= 1024 && xs <= 96 * 1024 && mhc_cache_smem(xs))
    gk_launch(mhc_pre_k<true, true, 0>, T, MHC_PRE_THREADS, xs, X, mixraw, ssq, base, scale, norm_w, hc, D, iters, hc_eps, rms_eps, post,
              comb, y, y16);
  else if (vec && hc == 4) /* the model's 4 streams compiled in: the collapse's loads and the Sinkhorn's shuffles unrolled */
    gk_launch(mhc_pre_k<true, false, 4>, T, MHC_PRE_THREADS, 0, X, mixraw, ssq, base, scale, norm_w, hc, D, iters, hc_eps, rms_eps, post,
              comb, y, y16);
  else if (vec)
    gk_launch(mhc_pre_k<true, false, 0>, T, MHC_PRE_THREADS, 0, X, mixraw, ssq, base, scale, norm_w, hc, D, iters, hc_eps, rms_eps, post,
              comb, y, y16);
  else
    gk_launch(mhc_pre_k<false, false, 0>, T, MHC_PRE_THREADS, 0, X, mixraw, ssq, base, scale, norm_w, hc, D, iters, hc_eps, rms_eps, post,
              comb, y, y16);
  return GK_LAUNCHED("mhc_pre");
}

/* mixraw[t][o] = fn[o] . X_t and ssq[t] = X_t . X_t in one pass over X for
 * long chunks (instead of a cuBLAS SGEMM with 24 rows, ~1.7 TB/s, and the
 * sum-of-squares pass of mhc_pre_k). A warp owns MP_TW tokens, lane l the
 * float4 columns l, l + 32, ... of the flattened streams; the block stages
 * fn 32 float4 columns at a time (double-buffered, one barrier per slice)
 * and prefetches the next slice of X; per lane the products run in column
 * order, then one tree reduction over the lanes: fixed order, deterministic
 * (another order than cuBLAS: equal within fp32 rounding). 4 tokens per
 * warp (fewer shared-memory reads of fn per product) measured the same
 * (H100, ninth session: 495.8 vs 496.7 ms per 4096-token prefill). */
#define MP_TW 2
#define MP_SL 32
template <int MIX>
__global__ void __launch_bounds__(256) mhc_proj_k(const float *X, const float *fn, int T, int n4, float *mixraw, float *ssq) {
  GK_PDL_BEGIN();
  __shared__ float4 fs[2][MIX][MP_SL];
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, tA = (blockIdx.x * 8 + w) * MP_TW;
  const float4 *X4 = (const float4 *)X, *F4 = (const float4 *)fn;
  const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
  constexpr int FPT = (MIX * MP_SL + 255) / 256; /* fn float4 per thread per slice */
  float acc[MP_TW][MIX + 1];
#pragma unroll
  for (int u = 0; u < MP_TW; u++)
#pragma unroll
    for (int o = 0; o <= MIX; o++) acc[u][o] = 0.f;
  const int ns = (n4 + MP_SL - 1) / MP_SL;
  float4 f[FPT], x[MP_TW], xn[MP_TW];
  auto ldf = [&](int sl) {
#pragma unroll
    for (int j = 0; j < FPT; j++) {
      const int i = threadIdx.x + j * 256, o = i / MP_SL, c = sl * MP_SL + i % MP_SL;
      f[j] = i < MIX * MP_SL && c < n4 ? F4[(size_t)o * n4 + c] : z4;
    }
  };
  auto stf = [&](int b) {
#pragma unroll
    for (int j = 0; j < FPT; j++) {
      const int i = threadIdx.x + j * 256;
      if (i < MIX * MP_SL) fs[b][i / MP_SL][i % MP_SL] = f[j];
    }
  };
  auto ldx = [&](int sl, float4 *v) {
    const int c = sl * MP_SL + lane;
#pragma unroll
    for (int u = 0; u < MP_TW; u++) v[u] = c < n4 && tA + u < T ? X4[(size_t)(tA + u) * n4 + c] : z4;
  };
  ldf(0);
  stf(0);
  ldx(0, x);
  __syncthreads();
  for (int sl = 0; sl < ns; sl++) {
    const int b = sl & 1;
    if (sl + 1 < ns) {
      ldf(sl + 1);
      ldx(sl + 1, xn);
    }
#pragma unroll
    for (int u = 0; u < MP_TW; u++) {
      acc[u][MIX] += x[u].x * x[u].x;
      acc[u][MIX] += x[u].y * x[u].y;
      acc[u][MIX] += x[u].z * x[u].z;
      acc[u][MIX] += x[u].w * x[u].w;
    }
#pragma unroll
    for (int o = 0; o < MIX; o++) {
      const float4 g = fs[b][o][lane];
#pragma unroll
      for (int u = 0; u < MP_TW; u++) {
        acc[u][o] += g.x * x[u].x;
        acc[u][o] += g.y * x[u].y;
        acc[u][o] += g.z * x[u].z;
        acc[u][o] += g.w * x[u].w;
      }
    }
    if (sl + 1 < ns) {
      stf(b ^ 1); /* the buffer read in the previous slice, released by its barrier */
#pragma unroll
      for (int u = 0; u < MP_TW; u++) x[u] = xn[u];
    }
    __syncthreads();
  }
#pragma unroll
  for (int u = 0; u < MP_TW; u++)
#pragma unroll
    for (int o = 0; o <= MIX; o++) {
      const float v = warp_sum(acc[u][o]);
      if (lane == 0 && tA + u < T) {
        if (o < MIX) mixraw[(size_t)(tA + u) * MIX + o] = v;
        else ssq[tA + u] = v;
      }
    }
}
#if !GK_HIP
static gk_scratch g_mt_part; /* the tensor-core form's partial sums (long chunks only: never in a graph) */
#endif
static int g_mhc_tc = -1; /* GLM53_GPU_MHC_TC=0: the SIMT kernel */
extern "C" void gk_set_mhc_tc(int on) { g_mhc_tc = on < 0 ? -1 : !!on; }
extern "C" int gk_mhc_tc_on(void) {
  if (g_mhc_tc < 0) g_mhc_tc = !GK_HIP && !(getenv("GLM53_GPU_MHC_TC") && !strcmp(getenv("GLM53_GPU_MHC_TC"), "0"));
  return g_mhc_tc && !GK_HIP;
}
static int g_mhc_k32 = -1; /* GLM53_GPU_MHC_K32=1: mhc_proj_tc_k's 128-byte steps (NV 2) */
extern "C" void gk_set_mhc_k32(int on) { g_mhc_k32 = on < 0 ? -1 : !!on; }
extern "C" int gk_mhc_k32(void) {
  if (g_mhc_k32 < 0) g_mhc_k32 = getenv("GLM53_GPU_MHC_K32") && !strcmp(getenv("GLM53_GPU_MHC_K32"), "1");
  return g_mhc_k32;
}
extern "C" int gk_mhc_proj(const gpu_mat *fn, const float *X, int T, int hc, int D, float *mixraw, float *ssq) {
  const int n = hc * D, mix = (2 + hc) * hc;
  if (fn->fmt != GF_F32 || fn->rows != mix || fn->cols != n || mix != 24 || n % 4 || (uintptr_t)X % 16 ||
      (uintptr_t)fn->d % 16)
    return 1;
#if !GK_HIP
  if (gk_mhc_tc_on()) {
    const int S = mt_splits(n);
    float *part = (float *)gk_scratch_grow(&g_mt_part, (size_t)S * T * MT_PART * 4);
    if (!part) return -1;
    if (gk_mhc_k32())
      gk_launch(mhc_proj_tc_k<2>, dim3((unsigned)((T + 63) / 64), (unsigned)S), 128, 0, X, (const float *)fn->d, T, n, part);
    else
      gk_launch(mhc_proj_tc_k<1>, dim3((unsigned)((T + 63) / 64), (unsigned)S), 128, 0, X, (const float *)fn->d, T, n, part);
    if (GK_LAUNCHED("mhc proj (tensor cores)")) return -1;
    gk_launch(mhc_proj_sum_k, gk_blocks((size_t)T * MT_PART, 256), 256, 0, (const float *)part, S, T, mixraw, ssq);
    return GK_LAUNCHED("mhc proj sums") ? -1 : 0;
  }
#endif
  gk_launch(mhc_proj_k<24>, gk_blocks((size_t)T, 8 * MP_TW), 256, 0, X, (const float *)fn->d, T, n / 4, mixraw, ssq);
  return GK_LAUNCHED("mhc proj") ? -1 : 0;
}

/* GLM53_GPU_MHC_FUSE=1: the post and the next projection in one launch
 * (opt-in: per 4096-token prefill its first version measured 11 ms slower
 * than the two launches on an H100, this one 5 ms slower on an H200;
 * docs/gpu-measurements.md, eleventh session) */
static int g_mhc_fuse = -1;
extern "C" void gk_set_mhc_fuse(int on) { g_mhc_fuse = on < 0 ? -1 : !!on; }
static bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }
extern "C" int gk_mhc_post_proj(float *X, const float *a, const float *eo, const int *erow, const int *idx, const float *wt,
                                int k, const float *post, const float *comb, int T, int hc, int D, const gpu_mat *fn,
                                float *mixraw, float *ssq) {
#if GK_HIP
  (void)X, (void)a, (void)eo, (void)erow, (void)idx, (void)wt, (void)k, (void)post, (void)comb, (void)T, (void)hc, (void)D,
      (void)fn, (void)mixraw, (void)ssq;
  return 1;
#else
  if (g_mhc_fuse < 0) g_mhc_fuse = getenv("GLM53_GPU_MHC_FUSE") && !strcmp(getenv("GLM53_GPU_MHC_FUSE"), "1");
  if (!g_mhc_fuse || !gk_mhc_tc_on() || T <= 0 || hc != 4 || D % 4 || fn->fmt != GF_F32 || fn->rows != MT_MIX ||
      fn->cols != hc * D || !al16(X) || !al16(a) || !al16(fn->d) || (eo && (!al16(eo) || k < 1 || k > MT_KMAX)))
    return 1;
  static int smem_ok = -1; /* the fn slices' shared memory (over 48 KB): opted in once */
  if (smem_ok < 0) {
    const cudaFuncAttribute at = cudaFuncAttributeMaxDynamicSharedMemorySize;
    smem_ok = cudaFuncSetAttribute((const void *)mhc_post_proj_tc_k<true>, at, (int)MT_FN_SMEM) == cudaSuccess &&
              cudaFuncSetAttribute((const void *)mhc_post_proj_tc_k<false>, at, (int)MT_FN_SMEM) == cudaSuccess;
    if (!smem_ok) (void)cudaGetLastError();
  }
  if (!smem_ok) return 1;
  const int S = mt_dsplits(D);
  float *part = (float *)gk_scratch_grow(&g_mt_part, (size_t)S * T * MT_PART * 4);
  if (!part) return -1;
  const dim3 grid((unsigned)((T + 63) / 64), (unsigned)S);
  if (eo)
    gk_launch(mhc_post_proj_tc_k<true>, grid, 128, MT_FN_SMEM, X, a, eo, erow, idx, wt, k, post, comb, (const float *)fn->d, T,
              D, part);
  else
    gk_launch(mhc_post_proj_tc_k<false>, grid, 128, MT_FN_SMEM, X, a, (const float *)NULL, (const int *)NULL,
              (const int *)NULL, (const float *)NULL, 0, post, comb, (const float *)fn->d, T, D, part);
  if (GK_LAUNCHED("mhc post + proj (tensor cores)")) return -1;
  gk_launch(mhc_proj_sum_k, gk_blocks((size_t)T * MT_PART, 256), 256, 0, (const float *)part, S, T, mixraw, ssq);
  return GK_LAUNCHED("mhc proj sums") ? -1 : 0;
#endif
}

/* the sublayer output of token t, column d: a, or after a MoE a plus the
 * routed outputs in ascending expert id (moe_combine_k's order); pair p's
 * output is row p of eo, or row erow[p] (the expert-sorted GEMM form) */
/* ET: float, or uint16_t for bf16 outputs (the MoE GEMM form's), widened */
template <typename ET>
__device__ __forceinline__ float moe_sum(float acc, const ET *eo, const int *erow, const int *idx, const float *wt, int t,
                                         int k, int D, int d) {
  const int *id = idx + (size_t)t * k;
  for (int last = -1, best; (best = moe_next(id, k, &last)) >= 0;) {
    const size_t p = (size_t)t * k + best;
    float e;
    vload<1>(&e, eo + (erow ? (size_t)erow[p] : p) * D + d);
    acc += wt[p] * e;
  }
  return acc;
}

/* moe_sum's order once for a block whose elements are all of token t: ord
 * = the pairs moe_sum adds (the first pair of each distinct expert id >= 0),
 * by ascending id; returns their count */
__device__ __forceinline__ int moe_order(const int *idx, int t, int k, int *ord) {
  __shared__ int nv, id[64]; /* k <= 64: the token's ids read once (the loops below read each up to k times) */
  if (threadIdx.x == 0) nv = 0;
  if ((int)threadIdx.x < k) id[threadIdx.x] = idx[(size_t)t * k + threadIdx.x];
  __syncthreads();
  if ((int)threadIdx.x < k) {
    const int j = threadIdx.x, e = id[j];
    bool ok = e >= 0;
    for (int q = 0; q < j && ok; q++) ok = id[q] != e;
    if (ok) {
      int rank = 0;
      for (int q = 0; q < k; q++) { /* distinct ids below e, each counted once */
        bool first = id[q] >= 0 && id[q] < e;
        for (int r = 0; r < q && first; r++) first = id[r] != id[q];
        rank += first;
      }
      ord[rank] = j;
      atomicAdd(&nv, 1);
    }
  }
  __syncthreads();
  return nv;
}

/* HCT: hc compiled in (4, the config's) so the streams stay in registers;
 * 0: hc at run time. V elements per thread (4: float4 loads and stores
 * when D % 4 == 0; the per-token post, comb, wt and erow loads then serve
 * four elements: prefill's post with the combine was 2.2x off the memory
 * roofline with one): the same per-element arithmetic as V = 1. */
/* LAT (decode: few blocks, so latency rather than occupancy; HCT only):
 * the streams, the sublayer output, comb and post loaded before the
 * combine order's barriers, and the routed outputs (k <= 8) all loaded
 * before the first addition, instead of one round trip per output; the
 * same additions in the same order */
template <bool MOE, int HCT, int V, typename ET = float, bool LAT = false>
__global__ void mhc_post_k(float *X, const float *a, const ET *eo, const int *erow, const int *idx, const float *wt, int k,
                           const float *post, const float *comb, int T, int hc_, int D) {
  GK_PDL_BEGIN();
  static_assert(!LAT || HCT, "the latency form needs hc compiled in");
  constexpr int HM = HCT ? HCT : MAX_HC;
  const int hc = HCT ? HCT : hc_;
  __shared__ int ord[64];
  const size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * V; /* the first of V elements of one token */
  int t = (int)(i / D), d = (int)(i % D), nv = -1;
  float old[HM][V], y[V], cbl[LAT ? HM * HM : 1], phl[LAT ? HM : 1];
  float *Xt = X + (size_t)t * hc * D;
  auto load = [&] { /* the token's streams and the sublayer's output at d */
#pragma unroll
    for (int g = 0; g < HM; g++)
      if (g < hc) vload<V>(old[g], Xt + (size_t)g * D + d);
    vload<V>(y, a + (size_t)t * D + d);
  };
  if (LAT && i < (size_t)T * D) {
    load();
#pragma unroll
    for (int q = 0; q < HM * HM; q++) cbl[q] = comb[(size_t)t * HM * HM + q];
#pragma unroll
    for (int h = 0; h < HM; h++) phl[h] = post[t * HM + h];
  }
  if (MOE && k <= 64) { /* a block within one token: the combine order once, in shared memory */
    const size_t b0 = blockIdx.x * (size_t)blockDim.x * V, b1 = min(b0 + (size_t)blockDim.x * V, (size_t)T * D) - 1;
    if (b0 / D == b1 / D) nv = moe_order(idx, (int)(b0 / D), k, ord);
  }
  if (i >= (size_t)T * D) return;
  if (!LAT) load();
  if (LAT && MOE && nv >= 0 && nv <= 8) {
    float w8[8], e8[8][V];
#pragma unroll
    for (int r = 0; r < 8; r++)
      if (r < nv) {
        const size_t p = (size_t)t * k + ord[r];
        w8[r] = wt[p];
        vload<V>(e8[r], eo + (erow ? (size_t)erow[p] : p) * D + d);
      }
#pragma unroll
    for (int r = 0; r < 8; r++)
      if (r < nv) mhc_post_add<V>(y, w8[r], e8[r]);
  } else if (MOE && nv >= 0) {
    /* moe_sum's additions, same order (loading all eight outputs before the
     * first addition measured slower: 29.8 vs 26.9 ms per 4096-token
     * prefill, the registers halve the blocks per SM) */
    for (int r = 0; r < nv; r++) {
      const size_t p = (size_t)t * k + ord[r];
      const float w = wt[p];
      float e[V];
      vload<V>(e, eo + (erow ? (size_t)erow[p] : p) * D + d);
      mhc_post_add<V>(y, w, e);
    }
  } else if (MOE) {
#pragma unroll
    for (int v = 0; v < V; v++) y[v] = moe_sum(y[v], eo, erow, idx, wt, t, k, D, d + v);
  }
  const float *cb = LAT ? cbl : comb + (size_t)t * hc * hc;
#pragma unroll
  for (int h = 0; h < HM; h++)
    if (h < hc) {
      float acc[V];
      mhc_post_mix<HM, V>(old, y, LAT ? phl[h] : post[t * hc + h], cb, hc, h, acc);
      vstore<V>(Xt + (size_t)h * D + d, acc);
    }
}
/* hc 4 or any; four elements per thread where D and the rows' alignment allow */
#define MHC_POST_LAUNCH(MOE, ET, V4, ...)                                                                           \
  do {                                                                                                             \
    const bool v4 = (V4) && D % 4 == 0;                                                                            \
    const dim3 g = gk_blocks((size_t)T * D / (v4 ? 4 : 1), 256);                                                   \
    if (hc == 4 && v4) gk_launch(mhc_post_k<MOE, 4, 4, ET>, g, 256, 0, __VA_ARGS__);                               \
    else if (hc == 4) gk_launch(mhc_post_k<MOE, 4, 1, ET>, g, 256, 0, __VA_ARGS__);                                \
    else if (v4) gk_launch(mhc_post_k<MOE, 0, 4, ET>, g, 256, 0, __VA_ARGS__);                                     \
    else gk_launch(mhc_post_k<MOE, 0, 1, ET>, g, 256, 0, __VA_ARGS__);                                             \
  } while (0)
extern "C" int gk_mhc_post(float *X, const float *a, const float *post, const float *comb, int T, int hc, int D) {
  MHC_POST_LAUNCH(false, float, al16(X) && al16(a), X, a, (const float *)NULL, (const int *)NULL, (const int *)NULL,
                  (const float *)NULL, 0, post, comb, T, hc, D);
  return GK_LAUNCHED("mhc_post");
}
/* the latency form (LAT) up to this many tokens (decode steps, small
 * batches); GLM53_GPU_POST_LAT=0 / gk_set_mhc_post_lat(0): never */
#define MHC_POST_LAT_MAX 64
static int g_post_lat = -1;
extern "C" void gk_set_mhc_post_lat(int on) { g_post_lat = on < 0 ? -1 : !!on; }
static int post_lat(void) {
  if (g_post_lat < 0) g_post_lat = !(getenv("GLM53_GPU_POST_LAT") && !strcmp(getenv("GLM53_GPU_POST_LAT"), "0"));
  return g_post_lat;
}
extern "C" int gk_mhc_post_moe(float *X, const float *a, const void *eo, int eo_bf16, const int *erow, const int *idx,
                               const float *wt, int k, const float *post, const float *comb, int T, int hc, int D) {
  if (hc == 4 && D % 4 == 0 && T <= MHC_POST_LAT_MAX && post_lat() && al16(X) && al16(a) &&
      (eo_bf16 ? (uintptr_t)eo % 8 == 0 : al16(eo))) {
    const dim3 g = gk_blocks((size_t)T * D / 4, 256);
    if (eo_bf16)
      gk_launch(mhc_post_k<true, 4, 4, uint16_t, true>, g, 256, 0, X, a, (const uint16_t *)eo, erow, idx, wt, k, post, comb,
                T, hc, D);
    else
      gk_launch(mhc_post_k<true, 4, 4, float, true>, g, 256, 0, X, a, (const float *)eo, erow, idx, wt, k, post, comb, T,
                hc, D);
    return GK_LAUNCHED("mhc_post_moe");
  }
  if (eo_bf16) /* four bf16 per 8-byte load */
    MHC_POST_LAUNCH(true, uint16_t, al16(X) && al16(a) && (uintptr_t)eo % 8 == 0, X, a, (const uint16_t *)eo, erow, idx, wt,
                    k, post, comb, T, hc, D);
  else
    MHC_POST_LAUNCH(true, float, al16(X) && al16(a) && al16(eo), X, a, (const float *)eo, erow, idx, wt, k, post, comb, T,
                    hc, D);
  return GK_LAUNCHED("mhc_post_moe");
}
#undef MHC_POST_LAUNCH

__global__ void final_norm_k(const float *X, const float *w, int first, int hc, int D, float eps, float *h) {
  GK_PDL_BEGIN();
  __shared__ float sh[32];
  int t = first + blockIdx.x;
  const float *Xt = X + (size_t)t * hc * D;
  float *ht = h + (size_t)blockIdx.x * D, ss = 0;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float a = 0;
    for (int k = 0; k < hc; k++) a += Xt[(size_t)k * D + d];
    a /= hc;
    ht[d] = a;
    ss += a * a;
  }
  ss = block_sum(ss, sh);
  float r = 1.0f / sqrtf(ss / D + eps);
  for (int d = threadIdx.x; d < D; d += blockDim.x) ht[d] = w[d] * (ht[d] * r);
}
extern "C" int gk_final_norm(const float *X, const float *w, int first, int T, int hc, int D, float eps, float *h) {
  if (T - first <= 0) return 0;
  gk_launch(final_norm_k, T - first, 256, 0, X, w, first, hc, D, eps, h);
  return GK_LAUNCHED("final_norm");
}

/* ---- KDA (kda.c kda_forward / kda_step) ---- */
/* causal conv + SiLU of channel j at token t of the segment whose first
 * token is t0 (rows before it come from the conv state st) */
/* RT: the raw projection's storage, float or bf16 bits (gk_kda_conv_prep) */
template <typename RT>
__device__ __forceinline__ float kda_conv1(const RT *raw, const float *st, const float *w, int t, int t0, int j, int ch,
                                           int K) {
  float acc = 0;
  for (int tau = 0; tau < K; tau++) {
    int src = t - t0 - (K - 1) + tau; /* within the segment */
    float x = src >= 0 ? ld_f(raw + (size_t)(t0 + src) * ch + j) : st[(size_t)(K - 1 + src) * ch + j];
    acc += w[(size_t)j * K + tau] * x;
  }
  return acc / (1.0f + expf(-acc));
}
/* channel j's new state after a segment of len tokens from row t0 = the
 * last K-1 rows of [state | raw], in ascending order so that a shift within
 * the state reads before it writes */
template <typename RT>
__device__ __forceinline__ void kda_conv_shift1(const RT *raw, float *st, int t0, int len, int j, int ch, int K) {
  for (int s = 0; s < K - 1; s++) {
    int src = len - (K - 1) + s;
    st[(size_t)s * ch + j] = src >= 0 ? ld_f(raw + (size_t)(t0 + src) * ch + j) : st[(size_t)(K - 1 + src) * ch + j];
  }
}
__global__ void kda_conv_k(const float *raw, gk_batch b, const float *w, int T, int ch, int K, float *qkv) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)T * ch) return;
  int t = (int)(i / ch), j = (int)(i % ch), sg = b.tseg[t];
  qkv[i] = kda_conv1(raw, bst(b, sg, GK_ST_CONV), w, t, b.seg[sg].t0, j, ch, K);
}
/* the new conv states: one thread per (channel, segment) */
template <typename RT> __global__ void kda_conv_state_k(const RT *raw, gk_batch b, int ch, int K) {
  GK_PDL_BEGIN();
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= ch) return;
  const gk_seg sg = b.seg[blockIdx.y];
  kda_conv_shift1(raw, sg.ls[b.layer].p[GK_ST_CONV], sg.t0, sg.len, j, ch, K);
}
extern "C" int gk_kda_conv(const float *raw, const gk_batch *b, const float *w, int T, int ch, int K, float *qkv) {
  if (batch_ok(b, "kda_conv")) return -1;
  gk_launch(kda_conv_k, gk_blocks((size_t)T * ch, 256), 256, 0, raw, *b, w, T, ch, K, qkv);
  gk_launch(kda_conv_state_k<float>, dim3(gk_blocks(ch, 256), b->nseg), 256, 0, raw, *b, ch, K);
  return GK_LAUNCHED("kda_conv");
}

/* l2-normalise q and k per head (eps inside the root), scale q */
__global__ void kda_prep_k(float *qkv, int T, int H, int hd, float qscale) {
  GK_PDL_BEGIN();
  int wid = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (wid >= T * H * 2) return;
  int which = wid % 2, h = (wid / 2) % H, t = wid / (2 * H), inner = H * hd;
  float *x = qkv + (size_t)t * 3 * inner + (size_t)which * inner + (size_t)h * hd;
  float ss = 0;
  for (int i = lane; i < hd; i += 32) ss += x[i] * x[i];
  ss = warp_sum(ss);
  float r = 1.0f / sqrtf(ss + 1e-6f);
  for (int i = lane; i < hd; i += 32) {
    float v = x[i] * r;
    x[i] = which == 0 ? v * qscale : v;
  }
}
extern "C" int gk_kda_prep(float *qkv, int T, int H, int hd, float qscale) {
  gk_launch(kda_prep_k, gk_blocks((size_t)T * H * 2 * 32, 256), 256, 0, qkv, T, H, hd, qscale);
  return GK_LAUNCHED("kda_prep");
}

#define KDA_MAXM 8 /* head dim <= 256 */
/* gk_kda_conv + gk_kda_prep in one pass, the same per-element arithmetic
 * (same bits): one warp per (NT consecutive tokens, slot), slot = which * H
 * + h with which 0 q, 1 k, 2 v; the lanes hold the head's conv outputs, so
 * the l2norm of q and k needs no reread. With the taps compiled in (KT > 0)
 * a lane loads its channels' weights once for its NT tokens and slides the
 * tap window: a token in the same segment as the one before reads one new
 * raw row instead of KT (prefill was load-bound on the KT-fold reread and
 * the per-token weights). SEQ (segments of a few tokens: decode): one warp
 * per (segment, slot) over the segment's tokens, which then writes the new
 * conv state of its channels (each lane owns its channels; their old rows
 * are read before they are overwritten), so decode needs no second
 * launch. */
template <bool SEQ, int MM, int KT, int NT, typename RT>
__global__ void kda_conv_prep_k(const RT *raw, gk_batch b, const float *w, int T, int H, int hd, int K, float qscale,
                                float *qkv) {
  GK_PDL_BEGIN();
  constexpr int KA = KT > 0 ? KT : 1;
  const int lane = threadIdx.x & 31, inner = H * hd, ch = 3 * inner;
  const long wid = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int slot = (int)(SEQ ? wid : wid % (3 * H));
  if (slot >= 3 * H) return;
  const int which = slot / H, h = slot % H, c0 = which * inner + h * hd;
  int ta, tb;
  if (SEQ) {
    ta = b.seg[blockIdx.y].t0;
    tb = ta + b.seg[blockIdx.y].len;
  } else {
    ta = (int)(wid / (3 * H)) * NT;
    if (ta >= T) return;
    tb = min(T, ta + NT);
  }
  float x[MM][KA], wv[MM][KA];
  if (KT > 0)
#pragma unroll
    for (int m = 0; m < MM; m++)
#pragma unroll
      for (int tau = 0; tau < KA; tau++) wv[m][tau] = lane + 32 * m >= hd ? 0.f : w[(size_t)(c0 + lane + 32 * m) * KT + tau];
  int psg = -1;
  for (int t = ta; t < tb; t++) {
    const int sg = SEQ ? (int)blockIdx.y : b.tseg[t], t0 = b.seg[sg].t0;
    const float *st = b.seg[sg].ls[b.layer].p[GK_ST_CONV];
    float v[MM], ss = 0;
    if (KT > 0) { /* every tap of every channel loaded before the first product (kda_conv1's arithmetic) */
      if (sg == psg) { /* token t-1's taps 1..KT-1 are t's 0..KT-2; the newest row is in the segment */
#pragma unroll
        for (int m = 0; m < MM; m++) {
          const int i = lane + 32 * m;
#pragma unroll
          for (int tau = 0; tau + 1 < KA; tau++) x[m][tau] = x[m][tau + 1];
          x[m][KA - 1] = i >= hd ? 0.f : ld_f(raw + (size_t)t * ch + c0 + i);
        }
      } else {
#pragma unroll
        for (int m = 0; m < MM; m++) {
          const int i = lane + 32 * m, j = c0 + i;
#pragma unroll
          for (int tau = 0; tau < KA; tau++) {
            const int src = t - t0 - (KT - 1) + tau;
            x[m][tau] = i >= hd ? 0.f : src >= 0 ? ld_f(raw + (size_t)(t0 + src) * ch + j) : st[(size_t)(KT - 1 + src) * ch + j];
          }
        }
      }
      psg = sg;
#pragma unroll
      for (int m = 0; m < MM; m++) {
        float acc = 0;
#pragma unroll
        for (int tau = 0; tau < KA; tau++) acc += wv[m][tau] * x[m][tau];
        v[m] = 0.f;
        if (lane + 32 * m >= hd) continue;
        v[m] = acc / (1.0f + expf(-acc));
        ss += v[m] * v[m];
      }
    } else {
#pragma unroll
      for (int m = 0; m < MM; m++) {
        const int i = lane + 32 * m;
        v[m] = 0.f;
        if (i >= hd) continue;
        v[m] = kda_conv1(raw, st, w, t, t0, c0 + i, ch, K);
        ss += v[m] * v[m];
      }
    }
    float *out = qkv + (size_t)t * ch + c0;
    if (which < 2) {
      ss = warp_sum(ss);
      const float r = 1.0f / sqrtf(ss + 1e-6f);
#pragma unroll
      for (int m = 0; m < MM; m++) {
        const int i = lane + 32 * m;
        if (i < hd) out[i] = which == 0 ? (v[m] * r) * qscale : v[m] * r;
      }
    } else {
#pragma unroll
      for (int m = 0; m < MM; m++)
        if (lane + 32 * m < hd) out[lane + 32 * m] = v[m];
    }
  }
  if (SEQ) /* kda_conv_state_k for this slot's channels */
    for (int i = lane; i < hd; i += 32)
      kda_conv_shift1(raw, b.seg[blockIdx.y].ls[b.layer].p[GK_ST_CONV], ta, tb - ta, c0 + i, ch, K);
}
/* segments up to this long take the SEQ form */
#define KDA_SEQ_MAX 4
/* tokens per warp of the prefill form with 4 taps (the taps slide over a
 * warp's tokens): 1, 4 or 8, the same bits. 4 is the default (H200,
 * 4096-token prefill of the full-dimension model: 495.6 ms vs 506.4 with
 * 1 and 500.4 with 8; 16 measured slower earlier). GLM53_GPU_KDA_CONV_NT
 * or gk_set_kda_conv_nt. */
static int g_kc_nt;
extern "C" void gk_set_kda_conv_nt(int nt) { g_kc_nt = nt == 1 || nt == 4 || nt == 8 ? nt : 0; }
static int kc_nt(void) {
  if (!g_kc_nt) {
    const char *e = getenv("GLM53_GPU_KDA_CONV_NT");
    const int v = e ? atoi(e) : 4;
    g_kc_nt = v == 1 || v == 8 ? v : 4;
  }
  return g_kc_nt;
}
template <typename RT>
static int conv_prep(const RT *raw, const gk_batch *b, const float *w, int T, int H, int hd, int K, float qscale, float *qkv) {
  if (hd > 32 * KDA_MAXM) return gk_fail("kda: head dim %d above %d", hd, 32 * KDA_MAXM);
  if (batch_ok(b, "kda_conv_prep")) return -1;
  const int slots = 3 * H;
  const bool seq = b->maxlen <= KDA_SEQ_MAX;
  const int nt = seq || K != 4 ? 1 : kc_nt();
  const dim3 grid = seq ? dim3(gk_blocks((size_t)slots * 32, 256), b->nseg)
                        : dim3(gk_blocks((size_t)((T + nt - 1) / nt) * slots * 32, 256));
  /* the head dim's registers per lane; the config's 4 taps unrolled */
#define KCP(S, M, KK, N) gk_launch(kda_conv_prep_k<S, M, KK, N, RT>, grid, 256, 0, raw, *b, w, T, H, hd, K, qscale, qkv)
#define KCP_M(S, KK, N)                                                                                          \
  do {                                                                                                           \
    if (hd <= 32) KCP(S, 1, KK, N);                                                                              \
    else if (hd <= 64) KCP(S, 2, KK, N);                                                                         \
    else if (hd <= 128) KCP(S, 4, KK, N);                                                                        \
    else KCP(S, 8, KK, N);                                                                                       \
  } while (0)
  if (seq) {
    if (K == 4) KCP_M(true, 4, 1);
    else KCP_M(true, 0, 1);
  } else {
    if (nt == 8) KCP_M(false, 4, 8);
    else if (nt == 4) KCP_M(false, 4, 4);
    else if (K == 4) KCP_M(false, 4, 1);
    else KCP_M(false, 0, 1);
    gk_launch(kda_conv_state_k<RT>, dim3(gk_blocks(3 * H * hd, 256), b->nseg), 256, 0, raw, *b, 3 * H * hd, K);
  }
#undef KCP_M
#undef KCP
  return GK_LAUNCHED("kda_conv_prep");
}
static int g_raw16 = -1;
extern "C" void gk_set_kda_raw16(int on) { g_raw16 = on < 0 ? -1 : !!on; }
extern "C" int gk_kda_raw16(void) {
  /* opt-in: measured no faster on the H100 (the conv's 2-byte loads cost what
   * the GEMM's halved writes save; docs/gpu-measurements.md, seventeenth session) */
  if (g_raw16 < 0) g_raw16 = getenv("GLM53_GPU_KDA_RAW") && !strcmp(getenv("GLM53_GPU_KDA_RAW"), "bf16");
  return g_raw16;
}
extern "C" int gk_kda_conv_prep(const void *raw, int raw16, const gk_batch *b, const float *w, int T, int H, int hd, int K,
                                float qscale, float *qkv) {
  return raw16 ? conv_prep((const uint16_t *)raw, b, w, T, H, hd, K, qscale, qkv)
               : conv_prep((const float *)raw, b, w, T, H, hd, K, qscale, qkv);
}

__global__ void kda_gate_k(float *g, const float *dt_bias, const float *A_log, int T, int H, int hd, float lb) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  int inner = H * hd;
  if (i >= (size_t)T * inner) return;
  int c = (int)(i % inner);
  g[i] = kda_gate1(g[i], dt_bias, A_log, c / hd, c, lb);
}
extern "C" int gk_kda_gate(float *g, const float *dt_bias, const float *A_log, int T, int H, int hd, float lower_bound) {
  gk_launch(kda_gate_k, gk_blocks((size_t)T * H * hd, 256), 256, 0, g, dt_bias, A_log, T, H, hd, lower_bound);
  return GK_LAUNCHED("kda_gate");
}

/* Delta-rule recurrence, token by token (kda_step). Columns j of S evolve
 * independently. A warp owns KR_CPW = 4 (or 8) columns of one head; lane l
 * holds S[i][j] for the MM contiguous rows i = l * MM + m of each (one
 * 16-byte shared load per vector and token at MM = 4). Per token and column the 32-lane
 * sums (S^T k, then S^T q) are one transposed reduction for all the warp's
 * columns (kr_reduce: 6 shuffles instead of 4 x 5, 9 instead of 8 x 5),
 * the deltas go back by one shuffle per column, and q, k and the decay of a
 * row are read once for all of them. The block (4 warps, 4 * KR_CPW
 * columns) stages tiles of TT tokens in shared memory: q, k, decay, beta, v
 * of its columns; with cp.async (CUDA, the decay already exponentiated or
 * given as a log) the next tile is copied while the current one is
 * computed, else one coalesced pass per tile. No block barrier per token.
 * State layout [H][dv][dk] keeps the lanes' loads contiguous. grid (H,
 * ceil(hd / (4 * KR_CPW)), nseg). Every token's arithmetic is the same
 * whatever the tiling, so decode and prefill agree bitwise. The loop is
 * issue-bound (H200, ncu, 4096-token launch: 191 instructions per token and
 * warp, 70% of the issue slots busy with 4 warps per scheduler), hence:
 * FULL (hd == 32 MM, the model's 128) compiles the head dim in (no guards,
 * constant offsets), the rows are contiguous (3 vector loads per token
 * instead of 12), and at prefill beta comes as sigmoid(logit) from the decay
 * pass instead of once per warp and token. */
#define KR_WARPS 4
/* CPW (columns per warp) 8 or 4: lane l ends a reduction with the sum of
 * column kr_col(l); kr_lane(c) is a lane holding column c's sum */
template <int CPW> __device__ __forceinline__ int kr_col(int lane) {
  return CPW == 8 ? ((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1) : ((lane >> 4) & 1) * 2 + ((lane >> 3) & 1);
}
template <int CPW> __device__ __forceinline__ int kr_lane(int c) {
  return CPW == 8 ? ((c >> 2) & 1) * 16 + ((c >> 1) & 1) * 8 + (c & 1) * 4 : ((c >> 1) & 1) * 16 + (c & 1) * 8;
}
/* CPW per-lane partials in, the 32-lane sum of column kr_col(lane) out (the
 * lanes sharing a column get the same bits: each stage adds a pair both
 * ways); 8 columns: 9 shuffles instead of 8 x 5 */
template <int CPW> __device__ __forceinline__ float kr_reduce(const float *v, int lane) {
  const bool u16 = lane & 16, u8 = lane & 8, u4 = lane & 4;
  float y;
  if (CPW == 8) {
    float w[4], x[2];
#pragma unroll
    for (int c = 0; c < 4; c++)
      w[c] = (u16 ? v[c + 4] : v[c]) + __shfl_xor_sync(0xffffffffu, u16 ? v[c] : v[c + 4], 16);
#pragma unroll
    for (int c = 0; c < 2; c++)
      x[c] = (u8 ? w[c + 2] : w[c]) + __shfl_xor_sync(0xffffffffu, u8 ? w[c] : w[c + 2], 8);
    y = (u4 ? x[1] : x[0]) + __shfl_xor_sync(0xffffffffu, u4 ? x[0] : x[1], 4);
  } else {
    float w[2];
#pragma unroll
    for (int c = 0; c < 2; c++)
      w[c] = (u16 ? v[c + 2] : v[c]) + __shfl_xor_sync(0xffffffffu, u16 ? v[c] : v[c + 2], 16);
    y = (u8 ? w[1] : w[0]) + __shfl_xor_sync(0xffffffffu, u8 ? w[0] : w[1], 8);
    y += __shfl_xor_sync(0xffffffffu, y, 4);
  }
  y += __shfl_xor_sync(0xffffffffu, y, 2);
  return y + __shfl_xor_sync(0xffffffffu, y, 1);
}
/* MM rows of a shared or global vector from row lane * MM (zeros past hd);
 * FULL: hd == 32 MM */
template <int MM, bool FULL> __device__ __forceinline__ void kr_rows(const float *v, int lane, int hd, float *out) {
  const int i0 = lane * MM;
  if (FULL && MM % 4 == 0) {
#pragma unroll
    for (int m = 0; m < MM; m += 4) {
      const float4 x = *(const float4 *)(v + i0 + m);
      out[m] = x.x, out[m + 1] = x.y, out[m + 2] = x.z, out[m + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int m = 0; m < MM; m++) out[m] = FULL || i0 + m < hd ? v[i0 + m] : 0.f;
  }
}
template <int MODE, int MM, bool ASYNC, int KR_CPW, bool FULL>
__global__ void __launch_bounds__(KR_WARPS * 32) kda_recur_k(gk_batch b, const float *qkv, const float *g,
                                                              const float *dt_bias, const float *A_log, float lb,
                                                              const float *bl, int H, int hd_, int TT, float *o) {
  GK_PDL_BEGIN();
  enum { KR_COLS = KR_CPW * KR_WARPS };
  const int hd = FULL ? 32 * MM : hd_;
  extern __shared__ __align__(16) float kda_sh[];
  const int h = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31, c0 = blockIdx.y * KR_COLS;
  const int cw = c0 + w * KR_CPW, my = kr_col<KR_CPW>(lane);
  const gk_seg sg = b.seg[blockIdx.z];
  const int t0 = sg.t0, T = t0 + sg.len, inner = H * hd;
  float *S = sg.ls[b.layer].p[GK_ST_S];
  const size_t tf = kr_tile_floats(hd, TT, KR_COLS);
  float s[KR_CPW][MM];
#pragma unroll
  for (int c = 0; c < KR_CPW; c++) {
    const int j = cw + c;
    const float *Sj = S + ((size_t)h * hd + (j < hd ? j : 0)) * hd;
    kr_rows<MM, FULL>(Sj, lane, hd, s[c]);
    if (j >= hd)
#pragma unroll
      for (int m = 0; m < MM; m++) s[c][m] = 0.f;
  }
  const kr_src src{qkv, g, dt_bias, A_log, bl, lb, H, hd, h, c0, TT};
  kr_first<MODE, ASYNC, KR_COLS>(src, t0, T, kda_sh);
  int n = 0;
  for (int tb = t0; tb < T; tb += TT, n++) {
    const int nt = T - tb < TT ? T - tb : TT;
    const float *cur = kr_tile<MODE, ASYNC, KR_COLS>(src, tb, T, n, kda_sh, tf);
    const float *qs = cur, *ks = qs + (size_t)TT * hd, *as = ks + (size_t)TT * hd, *vs = as + (size_t)TT * hd, *bs = vs + (size_t)TT * KR_COLS;
    for (int u = 0; u < nt; u++) {
      float av[MM], kv[MM], qv[MM], p[KR_CPW];
      kr_rows<MM, FULL>(as + u * hd, lane, hd, av);
      kr_rows<MM, FULL>(ks + u * hd, lane, hd, kv);
      kr_rows<MM, FULL>(qs + u * hd, lane, hd, qv);
      if (ASYNC && MODE == KR_LOG) /* the async copy is raw */
#pragma unroll
        for (int m = 0; m < MM; m++) av[m] = lane * MM + m < hd ? expf(av[m]) : 0.f;
#pragma unroll
      for (int c = 0; c < KR_CPW; c++) {
        float r = 0;
#pragma unroll
        for (int m = 0; m < MM; m++) {
          s[c][m] *= av[m];
          r += s[c][m] * kv[m];
        }
        p[c] = r;
      }
      const float r = kr_reduce<KR_CPW>(p, lane);
      const float delta = (MODE == KR_DECAY ? bs[u] : sigm(bs[u])) * (vs[u * KR_COLS + w * KR_CPW + my] - r);
#pragma unroll
      for (int c = 0; c < KR_CPW; c++) {
        const float d = __shfl_sync(0xffffffffu, delta, kr_lane<KR_CPW>(c));
        float oo = 0;
#pragma unroll
        for (int m = 0; m < MM; m++) {
          s[c][m] += kv[m] * d;
          oo += s[c][m] * qv[m];
        }
        p[c] = oo;
      }
      const float ov = kr_reduce<KR_CPW>(p, lane);
      if ((lane & (32 / KR_CPW - 1)) == 0 && cw + my < hd) o[((size_t)tb + u) * inner + h * hd + cw + my] = ov;
    }
    if (ASYNC) __syncthreads(); /* cur is the target of the copy issued next round */
  }
#pragma unroll
  for (int c = 0; c < KR_CPW; c++) {
    const int j = cw + c;
    if (j >= hd) continue;
    float *Sj = S + ((size_t)h * hd + j) * hd;
#pragma unroll
    for (int m = 0; m < MM; m++) {
      const int i = lane * MM + m;
      if (FULL || i < hd) Sj[i] = s[c][m];
    }
  }
}
/* decay = exp(gate) and beta = sigmoid(logit) in place, for the copied
 * (async) tiles at prefill (the same expressions as the token kernel's: the
 * same bits) */
__global__ void kda_decay_k(float *g, float *bl, const float *dt_bias, const float *A_log, size_t n, size_t nb, int H,
                            int hd, float lb) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < nb) bl[i] = sigm(bl[i]);
  if (i >= n) return;
  const int c = (int)(i % ((size_t)H * hd));
  g[i] = expf(kda_gate1(g[i], dt_bias, A_log, c / hd, c, lb));
}
/* the same four at a time (hd % 4 == 0, g 16-byte aligned, n < 2^31): 32-bit
 * index arithmetic once per four (the 64-bit modulo per element made the
 * scalar form ~2x its memory time); the same expressions, the same bits */
__global__ void kda_decay4_k(float4 *g, float *bl, const float *dt_bias, const float *A_log, int n4, int nb, int H, int hd,
                             float lb) {
  GK_PDL_BEGIN();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < nb) bl[i] = sigm(bl[i]);
  if (i >= n4) return;
  const int c = (i % (H * hd / 4)) * 4, h = c / hd;
  float4 v = g[i];
  v.x = expf(kda_gate1(v.x, dt_bias, A_log, h, c, lb));
  v.y = expf(kda_gate1(v.y, dt_bias, A_log, h, c + 1, lb));
  v.z = expf(kda_gate1(v.z, dt_bias, A_log, h, c + 2, lb));
  v.w = expf(kda_gate1(v.w, dt_bias, A_log, h, c + 3, lb));
  g[i] = v;
}

/* The recurrence's layout (GLM53_GPU_KDA_LAYOUT, gk_set_kda_layout): g1 /
 * g2 / g4, 8 lanes per column with 1, 2 or 4 columns per lane group
 * (kda_recur8_k; head dims 32, 64 and 128), x2 / x4 the same with 16 lanes
 * per column and y4 with 32 (g4's bits, twice / four times the warps; head
 * dims 64 and 128, y4 128; else g4),
 * or w4 / w8, 32 lanes per column
 * and 4 or 8 columns per warp (kda_recur_k, any head dim; w4 was the
 * default until the ninth session: H200, 4096-token prefill, w4 567 vs w8
 * 599 ms; 2 columns 619, the token loop unrolled by 2 +4..16 ms: both
 * removed). Each is another reduction order, the same for decode and
 * prefill (the choice depends on the head dim only). */
static int g_kr_layout;
extern "C" void gk_set_kda_layout(int layout) { g_kr_layout = layout > 0 && layout < GK_KR_N ? layout : 0; }
static int kr_layout(int hd) {
  if (!g_kr_layout) {
    const char *e = getenv("GLM53_GPU_KDA_LAYOUT");
    static const char *nm[GK_KR_N] = {"", "w4", "w8", "g1", "g2", "g4", "x2", "x4", "y4"};
    g_kr_layout = GK_KR_G4;
    for (int i = 1; e && i < GK_KR_N; i++)
      if (!strcmp(e, nm[i])) g_kr_layout = i;
  }
  const bool g = hd == 32 || hd == 64 || hd == 128;
  if (g_kr_layout >= GK_KR_G1 && !g) return GK_KR_W4;
  /* 16 / 32 lanes per column: 8 / 4 rows per lane */
  if ((g_kr_layout >= GK_KR_X2 && hd == 32) || (g_kr_layout == GK_KR_Y4 && hd != 128)) return GK_KR_G4;
  return g_kr_layout;
}
/* tokens per tile: what fits in `budget` bytes (48 KB: no opt-in shared
 * memory), split over two buffers when copying asynchronously; at most 32,
 * at most T (the longest segment's tokens: a batch of one-token decode
 * segments gets one-token tiles, so more blocks fit an SM; the tiling
 * never changes the bits) */
static int kr_tile_tokens(int hd, int cols, int T, bool async, size_t budget, size_t *smem) {
  const int nb = async ? 2 : 1;
  int tt = 32;
  while (tt > 1 && (size_t)nb * kr_tile_floats(hd, tt, cols) * sizeof(float) > budget) tt--;
  if (T > 0 && T < tt) tt = T;
  *smem = (size_t)nb * kr_tile_floats(hd, tt, cols) * sizeof(float);
  return tt;
}
/* Dynamic shared memory that leaves room for one block of kda_recur8_k per
 * SM, not two or three: more than half of an SM's (0: the device cannot
 * give a block that much), for grids of at most one block per SM (*sms).
 * At the model's shape the grid is 128 blocks; with programmatic dependent
 * launch its blocks are placed while the previous kernel drains, and the
 * SMs free first took two or three each while others idled (H100, 4096
 * tokens: 4.1 ms per launch in the bench, 2.3 ms alone under ncu at base
 * clock). Larger grids (batched decode) keep the small footprint. */
static size_t kr8_one_per_sm(int *sms) {
  static long v = -1;
  static int n;
  if (v < 0) {
    v = 0;
#if !GK_HIP /* HIP launches without PDL (and a CU's 64 KB of LDS leave no such room) */
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) (void)cudaGetLastError();
    else if (p.sharedMemPerMultiprocessor / 2 + 1024 <= p.sharedMemPerBlockOptin)
      v = (long)(p.sharedMemPerMultiprocessor / 2 + 1024), n = p.multiProcessorCount;
#endif
  }
  *sms = n;
  return (size_t)v;
}
/* the instantiation's opt-in to `bytes` of dynamic shared memory, once */
template <int MODE, int MM, int C, bool ASYNC, int LP> static bool kr8_smem(size_t bytes) {
  static int ok = -1;
  if (ok < 0) {
    ok = cudaFuncSetAttribute((const void *)kda_recur8_k<MODE, MM, ASYNC, C, LP>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) == cudaSuccess;
    if (!ok) (void)cudaGetLastError();
  }
  return ok;
}
template <int MODE, int MM, int C, bool ASYNC, int LP>
static void kr8_launch(const gk_batch *b, const float *qkv, const float *g, const float *dt_bias, const float *A_log,
                       float lb, const float *bl, int T, int H, float *o) {
  /* long launches (the copied tiles: prefill, never in a decode graph, so
   * the opt-in is not called during a capture): one block per SM where the
   * device allows it, tiles of up to 32 tokens in that room; else tiles in
   * 48 KB */
  int sms = 0;
  const size_t one = ASYNC ? kr8_one_per_sm(&sms) : 0;
  dim3 grid(H, gk_blocks(8 * MM, KR8_COLS), b->nseg);
  const bool big = one > 48 * 1024 && (long)grid.x * grid.y * grid.z <= sms && kr8_smem<MODE, MM, C, ASYNC, LP>(one);
  size_t sm;
  const int tt = kr_tile_tokens(8 * MM, KR8_COLS, b->maxlen, ASYNC, big ? one : 48 * 1024, &sm);
  if (big) sm = one;
  gk_launch(kda_recur8_k<MODE, MM, ASYNC, C, LP>, grid, kr8_threads<C, LP>(), sm, *b, qkv, g, dt_bias, A_log, lb, bl, H, tt,
            o, kr_out{});
}
template <int MODE, int MM>
static void kr8_run(int layout, const gk_batch *b, const float *qkv, const float *g, const float *dt_bias,
                    const float *A_log, float lb, const float *bl, int T, int H, float *o, bool async) {
#define KR8_L(C, LP)                                                                     \
  (async ? kr8_launch<MODE, MM, C, true, LP>(b, qkv, g, dt_bias, A_log, lb, bl, T, H, o) \
         : kr8_launch<MODE, MM, C, false, LP>(b, qkv, g, dt_bias, A_log, lb, bl, T, H, o))
  if (layout == GK_KR_G1) KR8_L(1, 8);
  else if (layout == GK_KR_G2) KR8_L(2, 8);
  else if constexpr (MM % 8 == 0) { /* x2 / x4 / y4 (kr_layout gives g4 where they do not apply) */
    if (layout == GK_KR_X4) KR8_L(4, 16);
    else if (layout == GK_KR_X2) KR8_L(2, 16);
    else if constexpr (MM % 16 == 0) {
      if (layout == GK_KR_Y4) KR8_L(4, 32);
      else KR8_L(4, 8);
    } else KR8_L(4, 8);
  } else KR8_L(4, 8);
#undef KR8_L
}
template <int MODE, int MM, int CPW>
static void kr_launch_c(const gk_batch *b, const float *qkv, const float *g, const float *dt_bias, const float *A_log,
                        float lb, const float *bl, int T, int H, int hd, float *o, bool async) {
  const int cols = CPW * KR_WARPS;
  size_t sm;
  const int tt = kr_tile_tokens(hd, cols, b->maxlen, async, 48 * 1024, &sm);
  dim3 grid(H, gk_blocks(hd, cols), b->nseg);
  const bool full = hd == 32 * MM;
  if (async && full)
    gk_launch(kda_recur_k<MODE, MM, true, CPW, true>, grid, KR_WARPS * 32, sm, *b, qkv, g, dt_bias, A_log, lb, bl, H, hd, tt, o);
  else if (async)
    gk_launch(kda_recur_k<MODE, MM, true, CPW, false>, grid, KR_WARPS * 32, sm, *b, qkv, g, dt_bias, A_log, lb, bl, H, hd, tt, o);
  else if (full)
    gk_launch(kda_recur_k<MODE, MM, false, CPW, true>, grid, KR_WARPS * 32, sm, *b, qkv, g, dt_bias, A_log, lb, bl, H, hd, tt, o);
  else
    gk_launch(kda_recur_k<MODE, MM, false, CPW, false>, grid, KR_WARPS * 32, sm, *b, qkv, g, dt_bias, A_log, lb, bl, H, hd, tt,
              o);
}
template <int MODE, int MM>
static void kr_launch(const gk_batch *b, const float *qkv, const float *g, const float *dt_bias, const float *A_log,
                      float lb, const float *bl, int T, int H, int hd, float *o, bool async) {
  if (kr_layout(hd) == GK_KR_W8) kr_launch_c<MODE, MM, 8>(b, qkv, g, dt_bias, A_log, lb, bl, T, H, hd, o, async);
  else kr_launch_c<MODE, MM, 4>(b, qkv, g, dt_bias, A_log, lb, bl, T, H, hd, o, async);
}
template <int MODE>
static int kr_run(const gk_batch *b, const float *qkv, const float *g, const float *dt_bias, const float *A_log, float lb,
                  const float *bl, int T, int H, int hd, float *o) {
  if (hd > 32 * KDA_MAXM) return gk_fail("kda: head dim %d above %d", hd, 32 * KDA_MAXM);
  if (batch_ok(b, "kda_recur")) return -1;
  /* cp.async tiles: CUDA, 16-byte rows (the decay given, not the raw gate) */
  const bool async = !GK_HIP && MODE != KR_RAW && hd % 4 == 0 && (uintptr_t)qkv % 16 == 0 && (uintptr_t)g % 16 == 0;
  const int layout = kr_layout(hd);
  if (layout >= GK_KR_G1) {
    if (hd == 32) kr8_run<MODE, 4>(layout, b, qkv, g, dt_bias, A_log, lb, bl, T, H, o, async);
    else if (hd == 64) kr8_run<MODE, 8>(layout, b, qkv, g, dt_bias, A_log, lb, bl, T, H, o, async);
    else kr8_run<MODE, 16>(layout, b, qkv, g, dt_bias, A_log, lb, bl, T, H, o, async);
  } else if (hd <= 32) kr_launch<MODE, 1>(b, qkv, g, dt_bias, A_log, lb, bl, T, H, hd, o, async);
  else if (hd <= 64) kr_launch<MODE, 2>(b, qkv, g, dt_bias, A_log, lb, bl, T, H, hd, o, async);
  else if (hd <= 128) kr_launch<MODE, 4>(b, qkv, g, dt_bias, A_log, lb, bl, T, H, hd, o, async);
  else kr_launch<MODE, 8>(b, qkv, g, dt_bias, A_log, lb, bl, T, H, hd, o, async);
  return GK_LAUNCHED("kda_recur");
}
extern "C" int gk_kda_recur(const gk_batch *b, const float *qkv, const float *g, const float *beta_logit, int T, int H,
                            int hd, float *o) {
  return kr_run<KR_LOG>(b, qkv, g, NULL, NULL, 0.f, beta_logit, T, H, hd, o);
}
/* decode (T < KR_DECAY_MIN): the gate transform as the tile is read; longer
 * launches turn graw into the decay in place first (one elementwise pass,
 * instead of every block recomputing its head's gates) and copy tiles
 * asynchronously. The same expf(kda_gate1(.)) either way: the same bits. */
#define KR_DECAY_MIN 32
extern "C" int gk_kda_recur_gated(const gk_batch *b, const float *qkv, float *graw, const float *dt_bias,
                                  const float *A_log, float lower_bound, float *beta_logit, int T, int H, int hd,
                                  float *o) {
  if (T >= KR_DECAY_MIN) {
    const size_t n = (size_t)T * H * hd;
    if (hd % 4 == 0 && (uintptr_t)graw % 16 == 0 && n < ((size_t)1 << 31))
      gk_launch(kda_decay4_k, gk_blocks(n / 4, 256), 256, 0, (float4 *)graw, beta_logit, dt_bias, A_log, (int)(n / 4), T * H,
                H, hd, lower_bound);
    else
      gk_launch(kda_decay_k, gk_blocks(n, 256), 256, 0, graw, beta_logit, dt_bias, A_log, n, (size_t)T * H, H, hd,
                lower_bound);
    if (GK_LAUNCHED("kda_decay")) return -1;
    return kr_run<KR_DECAY>(b, qkv, graw, NULL, NULL, 0.f, beta_logit, T, H, hd, o);
  }
  return kr_run<KR_RAW>(b, qkv, graw, dt_bias, A_log, lower_bound, beta_logit, T, H, hd, o);
}

/* decode: the recurrence with the gated norm in its last block per head
 * (kda_recur8_k's OUT form; layout g4, head dims 32 / 64 / 128) */
unsigned *gk_scratch_counters(size_t n); /* (gk_gemm.cu: zero between uses) */
template <int MM>
static void kr8_out_launch(const gk_batch *b, const float *qkv, const float *g, const float *dt_bias, const float *A_log,
                           float lb, const float *bl, int H, float *o, const kr_out &ko) {
  dim3 grid(H, gk_blocks(8 * MM, KR8_COLS), b->nseg);
  size_t sm;
  const int tt = kr_tile_tokens(8 * MM, KR8_COLS, b->maxlen, false, 48 * 1024, &sm);
  gk_launch(kda_recur8_k<KR_RAW, MM, false, 4, 8, true>, grid, kr8_threads<4, 8>(), sm, *b, qkv, g, dt_bias, A_log, lb, bl,
            H, tt, o, ko);
}
static int g_kda_out_fuse = -1;
extern "C" void gk_set_kda_out_fuse(int on) { g_kda_out_fuse = on < 0 ? -1 : !!on; }
extern "C" int gk_kda_recur_out(const gk_batch *b, const float *qkv, float *graw, const float *dt_bias, const float *A_log,
                                float lower_bound, float *beta_logit, int T, int H, int hd, float *o, const float *z,
                                const float *w, float eps, void *ob) {
  /* opt-in until measured on a device (twenty-second session) */
  if (g_kda_out_fuse < 0) g_kda_out_fuse = getenv("GLM53_GPU_KDA_OUT_FUSE") && !strcmp(getenv("GLM53_GPU_KDA_OUT_FUSE"), "1");
  if (!g_kda_out_fuse || T <= 0 || T >= KR_DECAY_MIN || !(hd == 32 || hd == 64 || hd == 128) || kr_layout(hd) != GK_KR_G4)
    return 1;
  if (batch_ok(b, "kda_recur_out")) return -1;
  unsigned *cnt = gk_scratch_counters((size_t)b->nseg * H);
  if (!cnt) return -1;
  const kr_out ko = {z, w, (uint16_t *)ob, cnt, eps};
  if (hd == 32) kr8_out_launch<4>(b, qkv, graw, dt_bias, A_log, lower_bound, beta_logit, H, o, ko);
  else if (hd == 64) kr8_out_launch<8>(b, qkv, graw, dt_bias, A_log, lower_bound, beta_logit, H, o, ko);
  else kr8_out_launch<16>(b, qkv, graw, dt_bias, A_log, lower_bound, beta_logit, H, o, ko);
  return GK_LAUNCHED("kda_recur + out") ? -1 : 0;
}

extern "C" void gk_set_decode_fusions(int on) {
  gk_set_route_fuse(on);
  gk_set_mhc_pre_fuse(on);
  gk_set_idx_fuse(on);
  gk_set_kda_out_fuse(on);
}

/* gated RMSNorm per head: w * o / rms(o) * sigmoid(z) */
/* ob NULL: o in place; else bf16 into ob (the rounding the output
 * projection's cuBLAS path gives its x: the same product, half the bytes
 * and no conversion pass) */
__global__ void kda_out_k(float *o, const float *z, const float *w, int T, int H, int hd, float eps, uint16_t *ob) {
  GK_PDL_BEGIN();
  int wid = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (wid >= T * H) return;
  kda_out_row(o, z, w, (size_t)wid * hd, hd, eps, ob, lane); /* (t*H + h)*hd == t*inner + h*hd */
}
extern "C" int gk_kda_out(float *o, const float *z, const float *w, int T, int H, int hd, float eps, void *ob) {
  gk_launch(kda_out_k, gk_blocks((size_t)T * H * 32, 256), 256, 0, o, z, w, T, H, hd, eps, (uint16_t *)ob);
  return GK_LAUNCHED("kda_out");
}

/* ---- DSA indexer (mla.c pool_key / indexer_scores / topk_pools) ---- */
extern "C" int gk_pool_keys(const gk_batch *b, const float *ape, int P, int hd) {
  if (P > 64) return gk_fail("indexer: kpool %d above 64", P);
  if (batch_ok(b, "pool_keys")) return -1;
  gk_launch(pool_keys_k, dim3(gk_blocks((size_t)(b->maxlen / P + 1) * hd, 256), b->nseg), 256, 0, *b, ape, P, hd);
  return GK_LAUNCHED("pool_keys");
}

static int g_idx_fuse = -1;
extern "C" void gk_set_idx_fuse(int on) { g_idx_fuse = on < 0 ? -1 : !!on; }
static int idx_fuse_on(void) {
  /* opt-in until measured on a device (twenty-second session) */
  if (g_idx_fuse < 0) g_idx_fuse = getenv("GLM53_GPU_IDX_FUSE") && !strcmp(getenv("GLM53_GPU_IDX_FUSE"), "1");
  return g_idx_fuse;
}
extern "C" int gk_idx_keys(const gk_batch *b, float *kk, const float *kg, const float *knw, const float *knb, const float *ape,
                           int T, int P, int hd, float eps) {
  if (!idx_fuse_on() || b->maxlen != 1 || T != b->nseg || P > 64 || T <= 0) return 1;
  if (batch_ok(b, "idx_keys")) return -1;
  gk_launch(idx_keys_k, T, 256, 0, *b, kk, kg, knw, knb, ape, P, hd, eps);
  return GK_LAUNCHED("indexer keys") ? -1 : 0;
}

extern "C" int gk_indexer_scores(const float *q, const float *w, const gk_batch *b, int T, int P, int nh, int hd, int K,
                                 int maxpool, float *score) {
  if (batch_ok(b, "indexer_scores")) return -1;
  const size_t sm = ((size_t)nh * (hd + 1) + 8 * (size_t)hd) * sizeof(float);
  if (sm > 48 * 1024) return gk_fail("indexer: %d heads x %d need %zu bytes of shared memory", nh, hd, sm);
  const int ppb = T >= 64 ? 64 : 8;
  dim3 grid(T, gk_blocks(maxpool, ppb));
  gk_launch(idx_scores_k, grid, 256, sm, q, w, *b, P, nh, hd, K, maxpool, ppb, score);
  return GK_LAUNCHED("indexer_scores");
}

/* top-K pools in the order topk_pools produces (score desc, index asc;
 * NaN as -inf). Up to `cap` pools (a power of two, the launch's shared
 * memory) a bitonic sort of (score, index) in shared memory (log^2
 * stages); beyond, rank by counting: pool p's rank is the number of pools
 * ordered before it (O(n^2), the former path at every length). H200, 1024
 * pools, one decode token: 58 vs 126 us (gk_kprof, so with launch gaps).
 * Both give the same K pools in the same order: the order is total. */
__global__ void select_k(const float *score, gk_batch b, int P, int K, int maxpool, int always_tail, int cap, int *dense,
                         int *npools, int *tail, int *pools) {
  GK_PDL_BEGIN();
  extern __shared__ float sel_sh[]; /* scores[cap], then indices[cap] */
  const int t = blockIdx.x, pos = bpos(b, t, NULL), n = (pos + 1) / P;
  int *pl = pools + (size_t)t * K;
  const float *sc = score + (size_t)t * maxpool;
  int n2 = 1;
  while (n2 < n) n2 <<= 1;
  if (n <= K) {
    for (int p = threadIdx.x; p < n; p += blockDim.x) pl[p] = p;
  } else if (n2 <= cap) {
    float *ss = sel_sh;
    int *si = (int *)(sel_sh + cap);
    for (int i = threadIdx.x; i < n2; i += blockDim.x) {
      ss[i] = i < n ? sc[i] : -INFINITY; /* padding sorts after every pool: -inf, larger index */
      si[i] = i;
    }
    __syncthreads();
    for (int k = 2; k <= n2; k <<= 1)
      for (int j = k >> 1; j > 0; j >>= 1) {
        for (int i = threadIdx.x; i < n2; i += blockDim.x) {
          const int l = i ^ j;
          if (l <= i) continue;
          const float a = ss[i], c = ss[l];
          const int ia = si[i], ic = si[l];
          /* ascending in "ordered before" within blocks of k with (i & k) == 0, descending otherwise */
          if ((i & k) == 0 ? pool_before(c, ic, a, ia) : pool_before(a, ia, c, ic)) {
            ss[i] = c; ss[l] = a;
            si[i] = ic; si[l] = ia;
          }
        }
        __syncthreads();
      }
    for (int r = threadIdx.x; r < K; r += blockDim.x) pl[r] = si[r];
  } else {
    for (int p = threadIdx.x; p < n; p += blockDim.x) {
      float v = sc[p];
      int rank = 0;
      for (int q = 0; q < n; q++) rank += pool_before(sc[q], q, v, p);
      if (rank < K) pl[rank] = p;
    }
  }
  if (threadIdx.x == 0) {
    dense[t] = n <= K ? always_tail : 0;
    npools[t] = n <= K ? n : K;
    tail[t] = always_tail ? n * P : pos + 1;
  }
}
#define SEL_SORT_MAX 4096 /* pools sorted in shared memory: 32 KB */
extern "C" int gk_select(const float *score, const gk_batch *b, int T, int P, int K, int maxpool, int always_tail, int *dense,
                         int *npools, int *tail, int *pools) {
  if (batch_ok(b, "select")) return -1;
  int cap = 0; /* no sort buffer while no token can see more than K pools */
  if (maxpool > K) {
    cap = 1;
    while (cap < maxpool && cap < SEL_SORT_MAX) cap <<= 1;
  }
  gk_launch(select_k, T, 256, (size_t)cap * 8, score, *b, P, K, maxpool, always_tail, cap, dense, npools, tail, pools);
  return GK_LAUNCHED("select");
}

/* which core: the head-sharing kernel (default) or the per-head one
 * (GLM53_GPU_MLA=head, or kl not a multiple of 4) */
static int g_mla_hs = -1;
extern "C" void gk_set_mla_kernel(int hs) { g_mla_hs = hs ? 1 : 0; }
static int mla_hs_on(int kl) {
  if (g_mla_hs < 0) g_mla_hs = !(getenv("GLM53_GPU_MLA") && !strcmp(getenv("GLM53_GPU_MLA"), "head"));
  return g_mla_hs && kl % 4 == 0;
}
/* the smallest flash-decoding part (the core's tile of rows), and the part
 * count that covers selections of up to maxN rows (split_rows) */
extern "C" int gk_mla_split_tile(int kl) { return mla_hs_on(kl) ? HS_R : 32; }
extern "C" int gk_mla_nsplit(int maxN, int chunk) {
  const int n = (maxN + chunk - 1) / chunk;
  return n < 1 ? 1 : n < MLA_PARTS ? n : MLA_PARTS;
}

extern "C" int gk_mla_attn(const float *qt, const gk_batch *b, const int *dense, const int *npools, const int *tail,
                           const int *pools, int T, int H, int kl, int P, int K, float scale, int chunk, int nsplit,
                           float *part, float *ob) {
  if (kl > KL_MAX) return gk_fail("mla: kv_lora_rank %d above %d", kl, KL_MAX);
  if (batch_ok(b, "mla_attn")) return -1;
  if (chunk <= 0) nsplit = 1;
  if (mla_hs_on(kl)) {
    static int attr;
    if (!attr) { /* more than the 48 KB default of dynamic shared memory */
      GK_TRY(cudaFuncSetAttribute((const void *)mla_hs_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)hs_smem(KL_MAX)));
      attr = 1;
    }
    dim3 grid(T, (H + HS_HG - 1) / HS_HG, nsplit);
    gk_launch(mla_hs_k, grid, 256, hs_smem(kl), qt, *b, dense, npools, tail, pools, H, kl, P, K, scale, chunk, nsplit, part, ob);
  } else {
    dim3 grid(T, H, nsplit);
    gk_launch(mla_attn_k, grid, 256, 0, qt, *b, dense, npools, tail, pools, H, kl, P, K, scale, chunk, nsplit, part, ob);
  }
  if (nsplit > 1) gk_launch(mla_merge_k, T * H, 256, 0, part, *b, dense, npools, tail, H, P, chunk, nsplit, kl, ob);
  return GK_LAUNCHED("mla_attn");
}

extern "C" int gk_store_at(const gk_batch *b, int which, int stride, const float *src, int T, int n) {
  if (batch_ok(b, "store_at")) return -1;
  gk_launch(store_at_k, gk_blocks((size_t)T * n, 256), 256, 0, *b, which, stride, src, T, n);
  return GK_LAUNCHED("store_at");
}

/* rows [0, rows) of a paged state, contiguous (gk_pages_linear); V floats
 * per thread (4 when the stride allows float4) */
template <int V>
__global__ void pages_linear_k(float *const *table, int pshift, int rows, int stride, float *dst) {
  GK_PDL_BEGIN();
  const size_t i = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) * V;
  if (i >= (size_t)rows * stride) return;
  const int r = (int)(i / stride), c = (int)(i % stride);
  const float *src = table[r >> pshift] + (size_t)(r & ((1 << pshift) - 1)) * stride + c;
  float v[V];
  vload<V>(v, src);
  vstore<V>(dst + i, v);
}
static gk_scratch g_lin[2];
extern "C" float *gk_pages_linear(int slot, float *const *table, int pshift, int rows, int stride) {
  if (slot < 0 || slot > 1 || rows <= 0 || stride <= 0) {
    gk_fail("pages_linear: slot %d, %d rows of %d", slot, rows, stride);
    return NULL;
  }
  const size_t n = (size_t)rows * stride;
  float *d = (float *)gk_scratch_grow(&g_lin[slot], n * sizeof(float));
  if (!d) return NULL;
  if (stride % 4 == 0) gk_launch(pages_linear_k<4>, gk_blocks(n / 4, 256), 256, 0, table, pshift, rows, stride, d);
  else gk_launch(pages_linear_k<1>, gk_blocks(n, 256), 256, 0, table, pshift, rows, stride, d);
  return GK_LAUNCHED("pages_linear") ? NULL : d;
}

/* ---- MoE router (moe.c moe_route; the per-token work in gk_route.cuh) ---- */
__global__ void moe_route_k(const float *logits, const float *bias, int T, int E, int k, int G, int topk_group, int norm,
                            float scaling, int *idx, float *wt, const gpu_mat *wset, long pfb, int *grp, int gmax) {
  GK_PDL_BEGIN();
  __shared__ route_smem sm[ROUTE_WARPS];
  const int w = threadIdx.x >> 5, t = blockIdx.x * ROUTE_WARPS + w;
  if (t >= T) return; /* the whole warp: no block barrier below */
  route_token(logits + (size_t)t * E, bias, E, k, G, topk_group, norm, scaling, idx + (size_t)t * k, wt + (size_t)t * k,
              wset, pfb / T, grp, gmax, sm[w]);
}
static long g_xpf = -1;
extern "C" void gk_set_expert_l2pf(long bytes) {
  if (bytes < 0) {
    const char *e = getenv("GLM53_GPU_EXPERT_L2PF_MB");
    bytes = e && *e ? (long)(atof(e) * 1048576.0) : 0; /* off until measured on the device */
  }
  g_xpf = bytes > 0 ? bytes : 0;
}
extern "C" long gk_expert_l2pf(void) {
  if (g_xpf < 0) gk_set_expert_l2pf(-1);
  return g_xpf;
}
static int g_route_group = -1; /* GLM53_GPU_ROUTE_GROUP=0: gk_moe_route_group declines */
extern "C" void gk_set_route_group(int on) { g_route_group = on < 0 ? -1 : !!on; }
extern "C" int gk_route_group_on(void) {
  if (g_route_group < 0) g_route_group = !(getenv("GLM53_GPU_ROUTE_GROUP") && !strcmp(getenv("GLM53_GPU_ROUTE_GROUP"), "0"));
  return g_route_group;
}
static int route_launch(const float *logits, const float *bias, int T, int E, int k, int G, int topk_group, int norm,
                        float scaling, int *idx, float *wt, const gpu_mat *wset, int *grp) {
  if (E > E_MAX || G > 64 || k > 64) return gk_fail("moe: %d experts / %d groups / top-%d above the kernel's bounds", E, G, k);
  const long pfb = wset ? gk_expert_l2pf() : 0;
  gk_launch(moe_route_k, gk_blocks(T, ROUTE_WARPS), 32 * ROUTE_WARPS, 0, logits, bias, T, E, k, G, topk_group, norm,
            scaling, idx, wt, pfb > 0 ? wset : (const gpu_mat *)NULL, pfb, grp, grp ? gk_expert_group_max(k, E) : 0);
  return GK_LAUNCHED("moe_route");
}
extern "C" int gk_moe_route_pf(const float *logits, const float *bias, int T, int E, int k, int G, int topk_group, int norm,
                               float scaling, int *idx, float *wt, const gpu_mat *wset) {
  return route_launch(logits, bias, T, E, k, G, topk_group, norm, scaling, idx, wt, wset, NULL);
}
extern "C" int gk_moe_route_group(const float *logits, const float *bias, int T, int E, int k, int G, int topk_group,
                                  int norm, float scaling, int *idx, float *wt, const gpu_mat *wset, int *grp) {
  if (T != 1 || !gk_route_group_on()) return 1;
  return route_launch(logits, bias, T, E, k, G, topk_group, norm, scaling, idx, wt, wset, grp) ? -1 : 0;
}
extern "C" int gk_moe_route(const float *logits, const float *bias, int T, int E, int k, int G, int topk_group, int norm,
                            float scaling, int *idx, float *wt) {
  return gk_moe_route_pf(logits, bias, T, E, k, G, topk_group, norm, scaling, idx, wt, NULL);
}

/* out[t] (holding the shared expert) += wt * expert output, in ascending
 * expert id as the reference accumulates */
__global__ void moe_combine_k(float *out, const float *eo, const int *idx, const float *wt, int T, int k, int D) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)T * D) return;
  out[i] = moe_sum<float>(out[i], eo, NULL, idx, wt, (int)(i / D), k, D, (int)(i % D));
}
extern "C" int gk_moe_combine(float *out, const float *eo, const int *idx, const float *wt, int T, int k, int D) {
  gk_launch(moe_combine_k, gk_blocks((size_t)T * D, 256), 256, 0, out, eo, idx, wt, T, k, D);
  return GK_LAUNCHED("moe_combine");
}

__global__ void gather_k(float *dst, const float *src, const int *rows, int n, int D, int scatter) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)n * D) return;
  size_t r = i / D, d = i % D;
  if (scatter) dst[(size_t)rows[r] * D + d] = src[i];
  else dst[i] = src[(size_t)rows[r] * D + d];
}
extern "C" int gk_gather_rows(float *dst, const float *src, const int *rows, int n, int D) {
  if (n <= 0) return 0;
  gk_launch(gather_k, gk_blocks((size_t)n * D, 256), 256, 0, dst, src, rows, n, D, 0);
  return GK_LAUNCHED("gather");
}
extern "C" int gk_scatter_rows(float *dst, const float *src, const int *rows, int n, int D) {
  if (n <= 0) return 0;
  gk_launch(gather_k, gk_blocks((size_t)n * D, 256), 256, 0, dst, src, rows, n, D, 1);
  return GK_LAUNCHED("scatter");
}

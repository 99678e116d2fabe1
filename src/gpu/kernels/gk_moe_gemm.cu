/* Routed experts of long chunks (prefill, batches of >= gk_gemm_min()
 * tokens) as bf16 tensor-core GEMMs over pairs sorted by expert.
 *
 * gk_moe_sort orders the (token, expert) pairs by expert on the device
 * (stable: ascending pair index within an expert) in three small kernels:
 * per-chunk histograms, a column scan giving every chunk's first slot per
 * expert, then each pair's slot = its chunk's slot + its rank among the
 * chunk's earlier pairs of the same expert. Counts are exact integers, so
 * the order is deterministic.
 *
 * gk_moe_experts_gemm then gathers the pairs' token rows once, converted to
 * bf16 in sorted order (one launch for every expert), runs gate and up
 * (bf16 out; fp32 with GLM53_GPU_MOE_OUT=f32), one SwiGLU launch writing
 * bf16, and down into eo in sorted order (bf16 out, or fp32): the MoE
 * combine reads eo through erow (gk_mhc_post_moe), so no scatter. At a
 * 4096-token prefill of 8 experts per token the fp32 forms of g, u and eo
 * are 268, 268 and 537 MB per layer, written once and read once (bf16:
 * 11-17 ms less per prefill on an H100). bf16 experts go in buckets of
 * similar pair counts, each padded to its largest and run as one batched
 * GEMM (cublasGemmBatchedEx): a
 * single expert's GEMM at ~1000 rows fills half of an H200 (measured:
 * ~200-235 TFLOP/s per-expert). Quantized experts are dequantised to bf16
 * per expert into scratch and run one at a time. */
#include "gk_common.cuh"
#include <stdlib.h>
#include <string.h>

#define SORT_CHUNK 256

/* per chunk of SORT_CHUNK pairs: the pairs of each expert (shared atomics:
 * the counts do not depend on their order) */
__global__ void moe_hist_k(const int *idx, int np, int E, int *ccount) {
  GK_PDL_BEGIN();
  extern __shared__ int cnt[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int p = blockIdx.x * SORT_CHUNK + threadIdx.x;
  if (p < np && idx[p] >= 0 && idx[p] < E) atomicAdd(&cnt[idx[p]], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) ccount[(size_t)blockIdx.x * E + e] = cnt[e];
}

/* one block: ccount[c][e] becomes the first slot of chunk c's pairs of
 * expert e; off[e] the first slot of expert e, off[E] the routed pairs */
__global__ void moe_scan_k(int *ccount, int nchunk, int E, int *off) {
  GK_PDL_BEGIN();
  extern __shared__ int tot[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = 0;
    for (int c = 0; c < nchunk; c++) {
      const int v = ccount[(size_t)c * E + e];
      ccount[(size_t)c * E + e] = run;
      run += v;
    }
    tot[e] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0;
    for (int e = 0; e < E; e++) {
      const int v = tot[e];
      tot[e] = s;
      off[e] = s;
      s += v;
    }
    off[E] = s;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    for (int c = 0; c < nchunk; c++) ccount[(size_t)c * E + e] += tot[e];
}

/* perm[slot] = pair for the routed pairs */
__global__ void moe_place_k(const int *idx, int np, int E, const int *ccount, int *perm) {
  GK_PDL_BEGIN();
  __shared__ int sid[SORT_CHUNK];
  const int p = blockIdx.x * SORT_CHUNK + threadIdx.x;
  const int e = p < np ? idx[p] : -1;
  sid[threadIdx.x] = e;
  __syncthreads();
  if (p >= np || e < 0 || e >= E) return;
  int rank = 0;
  for (int j = 0; j < (int)threadIdx.x; j++) rank += sid[j] == e;
  perm[ccount[(size_t)blockIdx.x * E + e] + rank] = p;
}

static gk_scratch g_cc;

extern "C" int gk_moe_sort(const int *idx, int np, int E, int *perm, int *off) {
  if (np <= 0 || E <= 0) return 0;
  const int nchunk = (np + SORT_CHUNK - 1) / SORT_CHUNK;
  int *cc = (int *)gk_scratch_grow(&g_cc, (size_t)nchunk * E * sizeof(int));
  if (!cc) return -1;
  const size_t sm = (size_t)E * sizeof(int);
  gk_launch(moe_hist_k, nchunk, SORT_CHUNK, sm, idx, np, E, cc);
  gk_launch(moe_scan_k, 1, 512, sm, cc, nchunk, E, off);
  gk_launch(moe_place_k, nchunk, SORT_CHUNK, 0, idx, np, E, (const int *)cc, perm);
  return GK_LAUNCHED("moe sort");
}

#if GK_HAVE_BLAS
/* for each compact slot s (expert e, padded row r = poff[e] + s - off[e]):
 * xs[r][:] = bf16(x[pair / k][:]) and erow[pair] = r; one block per slot */
template <bool V4>
__global__ void moe_gather_bf16_k(const float *x, int ldx, const int *perm, const int *idx, const int *off, const int *poff,
                                  int k, int D, __nv_bfloat16 *xs, int *erow) {
  GK_PDL_BEGIN();
  const int s = blockIdx.x, p = perm[s], e = idx[p], r = poff[e] + s - off[e];
  if (threadIdx.x == 0) erow[p] = r;
  const float *src = x + (size_t)(p / k) * ldx;
  __nv_bfloat16 *dst = xs + (size_t)r * D;
  if (V4) { /* D % 4 == 0, 16-byte aligned rows: float4 in, 4 bf16 out */
    for (int d = threadIdx.x * 4; d < D; d += blockDim.x * 4) {
      const float4 v = __ldg((const float4 *)(src + d));
      *(uint2 *)(dst + d) = make_uint2(bf16_bits(v.x) | bf16_bits(v.y) << 16, bf16_bits(v.z) | bf16_bits(v.w) << 16);
    }
  } else {
    for (int d = threadIdx.x; d < D; d += blockDim.x) dst[d] = __float2bfloat16(src[d]);
  }
}

/* The token rows once in bf16 (T x D, gk_rows_bf16: the rounding of the
 * gather above), then the gather copies bf16 rows: the source (33 MB at a
 * 4096-token prefill) stays in L2 across a token's k copies, instead of
 * k reads of its fp32 row from memory. Same bits.
 * xs[r] = xb[pair / k] (8 bf16 per thread, D % 8 == 0) and erow, as moe_gather_bf16_k */
__global__ void moe_gather16_k(const uint4 *xb, const int *perm, const int *idx, const int *off, const int *poff, int k, int D,
                               uint4 *xs, int *erow) {
  GK_PDL_BEGIN();
  const int s = blockIdx.x, p = perm[s], e = idx[p], r = poff[e] + s - off[e], n8 = D / 8;
  if (threadIdx.x == 0) erow[p] = r;
  const uint4 *src = xb + (size_t)(p / k) * n8;
  uint4 *dst = xs + (size_t)r * n8;
  for (int d = threadIdx.x; d < n8; d += blockDim.x) dst[d] = src[d];
}

/* h = bf16(swiglu(g, u)) elementwise from fp32 or bf16 (raw bits,
 * gk_moe_bf16_out) g and u: four per thread (n % 4 == 0, g and u aligned
 * to four elements, h to 8 bytes), or one */
template <typename IT>
__global__ void swiglu_bf16_v4_k(const IT *g, const IT *u, size_t n4, float limit, uint2 *h) {
  GK_PDL_BEGIN();
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n4) return;
  float a[4], b[4];
  vload<4>(a, g + 4 * i);
  vload<4>(b, u + 4 * i);
  h[i] = make_uint2(bf16_bits(swiglu1(a[0], b[0], limit)) | bf16_bits(swiglu1(a[1], b[1], limit)) << 16,
                    bf16_bits(swiglu1(a[2], b[2], limit)) | bf16_bits(swiglu1(a[3], b[3], limit)) << 16);
}
template <typename IT>
__global__ void swiglu_bf16_k(const IT *g, const IT *u, size_t n, float limit, __nv_bfloat16 *h) {
  GK_PDL_BEGIN();
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) h[i] = __float2bfloat16(swiglu1(ld_f(g + i), ld_f(u + i), limit));
}
template <typename IT> static void swiglu_bf16(const IT *g, const IT *u, size_t n, float limit, void *h) {
  const uintptr_t a = 4 * sizeof(IT);
  if (!n) return;
  if (n % 4 == 0 && (uintptr_t)g % a == 0 && (uintptr_t)u % a == 0 && (uintptr_t)h % 8 == 0)
    gk_launch(swiglu_bf16_v4_k<IT>, gk_blocks(n / 4, 256), 256, 0, g, u, n / 4, limit, (uint2 *)h);
  else
    gk_launch(swiglu_bf16_k<IT>, gk_blocks(n, 256), 256, 0, g, u, n, limit, (__nv_bfloat16 *)h);
}
extern "C" int gk_swiglu_to_bf16(const float *g, const float *u, size_t n, float limit, void *h) {
  swiglu_bf16(g, u, n, limit, h);
  return 0;
}

static cublasHandle_t g_h; /* gk_blas_handle(), fetched per call of gk_moe_experts_gemm */
static gk_scratch g_xs, g_hb, g_wq, g_tab, g_x16;
static cudaDataType_t g_ct; /* the outputs' type this call: CUDA_R_16BF (gk_moe_bf16_out) or CUDA_R_32F */

/* C[n][rows] (g_ct, ldc = rows) = B[n][cols] (bf16) . W^T, W bf16 [rows][cols] */
static int gemm_bf16(const void *W, int rows, int cols, const void *B, int n, void *C) {
  const float one = 1.f, zero = 0.f;
  if (cublasGemmEx(g_h, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, W, CUDA_R_16BF, cols, B, CUDA_R_16BF, cols, &zero, C,
                   g_ct, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
    return gk_fail("moe gemm: cublasGemmEx failed (%d x %d x %d)", rows, n, cols);
  return 0;
}
/* the same for nb problems of one shape, pointers in device arrays */
static int gemm_bf16_batched(const void *const *A, int rows, int cols, const void *const *B, int n, void *const *C, int nb) {
  const float one = 1.f, zero = 0.f;
  if (cublasGemmBatchedEx(g_h, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &one, A, CUDA_R_16BF, cols, B, CUDA_R_16BF, cols, &zero,
                          C, g_ct, rows, nb, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
    return gk_fail("moe gemm: cublasGemmBatchedEx failed (%d of %d x %d x %d)", nb, rows, n, cols);
  return 0;
}

/* a bf16 view of expert matrix W: W itself, or dequantised into slot q of the scratch */
static const void *as_bf16(const gpu_mat *W, int q, size_t slot) {
  if (W->fmt == GF_BF16) return W->d;
  __nv_bfloat16 *t = (__nv_bfloat16 *)g_wq.p + (size_t)q * slot;
  gk_dequant_bf16(W, t);
  return t;
}

/* bf16 experts: buckets of experts whose pair counts are within 1/8 of the
 * bucket's largest, each padded to it, so that one batched GEMM runs a
 * bucket's experts side by side (one expert's GEMM alone is too small to
 * fill the device). Host: ord[] (used experts by descending count, ties by
 * id), bucket starts, poff[e] (padded first row). Returns the bucket count. */
static int buckets(const int *hoff, int E, int *ord, int *bstart, int *poff) {
  int nu = 0;
  for (int e = 0; e < E; e++)
    if (hoff[e + 1] > hoff[e]) ord[nu++] = e;
  for (int i = 1; i < nu; i++) { /* insertion sort: E <= 512 */
    const int v = ord[i], cv = hoff[v + 1] - hoff[v];
    int j = i;
    while (j > 0 && hoff[ord[j - 1] + 1] - hoff[ord[j - 1]] < cv) { ord[j] = ord[j - 1]; j--; }
    ord[j] = v;
  }
  int nb = 0, row = 0;
  for (int i = 0; i < nu;) {
    const int top = hoff[ord[i] + 1] - hoff[ord[i]];
    bstart[nb++] = i;
    for (; i < nu && 8 * (hoff[ord[i] + 1] - hoff[ord[i]]) >= 7 * top; i++) {
      poff[ord[i]] = row;
      row += top;
    }
  }
  bstart[nb] = nu;
  for (int e = 0; e < E; e++)
    if (hoff[e + 1] == hoff[e]) poff[e] = row;
  poff[E] = row;
  return nb;
}
#endif

/* 1: the bf16 copy (x's gk_xb_alias where registered); 0: gather from the
 * fp32 rows (GLM53_GPU_MOE_X16=0); 2: a fresh copy even where x has an
 * alias (GLM53_GPU_MOE_X16=fresh: made right before the gather, so its
 * rows are in L2; measured 1-7 ms per prefill slower on an H100) */
static int g_x16_on = -1;
extern "C" void gk_set_moe_x16(int on) { g_x16_on = on >= 0 && on <= 2 ? on : -1; }

static int g_bf16_out = -1;
extern "C" void gk_set_moe_bf16_out(int on) { g_bf16_out = on < 0 ? -1 : !!on; }
extern "C" int gk_moe_bf16_out(void) {
  if (g_bf16_out < 0) g_bf16_out = !(getenv("GLM53_GPU_MOE_OUT") && !strcmp(getenv("GLM53_GPU_MOE_OUT"), "f32"));
  return g_bf16_out;
}

extern "C" size_t gk_moe_gemm_rows(int npairs) { return (size_t)npairs + (size_t)npairs / 7 + 1; }

extern "C" int gk_moe_experts_gemm(const gpu_mat *h_exp, int E, const int *hoff, const int *off, const int *perm,
                                   const int *idx, int k, const float *x, int ldx, int T, int D, int I, float limit,
                                   float *g, float *u, float *eo, int *erow) {
#if !GK_HAVE_BLAS
  (void)h_exp; (void)E; (void)hoff; (void)off; (void)perm; (void)idx; (void)k; (void)x; (void)ldx; (void)T; (void)D; (void)I;
  (void)limit; (void)g; (void)u; (void)eo; (void)erow;
  return gk_fail("moe gemm: no BLAS in this build");
#else
  const int n = hoff[E];
  if (n <= 0) return 0;
  if (E > 512) return gk_fail("moe gemm: %d experts above 512", E);
  if (!(g_h = gk_blas_handle())) return gk_fail("moe gemm: cuBLAS not initialised (gk_init)");
  const bool o16 = gk_moe_bf16_out();
  g_ct = o16 ? CUDA_R_16BF : CUDA_R_32F;
  const size_t es = o16 ? 2 : 4; /* bytes per output element */
  char *const gb = (char *)g, *const ub = (char *)u, *const eob = (char *)eo;
  const int quant = h_exp[0].fmt != GF_BF16;
  int ord[512], bst[513], poff[513];
  int nb = 0;
  if (quant) memcpy(poff, hoff, ((size_t)E + 1) * sizeof(int)); /* one expert at a time: no padding */
  else nb = buckets(hoff, E, ord, bst, poff);
  const int rows = poff[E]; /* <= gk_moe_gemm_rows(n) */
  /* device table: poff, then per used expert (in ord order) the pointers of
   * gate+up (A: 2 per expert, B, C) and down (A, B, C) */
  const size_t ptr0 = ((size_t)(E + 1) * sizeof(int) + 15) & ~(size_t)15, nptr = quant ? 0 : (size_t)9 * E;
  char *tab = (char *)gk_scratch_grow(&g_tab, ptr0 + nptr * sizeof(void *));
  __nv_bfloat16 *xs = (__nv_bfloat16 *)gk_scratch_grow(&g_xs, (size_t)rows * D * 2);
  __nv_bfloat16 *hb = (__nv_bfloat16 *)gk_scratch_grow(&g_hb, (size_t)rows * I * 2);
  const size_t slot = (size_t)I * D; /* gate, up and down have I x D elements each */
  if (!tab || !xs || !hb || (quant && !gk_scratch_grow(&g_wq, 3 * slot * 2))) return -1;
  alignas(16) char host[16 + 513 * sizeof(int) + 9 * 512 * sizeof(void *)];
  memcpy(host, poff, ((size_t)E + 1) * sizeof(int));
  const void **hp = (const void **)(host + ptr0);
  const int nu = quant ? 0 : bst[nb];
  for (int i = 0; i < nu; i++) {
    const int e = ord[i];
    const gpu_mat *W = h_exp + (size_t)e * 3;
    hp[2 * i] = W[0].d;                          /* gate+up A */
    hp[2 * i + 1] = W[1].d;
    hp[2 * nu + 2 * i] = hp[2 * nu + 2 * i + 1] = xs + (size_t)poff[e] * D; /* gate+up B */
    hp[4 * nu + 2 * i] = gb + (size_t)poff[e] * I * es; /* gate+up C */
    hp[4 * nu + 2 * i + 1] = ub + (size_t)poff[e] * I * es;
    hp[6 * nu + i] = W[2].d;                     /* down A, B, C */
    hp[7 * nu + i] = hb + (size_t)poff[e] * I;
    hp[8 * nu + i] = eob + (size_t)poff[e] * D * es;
  }
  GK_TRY(cudaMemcpyAsync(tab, host, ptr0 + (size_t)9 * nu * sizeof(void *), cudaMemcpyHostToDevice, cudaStreamPerThread));
  if (g_x16_on < 0) {
    const char *e = getenv("GLM53_GPU_MOE_X16");
    g_x16_on = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "fresh") ? 2 : 1;
  }
  const bool v4 = D % 4 == 0 && ldx % 4 == 0 && (uintptr_t)x % 16 == 0;
  const void *xa = g_x16_on == 1 && v4 && D % 8 == 0 ? gk_xb_lookup(x, T, D, ldx) : NULL; /* x already in bf16 (16-byte aligned rows) */
  uint2 *x16 = xa && (uintptr_t)xa % 16 == 0 ? (uint2 *)xa
               : g_x16_on && v4 && D % 8 == 0 ? (uint2 *)gk_scratch_grow(&g_x16, (size_t)T * D * 2) : NULL;
  if (x16 && (const void *)x16 != xa && (gk_rows_bf16(x, T, D, ldx, x16) || GK_LAUNCHED("moe x bf16"))) return -1;
  if (x16) {
    gk_launch(moe_gather16_k, n, 256, 0, (const uint4 *)x16, perm, idx, off, (const int *)tab, k, D, (uint4 *)xs, erow);
  } else if (v4)
    gk_launch(moe_gather_bf16_k<true>, n, 256, 0, x, ldx, perm, idx, off, (const int *)tab, k, D, xs, erow);
  else
    gk_launch(moe_gather_bf16_k<false>, n, 256, 0, x, ldx, perm, idx, off, (const int *)tab, k, D, xs, erow);
  if (GK_LAUNCHED("moe gather bf16")) return -1;
  const void *const *dp = (const void *const *)(tab + ptr0);
  if (!quant) {
    for (int b = 0; b < nb; b++) {
      const int i0 = bst[b], m = bst[b + 1] - i0, c = hoff[ord[i0] + 1] - hoff[ord[i0]];
      if (gemm_bf16_batched(dp + 2 * i0, I, D, dp + 2 * nu + 2 * i0, c, (void *const *)(dp + 4 * nu + 2 * i0), 2 * m))
        return -1;
    }
  } else {
    for (int e = 0; e < E; e++) {
      const int c = hoff[e + 1] - hoff[e];
      if (!c) continue;
      const gpu_mat *W = h_exp + (size_t)e * 3;
      const void *xe = xs + (size_t)poff[e] * D;
      if (gemm_bf16(as_bf16(&W[0], 0, slot), I, D, xe, c, gb + (size_t)poff[e] * I * es) ||
          gemm_bf16(as_bf16(&W[1], 1, slot), I, D, xe, c, ub + (size_t)poff[e] * I * es))
        return -1;
    }
  }
  if (GK_LAUNCHED("moe gate+up gemm")) return -1;
  /* padding rows (bucket members below the bucket's count) hold stale
   * inputs: GEMM rows are independent, and erow never points at them */
  const size_t ne = (size_t)rows * I;
  if (o16) swiglu_bf16((const uint16_t *)g, (const uint16_t *)u, ne, limit, hb);
  else swiglu_bf16((const float *)g, (const float *)u, ne, limit, hb);
  if (GK_LAUNCHED("moe swiglu bf16")) return -1;
  if (!quant) {
    for (int b = 0; b < nb; b++) {
      const int i0 = bst[b], m = bst[b + 1] - i0, c = hoff[ord[i0] + 1] - hoff[ord[i0]];
      if (gemm_bf16_batched(dp + 6 * nu + i0, D, I, dp + 7 * nu + i0, c, (void *const *)(dp + 8 * nu + i0), m)) return -1;
    }
  } else {
    for (int e = 0; e < E; e++) {
      const int c = hoff[e + 1] - hoff[e];
      if (c && gemm_bf16(as_bf16(&h_exp[(size_t)e * 3 + 2], 2, slot), D, I, hb + (size_t)poff[e] * I, c,
                         eob + (size_t)poff[e] * D * es))
        return -1;
    }
  }
  return GK_LAUNCHED("moe down gemm");
#endif
}

/* Device runtime (errors, memory, device info) and the matrix products:
 * an in-house GEMV for small token counts (decode), cuBLAS for large ones
 * (prefill), and the routed-expert GEMV that reads expert ids on the device. */
#include "gk_common.cuh"
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static char g_err[512];
#if GK_HAVE_BLAS
static cublasHandle_t g_blas;
static int g_blas_ok;
#endif

int gk_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  va_end(ap);
  return -1;
}
extern "C" const char *gk_error(void) { return g_err; }

extern "C" int gk_init(gk_devinfo *info) {
  memset(info, 0, sizeof *info);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return gk_fail("no GPU device: %s", cudaGetErrorString(e));
  if (n <= 0) return gk_fail("no GPU device visible");
  info->count = n;
  GK_TRY(cudaSetDevice(0));
  cudaDeviceProp p;
  GK_TRY(cudaGetDeviceProperties(&p, 0));
  snprintf(info->name, sizeof info->name, "%.127s", p.name);
  info->cc_major = p.major;
  info->cc_minor = p.minor;
  info->sm_count = p.multiProcessorCount;
#if GK_HIP
  info->hip = 1;
  snprintf(info->arch, sizeof info->arch, "%s", p.gcnArchName);
#else
  snprintf(info->arch, sizeof info->arch, "sm_%d%d", p.major, p.minor);
#endif
  GK_TRY(cudaMemGetInfo(&info->mem_free, &info->mem_total));
#if GK_HAVE_BLAS
  if (!g_blas_ok) {
    if (cublasCreate(&g_blas) != CUBLAS_STATUS_SUCCESS) return gk_fail("cuBLAS initialisation failed");
#if !GK_HIP
    cublasSetStream(g_blas, cudaStreamPerThread); /* the stream every kernel uses (--default-stream per-thread) */
#endif
    g_blas_ok = 1;
  }
#endif
  return 0;
}

extern "C" void *gk_malloc(size_t n) {
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, n ? n : 1);
  if (e != cudaSuccess) {
    gk_fail("device allocation of %zu bytes failed: %s", n, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}
extern "C" void gk_free(void *p) { if (p) cudaFree(p); }
extern "C" int gk_h2d(void *d, const void *h, size_t n) { GK_TRY(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); return 0; }
extern "C" int gk_d2h(void *h, const void *d, size_t n) { GK_TRY(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); return 0; }
extern "C" int gk_d2d(void *d, const void *s, size_t n) { GK_TRY(cudaMemcpy(d, s, n, cudaMemcpyDeviceToDevice)); return 0; }
extern "C" int gk_memset(void *d, int v, size_t n) { GK_TRY(cudaMemset(d, v, n)); return 0; }
extern "C" int gk_sync(void) { GK_TRY(cudaDeviceSynchronize()); GK_TRY(cudaGetLastError()); return 0; }
extern "C" int gk_check(const char *what) {
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? 0 : gk_fail("%s: %s", what, cudaGetErrorString(e));
}

/* grow-only scratch buffers (the backend serialises forwards) */
typedef struct { void *p; size_t n; } gk_scratch;
static unsigned g_gen;
extern "C" unsigned gk_scratch_gen(void) { return g_gen; }
static void *scratch(gk_scratch *s, size_t n) {
  if (s->n >= n) return s->p;
  g_gen++; /* captured graphs that used the old buffer are stale */
  gk_free(s->p);
  s->p = gk_malloc(n);
  s->n = s->p ? n : 0;
  return s->p;
}
static gk_scratch g_part;
#if GK_HAVE_BLAS
static gk_scratch g_xb, g_wb;
#endif

static int g_gemm_min = -1;
extern "C" int gk_gemm_min(void) {
  if (g_gemm_min < 0) {
    const char *e = getenv("GLM53_GPU_GEMM_MIN");
    g_gemm_min = e && atoi(e) > 0 ? atoi(e) : 32;
  }
  return g_gemm_min;
}
extern "C" void gk_set_gemm_min(int n) { g_gemm_min = n > 0 ? n : -1; }

/* ---------------- GEMV ----------------
 * Three kernels: v3 (the default, further below), and the two before it,
 * kept selectable (gk_set_gemv_version / GLM53_GPU_GEMV) as fallbacks and
 * for comparison; v1 and v2 give each other's bits, v3 its own.
 * v2 (issue 5): one warp owns RW rows (RW = rows per warp, by format) and reads them in
 * 16-byte-or-smaller chunks of 8 elements per lane, U chunks per row in
 * flight per round; x is read as float4 when aligned and reused for the RW
 * rows (the x traffic, 4 B per weight element, is what limited the one-row
 * kernel: 8 scalar loads per weight chunk). Per (row, token) the FMAs run in
 * plain j order whatever RW, U or the token count, then one fixed warp
 * reduction: every launch shape gives a (row, token) the same bits. */
#define NT 8         /* tokens per block */
#define WARPS 8      /* warps per block */

/* a lane's 8-element chunk of a row, loaded raw (converted at use) */
template <int FMT> struct wchunk;
template <> struct wchunk<GF_F32> { float4 a, b; };
template <> struct wchunk<GF_BF16> { uint4 a; };
template <> struct wchunk<GF_Q8> { uint2 a; float s; };
template <> struct wchunk<GF_Q4> { uint32_t a; float s; };

/* rows per warp and chunks in flight per row, per format (more for the
 * narrow formats, whose chunks are small) */
template <int FMT> struct gemv_shape { enum { RW = FMT == GF_F32 ? 1 : FMT == GF_BF16 ? 2 : 4, U = FMT == GF_Q4 ? 8 : 4 }; };

/* wc_load / wc_expand per format (overloads: the chunk types differ); the
 * values are those wl8 gives */
__device__ __forceinline__ void wc_load(const gpu_mat &W, size_t r, int j, wchunk<GF_F32> &c) {
  const float4 *p = (const float4 *)((const float *)W.d + r * (size_t)W.cols + j);
  c.a = __ldg(p);
  c.b = __ldg(p + 1);
}
__device__ __forceinline__ void wc_load(const gpu_mat &W, size_t r, int j, wchunk<GF_BF16> &c) {
  c.a = __ldg((const uint4 *)((const uint16_t *)W.d + r * (size_t)W.cols + j));
}
__device__ __forceinline__ void wc_load(const gpu_mat &W, size_t r, int j, wchunk<GF_Q8> &c) {
  c.a = __ldg((const uint2 *)((const int8_t *)W.d + r * (size_t)W.cols + j));
  c.s = gk_scale(W, r, j);
}
__device__ __forceinline__ void wc_load(const gpu_mat &W, size_t r, int j, wchunk<GF_Q4> &c) {
  c.a = __ldg((const uint32_t *)((const uint8_t *)W.d + ((r * (size_t)W.cols + j) >> 1)));
  c.s = gk_scale(W, r, j);
}
__device__ __forceinline__ void wc_expand(const wchunk<GF_F32> &c, float *v) {
  v[0] = c.a.x; v[1] = c.a.y; v[2] = c.a.z; v[3] = c.a.w; v[4] = c.b.x; v[5] = c.b.y; v[6] = c.b.z; v[7] = c.b.w;
}
__device__ __forceinline__ void wc_expand(const wchunk<GF_BF16> &c, float *v) {
  uint32_t w[4] = {c.a.x, c.a.y, c.a.z, c.a.w};
#pragma unroll
  for (int q = 0; q < 4; q++) { v[2 * q] = __uint_as_float(w[q] << 16); v[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u); }
}
__device__ __forceinline__ void wc_expand(const wchunk<GF_Q8> &c, float *v) {
  uint32_t w[2] = {c.a.x, c.a.y};
#pragma unroll
  for (int q = 0; q < 8; q++) v[q] = (float)(int8_t)((w[q >> 2] >> (8 * (q & 3))) & 0xff) * c.s;
}
__device__ __forceinline__ void wc_expand(const wchunk<GF_Q4> &c, float *v) {
#pragma unroll
  for (int q = 0; q < 8; q++) v[q] = (float)((int)((c.a >> (4 * q)) & 15) - 8) * c.s;
}
template <bool XV> __device__ __forceinline__ void x8(const float *xp, float *v) {
  if (XV) {
    float4 a = __ldg((const float4 *)xp), b = __ldg((const float4 *)xp + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else {
#pragma unroll
    for (int q = 0; q < 8; q++) v[q] = __ldg(xp + q);
  }
}

/* rows row0 .. row0+RW-1 (those < W.rows) over columns [c0, c1) (multiples
 * of 8), tokens 0..nt-1 of x: acc[r][t], reduced across the warp */
template <int FMT, bool XV, int RW>
__device__ __forceinline__ void gemv_rows_vec(const gpu_mat &W, int row0, const float *x, int nt, int ldx, int c0, int c1,
                                              float (*acc)[NT]) {
  constexpr int U = gemv_shape<FMT>::U;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < RW; r++)
#pragma unroll
    for (int t = 0; t < NT; t++) acc[r][t] = 0.f;
  for (int j = c0 + lane * 8; j < c1; j += U * 256) {
    wchunk<FMT> w[RW][U];
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
      for (int u = 0; u < U; u++)
        if (row0 + r < W.rows && j + u * 256 < c1) wc_load(W, row0 + r, j + u * 256, w[r][u]);
#pragma unroll
    for (int t = 0; t < NT; t++) {
      if (t >= nt) break;
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (j + u * 256 >= c1) break;
        float xv[8];
        x8<XV>(x + (size_t)t * ldx + j + u * 256, xv);
#pragma unroll
        for (int r = 0; r < RW; r++) {
          float wv[8];
          wc_expand(w[r][u], wv);
          float a = acc[r][t];
#pragma unroll
          for (int q = 0; q < 8; q++) a = fmaf(wv[q], xv[q], a);
          acc[r][t] = a;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < RW; r++)
#pragma unroll
    for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
}

/* any shape (cols or group not a multiple of 8): one element per lane */
template <int FMT>
__device__ __forceinline__ void gemv_row_scalar(const gpu_mat &W, int row, const float *x, int nt, int ldx, int c0, int c1,
                                                float *acc) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t] = 0.f;
  for (int j = c0 + lane; j < c1; j += 32) {
    float w = wl1<FMT>(W, row, j);
#pragma unroll
    for (int t = 0; t < NT; t++) {
      if (t >= nt) break;
      acc[t] = fmaf(w, __ldg(x + (size_t)t * ldx + j), acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t] = warp_sum(acc[t]);
}

/* MODE 0: scalar; 1: vector weights, scalar x; 2: vector weights and x */
template <int FMT, int MODE, int RW>
__device__ __forceinline__ void gemv_rows(const gpu_mat &W, int row0, const float *x, int nt, int ldx, int c0, int c1,
                                          float (*acc)[NT]) {
  if (MODE == 0) {
#pragma unroll
    for (int r = 0; r < RW; r++) {
      if (row0 + r < W.rows) gemv_row_scalar<FMT>(W, row0 + r, x, nt, ldx, c0, c1, acc[r]);
    }
  } else {
    gemv_rows_vec<FMT, MODE == 2, RW>(W, row0, x, nt, ldx, c0, c1, acc);
  }
}

template <int FMT, int MODE> struct gemv_rw { enum { RW = MODE == 0 ? 1 : (int)gemv_shape<FMT>::RW }; };

/* grid: (rows/(WARPS*RW), ceil(n/NT), nsplit). part != NULL: split-K
 * partials part[z][n][rows], reduced in split order by gemv_reduce. */
template <int FMT, int MODE>
__global__ void __launch_bounds__(256) gemv_k(gpu_mat W, const float *x, int n, int ldx, float *y, int ldy, int clen,
                                              float *part) {
  constexpr int RW = gemv_rw<FMT, MODE>::RW;
  int row0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * RW;
  if (row0 >= W.rows) return;
  int t0 = blockIdx.y * NT, nt = min(NT, n - t0);
  int c0 = blockIdx.z * clen, c1 = min(W.cols, c0 + clen);
  float acc[RW][NT];
  gemv_rows<FMT, MODE, RW>(W, row0, x + (size_t)t0 * ldx, nt, ldx, c0, c1, acc);
  if ((threadIdx.x & 31) == 0)
#pragma unroll
    for (int r = 0; r < RW; r++) {
      if (row0 + r >= W.rows) break;
      for (int t = 0; t < nt; t++) {
        if (part) part[((size_t)blockIdx.z * n + t0 + t) * W.rows + row0 + r] = acc[r][t];
        else y[(size_t)(t0 + t) * ldy + row0 + r] = acc[r][t];
      }
    }
}

__global__ void gemv_reduce(const float *part, int nsplit, int n, int rows, float *y, int ldy) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)n * rows) return;
  int t = (int)(i / rows), r = (int)(i % rows);
  float s = 0;
  for (int z = 0; z < nsplit; z++) s += part[((size_t)z * n + t) * rows + r];
  y[(size_t)t * ldy + r] = s;
}

/* pair p = blockIdx.y; only >= 0: pairs routed elsewhere are skipped */
template <int FMT, int MODE>
__global__ void __launch_bounds__(256) gemv_exp_k(const gpu_mat *wset, int which, int wstride, const int *idx, int k,
                                                  int xpt, const float *x, int ldx, float *y, int ldy, int rows, int only) {
  constexpr int RW = gemv_rw<FMT, MODE>::RW;
  int p = blockIdx.y;
  int row0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * RW;
  if (row0 >= rows) return;
  int e = idx ? idx[p] : p % k;
  if (only >= 0 && e >= 0 && e != only) return;
  float *yo = y + (size_t)p * ldy;
  if (e < 0) {
    if ((threadIdx.x & 31) == 0)
      for (int r = 0; r < RW && row0 + r < rows; r++) yo[row0 + r] = 0.f;
    return;
  }
  gpu_mat W = wset[(size_t)e * wstride + which];
  const float *xr = x + (size_t)(xpt ? p / k : p) * ldx;
  float acc[RW][NT];
  gemv_rows<FMT, MODE, RW>(W, row0, xr, 1, ldx, 0, W.cols, acc);
  if ((threadIdx.x & 31) == 0)
    for (int r = 0; r < RW && row0 + r < rows; r++) yo[row0 + r] = acc[r][0];
}

/* v1: one row per warp, scalar x loads (GLM53_GPU_GEMV=1); the same
 * per-(row, token) FMA order as v2. */
template <int FMT, bool VEC>
__device__ __forceinline__ void gemv1_row(const gpu_mat &W, int row, const float *x, int nt, int ldx, int c0, int c1,
                                         float *acc) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t] = 0.f;
  if (VEC) {
    /* four 16-byte weight loads in flight per lane before their FMAs; the
     * per-token order of the FMAs is the plain j order either way */
    int j = c0 + lane * 8;
    for (; j + 3 * 256 < c1; j += 4 * 256) {
      float w[4][8];
#pragma unroll
      for (int u = 0; u < 4; u++) wl8<FMT>(W, row, j + u * 256, w[u]);
#pragma unroll
      for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        float a = acc[t];
#pragma unroll
        for (int u = 0; u < 4; u++) {
          const float *xp = x + (size_t)t * ldx + j + u * 256;
#pragma unroll
          for (int q = 0; q < 8; q++) a = fmaf(w[u][q], __ldg(xp + q), a);
        }
        acc[t] = a;
      }
    }
    for (; j < c1; j += 256) {
      float w[8];
      wl8<FMT>(W, row, j, w);
#pragma unroll
      for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        const float *xp = x + (size_t)t * ldx + j;
        float a = acc[t];
#pragma unroll
        for (int q = 0; q < 8; q++) a = fmaf(w[q], __ldg(xp + q), a);
        acc[t] = a;
      }
    }
  } else {
    for (int j = c0 + lane; j < c1; j += 32) {
      float w = wl1<FMT>(W, row, j);
#pragma unroll
      for (int t = 0; t < NT; t++) {
        if (t >= nt) break;
        acc[t] = fmaf(w, __ldg(x + (size_t)t * ldx + j), acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; t++) acc[t] = warp_sum(acc[t]);
}

/* grid: (rows/WARPS, ceil(n/NT), nsplit). part != NULL: split-K partials
 * part[z][n][rows], reduced in split order by gemv_reduce. */
template <int FMT, bool VEC>
__global__ void __launch_bounds__(256) gemv1_k(gpu_mat W, const float *x, int n, int ldx, float *y, int ldy, int clen,
                                              float *part) {
  int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (row >= W.rows) return;
  int t0 = blockIdx.y * NT, nt = min(NT, n - t0);
  int c0 = blockIdx.z * clen, c1 = min(W.cols, c0 + clen);
  float acc[NT];
  gemv1_row<FMT, VEC>(W, row, x + (size_t)t0 * ldx, nt, ldx, c0, c1, acc);
  if ((threadIdx.x & 31) == 0)
    for (int t = 0; t < nt; t++) {
      if (part) part[((size_t)blockIdx.z * n + t0 + t) * W.rows + row] = acc[t];
      else y[(size_t)(t0 + t) * ldy + row] = acc[t];
    }
}

template <int FMT, bool VEC>
__global__ void __launch_bounds__(256) gemv1_exp_k(const gpu_mat *wset, int which, int wstride, const int *idx, int k,
                                                  int xpt, const float *x, int ldx, float *y, int ldy, int rows, int only) {
  int p = blockIdx.y;
  int row = blockIdx.x * WARPS + (threadIdx.x >> 5);
  if (row >= rows) return;
  int e = idx ? idx[p] : p % k;
  if (only >= 0 && e >= 0 && e != only) return;
  float *yo = y + (size_t)p * ldy;
  if (e < 0) {
    if ((threadIdx.x & 31) == 0) yo[row] = 0.f;
    return;
  }
  gpu_mat W = wset[(size_t)e * wstride + which];
  const float *xr = x + (size_t)(xpt ? p / k : p) * ldx;
  float acc[NT];
  gemv1_row<FMT, VEC>(W, row, xr, 1, ldx, 0, W.cols, acc);
  if ((threadIdx.x & 31) == 0) yo[row] = acc[0];
}

template <int F> struct gk_fmt_tag {};

/* ---------------- GEMV v3 (the default) ----------------
 * Made to stream the weights at the memory rate at batch 1.
 * - Every lane loads whole 16-byte chunks of a row (f32 4, bf16 8, Q8 16, Q4
 *   32 elements); a chunk of Q8/Q4 lies inside one scale group (group a
 *   multiple of the chunk), so its scale is one 2-byte load and is applied
 *   once per chunk: per (row, token) g = sum of (q * x) over the chunk in
 *   element order (fmaf), then acc = fmaf(scale, g, acc). bf16/f32: acc =
 *   fmaf(w, x, acc) in element order.
 * - Q4 nibbles become floats with exponent tricks, no int->float converts:
 *   (n << s) | bits(2^(23-s)) is the float 2^(23-s) + n, minus 2^(23-s)+8
 *   gives n - 8 exactly (one LOP3 + one FADD per weight); Q8 bytes likewise
 *   through PRMT (0x4B00_00xx = 2^23 + (q + 128)).
 * - A warp owns RW rows and reads the fp32 x chunk once (float4) for all of
 *   them; NTK tokens (1, 2, 4 or 8, from n) per block, all NTK computed
 *   (x rows past n repeat the last one) so that every x load issues early.
 * - Load schedule (gv_cfg / gv_pf): the next round of chunks is loaded
 *   before the FMAs of the current one, except bf16 at 1-2 tokens (more
 *   chunks per round and more warps per SM measured faster there).
 * - Split-K: the chunks of a row are cut into S = wk * ns slices, wk warps of
 *   a block (reduced through shared memory, slice order) times ns blocks
 *   (partials reduced by gemv_reduce, slice order). S comes from the matrix
 *   shape only (gv_plan), so a (row, token) result has the same bits
 *   whatever n, the tokens or pairs sharing the launch, RW, NTK or the x
 *   alignment: lane l always takes chunks l, l+32, ... of its slice.
 * - Shapes the chunked path cannot take (cols not a multiple of the chunk,
 *   a group not a multiple of it, a misaligned base) run a per-element loop
 *   (wl1 order) in the same kernel: checked per matrix on the device, so the
 *   routed-expert launch needs no host-side knowledge of the group. */
template <int FMT> struct gv_fmt;
template <> struct gv_fmt<GF_F32> { enum { E = 4, EW = 4, RWP = 2 }; };
template <> struct gv_fmt<GF_BF16> { enum { E = 8, EW = 8, RWP = 2 }; };
template <> struct gv_fmt<GF_Q8> { enum { E = 16, EW = 8, RWP = 4 }; };
template <> struct gv_fmt<GF_Q4> { enum { E = 32, EW = 8, RWP = 4 }; };
/* rows per warp (RW) and chunks per row per load round (U), by format,
 * tokens per block and load schedule: PF (the default) loads round i+1
 * before the FMAs of round i; plain (bench: gk_set_gemv_version(4)) loads
 * and then computes each round. Registers stay at or below ~128 so that two
 * blocks fit an SM. None of this changes the bits. */
template <int FMT, int NTK, bool PF> struct gv_cfg {
  enum {
    RW = FMT >= GF_Q8 ? (NTK <= 2 ? 4 : 2) : 2,
    U = PF ? (FMT >= GF_Q8 ? 1 : (NTK <= 2 ? 2 : 1)) : FMT >= GF_Q8 ? (NTK == 1 ? 2 : 1) : (NTK <= 2 ? 4 : 2)
  };
};

__device__ __forceinline__ void gv_cvt(const uint4 &w, int k, float *v, gk_fmt_tag<GF_F32>) {
  (void)k;
  v[0] = __uint_as_float(w.x); v[1] = __uint_as_float(w.y); v[2] = __uint_as_float(w.z); v[3] = __uint_as_float(w.w);
}
__device__ __forceinline__ void gv_cvt(const uint4 &w, int k, float *v, gk_fmt_tag<GF_BF16>) {
  (void)k;
  const uint32_t a[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int q = 0; q < 4; q++) { v[2 * q] = __uint_as_float(a[q] << 16); v[2 * q + 1] = __uint_as_float(a[q] & 0xffff0000u); }
}
/* bytes 8k..8k+7 of the chunk */
__device__ __forceinline__ void gv_cvt(const uint4 &w, int k, float *v, gk_fmt_tag<GF_Q8>) {
  const uint32_t a[2] = {k ? w.z : w.x, k ? w.w : w.y};
#pragma unroll
  for (int h = 0; h < 2; h++) {
    uint32_t u = a[h] ^ 0x80808080u; /* offset binary q + 128 */
#pragma unroll
    for (int i = 0; i < 4; i++) v[4 * h + i] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7650 | i)) - 8388736.0f;
  }
}
/* word k (nibbles 8k..8k+7) of the chunk */
__device__ __forceinline__ void gv_cvt(const uint4 &w, int k, float *v, gk_fmt_tag<GF_Q4>) {
  const uint32_t a = k == 0 ? w.x : k == 1 ? w.y : k == 2 ? w.z : w.w, h = a >> 12;
  v[0] = __uint_as_float((a & 0xFu) | 0x4B000000u) - 8388616.0f;  /* 2^23 + n - (2^23 + 8) */
  v[1] = __uint_as_float((a & 0xF0u) | 0x49000000u) - 524296.0f;  /* 2^19 */
  v[2] = __uint_as_float((a & 0xF00u) | 0x47000000u) - 32776.0f;  /* 2^15 */
  v[3] = __uint_as_float((a & 0xF000u) | 0x45000000u) - 2056.0f;  /* 2^11 */
  v[4] = __uint_as_float((a & 0xF0000u) | 0x43000000u) - 136.0f;  /* 2^7 */
  v[5] = __uint_as_float((h & 0xF00u) | 0x47000000u) - 32776.0f;
  v[6] = __uint_as_float((h & 0xF000u) | 0x45000000u) - 2056.0f;
  v[7] = __uint_as_float((h & 0xF0000u) | 0x43000000u) - 136.0f;
}
__device__ __forceinline__ float gv_scale(const gpu_mat &W, uint16_t s) {
  return W.scale_bf16 ? __uint_as_float((uint32_t)s << 16) : __half2float(__ushort_as_half(s));
}
template <bool XV, int EW> __device__ __forceinline__ void gv_x(const float *p, float *v) {
  if (XV) {
#pragma unroll
    for (int i = 0; i < EW / 4; i++) {
      float4 a = __ldg((const float4 *)p + i);
      v[4 * i] = a.x; v[4 * i + 1] = a.y; v[4 * i + 2] = a.z; v[4 * i + 3] = a.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < EW; i++) v[i] = __ldg(p + i);
  }
}

/* can matrix W take the chunked path (same answer on host and device) */
template <int FMT> __host__ __device__ __forceinline__ bool gv_fast(const gpu_mat &W) {
  constexpr int E = gv_fmt<FMT>::E;
  return W.cols % E == 0 && ((uintptr_t)W.d & 15) == 0 && (FMT <= GF_BF16 || (W.group > 0 && W.group % E == 0));
}

/* U chunks (c, c+32, ...; past ce: a valid duplicate, not used) of RW rows */
template <int FMT, int RW, int U>
__device__ __forceinline__ void gv_load(const gpu_mat &W, const int *rr, size_t rowbytes, int gsh, int ng, int c, int ce,
                                        uint4 (*w)[RW], float (*s)[RW]) {
  constexpr int E = gv_fmt<FMT>::E;
  constexpr bool SC = FMT >= GF_Q8;
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int cu = min(c + 32 * u, ce - 1);
    const int gi = SC ? (gsh >= 0 ? (cu * E) >> gsh : (cu * E) / W.group) : 0;
#pragma unroll
    for (int r = 0; r < RW; r++) {
      w[u][r] = __ldg((const uint4 *)((const char *)W.d + (size_t)rr[r] * rowbytes) + cu);
      if (SC) s[u][r] = gv_scale(W, __ldg((const uint16_t *)W.s + (size_t)rr[r] * ng + gi));
    }
  }
}

/* rows row0 .. row0+RW-1 (clamped to the last row; the caller drops the
 * copies) over chunks [cb, ce) of the split, tokens 0..nt-1 of x (the
 * chunked path computes all NTK, tokens past nt repeat token nt-1, so that
 * every x load can be issued early; the caller drops them); acc[r][t]
 * summed over the warp */
template <int FMT, int NTK, bool XV, bool PF>
__device__ __forceinline__ void gv_rows(const gpu_mat &W, int row0, const float *x, int nt, int ldx, int cb, int ce,
                                        float (*acc)[NTK]) {
  constexpr int E = gv_fmt<FMT>::E, EW = gv_fmt<FMT>::EW, KW = E / EW;
  constexpr int RW = gv_cfg<FMT, NTK, PF>::RW, U = gv_cfg<FMT, NTK, PF>::U;
  constexpr bool SC = FMT >= GF_Q8;
  constexpr size_t ES = FMT == GF_F32 ? 4 : FMT == GF_BF16 ? 2 : 1; /* Q4: bytes = elements / 2 below */
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < RW; r++)
#pragma unroll
    for (int t = 0; t < NTK; t++) acc[r][t] = 0.f;
  int rr[RW];
#pragma unroll
  for (int r = 0; r < RW; r++) rr[r] = min(row0 + r, W.rows - 1);
  if (gv_fast<FMT>(W)) {
    const size_t rowbytes = FMT == GF_Q4 ? (size_t)W.cols / 2 : (size_t)W.cols * ES;
    int gsh = -1, ng = 0;
    if (SC) {
      gsh = (W.group & (W.group - 1)) == 0 ? __ffs(W.group) - 1 : -1;
      ng = W.cols / W.group;
    }
    const float *xt[NTK];
#pragma unroll
    for (int t = 0; t < NTK; t++) xt[t] = x + (size_t)min(t, nt - 1) * ldx;
    uint4 wn[U][RW];
    float sn[U][RW];
    int c = cb + lane;
    if (PF && c < ce) gv_load<FMT, RW, U>(W, rr, rowbytes, gsh, ng, c, ce, wn, sn);
    for (; c < ce; c += 32 * U) {
      uint4 w[U][RW];
      float s[U][RW];
      if (PF) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
          for (int r = 0; r < RW; r++) { w[u][r] = wn[u][r]; s[u][r] = sn[u][r]; }
        if (c + 32 * U < ce) gv_load<FMT, RW, U>(W, rr, rowbytes, gsh, ng, c + 32 * U, ce, wn, sn);
      } else {
        gv_load<FMT, RW, U>(W, rr, rowbytes, gsh, ng, c, ce, w, s);
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (c + 32 * u >= ce) break;
        const int j = (c + 32 * u) * E;
        float g[SC ? RW : 1][SC ? NTK : 1];
        if (SC) {
#pragma unroll
          for (int r = 0; r < RW; r++)
#pragma unroll
            for (int t = 0; t < NTK; t++) g[SC ? r : 0][SC ? t : 0] = 0.f;
        }
#pragma unroll
        for (int k = 0; k < KW; k++) {
          if (NTK == 1) { /* x once, then row by row: 8 converted weights live */
            float xv[EW];
            gv_x<XV, EW>(xt[0] + j + k * EW, xv);
#pragma unroll
            for (int r = 0; r < RW; r++) {
              float wf[EW];
              gv_cvt(w[u][r], k, wf, gk_fmt_tag<FMT>());
              float a = SC ? g[SC ? r : 0][0] : acc[r][0];
#pragma unroll
              for (int q = 0; q < EW; q++) a = fmaf(wf[q], xv[q], a);
              if (SC) g[SC ? r : 0][0] = a;
              else acc[r][0] = a;
            }
          } else { /* converted once for all tokens */
            float wf[RW][EW];
#pragma unroll
            for (int r = 0; r < RW; r++) gv_cvt(w[u][r], k, wf[r], gk_fmt_tag<FMT>());
#pragma unroll
            for (int t = 0; t < NTK; t++) {
              float xv[EW];
              gv_x<XV, EW>(xt[t] + j + k * EW, xv);
#pragma unroll
              for (int r = 0; r < RW; r++) {
                float a = SC ? g[SC ? r : 0][SC ? t : 0] : acc[r][t];
#pragma unroll
                for (int q = 0; q < EW; q++) a = fmaf(wf[r][q], xv[q], a);
                if (SC) g[SC ? r : 0][SC ? t : 0] = a;
                else acc[r][t] = a;
              }
            }
          }
        }
        if (SC) {
#pragma unroll
          for (int r = 0; r < RW; r++)
#pragma unroll
            for (int t = 0; t < NTK; t++) acc[r][t] = fmaf(s[u][r], g[SC ? r : 0][SC ? t : 0], acc[r][t]);
        }
      }
    }
  } else {
    const int j1 = min(W.cols, ce * E);
#pragma unroll
    for (int r = 0; r < RW; r++)
      for (int j = cb * E + lane; j < j1; j += 32) {
        const float wv = wl1<FMT>(W, rr[r], j);
#pragma unroll
        for (int t = 0; t < NTK; t++) {
          if (t >= nt) break;
          acc[r][t] = fmaf(wv, __ldg(x + (size_t)t * ldx + j), acc[r][t]);
        }
      }
  }
#pragma unroll
  for (int r = 0; r < RW; r++)
#pragma unroll
    for (int t = 0; t < NTK; t++) acc[r][t] = warp_sum(acc[r][t]);
}

/* the wk warps of a row group add their slices in slice order (shared
 * memory); returns false for the warps that have nothing to write */
template <int RW, int NTK>
__device__ __forceinline__ bool gv_block_reduce(float (*acc)[NTK], int wk, int kw, int wr, float *red) {
  if (wk == 1) return true;
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0)
#pragma unroll
    for (int r = 0; r < RW; r++)
#pragma unroll
      for (int t = 0; t < NTK; t++) red[(warp * RW + r) * NTK + t] = acc[r][t];
  __syncthreads();
  if (kw) return false;
#pragma unroll
  for (int r = 0; r < RW; r++)
#pragma unroll
    for (int t = 0; t < NTK; t++) {
      float v = red[((wr * wk) * RW + r) * NTK + t];
      for (int i = 1; i < wk; i++) v += red[((wr * wk + i) * RW + r) * NTK + t];
      acc[r][t] = v;
    }
  return true;
}

/* grid: (row blocks * ntg, ns); block b: rows of block b / ntg, tokens of
 * group b % ntg (the blocks reading the same rows run together). Warp w:
 * row group w / wk, slice blockIdx.y * wk + w % wk of sl chunks. */
template <int FMT, int NTK, bool XV, bool PF>
__global__ void __launch_bounds__(256, FMT <= GF_BF16 && NTK == 1 ? 3 : 2) gv_k(gpu_mat W, const float *x, int n, int ldx, float *y, int ldy, int wk,
                                            int sl, int ntg, float *part) {
  constexpr int RW = gv_cfg<FMT, NTK, PF>::RW, E = gv_fmt<FMT>::E;
  __shared__ float red[WARPS * RW * NTK];
  const int warp = threadIdx.x >> 5, wr = warp / wk, kw = warp % wk;
  const int rb = blockIdx.x / ntg, tg = blockIdx.x % ntg;
  const int row0 = (rb * (WARPS / wk) + wr) * RW;
  const int t0 = tg * NTK, nt = min(NTK, n - t0);
  const int cpr = (W.cols + E - 1) / E, cb = min(cpr, (int)(blockIdx.y * wk + kw) * sl), ce = min(cpr, cb + sl);
  float acc[RW][NTK];
  gv_rows<FMT, NTK, XV, PF>(W, row0, x + (size_t)t0 * ldx, nt, ldx, cb, ce, acc);
  if (!gv_block_reduce<RW, NTK>(acc, wk, kw, wr, red) || (threadIdx.x & 31)) return;
#pragma unroll
  for (int r = 0; r < RW; r++) {
    if (row0 + r >= W.rows) break;
#pragma unroll
    for (int t = 0; t < NTK; t++) {
      if (t >= nt) break;
      if (part) part[((size_t)blockIdx.y * n + t0 + t) * W.rows + row0 + r] = acc[r][t];
      else y[(size_t)(t0 + t) * ldy + row0 + r] = acc[r][t];
    }
  }
}

/* pair p = blockIdx.y (one token); rows of block blockIdx.x */
template <int FMT, bool XV, bool PF>
__global__ void __launch_bounds__(256, FMT <= GF_BF16 ? 3 : 2) gv_exp_k(const gpu_mat *wset, int which, int wstride, const int *idx, int k, int xpt,
                                                const float *x, int ldx, float *y, int ldy, int rows, int only, int wk,
                                                int sl) {
  constexpr int RW = gv_cfg<FMT, 1, PF>::RW, E = gv_fmt<FMT>::E;
  __shared__ float red[WARPS * RW];
  const int p = blockIdx.y;
  const int e = idx ? idx[p] : p % k;
  if (only >= 0 && e >= 0 && e != only) return; /* the whole block */
  const int warp = threadIdx.x >> 5, wr = warp / wk, kw = warp % wk;
  const int row0 = (blockIdx.x * (WARPS / wk) + wr) * RW;
  float *yo = y + (size_t)p * ldy;
  float acc[RW][1];
  if (e < 0) {
    if (kw || (threadIdx.x & 31)) return;
    for (int r = 0; r < RW && row0 + r < rows; r++) yo[row0 + r] = 0.f;
    return;
  }
  const gpu_mat W = wset[(size_t)e * wstride + which];
  const int cpr = (W.cols + E - 1) / E, cb = min(cpr, kw * sl), ce = min(cpr, cb + sl);
  gv_rows<FMT, 1, XV, PF>(W, row0, x + (size_t)(xpt ? p / k : p) * ldx, 1, ldx, cb, ce, acc);
  if (!gv_block_reduce<RW, 1>(acc, wk, kw, wr, red) || (threadIdx.x & 31)) return;
#pragma unroll
  for (int r = 0; r < RW; r++) {
    if (row0 + r >= rows) break;
    yo[row0 + r] = acc[r][0];
  }
}

/* kernel choice: 3 (default) the v3 kernel above, 4 the same without the
 * load pipelining (bench; same bits as 3); 1 the one-row kernel
 * (GLM53_GPU_GEMV=1); 2 the rows-per-warp kernel of issue 5
 * (GLM53_GPU_GEMV=2). 1 and 2 give each other's bits, 3/4 their own
 * (docs/gpu.md). */
static int g_gemv_ver = -1;
static int gemv_ver(void) {
  if (g_gemv_ver < 0) {
    const char *e = getenv("GLM53_GPU_GEMV");
    g_gemv_ver = e && atoi(e) >= 1 && atoi(e) <= 4 ? atoi(e) : 3;
  }
  return g_gemv_ver;
}
extern "C" void gk_set_gemv_version(int v) { g_gemv_ver = v >= 1 && v <= 4 ? v : -1; }

static int vec_ok(const gpu_mat *W) {
  return W->cols % 8 == 0 && (W->fmt <= GF_BF16 || W->group % 8 == 0);
}
/* 0 scalar, 1 vector weights, 2 vector weights and x (x 16-byte aligned
 * rows): all three give the same bits */
static int gemv_mode(const gpu_mat *W, const float *x, int ldx) {
  if (!vec_ok(W)) return 0;
  return ((uintptr_t)x % 16 == 0 && ldx % 4 == 0) ? 2 : 1;
}
template <int FMT> static int rows_per_block(int mode) { return WARPS * (mode == 0 ? 1 : (int)gemv_shape<FMT>::RW); }

/* split-K count of the v1/v2 kernels: a function of the shape only */
static int nsplit_for(const gpu_mat *W, int *clen) {
  int ns = 1;
  if (W->rows < 2048 && W->cols >= 2048) {
    ns = W->cols / 1024;
    if (ns > 16) ns = 16;
  }
  int c = (W->cols + ns - 1) / ns;
  c = (c + 7) / 8 * 8;
  *clen = c;
  return (W->cols + c - 1) / c;
}

/* v3 split-K plan: S = wk * ns slices of sl chunks per row, doubling S
 * while the warps (rows / RWP * S) stay under the target and each slice
 * keeps at least one chunk per lane. Depends on (format, rows, cols) and
 * the path only: gk_matmul (maxS 128, target 4096 warps for f32/bf16, 2048
 * for Q8/Q4) or the pair launches (maxS = WARPS, target 2048: the pairs
 * multiply the warps); targets measured on the H200 (docs/gpu.md). */
static int g_gv_target; /* bench override, 0: the defaults above */
extern "C" void gk_set_gemv_split_target(int warps) { g_gv_target = warps > 0 ? warps : 0; }
static int gv_E(int fmt) { return fmt == GF_F32 ? 4 : fmt == GF_BF16 ? 8 : fmt == GF_Q8 ? 16 : 32; }
static void gv_plan(int fmt, int rows, int cols, int maxS, int *wk, int *ns, int *sl) {
  const int cpr = (cols + gv_E(fmt) - 1) / gv_E(fmt), rwp = fmt >= GF_Q8 ? 4 : 2;
  const long rg = (rows + rwp - 1) / rwp;
  const long target = g_gv_target ? g_gv_target : fmt >= GF_Q8 || maxS <= WARPS ? 2048 : 4096;
  int S = 1;
  while (S < maxS && rg * S < target && cpr / (2 * S) >= 32) S *= 2;
  *wk = S < WARPS ? S : WARPS;
  *ns = S / *wk;
  *sl = (cpr + S - 1) / S;
}

template <int FMT, int NTK, bool PF>
static void gv_launch(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy, int wk, int ns, int sl,
                      float *part) {
  constexpr int RW = gv_cfg<FMT, NTK, PF>::RW;
  const int ntg = (n + NTK - 1) / NTK;
  dim3 grid(gk_blocks(W->rows, (WARPS / wk) * RW) * ntg, ns);
  if ((uintptr_t)x % 16 == 0 && ldx % 4 == 0)
    gv_k<FMT, NTK, true, PF><<<grid, 256>>>(*W, x, n, ldx, y, ldy, wk, sl, ntg, part);
  else gv_k<FMT, NTK, false, PF><<<grid, 256>>>(*W, x, n, ldx, y, ldy, wk, sl, ntg, part);
}
/* the load schedule by format and tokens per block, as measured faster on
 * the H200: bf16 at 1-2 tokens plain (U = 4 without the copy: more warps
 * per SM), everything else pipelined. PLAIN: plain everywhere (bench). */
template <int FMT, int NTK, bool PLAIN> struct gv_pf { static constexpr bool v = !PLAIN && !(FMT == GF_BF16 && NTK <= 2); };
template <int FMT, bool PLAIN>
static void gv_launch_n(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy, int wk, int ns, int sl,
                        float *part) {
  if (n == 1) gv_launch<FMT, 1, gv_pf<FMT, 1, PLAIN>::v>(W, x, n, ldx, y, ldy, wk, ns, sl, part);
  else if (n == 2) gv_launch<FMT, 2, gv_pf<FMT, 2, PLAIN>::v>(W, x, n, ldx, y, ldy, wk, ns, sl, part);
  else if (n <= 4) gv_launch<FMT, 4, gv_pf<FMT, 4, PLAIN>::v>(W, x, n, ldx, y, ldy, wk, ns, sl, part);
  else gv_launch<FMT, 8, gv_pf<FMT, 8, PLAIN>::v>(W, x, n, ldx, y, ldy, wk, ns, sl, part);
}

template <int FMT>
static void launch_gemv(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy, int clen, int ns, int wk,
                        int sl, float *part) {
  const int ver = gemv_ver();
  if (ver >= 3) {
    if (ver == 3) gv_launch_n<FMT, false>(W, x, n, ldx, y, ldy, wk, ns, sl, part);
    else gv_launch_n<FMT, true>(W, x, n, ldx, y, ldy, wk, ns, sl, part);
    return;
  }
  int mode = gemv_mode(W, x, ldx);
  if (ver == 1) {
    dim3 g1(gk_blocks(W->rows, WARPS), gk_blocks(n, NT), ns);
    if (mode) gemv1_k<FMT, true><<<g1, 256>>>(*W, x, n, ldx, y, ldy, clen, part);
    else gemv1_k<FMT, false><<<g1, 256>>>(*W, x, n, ldx, y, ldy, clen, part);
    return;
  }
  dim3 grid(gk_blocks(W->rows, rows_per_block<FMT>(mode)), gk_blocks(n, NT), ns);
  if (mode == 2) gemv_k<FMT, 2><<<grid, 256>>>(*W, x, n, ldx, y, ldy, clen, part);
  else if (mode == 1) gemv_k<FMT, 1><<<grid, 256>>>(*W, x, n, ldx, y, ldy, clen, part);
  else gemv_k<FMT, 0><<<grid, 256>>>(*W, x, n, ldx, y, ldy, clen, part);
}

static int gemv(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy) {
  if (W->rows <= 0) return 0;
  int clen = 0, ns, wk = 1, sl = 0;
  if (gemv_ver() >= 3) gv_plan(W->fmt, W->rows, W->cols, 128, &wk, &ns, &sl);
  else ns = nsplit_for(W, &clen);
  float *part = NULL;
  if (ns > 1) {
    part = (float *)scratch(&g_part, (size_t)ns * n * W->rows * sizeof(float));
    if (!part) return -1;
  }
  switch (W->fmt) {
  case GF_F32: launch_gemv<GF_F32>(W, x, n, ldx, y, ldy, clen, ns, wk, sl, part); break;
  case GF_BF16: launch_gemv<GF_BF16>(W, x, n, ldx, y, ldy, clen, ns, wk, sl, part); break;
  case GF_Q8: launch_gemv<GF_Q8>(W, x, n, ldx, y, ldy, clen, ns, wk, sl, part); break;
  case GF_Q4: launch_gemv<GF_Q4>(W, x, n, ldx, y, ldy, clen, ns, wk, sl, part); break;
  default: return gk_fail("matmul: unsupported weight format %d", W->fmt);
  }
  if (ns > 1) gemv_reduce<<<gk_blocks((size_t)n * W->rows, 256), 256>>>(part, ns, n, W->rows, y, ldy);
  return GK_LAUNCHED("gemv");
}

/* ---------------- cuBLAS path ---------------- */
#if GK_HAVE_BLAS
__global__ void to_bf16_k(const float *x, int n, int cols, int ldx, __nv_bfloat16 *o) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)n * cols) return;
  size_t t = i / cols, c = i % cols;
  o[i] = __float2bfloat16(x[t * ldx + c]);
}
__global__ void dequant_bf16_k(gpu_mat W, __nv_bfloat16 *o) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)W.rows * W.cols) return;
  o[i] = __float2bfloat16(wl1_any(W, i / W.cols, (int)(i % W.cols)));
}

static int gemm(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy) {
  const float one = 1.f, zero = 0.f;
  if (W->fmt == GF_F32) {
    if (cublasSgemm(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, W->rows, n, W->cols, &one, (const float *)W->d, W->cols, x, ldx,
                    &zero, y, ldy) != CUBLAS_STATUS_SUCCESS)
      return gk_fail("cublasSgemm failed (%d x %d x %d)", W->rows, n, W->cols);
    return GK_LAUNCHED("sgemm");
  }
  __nv_bfloat16 *xb = (__nv_bfloat16 *)scratch(&g_xb, (size_t)n * W->cols * 2);
  if (!xb) return -1;
  to_bf16_k<<<gk_blocks((size_t)n * W->cols, 256), 256>>>(x, n, W->cols, ldx, xb);
  const void *wb = W->d;
  if (W->fmt != GF_BF16) { /* quantized: dequantize to bf16 once per call (prefill only) */
    __nv_bfloat16 *t = (__nv_bfloat16 *)scratch(&g_wb, (size_t)W->rows * W->cols * 2);
    if (!t) return -1;
    dequant_bf16_k<<<gk_blocks((size_t)W->rows * W->cols, 256), 256>>>(*W, t);
    wb = t;
  }
  if (cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, W->rows, n, W->cols, &one, wb, CUDA_R_16BF, W->cols, xb,
                   CUDA_R_16BF, W->cols, &zero, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
    return gk_fail("cublasGemmEx failed (%d x %d x %d)", W->rows, n, W->cols);
  return GK_LAUNCHED("gemm bf16");
}

#endif

extern "C" int gk_matmul(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy) {
  if (n <= 0) return 0;
#if GK_HAVE_BLAS
  if (n >= gk_gemm_min()) return gemm(W, x, n, ldx, y, ldy);
#endif
  return gemv(W, x, n, ldx, y, ldy);
}

static int batched_gemv(const gpu_mat *d_wset, int which, int wstride, int fmt, int rows, int cols, const int *idx,
                        int npairs, int k, int xpt, const float *x, int ldx, float *y, int ldy, int only) {
  if (npairs <= 0 || rows <= 0) return 0;
  const int ver = gemv_ver(), xv = (uintptr_t)x % 16 == 0 && ldx % 4 == 0;
  int wk = 1, ns = 1, sl = 0;
  if (ver >= 3) gv_plan(fmt, rows, cols, WARPS, &wk, &ns, &sl); /* ns == 1 */
  /* v1/v2: the backend checks group % 8 for quantized weights */
  int mode = cols % 8 ? 0 : xv ? 2 : 1;
#define GK_EXP3(F, PF)                                                                                          \
  {                                                                                                             \
    dim3 g3(gk_blocks(rows, (WARPS / wk) * gv_cfg<F, 1, PF>::RW), npairs);                                       \
    if (xv) gv_exp_k<F, true, PF><<<g3, 256>>>(d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only, wk, sl); \
    else gv_exp_k<F, false, PF><<<g3, 256>>>(d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only, wk, sl); \
  }
#define GK_EXP(F)                                                                                               \
  if (ver == 3) GK_EXP3(F, (gv_pf<F, 1, false>::v))                                                              \
  else if (ver == 4) GK_EXP3(F, false)                                                                          \
  else if (ver == 1) {                                                                                          \
    dim3 g1(gk_blocks(rows, WARPS), npairs);                                                                     \
    if (mode) gemv1_exp_k<F, true><<<g1, 256>>>(d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only); \
    else gemv1_exp_k<F, false><<<g1, 256>>>(d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only);    \
  } else {                                                                                                      \
    dim3 grid(gk_blocks(rows, rows_per_block<F>(mode)), npairs);                                                 \
    if (mode == 2) gemv_exp_k<F, 2><<<grid, 256>>>(d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only); \
    else if (mode == 1) gemv_exp_k<F, 1><<<grid, 256>>>(d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only); \
    else gemv_exp_k<F, 0><<<grid, 256>>>(d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only);        \
  }
  switch (fmt) {
  case GF_F32: GK_EXP(GF_F32); break;
  case GF_BF16: GK_EXP(GF_BF16); break;
  case GF_Q8: GK_EXP(GF_Q8); break;
  case GF_Q4: GK_EXP(GF_Q4); break;
  default: return gk_fail("batched gemv: unsupported weight format %d", fmt);
  }
#undef GK_EXP
#undef GK_EXP3
  return GK_LAUNCHED("batched gemv");
}

extern "C" int gk_matmul_experts(const gpu_mat *d_wset, int which, int fmt, int rows, int cols, const int *idx,
                                 int npairs, int k, int xpt, const float *x, int ldx, float *y, int ldy) {
  return batched_gemv(d_wset, which, 3, fmt, rows, cols, idx, npairs, k, xpt, x, ldx, y, ldy, -1);
}
extern "C" int gk_matmul_expert_only(const gpu_mat *d_wset, int which, int fmt, int rows, int cols, const int *idx,
                                     int npairs, int k, int xpt, const float *x, int ldx, float *y, int ldy, int only) {
  return batched_gemv(d_wset, which, 3, fmt, rows, cols, idx, npairs, k, xpt, x, ldx, y, ldy, only);
}

extern "C" int gk_matmul_heads(const gpu_mat *h_mats, const gpu_mat *d_mats, int H, const float *x, int T, int ldx_head,
                               float *y, int ldy_head) {
  const gpu_mat *W = &h_mats[0];
  if (T < gk_gemm_min()) /* row p = t*H + h of x and y */
    return batched_gemv(d_mats, 0, 1, W->fmt, W->rows, W->cols, NULL, T * H, H, 0, x, ldx_head, y, ldy_head, -1);
  for (int h = 0; h < H; h++)
    if (gk_matmul(&h_mats[h], x + (size_t)h * ldx_head, T, H * ldx_head, y + (size_t)h * ldy_head, H * ldy_head)) return -1;
  return 0;
}

/* ---------------- CUDA graphs ----------------
 * Kernels are built with --default-stream per-thread, so every launch goes
 * to cudaStreamPerThread, which can be captured. */
extern "C" int gk_graphs_supported(void) { return !GK_HIP; }
#if !GK_HIP
extern "C" int gk_capture_begin(void) {
  GK_TRY(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed));
  return 0;
}
extern "C" int gk_capture_end(void **exec) {
  cudaGraph_t g;
  *exec = NULL;
  cudaError_t e = cudaStreamEndCapture(cudaStreamPerThread, &g);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return gk_fail("graph capture: %s", cudaGetErrorString(e));
  }
  cudaGraphExec_t x;
  e = cudaGraphInstantiate(&x, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return gk_fail("graph instantiate: %s", cudaGetErrorString(e));
  }
  *exec = (void *)x;
  return 0;
}
extern "C" int gk_graph_launch(void *exec) {
  GK_TRY(cudaGraphLaunch((cudaGraphExec_t)exec, cudaStreamPerThread));
  return 0;
}
extern "C" void gk_graph_free(void *exec) { if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec); }
#else
extern "C" int gk_capture_begin(void) { return gk_fail("graph replay is not enabled in the HIP build"); }
extern "C" int gk_capture_end(void **exec) { *exec = NULL; return -1; }
extern "C" int gk_graph_launch(void *exec) { return gk_fail("graph replay is not enabled in the HIP build"); }
extern "C" void gk_graph_free(void *exec) {}
#endif

/* ---------------- timing helpers (bench only) ---------------- */
extern "C" void *gk_event_new(void) {
  cudaEvent_t e;
  if (cudaEventCreate(&e) != cudaSuccess) return NULL;
  return (void *)e;
}
extern "C" void gk_event_record(void *e) { cudaEventRecord((cudaEvent_t)e, 0); }
extern "C" float gk_event_ms(void *a, void *b) {
  float ms = 0;
  cudaEventSynchronize((cudaEvent_t)b);
  cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b);
  return ms;
}
extern "C" void gk_event_free(void *e) { if (e) cudaEventDestroy((cudaEvent_t)e); }

__global__ void fill_k(uint32_t *p, size_t n, uint32_t seed) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t h = (uint32_t)i * 2654435761u ^ seed;
  h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
  /* two bf16 in [-1, 1) */
  uint32_t a = 0x3f80u | ((h & 0x7f) << 0), b = 0x3f80u | ((h >> 16) & 0x7f);
  p[i] = ((b ^ ((h >> 8) & 1) << 15) << 16) | (a ^ ((h >> 24) & 1) << 15);
}

extern "C" int gk_fill_random(void *p, size_t bytes, unsigned seed) {
  fill_k<<<gk_blocks(bytes / 4, 256), 256>>>((uint32_t *)p, bytes / 4, seed);
  return GK_LAUNCHED("fill");
}

extern "C" double gk_time_d2d_gbs(size_t bytes, int reps) {
  void *a = gk_malloc(bytes), *b = gk_malloc(bytes);
  if (!a || !b) { gk_free(a); gk_free(b); return -1; }
  fill_k<<<gk_blocks(bytes / 4, 256), 256>>>((uint32_t *)a, bytes / 4, 7);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  void *e0 = gk_event_new(), *e1 = gk_event_new();
  gk_event_record(e0);
  for (int i = 0; i < reps; i++) cudaMemcpy(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice);
  gk_event_record(e1);
  float ms = gk_event_ms(e0, e1);
  gk_event_free(e0); gk_event_free(e1);
  gk_free(a); gk_free(b);
  return 2.0 * bytes * reps / (ms * 1e-3) / 1e9;
}

extern "C" double gk_time_bf16_gemm_tflops(int m, int n, int k, int reps) {
#if !GK_HAVE_BLAS
  return -1;
#else
  void *A = gk_malloc((size_t)m * k * 2), *B = gk_malloc((size_t)k * n * 2), *C = gk_malloc((size_t)m * n * 2);
  if (!A || !B || !C) { gk_free(A); gk_free(B); gk_free(C); return -1; }
  fill_k<<<gk_blocks((size_t)m * k / 2, 256), 256>>>((uint32_t *)A, (size_t)m * k / 2, 1);
  fill_k<<<gk_blocks((size_t)k * n / 2, 256), 256>>>((uint32_t *)B, (size_t)k * n / 2, 2);
  const float one = 1.f, zero = 0.f;
  for (int i = 0; i < 3; i++)
    cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_16BF, k, B, CUDA_R_16BF, k, &zero, C,
                 CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  void *e0 = gk_event_new(), *e1 = gk_event_new();
  gk_event_record(e0);
  for (int i = 0; i < reps; i++)
    cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_16BF, k, B, CUDA_R_16BF, k, &zero, C,
                 CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  gk_event_record(e1);
  float ms = gk_event_ms(e0, e1);
  gk_event_free(e0); gk_event_free(e1);
  gk_free(A); gk_free(B); gk_free(C);
  return 2.0 * m * n * (double)k * reps / (ms * 1e-3) / 1e12;
#endif
}

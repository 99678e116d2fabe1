/* Device runtime (errors, memory, device info) and the matrix products:
 * an in-house GEMV for small token counts (decode), cuBLAS for large ones
 * (prefill), and the routed-expert GEMV that reads expert ids on the device. */
#include "gk_gemv.cuh"
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static char g_err[512];
static void pdl_detect(const cudaDeviceProp *p);
#if GK_HAVE_BLAS
static cublasHandle_t g_blas, g_blas_side; /* the side stream's own (its own workspace) */
static int g_blas_ok;
#endif
#if !GK_HIP
cudaStream_t g_gk_stream = cudaStreamPerThread;
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
  pdl_detect(&p);
  if (gk_mla_flash_wg_detect(p.major, p.minor)) return -1;
  if (gk_set_pdl_early(-1)) return -1;
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
extern "C" void gk_free(void *p) { if (p) (void)cudaFree(p); }
extern "C" int gk_h2d(void *d, const void *h, size_t n) { GK_TRY(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice)); return 0; }
extern "C" int gk_d2h(void *h, const void *d, size_t n) { GK_TRY(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost)); return 0; }
extern "C" int gk_d2d(void *d, const void *s, size_t n) { GK_TRY(cudaMemcpy(d, s, n, cudaMemcpyDeviceToDevice)); return 0; }
extern "C" int gk_memset(void *d, int v, size_t n) { GK_TRY(cudaMemset(d, v, n)); return 0; }
extern "C" int gk_sync(void) { GK_TRY(cudaDeviceSynchronize()); GK_TRY(cudaGetLastError()); return 0; }
static cudaError_t g_launch_err = cudaSuccess; /* first failed gk_launch since the last check */
unsigned long g_gk_launches;
extern "C" unsigned long gk_launch_count(void) { return g_gk_launches; }
void gk_launch_failed(cudaError_t e) {
  if (g_launch_err == cudaSuccess) g_launch_err = e;
}
extern "C" int gk_check(const char *what) {
  gk_kprof_mark(what); /* no-op unless a bench profiles (gk_kprof.cu) */
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = g_launch_err;
  g_launch_err = cudaSuccess;
  return e == cudaSuccess ? 0 : gk_fail("%s: %s", what, cudaGetErrorString(e));
}

/* PDL (gk_common.cuh): capable = device cc >= 9 and the kernels built from
 * sm_90+ PTX (so GK_PDL_WAIT is compiled in); allowed unless
 * GLM53_GPU_PDL=0 or gk_set_pdl(0) (the backend turns it off for forwards
 * that stream experts: their kernels also wait on copy-engine events) */
static int g_pdl_cap = 0, g_pdl_env = -1, g_pdl_allow = 1, g_pdl_forced_off = 0;
int gk_pdl_on(void) {
  if (g_pdl_env < 0) g_pdl_env = !(getenv("GLM53_GPU_PDL") && !strcmp(getenv("GLM53_GPU_PDL"), "0"));
  return g_pdl_cap && g_pdl_env && g_pdl_allow && !g_pdl_forced_off;
}
extern "C" void gk_set_pdl(int on) { g_pdl_allow = on != 0; }
extern "C" void gk_force_pdl_off(int off) { g_pdl_forced_off = off != 0; }
extern "C" int gk_pdl_supported(void) { return g_pdl_cap; }
/* the trigger order of every translation unit's kernels (gk_common.cuh):
 * each registers its flag's setter at static initialisation */
#define PDL_TU_MAX 32
static gk_pdl_order_fn g_pdl_tu[PDL_TU_MAX];
static int g_pdl_ntu, g_pdl_early = 0;
int gk_pdl_order_register(gk_pdl_order_fn f) {
  if (g_pdl_ntu < PDL_TU_MAX) g_pdl_tu[g_pdl_ntu++] = f;
  return g_pdl_ntu;
}
extern "C" int gk_set_pdl_early(int on) {
  if (on < 0) on = getenv("GLM53_GPU_PDL_EARLY") && !strcmp(getenv("GLM53_GPU_PDL_EARLY"), "1");
  g_pdl_early = on != 0;
  for (int i = 0; i < g_pdl_ntu; i++)
    if (g_pdl_tu[i](!g_pdl_early)) return gk_fail("setting the PDL trigger order failed");
  return 0;
}
extern "C" int gk_pdl_early(void) { return g_pdl_early; }
__global__ void pdl_probe_k(void) {}
static void pdl_detect(const cudaDeviceProp *p) {
#if !GK_HIP
  cudaFuncAttributes fa;
  g_pdl_cap = p->major >= 9 && cudaFuncGetAttributes(&fa, pdl_probe_k) == cudaSuccess && fa.ptxVersion >= 90;
  cudaGetLastError();
#else
  (void)p;
#endif
}

/* grow-only scratch buffers (the backend serialises forwards) */
static unsigned g_gen;
extern "C" unsigned gk_scratch_gen(void) { return g_gen; }
void *gk_scratch_grow(gk_scratch *s, size_t n) {
  if (s->n >= n) return s->p;
  gk_free(s->p);
  s->p = gk_malloc(n);
  s->n = s->p ? n : 0;
  return s->p;
}
/* the same for buffers that captured graphs use */
static void *scratch(gk_scratch *s, size_t n) {
  if (s->n < n) g_gen++; /* captured graphs that used the old buffer are stale */
  return gk_scratch_grow(s, n);
}
static gk_scratch g_part, g_cnt;
float *gk_scratch_part(size_t floats) { return (float *)scratch(&g_part, floats * sizeof(float)); }
unsigned *gk_scratch_counters(size_t n) {
  const size_t had = g_cnt.n;
  unsigned *c = (unsigned *)scratch(&g_cnt, n * sizeof(unsigned));
  if (c && g_cnt.n != had && cudaMemset(c, 0, g_cnt.n) != cudaSuccess) { /* new buffer: all zero */
    gk_fail("counter reset failed");
    return NULL;
  }
  return c;
}
#if GK_HAVE_BLAS
/* the bf16 rows of x and the dequantised weight of the cuBLAS products, one
 * pair per stream (the side stream's work runs beside the compute
 * stream's) */
static gk_scratch g_xb[2], g_wb[2];
static gk_scratch g_hb[2]; /* gk_mlp's bf16 SwiGLU output */
#endif

/* ---- second streams: the side stream and a decode graph's branch ----
 * A fork: its stream and two events (the fork point on the compute
 * stream, the end of its work), each made once so that a failed start
 * leaks nothing when retried; open: forked, not joined yet; on: launches
 * go to its stream (gk_launch's g_gk_stream) until back. */
#if !GK_HIP
typedef struct {
  cudaStream_t s;
  cudaEvent_t ev[2];
  int made, open, on;
} gk_fork;
static int fork_make(gk_fork *f) {
  if (f->made) return 0;
  if (!f->s) GK_TRY(cudaStreamCreateWithFlags(&f->s, cudaStreamNonBlocking));
  for (int i = 0; i < 2; i++)
    if (!f->ev[i]) GK_TRY(cudaEventCreateWithFlags(&f->ev[i], cudaEventDisableTiming));
  f->made = 1;
  return 0;
}
/* f's stream starts after the work launched so far; launches go there */
static int fork_open(gk_fork *f) {
  GK_TRY(cudaEventRecord(f->ev[0], cudaStreamPerThread));
  GK_TRY(cudaStreamWaitEvent(f->s, f->ev[0], 0));
  f->open = f->on = 1;
  g_gk_stream = f->s;
  return 0;
}
static int fork_back(gk_fork *f) {
  if (!f->on) return 0;
  f->on = 0;
  g_gk_stream = cudaStreamPerThread;
  GK_TRY(cudaEventRecord(f->ev[1], f->s));
  return 0;
}
static int fork_join(gk_fork *f) {
  if (!f->open) return 0;
  const int rc = fork_back(f);
  f->open = 0;
  GK_TRY(cudaStreamWaitEvent(cudaStreamPerThread, f->ev[1], 0));
  return rc;
}
/* the compute stream's capture: 1 capturing, 0 not, -1 invalidated or the
 * query failed (its error cleared): either fork declines then */
static int capture_state(void) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(cudaStreamPerThread, &cs) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return cs == cudaStreamCaptureStatusActive ? 1 : cs == cudaStreamCaptureStatusNone ? 0 : -1;
}
#endif

/* ---- the side stream (gk.h) ---- */
static int g_side_env = -1;
static unsigned g_side_forks;
extern "C" void gk_set_side(int on) { g_side_env = on < 0 ? -1 : !!on; }
extern "C" unsigned gk_side_forks(void) { return g_side_forks; }
#if !GK_HIP && GK_HAVE_BLAS
static gk_fork g_side;
static int g_side_ok; /* the stream's cuBLAS handle made too */
extern "C" int gk_side_fork(void) {
  if (g_side_env < 0) g_side_env = getenv("GLM53_GPU_SIDE") && !strcmp(getenv("GLM53_GPU_SIDE"), "1");
  if (!g_side_env || !g_blas_ok || g_side.open || gk_kprof_active() || capture_state() != 0) return 0;
  if (!g_side_ok) {
    if (fork_make(&g_side)) return -1;
    if (!g_blas_side && cublasCreate(&g_blas_side) != CUBLAS_STATUS_SUCCESS) {
      g_blas_side = NULL;
      return gk_fail("cuBLAS initialisation (side stream) failed");
    }
    cublasSetStream(g_blas_side, g_side.s);
    g_side_ok = 1;
  }
  if (fork_open(&g_side)) return -1;
  g_side_forks++;
  return 1;
}
extern "C" int gk_side_back(void) { return fork_back(&g_side); }
extern "C" int gk_side_join(void) { return fork_join(&g_side); }
/* between gk_side_fork and gk_side_back: the side stream's cuBLAS handle and scratch */
static inline int on_side(void) { return g_side.on; }
#else
static inline int on_side(void) { return 0; }
extern "C" int gk_side_fork(void) { return 0; }
extern "C" int gk_side_back(void) { return 0; }
extern "C" int gk_side_join(void) { return 0; }
#endif

/* ---- a branch of a decode graph (gk.h gk_branch_fork) ----
 * Captured only: the fork and join become graph edges, so they cost
 * nothing per replay (direct launches would pay two event calls a site).
 * Opt-in (GLM53_GPU_BRANCH=1): the comb branch measured 0.10 ms per token
 * slower on an H100 (docs/gpu-measurements.md, eighteenth session). */
static int g_branch_env = -1;
extern "C" void gk_set_branch(int on) { g_branch_env = on < 0 ? -1 : !!on; }
static int branch_wanted(void) {
  if (g_branch_env < 0) g_branch_env = getenv("GLM53_GPU_BRANCH") && !strcmp(getenv("GLM53_GPU_BRANCH"), "1");
  return g_branch_env;
}
#if !GK_HIP
static gk_fork g_br;
extern "C" int gk_branch_fork(void) {
  if (!branch_wanted() || g_br.open || on_side() || capture_state() != 1) return 0;
  return fork_make(&g_br) || fork_open(&g_br) ? -1 : 1;
}
extern "C" int gk_branch_back(void) { return fork_back(&g_br); }
extern "C" int gk_branch_join(void) { return fork_join(&g_br); }
#else
extern "C" int gk_branch_fork(void) { return 0; }
extern "C" int gk_branch_back(void) { return 0; }
extern "C" int gk_branch_join(void) { return 0; }
#endif

static int g_gemm_min = -1;
extern "C" int gk_gemm_min(void) {
  if (g_gemm_min < 0) {
    const char *e = getenv("GLM53_GPU_GEMM_MIN");
    g_gemm_min = e && atoi(e) > 0 ? atoi(e) : 8; /* measured crossover, docs/gpu-measurements.md, fifth session */
  }
  return g_gemm_min;
}
extern "C" void gk_set_gemm_min(int n) { g_gemm_min = n > 0 ? n : -1; }
extern "C" int gk_have_blas(void) { return GK_HAVE_BLAS; }
static unsigned g_merged; /* products run inside a merged GEMM (multi_blas's merge_run) */
extern "C" unsigned gk_gemm_merged(void) { return g_merged; }
static const float *g_ax; /* gk_xb_alias */
static const void *g_axb;
static int g_an, g_acols;
static int g_alias_on = -1;
extern "C" void gk_set_xb_alias(int on) { g_alias_on = on < 0 ? -1 : !!on; }
extern "C" int gk_xb_alias_on(void) {
  if (g_alias_on < 0) g_alias_on = !(getenv("GLM53_GPU_XB_ALIAS") && !strcmp(getenv("GLM53_GPU_XB_ALIAS"), "0"));
  return g_alias_on;
}
extern "C" void gk_xb_alias(const float *x, int n, int cols, const void *xb16) {
  g_ax = x && xb16 && gk_xb_alias_on() ? x : NULL;
  g_axb = g_ax ? xb16 : NULL;
  g_an = n, g_acols = cols;
}
extern "C" const void *gk_xb_lookup(const float *x, int n, int cols, int ldx) {
  return g_ax && x == g_ax && cols == g_acols && ldx == cols && n <= g_an ? g_axb : NULL;
}
static int g_merge = -1;
extern "C" void gk_set_gemm_merge(int on) { g_merge = on < 0 ? -1 : !!on; }
static int merge_on(void) {
  /* opt-in: the merged q | k | v GEMM measured the same as three (H100, seventeenth session) */
  if (g_merge < 0) g_merge = getenv("GLM53_GPU_GEMM_MERGE") && !strcmp(getenv("GLM53_GPU_GEMM_MERGE"), "1");
  return g_merge;
}

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
#define NT 8         /* tokens per block (v1/v2) */

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
      if (t >= nt) continue;
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (j + u * 256 >= c1) continue;
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
  GK_PDL_BEGIN();
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
      if (row0 + r >= W.rows) continue; /* not break: hipcc cannot fully unroll two-exit loops */
      for (int t = 0; t < nt; t++) {
        if (part) part[((size_t)blockIdx.z * n + t0 + t) * W.rows + row0 + r] = acc[r][t];
        else y[(size_t)(t0 + t) * ldy + row0 + r] = acc[r][t];
      }
    }
}

__global__ void gemv_reduce(const float *part, int nsplit, int n, int rows, float *y, int ldy) {
  GK_PDL_BEGIN();
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
  GK_PDL_BEGIN();
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
        if (t >= nt) continue;
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
        if (t >= nt) continue;
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
        if (t >= nt) continue;
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
  GK_PDL_BEGIN();
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
  GK_PDL_BEGIN();
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

template <int FMT>
static void launch_legacy(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy, int clen, int ns,
                          float *part) {
  int mode = gemv_mode(W, x, ldx);
  if (gemv_ver() == 1) {
    dim3 g1(gk_blocks(W->rows, WARPS), gk_blocks(n, NT), ns);
    if (mode) gk_launch(gemv1_k<FMT, true>, g1, 256, 0, *W, x, n, ldx, y, ldy, clen, part);
    else gk_launch(gemv1_k<FMT, false>, g1, 256, 0, *W, x, n, ldx, y, ldy, clen, part);
    return;
  }
  dim3 grid(gk_blocks(W->rows, rows_per_block<FMT>(mode)), gk_blocks(n, NT), ns);
  if (mode == 2) gk_launch(gemv_k<FMT, 2>, grid, 256, 0, *W, x, n, ldx, y, ldy, clen, part);
  else if (mode == 1) gk_launch(gemv_k<FMT, 1>, grid, 256, 0, *W, x, n, ldx, y, ldy, clen, part);
  else gk_launch(gemv_k<FMT, 0>, grid, 256, 0, *W, x, n, ldx, y, ldy, clen, part);
}

/* the GEMV of the v1/v2 kernels (split partials reduced by gemv_reduce) */
static int gemv_legacy(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy) {
  if (W->rows <= 0) return 0;
  int clen = 0, ns = nsplit_for(W, &clen);
  float *part = NULL;
  if (ns > 1 && !(part = gk_scratch_part((size_t)ns * n * W->rows))) return -1;
  switch (W->fmt) {
  case GF_F32: launch_legacy<GF_F32>(W, x, n, ldx, y, ldy, clen, ns, part); break;
  case GF_BF16: launch_legacy<GF_BF16>(W, x, n, ldx, y, ldy, clen, ns, part); break;
  case GF_Q8: launch_legacy<GF_Q8>(W, x, n, ldx, y, ldy, clen, ns, part); break;
  case GF_Q4: launch_legacy<GF_Q4>(W, x, n, ldx, y, ldy, clen, ns, part); break;
  default: return gk_fail("matmul: unsupported weight format %d", W->fmt);
  }
  if (ns > 1) gk_launch(gemv_reduce, gk_blocks((size_t)n * W->rows, 256), 256, 0, part, ns, n, W->rows, y, ldy);
  return GK_LAUNCHED("gemv");
}

static int gemv(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy) {
  if (gemv_ver() < 3) return gemv_legacy(W, x, n, ldx, y, ldy);
  const gv_req r = {W, NULL, x, ldx, y, ldy, 0.f};
  return gv3_products(&r, 1, n, gemv_ver() == 4);
}

/* ---------------- cuBLAS path ---------------- */
#if GK_HAVE_BLAS
__global__ void to_bf16_k(const float *x, int n, int cols, int ldx, __nv_bfloat16 *o) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)n * cols) return;
  size_t t = i / cols, c = i % cols;
  o[i] = __float2bfloat16(x[t * ldx + c]);
}
/* The same rounding (bf16_bits is __float2bfloat16's) four or eight
 * elements per thread: x's rows contiguous (ldx == cols, n8 groups of
 * eight), or rows of c4 groups of four ld4 apart (32-bit index arithmetic:
 * the per-element kernel's 64-bit division kept it well off the memory
 * roofline, and every cuBLAS product of a long chunk converts its x). */
__global__ void to_bf16_v8_k(const float4 *x, unsigned n8, uint4 *o) {
  GK_PDL_BEGIN();
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const float4 a = x[2 * i], b = x[2 * i + 1];
  o[i] = make_uint4(bf16_bits(a.x) | bf16_bits(a.y) << 16, bf16_bits(a.z) | bf16_bits(a.w) << 16,
                    bf16_bits(b.x) | bf16_bits(b.y) << 16, bf16_bits(b.z) | bf16_bits(b.w) << 16);
}
__global__ void to_bf16_v4_k(const float4 *x, unsigned c4, unsigned ld4, unsigned n4, uint2 *o) {
  GK_PDL_BEGIN();
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n4) return;
  const unsigned t = i / c4, c = i - t * c4;
  const float4 a = x[(size_t)t * ld4 + c];
  o[i] = make_uint2(bf16_bits(a.x) | bf16_bits(a.y) << 16, bf16_bits(a.z) | bf16_bits(a.w) << 16);
}
__global__ void dequant_bf16_k(gpu_mat W, __nv_bfloat16 *o) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)W.rows * W.cols) return;
  o[i] = __float2bfloat16(wl1_any(W, i / W.cols, (int)(i % W.cols)));
}

/* the handle of the stream launches go to */
static cublasHandle_t blas_now(void) { return on_side() ? g_blas_side : g_blas; }
cublasHandle_t gk_blas_handle(void) { return g_blas_ok ? blas_now() : NULL; }
void gk_dequant_bf16(const gpu_mat *W, __nv_bfloat16 *out) {
  gk_launch(dequant_bf16_k, gk_blocks((size_t)W->rows * W->cols, 256), 256, 0, *W, out);
}

extern "C" int gk_rows_bf16(const float *x, int n, int cols, int ldx, void *out) {
  const size_t ne = (size_t)n * cols;
  if (!ne) return 0;
  if (ne / 4 < 0xffffffffu && (uintptr_t)x % 16 == 0 && cols % 4 == 0 && ldx % 4 == 0) {
    if (ldx == cols && ne % 8 == 0 && (uintptr_t)out % 16 == 0)
      gk_launch(to_bf16_v8_k, gk_blocks(ne / 8, 256), 256, 0, (const float4 *)x, (unsigned)(ne / 8), (uint4 *)out);
    else
      gk_launch(to_bf16_v4_k, gk_blocks(ne / 4, 256), 256, 0, (const float4 *)x, (unsigned)(cols / 4), (unsigned)(ldx / 4),
                (unsigned)(ne / 4), (uint2 *)out);
  } else
    gk_launch(to_bf16_k, gk_blocks(ne, 256), 256, 0, x, n, cols, ldx, (__nv_bfloat16 *)out);
  return 0;
}
/* x [n][cols] (ldx apart) as dense bf16 rows in the g_xb scratch */
static const __nv_bfloat16 *x_bf16(const float *x, int n, int cols, int ldx) {
  if (const void *a = gk_xb_lookup(x, n, cols, ldx)) return (const __nv_bfloat16 *)a; /* already in bf16 (gk_xb_alias) */
  __nv_bfloat16 *xb = (__nv_bfloat16 *)scratch(&g_xb[on_side()], (size_t)n * cols * 2);
  return xb && !gk_rows_bf16(x, n, cols, ldx, xb) ? xb : NULL;
}
static int gemm_xb(const gpu_mat *W, const __nv_bfloat16 *xb, int n, float *y, int ldy, bool y16 = false);

static int gemm(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy) {
  const float one = 1.f, zero = 0.f;
  if (W->fmt == GF_F32) {
    if (cublasSgemm(blas_now(), CUBLAS_OP_T, CUBLAS_OP_N, W->rows, n, W->cols, &one, (const float *)W->d, W->cols, x, ldx,
                    &zero, y, ldy) != CUBLAS_STATUS_SUCCESS)
      return gk_fail("cublasSgemm failed (%d x %d x %d)", W->rows, n, W->cols);
    return GK_LAUNCHED("sgemm");
  }
  const __nv_bfloat16 *xb = x_bf16(x, n, W->cols, ldx);
  return xb ? gemm_xb(W, xb, n, y, ldy) : -1;
}

/* y = xb . W^T for bf16 rows xb [n][W cols] (quantized W dequantised);
 * y16: y holds bf16 (ldy in its elements) */
static int gemm_xb(const gpu_mat *W, const __nv_bfloat16 *xb, int n, float *y, int ldy, bool y16) {
  const float one = 1.f, zero = 0.f;
  const void *wb = W->d;
  if (W->fmt != GF_BF16) { /* quantized: dequantize to bf16 once per call (prefill only) */
    __nv_bfloat16 *t = (__nv_bfloat16 *)scratch(&g_wb[on_side()], (size_t)W->rows * W->cols * 2);
    if (!t) return -1;
    gk_dequant_bf16(W, t);
    wb = t;
  }
  if (cublasGemmEx(blas_now(), CUBLAS_OP_T, CUBLAS_OP_N, W->rows, n, W->cols, &one, wb, CUDA_R_16BF, W->cols, xb,
                   CUDA_R_16BF, W->cols, &zero, y, y16 ? CUDA_R_16BF : CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                   CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
    return gk_fail("cublasGemmEx failed (%d x %d x %d)", W->rows, n, W->cols);
  return GK_LAUNCHED("gemm bf16");
}


/* the per-head products as one strided-batched bf16 GEMM (one conversion
 * of x for all heads) when every head's matrix is bf16, of one shape, and
 * evenly spaced in memory (W_UK^T: one buffer; W_UV: rows of kv_b); 1: not
 * applicable (the caller loops over heads), -1 on error */
static int heads_batched(const gpu_mat *W, int H, const float *x, int T, int ldx_head, float *y, int ldy_head) {
  if (H < 2 || W[0].fmt != GF_BF16) return 1;
  const long long st = (const char *)W[1].d - (const char *)W[0].d;
  if (st <= 0 || st % 2) return 1;
  for (int h = 1; h < H; h++)
    if (W[h].fmt != GF_BF16 || W[h].rows != W[0].rows || W[h].cols != W[0].cols ||
        (const char *)W[h].d - (const char *)W[0].d != st * h)
      return 1;
  const int ld = H * ldx_head, rows = W[0].rows, cols = W[0].cols;
  const __nv_bfloat16 *xb = x_bf16(x, T, ld, ld);
  if (!xb) return -1;
  const float one = 1.f, zero = 0.f;
  if (cublasGemmStridedBatchedEx(blas_now(), CUBLAS_OP_T, CUBLAS_OP_N, rows, T, cols, &one, W[0].d, CUDA_R_16BF, cols, st / 2, xb,
                                 CUDA_R_16BF, ld, ldx_head, &zero, y, CUDA_R_32F, H * ldy_head, ldy_head, H,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
    return gk_fail("cublasGemmStridedBatchedEx failed (%d heads of %d x %d x %d)", H, rows, T, cols);
  return GK_LAUNCHED("gemm bf16 heads") ? -1 : 0;
}
#endif

/* cuBLAS for chunks of at least gk_gemm_min() tokens, where built with it */
static int use_blas(int n) {
#if GK_HAVE_BLAS
  return n >= gk_gemm_min();
#else
  (void)n;
  return 0;
#endif
}

extern "C" int gk_matmul(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy) {
  if (n <= 0) return 0;
#if GK_HAVE_BLAS
  if (use_blas(n)) return gemm(W, x, n, ldx, y, ldy);
#endif
  return gemv(W, x, n, ldx, y, ldy);
}


#if GK_HAVE_BLAS
/* How many products from p[0] on form one GEMM: bf16 matrices of the shared
 * x, each stored right after the previous one (glm53_gpu.c up_adjacent at
 * upload) and writing right after the previous one's columns with the
 * same row stride, as the KDA q | k | v projections into their qkv rows:
 * one GEMM of the summed rows instead of three of a third (fewer waves
 * and one tail). */
static int merge_run(const gk_prod *p, int np) {
  const gpu_mat *W = p[0].W;
  if (!merge_on() || W->fmt != GF_BF16 || p[0].W2 || p[0].x) return 1;
  int m = 1;
  size_t rows = W->rows;
  const size_t es = p[0].y16 ? 2 : 4;
  while (m < np) {
    const gpu_mat *V = p[m].W;
    if (V->fmt != GF_BF16 || p[m].W2 || p[m].x || V->cols != W->cols || p[m].ldy != p[0].ldy || p[m].y16 != p[0].y16 ||
        (const char *)V->d != (const char *)W->d + rows * W->cols * 2 || (const char *)p[m].y != (const char *)p[0].y + rows * es)
      break;
    rows += V->rows;
    m++;
  }
  return m;
}
/* the cuBLAS path of gk_matmul_multi: the products of the shared x (bf16 or
 * quantized weights) take one bf16 conversion of it; the others go through
 * gk_matmul / gk_gate_up (which convert their own x). Same results as one
 * gk_matmul per product, but for runs of adjacent bf16 products
 * (merge_run: one GEMM of their summed rows, equal to fp32 rounding). */
static int multi_blas(const gk_prod *p, int np, const float *x, int n, int ldx) {
  int have = -1; /* columns of x now in g_xb, -1: none */
  const __nv_bfloat16 *xb = NULL;
  for (int i = 0; i < np; i++) {
    const gpu_mat *W = p[i].W, *W2 = p[i].W2;
    const int shared = !p[i].x && W->fmt != GF_F32 && (!W2 || (W2->fmt != GF_F32 && W2->cols == W->cols));
    if (p[i].y16 && (!shared || W2)) return gk_fail("matmul: bf16 output of a product that is not a plain one of the shared x");
    if (!shared) {
      const float *xi = p[i].x ? p[i].x : x;
      const int li = p[i].x ? p[i].ldx : ldx;
      if (W2 ? gk_gate_up(W, W2, xi, n, li, p[i].y, p[i].u, p[i].limit) : gk_matmul(W, xi, n, li, p[i].y, p[i].ldy)) return -1;
      have = -1; /* g_xb may hold another x now */
      continue;
    }
    if (have != W->cols) {
      if (!(xb = x_bf16(x, n, W->cols, ldx))) return -1;
      have = W->cols;
    }
    if (!W2) {
      const int m = merge_run(p + i, np - i);
      gpu_mat Wm = *W;
      for (int j = 1; j < m; j++) Wm.rows += p[i + j].W->rows;
      if (gemm_xb(&Wm, xb, n, p[i].y, p[i].ldy, p[i].y16)) return -1;
      if (m > 1) g_merged += m;
      i += m - 1;
      continue;
    }
    if (p[i].ldy != W->rows) return gk_fail("matmul: fused gate/up output stride %d", p[i].ldy);
    if (gemm_xb(W, xb, n, p[i].y, W->rows) || gemm_xb(W2, xb, n, p[i].u, W->rows) ||
        gk_swiglu(p[i].y, p[i].u, (size_t)n * W->rows, p[i].limit))
      return -1;
  }
  return 0;
}
#endif

/* the GEMV requests of np (<= 16) products sharing x unless they have their own */
static int prod_reqs(const gk_prod *p, int np, const float *x, int ldx, gv_req *r) {
  for (int i = 0; i < np; i++) {
    if (p[i].W2 && p[i].ldy != p[i].W->rows) return gk_fail("matmul: fused gate/up output stride %d", p[i].ldy);
    r[i] = (gv_req){p[i].W, p[i].W2, p[i].x ? p[i].x : x, p[i].x ? p[i].ldx : ldx, p[i].y, p[i].ldy, p[i].limit};
  }
  return 0;
}
extern "C" int gk_matmul_multi(const gk_prod *p, int np, const float *x, int n, int ldx) {
  if (n <= 0 || np <= 0) return 0;
#if GK_HAVE_BLAS
  if (use_blas(n)) return multi_blas(p, np, x, n, ldx);
#endif
  for (int i = 0; i < np; i++)
    if (p[i].y16) return gk_fail("matmul: bf16 outputs need the cuBLAS path (%d tokens)", n);
  if (use_blas(n) || gemv_ver() < 3 || np > 16) {
    for (int i = 0; i < np; i++) {
      const float *xi = p[i].x ? p[i].x : x;
      const int li = p[i].x ? p[i].ldx : ldx;
      if (p[i].W2 ? gk_gate_up(p[i].W, p[i].W2, xi, n, li, p[i].y, p[i].u, p[i].limit)
                  : gk_matmul(p[i].W, xi, n, li, p[i].y, p[i].ldy))
        return -1;
    }
    return 0;
  }
  gv_req r[16];
  if (prod_reqs(p, np, x, ldx, r)) return -1;
  return gv3_products(r, np, n, gemv_ver() == 4);
}

static int g_route_fuse = -1;
extern "C" void gk_set_route_fuse(int on) { g_route_fuse = on < 0 ? -1 : !!on; }
extern "C" int gk_matmul_route(const gk_prod *p, int np, const float *x, int n, int ldx, int rp, const gk_route_req *q) {
  /* opt-in until measured on a device (written in the twenty-second session, which had none) */
  if (g_route_fuse < 0) g_route_fuse = getenv("GLM53_GPU_ROUTE_FUSE") && !strcmp(getenv("GLM53_GPU_ROUTE_FUSE"), "1");
  if (!g_route_fuse || n <= 0 || np <= 0 || np > 16 || rp < 0 || rp >= np || use_blas(n) || gemv_ver() != 3) return 1;
  const gk_prod *R = &p[rp];
  if (R->W2 || R->x || R->ldy != q->E || R->W->rows != q->E || q->E < 1 || q->E > GK_ROUTE_E_MAX || q->k < 1 ||
      q->k > 64 || q->G > 64 || gk_expert_l2pf() > 0)
    return 1;
  gv_req r[16];
  if (prod_reqs(p, np, x, ldx, r)) return -1;
  for (int i = 0; i < np; i++) /* (the routed launches: float4 x rows) */
    if (p[i].y16 || (uintptr_t)r[i].x % 16 || r[i].ldx % 4) return 1;
  const int grouped = q->grp && n == 1 && gk_route_group_on();
  const gv_route rt = {.bias = q->bias, .idx = q->idx, .grp = grouped ? q->grp : NULL, .wt = q->wt, .E = q->E, .k = q->k,
                       .G = q->G, .topk_group = q->topk_group, .norm = q->norm,
                       .gmax = grouped ? gk_expert_group_max(q->k, q->E) : 0, .scaling = q->scaling};
  r[rp].rt = &rt;
  if (gv3_products(r, np, n, 0)) return -1;
  return grouped || !q->grp ? 0 : 2;
}

static int g_pre_fuse = -1;
extern "C" void gk_set_mhc_pre_fuse(int on) { g_pre_fuse = on < 0 ? -1 : !!on; }
extern "C" int gk_mhc_proj_pre(const gpu_mat *fn, const float *X, int T, int hc, int D, float *mixraw, const float *base,
                               const float *scale, const float *norm_w, int iters, float hc_eps, float rms_eps, float *post,
                               float *comb, float *y, void *y16) {
  /* opt-in until measured on a device (twenty-second session) */
  if (g_pre_fuse < 0) g_pre_fuse = getenv("GLM53_GPU_MHC_PRE_FUSE") && !strcmp(getenv("GLM53_GPU_MHC_PRE_FUSE"), "1");
  const int n = hc * D, mix = (2 + hc) * hc;
  if (!g_pre_fuse || branch_wanted() || T != 1 || hc != 4 || D % 4 || use_blas(1) || gemv_ver() != 3 ||
      fn->fmt != GF_F32 || fn->rows != mix || fn->cols != n || !comb || (uintptr_t)X % 16 || (uintptr_t)y % 16 ||
      (uintptr_t)norm_w % 16 || (uintptr_t)y16 % 8)
    return 1;
  const gv_mpre mp = {.X = X, .base = base, .scale = scale, .norm_w = norm_w, .post = post, .comb = comb, .y = y,
                      .y16 = (uint16_t *)y16, .D = D, .iters = iters, .hc_eps = hc_eps, .rms_eps = rms_eps};
  const gv_req r = {fn, NULL, X, n, mixraw, mix, 0.f, NULL, &mp};
  return gv3_products(&r, 1, 1, 0) ? -1 : 0;
}

extern "C" int gk_gate_up(const gpu_mat *Wg, const gpu_mat *Wu, const float *x, int n, int ldx, float *g, float *u,
                          float limit) {
  if (n <= 0) return 0;
  const int I = Wg->rows;
#if GK_HAVE_BLAS
  if (use_blas(n) && Wg->fmt != GF_F32 && Wu->fmt != GF_F32 && Wg->cols == Wu->cols) { /* one conversion of x */
    const gk_prod p = {.W = Wg, .y = g, .ldy = I, .W2 = Wu, .u = u, .limit = limit};
    return multi_blas(&p, 1, x, n, ldx);
  }
#endif
  if (use_blas(n) || gemv_ver() < 3) {
    if (gk_matmul(Wg, x, n, ldx, g, I) || gk_matmul(Wu, x, n, ldx, u, I)) return -1;
    return gk_swiglu(g, u, (size_t)n * I, limit);
  }
  const gv_req r = {Wg, Wu, x, ldx, g, I, limit};
  return gv3_products(&r, 1, n, gemv_ver() == 4);
}

extern "C" int gk_matmul_xb16(const gpu_mat *W, const void *xb, int n, float *y, int ldy) {
  if (n <= 0) return 0;
#if GK_HAVE_BLAS
  if (use_blas(n) && W->fmt != GF_F32) return gemm_xb(W, (const __nv_bfloat16 *)xb, n, y, ldy);
#endif
  (void)xb; (void)y; (void)ldy;
  return gk_fail("matmul: bf16 x needs the cuBLAS path and 16-bit or quantized weights (%d tokens, format %d)", n, W->fmt);
}
extern "C" int gk_xb16_ok(const gpu_mat *W, int n) { return use_blas(n) && W->fmt != GF_F32; }

extern "C" int gk_mlp(const gpu_mat *Wg, const gpu_mat *Wu, const gpu_mat *Wd, const float *x, int n, int ldx, float *g,
                      float *u, float limit, float *out, int ldo) {
  if (n <= 0) return 0;
  const int I = Wg->rows;
#if GK_HAVE_BLAS
  if (use_blas(n) && Wg->fmt != GF_F32 && Wu->fmt != GF_F32 && Wd->fmt != GF_F32 && Wg->cols == Wu->cols &&
      Wd->cols == I) {
    const __nv_bfloat16 *xb = x_bf16(x, n, Wg->cols, ldx);
    uint16_t *hb = (uint16_t *)scratch(&g_hb[on_side()], (size_t)n * I * 2);
    if (!xb || !hb || gemm_xb(Wg, xb, n, g, I) || gemm_xb(Wu, xb, n, u, I) ||
        gk_swiglu_to_bf16(g, u, (size_t)n * I, limit, hb) || GK_LAUNCHED("swiglu bf16"))
      return -1;
    return gemm_xb(Wd, (const __nv_bfloat16 *)hb, n, out, ldo);
  }
#endif
  return gk_gate_up(Wg, Wu, x, n, ldx, g, u, limit) || gk_matmul(Wd, g, n, I, out, ldo) ? -1 : 0;
}

static int batched_gemv(const gpu_mat *d_wset, int which, int wstride, int fmt, int rows, int cols, const int *idx,
                        int npairs, int k, int xpt, const float *x, int ldx, float *y, int ldy, int only) {
  if (npairs <= 0 || rows <= 0) return 0;
  const int ver = gemv_ver();
  if (ver >= 3) return gv3_pairs(d_wset, which, wstride, fmt, rows, cols, idx, npairs, k, xpt, x, ldx, y, ldy, only, ver == 4);
  /* v1/v2: the backend checks group % 8 for quantized weights */
  const int xv = (uintptr_t)x % 16 == 0 && ldx % 4 == 0, mode = cols % 8 ? 0 : xv ? 2 : 1;
#define GK_EXP(F)                                                                                               \
  if (ver == 1) {                                                                                               \
    dim3 g1(gk_blocks(rows, WARPS), npairs);                                                                     \
    if (mode) gk_launch(gemv1_exp_k<F, true>, g1, 256, 0, d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only); \
    else gk_launch(gemv1_exp_k<F, false>, g1, 256, 0, d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only);    \
  } else {                                                                                                      \
    dim3 grid(gk_blocks(rows, rows_per_block<F>(mode)), npairs);                                                 \
    if (mode == 2) gk_launch(gemv_exp_k<F, 2>, grid, 256, 0, d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only); \
    else if (mode == 1) gk_launch(gemv_exp_k<F, 1>, grid, 256, 0, d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only); \
    else gk_launch(gemv_exp_k<F, 0>, grid, 256, 0, d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only);        \
  }
  switch (fmt) {
  case GF_F32: GK_EXP(GF_F32); break;
  case GF_BF16: GK_EXP(GF_BF16); break;
  case GF_Q8: GK_EXP(GF_Q8); break;
  case GF_Q4: GK_EXP(GF_Q4); break;
  default: return gk_fail("batched gemv: unsupported weight format %d", fmt);
  }
#undef GK_EXP
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

extern "C" int gk_experts_grouped(const gpu_mat *d_wset, int which, int gu, float limit, int fmt, int rows, int cols,
                                  const int *grp, const int *idx, int npairs, int E, int k, int xpt, const float *x,
                                  int ldx, float *y, int ldy, float *u, const gk_shared_rows *sh) {
  if (sh && sh->n <= 0) sh = NULL;
  if (npairs < 0 || rows <= 0 || (npairs == 0 && !sh)) return 0;
  const int ver = gemv_ver();
  if (ver >= 3) return gv3_grouped(d_wset, which, gu, limit, fmt, rows, cols, grp, idx, npairs, E, k, xpt, x, ldx, y, ldy, sh, ver == 4);
  /* v1/v2 (bench fallbacks): per-pair launches, the shared rows apart */
  if (sh && (gu ? gk_gate_up(&sh->W, &sh->W2, sh->x, sh->n, sh->ldx, sh->y, u, limit)
                : gk_matmul(&sh->W, sh->x, sh->n, sh->ldx, sh->y, sh->ldy)))
    return -1;
  if (!npairs) return 0;
  if (batched_gemv(d_wset, which, 3, fmt, rows, cols, idx, npairs, k, xpt, x, ldx, y, ldy, -1)) return -1;
  if (!gu) return 0;
  if (batched_gemv(d_wset, which + 1, 3, fmt, rows, cols, idx, npairs, k, xpt, x, ldx, u, ldy, -1)) return -1;
  return gk_swiglu(y, u, (size_t)npairs * ldy, limit);
}

static int g_shared_group = -1;
extern "C" void gk_set_shared_group(int mode) { g_shared_group = mode < 0 ? -1 : mode > 2 ? 2 : mode; }
extern "C" int gk_shared_group(void) {
  if (g_shared_group < 0) {
    const char *e = getenv("GLM53_GPU_SHARED_GROUP");
    g_shared_group = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "2") ? 2 : 1;
  }
  return g_shared_group;
}

extern "C" int gk_matmul_heads(const gpu_mat *h_mats, const gpu_mat *d_mats, int H, const float *x, int T, int ldx_head,
                               float *y, int ldy_head) {
  const gpu_mat *W = &h_mats[0];
  if (T < gk_gemm_min()) /* row p = t*H + h of x and y */
    return batched_gemv(d_mats, 0, 1, W->fmt, W->rows, W->cols, NULL, T * H, H, 0, x, ldx_head, y, ldy_head, -1);
#if GK_HAVE_BLAS
  if (use_blas(T)) {
    const int r = heads_batched(h_mats, H, x, T, ldx_head, y, ldy_head);
    if (r <= 0) return r;
  }
#endif
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
extern "C" void gk_event_record(void *e) { (void)cudaEventRecord((cudaEvent_t)e, 0); }
extern "C" float gk_event_ms(void *a, void *b) {
  float ms = 0;
  (void)cudaEventSynchronize((cudaEvent_t)b);
  (void)cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b);
  return ms;
}
extern "C" void gk_event_free(void *e) { if (e) (void)cudaEventDestroy((cudaEvent_t)e); }

__global__ void fill_k(uint32_t *p, size_t n, uint32_t seed) {
  GK_PDL_BEGIN();
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
  (void)cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  void *e0 = gk_event_new(), *e1 = gk_event_new();
  gk_event_record(e0);
  for (int i = 0; i < reps; i++) (void)cudaMemcpy(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice);
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
    cublasGemmEx(blas_now(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_16BF, k, B, CUDA_R_16BF, k, &zero, C,
                 CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  void *e0 = gk_event_new(), *e1 = gk_event_new();
  gk_event_record(e0);
  for (int i = 0; i < reps; i++)
    cublasGemmEx(blas_now(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, A, CUDA_R_16BF, k, B, CUDA_R_16BF, k, &zero, C,
                 CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  gk_event_record(e1);
  float ms = gk_event_ms(e0, e1);
  gk_event_free(e0); gk_event_free(e1);
  gk_free(A); gk_free(B); gk_free(C);
  return 2.0 * m * n * (double)k * reps / (ms * 1e-3) / 1e12;
#endif
}

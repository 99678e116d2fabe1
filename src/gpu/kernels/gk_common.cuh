/* Shared device helpers of the kernel files: error state, weight element
 * loads for every wmat format, warp/block reductions with a fixed order (so
 * results are bitwise reproducible run to run). */
#ifndef GLM53_GPU_GK_COMMON_CUH
#define GLM53_GPU_GK_COMMON_CUH
#include "gpu_compat.h"
#include "gk.h"
#include <stdint.h>
#include <stdio.h>
#if GK_HIP
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif

enum { GF_F32 = 1, GF_BF16 = 2, GF_Q8 = 3, GF_Q4 = 4 };

/* set the module error (host); returns -1 */
int gk_fail(const char *fmt, ...);
/* a grow-only device scratch buffer (gk_gemm.cu): p holds at least n bytes
 * after a successful call (NULL + gk_error on failure). For buffers that
 * captured graphs never use (the cuBLAS forms of long chunks): growing it
 * does not mark graphs stale. */
typedef struct { void *p; size_t n; } gk_scratch;
void *gk_scratch_grow(gk_scratch *s, size_t n);
#if GK_HAVE_BLAS
/* gk_gemm.cu: the one cuBLAS handle (created by gk_init, on the kernels'
 * stream; NULL before), and the dequantisation of a weight matrix to dense
 * bf16 rows (launched on that stream) for the cuBLAS paths of other files */
cublasHandle_t gk_blas_handle(void);
void gk_dequant_bf16(const gpu_mat *W, __nv_bfloat16 *out);
#endif
/* check a CUDA call; returns -1 with context on failure */
#define GK_TRY(call)                                                                        \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) return gk_fail("%s: %s", #call, cudaGetErrorString(e_));         \
  } while (0)
#define GK_LAUNCHED(name) gk_check(name)

/* ---- programmatic dependent launch (PDL, sm_90+) ----
 * Every kernel of the forward is launched through gk_launch and starts with
 * GK_PDL_WAIT() before it touches memory an earlier kernel writes or reads:
 * with PDL on, a kernel's blocks are scheduled while the previous kernel
 * drains, so its launch latency (most of a small kernel's cost at decode)
 * overlaps that kernel; the wait returns once the previous grid has
 * completed and its writes are visible (transitively, every earlier one).
 * GK_PDL_WAIT is a no-op when the kernel was launched without PDL, and is
 * compiled out below sm_90 and on HIP; gk_pdl_on() turns PDL on only where
 * the kernels were built for sm_90+ PTX (so the wait is in them) and the
 * device supports it (GLM53_GPU_PDL=0 turns it off). */
#if !GK_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GK_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define GK_PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define GK_PDL_WAIT() do { } while (0)
#define GK_PDL_LAUNCH() do { } while (0)
#endif
/* Trigger order. Early (opt-in until measured on the device:
 * GLM53_GPU_PDL_EARLY=1, gk_set_pdl_early(1)): let the next kernel be scheduled,
 * then wait for the previous one. A kernel's dependents launch once all its
 * blocks have started, so a run of small kernels and the product after it
 * are all resident early and the product's pre-wait weight prefetch
 * (gv_rows) overlaps the whole run instead of its last kernel only. Safe
 * because every kernel waits before it touches activations and none
 * completes before its wait returns, so "the previous grid completed"
 * still means every earlier one did. Late (the default): wait, then
 * trigger. A __constant__ flag per translation unit (no relocatable device
 * code), each registered at static initialisation and set together. */
static __constant__ int gk_pdl_late_c = 1;
#define GK_PDL_BEGIN()                                                                                                 \
  do {                                                                                                                 \
    if (gk_pdl_late_c) { GK_PDL_WAIT(); GK_PDL_LAUNCH(); }                                                              \
    else { GK_PDL_LAUNCH(); GK_PDL_WAIT(); }                                                                           \
  } while (0)
typedef int (*gk_pdl_order_fn)(int late);
int gk_pdl_order_register(gk_pdl_order_fn f); /* gk_gemm.cu */
static int gk_pdl_order_set_tu(int late) {
#if GK_HIP
  (void)late; /* no PDL on HIP: the order does not matter */
  return 0;
#else
  return cudaMemcpyToSymbol(gk_pdl_late_c, &late, sizeof late) == cudaSuccess ? 0 : -1;
#endif
}
static const int gk_pdl_order_reg __attribute__((unused)) = gk_pdl_order_register(gk_pdl_order_set_tu);
int gk_pdl_on(void);

/* Asynchronous prefetch of [p, p + n) into L2 (n a multiple of 16, p
 * 16-byte aligned; sm_90 bulk prefetch, one instruction for the range),
 * with the evict-last priority when last is set so that the weights it
 * brings in outlive the streaming reads of the product still running. A
 * no-op below sm_90 and on HIP. */
__device__ __forceinline__ void gk_l2_prefetch(const void *p, unsigned n, bool last) {
#if !GK_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (!n) return;
  if (last) {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p), "r"(n), "l"(pol) : "memory");
  } else {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
  }
#else
  (void)p; (void)n; (void)last;
#endif
}
void gk_launch_failed(cudaError_t e); /* kept for the next gk_check */
extern unsigned long g_gk_launches;   /* kernels launched so far (gk_launch_count) */
#if !GK_HIP
/* the stream launches go to: the per-thread default stream, or the side
 * stream between gk_side_fork and gk_side_join (gk_gemm.cu) */
extern cudaStream_t g_gk_stream;
template <typename... KArgs, typename... Args>
static inline void gk_launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = g_gk_stream;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = gk_pdl_on() ? 1 : 0;
  cudaError_t e = cudaLaunchKernelEx(&cfg, k, args...);
  if (e != cudaSuccess) gk_launch_failed(e);
  g_gk_launches++;
}
#else
template <typename... KArgs, typename... Args>
static inline void gk_launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, Args... args) {
  k<<<grid, block, smem>>>(args...);
  g_gk_launches++;
}
#endif

/* an L2 (coherent) load of data other blocks wrote before a fence: the
 * split-K partials (HIP 5.2 has no float __ldcg; volatile loads are
 * coherent there) */
#if GK_HIP
__device__ __forceinline__ float gk_ldcg(const float *p) { return *(const volatile float *)p; }
#else
__device__ __forceinline__ float gk_ldcg(const float *p) { return __ldcg(p); }
#endif
/* V consecutive floats (V 1 or 4; 4: one 16-byte access, p aligned to 16) */
template <int V> __device__ __forceinline__ void vload(float *v, const float *p) {
  if (V == 4) {
    const float4 q = *(const float4 *)p;
    v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
  } else {
#pragma unroll
    for (int i = 0; i < V; i++) v[i] = p[i];
  }
}
/* V consecutive bf16 values (raw bits) widened to float (V 4: one 8-byte
 * access, p aligned to 8): the MoE GEMM form's expert outputs */
template <int V> __device__ __forceinline__ void vload(float *v, const uint16_t *p) {
  if (V == 4) {
    const uint2 q = *(const uint2 *)p;
    v[0] = __uint_as_float(q.x << 16); v[1] = __uint_as_float(q.x & 0xffff0000u);
    v[2] = __uint_as_float(q.y << 16); v[3] = __uint_as_float(q.y & 0xffff0000u);
  } else {
#pragma unroll
    for (int i = 0; i < V; i++) v[i] = __uint_as_float((uint32_t)p[i] << 16);
  }
}
template <int V> __device__ __forceinline__ void vstore(float *p, const float *v) {
  if (V == 4) *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
  else {
#pragma unroll
    for (int i = 0; i < V; i++) p[i] = v[i];
  }
}

static inline unsigned gk_blocks(size_t n, unsigned per) { return (unsigned)((n + per - 1) / per); }

__device__ __forceinline__ float bf16f(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
/* one element of fp32 or bf16 (raw bits) storage as float */
__device__ __forceinline__ float ld_f(const float *p) { return *p; }
__device__ __forceinline__ float ld_f(const uint16_t *p) { return bf16f(*p); }
__device__ __forceinline__ float gk_scale(const gpu_mat &W, size_t r, int j) {
  size_t ng = (size_t)W.cols / W.group;
  uint16_t s = ((const uint16_t *)W.s)[r * ng + j / W.group];
  return W.scale_bf16 ? bf16f(s) : __half2float(__ushort_as_half(s));
}

/* one element W[r][j] */
template <int FMT> __device__ __forceinline__ float wl1(const gpu_mat &W, size_t r, int j) {
  size_t i = r * (size_t)W.cols + j;
  if (FMT == GF_F32) return ((const float *)W.d)[i];
  if (FMT == GF_BF16) return bf16f(((const uint16_t *)W.d)[i]);
  if (FMT == GF_Q8) return (float)((const int8_t *)W.d)[i] * gk_scale(W, r, j);
  uint8_t b = ((const uint8_t *)W.d)[i >> 1];
  int nib = (j & 1) ? (b >> 4) : (b & 15);
  return (float)(nib - 8) * gk_scale(W, r, j);
}
__device__ __forceinline__ float wl1_any(const gpu_mat &W, size_t r, int j) {
  switch (W.fmt) {
  case GF_F32: return wl1<GF_F32>(W, r, j);
  case GF_BF16: return wl1<GF_BF16>(W, r, j);
  case GF_Q8: return wl1<GF_Q8>(W, r, j);
  default: return wl1<GF_Q4>(W, r, j);
  }
}

/* eight elements W[r][j..j+8), j % 8 == 0, cols % 8 == 0, group % 8 == 0 */
template <int FMT> __device__ __forceinline__ void wl8(const gpu_mat &W, size_t r, int j, float *v) {
  size_t i = r * (size_t)W.cols + j;
  if (FMT == GF_F32) {
    float4 a = __ldg((const float4 *)((const float *)W.d + i)), b = __ldg((const float4 *)((const float *)W.d + i) + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else if (FMT == GF_BF16) {
    uint4 a = __ldg((const uint4 *)((const uint16_t *)W.d + i));
    uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int q = 0; q < 4; q++) { v[2 * q] = __uint_as_float(w[q] << 16); v[2 * q + 1] = __uint_as_float(w[q] & 0xffff0000u); }
  } else if (FMT == GF_Q8) {
    uint2 a = __ldg((const uint2 *)((const int8_t *)W.d + i));
    float s = gk_scale(W, r, j);
    uint32_t w[2] = {a.x, a.y};
#pragma unroll
    for (int q = 0; q < 8; q++) v[q] = (float)(int8_t)((w[q >> 2] >> (8 * (q & 3))) & 0xff) * s;
  } else {
    uint32_t a = __ldg((const uint32_t *)((const uint8_t *)W.d + (i >> 1)));
    float s = gk_scale(W, r, j);
#pragma unroll
    for (int q = 0; q < 8; q++) v[q] = (float)((int)((a >> (4 * q)) & 15) - 8) * s;
  }
}

#include "gk_device.cuh" /* bf16_bits, sigm, kda_gate1, warp/block sums, paged rows, MLA selections */
/* clamped SwiGLU (ops.h swiglu_clamped): the MLP kernels and the fused
 * gate+up GEMV give the same bits */
__device__ __forceinline__ float swiglu1(float a, float b, float limit) {
  if (!isnan(limit)) {
    a = fminf(a, limit);
    b = fminf(fmaxf(b, -limit), limit);
  }
  return a / (1.0f + expf(-a)) * b;
}

#endif

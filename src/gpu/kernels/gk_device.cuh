/* Device helpers that need no CUDA header (only gk.h's types, the math
 * library, __float_as_uint, __shfl_xor_sync and __syncthreads), so that
 * tests/emu can compile the kernels that use them on the host: scalar
 * functions (bf16 rounding, gates), fixed-
 * order warp and block sums, paged-state rows and the MLA selection walk. */
#ifndef GLM53_GPU_GK_DEVICE_CUH
#define GLM53_GPU_GK_DEVICE_CUH
#include "gk.h"
/* a kernel's dynamic shared memory (the emulator gives a host buffer) */
#ifndef GK_DYN_SMEM
#define GK_DYN_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif
/* batch table lookups (gk.h gk_batch) */
__device__ __forceinline__ float *bst(const gk_batch &b, int s, int which) { return b.seg[s].ls[b.layer].p[which]; }
__device__ __forceinline__ int bpos(const gk_batch &b, int t, int *seg) {
  int s = b.tseg[t];
  if (seg) *seg = s;
  return b.seg[s].pos0 + t - b.seg[s].t0;
}
/* fp32 -> bf16 bits, round to nearest even (__float2bfloat16's result) */
__device__ __forceinline__ uint32_t bf16_bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u; /* NaN */
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
/* KDA forget gate (log decay) of channel c (head h) from its raw
 * projection: the token recurrence and the chunked form share it */
__device__ __forceinline__ float kda_gate1(float graw, const float *dt_bias, const float *A_log, int h, int c, float lb) {
  float rate = expf(A_log[h]), x = graw + dt_bias[c];
  return !isnan(lb) ? lb * sigm(rate * x) : -rate * (x > 20.0f ? x : log1pf(expf(x)));
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
/* block-wide sum (blockDim.x a multiple of 32, <= 1024), same order every time;
 * every thread gets the result. sh: 32 floats of shared memory. */
__device__ __forceinline__ float block_sum(float v, float *sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  float t = 0;
  for (int i = 0; i < nw; i++) t += sh[i];
  return t;
}
/* the strict total order of scores (larger first, NaN as -inf, then the
 * lower index): the indexer's pool selection and the MoE router's top-k */
__device__ __forceinline__ bool pool_before(float a, int ia, float b, int ib) {
  if (isnan(a)) a = -INFINITY;
  if (isnan(b)) b = -INFINITY;
  return a != b ? a > b : ia < ib;
}
/* one row's RMSNorm / LayerNorm by the whole block (ops.h rmsnorm /
 * layernorm): thread i owns elements i, i + blockDim.x, ... in every loop,
 * so a caller may reread the outputs it owns (the fused stores below); sh:
 * 32 floats of shared memory. y may be x (in place). */
__device__ __forceinline__ void rmsnorm_row(float *yr, const float *xr, const float *w, int n, float eps, float *sh) {
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, sh);
  float r = 1.0f / sqrtf(ss / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (w ? w[i] : 1.0f) * (xr[i] * r);
}
__device__ __forceinline__ void layernorm_row(float *yr, const float *xr, const float *w, const float *b, int n, float eps,
                                              float *sh) {
  float s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i];
  float mu = block_sum(s, sh) / n;
  float v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += (xr[i] - mu) * (xr[i] - mu);
  float var = block_sum(v, sh) / n;
  float r = 1.0f / sqrtf(var + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = ((xr[i] - mu) * r) * w[i] + b[i];
}
/* row `row` of the paged state `which` (gk.h gk_lstate) */
__device__ __forceinline__ float *gk_prow(const gk_lstate &st, int which, int row, int stride) {
  return st.pg[which][row >> st.pshift] + (size_t)(row & ((1 << st.pshift) - 1)) * stride;
}

/* A query's DSA selection as select_k writes it (dense flag isd, np pools
 * pl[], tail start tb) at position pos: how many latent rows it attends
 * over, and the position of its s-th row (the pools' tokens in selection
 * order, then the tail). Shared by every MLA attention core. */
__device__ __forceinline__ int sel_count(int isd, int np, int tb, int pos, int P) {
  return isd ? pos + 1 : np * P + max(0, pos - tb + 1);
}
__device__ __forceinline__ int sel_row(int isd, int np, int tb, const int *pl, int P, int s) {
  return isd ? s : (s < np * P ? pl[s / P] * P + s % P : tb + s - np * P);
}
/* flash-decoding split of a selection of N rows: rows per part, the
 * smallest multiple of `chunk` (the core's tile) with at most MLA_PARTS
 * parts (so a short context spreads over many small parts instead of a
 * few long ones); the parts from ceil(N / rows) on are empty. It depends on
 * N and chunk only, so a token's rows split alike in decode steps, short
 * prefill chunks and batches of sessions of any context bound, as long as
 * the launch has the nsplit of gk_mla_nsplit (a smaller one gets longer
 * parts instead of losing rows). */
#define MLA_PARTS 32
__device__ __forceinline__ int split_rows(int N, int chunk, int nsplit) {
  const int r = (N + MLA_PARTS - 1) / MLA_PARTS, rn = (N + nsplit - 1) / nsplit;
  return (max(r, rn) + chunk - 1) / chunk * chunk;
}
__device__ __forceinline__ int split_used(int N, int rows) { return rows > 0 ? (N + rows - 1) / rows : 0; }
/* the rows [s0, s1) of part sp (chunk <= 0: one part of every row); false
 * for an empty part past the first (its block returns, the merge skips it) */
__device__ __forceinline__ bool split_part(int N, int chunk, int nsplit, int sp, int *s0, int *s1) {
  const int rows = chunk > 0 ? split_rows(N, chunk, nsplit) : N;
  *s0 = sp * rows;
  *s1 = min(N, *s0 + rows);
  return sp == 0 || sp < split_used(N, rows);
}

#endif

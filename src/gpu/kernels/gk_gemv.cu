/* The v3 decode GEMV (the default GEMV, docs/gpu.md "Products"): products
 * of one or several matrices sharing an input in one launch, fused gate+up
 * with SwiGLU, split-K reduced by the last block of each tile, and the
 * routed-expert launches (per pair, or grouped per expert on the device).
 * Moved out of gk_gemm.cu, which keeps the dispatch, the older GEMV
 * versions and cuBLAS. */
#include "gk_gemv.cuh"
#include "gk_route.cuh"   /* route_token: the router launch's last block routes */
#include "gk_mhc_pre.cuh" /* mhc_pre_tok: the mHC projection's last block runs the pre */
#include <stdlib.h>
#include <string.h>

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
 *   chunks per round and more warps per SM measured faster there). A
 *   cp.async pipeline into per-lane shared-memory slots (2-4 rounds ahead,
 *   no registers held) measured slower everywhere (docs/gpu.md).
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
template <int XM, int EW> __device__ __forceinline__ void gv_x(const float *p, float *v) {
  if (XM) {
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


/* a warp's RW rows: each row's data and scale bases: rows row0 + r of W,
 * or for a fused gate+up product (gu) gate row (row0 + r) / 2 at even r and
 * the same row of W2 (up) at odd r; clamped to the last row (the caller
 * drops the copies). Same addresses as one product per matrix, so the
 * same bits. */
template <int RW> struct gv_rowp {
  const char *w[RW];
  const uint16_t *s[RW];
  int row[RW];
};
template <int FMT, int RW>
__device__ __forceinline__ void gv_rowp_init(const gpu_mat &W, const gpu_mat &W2, bool gu, int row0, gv_rowp<RW> &p) {
  const size_t rowbytes = FMT == GF_Q4 ? (size_t)W.cols / 2 : (size_t)W.cols * (FMT == GF_F32 ? 4 : FMT == GF_BF16 ? 2 : 1);
  const size_t ng = FMT >= GF_Q8 && W.group > 0 ? (size_t)(W.cols / W.group) : 0;
#pragma unroll
  for (int r = 0; r < RW; r++) {
    const bool up = gu && (r & 1);
    const int rr = gu ? min((row0 + r) >> 1, W.rows - 1) : min(row0 + r, W.rows - 1);
    p.row[r] = rr;
    p.w[r] = (const char *)(up ? W2.d : W.d) + (size_t)rr * rowbytes;
    p.s[r] = (const uint16_t *)(up ? W2.s : W.s) + (size_t)rr * ng;
  }
}

/* U chunks (c, c+32, ...; past ce: a valid duplicate, not used) of RW rows */
template <int FMT, int RW, int U>
__device__ __forceinline__ void gv_load(const gpu_mat &W, const gv_rowp<RW> &p, int gsh, int c, int ce, uint4 (*w)[RW],
                                        float (*s)[RW]) {
  constexpr int E = gv_fmt<FMT>::E;
  constexpr bool SC = FMT >= GF_Q8;
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int cu = min(c + 32 * u, ce - 1);
    const int gi = SC ? (gsh >= 0 ? (cu * E) >> gsh : (cu * E) / W.group) : 0;
#pragma unroll
    for (int r = 0; r < RW; r++) {
      w[u][r] = __ldg((const uint4 *)p.w[r] + cu);
      if (SC) s[u][r] = gv_scale(W, __ldg(p.s[r] + gi));
    }
  }
}

/* one chunk (elements j .. j+E-1) of RW rows (w, scales s) into acc for
 * the NTK tokens xt[]: per (row, token) the element-order fmaf chain (a
 * chunk sum times the scale for Q8/Q4) */
/* x values: from global memory (XM 0 scalar, 1 float4), or (XM 2) from
 * the block's staged copy: float4 q of chunk cc of token t at
 * xs[(t * E/4 + q) * st + cc] (see gv_stage) */
template <int XM, int EW, int E>
__device__ __forceinline__ void gv_xk(const float *const *xt, int t, int j, int k, const float4 *xs, int st, int cc,
                                      float *v) {
  if (XM == 2) {
#pragma unroll
    for (int i = 0; i < EW / 4; i++) {
      const float4 a = xs[(t * (E / 4) + k * (EW / 4) + i) * st + cc];
      v[4 * i] = a.x; v[4 * i + 1] = a.y; v[4 * i + 2] = a.z; v[4 * i + 3] = a.w;
    }
  } else {
    gv_x<XM, EW>(xt[t] + j + k * EW, v);
  }
}
template <int FMT, int NTK, int XM, int RW>
__device__ __forceinline__ void gv_chunk(const uint4 *w, const float *s, int j, const float *const *xt,
                                         const float4 *xs, int st, int cc, float (*acc)[NTK]) {
  constexpr int E = gv_fmt<FMT>::E, EW = gv_fmt<FMT>::EW, KW = E / EW;
  constexpr bool SC = FMT >= GF_Q8;
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
      gv_xk<XM, EW, E>(xt, 0, j, k, xs, st, cc, xv);
#pragma unroll
      for (int r = 0; r < RW; r++) {
        float wf[EW];
        gv_cvt(w[r], k, wf, gk_fmt_tag<FMT>());
        float a = SC ? g[SC ? r : 0][0] : acc[r][0];
#pragma unroll
        for (int q = 0; q < EW; q++) a = fmaf(wf[q], xv[q], a);
        if (SC) g[SC ? r : 0][0] = a;
        else acc[r][0] = a;
      }
    } else { /* converted once for all tokens */
      float wf[RW][EW];
#pragma unroll
      for (int r = 0; r < RW; r++) gv_cvt(w[r], k, wf[r], gk_fmt_tag<FMT>());
#pragma unroll
      for (int t = 0; t < NTK; t++) {
        float xv[EW];
        gv_xk<XM, EW, E>(xt, t, j, k, xs, st, cc, xv);
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
      for (int t = 0; t < NTK; t++) acc[r][t] = fmaf(s[r], g[SC ? r : 0][SC ? t : 0], acc[r][t]);
  }
}

/* XM 2: the block copies the x of its chunk range [kb0, kb0 + ncb) for its
 * NTK tokens into shared memory, chunk-major per float4 (stride ncb | 1,
 * odd: the transposing stores spread over the banks), so that a warp's
 * x loads (lane l: chunk l) are consecutive 16-byte words instead of 32
 * lines 32 floats apart (the L1 limit of Q4/Q8, docs/gpu.md). Same x
 * values, same order: same bits. Every thread of the block calls it. */
extern __shared__ float4 gv_xsm[];
template <int FMT, int NTK>
__device__ __forceinline__ void gv_stage(const float *const *xt, int kb0, int ncb) {
  constexpr int E4 = gv_fmt<FMT>::E / 4;
  const int st = ncb | 1;
#pragma unroll
  for (int t = 0; t < NTK; t++) {
    const float4 *src = (const float4 *)xt[t] + (size_t)kb0 * E4;
    for (int i = threadIdx.x; i < ncb * E4; i += blockDim.x) gv_xsm[(t * E4 + (i % E4)) * st + i / E4] = __ldg(src + i);
  }
  __syncthreads();
}
static inline size_t gv_xs_bytes(int fmt, int ntk, int ncb) { return (size_t)ntk * (fmt == GF_Q4 ? 8 : 4) * (ncb | 1) * 16; }
#define GV_XS_MAX (48 * 1024) /* no opt-in: at most the default dynamic shared memory */

/* PFB (WAIT only): the L2 prefetch before the wait, bytes per row (a
 * multiple of 16) | 1 for the evict-last priority (gk_set_gemv_l2pf); 0:
 * one chunk per lane (plain schedule only). Lane r prefetches row r's
 * slice from its start, lane 16 + r its scales: the bytes this warp reads
 * first. */
template <int FMT, int RW>
__device__ __forceinline__ void gv_l2pf(const gpu_mat &W, const gv_rowp<RW> &rp, int gsh, int cb, int ce, int pfb) {
  constexpr int E = gv_fmt<FMT>::E;
  const int lane = threadIdx.x & 31;
  const unsigned nch = min((unsigned)(ce - cb), (unsigned)pfb >> 4);
  if (ce <= cb || !nch) return;
#pragma unroll
  for (int r = 0; r < RW; r++) {
    if (lane == r) gk_l2_prefetch(rp.w[r] + (size_t)cb * 16, nch * 16u, pfb & 1);
    if (FMT >= GF_Q8 && lane == 16 + r) {
      const int c1 = cb + (int)nch - 1;
      const int g0 = gsh >= 0 ? (cb * E) >> gsh : (cb * E) / W.group, g1 = gsh >= 0 ? (c1 * E) >> gsh : (c1 * E) / W.group;
      const uintptr_t a = (uintptr_t)(rp.s[r] + g0) & ~(uintptr_t)15, b = ((uintptr_t)(rp.s[r] + g1 + 1) + 15) & ~(uintptr_t)15;
      gk_l2_prefetch((const void *)a, (unsigned)(b - a), pfb & 1);
    }
  }
}

/* rows row0 .. row0+RW-1 (see gv_rowp) over chunks [cb, ce) of the split,
 * tokens xt[0..NTK) (the chunked path computes all NTK; the caller repeats
 * its last real token in the rest and drops them; nt = the real ones);
 * acc[r][t] summed over the warp. PF: round i+1 is loaded before the
 * FMAs of round i; else each round is loaded, then computed (U chunks per
 * row per round). WAIT: the kernel's PDL wait comes here, after the
 * first weight loads are issued (the weights are never written by a
 * kernel, so they may be read before the previous kernel ends). */
template <int FMT, int NTK, int XM, bool PF, bool WAIT>
__device__ __forceinline__ void gv_rows(const gpu_mat &W, const gpu_mat &W2, bool gu, int row0, const float *const *xt,
                                        int nt, int cb, int ce, int kb0, int kb1, float (*acc)[NTK], int pfb) {
  constexpr int E = gv_fmt<FMT>::E;
  constexpr int RW = gv_cfg<FMT, NTK, PF>::RW, U = gv_cfg<FMT, NTK, PF>::U;
  constexpr bool SC = FMT >= GF_Q8;
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < RW; r++)
#pragma unroll
    for (int t = 0; t < NTK; t++) acc[r][t] = 0.f;
  gv_rowp<RW> rp;
  gv_rowp_init<FMT, RW>(W, W2, gu, row0, rp);
  if (gv_fast<FMT>(W) && (!gu || gv_fast<FMT>(W2))) {
    const int gsh = SC && (W.group & (W.group - 1)) == 0 ? __ffs(W.group) - 1 : -1;
    uint4 wn[U][RW];
    float sn[U][RW];
    int c = cb + lane;
    if (PF && c < ce) gv_load<FMT, RW, U>(W, rp, gsh, c, ce, wn, sn);
#if !GK_HIP
    if (WAIT && pfb > 0) gv_l2pf<FMT, RW>(W, rp, gsh, cb, ce, pfb); /* while waiting */
    else if (!PF && WAIT && c < ce) /* the first round into L2 while waiting */
#pragma unroll
      for (int r = 0; r < RW; r++) asm volatile("prefetch.global.L2 [%0];" ::"l"((const uint4 *)rp.w[r] + c));
#endif
    if (WAIT) GK_PDL_BEGIN();
    if (XM == 2) gv_stage<FMT, NTK>(xt, kb0, kb1 - kb0);
    const int st = (kb1 - kb0) | 1;
    for (; c < ce; c += 32 * U) {
      uint4 w[U][RW];
      float sc[U][RW];
      if (PF) {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
          for (int r = 0; r < RW; r++) { w[u][r] = wn[u][r]; sc[u][r] = sn[u][r]; }
        if (c + 32 * U < ce) gv_load<FMT, RW, U>(W, rp, gsh, c + 32 * U, ce, wn, sn);
      } else {
        gv_load<FMT, RW, U>(W, rp, gsh, c, ce, w, sc);
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (c + 32 * u >= ce) break;
        gv_chunk<FMT, NTK, XM, RW>(w[u], sc[u], (c + 32 * u) * E, xt, gv_xsm, st, c + 32 * u - kb0, acc);
      }
    }
  } else {
    if (WAIT) GK_PDL_BEGIN();
    const int j1 = min(W.cols, ce * E);
#pragma unroll
    for (int r = 0; r < RW; r++)
      for (int j = cb * E + lane; j < j1; j += 32) {
        const float wv = wl1<FMT>(gu && (r & 1) ? W2 : W, rp.row[r], j);
#pragma unroll
        for (int t = 0; t < NTK; t++) /* no break: hipcc cannot fully unroll loops with two exits */
          if (t < nt) acc[r][t] = fmaf(wv, __ldg(xt[t] + j), acc[r][t]);
      }
  }
#pragma unroll
  for (int r = 0; r < RW; r++)
#pragma unroll
    for (int t = 0; t < NTK; t++) acc[r][t] = warp_sum(acc[r][t]);
}

/* the wk warps of a row group add their slices in slice order (shared
 * memory); true for the warps that hold the sums (lane 0 writes). Every
 * thread of the block calls it. */
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

/* write a warp's rows (virtual rows row0 + r < vrows) for tokens t < nt
 * to yrow[t]: plain, or swiglu of each (gate, up) row pair */
template <int RW, int NTK>
__device__ __forceinline__ void gv_store(const float (*acc)[NTK], float *const *yrow, int row0, int vrows, int nt, bool gu,
                                         float limit) {
#pragma unroll
  for (int r = 0; r < RW; r++) {
    if (row0 + r >= vrows) continue; /* continue, not break: see gv_rows */
#pragma unroll
    for (int t = 0; t < NTK; t++) {
      if (t >= nt) continue;
      if (!gu) yrow[t][row0 + r] = acc[r][t];
      else if (!(r & 1)) yrow[t][(row0 + r) >> 1] = swiglu1(acc[r][t], acc[r + 1][t], limit);
    }
  }
}

/* ---- one launch, several products sharing x ----
 * Blocks are laid out product after product (b0); within a product block
 * lb = split * (nrb * ntg) + tile, tile = row block * ntg + token group.
 * Split-K across blocks (ns > 1): each block stores its partial sums, the
 * last of a tile's ns blocks to arrive (counter) adds them in split order
 * (the order the former separate reduction kernel used, so the same bits)
 * and resets the counter. */
#define GV_MAXE 6
typedef struct {
  gpu_mat W, W2; /* W2: up of a fused gate+up (gu) */
  const float *x;
  float *y, *part;
  unsigned *cnt;
  int ldx, ldy, wk, sl, ns, nrb, b0, gu;
  float limit;
} gv_ent;
enum { GV_EP_NONE, GV_EP_ROUTE, GV_EP_MHC_PRE };
typedef struct {
  gv_ent e[GV_MAXE];
  int n;
  int pfb;        /* gv_rows' L2 prefetch */
  int ep_ent;     /* the entry whose last block runs the epilogue (-1: none) */
  unsigned *done; /* that entry's finished-tile counter */
  gv_route rt;    /* GV_EP_ROUTE */
  gv_mpre mp;     /* GV_EP_MHC_PRE */
} gv_list;
/* The epilogue entry's tiles each count themselves done once their outputs
 * are stored (fence, then the counter); the last one to arrive runs the
 * epilogue on the outputs (read through L2) and resets the counter. The
 * route: one warp per token (dynamic shared memory: ROUTE_WARPS
 * route_smem); the pre: the whole block, one token. */
template <int EP>
__device__ __forceinline__ void gv_epilogue(const gv_list &L, const float *y, int ldy, int n, int tiles) {
  __shared__ int elast;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) elast = atomicAdd(L.done, 1u) == (unsigned)tiles - 1;
  __syncthreads();
  if (!elast) return;
  __threadfence();
  if constexpr (EP == GV_EP_ROUTE) {
    const gv_route &R = L.rt;
    route_smem *S = (route_smem *)gv_xsm;
    const int w = threadIdx.x >> 5;
    if (w < ROUTE_WARPS)
      for (int t = w; t < n; t += ROUTE_WARPS)
        route_token(y + (size_t)t * ldy, R.bias, R.E, R.k, R.G, R.topk_group, R.norm, R.scaling, R.idx + (size_t)t * R.k,
                    R.wt + (size_t)t * R.k, (const gpu_mat *)NULL, 0, n == 1 ? R.grp : (int *)NULL, R.gmax, S[w]);
  } else if constexpr (EP == GV_EP_MHC_PRE) {
    const gv_mpre &M = L.mp;
    mhc_pre_tok<true, false, 4>(M.X, y, (const float *)NULL, M.base, M.scale, M.norm_w, 4, M.D, M.iters, M.hc_eps,
                                M.rms_eps, M.post, M.comb, M.y, M.y16, 0);
  }
  if (threadIdx.x == 0) *L.done = 0;
}

/* EP: the launch's epilogue (GV_EP_*; its own instantiations: the
 * route's and the pre's code take ~80 registers, which the other launches
 * must not carry; the pre's launch, the small mHC projection, gets the
 * registers of two blocks per SM: at three its epilogue spilled) */
template <int FMT, int NTK, int XM, bool PF, int EP = GV_EP_NONE>
__global__ void __launch_bounds__(256, FMT <= GF_BF16 && NTK == 1 && EP != GV_EP_MHC_PRE ? 3 : 2)
    gv_k(const gv_list L, int n, int ntg) {
  constexpr int RW = gv_cfg<FMT, NTK, PF>::RW, E = gv_fmt<FMT>::E;
  __shared__ float red[WARPS * RW * NTK];
  __shared__ int last;
  int ei = 0;
#pragma unroll
  for (int i = 1; i < GV_MAXE; i++)
    if (i < L.n && (int)blockIdx.x >= L.e[i].b0) ei = i;
  const gv_ent &P = L.e[ei]; /* read from the parameter space when used: a register copy spills */
  const int lb = blockIdx.x - P.b0, per = P.nrb * ntg, sp = lb / per, tile = lb % per;
  const int rb = tile / ntg, tg = tile % ntg;
  const int warp = threadIdx.x >> 5, wr = warp / P.wk, kw = warp % P.wk;
  const int rpb = (WARPS / P.wk) * RW, row0 = rb * rpb + wr * RW, vrows = P.gu ? 2 * P.W.rows : P.W.rows;
  const int t0 = tg * NTK, nt = min(NTK, n - t0);
  const int cpr = (P.W.cols + E - 1) / E, cb = min(cpr, (sp * P.wk + kw) * P.sl), ce = min(cpr, cb + P.sl);
  const float *xt[NTK];
#pragma unroll
  for (int t = 0; t < NTK; t++) xt[t] = P.x + (size_t)(t0 + min(t, nt - 1)) * P.ldx;
  float acc[RW][NTK];
  const int kb0 = min(cpr, sp * P.wk * P.sl), kb1 = min(cpr, kb0 + P.wk * P.sl);
  gv_rows<FMT, NTK, XM, PF, true>(P.W, P.W2, P.gu, row0, xt, nt, cb, ce, kb0, kb1, acc, L.pfb);
  const bool has = gv_block_reduce<RW, NTK>(acc, P.wk, kw, wr, red) && !(threadIdx.x & 31);
  if (P.ns == 1) {
    if (has) {
      float *yrow[NTK];
#pragma unroll
      for (int t = 0; t < NTK; t++) yrow[t] = P.y + (size_t)(t0 + t) * P.ldy;
      gv_store<RW, NTK>(acc, yrow, row0, vrows, nt, P.gu, P.limit);
    }
    if (EP && ei == L.ep_ent) gv_epilogue<EP>(L, P.y, P.ldy, n, per);
    return;
  }
  if (has)
#pragma unroll
    for (int r = 0; r < RW; r++) {
      if (row0 + r >= vrows) continue;
#pragma unroll
      for (int t = 0; t < NTK; t++)
        if (t < nt) P.part[((size_t)sp * n + t0 + t) * vrows + row0 + r] = acc[r][t];
    }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(P.cnt + tile, 1u) == (unsigned)P.ns - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int rbase = rb * rpb, step = P.gu ? 2 : 1, nr = min(rpb, vrows - rbase) / step;
  for (int i = threadIdx.x; i < nr * nt; i += blockDim.x) {
    const int t = i / nr, vr = rbase + (i % nr) * step;
    float s0 = 0.f, s1 = 0.f;
    for (int z = 0; z < P.ns; z++) {
      const float *pz = P.part + ((size_t)z * n + t0 + t) * vrows + vr;
      s0 += gk_ldcg(pz);
      if (P.gu) s1 += gk_ldcg(pz + 1);
    }
    float *yo = P.y + (size_t)(t0 + t) * P.ldy;
    if (P.gu) yo[vr >> 1] = swiglu1(s0, s1, P.limit);
    else yo[vr] = s0;
  }
  if (threadIdx.x == 0) P.cnt[tile] = 0;
  if (EP && ei == L.ep_ent) gv_epilogue<EP>(L, P.y, P.ldy, n, per);
}

/* ---- routed experts, one (token, expert) pair per block row ----
 * pair p = blockIdx.y (one token); rows of block blockIdx.x */
template <int FMT, int XM, bool PF>
__global__ void __launch_bounds__(256, FMT <= GF_BF16 ? 3 : 2)
    gv_exp_k(const gpu_mat *wset, int which, int wstride, const int *idx, int k, int xpt, const float *x, int ldx,
             float *y, int ldy, int rows, int only, int wk, int sl) {
  GK_PDL_BEGIN();
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
  const float *xt[1] = {x + (size_t)(xpt ? p / k : p) * ldx};
  gv_rows<FMT, 1, XM, PF, false>(W, W, false, row0, xt, 1, cb, ce, 0, min(cpr, wk * sl), acc, 0);
  if (!gv_block_reduce<RW, 1>(acc, wk, kw, wr, red) || (threadIdx.x & 31)) return;
  float *yrow[1] = {yo};
  gv_store<RW, 1>(acc, yrow, row0, rows, 1, false, 0.f);
}

/* ---- routed experts grouped per expert ----
 * grp (gk_expert_group): [0] the group count, then gmax groups of
 * {expert, pairs (<= NTK), offset into the pair list}, then the pair list
 * (ascending expert, then pair). Block (row block, g) computes group g's
 * pairs as the NTK tokens of one GEMV, so an expert's weights are read
 * once per group; the last block row (g == gmax) writes zeros to the rows
 * of pairs routed to no expert (idx < 0). Per (pair, row) the arithmetic
 * of gv_exp_k (same plan, same lane/chunk order): the same bits.
 * The shared expert (S.r.n > 0, gk_shared_rows) takes the first nsg =
 * ceil(S.r.n / NTK) block rows, NTK of its tokens each, with the same plan
 * and arithmetic; they come first so that they are dispatched first, and
 * they issue their weight loads before the PDL wait (their matrix and its
 * position do not depend on the routing). */
typedef struct {
  gk_shared_rows r; /* r.n == 0: none */
  int nsg;          /* the block rows r takes (gv_grp_launch) */
} gv_shx;
template <int FMT, int NTK, int XM, bool PF>
__global__ void __launch_bounds__(256, FMT <= GF_BF16 && NTK == 1 ? 3 : 2)
    gv_grp_k(const gpu_mat *wset, int which, int gu, float limit, const int *grp, int gmax, const int *idx, int npairs,
             int k, int xpt, const float *x, int ldx, float *y, int ldy, int rows, int wk, int sl, const gv_shx S) {
  constexpr int RW = gv_cfg<FMT, NTK, PF>::RW, E = gv_fmt<FMT>::E;
  __shared__ float red[WARPS * RW * NTK];
  const int warp = threadIdx.x >> 5, wr = warp / wk, kw = warp % wk;
  const int rpb = (WARPS / wk) * RW, row0 = blockIdx.x * rpb + wr * RW, vrows = gu ? 2 * rows : rows;
  float acc[RW][NTK];
  float *yrow[NTK];
  if ((int)blockIdx.y < S.nsg) { /* the shared expert's tokens t0.. */
    const gk_shared_rows &R = S.r;
    const int t0 = blockIdx.y * NTK, nt = min(NTK, R.n - t0);
    const float *xt[NTK];
#pragma unroll
    for (int t = 0; t < NTK; t++) {
      xt[t] = R.x + (size_t)(t0 + min(t, nt - 1)) * R.ldx;
      yrow[t] = R.y + (size_t)(t0 + t) * R.ldy;
    }
    const int cpr = (R.W.cols + E - 1) / E, cb = min(cpr, kw * sl), ce = min(cpr, cb + sl);
    gv_rows<FMT, NTK, XM, PF, true>(R.W, R.W2, gu, row0, xt, nt, cb, ce, 0, min(cpr, wk * sl), acc, 0);
    if (!gv_block_reduce<RW, NTK>(acc, wk, kw, wr, red) || (threadIdx.x & 31)) return;
    gv_store<RW, NTK>(acc, yrow, row0, vrows, nt, gu, limit);
    return;
  }
  GK_PDL_BEGIN(); /* grp, idx and x come from the previous kernels */
  const int g = blockIdx.y - S.nsg;
  if (g == gmax) { /* zeros for unrouted pairs, this block's (real) rows */
    const int rpr = gu ? rpb / 2 : rpb, r0 = blockIdx.x * rpr;
    for (int p = 0; p < npairs; p++)
      if (idx[p] < 0)
        for (int r = threadIdx.x; r < rpr && r0 + r < rows; r += blockDim.x) y[(size_t)p * ldy + r0 + r] = 0.f;
    return;
  }
  if (g >= grp[0]) return;
  const int *gr = grp + 1 + 3 * g, e = gr[0], cnt = gr[1];
  const int *pl = grp + 1 + 3 * gmax + gr[2];
  int pr[NTK];
  const float *xt[NTK];
#pragma unroll
  for (int t = 0; t < NTK; t++) {
    pr[t] = pl[min(t, cnt - 1)];
    xt[t] = x + (size_t)(xpt ? pr[t] / k : pr[t]) * ldx;
  }
  const gpu_mat W = wset[(size_t)e * 3 + which], W2 = gu ? wset[(size_t)e * 3 + which + 1] : W;
  const int cpr = (W.cols + E - 1) / E, cb = min(cpr, kw * sl), ce = min(cpr, cb + sl);
  gv_rows<FMT, NTK, XM, PF, false>(W, W2, gu, row0, xt, cnt, cb, ce, 0, min(cpr, wk * sl), acc, 0);
  if (!gv_block_reduce<RW, NTK>(acc, wk, kw, wr, red) || (threadIdx.x & 31)) return;
#pragma unroll
  for (int t = 0; t < NTK; t++) yrow[t] = y + (size_t)pr[t] * ldy;
  gv_store<RW, NTK>(acc, yrow, row0, vrows, cnt, gu, limit);
}

/* ---- host side ---- */

/* v3 split-K plan: S = wk * ns slices of sl chunks per row, doubling S
 * while the warps (rows / RWP * S) stay under the target and each slice
 * keeps at least one chunk per lane. Depends on (format, rows, cols) and
 * the path only: gk_matmul (maxS 128, target 4096 warps for f32/bf16, 2048
 * for Q8/Q4) or the pair launches (maxS = WARPS, target 2048: the pairs
 * multiply the warps); targets measured on the H200 (docs/gpu.md). A fused
 * gate+up product takes the plan of its gate matrix (the bits of two
 * separate products). */
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

/* the load schedule by format and tokens per block, as measured faster on
 * the H200: bf16 at 1-2 tokens plain (U = 4 without the copy: more warps
 * per SM), everything else pipelined. PLAIN: plain everywhere (bench). */
template <int FMT, int NTK, bool PLAIN> struct gv_pf { static constexpr bool v = !PLAIN && !(FMT == GF_BF16 && NTK <= 2); };
static int x_vec(const float *x, int ldx) { return (uintptr_t)x % 16 == 0 && ldx % 4 == 0; }
/* x staging (gv_stage) at 1-2 tokens per block: 1 (the default) for Q4,
 * 2 for Q8 and Q4, 0 off (GLM53_GPU_GEMV_XS or gk_set_gemv_xs); same bits
 * either way. Q8 is off by default: measured slower on the H200 on 4 of
 * the 7 gpu_gemv shapes (4096 x 8192: 13.3 vs 11.5 us), Q4 20-35% faster. */
static int g_xs = -1;
extern "C" void gk_set_gemv_xs(int on) { g_xs = on < 0 ? -1 : on > 2 ? 2 : on; }
static int xs_on(int fmt) {
  if (g_xs < 0) {
    const char *e = getenv("GLM53_GPU_GEMV_XS");
    g_xs = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "2") ? 2 : 1;
  }
  return g_xs == 2 || (g_xs == 1 && fmt == GF_Q4);
}
/* shared memory of a staged launch whose blocks span up to ncb chunks,
 * 0 when it does not fit (read x from global memory then) */
static size_t xs_smem(int fmt, int ntk, int ncb) {
  const size_t b = gv_xs_bytes(fmt, ntk, ncb);
  return b <= GV_XS_MAX ? b : 0;
}

/* gk_set_gemv_l2pf: bytes per row before the wait, evict-last priority */
static int g_l2pf = -1, g_l2pf_last = 1;
extern "C" void gk_set_gemv_l2pf(int bytes, int last) {
  if (bytes < 0) {
    const char *e = getenv("GLM53_GPU_GEMV_L2PF"), *l = getenv("GLM53_GPU_L2PF_LAST");
    bytes = e && *e ? atoi(e) : 0; /* off until measured on the device (docs/gpu.md) */
    last = !(l && !strcmp(l, "0"));
  }
  g_l2pf = bytes > 0 ? (bytes < (1 << 24) ? bytes : 1 << 24) & ~15 : 0;
  g_l2pf_last = last != 0;
}
extern "C" int gk_gemv_l2pf(void) {
  if (g_l2pf < 0) gk_set_gemv_l2pf(-1, -1);
  return g_l2pf;
}
static int l2pf_param(void) { return gk_gemv_l2pf() > 0 ? g_l2pf | g_l2pf_last : 0; }

template <int FMT, int NTK, bool PLAIN>
static int gv_run(const gv_req *r, int nr, int n) {
  constexpr bool PF = gv_pf<FMT, NTK, PLAIN>::v;
  constexpr int RW = gv_cfg<FMT, NTK, PF>::RW;
  const int ntg = (n + NTK - 1) / NTK;
  for (int i0 = 0; i0 < nr; i0 += GV_MAXE) {
    gv_list L;
    memset(&L, 0, sizeof L);
    L.n = nr - i0 < GV_MAXE ? nr - i0 : GV_MAXE;
    L.pfb = l2pf_param();
    L.ep_ent = -1;
    int ep = GV_EP_NONE;
    long blocks = 0;
    size_t pf = 0, pc = 0; /* partial floats, counters */
    for (int j = 0; j < L.n; j++) {
      const gv_req *q = &r[i0 + j];
      gv_ent *e = &L.e[j];
      e->W = *q->W;
      e->gu = q->W2 != NULL;
      e->W2 = e->gu ? *q->W2 : *q->W;
      e->x = q->x;
      e->ldx = q->ldx;
      e->y = q->y;
      e->ldy = q->ldy;
      e->limit = q->limit;
      if (q->rt || q->mp) {
        if (q->rt) L.rt = *q->rt;
        else L.mp = *q->mp;
        ep = q->rt ? GV_EP_ROUTE : GV_EP_MHC_PRE;
        L.ep_ent = j;
      }
      gv_plan(FMT, q->W->rows, q->W->cols, 128, &e->wk, &e->ns, &e->sl);
      const int vrows = (e->gu ? 2 : 1) * q->W->rows;
      e->nrb = (int)gk_blocks(vrows, (WARPS / e->wk) * RW);
      e->b0 = (int)blocks;
      blocks += (long)e->nrb * ntg * e->ns;
      if (e->ns > 1) {
        e->part = (float *)(uintptr_t)pf; /* offsets until the buffers exist */
        e->cnt = (unsigned *)(uintptr_t)pc;
        pf += (size_t)e->ns * n * vrows;
        pc += (size_t)e->nrb * ntg;
      }
    }
    if (blocks <= 0) continue;
    if (blocks > 0x7fffffffL) return gk_fail("gemv: %ld blocks", blocks);
    const int rt = ep != GV_EP_NONE; /* one counter more, after the tiles' */
    float *part = pf ? gk_scratch_part(pf) : NULL;
    unsigned *cnt = pc + rt ? gk_scratch_counters(pc + rt) : NULL;
    if ((pf && !part) || (pc + rt && !cnt)) return -1;
    L.done = rt ? cnt + pc : NULL;
    for (int j = 0; j < L.n; j++)
      if (L.e[j].ns > 1) {
        L.e[j].part = part + (uintptr_t)L.e[j].part;
        L.e[j].cnt = cnt + (uintptr_t)L.e[j].cnt;
      }
    int xv = 1; /* float4 x loads when every product's x rows allow them */
    for (int j = 0; j < L.n; j++) xv &= x_vec(L.e[j].x, L.e[j].ldx);
    if (rt) { /* (gk_matmul_route / gk_mhc_proj_pre checked the x rows, the schedule and the pre's shape) */
      if (PLAIN || !xv || (ep == GV_EP_MHC_PRE && (FMT != GF_F32 || NTK != 1 || n != 1)))
        return gk_fail("gemv: an epilogue launch needs float4 x rows, the pipelined schedule (and for the pre fp32, one token)");
      if constexpr (!PLAIN) {
        if (ep == GV_EP_ROUTE)
          gk_launch(gv_k<FMT, NTK, 1, PF, GV_EP_ROUTE>, dim3((unsigned)blocks), 256, ROUTE_WARPS * sizeof(route_smem), L, n,
                    ntg);
        else if constexpr (FMT == GF_F32 && NTK == 1)
          gk_launch(gv_k<FMT, NTK, 1, PF, GV_EP_MHC_PRE>, dim3((unsigned)blocks), 256, 0, L, n, ntg);
      }
      continue;
    }
    if constexpr (FMT >= GF_Q8 && NTK <= 2) {
      size_t sm = 0;
      for (int j = 0; j < L.n && xv && xs_on(FMT); j++) {
        const gv_ent *e = &L.e[j];
        const int cpr = (e->W.cols + gv_fmt<FMT>::E - 1) / gv_fmt<FMT>::E, ncb = cpr < e->wk * e->sl ? cpr : e->wk * e->sl;
        const size_t b = xs_smem(FMT, NTK, ncb);
        if (!b) { sm = 0; break; }
        sm = b > sm ? b : sm;
      }
      if (sm) {
        gk_launch(gv_k<FMT, NTK, 2, PF>, dim3((unsigned)blocks), 256, sm, L, n, ntg);
        continue;
      }
    }
    if (xv) gk_launch(gv_k<FMT, NTK, 1, PF>, dim3((unsigned)blocks), 256, 0, L, n, ntg);
    else gk_launch(gv_k<FMT, NTK, 0, PF>, dim3((unsigned)blocks), 256, 0, L, n, ntg);
  }
  return 0;
}
template <int FMT, bool PLAIN> static int gv_run_n(const gv_req *r, int nr, int n) {
  if (n == 1) return gv_run<FMT, 1, PLAIN>(r, nr, n);
  if (n == 2) return gv_run<FMT, 2, PLAIN>(r, nr, n);
  if (n <= 4) return gv_run<FMT, 4, PLAIN>(r, nr, n);
  return gv_run<FMT, 8, PLAIN>(r, nr, n);
}

int gv3_products(const gv_req *r, int nr, int n, int plain) {
  if (n <= 0) return 0;
  gv_req sel[16];
  if (nr > 16) return gk_fail("gemv: %d products in one call (at most 16)", nr);
  for (int fmt = GF_F32; fmt <= GF_Q4; fmt++) {
    int m = 0;
    for (int i = 0; i < nr; i++) {
      const gpu_mat *W = r[i].W;
      if (W->fmt != fmt || W->rows <= 0) continue;
      if (r[i].W2 && (r[i].W2->fmt != W->fmt || r[i].W2->rows != W->rows || r[i].W2->cols != W->cols ||
                      r[i].W2->group != W->group || r[i].W2->scale_bf16 != W->scale_bf16))
        return gk_fail("gemv: fused gate/up matrices differ in shape or format");
      sel[m++] = r[i];
    }
    if (!m) continue;
    int rc;
    switch (fmt) {
    case GF_F32: rc = plain ? gv_run_n<GF_F32, true>(sel, m, n) : gv_run_n<GF_F32, false>(sel, m, n); break;
    case GF_BF16: rc = plain ? gv_run_n<GF_BF16, true>(sel, m, n) : gv_run_n<GF_BF16, false>(sel, m, n); break;
    case GF_Q8: rc = plain ? gv_run_n<GF_Q8, true>(sel, m, n) : gv_run_n<GF_Q8, false>(sel, m, n); break;
    default: rc = plain ? gv_run_n<GF_Q4, true>(sel, m, n) : gv_run_n<GF_Q4, false>(sel, m, n); break;
    }
    if (rc) return -1;
  }
  for (int i = 0; i < nr; i++)
    if (r[i].W->fmt < GF_F32 || r[i].W->fmt > GF_Q4) return gk_fail("matmul: unsupported weight format %d", r[i].W->fmt);
  return GK_LAUNCHED("gemv");
}

int gv3_pairs(const gpu_mat *d_wset, int which, int wstride, int fmt, int rows, int cols, const int *idx, int npairs,
              int k, int xpt, const float *x, int ldx, float *y, int ldy, int only, int plain) {
  int wk = 1, ns = 1, sl = 0;
  gv_plan(fmt, rows, cols, WARPS, &wk, &ns, &sl); /* ns == 1 */
  const int xv = x_vec(x, ldx), cpr = (cols + gv_E(fmt) - 1) / gv_E(fmt);
#define GV_PAIRS(F, PF)                                                                                              \
  {                                                                                                                  \
    constexpr int RW_ = gv_cfg<F, 1, PF>::RW;                                                                     \
    dim3 g3(gk_blocks(rows, (WARPS / wk) * RW_), npairs);                                                          \
    const size_t sm = F >= GF_Q8 && xv && xs_on(F) ? xs_smem(F, 1, cpr < wk * sl ? cpr : wk * sl) : 0;              \
    if (sm) gk_launch(gv_exp_k<F, (F >= GF_Q8 ? 2 : 1), PF>, g3, 256, sm, d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only, wk, sl); \
    else if (xv) gk_launch(gv_exp_k<F, 1, PF>, g3, 256, 0, d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only, wk, sl); \
    else gk_launch(gv_exp_k<F, 0, PF>, g3, 256, 0, d_wset, which, wstride, idx, k, xpt, x, ldx, y, ldy, rows, only, wk, sl); \
  }
#define GV_PAIRS_F(F)                                                                                                \
  if (plain) GV_PAIRS(F, false) else GV_PAIRS(F, (gv_pf<F, 1, false>::v))
  switch (fmt) {
  case GF_F32: GV_PAIRS_F(GF_F32); break;
  case GF_BF16: GV_PAIRS_F(GF_BF16); break;
  case GF_Q8: GV_PAIRS_F(GF_Q8); break;
  case GF_Q4: GV_PAIRS_F(GF_Q4); break;
  default: return gk_fail("batched gemv: unsupported weight format %d", fmt);
  }
#undef GV_PAIRS_F
#undef GV_PAIRS
  return GK_LAUNCHED("batched gemv");
}

/* pairs per group: about the mean pairs per used expert (bits do not
 * depend on it) */
int gk_group_ntk(int npairs, int E) {
  const int used = npairs < E ? npairs : E, avg = used > 0 ? (npairs + used - 1) / used : 1;
  return avg <= 1 ? 1 : avg <= 2 ? 2 : avg <= 4 ? 4 : 8;
}
static int group_max(int npairs, int E, int ntk) {
  const int m = npairs < E ? npairs : E;
  return m + (npairs - m) / ntk;
}
extern "C" int gk_expert_group_max(int npairs, int E) { return group_max(npairs, E, gk_group_ntk(npairs, E)); }
extern "C" size_t gk_expert_group_ints(int npairs, int E) {
  return 1 + 3 * (size_t)group_max(npairs, E, 1) + (size_t)npairs;
}

/* one block: per expert e (threads e, e + blockDim, ...) count its pairs,
 * then (thread 0) the group and pair offsets in ascending expert order,
 * then each expert writes its pairs in ascending order and its groups */
__global__ void expert_group_k(const int *idx, int npairs, int E, int ntk, int gmax, int *grp) {
  GK_PDL_BEGIN();
  extern __shared__ int gsm[]; /* cnt[E], goff[E], poff[E], then idx when it fits */
  int *cnt = gsm, *goff = cnt + E, *poff = goff + E, *sidx = poff + E;
  const bool in_sm = npairs <= 8192;
  const int *id = in_sm ? sidx : idx;
  if (in_sm)
    for (int p = threadIdx.x; p < npairs; p += blockDim.x) sidx[p] = idx[p];
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int c = 0;
    for (int p = 0; p < npairs; p++) c += id[p] == e;
    cnt[e] = c;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int g = 0, q = 0;
    for (int e = 0; e < E; e++) {
      goff[e] = g;
      poff[e] = q;
      g += (cnt[e] + ntk - 1) / ntk;
      q += cnt[e];
    }
    grp[0] = g;
  }
  __syncthreads();
  int *pairs = grp + 1 + 3 * gmax;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int c = cnt[e], q = poff[e];
    if (!c) continue;
    for (int p = 0, w = 0; p < npairs && w < c; p++)
      if (id[p] == e) pairs[q + w++] = p;
    for (int i = 0, g = goff[e]; i < c; i += ntk, g++) {
      grp[1 + 3 * g] = e;
      grp[2 + 3 * g] = c - i < ntk ? c - i : ntk;
      grp[3 + 3 * g] = q + i;
    }
  }
}
extern "C" int gk_expert_group(const int *idx, int npairs, int E, int *grp) {
  if (npairs <= 0) return 0;
  if (E <= 0 || E > 4096) return gk_fail("expert grouping: %d experts", E);
  const int ntk = gk_group_ntk(npairs, E);
  const size_t sm = (3 * (size_t)E + (npairs <= 8192 ? npairs : 0)) * sizeof(int);
  if (sm > 48 * 1024) return gk_fail("expert grouping: %zu bytes of shared memory", sm);
  gk_launch(expert_group_k, 1, 256, sm, idx, npairs, E, ntk, group_max(npairs, E, ntk), grp);
  return GK_LAUNCHED("expert group");
}

template <int FMT, int NTK, bool PLAIN>
static void gv_grp_launch(const gpu_mat *d_wset, int which, int gu, float limit, int rows, int cols, const int *grp,
                          int gmax, const int *idx, int npairs, int k, int xpt, const float *x, int ldx, float *y,
                          int ldy, gv_shx S) {
  constexpr bool PF = gv_pf<FMT, NTK, PLAIN>::v;
  int wk = 1, ns = 1, sl = 0;
  gv_plan(FMT, rows, cols, WARPS, &wk, &ns, &sl); /* the plan of gv3_pairs (ns == 1) */
  constexpr int RW = gv_cfg<FMT, NTK, PF>::RW;
  S.nsg = S.r.n > 0 ? (S.r.n + NTK - 1) / NTK : 0;
  dim3 grid(gk_blocks((gu ? 2 : 1) * rows, (WARPS / wk) * RW), S.nsg + gmax + 1);
  const int xv = x_vec(x, ldx) && (S.r.n <= 0 || x_vec(S.r.x, S.r.ldx));
  if constexpr (FMT >= GF_Q8 && NTK <= 2) {
    const int cpr = (cols + gv_fmt<FMT>::E - 1) / gv_fmt<FMT>::E;
    const size_t sm = xv && xs_on(FMT) ? xs_smem(FMT, NTK, cpr < wk * sl ? cpr : wk * sl) : 0;
    if (sm) {
      gk_launch(gv_grp_k<FMT, NTK, 2, PF>, grid, 256, sm, d_wset, which, gu, limit, grp, gmax, idx, npairs, k, xpt, x, ldx, y, ldy, rows, wk, sl, S);
      return;
    }
  }
  if (xv)
    gk_launch(gv_grp_k<FMT, NTK, 1, PF>, grid, 256, 0, d_wset, which, gu, limit, grp, gmax, idx, npairs, k, xpt, x, ldx, y, ldy, rows, wk, sl, S);
  else
    gk_launch(gv_grp_k<FMT, NTK, 0, PF>, grid, 256, 0, d_wset, which, gu, limit, grp, gmax, idx, npairs, k, xpt, x, ldx, y, ldy, rows, wk, sl, S);
}
template <int FMT, bool PLAIN>
static void gv_grp_n(int ntk, const gpu_mat *d_wset, int which, int gu, float limit, int rows, int cols, const int *grp,
                     int gmax, const int *idx, int npairs, int k, int xpt, const float *x, int ldx, float *y, int ldy,
                     const gv_shx &S) {
#define GV_G(N) gv_grp_launch<FMT, N, PLAIN>(d_wset, which, gu, limit, rows, cols, grp, gmax, idx, npairs, k, xpt, x, ldx, y, ldy, S)
  if (ntk == 1) GV_G(1);
  else if (ntk == 2) GV_G(2);
  else if (ntk == 4) GV_G(4);
  else GV_G(8);
#undef GV_G
}

int gv3_grouped(const gpu_mat *d_wset, int which, int gu, float limit, int fmt, int rows, int cols, const int *grp,
                const int *idx, int npairs, int E, int k, int xpt, const float *x, int ldx, float *y, int ldy,
                const gk_shared_rows *sh, int plain) {
  if (npairs < 0 || rows <= 0 || (npairs == 0 && !sh)) return 0;
  /* a shared-only launch (npairs 0) takes the shared tokens' own width */
  const int ntk = npairs ? gk_group_ntk(npairs, E) : gk_group_ntk(sh->n, 1),
            gmax = npairs ? group_max(npairs, E, ntk) : 0;
  gv_shx S;
  memset(&S, 0, sizeof S);
  if (sh) {
    if (sh->W.fmt != fmt || sh->W.rows != rows || sh->W.cols != cols ||
        (gu && (sh->W2.fmt != fmt || sh->W2.rows != rows || sh->W2.cols != cols)))
      return gk_fail("grouped experts: the shared expert's matrix is not the routed experts' shape and format");
    S.r = *sh;
    if (!gu) S.r.W2 = sh->W;
  }
#define GV_GF(F)                                                                                                     \
  if (plain) gv_grp_n<F, true>(ntk, d_wset, which, gu, limit, rows, cols, grp, gmax, idx, npairs, k, xpt, x, ldx, y, ldy, S); \
  else gv_grp_n<F, false>(ntk, d_wset, which, gu, limit, rows, cols, grp, gmax, idx, npairs, k, xpt, x, ldx, y, ldy, S)
  switch (fmt) {
  case GF_F32: GV_GF(GF_F32); break;
  case GF_BF16: GV_GF(GF_BF16); break;
  case GF_Q8: GV_GF(GF_Q8); break;
  case GF_Q4: GV_GF(GF_Q4); break;
  default: return gk_fail("grouped experts: unsupported weight format %d", fmt);
  }
#undef GV_GF
  return GK_LAUNCHED("grouped experts");
}

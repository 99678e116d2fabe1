/* The KDA delta-rule recurrence's tile staging (shared by both token
 * kernels) and its 8-lanes-per-column kernel. Apart from gk_layers.cu so
 * that tests/unit/test_kda_recur_emu.cpp can run them on the host through
 * tests/emu/cuda_emu.h: the includer provides gk_device.cuh, float4,
 * __shfl_xor_sync, __shfl_sync and GK_PDL_BEGIN. */
#ifndef GLM53_GPU_GK_KDA_RECUR_CUH
#define GLM53_GPU_GK_KDA_RECUR_CUH

/* MODE: how g gives the decay a = exp(gate): 0 g is the log decay, 1 g is
 * the raw gate projection (kda_gate1), 2 g is the decay itself and bl is
 * beta itself (not its logit) */
enum { KR_LOG = 0, KR_RAW = 1, KR_DECAY = 2 };

#if !GK_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define KR_CP_ASYNC 1
#else
#define KR_CP_ASYNC 0
#endif
__device__ __forceinline__ void kr_cp16(float *sm, const float *g) {
#if KR_CP_ASYNC
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(sm)), "l"(g) : "memory");
#else
  *(float4 *)sm = *(const float4 *)g;
#endif
}
__device__ __forceinline__ void kr_cp4(float *sm, const float *g) {
#if KR_CP_ASYNC
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((unsigned)__cvta_generic_to_shared(sm)), "l"(g) : "memory");
#else
  *sm = *g;
#endif
}
__device__ __forceinline__ void kr_commit(void) {
#if KR_CP_ASYNC
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void kr_wait(void) {
#if KR_CP_ASYNC
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
/* floats of one tile buffer: q, k, a [TT][hd], v [TT][cols], beta [TT] */
__host__ __device__ __forceinline__ size_t kr_tile_floats(int hd, int tt, int cols) {
  return ((size_t)tt * (3 * hd + cols + 1) + 3) & ~(size_t)3;
}

/* What a block's tiles come from: head h, the block's value columns from
 * c0, TT tokens per tile (the token kernels' launch arguments) */
struct kr_src {
  const float *qkv, *g, *dt_bias, *A_log, *bl;
  float lb;
  int H, hd, h, c0, TT;
};
/* Tile of nt tokens from token tb into buf (layout of kr_tile_floats): q, k
 * and the decay of head h, v of the block's COLS columns from c0 (zeros
 * past hd), beta. ASYNC: cp.async of 16-byte rows (the decay given, not the
 * raw gate), committed by the caller; else one coalesced pass computing
 * the decay (MODE) as it reads. */
template <int MODE, bool ASYNC, int COLS>
__device__ __forceinline__ void kr_load(const kr_src &sr, int tb, int nt, float *buf) {
  const int H = sr.H, hd = sr.hd, h = sr.h, c0 = sr.c0, TT = sr.TT, inner = H * hd, nth = blockDim.x;
  const float *qkv = sr.qkv, *g = sr.g, *bl = sr.bl;
  float *qs = buf, *ks = qs + (size_t)TT * hd, *as = ks + (size_t)TT * hd, *vs = as + (size_t)TT * hd,
        *bs = vs + (size_t)TT * COLS;
  if (ASYNC) {
    const int q4 = hd / 4;
    for (int e = threadIdx.x; e < nt * q4; e += nth) {
      const int u = e / q4, i = 4 * (e - u * q4);
      const size_t t = (size_t)tb + u;
      const float *row = qkv + t * 3 * inner + h * hd + i;
      kr_cp16(qs + u * hd + i, row);
      kr_cp16(ks + u * hd + i, row + inner);
      kr_cp16(as + u * hd + i, g + t * inner + h * hd + i);
    }
    for (int e = threadIdx.x; e < nt * (COLS / 4); e += nth) {
      const int u = e / (COLS / 4), jj = 4 * (e - u * (COLS / 4)), j = c0 + jj;
      if (j < hd) kr_cp16(vs + u * COLS + jj, qkv + ((size_t)tb + u) * 3 * inner + 2 * inner + h * hd + j);
      else *(float4 *)(vs + u * COLS + jj) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int e = threadIdx.x; e < nt; e += nth) kr_cp4(bs + e, bl + ((size_t)tb + e) * H + h);
  } else {
    for (int e = threadIdx.x; e < nt * hd; e += nth) {
      const int u = e / hd, i = e - u * hd;
      const size_t t = (size_t)tb + u;
      const float *row = qkv + t * 3 * inner;
      qs[e] = row[h * hd + i];
      ks[e] = row[inner + h * hd + i];
      const float gv = g[t * inner + h * hd + i];
      as[e] = MODE == KR_DECAY ? gv
                               : expf(MODE == KR_RAW ? kda_gate1(gv, sr.dt_bias, sr.A_log, h, h * hd + i, sr.lb) : gv);
    }
    for (int e = threadIdx.x; e < nt * COLS; e += nth) {
      const int u = e / COLS, j = c0 + (e - u * COLS);
      vs[e] = j < hd ? qkv[((size_t)tb + u) * 3 * inner + 2 * inner + h * hd + j] : 0.f;
    }
    for (int e = threadIdx.x; e < nt; e += nth) bs[e] = bl[((size_t)tb + e) * H + h];
  }
}
/* The tile pipeline of both token kernels over tokens [t0, T): kr_first
 * before the loop (ASYNC: the first tile's copy issued), kr_tile at the
 * top of tile n (from token tb), which returns that tile's buffer in sh.
 * ASYNC: two buffers of tf floats, the next tile's copy issued and this
 * one's awaited; else this tile loaded between two barriers. After its
 * tokens an ASYNC tile needs a barrier: its buffer is the next copy's
 * target. */
template <int MODE, bool ASYNC, int COLS>
__device__ __forceinline__ void kr_first(const kr_src &sr, int t0, int T, float *sh) {
  if (ASYNC && t0 < T) {
    kr_load<MODE, true, COLS>(sr, t0, T - t0 < sr.TT ? T - t0 : sr.TT, sh);
    kr_commit();
  }
}
template <int MODE, bool ASYNC, int COLS>
__device__ __forceinline__ float *kr_tile(const kr_src &sr, int tb, int T, int n, float *sh, size_t tf) {
  const int TT = sr.TT;
  float *cur = sh + (ASYNC && (n & 1) ? tf : 0);
  if (ASYNC) {
    if (tb + TT < T) {
      kr_load<MODE, true, COLS>(sr, tb + TT, T - tb - TT < TT ? T - tb - TT : TT, sh + ((n & 1) ? 0 : tf));
      kr_commit();
      kr_wait<1>();
    } else {
      kr_wait<0>();
    }
    __syncthreads();
  } else {
    __syncthreads(); /* the previous tile is consumed */
    kr_load<MODE, false, COLS>(sr, tb, T - tb < TT ? T - tb : TT, cur);
    __syncthreads();
  }
  return cur;
}

/* ---- 8 lanes per column ----
 * The 32-lanes-per-column kernel (gk_layers.cu kda_recur_k) spends most of
 * its issue slots on 32-lane reductions (191 instructions per token and
 * warp for 4 columns' 64 products per lane, ncu). Here a column's hd rows
 * are spread over the 8 lanes of a lane group (MM = hd / 8 rows each: lane
 * s of the group holds rows 32 q + 4 s + e, so the group's 16-byte shared
 * loads of q, k and the decay are 128 contiguous bytes), a group holds C
 * columns (a warp's four groups 4 C), and a column's sum is 3 shuffle
 * stages within the group (C = 1 needs no shuffle to share it back).
 * Per lane the products of a column run in MM / 4 partial sums of 4 rows
 * (fixed tree), so the FMA chains are short. Blocks of NW warps hold
 * KR8_COLS = 64 columns (two blocks per head at hd = 128: the q, k and
 * decay tiles are staged once per 64 columns instead of per 16). Every
 * token's arithmetic is the same whatever the tiling: decode (T = 1, the
 * gate transformed as the tile is read) and prefill (the decay
 * precomputed) agree bitwise. Needs hd == 8 MM with MM % 4 == 0. */
#define KR8_COLS 64
/* C columns per lane: after kr8_reduce lane s of a group holds the sum of
 * the group's column kr8_col(s); kr8_lane(c) is a lane holding column c */
template <int C> __device__ __forceinline__ int kr8_col(int s) {
  return C == 4 ? ((s >> 2) & 1) * 2 + ((s >> 1) & 1) : C == 2 ? (s >> 2) & 1 : 0;
}
template <int C> __device__ __forceinline__ int kr8_lane(int c) { return C == 4 ? (c >> 1) * 4 + (c & 1) * 2 : C == 2 ? c * 4 : 0; }
/* the 8-lane sums of column kr8_col(s) from two sets of C per-lane
 * partials, x and y, stage by stage so that their shuffles overlap (the
 * lanes sharing a column get the same bits: each stage adds a pair both
 * ways) */
template <int C> __device__ __forceinline__ void kr8_reduce2(const float *x, const float *y, int s, float *rx, float *ry) {
  const bool u4 = s & 4, u2 = s & 2;
  float a, b;
  if (C == 4) {
    float wa[2], wb[2];
#pragma unroll
    for (int c = 0; c < 2; c++) {
      const float sa = __shfl_xor_sync(0xffffffffu, u4 ? x[c] : x[c + 2], 4);
      const float sb = __shfl_xor_sync(0xffffffffu, u4 ? y[c] : y[c + 2], 4);
      wa[c] = (u4 ? x[c + 2] : x[c]) + sa;
      wb[c] = (u4 ? y[c + 2] : y[c]) + sb;
    }
    const float sa = __shfl_xor_sync(0xffffffffu, u2 ? wa[0] : wa[1], 2);
    const float sb = __shfl_xor_sync(0xffffffffu, u2 ? wb[0] : wb[1], 2);
    a = (u2 ? wa[1] : wa[0]) + sa;
    b = (u2 ? wb[1] : wb[0]) + sb;
  } else {
    if (C == 2) {
      const float sa = __shfl_xor_sync(0xffffffffu, u4 ? x[0] : x[1], 4);
      const float sb = __shfl_xor_sync(0xffffffffu, u4 ? y[0] : y[1], 4);
      a = (u4 ? x[1] : x[0]) + sa;
      b = (u4 ? y[1] : y[0]) + sb;
    } else {
      const float sa = __shfl_xor_sync(0xffffffffu, x[0], 4), sb = __shfl_xor_sync(0xffffffffu, y[0], 4);
      a = x[0] + sa;
      b = y[0] + sb;
    }
    const float sa = __shfl_xor_sync(0xffffffffu, a, 2), sb = __shfl_xor_sync(0xffffffffu, b, 2);
    a += sa;
    b += sb;
  }
  const float sa = __shfl_xor_sync(0xffffffffu, a, 1), sb = __shfl_xor_sync(0xffffffffu, b, 1);
  *rx = a + sa;
  *ry = b + sb;
}
/* sum of the MM products of one lane's rows: MM / 4 chains of 4, then a
 * fixed pairwise tree */
template <int MM> __device__ __forceinline__ float kr8_tree(float *r) {
#pragma unroll
  for (int st = 1; st < MM / 4; st *= 2)
#pragma unroll
    for (int q = 0; q + st < MM / 4; q += 2 * st) r[q] += r[q + st];
  return r[0];
}
/* the lane's MM rows of a shared or global vector (hd == 8 MM) */
template <int MM> __device__ __forceinline__ void kr8_rows(const float *v, int s, float *out) {
#pragma unroll
  for (int q = 0; q < MM / 4; q++) {
    const float4 x = *(const float4 *)(v + 32 * q + 4 * s);
    out[4 * q] = x.x, out[4 * q + 1] = x.y, out[4 * q + 2] = x.z, out[4 * q + 3] = x.w;
  }
}
/* ---- 16 or 32 lanes per column (layouts x4, x2, y4) ----
 * The same per-column sums with each column's rows over LP = 16 or 32
 * lanes: the bits of a lane above its 8-lane group index (u = lane >> 3
 * within the column's lanes) pick which of kr8_tree's MM / 4 chains it
 * holds (chains u NQ .. u NQ + NQ - 1, NQ = MM / 4 / (LP / 8)), so its own
 * tree is the subtree of those chains; the first shuffle stages (lanes 8,
 * then 16 apart) add the subtrees level by level, which are kr8_tree's
 * last levels, and kr8_reduce2's stages follow: every column's sum is the
 * same tree of the same products, so x4, x2 and y4 give g4's bits. Two or
 * four times the warps per block for the same columns (the recurrence is
 * latency-bound at one warp per scheduler in g4) and fewer registers per
 * lane. Needs MM / 4 >= LP / 8 (x: head dims 64, 128; y: 128). */
/* the lane's MM * 8 / LP rows of a shared or global vector */
template <int MM, int LP> __device__ __forceinline__ void krx_rows(const float *v, int lane, float *out) {
  constexpr int NQ = MM / 4 / (LP / 8);
  const int s = lane & 7, u = (lane >> 3) & (LP / 8 - 1);
#pragma unroll
  for (int q = 0; q < NQ; q++) {
    const float4 x = *(const float4 *)(v + 32 * (q + u * NQ) + 4 * s);
    out[4 * q] = x.x, out[4 * q + 1] = x.y, out[4 * q + 2] = x.z, out[4 * q + 3] = x.w;
  }
}
/* after krx_reduce2 the lane holds the sum of column krx_col(lane) of its
 * C; krx_lane(c) is a lane (within the column's LP) holding column c. Each
 * stage above bit 2 keeps the upper half of the lane's columns where the
 * stage's bit is set. */
template <int C, int LP> __device__ __forceinline__ int krx_col(int lane) {
  int col = 0, cc = C;
#pragma unroll
  for (int b = 3; (1 << b) < LP; b++)
    if (cc > 1) col += ((lane >> b) & 1) * (cc / 2), cc /= 2;
  return col + (cc == 4 ? kr8_col<4>(lane & 7) : cc == 2 ? kr8_col<2>(lane & 7) : 0);
}
template <int C, int LP> __device__ __forceinline__ int krx_lane(int c) {
  int lane = 0, cc = C;
#pragma unroll
  for (int b = 3; (1 << b) < LP; b++)
    if (cc > 1) {
      const int hi = c >= cc / 2;
      lane |= hi << b, c -= hi * (cc / 2), cc /= 2;
    }
  return lane + (cc == 4 ? kr8_lane<4>(c) : cc == 2 ? kr8_lane<2>(c) : 0);
}
/* the LP-lane sums: the stage of lane bit B (lanes 2^B apart; columns C /
 * 2 .. C - 1 go to the lane with the bit set), the next bit, then
 * kr8_reduce2 */
template <int C, int LP, int B = 3>
__device__ __forceinline__ void krx_reduce2(const float *x, const float *y, int lane, float *rx, float *ry) {
  if constexpr ((1 << B) >= LP) kr8_reduce2<C>(x, y, lane & 7, rx, ry);
  else {
    constexpr int CH = C > 1 ? C / 2 : 1;
    const bool u = (lane >> B) & 1;
    float hx[CH], hy[CH];
#pragma unroll
    for (int c = 0; c < CH; c++) {
      if (C > 1) {
        const float sa = __shfl_xor_sync(0xffffffffu, u ? x[c] : x[c + CH], 1 << B);
        const float sb = __shfl_xor_sync(0xffffffffu, u ? y[c] : y[c + CH], 1 << B);
        hx[c] = (u ? x[c + CH] : x[c]) + sa;
        hy[c] = (u ? y[c + CH] : y[c]) + sb;
      } else {
        hx[c] = x[c] + __shfl_xor_sync(0xffffffffu, x[c], 1 << B);
        hy[c] = y[c] + __shfl_xor_sync(0xffffffffu, y[c], 1 << B);
      }
    }
    krx_reduce2<CH, LP, B + 1>(hx, hy, lane, rx, ry);
  }
}
/* The gated RMSNorm of one (token, head) output row by one warp
 * (gk_layers.cu kda_out_k): w * o / rms(o) * sigmoid(z), o in place or in
 * bf16 into ob; o read through L2 (in the recurrence's fused form the
 * head's other block wrote part of it) */
__device__ __forceinline__ void kda_out_row(float *o, const float *z, const float *w, size_t base, int hd, float eps,
                                            uint16_t *ob, int lane) {
  float ss = 0;
  for (int i = lane; i < hd; i += 32) {
    const float x = gk_ldcg(o + base + i);
    ss += x * x;
  }
  ss = warp_sum(ss);
  const float r = 1.0f / sqrtf(ss / hd + eps);
  for (int i = lane; i < hd; i += 32) {
    const float v = (w[i] * (gk_ldcg(o + base + i) * r)) * sigm(z[base + i]);
    if (ob) ob[base + i] = (uint16_t)bf16_bits(v);
    else o[base + i] = v;
  }
}
/* the gated norm done by the recurrence (kda_recur8_k's OUT form): the
 * norm's inputs, and a counter per (segment, head), zero between launches */
typedef struct {
  const float *z, *w;
  uint16_t *ob;
  unsigned *cnt;
  float eps;
} kr_out;

/* threads per block of 64 columns: 16 / C warps with 8 lanes per column,
 * 32 / C with 16, 64 / C with 32 */
template <int C, int LP = 8> __host__ __device__ constexpr int kr8_threads() { return 32 * (LP / 8) * (16 / C); }

/* grid (H, ceil(hd / KR8_COLS), nseg), kr8_threads<C, LP>() threads; the
 * shared tiles as kr_tile_floats(hd, TT, KR8_COLS), twice when ASYNC. LP:
 * lanes per column, 8, 16 or 32 (above). OUT: the head's last block to
 * finish (ko.cnt) applies the gated norm to the segment's output rows of
 * the head (kda_out_row, gk_kda_out's arithmetic: the same bits), one
 * launch fewer per KDA layer. */
template <int MODE, int MM, bool ASYNC, int C, int LP = 8, bool OUT = false>
__global__ void __launch_bounds__((kr8_threads<C, LP>())) kda_recur8_k(gk_batch b, const float *qkv, const float *g,
                                                                     const float *dt_bias, const float *A_log, float lb,
                                                                     const float *bl, int H, int TT, float *o,
                                                                     const kr_out ko) {
  GK_PDL_BEGIN();
  /* C >= LP / 8: every stage above bit 2 halves the lane's columns (else
   * the lanes sharing a column are not the ones olane assumes) */
  static_assert(LP == 8 || ((LP == 16 || LP == 32) && MM / 4 >= LP / 8 && C >= LP / 8), "16 or 32 lanes per column");
  enum { HD = 8 * MM, CPW = (32 / LP) * C, MR = MM * 8 / LP }; /* MR rows per lane */
  GK_DYN_SMEM(float, kr8_sh);
  const int h = blockIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31, s = lane & 7, gp = lane / LP;
  const int u = (lane >> 3) & (LP / 8 - 1); /* which of a column's 8-lane groups (16 or 32 lanes per column) */
  const int c0 = blockIdx.y * KR8_COLS, cl = w * CPW + gp * C; /* the lane's first column, block-local */
  const int my = cl + (LP == 8 ? kr8_col<C>(s) : krx_col<C, LP>(lane)); /* the column whose sums the lane ends with */
  auto rows = [&](const float *v, float *out) {
    if (LP == 8) kr8_rows<MM>(v, s, out);
    else krx_rows<MM, LP>(v, lane, out);
  };
  const gk_seg sg = b.seg[blockIdx.z];
  const int t0 = sg.t0, T = t0 + sg.len, inner = H * HD;
  float *S = sg.ls[b.layer].p[GK_ST_S];
  const size_t tf = kr_tile_floats(HD, TT, KR8_COLS);
  float st[C][MR];
#pragma unroll
  for (int c = 0; c < C; c++) {
    const int j = c0 + cl + c;
    if (j < HD) rows(S + ((size_t)h * HD + j) * HD, st[c]);
    else
#pragma unroll
      for (int m = 0; m < MR; m++) st[c][m] = 0.f;
  }
  const kr_src src{qkv, g, dt_bias, A_log, bl, lb, H, HD, h, c0, TT};
  kr_first<MODE, ASYNC, KR8_COLS>(src, t0, T, kr8_sh);
  /* the previous token's S^T q partials: reduced together with this
   * token's S^T k (the output is off the recurrence's critical path, its
   * shuffles overlap those of the next token); tp is that token, -1 none */
  float po[C];
#pragma unroll
  for (int c = 0; c < C; c++) po[c] = 0.f;
  int tp = -1;
  const bool olane = (lane & (LP / C - 1)) == 0 && c0 + my < HD; /* one lane per column stores */
  const size_t ocol = (size_t)h * HD + c0 + my;
  int n = 0;
  for (int tb = t0; tb < T; tb += TT, n++) {
    const int nt = T - tb < TT ? T - tb : TT;
    const float *cur = kr_tile<MODE, ASYNC, KR8_COLS>(src, tb, T, n, kr8_sh, tf);
    const float *qs = cur, *ks = qs + (size_t)TT * HD, *as = ks + (size_t)TT * HD, *vs = as + (size_t)TT * HD,
                *bs = vs + (size_t)TT * KR8_COLS;
    for (int k = 0; k < nt; k++) {
      float av[MR], kv[MR], qv[MR], p[C];
      rows(as + k * HD, av);
      rows(ks + k * HD, kv);
      rows(qs + k * HD, qv);
      if (ASYNC && MODE == KR_LOG) /* the async copy is raw */
#pragma unroll
        for (int m = 0; m < MR; m++) av[m] = expf(av[m]);
#pragma unroll
      for (int c = 0; c < C; c++) {
        float r[MR / 4];
#pragma unroll
        for (int q = 0; q < MR / 4; q++) {
          r[q] = 0.f;
#pragma unroll
          for (int e = 0; e < 4; e++) {
            st[c][4 * q + e] *= av[4 * q + e];
            r[q] += st[c][4 * q + e] * kv[4 * q + e];
          }
        }
        p[c] = kr8_tree<MR>(r);
      }
      float r, ov;
      if (LP == 8) kr8_reduce2<C>(p, po, s, &r, &ov);
      else krx_reduce2<C, LP>(p, po, lane, &r, &ov);
      if (tp >= 0 && olane) o[(size_t)tp * inner + ocol] = ov;
      const float delta = (MODE == KR_DECAY ? bs[k] : sigm(bs[k])) * (vs[k * KR8_COLS + my] - r);
#pragma unroll
      for (int c = 0; c < C; c++) {
        const float d = C == 1 ? delta
                               : __shfl_sync(0xffffffffu, delta, gp * LP + (LP == 8 ? kr8_lane<C>(c) : krx_lane<C, LP>(c)));
        float oo[MR / 4];
#pragma unroll
        for (int q = 0; q < MR / 4; q++) {
          oo[q] = 0.f;
#pragma unroll
          for (int e = 0; e < 4; e++) {
            st[c][4 * q + e] += kv[4 * q + e] * d;
            oo[q] += st[c][4 * q + e] * qv[4 * q + e];
          }
        }
        po[c] = kr8_tree<MR>(oo);
      }
      tp = tb + k;
    }
    if (ASYNC) __syncthreads(); /* cur is the target of the copy issued next round */
  }
  if (tp >= 0) { /* the last token's output (tp is the same in every thread) */
    float r, ov;
    if (LP == 8) kr8_reduce2<C>(po, po, s, &r, &ov);
    else krx_reduce2<C, LP>(po, po, lane, &r, &ov);
    if (olane) o[(size_t)tp * inner + ocol] = ov;
  }
#pragma unroll
  for (int c = 0; c < C; c++) {
    const int j = c0 + cl + c;
    if (j >= HD) continue;
    float *Sj = S + ((size_t)h * HD + j) * HD;
#pragma unroll
    for (int q = 0; q < MR / 4; q++)
      *(float4 *)(Sj + 32 * (q + u * (MR / 4)) + 4 * s) =
          make_float4(st[c][4 * q], st[c][4 * q + 1], st[c][4 * q + 2], st[c][4 * q + 3]);
  }
  if constexpr (OUT) { /* the head's blocks count themselves done (fence, then the counter); the last one normalises */
    __shared__ int olast;
    unsigned *cnt = ko.cnt + (size_t)blockIdx.z * H + h;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) olast = atomicAdd(cnt, 1u) == gridDim.y - 1;
    __syncthreads();
    if (!olast) return;
    __threadfence();
    for (int t = t0 + w; t < T; t += (int)(blockDim.x >> 5))
      kda_out_row(o, ko.z, ko.w, (size_t)t * inner + (size_t)h * HD, HD, ko.eps, ko.ob, lane);
    if (threadIdx.x == 0) *cnt = 0;
  }
}
#endif

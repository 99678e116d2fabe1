/* The mHC projection of long chunks on tensor cores: mixraw[t][o] = fn[o]
 * . X_t (24 outputs) and ssq[t] = X_t . X_t, as gk_mhc_proj's SIMT kernel
 * (mhc_proj_k in gk_layers.cu) computes them, which is bound by shared-
 * memory reads of fn (one 16-byte read per 8 FMAs; ~225 us per call on an
 * H100 for 4096 tokens of 4 x 4096 floats against ~90 us to read X once).
 *
 * Arithmetic: 3xTF32 on mma.sync m16n8k8 (fp32 accumulation): x = hi + lo
 * with hi = tf32(x), lo = tf32(x - hi), and likewise fn; x . f = hi.hi +
 * hi.lo + lo.hi, ~2^-21 relative per product (lo.lo dropped): fp32-level
 * accuracy, not fp32's bits.
 *
 * Layout: a warp takes 16 tokens, a block 4 warps (64 tokens) and one
 * split of MT_COLS columns (grid.y splits: the split count depends on the
 * width only, so a token's sums never depend on the chunk it came in). A
 * lane loads float4s: X rows g and g + 8 and fn rows 8 j + g (j < 3) at
 * columns 4 t .. 4 t + 3 of each 16; since a dot product may visit its k
 * in any order (the same for both operands), float4 element 0 / 1 are
 * logical k t / t + 4 of one k8 step and elements 2 / 3 of the next. Each
 * split writes partial sums part[s][t][25] (24 outputs, then the sum of
 * squares); mhc_proj_sum_k adds the splits in order: deterministic.
 *
 * Apart from gk_layers.cu so that tests/unit/test_mhc_tc_emu.cpp can run
 * it on the host through tests/emu/cuda_emu.h (GK_EMU: emulated cvt.rna
 * and mma.sync). CUDA only: the HIP build keeps the SIMT kernel. The
 * includer provides __shfl_xor_sync, float4, GK_PDL_BEGIN and
 * gk_mhc_post.cuh. */
#ifndef GLM53_GPU_GK_MHC_TC_CUH
#define GLM53_GPU_GK_MHC_TC_CUH

/* columns per split: 512 gives a 4096-token chunk of the model's 16384
 * columns 2048 blocks, 2.6 waves of 6 blocks per SM (80 registers); 1024
 * left the second of two waves half empty (H100: 172 us per call) */
#define MT_COLS 512
#define MT_MIX 24    /* outputs (the 4-stream mHC's (2 + hc) hc) */
#define MT_PART 25   /* floats per (split, token): the outputs, the sum of squares */

static inline int mt_splits(int n) { return (n + MT_COLS - 1) / MT_COLS; }

/* fp32 -> tf32 (round to nearest, ties away), as an fp32 bit pattern */
__device__ __forceinline__ uint32_t mt_tf32(float x) {
#ifdef GK_EMU
  return emu_cvt_rna_tf32(x);
#else
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
#endif
}
/* c[16x8] += a[16x8] . b[8x8], tf32 in, fp32 accumulate */
__device__ __forceinline__ void mt_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#ifdef GK_EMU
  emu_mma_tf32_1688(c, a, b0, b1);
#else
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
__device__ __forceinline__ void mt_split(float x, uint32_t *hi, uint32_t *lo) {
  *hi = mt_tf32(x);
  *lo = mt_tf32(x - __uint_as_float(*hi));
}
/* one k8 step: a = X rows (g, g + 8) at logical k (t, t + 4); f = fn row
 * 8 j + g at (t, t + 4) for j < 3 */
__device__ __forceinline__ void mt_step(float c[3][4], float a0, float b0, float a1, float b1, const float (*f)[2]) {
  uint32_t ah[4], al[4];
  mt_split(a0, &ah[0], &al[0]);
  mt_split(b0, &ah[1], &al[1]);
  mt_split(a1, &ah[2], &al[2]);
  mt_split(b1, &ah[3], &al[3]);
#pragma unroll
  for (int j = 0; j < 3; j++) {
    uint32_t fh0, fl0, fh1, fl1;
    mt_split(f[j][0], &fh0, &fl0);
    mt_split(f[j][1], &fh1, &fl1);
    mt_mma(c[j], al, fh0, fh1);
    mt_mma(c[j], ah, fl0, fl1);
    mt_mma(c[j], ah, fh0, fh1);
  }
}

/* a warp's partial sums of split s for its rows ra / rb (lane quad t4):
 * the sums of squares added over the quad (lanes 4 g .. 4 g + 3 share
 * rows), the mma fragments c stored by output */
__device__ __forceinline__ void mt_store(float *part, int s, int T, int ra, int rb, bool oka, bool okb, int t4,
                                         const float (*c)[4], float *ss) {
#pragma unroll
  for (int e = 0; e < 2; e++) {
    ss[e] += __shfl_xor_sync(0xffffffffu, ss[e], 1);
    ss[e] += __shfl_xor_sync(0xffffffffu, ss[e], 2);
  }
  float *pa = part + ((size_t)s * T + ra) * MT_PART, *pb = part + ((size_t)s * T + rb) * MT_PART;
#pragma unroll
  for (int j = 0; j < 3; j++) {
    const int o = 8 * j + 2 * t4;
    if (oka) pa[o] = c[j][0], pa[o + 1] = c[j][1];
    if (okb) pb[o] = c[j][2], pb[o + 1] = c[j][3];
  }
  if (t4 == 0 && oka) pa[MT_MIX] = ss[0];
  if (t4 == 0 && okb) pb[MT_MIX] = ss[1];
}

/* NV float4s of a row per lane and step: NV 1, a warp's step reads 64
 * contiguous bytes of each of its 32 rows (16 columns; the first kernel);
 * NV 2 (GLM53_GPU_MHC_K32=1), 128 bytes (32 columns: whole 128-byte lines,
 * twice the bytes in flight per warp, 4 blocks per SM). A lane's float4 v
 * holds columns 4 (NV t + v) .. + 3: logical k t / t + 4 of two k8 steps,
 * in fn as in X. */
template <int NV = 1>
__global__ void __launch_bounds__(128, NV == 1 ? 6 : 4) mhc_proj_tc_k(const float *X, const float *fn, int T, int n,
                                                                      float *part) {
  GK_PDL_BEGIN();
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int t0 = (blockIdx.x * 4 + w) * 16, s = blockIdx.y, c0 = s * MT_COLS, c1 = min(n, c0 + MT_COLS);
  if (t0 >= T) return;
  const int ra = t0 + g, rb = t0 + g + 8;
  const bool oka = ra < T, okb = rb < T;
  const float *xa = X + (size_t)(oka ? ra : t0) * n, *xb = X + (size_t)(okb ? rb : t0) * n;
  const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
  float c[3][4], ss[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 3; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
  float4 a[NV], b[NV], f[3][NV];
  auto load = [&](int cb) { /* n % 4 == 0: a float4 is all in or all out */
#pragma unroll
    for (int v = 0; v < NV; v++) {
      const int col = cb + 4 * (NV * t4 + v);
      const bool ok = col < c1;
      a[v] = ok && oka ? __ldg((const float4 *)(xa + col)) : z4;
      b[v] = ok && okb ? __ldg((const float4 *)(xb + col)) : z4;
#pragma unroll
      for (int j = 0; j < 3; j++) f[j][v] = ok ? __ldg((const float4 *)(fn + (size_t)(8 * j + g) * n + col)) : z4;
    }
  };
  load(c0);
#pragma unroll(NV == 1 ? 2 : 1)
  for (int cb = c0; cb < c1; cb += 16 * NV) {
    float4 ca[NV], cbv[NV], cf[3][NV];
#pragma unroll
    for (int v = 0; v < NV; v++) {
      ca[v] = a[v], cbv[v] = b[v];
#pragma unroll
      for (int j = 0; j < 3; j++) cf[j][v] = f[j][v];
    }
    if (cb + 16 * NV < c1) load(cb + 16 * NV); /* the next step's loads in flight during this one's products */
#pragma unroll
    for (int v = 0; v < NV; v++) {
      ss[0] += ca[v].x * ca[v].x;
      ss[0] += ca[v].y * ca[v].y;
      ss[0] += ca[v].z * ca[v].z;
      ss[0] += ca[v].w * ca[v].w;
      ss[1] += cbv[v].x * cbv[v].x;
      ss[1] += cbv[v].y * cbv[v].y;
      ss[1] += cbv[v].z * cbv[v].z;
      ss[1] += cbv[v].w * cbv[v].w;
      const float f01[3][2] = {{cf[0][v].x, cf[0][v].y}, {cf[1][v].x, cf[1][v].y}, {cf[2][v].x, cf[2][v].y}};
      const float f23[3][2] = {{cf[0][v].z, cf[0][v].w}, {cf[1][v].z, cf[1][v].w}, {cf[2][v].z, cf[2][v].w}};
      mt_step(c, ca[v].x, cbv[v].x, ca[v].y, cbv[v].y, f01);
      mt_step(c, ca[v].z, cbv[v].z, ca[v].w, cbv[v].w, f23);
    }
  }
  mt_store(part, s, T, ra, rb, oka, okb, t4, c, ss);
}

/* ---- the mHC post fused with the next site's projection ----
 * At prefill the post (gk_mhc_post / gk_mhc_post_moe) writes the new
 * streams and the next projection reads them back: the fused kernel
 * computes the post where the projection loads its operands (the same
 * per-element arithmetic as mhc_post_k, gk_mhc_post.cuh: the same bits of
 * X), stores them and feeds them to the 3xTF32 products. Its splits are
 * MT_DCOLS hidden columns of all four streams (a block reads every old
 * stream value of its columns once), so its partial sums group the columns
 * otherwise than mhc_proj_tc_k's: equal within fp32, deterministic, and a
 * token's sums still do not depend on its chunk (the split count depends on
 * the width only). hc = 4 (24 outputs), D % 4 == 0, at most MT_KMAX experts
 * per token. 128 threads: 4 warps of 16 tokens; 168 registers, three
 * blocks per SM. Opt-in (gk_mhc_post_proj): it saves one read of X per
 * site but measured 5 ms slower per 4096-token prefill than the post and
 * mhc_proj_tc_k apart (H200, eleventh session), which run at more warps
 * per SM. */
#define MT_DCOLS 128
#define MT_KMAX 8
static inline int mt_dsplits(int D) { return (D + MT_DCOLS - 1) / MT_DCOLS; }
/* the block's fn columns in shared memory, row stride MT_FS floats (the 16
 * of padding put a quarter-warp's two rows in different banks) */
#define MT_FS (4 * MT_DCOLS + 16)
#define MT_FN_SMEM ((size_t)MT_MIX * MT_FS * sizeof(float))

template <bool MOE>
__global__ void __launch_bounds__(128, 3) mhc_post_proj_tc_k(float *X, const float *a, const float *eo, const int *erow,
                                                              const int *idx, const float *wt, int k, const float *post,
                                                              const float *comb, const float *fn, int T, int D, float *part) {
  GK_PDL_BEGIN();
  GK_DYN_SMEM(float, fs); /* [MT_MIX][MT_FS]: fn at columns h D + d0 + i as h MT_DCOLS + i */
  __shared__ float pc[64][20]; /* per token: post[4], comb[16] (stride 20: a warp's 8 tokens in 8 banks) */
  __shared__ float mw[MOE ? 64 : 1][MT_KMAX];
  __shared__ int mr[MOE ? 64 : 1][MT_KMAX], mn[MOE ? 64 : 1];
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3, n = 4 * D;
  const int tb = blockIdx.x * 64, s = blockIdx.y, d0 = s * MT_DCOLS, d1 = min(D, d0 + MT_DCOLS);
  for (int e = tid; e < MT_MIX * MT_DCOLS; e += 128) { /* float4 e: row o, stream h, columns 4 i4 .. */
    const int o = e / MT_DCOLS, h = (e / (MT_DCOLS / 4)) % 4, i = 4 * (e % (MT_DCOLS / 4));
    *(float4 *)(fs + o * MT_FS + h * MT_DCOLS + i) =
        d0 + i < d1 ? __ldg((const float4 *)(fn + (size_t)o * n + h * D + d0 + i)) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  for (int e = tid; e < 64 * 20; e += 128) {
    const int u = e / 20, j = e % 20, t = tb + u;
    pc[u][j] = t >= T ? 0.f : j < 4 ? post[(size_t)t * 4 + j] : comb[(size_t)t * 16 + j - 4];
  }
  if (MOE && tid < 64) { /* moe_sum's order: the first pair of each distinct id >= 0, ascending id */
    const int t = tb + tid;
    int cnt = 0;
    if (t < T) {
      const int *id = idx + (size_t)t * k;
      for (int last = -1, best; (best = moe_next(id, k, &last)) >= 0;) {
        const size_t p = (size_t)t * k + best;
        mw[tid][cnt] = wt[p];
        mr[tid][cnt] = erow ? erow[p] : (int)p;
        cnt++;
      }
    }
    mn[tid] = cnt;
  }
  __syncthreads();
  const int ua = w * 16 + g, ub = ua + 8, ra = tb + ua, rb = tb + ub;
  if (tb + w * 16 >= T) return;
  const bool oka = ra < T, okb = rb < T;
  const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
  float c[3][4], ss[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < 3; j++) c[j][0] = c[j][1] = c[j][2] = c[j][3] = 0.f;
#pragma unroll 1
  for (int cb = d0; cb < d1; cb += 16) {
    const int col = cb + 4 * t4;
    const bool ok = col < d1; /* D % 4 == 0: a float4 is all in or all out */
    float oa[4][4], ob[4][4], ya[4], yb[4];
#pragma unroll
    for (int h = 0; h < 4; h++) {
      const float4 x = ok && oka ? *(const float4 *)(X + (size_t)ra * n + h * D + col) : z4;
      const float4 y = ok && okb ? *(const float4 *)(X + (size_t)rb * n + h * D + col) : z4;
      oa[h][0] = x.x, oa[h][1] = x.y, oa[h][2] = x.z, oa[h][3] = x.w;
      ob[h][0] = y.x, ob[h][1] = y.y, ob[h][2] = y.z, ob[h][3] = y.w;
    }
    const float4 va = ok && oka ? *(const float4 *)(a + (size_t)ra * D + col) : z4;
    const float4 vb = ok && okb ? *(const float4 *)(a + (size_t)rb * D + col) : z4;
    ya[0] = va.x, ya[1] = va.y, ya[2] = va.z, ya[3] = va.w;
    yb[0] = vb.x, yb[1] = vb.y, yb[2] = vb.z, yb[3] = vb.w;
    if (MOE && ok) { /* a row's expert outputs loaded together, then added in order */
#pragma unroll
      for (int rr = 0; rr < 2; rr++) {
        const int u = rr ? ub : ua, cnt = mn[u];
        float4 e4[MT_KMAX];
#pragma unroll
        for (int r = 0; r < MT_KMAX; r++) e4[r] = r < cnt ? *(const float4 *)(eo + (size_t)mr[u][r] * D + col) : z4;
#pragma unroll
        for (int r = 0; r < MT_KMAX; r++)
          if (r < cnt) {
            const float e[4] = {e4[r].x, e4[r].y, e4[r].z, e4[r].w};
            mhc_post_add<4>(rr ? yb : ya, mw[u][r], e);
          }
      }
    }
    /* stream by stream: the new values (all old streams stay live), stored,
     * then their products with fn's columns h D + col */
#pragma unroll
    for (int h = 0; h < 4; h++) {
      float na[4], nb[4];
      mhc_post_mix<4, 4>(oa, ya, pc[ua][h], &pc[ua][4], 4, h, na);
      mhc_post_mix<4, 4>(ob, yb, pc[ub][h], &pc[ub][4], 4, h, nb);
      if (ok && oka) *(float4 *)(X + (size_t)ra * n + h * D + col) = make_float4(na[0], na[1], na[2], na[3]);
      if (ok && okb) *(float4 *)(X + (size_t)rb * n + h * D + col) = make_float4(nb[0], nb[1], nb[2], nb[3]);
      float4 f[3];
#pragma unroll
      for (int j = 0; j < 3; j++) f[j] = *(const float4 *)(fs + (8 * j + g) * MT_FS + h * MT_DCOLS + col - d0);
#pragma unroll
      for (int v = 0; v < 4; v++) {
        ss[0] += na[v] * na[v];
        ss[1] += nb[v] * nb[v];
      }
      const float f01[3][2] = {{f[0].x, f[0].y}, {f[1].x, f[1].y}, {f[2].x, f[2].y}};
      const float f23[3][2] = {{f[0].z, f[0].w}, {f[1].z, f[1].w}, {f[2].z, f[2].w}};
      mt_step(c, na[0], nb[0], na[1], nb[1], f01);
      mt_step(c, na[2], nb[2], na[3], nb[3], f23);
    }
  }
  mt_store(part, s, T, ra, rb, oka, okb, t4, c, ss);
}

/* mixraw[t][o] / ssq[t] = the splits' partial sums, added in split order */
__global__ void mhc_proj_sum_k(const float *part, int S, int T, float *mixraw, float *ssq) {
  GK_PDL_BEGIN();
  const size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)T * MT_PART) return;
  const size_t t = i / MT_PART;
  const int o = (int)(i % MT_PART);
  float v = 0.f;
  for (int s = 0; s < S; s++) v += part[(size_t)s * T * MT_PART + i];
  if (o < MT_MIX) mixraw[t * MT_MIX + o] = v;
  else ssq[t] = v;
}

#endif

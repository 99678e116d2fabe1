/* The fused (flash) attention of the per-head MLA form on Hopper's
 * warpgroup products (wgmma, sm_90a): the same arithmetic and selection as
 * mla_flash_k (gk_mla_flash.cuh: scores q . (K hi + K lo), output P hi .
 * V hi + P lo . V hi + P hi . V lo, online base-2 softmax, the per-token
 * pool bitmap), a different division of the work:
 *
 * - a block of two warpgroups takes 128 tokens of one head, a warpgroup 64
 *   of them and a warp 16, so every row's scores, maximum and sum stay in
 *   one quad of lanes (no exchange between warps);
 * - key tiles of 64 rows. The scores are 2 NOPE / 16 products m64n64k16
 *   with q and K hi | lo both read by the tensor cores from shared memory
 *   (q's descriptors reused for the K lo half); the output is 3 x 4
 *   products m64n{VD}k16 with the probabilities as register A operands (the
 *   score accumulators turned into bf16 hi and lo fragments in place, as
 *   FlashAttention-3 does) and V hi / V lo read transposed from shared
 *   memory. The mma.sync kernel reads every K and V fragment once per 16
 *   rows through ldmatrix; here once per 64 rows, and half the K / V bytes
 *   per (token, key) are copied;
 * - q (128 rows), one K tile and one V tile in shared memory (193 KB at the
 *   model's widths, one block per SM): the V tile loads (cp.async) while the
 *   scores run, the next K tile while the output products run;
 * - or (BN 32, GLM53_GPU_MLA_FLASH_WG_BN=32) key tiles of 32 rows in two
 *   stages (the same 193 KB): tile j + 1's K and V load during all of tile
 *   j's work, behind one barrier per tile instead of two.
 *
 * Shared layouts: the 128-byte swizzle (mw_cfg says why). The includer provides
 * gk_device.cuh (bf16_bits), gk_wgmma.cuh, gk_mla_flash.cuh (mf_cp16,
 * mf_commit, mf_wait_all, mf_wait_prior, mf_split), __shfl_xor_sync and GK_PDL_BEGIN. */
#ifndef GLM53_GPU_GK_MLA_FLASH_WG_CUH
#define GLM53_GPU_GK_MLA_FLASH_WG_CUH

#define MW_BM 128 /* tokens per block: two warpgroups of 64 */
#define MW_THREADS 256

/* Shared layouts: the 128-byte swizzle of gk_wgmma.cuh (mw_sw128_off),
 * every tile 1024-byte aligned. q and K are K-major: 8 k-atoms of 64 bf16
 * per row (K hi | lo; q 4), each tile's rows (SBO 1024) one atom column
 * after another. V is MN-major: a key's V hi | lo row in atoms of 64
 * columns (LBO BN x 128), 8 keys per atom (SBO 1024). With this layout
 * 8 consecutive threads copy 128 consecutive bytes of a row into 128
 * consecutive bytes of shared memory: the no-swizzle core matrices (16
 * bytes of 8 rows contiguous) made each warp's cp.async of 512 contiguous
 * bytes split per thread, 2x the L2 sectors (16-byte halves) and 8x the
 * shared wavefronts, which bounded the kernel (ncu on an H100, fourteenth
 * session: L2 84% busy, the kernel at 2.6 ms without its copies against
 * 4.8 ms with them). */
template <int NOPE, int VD, int BN = 64> struct mw_cfg {
  static_assert(NOPE % 64 == 0 && (VD == 32 || VD % 64 == 0), "whole swizzle atoms (V lo at VD 32: half an atom's row)");
  static_assert(BN == 64 || BN == 32, "keys per tile: 64 (one stage) or 32 (two)");
  static constexpr int ST = BN == 64 ? 1 : 2;                                  /* stages of K and V tiles */
  static constexpr int QCH = NOPE / 8, KCH = 2 * NOPE / 8, VCH = 2 * VD / 8; /* 16-byte chunks per row */
  static constexpr int QB = MW_BM * NOPE * 2, KB = BN * 2 * NOPE * 2, VB = BN * 2 * VD * 2;
  static constexpr int VLBO = BN * 128; /* V: between atoms along the columns */
  static constexpr size_t smem = (size_t)QB + ST * (KB + VB) + 1024; /* + the alignment of the first tile */
};

template <int VD> __device__ __forceinline__ void mw_rs(float *d, const uint32_t *a, uint64_t db);
template <> __device__ __forceinline__ void mw_rs<256>(float *d, const uint32_t *a, uint64_t db) { mw_rs_n256(d, a, db); }
template <> __device__ __forceinline__ void mw_rs<32>(float *d, const uint32_t *a, uint64_t db) { mw_rs_n32(d, a, db); }

/* The mask's common case: a row's keys k0 .. k0 + n - 1 (k0 a multiple of
 * n, n a multiple of 16) with no causal edge (all <= pos) and no tail edge
 * (all selected, or all below the tail with pools of 2+ rows). Their pools
 * are then consecutive bits of one bitmap word, and a thread's keys 8 i +
 * 2 t4 (+ 1) from k0 share one pool: mw_pool_bits shifts the word so that
 * mw_key8_sel(bits, i) is its bit. (The mma.sync kernel keeps the per-key
 * tests: this path took it past its 128-register cap into spills.) */
__device__ __forceinline__ bool mw_edge_free(int k0, int n, int pos, bool all, int tail, int pshift) {
  return k0 + n - 1 <= pos && (all || (pshift > 0 && k0 + n <= tail));
}
__device__ __forceinline__ uint32_t mw_pool_bits(uint32_t word, int k0, int pshift, int t4) {
  return (word >> ((k0 >> pshift) & 31)) >> (pshift <= 3 ? (2 * t4) >> pshift : 0);
}
__device__ __forceinline__ bool mw_key8_sel(uint32_t bits, int i, int pshift) { return bits >> ((8 * i) >> pshift) & 1; }

/* Timing diagnostics (bench/gpu/gpu_mla.c only; results are wrong): DG
 * bits leave out a stage: 1 the K / V copies after the first tile, 2 the
 * score products, 4 the output products, 8 the mask and softmax (the
 * scores split as they are). 16 (same results; an A/B of the order, not
 * yet measured) issues the next K tile right after the score products,
 * behind a third barrier per tile, so that it loads during the softmax
 * too; without it the next K tile loads during the output products only. */
enum { MW_DG_COPY = 1, MW_DG_SCORE = 2, MW_DG_OUT = 4, MW_DG_SOFTMAX = 8, MW_DG_EARLYK = 16 };

/* out[t][h][VD]: as mla_flash_k (same arguments, and hg); grid ((T + 127)
 * / 128 x H) blocks in one dimension, in groups of hg heads (hg divides
 * H): a group's token tiles, longest first, each tile for the group's
 * heads in turn (hg 1: one head's tiles after another, so the blocks that
 * run together read the same K / V rows) */
template <int NOPE, int VD, int DG = 0, int BN = 64>
__global__ void __launch_bounds__(MW_THREADS, 1)
    mla_flash_wg_k(const uint16_t *Q16, const uint16_t *KV3, const int *dense, const int *tail, const uint32_t *map, int nw,
                   const int *dpos, int T, int H, int pshift, int lrows, float sl2, int hg, void *out, int out16) {
  GK_PDL_BEGIN();
#if MW_WGMMA
  using C = mw_cfg<NOPE, VD, BN>;
  static_assert(C::ST == 1 || !(DG & MW_DG_EARLYK), "the early K tile is a one-stage order");
  GK_DYN_SMEM(uint4, mw_sm);
  /* stage u's K tile at Ks + u SB, its V tile KB after it */
  constexpr int SB = C::KB + C::VB;
  char *const Qs = (char *)mw_sm + ((1024u - (mw_saddr(mw_sm) & 1023u)) & 1023u), *const Ks = Qs + C::QB,
              *const Vs = Ks + C::KB;
  const int ntile = (T + MW_BM - 1) / MW_BM, grp = (int)blockIdx.x / (hg * ntile), r = (int)blockIdx.x - grp * hg * ntile;
  const int tA = (ntile - 1 - r / hg) * MW_BM, h = grp * hg + r % hg;
  const int tid = threadIdx.x, wg = tid >> 7, w = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int pos0 = *dpos, ldh = 2 * (NOPE + VD);
  const int nkt = (pos0 + min(tA + MW_BM, T) - 1) / BN + 1;
  /* this warpgroup's rows: none past T (then it only helps load), the last
   * position it attends from (later key tiles are skipped) */
  const int wt0 = tA + 64 * wg, wlast = wt0 < T ? pos0 + min(wt0 + 63, T - 1) : -1;
  int rpos[2], rden[2], rtail[2];
  const uint32_t *rmap[2];
#pragma unroll
  for (int e = 0; e < 2; e++) {
    const int t = wt0 + 16 * w + g + 8 * e, ok = t < T;
    rpos[e] = ok ? pos0 + t : -1;
    rden[e] = ok ? dense[t] : 1;
    rtail[e] = ok ? tail[t] : 0;
    rmap[e] = map + (size_t)(ok ? t : 0) * nw;
  }
  /* copies: consecutive threads take consecutive 16-byte chunks of a row */
  for (int i = tid; i < MW_BM * C::QCH; i += MW_THREADS) {
    const int r = i / C::QCH, c = i % C::QCH, t = tA + r;
    mf_cp16(Qs + mw_sw128_off(c, r, MW_BM), Q16 + ((size_t)(t < T ? t : 0) * H + h) * NOPE + c * 8, t < T);
  }
  /* key tile j into stage j % ST */
  auto load_k = [&](int j) {
    char *const kd = Ks + (j % C::ST) * SB;
    auto cp = [&](int i) {
      const int r = i / C::KCH, c = i % C::KCH, n = j * BN + r;
      mf_cp16(kd + mw_sw128_off(c, r, BN), KV3 + ((size_t)(n < lrows ? n : 0) * H + h) * ldh + c * 8, n < lrows);
    };
    if (DG & MW_DG_EARLYK) { /* issued while a tile's scores are live: not unrolled (registers) */
#pragma unroll 1
      for (int i = tid; i < BN * C::KCH; i += MW_THREADS) cp(i);
    } else
      for (int i = tid; i < BN * C::KCH; i += MW_THREADS) cp(i);
  };
  auto load_v = [&](int j) {
    char *const vd = Vs + (j % C::ST) * SB;
    for (int i = tid; i < BN * C::VCH; i += MW_THREADS) {
      const int r = i / C::VCH, c = i % C::VCH, n = j * BN + r;
      mf_cp16(vd + mw_sw128_off(c, r, BN), KV3 + ((size_t)(n < lrows ? n : 0) * H + h) * ldh + 2 * NOPE + c * 8,
              n < lrows);
    }
  };
  /* descriptors at k step 0: q of this warpgroup (its 64 rows of each
   * atom column), K, V hi and V lo (column VD: atom VD / 64, + 2 (VD % 64)
   * bytes into its rows); a k step of q / K is 32 bytes into an atom's rows
   * (4 per atom), a key step of V two 8-key groups (2048 bytes) */
  const uint64_t dq = mw_desc_sw128(Qs + 64 * wg * 128, 16, 1024), dk = mw_desc_sw128(Ks, 16, 1024);
  const uint64_t dvh = mw_desc_sw128(Vs, C::VLBO, 1024),
                 dvl = mw_desc_sw128(Vs + (VD / 64) * C::VLBO + (VD % 64) * 2, C::VLBO, 1024);
  float o[VD / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < VD / 2; i++) o[i] = 0.f;
  load_k(0);
  if (C::ST == 2) load_v(0);
  mf_commit();
  for (int j = 0; j < nkt; j++) {
    const bool act = j * BN <= wlast; /* uniform over the warpgroup */
    /* this tile's stage: descriptor addresses are in 16-byte units */
    const uint64_t so = (uint64_t)((j % C::ST) * (SB / 16));
    mf_wait_all();
    mw_proxy_fence();
    /* one stage: K tile j (and q) in, both warpgroups done with V tile
     * j - 1; two: K and V tile j in, both warpgroups done with tile j - 1,
     * whose stage tile j + 1 takes: it loads during all of this tile's work.
     * (Issued after the score products instead, the loads split their
     * commit from their wait: ptxas then serialized the products.) */
    __syncthreads();
    if (C::ST == 1 && (!(DG & MW_DG_COPY) || j == 0)) load_v(j);
    if (C::ST == 2 && j + 1 < nkt && !(DG & MW_DG_COPY)) {
      load_k(j + 1);
      load_v(j + 1);
    }
    mf_commit();
    uint32_t ph[BN / 16][4], pl[BN / 16][4];
    float s[BN / 2];
    /* the tile's bitmap words, loaded before the products so that their
     * latency hides behind them: the tile's pools lie in two consecutive
     * words (one unless P = 1) */
    const int w0 = (j * BN) >> pshift >> 5;
    uint32_t mw[2][2];
    if (act) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const bool all = rden[e] || j * BN >= rtail[e];
        mw[e][0] = all ? 0u : __ldg(rmap[e] + w0);
        mw[e][1] = all || w0 + 1 >= nw ? 0u : __ldg(rmap[e] + w0 + 1);
      }
#pragma unroll
      for (int i = 0; i < BN / 2; i++) s[i] = 0.f;
      mw_fence();
#pragma unroll
      for (int kk = 0; kk < 2 * NOPE / 16; kk++)
        if (!(DG & MW_DG_SCORE)) {
          const int qk = kk % (NOPE / 16); /* descriptor units of 16 bytes: */
          const uint64_t da = dq + (uint64_t)((qk >> 2) * (MW_BM * 128 / 16) + (qk & 3) * 2),
                         db = dk + so + (uint64_t)((kk >> 2) * (BN * 128 / 16) + (kk & 3) * 2);
          if (BN == 64) mw_ss_n64(s, da, db, kk > 0);
          else mw_ss_n32(s, da, db, kk > 0);
        }
      mw_commit();
      mw_wait0();
#pragma unroll
      for (int i = 0; i < BN / 2; i++) mw_keep(s[i]);
    }
    /* MW_DG_EARLYK: once both warpgroups are done with K tile j, the next
     * one loads during this tile's softmax as well as its output products
     * (the kernel ran about as long as its copies alone plus its products
     * alone: fourteenth session) */
    if (DG & MW_DG_EARLYK) {
      __syncthreads();
      if (j + 1 < nkt && !(DG & MW_DG_COPY)) load_k(j + 1);
      mf_commit(); /* a group even when empty: V tile j is then the one before the newest */
    }
    if (act) {
      /* mask and online softmax per row (the quad holds the row's 64 keys) */
#pragma unroll
      for (int e = 0; e < 2 && (DG & MW_DG_SOFTMAX); e++)
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
          mf_split(s[4 * i + 2 * e], s[4 * i + 2 * e + 1], &ph[i >> 1][2 * (i & 1) + e], &pl[i >> 1][2 * (i & 1) + e]);
#pragma unroll
      for (int e = 0; e < 2 && !(DG & MW_DG_SOFTMAX); e++) {
        const bool all = rden[e] || j * BN >= rtail[e]; /* no pool lookups in this tile */
        const uint32_t m0 = mw[e][0], m1 = mw[e][1];
        float tmax = -INFINITY;
        if (mw_edge_free(j * BN, BN, rpos[e], all, rtail[e], pshift)) {
          /* most tiles (mw_edge_free): the pool bits from the first word, one
           * shift per 8 keys instead of the per-key tests */
          const uint32_t tb = all ? ~0u : mw_pool_bits(m0, j * BN, pshift, t4);
#pragma unroll
          for (int i = 0; i < BN / 8; i++) {
            const bool sel = all || mw_key8_sel(tb, i, pshift);
#pragma unroll
            for (int c = 0; c < 2; c++) {
              const float v = sel ? s[4 * i + 2 * e + c] * sl2 : -INFINITY;
              s[4 * i + 2 * e + c] = v;
              tmax = fmaxf(tmax, v);
            }
          }
        } else {
#pragma unroll
          for (int i = 0; i < BN / 8; i++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
              const int n = j * BN + 8 * i + 2 * t4 + c, p = n >> pshift;
              const bool sel = n <= rpos[e] && (all || n >= rtail[e] || (((p >> 5) == w0 ? m0 : m1) >> (p & 31) & 1));
              const float v = sel ? s[4 * i + 2 * e + c] * sl2 : -INFINITY;
              s[4 * i + 2 * e + c] = v;
              tmax = fmaxf(tmax, v);
            }
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
        const float mn = fmaxf(m[e], tmax), mu = mn == -INFINITY ? 0.f : mn, alpha = exp2f(m[e] - mu);
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < BN / 8; i++) {
          const float p0 = exp2f(s[4 * i + 2 * e] - mu), p1 = exp2f(s[4 * i + 2 * e + 1] - mu);
          sum += p0;
          sum += p1;
          /* A fragment of key step i / 2: a[e] (keys 0-7 of the step) or a[2 + e] (keys 8-15) */
          mf_split(p0, p1, &ph[i >> 1][2 * (i & 1) + e], &pl[i >> 1][2 * (i & 1) + e]);
        }
        l[e] = l[e] * alpha + sum;
        m[e] = mn;
        if (alpha != 1.f) /* once the row's maximum settles, most tiles: x 1 is exact, skip it */
#pragma unroll
          for (int i = 0; i < VD / 8; i++) {
            o[4 * i + 2 * e] *= alpha;
            o[4 * i + 2 * e + 1] *= alpha;
          }
      }
    }
    if (C::ST == 1) {
      if (DG & MW_DG_EARLYK) mf_wait_prior();
      else mf_wait_all();
      mw_proxy_fence();
      __syncthreads(); /* V tile j in (EARLYK: K tile j + 1 may still be loading); both warpgroups done with K tile j */
      if (!(DG & MW_DG_EARLYK) && j + 1 < nkt && !(DG & MW_DG_COPY)) {
        load_k(j + 1);
        mf_commit();
      }
    }
    if (act) {
      mw_fence();
#pragma unroll
      for (int kv = 0; kv < BN / 16 && !(DG & MW_DG_OUT); kv++) { /* a key step: 2 x 1024 bytes = 128 units */
        mw_rs<VD>(o, ph[kv], dvh + so + (uint64_t)(kv * 128));
        mw_rs<VD>(o, pl[kv], dvh + so + (uint64_t)(kv * 128));
        mw_rs<VD>(o, ph[kv], dvl + so + (uint64_t)(kv * 128));
      }
      mw_commit();
      mw_wait0();
#pragma unroll
      for (int i = 0; i < VD / 2; i++) mw_keep(o[i]);
    }
  }
#pragma unroll
  for (int e = 0; e < 2; e++) {
    float z = l[e];
    z += __shfl_xor_sync(0xffffffffu, z, 1);
    z += __shfl_xor_sync(0xffffffffu, z, 2);
    const int t = wt0 + 16 * w + g + 8 * e;
    const float inv = z > 0 ? 1.0f / z : 0.f;
    if (t >= T) continue;
    const size_t at = ((size_t)t * H + h) * VD + 2 * t4;
    if (out16) /* bf16 rows (the output product's x: gk_matmul_xb16) */
#pragma unroll
      for (int i = 0; i < VD / 8; i++)
        *(uint32_t *)((uint16_t *)out + at + 8 * i) =
            bf16_bits(o[4 * i + 2 * e] * inv) | bf16_bits(o[4 * i + 2 * e + 1] * inv) << 16;
    else
#pragma unroll
      for (int i = 0; i < VD / 8; i++)
        *(float2 *)((float *)out + at + 8 * i) = make_float2(o[4 * i + 2 * e] * inv, o[4 * i + 2 * e + 1] * inv);
  }
#else
  (void)Q16; (void)KV3; (void)dense; (void)tail; (void)map; (void)nw; (void)dpos; (void)T; (void)H; (void)pshift;
  (void)lrows; (void)sl2; (void)out; (void)out16;
  __trap(); /* not built for sm_90a: the host never launches it (gk_mla_flash_wg_available) */
#endif
}

#endif

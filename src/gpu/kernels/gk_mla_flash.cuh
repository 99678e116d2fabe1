/* The fused (flash) attention kernel of the per-head MLA form and its
 * selection bitmap (gk_mla_flash.cu has the design and the launch). Apart
 * so that tests/unit/test_mla_flash_emu.cpp can run them on the host
 * through tests/emu/cuda_emu.h, which provides the warp's ldmatrix and
 * mma.sync (GK_EMU; cp.async becomes a plain copy there). The includer
 * provides gk_device.cuh (bf16_bits), __shfl_xor_sync and GK_PDL_BEGIN.
 * CUDA only: the HIP build leaves it out. */
#ifndef GLM53_GPU_GK_MLA_FLASH_CUH
#define GLM53_GPU_GK_MLA_FLASH_CUH

#define MF_BM 64 /* tokens per block: 4 row groups of 16 */

/* BN keys per tile (32 or 64): 32, the default, leaves room (shared
 * memory, <= 128 registers) for two blocks per SM at the model's widths;
 * 64 halves the barriers and rescales per key but fits one */
template <int NOPE, int VD, int BN> struct mf_cfg {
  static constexpr int LQ = NOPE + 8;     /* shared row strides in bf16: q */
  static constexpr int LK = 2 * NOPE + 8; /* K hi | lo */
  static constexpr int LV = 2 * VD + 8;   /* V hi | lo */
  static constexpr int LP = BN + 8;       /* probabilities, hi and lo planes */
  static constexpr size_t smem =
      (size_t)(MF_BM * LQ + BN * LK + BN * LV + 2 * MF_BM * LP) * 2 + (size_t)2 * MF_BM * sizeof(float);
};
#define MF_THREADS 256 /* 8 warps: 4 row groups x 2 halves (keys for the scores, output columns for P.V) */

/* 16 bytes global -> shared, zero-filled when !ok (g must still be a valid address) */
__device__ __forceinline__ void mf_cp16(void *sm, const void *g, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(sm)), "l"(g),
               "r"(ok ? 16 : 0)
               : "memory");
#else
  *(uint4 *)sm = ok ? *(const uint4 *)g : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void mf_commit(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mf_wait_all(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#endif
}
/* every cp.async group but the newest complete */
__device__ __forceinline__ void mf_wait_prior(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
#endif
}
/* four 8x8 bf16 matrices (row addresses from lanes 8i..8i+7 for matrix i);
 * .trans hands each lane the transposed elements */
__device__ __forceinline__ void mf_ldm4(uint32_t r[4], const uint16_t *sm) {
#ifdef GK_EMU
  emu_ldmatrix_x4(r, sm, false);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((unsigned)__cvta_generic_to_shared(sm)));
#endif
}
__device__ __forceinline__ void mf_ldm4t(uint32_t r[4], const uint16_t *sm) {
#ifdef GK_EMU
  emu_ldmatrix_x4(r, sm, true);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"((unsigned)__cvta_generic_to_shared(sm)));
#endif
}
/* c[16x8] += a[16x16] . b[16x8], bf16 in, fp32 accumulate */
__device__ __forceinline__ void mf_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
#ifdef GK_EMU
  emu_mma_bf16_16816(c, a, b0, b1);
#else
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
/* two probabilities -> their bf16 hi pair and lo pair (first in the low
 * half). On the device one cvt.rn.bf16x2 per pair: the same round to
 * nearest even as bf16_bits (the emulator's form), in 6 instructions
 * instead of ~30 (the softmax's issue slots) */
__device__ __forceinline__ void mf_split(float x, float y, uint32_t *hi, uint32_t *lo) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(GK_EMU)
  uint32_t h, l;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(h) : "f"(y), "f"(x));
  const float rx = x - __uint_as_float(h << 16), ry = y - __uint_as_float(h & 0xffff0000u);
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(l) : "f"(ry), "f"(rx));
  *hi = h;
  *lo = l;
#else
  const uint32_t hx = bf16_bits(x), hy = bf16_bits(y);
  *hi = hx | hy << 16;
  *lo = bf16_bits(x - __uint_as_float(hx << 16)) | bf16_bits(y - __uint_as_float(hy << 16)) << 16;
#endif
}

/* 32-bit words per token of the selection bitmap over lrows rows of pools of P */
static inline int mf_map_words(int lrows, int P) { return (lrows / (P > 0 ? P : 1) + 31) / 32 + 1; }
/* map[t][w]: bit p of the pools token t selected (tokens past the dense prefix only) */
__global__ void mf_selmap_k(const int *dense, const int *npools, const int *pools, int K, int nw, uint32_t *map) {
  GK_PDL_BEGIN();
  GK_DYN_SMEM(uint32_t, mf_bm);
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < nw; i += blockDim.x) mf_bm[i] = 0;
  __syncthreads();
  if (!dense[t])
    for (int i = threadIdx.x; i < npools[t]; i += blockDim.x) {
      const int p = pools[(size_t)t * K + i];
      if (p >= 0 && (p >> 5) < nw) atomicOr(&mf_bm[p >> 5], 1u << (p & 31));
    }
  __syncthreads();
  for (int i = threadIdx.x; i < nw; i += blockDim.x) map[(size_t)t * nw + i] = mf_bm[i];
}

/* out[t][h][VD] for the tokens of the call (positions *dpos + t); Q16
 * [T][H][NOPE] bf16; KV3 rows [n][h][K hi, K lo, V hi, V lo] (lrows of
 * them); sl2 = softmax scale x log2(e). Warp w takes rows 16 (w % 4) ..
 * +16 and half w / 4: the scores of that half of each key tile, then the
 * output columns of that half over the whole tile. The two warps of a row
 * group exchange their row maxima through shared memory (both then hold
 * the same running maximum, computed in the same order) and write their
 * probabilities (bf16 hi and lo planes) for each other; each keeps the
 * sum of its own probabilities, added to the other's at the end. */
template <int NOPE, int VD, int BN>
__global__ void __launch_bounds__(MF_THREADS, BN == 32 ? 2 : 1)
    mla_flash_k(const uint16_t *Q16, const uint16_t *KV3, const int *dense, const int *tail, const uint32_t *map, int nw,
                const int *dpos, int T, int H, int pshift, int lrows, float sl2, void *out, int out16) {
  GK_PDL_BEGIN();
  using C = mf_cfg<NOPE, VD, BN>;
  constexpr int HB = BN / 2, HV = VD / 2; /* a warp's keys of the scores, columns of the output */
  GK_DYN_SMEM(uint16_t, mf_sm);
  uint16_t *Qs = mf_sm, *Ks = Qs + MF_BM * C::LQ, *Vs = Ks + BN * C::LK, *Ph = Vs + BN * C::LV, *Pl = Ph + MF_BM * C::LP;
  float *red = (float *)(Pl + MF_BM * C::LP); /* [2 halves][64 rows]: row maxima, at the end the sums */
  const int ntile = (T + MF_BM - 1) / MF_BM, tA = (ntile - 1 - (int)blockIdx.x) * MF_BM, h = blockIdx.y;
  const int tid = threadIdx.x, w = tid >> 5, rg = w & 3, hf = w >> 2, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int pos0 = *dpos, ldh = 2 * (NOPE + VD);
  const int nkt = (pos0 + min(tA + MF_BM, T) - 1) / BN + 1;
  /* this lane's two rows (g, g + 8 of the group's 16): position, selection */
  int rpos[2], rden[2], rtail[2];
  const uint32_t *rmap[2];
#pragma unroll
  for (int e = 0; e < 2; e++) {
    const int t = tA + rg * 16 + g + 8 * e, ok = t < T;
    rpos[e] = ok ? pos0 + t : -1; /* rows past T: every key masked, nothing written */
    rden[e] = ok ? dense[t] : 1;
    rtail[e] = ok ? tail[t] : 0;
    rmap[e] = map + (size_t)(ok ? t : 0) * nw;
  }
  auto load_q = [&]() {
    constexpr int CH = NOPE / 8;
    for (int i = tid; i < MF_BM * CH; i += MF_THREADS) {
      const int r = i / CH, c = i % CH, t = tA + r;
      mf_cp16(Qs + r * C::LQ + c * 8, Q16 + ((size_t)(t < T ? t : 0) * H + h) * NOPE + c * 8, t < T);
    }
  };
  auto load_kv = [&](int j, int v) { /* v: the V half of the rows, else K */
    const int CH = (v ? 2 * VD : 2 * NOPE) / 8, L = v ? C::LV : C::LK;
    uint16_t *dst = v ? Vs : Ks;
    for (int i = tid; i < BN * CH; i += MF_THREADS) {
      const int r = i / CH, c = i % CH, n = j * BN + r;
      mf_cp16(dst + r * L + c * 8, KV3 + ((size_t)(n < lrows ? n : 0) * H + h) * ldh + (v ? 2 * NOPE : 0) + c * 8,
              n < lrows);
    }
  };
  float o[HV / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < HV / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  const int r0 = rg * 16 + g; /* the lane's first row in the block (the second: + 8) */
  load_q();
  load_kv(0, 0);
  mf_commit();
  for (int j = 0; j < nkt; j++) {
    mf_wait_all();
    __syncthreads(); /* K tile j (and q) in; every warp done with V tile j - 1, the probabilities and maxima */
    load_kv(j, 1);
    mf_commit();
    float s[HB / 8][4];
#pragma unroll
    for (int i = 0; i < HB / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll 2
    for (int kk = 0; kk < NOPE / 16; kk++) {
      uint32_t a[4];
      mf_ldm4(a, Qs + (rg * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * C::LQ + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int pl = 0; pl < 2; pl++)
#pragma unroll
        for (int jn = 0; jn < HB / 16; jn++) {
          uint32_t b[4];
          mf_ldm4(b, Ks + (hf * HB + jn * 16 + (lane >> 4) * 8 + (lane & 7)) * C::LK + pl * NOPE + kk * 16 +
                         ((lane >> 3) & 1) * 8);
          mf_mma(s[2 * jn], a, b[0], b[1]);
          mf_mma(s[2 * jn + 1], a, b[2], b[3]);
        }
    }
    /* mask, this half's row maxima to the partner */
    const int kb = j * BN + hf * HB;
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const bool all = rden[e] || j * BN >= rtail[e]; /* no pool lookups in this tile */
      float tmax = -INFINITY;
#pragma unroll
      for (int jn = 0; jn < HB / 8; jn++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
          const int n = kb + jn * 8 + 2 * t4 + c, p = n >> pshift;
          const bool sel = n <= rpos[e] && (all || n >= rtail[e] || (__ldg(rmap[e] + (p >> 5)) >> (p & 31) & 1));
          const float v = sel ? s[jn][2 * e + c] * sl2 : -INFINITY;
          s[jn][2 * e + c] = v;
          tmax = fmaxf(tmax, v);
        }
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
      if (t4 == 0) red[hf * MF_BM + r0 + 8 * e] = tmax;
    }
    __syncthreads(); /* both halves' maxima */
    /* online softmax (base 2): the same running maximum in both warps of
     * the group; probabilities split hi + lo into shared memory */
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int r = r0 + 8 * e;
      const float mn = fmaxf(fmaxf(m[e], red[r]), red[MF_BM + r]), mu = mn == -INFINITY ? 0.f : mn;
      const float alpha = exp2f(m[e] - mu);
      float sum = 0.f;
#pragma unroll
      for (int jn = 0; jn < HB / 8; jn++) {
        const float p0 = exp2f(s[jn][2 * e] - mu), p1 = exp2f(s[jn][2 * e + 1] - mu);
        sum += p0;
        sum += p1;
        uint32_t hi, lo;
        mf_split(p0, p1, &hi, &lo);
        const int col = hf * HB + jn * 8 + 2 * t4;
        *(uint32_t *)(Ph + r * C::LP + col) = hi;
        *(uint32_t *)(Pl + r * C::LP + col) = lo;
      }
      l[e] = l[e] * alpha + sum;
      m[e] = mn;
#pragma unroll
      for (int i = 0; i < HV / 8; i++) {
        o[i][2 * e] *= alpha;
        o[i][2 * e + 1] *= alpha;
      }
    }
    mf_wait_all();
    __syncthreads(); /* V tile j and both halves' probabilities in; every warp done with K tile j */
    if (j + 1 < nkt) {
      load_kv(j + 1, 0);
      mf_commit();
    }
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
      uint32_t ph[4], plo[4];
      const int prow = (rg * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * C::LP + kk * 16 + (lane >> 4) * 8;
      mf_ldm4(ph, Ph + prow);
      mf_ldm4(plo, Pl + prow);
      const uint16_t *vr = Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * C::LV + hf * HV + (lane >> 4) * 8;
#pragma unroll
      for (int jd = 0; jd < HV / 16; jd++) {
        uint32_t b[4];
        mf_ldm4t(b, vr + jd * 16); /* V hi: keys x 16 columns */
        mf_mma(o[2 * jd], ph, b[0], b[1]);
        mf_mma(o[2 * jd + 1], ph, b[2], b[3]);
        mf_mma(o[2 * jd], plo, b[0], b[1]);
        mf_mma(o[2 * jd + 1], plo, b[2], b[3]);
        mf_ldm4t(b, vr + VD + jd * 16); /* V lo */
        mf_mma(o[2 * jd], ph, b[0], b[1]);
        mf_mma(o[2 * jd + 1], ph, b[2], b[3]);
      }
    }
  }
  /* the row sums: this warp's over the quad, then the partner's */
#pragma unroll
  for (int e = 0; e < 2; e++) {
    float z = l[e];
    z += __shfl_xor_sync(0xffffffffu, z, 1);
    z += __shfl_xor_sync(0xffffffffu, z, 2);
    l[e] = z;
  }
  __syncthreads(); /* every warp done reading the maxima */
  if (t4 == 0) red[hf * MF_BM + r0] = l[0], red[hf * MF_BM + r0 + 8] = l[1];
  __syncthreads();
#pragma unroll
  for (int e = 0; e < 2; e++) {
    const int r = r0 + 8 * e, t = tA + r;
    const float z = red[r] + red[MF_BM + r], inv = z > 0 ? 1.0f / z : 0.f;
    if (t >= T) continue;
    const size_t at = ((size_t)t * H + h) * VD + hf * HV + 2 * t4;
    if (out16) /* bf16 rows (the output product's x: gk_matmul_xb16) */
#pragma unroll
      for (int i = 0; i < HV / 8; i++)
        *(uint32_t *)((uint16_t *)out + at + i * 8) = bf16_bits(o[i][2 * e] * inv) | bf16_bits(o[i][2 * e + 1] * inv) << 16;
    else
#pragma unroll
      for (int i = 0; i < HV / 8; i++)
        *(float2 *)((float *)out + at + i * 8) = make_float2(o[i][2 * e] * inv, o[i][2 * e + 1] * inv);
  }
}

#endif

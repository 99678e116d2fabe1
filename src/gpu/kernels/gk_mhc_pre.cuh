/* The mHC pre of one token by one block (mhc.c: the rms of the streams,
 * the pre weights, the collapse and its RMSNorm, the Sinkhorn of the
 * mixing logits): the pre launch (gk_layers.cu mhc_pre_k) and, for one
 * token, the last block of the projection's GEMV launch (gk_gemv.cu) run
 * this code. Needs gk_device.cuh and, on the device, gk_common.cuh
 * (tests/unit/test_route_emu.cpp runs it on the host through tests/emu:
 * GK_EMU, where the y warps' named barrier is a block barrier, as on HIP). */
#ifndef GLM53_GPU_GK_MHC_PRE_CUH
#define GLM53_GPU_GK_MHC_PRE_CUH

#define MAX_HC 16
__device__ __forceinline__ void sinkhorn_dev(float *L, int n, int iters, float eps) {
  for (int g = 0; g < n; g++) {
    float *row = L + g * n, mx = row[0];
    for (int h = 1; h < n; h++) mx = fmaxf(mx, row[h]);
    float s = 0;
    for (int h = 0; h < n; h++) s += (row[h] = expf(row[h] - mx));
    for (int h = 0; h < n; h++) row[h] = row[h] / s + eps;
  }
  for (int it = 0; it < iters; it++) {
    if (it > 0)
      for (int g = 0; g < n; g++) {
        float s = 0;
        for (int h = 0; h < n; h++) s += L[g * n + h];
        for (int h = 0; h < n; h++) L[g * n + h] /= s + eps;
      }
    for (int h = 0; h < n; h++) {
      float s = 0;
      for (int g = 0; g < n; g++) s += L[g * n + h];
      for (int g = 0; g < n; g++) L[g * n + h] /= s + eps;
    }
  }
}

/* One block per token. Every load of X is issued with several others in
 * flight (float4, unrolled: a single block per token at decode is latency
 * bound; H200, D = 4096: 27 -> 19 us per site, gk_kprof with launch gaps),
 * the collapsed row y stays in registers between its sum of squares and
 * its normalisation, and warp 0 runs the Sinkhorn (a latency chain of ~20 x
 * 2 normalisations) while warps 1.. collapse and normalise. VEC: D % 4 == 0
 * and 16-byte rows (else the same steps with scalar loads). HC: the stream
 * count compiled in (H100, decode, alone under ncu: 24.5 -> 14.6 us; the
 * inputs loaded up front: 14.2; the Sinkhorn is then the longest path). */
#define MHC_YK 8 /* float4 of y held in registers per thread */
/* the pre-weighted sum of the hc streams at float4 column c; its squares
 * are added to s2 in element order */
__device__ __forceinline__ float4 mhc_collapse4(const float4 *X4, const float *pre, int hc, int D4, int c, float &s2) {
  float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s = 0; s < hc; s++) {
    const float4 x = X4[(size_t)s * D4 + c];
    const float p = pre[s];
    a.x += p * x.x;
    a.y += p * x.y;
    a.z += p * x.z;
    a.w += p * x.w;
  }
  s2 += a.x * a.x;
  s2 += a.y * a.y;
  s2 += a.z * a.z;
  s2 += a.w * a.w;
  return a;
}
/* warp 0 of token t's block: the Sinkhorn of its mixing logits (r: the
 * rms factor of its streams) into combt; HC: sv, sb, ss2 are lane's logit
 * input, base and scale[2], loaded up front by the caller. (Every lane
 * holding the whole 4 x 4 matrix in registers, the serial loop's 16
 * divisions per normalisation in each lane instead of one, measured 1.6
 * ms per token slower on an H100: the divisions, not the shuffles, are
 * the chain; twenty-first session.) */
template <int HC>
__device__ __forceinline__ void mhc_sinkhorn_warp(const float *mu, const float *base, const float *scale, float r, int hc,
                                                  int iters, float hc_eps, float *combt, float sv, float sb, float ss2) {
  const int lane = threadIdx.x & 31;
  if (hc * hc <= 32) { /* lane (g, h) holds L[g][h]; the serial path's operations in its order */
    const int nn = hc * hc, g = lane / hc, h = lane % hc;
    float v = lane >= nn ? 0.f : HC ? ss2 * (sv * r) + sb : scale[2] * (mu[2 * hc + lane] * r) + base[2 * hc + lane];
    float mx = __shfl_sync(0xffffffffu, v, g * hc);
    for (int j = 1; j < hc; j++) mx = fmaxf(mx, __shfl_sync(0xffffffffu, v, g * hc + j));
    const float e = expf(v - mx);
    float s = 0;
    for (int j = 0; j < hc; j++) s += __shfl_sync(0xffffffffu, e, g * hc + j);
    v = e / s + hc_eps;
    for (int it = 0; it < iters; it++) {
      if (it > 0) {
        s = 0;
        for (int j = 0; j < hc; j++) s += __shfl_sync(0xffffffffu, v, g * hc + j);
        v /= s + hc_eps;
      }
      s = 0;
      for (int j = 0; j < hc; j++) s += __shfl_sync(0xffffffffu, v, j * hc + h);
      v /= s + hc_eps;
    }
    if (lane < nn) combt[lane] = v;
  } else if (lane == 0) { /* one thread: hc above 5 */
    float L[MAX_HC * MAX_HC];
    for (int k = 0; k < hc * hc; k++) L[k] = scale[2] * (mu[2 * hc + k] * r) + base[2 * hc + k];
    sinkhorn_dev(L, hc, iters, hc_eps);
    for (int k = 0; k < hc * hc; k++) combt[k] = L[k];
  }
}
/* token t's sum of squares over its n stream values (every thread of the
 * block calls it; the same loop and sums for mhc_pre_k and mhc_comb_k,
 * so the same bits); ssq: gk_mhc_proj's, no pass over X; CACHE: the
 * streams also copied to xs, visible after block_sum's barriers */
template <bool VEC, bool CACHE>
__device__ __forceinline__ float mhc_ssq(const float *Xt, int n, const float *ssq, int t, float *sh, float4 *xs) {
  float ss = 0;
  if (ssq) {
  } else if (VEC) {
#pragma unroll 16 /* one round trip at decode (16 float4 per thread at the model's 4 x 4096) */
    for (int i = threadIdx.x; i < n / 4; i += blockDim.x) {
      const float4 v = ((const float4 *)Xt)[i];
      if (CACHE) xs[i] = v;
      ss += v.x * v.x;
      ss += v.y * v.y;
      ss += v.z * v.z;
      ss += v.w * v.w;
    }
  } else {
#pragma unroll 8
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += Xt[i] * Xt[i];
  }
  return ssq ? ssq[t] : block_sum(ss, sh);
}
/* Token t's pre (mhc_pre_k's block; gk_gemv.cu's projection launch runs
 * it in its last block for one token, reading the mixing inputs the
 * launch's other blocks wrote: through L2, which the kernel's loads give
 * the same values) */
template <bool VEC, bool CACHE, int HC>
__device__ __forceinline__ void mhc_pre_tok(const float *X, const float *mixraw, const float *ssq, const float *base,
                                            const float *scale, const float *norm_w, int hc_, int D, int iters, float hc_eps,
                                            float rms_eps, float *post, float *comb, float *y, uint16_t *y16, int t) {
  const int hc = HC ? HC : hc_; /* HC: the stream count compiled in (the same operations, unrolled) */
  __shared__ float sh[32], sh2[32]; /* block_sum's partials; the y sums' (apart: no barrier between their uses) */
  __shared__ float pre[MAX_HC];
  GK_DYN_SMEM(float4, mhc_xs); /* CACHE: the token's streams, read once from memory */
  const int n = hc * D, mix = (2 + hc) * hc, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const float *Xt = X + (size_t)t * n;
  const float4 *X4 = CACHE ? mhc_xs : (const float4 *)Xt;
  const float *mu = mixraw + (size_t)t * mix;
  const int D4 = D / 4;
  /* HC: the mixing inputs loaded up front, beside X (each was a global round
   * trip on the path after the sum of squares), and every thread computes
   * the pre weights itself (no barrier); the same expressions */
  constexpr int H1 = HC ? HC : 1;
  float hm[H1], hb[H1], hs0 = 0.f, pm = 0.f, pb = 0.f, ps1 = 0.f, sv = 0.f, sb = 0.f, ss2 = 0.f;
  if (HC) {
#pragma unroll
    for (int i = 0; i < H1; i++) hm[i] = gk_ldcg(mu + i), hb[i] = base[i];
    hs0 = scale[0];
    if ((int)threadIdx.x < HC) pm = gk_ldcg(mu + HC + threadIdx.x), pb = base[HC + threadIdx.x], ps1 = scale[1];
    if (comb && w == 0 && lane < HC * HC) sv = gk_ldcg(mu + 2 * HC + lane), sb = base[2 * HC + lane];
    if (comb && w == 0) ss2 = scale[2];
  }
  const float ss = mhc_ssq<VEC, CACHE>(Xt, n, ssq, t, sh, mhc_xs);
  const float r = 1.0f / sqrtf(ss / n + rms_eps);
  float prer[H1];
  if (HC) {
#pragma unroll
    for (int i = 0; i < H1; i++) prer[i] = sigm(hs0 * (hm[i] * r) + hb[i]) + hc_eps;
    if ((int)threadIdx.x < HC) post[t * HC + threadIdx.x] = 2.0f * sigm(ps1 * (pm * r) + pb);
  } else {
    if (threadIdx.x < hc) {
      pre[threadIdx.x] = sigm(scale[0] * (mu[threadIdx.x] * r) + base[threadIdx.x]) + hc_eps;
      post[t * hc + threadIdx.x] = 2.0f * sigm(scale[1] * (mu[hc + threadIdx.x] * r) + base[hc + threadIdx.x]);
    }
    __syncthreads();
  }
  const float *pw = HC ? prer : pre;
  const int nth = blockDim.x - 32, tid = threadIdx.x - 32;
  float *yt = y + (size_t)t * D;
  float4 yr[MHC_YK];
  if (w == 0) {
    if (comb) mhc_sinkhorn_warp<HC>(mu, base, scale, r, hc, iters, hc_eps, comb + (size_t)t * hc * hc, sv, sb, ss2);
  } else if (VEC) {
    float s2 = 0;
#pragma unroll
    for (int k = 0; k < MHC_YK; k++) {
      const int c = tid + k * nth;
      if (c < D4) {
        yr[k] = mhc_collapse4(X4, pw, hc, D4, c, s2);
      }
    }
    for (int c = tid + MHC_YK * nth; c < D4; c += nth) { /* past the registers: y holds the sums */
      ((float4 *)yt)[c] = mhc_collapse4(X4, pw, hc, D4, c, s2);
    }
    s2 = warp_sum(s2);
    if (lane == 0) sh2[w] = s2;
  } else {
    float s2 = 0;
    for (int d = tid; d < D; d += nth) {
      float a = 0;
      for (int s = 0; s < hc; s++) a += pw[s] * Xt[(size_t)s * D + d];
      yt[d] = a;
      s2 += a * a;
    }
    s2 = warp_sum(s2);
    if (lane == 0) sh2[w] = s2;
  }
  /* the y warps meet (named barrier 1 without warp 0; HIP: all threads) */
#if GK_HIP || defined(GK_EMU)
  __syncthreads();
#else
  if (w) asm volatile("bar.sync 1, %0;" ::"r"((int)blockDim.x - 32) : "memory");
#endif
  if (w) {
    float s2 = 0;
    for (int i = 1; i < (int)(blockDim.x >> 5); i++) s2 += sh2[i];
    const float r2 = 1.0f / sqrtf(s2 / D + rms_eps);
    if (VEC) {
      const float4 *nw4 = (const float4 *)norm_w;
      uint2 *y16t = y16 ? (uint2 *)(y16 + (size_t)t * D) : NULL; /* the bf16 copy (x_bf16's rounding), 8-byte aligned */
      auto put = [&](int c, float4 v) {
        ((float4 *)yt)[c] = v;
        if (y16t) y16t[c] = make_uint2(bf16_bits(v.x) | bf16_bits(v.y) << 16, bf16_bits(v.z) | bf16_bits(v.w) << 16);
      };
#pragma unroll
      for (int k = 0; k < MHC_YK; k++) {
        const int c = tid + k * nth;
        if (c < D4) {
          const float4 g = nw4[c], a = yr[k];
          put(c, make_float4(g.x * (a.x * r2), g.y * (a.y * r2), g.z * (a.z * r2), g.w * (a.w * r2)));
        }
      }
      for (int c = tid + MHC_YK * nth; c < D4; c += nth) {
        const float4 g = nw4[c], a = ((const float4 *)yt)[c];
        put(c, make_float4(g.x * (a.x * r2), g.y * (a.y * r2), g.z * (a.z * r2), g.w * (a.w * r2)));
      }
    } else {
      for (int d = tid; d < D; d += nth) {
        yt[d] = norm_w[d] * (yt[d] * r2);
        if (y16) y16[(size_t)t * D + d] = (uint16_t)bf16_bits(yt[d]);
      }
    }
  }
}
#endif

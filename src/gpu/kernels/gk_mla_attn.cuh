/* The absorbed MLA attention cores over the (paged) latent cache, apart
 * from gk_layers.cu (which launches them) so that tests/unit/
 * test_mla_attn_emu.cpp can run them on the host through tests/emu. Needs
 * gk_device.cuh and, on the device, gk_common.cuh. */
#ifndef GLM53_GPU_GK_MLA_ATTN_CUH
#define GLM53_GPU_GK_MLA_ATTN_CUH
#define KL_MAX 512   /* kv_lora_rank bound of gk_mla_attn */
#define MLA_MAXC (KL_MAX / 32)

/* ---- MLA attention core (mla.c mla_forward, absorbed form) ----
 * grid (T, H, nsplit), 256 threads: online softmax over this split's
 * selected latents (warp w takes every 8th), the 8 warps merged in order;
 * one split writes ob directly, several write (max, sum, acc[kl]) records
 * that mla_merge_k combines in split order. */
__global__ void __launch_bounds__(256) mla_attn_k(const float *qtg, gk_batch b, const int *dense,
                                                   const int *npools, const int *tail, const int *pools,
                                                   int H, int kl, int P, int K, float scale, int chunk, int nsplit,
                                                   float *part, float *ob) {
  GK_PDL_BEGIN();
  __shared__ float qt[KL_MAX], wacc[8][KL_MAX], wm[8], wz[8];
  int sg;
  const int t = blockIdx.x, h = blockIdx.y, sp = blockIdx.z, w = threadIdx.x >> 5, lane = threadIdx.x & 31, pos = bpos(b, t, &sg);
  const gk_lstate &lst = b.seg[sg].ls[b.layer];
  const size_t th = (size_t)t * H + h;
  for (int j = threadIdx.x; j < kl; j += blockDim.x) qt[j] = qtg[th * kl + j];
  __syncthreads();
  const int isd = dense[t], np = npools[t], tb = tail[t];
  const int N = sel_count(isd, np, tb, pos, P);
  int s0, s1;
  if (!split_part(N, chunk, nsplit, sp, &s0, &s1)) return;
  const int *pl = pools + (size_t)t * K;
  float m = -INFINITY, z = 0, acc[MLA_MAXC];
#pragma unroll
  for (int c = 0; c < MLA_MAXC; c++) acc[c] = 0.f;
  for (int s = s0 + w; s < s1; s += 8) {
    int tok = sel_row(isd, np, tb, pl, P, s);
    const float *lat = gk_prow(lst, GK_ST_LATENT, tok, kl);
    float d = 0;
#pragma unroll
    for (int c = 0; c < MLA_MAXC; c++) {
      int cc = lane + 32 * c;
      if (cc < kl) d += qt[cc] * lat[cc];
    }
    float sc = warp_sum(d) * scale;
    if (sc > m) {
      float f = expf(m - sc);
      z *= f;
#pragma unroll
      for (int c = 0; c < MLA_MAXC; c++) acc[c] *= f;
      m = sc;
    }
    float p = expf(sc - m);
    z += p;
#pragma unroll
    for (int c = 0; c < MLA_MAXC; c++) {
      int cc = lane + 32 * c;
      if (cc < kl) acc[c] += p * lat[cc];
    }
  }
#pragma unroll
  for (int c = 0; c < MLA_MAXC; c++) {
    int cc = lane + 32 * c;
    if (cc < kl) wacc[w][cc] = acc[c];
  }
  if (lane == 0) { wm[w] = m; wz[w] = z; }
  __syncthreads();
  float M = -INFINITY;
  for (int i = 0; i < 8; i++)
    if (wz[i] > 0) M = fmaxf(M, wm[i]);
  float Z = 0;
  for (int i = 0; i < 8; i++)
    if (wz[i] > 0) Z += wz[i] * expf(wm[i] - M);
  float *rec = nsplit > 1 ? part + (th * nsplit + sp) * (size_t)(kl + 2) : NULL;
  if (rec && threadIdx.x == 0) { rec[0] = M; rec[1] = Z; }
  for (int j = threadIdx.x; j < kl; j += blockDim.x) {
    float a = 0;
    for (int i = 0; i < 8; i++)
      if (wz[i] > 0) a += wacc[i][j] * expf(wm[i] - M);
    if (rec) rec[2 + j] = a;
    else ob[th * kl + j] = Z > 0 ? a / Z : 0.f;
  }
}
/* combines the non-empty parts of (t, h) = blockIdx.x in part order */
__global__ void mla_merge_k(const float *part, gk_batch b, const int *dense, const int *npools, const int *tail, int H,
                            int P, int chunk, int nsplit, int kl, float *ob) {
  GK_PDL_BEGIN();
  const size_t th = blockIdx.x;
  const int t = (int)(th / H), pos = bpos(b, t, NULL), N = sel_count(dense[t], npools[t], tail[t], pos, P);
  const int used = split_used(N, split_rows(N, chunk, nsplit));
  const float *r0 = part + th * nsplit * (size_t)(kl + 2);
  float M = -INFINITY, Z = 0;
  for (int s = 0; s < used; s++)
    if (r0[s * (size_t)(kl + 2) + 1] > 0) M = fmaxf(M, r0[s * (size_t)(kl + 2)]);
  for (int s = 0; s < used; s++) {
    const float *r = r0 + s * (size_t)(kl + 2);
    if (r[1] > 0) Z += r[1] * expf(r[0] - M);
  }
  for (int j = threadIdx.x; j < kl; j += blockDim.x) {
    float a = 0;
    for (int s = 0; s < used; s++) {
      const float *r = r0 + s * (size_t)(kl + 2);
      if (r[1] > 0) a += r[2 + j] * expf(r[0] - M);
    }
    ob[th * kl + j] = Z > 0 ? a / Z : 0.f;
  }
}
/* ---- MLA attention core, heads sharing the latent rows ----
 * All heads of a token attend over the same selected latent rows, so one
 * block takes HS_HG heads of a token (and one split of its rows): tiles of
 * HS_R rows are gathered once into shared memory and used by every head
 * (the per-head form read each row once per head: 64 times per token).
 * Thread (hh, r) = (tid / 16, tid % 16) scores row r of the tile for head
 * hh, then owns the output columns r, r + 16, ... of head hh; the running
 * max and sum of a head are kept identically by its 16 threads. grid (T,
 * ceil(H / HS_HG), nsplit), 256 threads; records as mla_attn_k writes them
 * (mla_merge_k combines several splits). */
#define HS_HG 16
#define HS_R 16
#define HS_COLS (KL_MAX / 16)
/* orders the ps writes of a head's 16 threads (one warp) before their reads;
 * HIP before 6 has no __syncwarp: the block barrier (every thread reaches
 * it) does the same, more slowly */
#if GK_HIP
#define HS_SYNC_HEAD() __syncthreads()
#else
#define HS_SYNC_HEAD() __syncwarp()
#endif
static inline size_t hs_smem(int kl) { return ((size_t)HS_HG * kl + (size_t)HS_R * (kl + 4) + HS_HG * HS_R) * sizeof(float); }
__global__ void __launch_bounds__(256) mla_hs_k(const float *qtg, gk_batch b, const int *dense, const int *npools,
                                                 const int *tail, const int *pools, int H, int kl, int P, int K, float scale,
                                                 int chunk, int nsplit, float *part, float *ob) {
  GK_PDL_BEGIN();
  GK_DYN_SMEM(float, hs_sh);
  const int ldl = kl + 4; /* row padding: the 16 rows a warp scores start in different banks */
  float *qs = hs_sh, *ls = qs + HS_HG * kl, *ps = ls + HS_R * ldl;
  int sg;
  const int t = blockIdx.x, h0 = blockIdx.y * HS_HG, sp = blockIdx.z, pos = bpos(b, t, &sg);
  const int tid = threadIdx.x, hh = tid >> 4, r = tid & 15, nh = min(HS_HG, H - h0), kq = kl / 4;
  const gk_lstate &lst = b.seg[sg].ls[b.layer];
  for (int i = tid; i < HS_HG * kl; i += blockDim.x) {
    int a = i / kl;
    qs[i] = a < nh ? qtg[((size_t)t * H + h0) * kl + i] : 0.f;
  }
  const int isd = dense[t], np = npools[t], tb = tail[t];
  const int N = sel_count(isd, np, tb, pos, P);
  int s0, s1;
  if (!split_part(N, chunk, nsplit, sp, &s0, &s1)) return;
  const int *pl = pools + (size_t)t * K;
  float m = -INFINITY, z = 0, acc[HS_COLS];
#pragma unroll
  for (int j = 0; j < HS_COLS; j++) acc[j] = 0.f;
  for (int base = s0; base < s1; base += HS_R) {
    __syncthreads(); /* the previous tile is consumed (and q is loaded) */
    for (int i = tid; i < HS_R * kq; i += blockDim.x) {
      int rr = i / kq, c4 = i % kq, s = base + rr;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (s < s1) {
        int tok = sel_row(isd, np, tb, pl, P, s);
        v = ((const float4 *)gk_prow(lst, GK_ST_LATENT, tok, kl))[c4];
      }
      *(float4 *)(ls + rr * ldl + 4 * c4) = v;
    }
    __syncthreads();
    const float4 *qa = (const float4 *)(qs + hh * kl), *la = (const float4 *)(ls + r * ldl);
    float d = 0;
    for (int c4 = 0; c4 < kq; c4++) {
      float4 x = qa[c4], y = la[c4];
      d = fmaf(x.x, y.x, d); d = fmaf(x.y, y.y, d); d = fmaf(x.z, y.z, d); d = fmaf(x.w, y.w, d);
    }
    const float sc = base + r < s1 ? d * scale : -INFINITY;
    float mt = sc;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o)); /* the 16 lanes of head hh */
    const float mn = fmaxf(m, mt); /* finite: row base < s1 is valid */
    const float f = expf(m - mn), p = base + r < s1 ? expf(sc - mn) : 0.f;
    float ssum = p;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) ssum += __shfl_xor_sync(0xffffffffu, ssum, o);
    z = z * f + ssum;
    m = mn;
    ps[hh * HS_R + r] = p;
    HS_SYNC_HEAD(); /* a head's 16 threads share a warp */
#pragma unroll
    for (int j = 0; j < HS_COLS; j++) acc[j] *= f;
    for (int rr = 0; rr < HS_R; rr++) {
      const float pr = ps[hh * HS_R + rr], *lr = ls + rr * ldl;
#pragma unroll
      for (int j = 0; j < HS_COLS; j++) {
        int c = r + 16 * j;
        if (c < kl) acc[j] = fmaf(pr, lr[c], acc[j]);
      }
    }
    HS_SYNC_HEAD();
  }
  if (hh >= nh) return;
  const size_t th = (size_t)t * H + h0 + hh;
  float *rec = nsplit > 1 ? part + (th * nsplit + sp) * (size_t)(kl + 2) : NULL;
  if (rec && r == 0) { rec[0] = m; rec[1] = z; }
#pragma unroll
  for (int j = 0; j < HS_COLS; j++) {
    int c = r + 16 * j;
    if (c >= kl) break;
    if (rec) rec[2 + c] = acc[j];
    else ob[th * kl + c] = z > 0 ? acc[j] / z : 0.f;
  }
}

#endif

/* Kernels that address the paged latent / indexer states (gk.h
 * gk_lstate): the per-token state store and the DSA indexer's pooled keys
 * and pool scores. Apart from gk_layers.cu (which launches them) so that
 * tests/unit/test_dsa_emu.cpp can run them on the host through tests/emu.
 * Needs gk_device.cuh and, on the device, gk_common.cuh. (Also the MLA
 * norms' launch, which can store the latent rows.) */
#ifndef GLM53_GPU_GK_DSA_CUH
#define GLM53_GPU_GK_DSA_CUH

/* state[pos(t) * stride + i] = src[t * n + i], the token's sequence and
 * position read from the batch table on the device */
__global__ void store_at_k(gk_batch b, int which, int stride, const float *src, int T, int n) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i >= (size_t)T * n) return;
  int t = (int)(i / n), sg;
  const size_t c = i % n;
  const int pos = bpos(b, t, &sg);
  gk_prow(b.seg[sg].ls[b.layer], which, pos, stride)[c] = src[i];
}
/* The MLA's q_a and kv_a norms in one launch (blocks [0, T) the first
 * row set, [T, 2T) the second); which >= 0: the second set's rows also
 * stored to state `which` at the tokens' positions (store_at_k's copy of
 * the rows just written, read back by the threads that wrote them) */
__global__ void rmsnorm2_k(gk_norm_rows a, gk_norm_rows b, int T, float eps, gk_batch bt, int which, int stride) {
  GK_PDL_BEGIN();
  __shared__ float sh[32];
  const bool first = (int)blockIdx.x < T;
  const gk_norm_rows &p = first ? a : b;
  const int t = first ? (int)blockIdx.x : (int)blockIdx.x - T;
  float *yr = p.y + (size_t)t * p.ldy;
  rmsnorm_row(yr, p.x + (size_t)t * p.ldx, p.w, p.n, eps, sh);
  if (first || which < 0) return;
  int sg;
  const int pos = bpos(bt, t, &sg);
  float *dst = gk_prow(bt.seg[sg].ls[bt.layer], which, pos, stride);
  for (int i = threadIdx.x; i < p.n; i += blockDim.x) dst[i] = yr[i];
}
/* ---- DSA indexer (mla.c pool_key / indexer_scores) ---- */
/* column c of pooled key p: the softmax over the pool's P gate logits
 * (plus the position bias ape) weighting its P keys */
__device__ __forceinline__ float pool_col(const gk_lstate &st, const float *ape, int P, int hd, int p, int c) {
  float l[64], mx = -INFINITY;
  for (int m = 0; m < P; m++) {
    l[m] = gk_prow(st, GK_ST_IS, p * P + m, hd)[c] + ape[m * hd + c];
    mx = fmaxf(mx, l[m]);
  }
  float z = 0, acc = 0;
  for (int m = 0; m < P; m++) z += expf(l[m] - mx);
  for (int m = 0; m < P; m++) acc += expf(l[m] - mx) / z * gk_prow(st, GK_ST_IK, p * P + m, hd)[c];
  return acc;
}
__global__ void pool_keys_k(gk_batch b, const float *ape, int P, int hd) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  const gk_seg sg = b.seg[blockIdx.y];
  const gk_lstate &st = sg.ls[b.layer];
  const int pos0 = sg.pos0, p_lo = pos0 / P, p_hi = (pos0 + sg.len) / P; /* pools this segment completes */
  if (i >= (size_t)(p_hi - p_lo) * hd) return;
  int p = p_lo + (int)(i / hd), c = (int)(i % hd);
  gk_prow(st, GK_ST_POOL, p, hd)[c] = pool_col(st, ape, P, hd, p, c);
}
/* Decode (every segment one token; one block per token): the token's
 * indexer key layer-normed in place (kk), stored with its gate logits (kg)
 * at its position, and the pool it completes, if any, pooled: layernorm_k,
 * two store_at_k and pool_keys_k in one launch with their expressions
 * (the same bits). Thread i owns columns i, i + blockDim.x, ... in every
 * step, so the pool reads the token's own row back from its own writes;
 * the pool's other rows are earlier tokens'. */
__global__ void idx_keys_k(gk_batch b, float *kk, const float *kg, const float *knw, const float *knb, const float *ape,
                           int P, int hd, float eps) {
  GK_PDL_BEGIN();
  __shared__ float sh[32];
  const int t = blockIdx.x;
  int sg;
  const int pos = bpos(b, t, &sg);
  const gk_lstate &st = b.seg[sg].ls[b.layer];
  float *kr = kk + (size_t)t * hd;
  layernorm_row(kr, kr, knw, knb, hd, eps, sh);
  float *ik = gk_prow(st, GK_ST_IK, pos, hd), *is = gk_prow(st, GK_ST_IS, pos, hd);
  for (int c = threadIdx.x; c < hd; c += blockDim.x) {
    ik[c] = kr[c];
    is[c] = kg[(size_t)t * hd + c];
  }
  if ((pos + 1) % P) return;
  const int p = pos / P;
  for (int c = threadIdx.x; c < hd; c += blockDim.x) gk_prow(st, GK_ST_POOL, p, hd)[c] = pool_col(st, ape, P, hd, p, c);
}
/* grid (T, ceil(maxpool / ppb)); a warp scores ppb / 8 pools; only
 * queries that see more than K complete pools need scores. Lane h owns
 * head h (and h + 32, ...): its dot product with the pool key runs down
 * the head dim from shared memory (q rows padded to hd + 1 floats: no bank
 * conflicts; the key staged per warp, read as a broadcast), so a pool
 * costs one warp reduction instead of one per head. ppb: 64 at prefill (q
 * staged once for 64 pools), 8 at decode (more blocks). */
__global__ void idx_scores_k(const float *q, const float *w, gk_batch b, int P, int nh, int hd, int K, int maxpool,
                             int ppb, float *score) {
  GK_PDL_BEGIN();
  GK_DYN_SMEM(float, qsh); /* q [nh][hd + 1], then a key [hd] per warp */
  int sg;
  const int t = blockIdx.x, n = (bpos(b, t, &sg) + 1) / P;
  const gk_lstate &st = b.seg[sg].ls[b.layer];
  if (n <= K || blockIdx.y * ppb >= n) return;
  const int ld = hd + 1;
  for (int i = threadIdx.x; i < nh * hd; i += blockDim.x) qsh[(i / hd) * ld + i % hd] = q[(size_t)t * nh * hd + i];
  const int wq = threadIdx.x >> 5, lane = threadIdx.x & 31, per = ppb / 8;
  float *ksh = qsh + (size_t)nh * ld + (size_t)wq * hd;
  __syncthreads();
  const float s = 1.0f / sqrtf((float)hd), ws = 1.0f / sqrtf((float)nh);
  for (int it = 0; it < per; it++) {
    const int p = blockIdx.y * ppb + wq * per + it;
    if (p >= n) break;
    const float *key = gk_prow(st, GK_ST_POOL, p, hd);
    for (int i = lane; i < hd; i += 32) ksh[i] = key[i];
    __syncwarp();
    float acc = 0;
    for (int h = lane; h < nh; h += 32) {
      const float *qh = qsh + (size_t)h * ld;
      float d = 0;
      for (int i = 0; i < hd; i++) d += qh[i] * ksh[i];
      d *= s;
      if (d > 0) acc += (w[(size_t)t * nh + h] * ws) * d;
    }
    acc = warp_sum(acc);
    if (lane == 0) score[(size_t)t * maxpool + p] = acc;
    __syncwarp(); /* ksh is rewritten for the next pool */
  }
}
#endif

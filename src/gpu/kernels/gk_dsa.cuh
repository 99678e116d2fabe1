/* Kernels that address the paged latent / indexer states (gk.h
 * gk_lstate): the per-token state store and the DSA indexer's pooled keys
 * and pool scores. Apart from gk_layers.cu (which launches them) so that
 * tests/unit/test_dsa_emu.cpp can run them on the host through tests/emu.
 * Needs gk_device.cuh and, on the device, gk_common.cuh. */
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
/* ---- DSA indexer (mla.c pool_key / indexer_scores) ---- */
__global__ void pool_keys_k(gk_batch b, const float *ape, int P, int hd) {
  GK_PDL_BEGIN();
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  const gk_seg sg = b.seg[blockIdx.y];
  const gk_lstate &st = sg.ls[b.layer];
  const int pos0 = sg.pos0, p_lo = pos0 / P, p_hi = (pos0 + sg.len) / P; /* pools this segment completes */
  if (i >= (size_t)(p_hi - p_lo) * hd) return;
  int p = p_lo + (int)(i / hd), c = (int)(i % hd);
  float l[64], mx = -INFINITY;
  for (int m = 0; m < P; m++) {
    l[m] = gk_prow(st, GK_ST_IS, p * P + m, hd)[c] + ape[m * hd + c];
    mx = fmaxf(mx, l[m]);
  }
  float z = 0, acc = 0;
  for (int m = 0; m < P; m++) z += expf(l[m] - mx);
  for (int m = 0; m < P; m++) acc += expf(l[m] - mx) / z * gk_prow(st, GK_ST_IK, p * P + m, hd)[c];
  gk_prow(st, GK_ST_POOL, p, hd)[c] = acc;
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

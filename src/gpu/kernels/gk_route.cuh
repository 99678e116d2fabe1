/* The MoE routing of one token by one warp (moe.c moe_route): the
 * separate route launch (gk_layers.cu moe_route_k) and the router GEMV's
 * last block (gk_gemv.cu gv_k, gk_matmul_route) run the same code, so the
 * same ids, weights and grouping ints. Needs gk_device.cuh and, on the
 * device, gk_common.cuh (tests/unit/test_route_emu.cpp runs it on the host
 * through tests/emu). */
#ifndef GLM53_GPU_GK_ROUTE_CUH
#define GLM53_GPU_GK_ROUTE_CUH

#define E_MAX GK_ROUTE_E_MAX
__device__ __forceinline__ bool r_before(float a, int ia, float b, int ib) { return pool_before(a, ia, b, ib); }
__device__ __forceinline__ void topk_masked_dev(const float *v, const unsigned char *allowed, int n, int k, int *out) {
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (allowed && !allowed[i]) continue;
    if (m == k && !r_before(v[i], i, v[out[m - 1]], out[m - 1])) continue;
    int j = m < k ? m++ : k - 1;
    while (j > 0 && r_before(v[i], i, v[out[j - 1]], out[j - 1])) { out[j] = out[j - 1]; j--; }
    out[j] = i;
  }
  for (; m < k; m++) out[m] = -1;
}
/* one warp per token: the per-expert work split over the lanes, the
 * top-k as k rounds of a warp argmax under r_before (a strict total order,
 * so the same ids in the same order as topk_masked_dev's insertion); group
 * scores and weights as the serial reference computes them */
#define ROUTE_WARPS 4
/* (the order is strict, so the best is unique whatever the reduction's
 * shape; each lane carries its candidate's value with its id, so the
 * butterfly's steps wait on shuffles only, not on shared-memory reads) */
__device__ __forceinline__ int route_argmax(const float *v, const unsigned char *ok, int n) {
  const int lane = threadIdx.x & 31;
  int bi = -1;
  float bv = 0.f;
  for (int e = lane; e < n; e += 32)
    if (ok[e]) {
      const float x = v[e];
      if (bi < 0 || r_before(x, e, bv, bi)) bi = e, bv = x;
    }
  for (int o = 16; o > 0; o >>= 1) {
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    if (oi >= 0 && (bi < 0 || r_before(ov, oi, bv, bi))) bi = oi, bv = ov;
  }
  return bi;
}
/* of a token's k selected ids (distinct, -1 for none): how many are
 * experts, and expert e's place among them in ascending id */
__device__ __forceinline__ int route_nsel(const int *id, int k) {
  int n = 0;
  for (int i = 0; i < k; i++) n += id[i] >= 0;
  return n;
}
__device__ __forceinline__ int route_rank(const int *id, int k, int e) {
  int rank = 0;
  for (int i = 0; i < k; i++) rank += id[i] >= 0 && id[i] < e;
  return rank;
}
/* The selected experts' gate and up weights into L2 (gk_moe_route_pf),
 * `bytes` of them in 64 KB pieces spread over the lanes: experts in
 * ascending id (the grouped launch's block order), gate and up pieces
 * alternating from row 0 (its virtual rows alternate gate/up). srt: 64
 * ints of the warp's shared memory. */
#define XPF_PIECE 65536u
__device__ __forceinline__ void route_prefetch(const gpu_mat *wset, const int *id, int k, long bytes, int *srt) {
  const int lane = threadIdx.x & 31;
  __syncwarp();
  const int nsel = route_nsel(id, k);
  for (int j = lane; j < k; j += 32)
    if (id[j] >= 0) srt[route_rank(id, k, id[j])] = id[j];
  __syncwarp();
  if (!nsel) return;
  const gpu_mat &g0 = wset[(size_t)srt[0] * 3];
  const size_t m = g0.fmt == GF_F32 ? (size_t)g0.rows * g0.cols * 4 : g0.fmt == GF_BF16 ? (size_t)g0.rows * g0.cols * 2
                   : g0.fmt == GF_Q8 ? (size_t)g0.rows * g0.cols : (size_t)g0.rows * g0.cols / 2;
  const long pm = (long)((m + XPF_PIECE - 1) / XPF_PIECE), np = bytes / XPF_PIECE;
  for (long q = lane; q < np; q += 32) {
    const long r = q / (2 * pm), j = q % (2 * pm);
    if (r >= nsel) break;
    const size_t off = (size_t)(j >> 1) * XPF_PIECE;
    const gpu_mat &w = wset[(size_t)srt[r] * 3 + (j & 1)];
    gk_l2_prefetch((const char *)w.d + off, (unsigned)min((size_t)XPF_PIECE, m - off) & ~15u, true);
  }
}
/* grp (one token only, gk_moe_route_group): the pairs grouped per expert
 * as gk_expert_group writes them for these k pairs: each expert has at
 * most one pair, so every group holds one pair, in ascending expert id
 * (gmax: group_max of the grouped launch) */
__device__ __forceinline__ void route_group(const int *sid, int k, int gmax, int *grp) {
  const int lane = threadIdx.x & 31;
  for (int j = lane; j < k; j += 32) {
    const int e = sid[j];
    if (e < 0) continue;
    const int rank = route_rank(sid, k, e);
    grp[1 + 3 * rank] = e;
    grp[2 + 3 * rank] = 1;
    grp[3 + 3 * rank] = rank;
    grp[1 + 3 * gmax + rank] = j; /* the pair list: pair j of token 0 */
  }
  if (lane == 0) grp[0] = route_nsel(sid, k);
}
/* one warp's working memory */
typedef struct {
  float sig[E_MAX], ch[E_MAX], gs[64];
  int srt[64], id[64];
  unsigned char ok[E_MAX], gok[64];
} route_smem;
/* Token's routing from its E logits lg (read through L2: the router's
 * other blocks may have written them in this launch) into id[k], wt[k];
 * pfb > 0: the selected experts' first pfb bytes into L2; grp: the
 * one-token grouping (route_group). The whole warp calls it. */
__device__ __forceinline__ void route_token(const float *lg, const float *bias, int E, int k, int G, int topk_group, int norm,
                                            float scaling, int *id, float *wt, const gpu_mat *wset, long pfb, int *grp,
                                            int gmax, route_smem &S) {
  const int lane = threadIdx.x & 31;
  float *sig = S.sig, *choice = S.ch, *gs = S.gs;
  int *sid = S.id;
  unsigned char *ok = S.ok, *gok = S.gok;
  for (int e = lane; e < E; e += 32) {
    sig[e] = sigm(gk_ldcg(lg + e));
    choice[e] = sig[e] + bias[e];
  }
  const int per = G > 0 ? E / G : E;
  __syncwarp();
  if (G > 1) {
    for (int g = lane; g < G; g += 32) { /* top-2 sum of each group, as the serial loop adds them */
      int n2 = per < 2 ? per : 2, best[2];
      topk_masked_dev(choice + g * per, NULL, per, n2, best);
      float v = 0;
      for (int i = 0; i < n2; i++) v += choice[g * per + best[i]];
      gs[g] = v;
      gok[g] = 1;
    }
    __syncwarp();
    for (int i = 0; i < topk_group; i++) { /* the topk_group best groups */
      const int g = route_argmax(gs, gok, G);
      __syncwarp();
      if (lane == 0 && g >= 0) gok[g] = 0; /* 0 now marks a selected group */
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32) ok[e] = e / per < G && !gok[e / per];
  } else {
    for (int e = lane; e < E; e += 32) ok[e] = 1;
  }
  __syncwarp();
  for (int m = 0; m < k; m++) {
    const int e = route_argmax(choice, ok, E);
    __syncwarp();
    if (lane == 0) {
      id[m] = e;
      sid[m] = e; /* the weights below read the shared copy: id[] in global memory would be a round trip per read */
      if (e >= 0) ok[e] = 0;
    }
    __syncwarp();
  }
  if (wset && pfb > 0) route_prefetch(wset, sid, k, pfb, S.srt);
  if (grp) route_group(sid, k, gmax, grp);
  /* every lane adds the sum in the serial order, then lane i divides
   * weight i (the serial loop's operations, its divisions side by side) */
  double sum = 0;
  for (int i = 0; i < k; i++) sum += sid[i] >= 0 ? sig[sid[i]] : 0.0f;
  for (int i = lane; i < k; i += 32) {
    double v = sid[i] >= 0 ? sig[sid[i]] : 0.0;
    if (norm) v /= sum + 1e-20;
    wt[i] = (float)(v * scaling);
  }
}
#endif

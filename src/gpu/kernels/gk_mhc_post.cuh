/* The mHC post's per-element arithmetic, shared by mhc_post_k (gk_layers.cu)
 * and the fused post + projection (gk_mhc_tc.cuh mhc_post_proj_tc_k) so
 * that both write the same bits (the same expressions, so the compiler
 * contracts them alike). Plain arithmetic: portable, and the CUDA emulator
 * can run it. */
#ifndef GLM53_GPU_GK_MHC_POST_CUH
#define GLM53_GPU_GK_MHC_POST_CUH

/* the combine's order (moe_sum, the fused post): the first of the k pairs
 * id[] with the smallest expert id above *last, which becomes that id; -1
 * when none (so starting from *last = -1 each distinct id >= 0 is visited
 * once, ascending) */
__device__ __forceinline__ int moe_next(const int *id, int k, int *last) {
  int best = -1;
  for (int j = 0; j < k; j++)
    if (id[j] > *last && (best < 0 || id[j] < id[best])) best = j;
  if (best >= 0) *last = id[best];
  return best;
}
/* y += w e: one routed expert's output, added in ascending expert id */
template <int V> __device__ __forceinline__ void mhc_post_add(float *y, float w, const float *e) {
#pragma unroll
  for (int v = 0; v < V; v++) y[v] += w * e[v];
}
/* new stream h = ph y + sum over g ascending of comb[g][h] old_g (cb: the
 * token's hc x hc comb, row g; HM: the streams compiled in, hc <= HM) */
template <int HM, int V>
__device__ __forceinline__ void mhc_post_mix(const float (*old)[V], const float *y, float ph, const float *cb, int hc, int h,
                                             float *acc) {
#pragma unroll
  for (int v = 0; v < V; v++) acc[v] = ph * y[v];
#pragma unroll
  for (int g = 0; g < HM; g++)
    if (g < hc) {
      const float c = cb[g * hc + h];
#pragma unroll
      for (int v = 0; v < V; v++) acc[v] += c * old[g][v];
    }
}

#endif

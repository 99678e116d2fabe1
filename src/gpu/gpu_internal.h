/* Shared between the gpu backend and its startup validation. */
#ifndef GLM53_GPU_INTERNAL_H
#define GLM53_GPU_INTERNAL_H
#include "gpu/kernels/gk.h"
#include "model/wmat.h"

/* Per-head matrices of absorbed MLA from kv_b ([H*(nope+vd)][kl], host w and
 * its device copy dkvb): W_UK^T[h] [kl][nope] (a transposed copy, f32 when
 * kv_b is f32, else bf16) and W_UV[h] [vd][kl] (views into dkvb). Each as a
 * host array of H gpu_mat (malloc'd) and a device array (via alloc). */
typedef struct {
  gpu_mat *uk_h, *uv_h; /* host arrays (free()) */
  gpu_mat *uk_d, *uv_d; /* device arrays */
} gpu_mla_heads;
int gpu_build_mla_heads(const wmat *w, const gpu_mat *dkvb, int H, int nope, int vd, void *(*alloc)(void *ctx, size_t n),
                        void *ctx, gpu_mla_heads *out);
/* flash-decoding split of the MLA attention for a chunk of T tokens at pos0:
 * chunk size (0 = no split) and the number of splits */
int gpu_mla_split(int T, int pos0, int K, int P, int *chunk);

#endif

/* Interface between the v3 decode GEMV (gk_gemv.cu) and the product
 * dispatch of gk_gemm.cu: C++ linkage, kernel files only. */
#ifndef GLM53_GPU_GK_GEMV_CUH
#define GLM53_GPU_GK_GEMV_CUH
#include "gk_common.cuh"

#define WARPS 8 /* warps per GEMV block (every GEMV version) */

/* Work that the last block of a product's launch does once every tile of
 * that product is stored (the product's output y read through L2), in
 * instantiations of their own: the routing of a router's logits (y, ldy
 * == E; gk_matmul_route, gk_route.cuh route_token), or the mHC pre of
 * one token from its projection (y = mixraw; gk_mhc_proj_pre,
 * gk_mhc_pre.cuh mhc_pre_tok) */
typedef struct {
  const float *bias;
  int *idx, *grp; /* grp: the one-token grouping, or NULL */
  float *wt;
  int E, k, G, topk_group, norm, gmax;
  float scaling;
} gv_route;
typedef struct {
  const float *X, *base, *scale, *norm_w;
  float *post, *comb, *y;
  uint16_t *y16;
  int D, iters;
  float hc_eps, rms_eps;
} gv_mpre;
/* one product of a v3 launch: y[n][ldy] = x W^T, or with W2 (fused
 * gate+up, same shape and format as W) y = swiglu(x W^T, x W2^T) */
typedef struct {
  const gpu_mat *W, *W2;
  const float *x;
  int ldx;
  float *y;
  int ldy;
  float limit;
  const gv_route *rt; /* NULL, or this product's logits are routed */
  const gv_mpre *mp;  /* NULL, or this product is the mHC projection of one token, whose pre follows */
} gv_req;

/* products of n tokens each (any formats, at most 16; one launch per
 * format and up to GV_MAXE products); plain: without load pipelining
 * (same bits) */
int gv3_products(const gv_req *r, int nr, int n, int plain);
/* the per-pair routed-expert / per-head launch: pair p uses matrix
 * wset[e * wstride + which] with e = idx[p] (idx NULL: p % k), x row
 * (xpt ? p / k : p); only >= 0: just the pairs of that expert */
int gv3_pairs(const gpu_mat *d_wset, int which, int wstride, int fmt, int rows, int cols, const int *idx, int npairs,
              int k, int xpt, const float *x, int ldx, float *y, int ldy, int only, int plain);
/* the same products grouped per expert (grp from gk_expert_group): each
 * expert's weights are read once per group of up to gk_group_ntk pairs;
 * gu: which and which + 1 fused into swiglu. Same bits as gv3_pairs.
 * sh: the shared expert's rows in the same launch (gk.h), or NULL. */
int gv3_grouped(const gpu_mat *d_wset, int which, int gu, float limit, int fmt, int rows, int cols, const int *grp,
                const int *idx, int npairs, int E, int k, int xpt, const float *x, int ldx, float *y, int ldy,
                const gk_shared_rows *sh, int plain);
int gk_group_ntk(int npairs, int E);

/* grow-only scratch (gk_gemm.cu): split-K partials, and arrival counters
 * that are zero between launches */
float *gk_scratch_part(size_t floats);
unsigned *gk_scratch_counters(size_t n);

#endif

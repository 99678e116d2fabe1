/* C interface of the device kernels (the .cu files beside this). Everything here
 * is callable from C and names no CUDA/HIP type, so src/gpu/glm53_gpu.c
 * builds with any C compiler. All launches go to one stream, in order; the
 * functions return 0 or -1 with the reason in gk_error(). Pointers are device
 * pointers unless named h_*. */
#ifndef GLM53_GPU_GK_H
#define GLM53_GPU_GK_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix on the device, W[rows][cols] (y = W x), in one of the wmat
 * formats (model/wmat.h numbering: 1 f32, 2 bf16, 3 q8, 4 q4). */
typedef struct {
  int fmt, rows, cols, group, scale_bf16, pad_;
  const void *d;  /* data */
  const void *s;  /* Q4/Q8 scales, one 16-bit per (row, group) */
} gpu_mat;

typedef struct {
  int count;            /* devices visible */
  char name[128];
  size_t mem_total, mem_free;
  int cc_major, cc_minor; /* CUDA compute capability */
  char arch[64];        /* "sm_90" or the HIP gcnArchName */
  int sm_count;
  int hip;
} gk_devinfo;

const char *gk_error(void);
/* Select device 0 and describe it; -1 when no usable device. */
int gk_init(gk_devinfo *info);
void *gk_malloc(size_t n);          /* NULL + gk_error on failure */
void gk_free(void *p);
int gk_h2d(void *d, const void *h, size_t n);
int gk_d2h(void *h, const void *d, size_t n);
int gk_d2d(void *d, const void *s, size_t n);
int gk_memset(void *d, int v, size_t n);
int gk_sync(void);                  /* waits and reports any launch/async error */
unsigned long gk_launch_count(void); /* kernels launched through gk_launch so far (cuBLAS calls not counted) */
int gk_check(const char *what);     /* reports the last launch error */
/* bench: per-operation GPU time (gk_kprof.cu). gk_kprof_begin() records an
 * event at every gk_check from then on (decode graphs must be off);
 * gk_kprof_stage() files the records since its last call under a stage;
 * gk_kprof_end() prints the operations by time per step (reps steps) and
 * stops. gk_kprof_mark is gk_check's hook. */
int gk_kprof_begin(void);
void gk_kprof_stage(const char *stage);
void gk_kprof_end(const char *label, int reps);
void gk_kprof_mark(const char *what);
int gk_kprof_active(void); /* between gk_kprof_begin and gk_kprof_end */

/* ---- linear algebra (gk_gemm.cu) ---- */
/* Y[n][ldy] (first rows columns) = X[n][ldx] * W^T. Small n uses the
 * in-house GEMV (per-token arithmetic independent of n, so a token gives the
 * same bits in prefill and decode); n >= gk_gemm_min() uses cuBLAS. */
int gk_matmul(const gpu_mat *W, const float *x, int n, int ldx, float *y, int ldy);
int gk_gemm_min(void);              /* $GLM53_GPU_GEMM_MIN, default 8 */
int gk_have_blas(void);             /* 1 when built with cuBLAS/hipBLAS */
void gk_set_gemm_min(int n);        /* tests: n <= 0 restores the default */
/* The side stream (gk_gemm.cu): a second compute stream for work of a long
 * chunk that is independent of what the compute stream does next (the
 * shared expert beside the routing and the routed experts, the query
 * product beside the indexer, the KDA gate products beside q / k / v and
 * the recurrence).
 * gk_side_fork: the side stream waits for everything launched so far, and
 * the launches that follow (kernels, cuBLAS, the bf16 scratch of the
 * products) go to it; returns 1, or 0 when the side stream is off (the
 * default: no faster on the H100 bench; HIP, kernel profiling, graph
 * capture, a fork already open) and launches stay where they were.
 * gk_side_back: launches go to the compute stream again (which does not
 * wait yet).
 * gk_side_join: gk_side_back if needed, then the compute stream waits for
 * the side work (a no-op without a fork). Same results either way. */
int gk_side_fork(void);
int gk_side_back(void);
int gk_side_join(void);
void gk_set_side(int on); /* 1 on, 0 off, -1: GLM53_GPU_SIDE=1 (default off) */
unsigned gk_side_forks(void); /* forks so far (tests: that the side stream ran) */
/* products that gk_matmul_multi's cuBLAS path ran inside a merged GEMM so
 * far (adjacent bf16 weights and outputs; tests: that the merge ran) */
unsigned gk_gemm_merged(void);
/* x's first n rows of cols floats (dense: ldx == cols) are also xb16 in
 * bf16 (that rounding, e.g. gk_mhc_pre's y16): the cuBLAS path's products
 * of x and the MoE GEMM form's gather read xb16 instead of converting x
 * again (same bits). Valid until the next call; x NULL clears. The caller
 * keeps it true: x must not change while registered. */
void gk_xb_alias(const float *x, int n, int cols, const void *xb16);
const void *gk_xb_lookup(const float *x, int n, int cols, int ldx); /* the registered bf16 rows of x, or NULL */
/* registrations taken (1, default) or ignored (0; GLM53_GPU_XB_ALIAS=0, then
 * gk_mhc_pre's y16 is not written either); -1 the environment */
void gk_set_xb_alias(int on);
int gk_xb_alias_on(void);
/* 1 on (GLM53_GPU_GEMM_MERGE=1; opt-in: measured no faster on the H100),
 * 0 off (the default), -1 the environment */
void gk_set_gemm_merge(int on);
/* GEMV kernel (bench/tests): 3 = the default v3 (chunked, split-K by shape,
 * docs/gpu.md); 4 = v3 without load pipelining (same bits as 3); 1 = the
 * one-row-per-warp kernel ($GLM53_GPU_GEMV=1); 2 = the rows-per-warp kernel
 * of issue 5 ($GLM53_GPU_GEMV=2); 0 = back to the environment/default. 1 and
 * 2 give the same bits; 3/4 their own (each (row, token) independent of n
 * and of the launch in every version). */
void gk_set_gemv_version(int v);
/* bench only: the warp count the v3 split-K plan aims at (default by format
 * and path, docs/gpu.md; <= 0 restores it). Changes the split counts, hence
 * the bits. */
void gk_set_gemv_split_target(int warps);
/* bench/tests: 1 stages each block's x in shared memory for Q4 at 1-2
 * tokens per block (the default, docs/gpu.md), 2 for Q8 and Q4, 0 reads it
 * from global memory ($GLM53_GPU_GEMV_XS=0/1/2), -1 back to the
 * environment; same bits */
void gk_set_gemv_xs(int on);
/* Routed experts, small-n path: for pair p (token p / k, slot p % k) with
 * e = idx[p] >= 0, Y[p] = Wset[e*3 + which] * X[xrow(p)], xrow = p / k when
 * x_per_token, else p. Pairs with idx < 0 get zeros. */
int gk_matmul_experts(const gpu_mat *d_wset, int which, int fmt, int rows, int cols, const int *idx, int npairs, int k,
                      int x_per_token, const float *x, int ldx, float *y, int ldy);
/* The same for the pairs routed to expert `only` alone (other pairs are left
 * untouched, pairs with idx < 0 get zeros): each pair gets the bits the
 * all-pairs launch gives it (expert streaming computes expert by expert). */
int gk_matmul_expert_only(const gpu_mat *d_wset, int which, int fmt, int rows, int cols, const int *idx, int npairs,
                          int k, int x_per_token, const float *x, int ldx, float *y, int ldy, int only);

/* Several products of n tokens in as few launches as the formats allow
 * (the GEMV path: one launch per weight format and up to 6 products;
 * cuBLAS runs them one by one): y_i = X_i W_i^T with X_i = the product's
 * own x (ldx) or, when NULL, the shared one; each with the bits gk_matmul
 * gives it alone, except on the cuBLAS path for consecutive bf16 products
 * whose matrices and outputs are adjacent (W_{i+1} stored right after W_i,
 * y_{i+1} = y_i + W_i rows, the same ldy): one GEMM of their summed rows,
 * equal to fp32 rounding (gk_gemm_merged counts them). With W2 (an up matrix of W's shape and format) the
 * product is gk_gate_up's: y = swiglu(X W^T, X W2^T), u its scratch. */
typedef struct {
  const gpu_mat *W;
  float *y;
  int ldy;
  const float *x; /* NULL: the shared x */
  int ldx;
  const gpu_mat *W2; /* NULL: a plain product */
  float *u;          /* fused: scratch of n x W rows floats (cuBLAS path) */
  float limit;       /* fused: the SwiGLU clamp */
  int y16;           /* y holds bf16 (raw bits; ldy in them): plain products of the shared x on the cuBLAS path only */
} gk_prod;
int gk_matmul_multi(const gk_prod *p, int np, const float *x, int n, int ldx);
/* y = xb W^T from x already in bf16 (dense rows of W cols, the rounding
 * gk_matmul's cuBLAS path gives x): the same bits as gk_matmul of the fp32
 * x. Only where gk_xb16_ok (the cuBLAS path, W not fp32); else an error. */
int gk_matmul_xb16(const gpu_mat *W, const void *xb, int n, float *y, int ldy);
/* BLAS builds: x [n][cols] (ldx apart) as dense bf16 rows (the rounding
 * above; 8 or 4 per thread where aligned) into out; and h = bf16(swiglu(g,
 * u)) over n elements (gk_swiglu's value, that rounding). Launches only:
 * the caller checks them (GK_LAUNCHED), under its own profile label. */
int gk_rows_bf16(const float *x, int n, int cols, int ldx, void *out);
int gk_swiglu_to_bf16(const float *g, const float *u, size_t n, float limit, void *h);
int gk_xb16_ok(const gpu_mat *W, int n);
/* out = down(swiglu(x gate^T, x up^T)) (out ldo apart; g, u: n x gate rows
 * floats, g's rows then hold the SwiGLU on the GEMV path): gk_gate_up then
 * gk_matmul, with the same bits; on the cuBLAS path the SwiGLU goes
 * straight to the bf16 rows the down product reads (no fp32 pass). */
int gk_mlp(const gpu_mat *Wg, const gpu_mat *Wu, const gpu_mat *Wd, const float *x, int n, int ldx, float *g, float *u,
           float limit, float *out, int ldo);
/* g[n][I] = swiglu(X Wg^T, X Wu^T) (I = Wg rows; u: scratch of the same
 * size, used by the cuBLAS path); GEMV path: one fused launch, the bits of
 * gk_matmul + gk_matmul + gk_swiglu. */
int gk_gate_up(const gpu_mat *Wg, const gpu_mat *Wu, const float *x, int n, int ldx, float *g, float *u, float limit);
/* Routed experts grouped per expert on the device (no host round trip):
 * gk_expert_group sorts the npairs (token, expert) pairs of idx (E
 * experts) into grp (gk_expert_group_ints ints), then gk_experts_grouped
 * runs the products of which (gu: gate and up, which and which + 1, into
 * swiglu; u: scratch for the v1/v2 GEMV) reading each expert's weights
 * once per group of pairs. Every pair gets the bits of gk_matmul_experts;
 * pairs with idx < 0 get zeros. sh (or NULL): the shared expert's
 * product in the same launch, n tokens' rows of x times W (gu: swiglu of
 * W and W2) into y; its matrices have the routed experts' shape and
 * format, and each token gets the bits of gk_matmul_experts over a set
 * holding only the shared expert (k = 1). npairs may be 0 with sh (the
 * shared product alone: grp and idx unused). */
typedef struct {
  gpu_mat W, W2;
  const float *x;
  int ldx;
  float *y;
  int ldy, n;
} gk_shared_rows;
size_t gk_expert_group_ints(int npairs, int E);
int gk_expert_group(const int *idx, int npairs, int E, int *grp);
int gk_expert_group_max(int npairs, int E); /* the group slots grp holds (before its pair list) */
int gk_experts_grouped(const gpu_mat *d_wset, int which, int gu, float limit, int fmt, int rows, int cols, const int *grp,
                       const int *idx, int npairs, int E, int k, int xpt, const float *x, int ldx, float *y, int ldy,
                       float *u, const gk_shared_rows *sh);
/* decode's shared expert inside the routed experts' grouped launches
 * (glm53_gpu.c shared_rows): 0 never; 1 (the default) its down product,
 * and its gate and up products too when the router's format differs from
 * the shared expert's (the router and they are two launches then anyway);
 * 2 the gate and up products always. One or two weight launches fewer per
 * MoE layer: on an H100 (twentieth session) the default was 0.33 ms per
 * token faster than 0 with an fp32 router, 0.07-0.23 with a bf16 one.
 * GLM53_GPU_SHARED_GROUP=0|1|2 or
 * gk_set_shared_group (-1: the environment). The grouped launch's GEMV
 * plan sums in another order than the separate launch's: other bits. */
void gk_set_shared_group(int mode);
int gk_shared_group(void);
/* programmatic dependent launch between kernels (sm_90+, docs/gpu.md):
 * supported once gk_init ran on such a device; gk_set_pdl(0) turns it off
 * for the following launches (GLM53_GPU_PDL=0: always off). Bits do not
 * depend on it. */
int gk_pdl_supported(void);
void gk_set_pdl(int on);
void gk_force_pdl_off(int off); /* tests / bench: 1 keeps PDL off whatever gk_set_pdl says */
/* PDL trigger order (gk_common.cuh): early (1: a kernel lets its
 * dependents launch before it waits, so runs of small kernels and the
 * product after them are resident at once) or late (0, the default: wait,
 * then trigger); -1: GLM53_GPU_PDL_EARLY (1: early). Bits do not depend on
 * it. Takes effect for the next launches and graph replays. */
int gk_set_pdl_early(int on);
int gk_pdl_early(void);
/* L2 prefetch of the decode GEMV (gk_gemv.cu): before its PDL wait each
 * warp prefetches the first `bytes` of each of its rows' slices into L2
 * (one bulk prefetch per row, evict-last when `last`), so weights stream
 * while the small kernels before it run; 0: the former prefetch of one
 * chunk per lane; -1: GLM53_GPU_GEMV_L2PF (bytes, default 0) and
 * GLM53_GPU_L2PF_LAST (default 1). Bits do not depend on it. */
void gk_set_gemv_l2pf(int bytes, int last);
int gk_gemv_l2pf(void);
/* The routed experts' L2 prefetch at decode (gk_moe_route_pf): bytes of
 * the selected experts' gate and up matrices, lowest expert id first (the
 * order the grouped expert launch reads them); -1: GLM53_GPU_EXPERT_L2PF_MB
 * (MB, default 0). */
void gk_set_expert_l2pf(long bytes);
long gk_expert_l2pf(void);

/* Per-head products: for each token t and head h, y[t][h] (ldy_head apart,
 * rows of W_h) = W_h x[t][h] (ldx_head apart). h_mats / d_mats: the H
 * matrices on the host / as a device array (same shapes and format). */
int gk_matmul_heads(const gpu_mat *h_mats, const gpu_mat *d_mats, int H, const float *x, int T, int ldx_head, float *y,
                    int ldy_head);

/* ---- elementwise / norms (gk_layers.cu) ---- */
int gk_embed(const gpu_mat *E, const int32_t *tok, int T, int hc, float *X);
/* y[t] = w * x[t] / rms(x[t]) (w may be NULL) */
int gk_rmsnorm(float *y, int ldy, const float *x, int ldx, const float *w, int T, int n, float eps);
/* two gk_rmsnorm calls of T rows each in one launch, the same bits */
typedef struct { float *y; int ldy; const float *x; int ldx; const float *w; int n; } gk_norm_rows;
int gk_rmsnorm2(gk_norm_rows a, gk_norm_rows b, int T, float eps);
int gk_layernorm(float *y, int ldy, const float *x, int ldx, const float *w, const float *b, int T, int n, float eps);
int gk_swiglu(float *g, const float *u, size_t n, float limit);  /* g = swiglu(g, u) */
/* the same on rows p (of n elements) whose idx[p] == only */
int gk_swiglu_only(float *g, const float *u, const int *idx, int npairs, int n, int only, float limit);
/* mHC site: mixraw[T][mix] = fn . X (unnormalised, from gk_matmul or
 * gk_mhc_proj), then post/comb and y = rmsnorm(sum pre_s X_s) * norm_w;
 * ssq: each token's sum of squares of X (gk_mhc_proj), or NULL (computed) */
int gk_mhc_pre(const float *X, const float *mixraw, const float *ssq, const float *base, const float *scale,
               const float *norm_w, int T, int hc, int D, int iters, float hc_eps, float rms_eps, float *post, float *comb,
               float *y, void *y16);
/* gk_matmul of the projection fn (mixraw = X fn^T) and gk_mhc_pre for one
 * token in one launch: the projection's last block runs the pre (the same
 * code and inputs: the same bits; comb computed there too). 1 (nothing
 * launched) where it does not apply: T != 1, hc != 4, fn not fp32, the
 * vector rows' alignment, the cuBLAS or another GEMV path, the comb
 * wanted on a graph branch (gk_set_branch), or off
 * (opt-in until measured on a device: GLM53_GPU_MHC_PRE_FUSE=1 /
 * gk_set_mhc_pre_fuse(1); -1 the environment) */
int gk_mhc_proj_pre(const gpu_mat *fn, const float *X, int T, int hc, int D, float *mixraw, const float *base,
                    const float *scale, const float *norm_w, int iters, float hc_eps, float rms_eps, float *post, float *comb,
                    float *y, void *y16);
void gk_set_mhc_pre_fuse(int on);
/* y16 (8-byte aligned, or NULL): y's rows also in bf16 (the rounding
 * gk_matmul's cuBLAS path gives its x), for gk_xb_alias; comb NULL: the
 * pre leaves comb to gk_mhc_comb */
/* comb alone, the bits gk_mhc_pre with the same arguments writes (a decode
 * graph runs it on a branch beside the sublayer: gk_branch_fork) */
int gk_mhc_comb(const float *X, const float *mixraw, const float *ssq, const float *base, const float *scale,
                const float *norm_w, int T, int hc, int D, int iters, float hc_eps, float rms_eps, float *comb,
                const float *y, const void *y16);
/* gk_mhc_post_moe up to 64 tokens in its latency form (1, the default:
 * every load ahead of the routed outputs' additions) or not (0); same
 * bits; -1: GLM53_GPU_POST_LAT */
void gk_set_mhc_post_lat(int on);
/* A branch of a graph being captured on the compute stream: between
 * gk_branch_fork (1: forked; 0: not capturing, HIP, or off: opt-in,
 * GLM53_GPU_BRANCH=1 / gk_set_branch(1)) and gk_branch_back the launches go to a second stream
 * that starts after the work launched so far; gk_branch_join makes the
 * compute stream's next launches wait for it (a no-op when none is open). */
int gk_branch_fork(void);
int gk_branch_back(void);
int gk_branch_join(void);
void gk_set_branch(int on); /* -1: GLM53_GPU_BRANCH (default off) */
/* mixraw = fn . X and ssq[T] in one pass over X (fp32, another summation
 * order than gk_matmul): 0, -1, or 1 when fn is not f32 [24][4 D] (hc 4) */
int gk_mhc_proj(const gpu_mat *fn, const float *X, int T, int hc, int D, float *mixraw, float *ssq);
/* its tensor-core form (CUDA; 3xTF32, column splits added in order): -1
 * the environment (GLM53_GPU_MHC_TC, default on), 0 the SIMT kernel, 1 on */
void gk_set_mhc_tc(int on);
int gk_mhc_tc_on(void);
/* its steps of 32 columns (128 bytes of a row per warp; -1 the environment,
 * GLM53_GPU_MHC_K32=1; default off, 16 columns, until measured) */
void gk_set_mhc_k32(int on);
int gk_mhc_k32(void);
int gk_mhc_post(float *X, const float *a, const float *post, const float *comb, int T, int hc, int D);
/* the same after a MoE: a = a (shared expert) + the routed outputs eo
 * weighted by wt in ascending expert id, as gk_moe_combine adds them (same
 * bits, one launch less). Pair p's output is row p of eo, or with erow !=
 * NULL row erow[p] (the slots gk_moe_experts_gemm wrote). eo_bf16: eo holds
 * bf16 rows (raw bits; gk_moe_experts_gemm's outputs where
 * gk_moe_bf16_out()), widened as they are read; else fp32. */
int gk_mhc_post_moe(float *X, const float *a, const void *eo, int eo_bf16, const int *erow, const int *idx, const float *wt,
                    int k, const float *post, const float *comb, int T, int hc, int D);
/* gk_mhc_post (eo NULL) or gk_mhc_post_moe followed by gk_mhc_proj of the
 * new X with the next site's fn, in one pass over X (tensor cores, long
 * chunks; its column grouping differs from gk_mhc_proj's: equal within
 * fp32, X bitwise the same). Opt-in (GLM53_GPU_MHC_FUSE=1). 1: not
 * applicable (off, HIP, GLM53_GPU_MHC_TC=0, shapes): the caller runs the
 * two steps */
int gk_mhc_post_proj(float *X, const float *a, const float *eo, const int *erow, const int *idx, const float *wt, int k,
                     const float *post, const float *comb, int T, int hc, int D, const gpu_mat *fn, float *mixraw, float *ssq);
void gk_set_mhc_fuse(int on); /* 1 on, 0 off, -1: GLM53_GPU_MHC_FUSE */
/* mean over streams + final rmsnorm for rows [first, T) */
int gk_final_norm(const float *X, const float *w, int first, int T, int hc, int D, float eps, float *h);

/* ---- per-sequence state: the batch table ----
 * Kernels that read or write a sequence's state (KDA conv + recurrent
 * state, MLA latent cache, indexer keys / gate logits / pooled keys) or need
 * a token's position take a gk_batch: the tokens of one launch form nseg
 * segments, segment s = tokens [t0, t0 + len) of one sequence at positions
 * pos0 .. pos0 + len - 1, whose per-layer states are ls[layer]. A prefill
 * chunk or a single-session decode step is one segment; a batched decode
 * step is n segments of one token. The tables live on the device (uploaded
 * with the tokens, one copy per forward), so a launch does not depend on
 * positions or on which sessions are batched (CUDA graph replay). */
enum { GK_ST_CONV, GK_ST_S, GK_ST_LATENT, GK_ST_IK, GK_ST_IS, GK_ST_POOL, GK_ST_N };
/* One layer of one sequence (NULL where the layer has none). The KDA
 * states are dense (p[GK_ST_CONV], p[GK_ST_S]: fixed size). The MLA latent
 * cache and the indexer's keys, gate logits (rows = positions) and pooled
 * keys (rows = pools) are paged: pg[which] is a device table of page
 * pointers, row r at pg[which][r >> pshift] + (r & (2^pshift - 1)) *
 * stride, so a sequence holds pages for the rows it has, not for its whole
 * context (glm53_gpu.c allocates them from a pool shared by the model's
 * sessions). */
typedef struct {
  float *p[GK_ST_N];
  float *const *pg[GK_ST_N];
  int pshift, pad_;
} gk_lstate;
/* rows [0, rows) of a paged state (table: device page pointers, 2^pshift
 * rows of `stride` floats each) copied into one contiguous grow-only
 * buffer, returned (NULL: gk_error), for the cuBLAS forms that read the
 * latent cache or the pooled keys as a matrix; slot 0 or 1 (two buffers) */
float *gk_pages_linear(int slot, float *const *table, int pshift, int rows, int stride);
typedef struct {
  const gk_lstate *ls; /* device array [layers] */
  int t0, len, pos0, pad_;
} gk_seg;
typedef struct {
  const gk_seg *seg; /* device [nseg] */
  const int *tseg;   /* device [T]: the segment of each token */
  int nseg, maxlen;  /* host-known: segment count, longest segment (grid sizes) */
  int layer;         /* which ls[] entry the launch uses */
} gk_batch;

/* ---- KDA ---- */
/* depthwise causal conv + SiLU over each segment's tokens, continuing from
 * and then updating its conv state (ls[layer].p[GK_ST_CONV]) */
int gk_kda_conv(const float *raw, const gk_batch *b, const float *w, int T, int ch, int K, float *qkv);
int gk_kda_prep(float *qkv, int T, int H, int hd, float qscale);          /* l2norm q,k (+ scale q) */
/* gk_kda_conv then gk_kda_prep in one pass (same bits; ch = 3 * H * hd);
 * one launch when no segment is longer than 4 tokens (decode), else two.
 * raw16: raw holds bf16 (raw bits; the projections' bf16 outputs of long
 * chunks, gk_kda_raw16), widened as read; the conv state stays fp32. */
int gk_kda_conv_prep(const void *raw, int raw16, const gk_batch *b, const float *w, int T, int H, int hd, int K, float qscale,
                     float *qkv);
/* the KDA q / k / v projections of long chunks written in bf16 (1;
 * GLM53_GPU_KDA_RAW=bf16, opt-in: measured no faster), or fp32 (0, the
 * default); -1 the environment */
void gk_set_kda_raw16(int on);
int gk_kda_raw16(void);
/* its prefill form's tokens per warp with 4 taps, 1, 4 or 8, the same
 * bits (0: GLM53_GPU_KDA_CONV_NT, default 4) */
void gk_set_kda_conv_nt(int nt);
int gk_kda_gate(float *g, const float *dt_bias, const float *A_log, int T, int H, int hd, float lower_bound);
/* state GK_ST_S: [H][dv][dk] (column-major per head); beta_logit [T][H];
 * o [T][H*dv]; each segment's tokens in order through its own state */
int gk_kda_recur(const gk_batch *b, const float *qkv, const float *g, const float *beta_logit, int T, int H, int hd, float *o);
/* the same from the raw forget-gate projection: the gk_kda_gate transform
 * applied as g is read (same bits, one launch less); from 32 tokens graw
 * is overwritten with the decay exp(gate) and beta_logit with
 * sigmoid(beta_logit) first (same bits again) */
int gk_kda_recur_gated(const gk_batch *b, const float *qkv, float *graw, const float *dt_bias, const float *A_log,
                       float lower_bound, float *beta_logit, int T, int H, int hd, float *o);
/* The chunked form of the same recurrence for long chunks (gk_kda_chunk.cu):
 * opt-in (GLM53_KDA_PREFILL=chunked as on the CPU, or gk_set_kda_chunked;
 * -1 goes back to the environment); equal to the token form to fp32
 * rounding, not bitwise. gk_kda_chunk_use: on, head dim 32/64/128 with
 * the shared memory it needs, a segment of 64+ tokens. gk_kda_chunked
 * overwrites qkv and graw (dead after the recurrence) and needs
 * gk_kda_chunk_work(T, H, hd) floats of work (at most 3 * H * hd * T). */
void gk_set_kda_chunked(int on);
void gk_set_kda_chunk_len(int len); /* 64 (default) or 32 tokens per chunk; 0: GLM53_GPU_KDA_CHUNK */
/* the prep's pair products: 1 factorised by 16-token blocks (default, for
 * lower bounds down to -5.3), 0 exact per pair; -1: GLM53_GPU_KDA_PAIRS */
void gk_set_kda_pairs(int fact);
int gk_kda_chunk_use(const gk_batch *b, int hd);
size_t gk_kda_chunk_work(int T, int H, int hd);
int gk_kda_chunked(const gk_batch *b, float *qkv, float *graw, const float *dt_bias, const float *A_log,
                   float lower_bound, const float *beta_logit, int T, int H, int hd, float *work, float *o);
/* ob NULL: o normalised and gated in place; else written to ob in bf16
 * (raw bits, the rounding the output projection's cuBLAS path gives its x:
 * gk_matmul_xb16 then gives gk_matmul's bits) */
int gk_kda_out(float *o, const float *z, const float *w, int T, int H, int hd, float eps, void *ob);
/* decode (T < 32, the g4 layout, head dims 32 / 64 / 128):
 * gk_kda_recur_gated and then gk_kda_out in one launch, the head's last
 * block applying the norm (the same bits); 1 (nothing launched) where it
 * does not apply or when off (opt-in until measured on a device:
 * GLM53_GPU_KDA_OUT_FUSE=1 / gk_set_kda_out_fuse(1); -1 the environment).
 * z must be complete when it starts. */
int gk_kda_recur_out(const gk_batch *b, const float *qkv, float *graw, const float *dt_bias, const float *A_log,
                     float lower_bound, float *beta_logit, int T, int H, int hd, float *o, const float *z, const float *w,
                     float eps, void *ob);
void gk_set_kda_out_fuse(int on);
/* the twenty-second session's four opt-in decode launch fusions at once
 * (gk_set_route_fuse, gk_set_mhc_pre_fuse, gk_set_idx_fuse,
 * gk_set_kda_out_fuse): 1 on, 0 off, -1 each from its environment */
void gk_set_decode_fusions(int on);
/* the recurrence's layout, bench A/B (gk_layers.cu kr_layout; 0:
 * GLM53_GPU_KDA_LAYOUT, default g4): 32 lanes per column with 4 or 8
 * columns per warp (w4, w8), 8 lanes per column with 1, 2 or 4 columns
 * per lane group (g1, g2, g4; head dims 32, 64, 128, else w4), or 16 lanes
 * per column with 2 or 4 columns (x2, x4: g4's bits; head dims 64, 128),
 * or 32 lanes per column with 4 (y4: g4's bits; head dim 128) */
enum { GK_KR_DEFAULT = 0, GK_KR_W4, GK_KR_W8, GK_KR_G1, GK_KR_G2, GK_KR_G4, GK_KR_X2, GK_KR_X4, GK_KR_Y4, GK_KR_N };
void gk_set_kda_layout(int layout);

/* ---- MLA + DSA indexer ---- */
/* state `which` of the token's sequence, row (position) * stride + i = src[t * n + i] */
int gk_store_at(const gk_batch *b, int which, int stride, const float *src, int T, int n);
/* gk_rmsnorm2, b's output rows also stored to state `which` (row stride
 * `stride`) at the tokens' positions (gk_store_at's copy, same launch;
 * with the fusions below off, the two launches) */
int gk_rmsnorm2_at(gk_norm_rows a, gk_norm_rows b, int T, float eps, const gk_batch *bt, int which, int stride);
/* pooled keys (GK_ST_POOL) of the pools each segment completes, from GK_ST_IK / GK_ST_IS */
int gk_pool_keys(const gk_batch *b, const float *ape, int P, int hd);
/* decode (every segment one token): gk_layernorm of the indexer keys kk
 * (T rows of hd, in place), gk_store_at of kk to GK_ST_IK and of the gate
 * logits kg to GK_ST_IS, then gk_pool_keys, in one launch with the same
 * bits; 1 (nothing done) for longer segments or when off (opt-in until
 * measured on a device: GLM53_GPU_IDX_FUSE=1 or gk_set_idx_fuse(1), which
 * also makes gk_rmsnorm2_at one launch; -1 the environment) */
int gk_idx_keys(const gk_batch *b, float *kk, const float *kg, const float *knw, const float *knb, const float *ape, int T,
                int P, int hd, float eps);
void gk_set_idx_fuse(int on);
/* score [T][maxpool]: maxpool bounds every sequence's pool count */
int gk_indexer_scores(const float *q, const float *w, const gk_batch *b, int T, int P, int nh, int hd, int K, int maxpool,
                      float *score);
/* the same scores for a chunk of one sequence through fp32 cuBLAS GEMMs
 * (gk_idx_gemm.cu): pool is its GK_ST_POOL, dpos its pos0 on the device,
 * pos0 the host copy; equal to gk_indexer_scores within fp32 rounding (the
 * head sum in another order). 0, -1 on error, 1 when not in this build. */
int gk_indexer_scores_gemm(const float *q, const float *w, const float *pool, int T, const int *dpos, int pos0, int P,
                           int nh, int hd, int K, int maxpool, float *score);
/* selection per query: dense[T], npools[T], tail[T], pools[T][K] */
int gk_select(const float *score, const gk_batch *b, int T, int P, int K, int maxpool, int always_tail, int *dense,
              int *npools, int *tail, int *pools);
/* Attention core over each token's latent cache (GK_ST_LATENT): qt [T][H][kl] (queries absorbed
 * through W_UK) -> ob [T][H][kl] (softmax-weighted latent sums). With
 * chunk > 0 the N selected rows of each (t, h) are split into parts of the
 * smallest multiple of `chunk` rows that makes at most 32 parts
 * (flash-decoding; nsplit = gk_mla_nsplit(the longest selection, chunk);
 * part holds T*H*nsplit*(kl+2) floats), merged in part order: a token's
 * result depends on its selection and chunk only. */
int gk_mla_attn(const float *qt, const gk_batch *b, const int *dense, const int *npools, const int *tail, const int *pools,
                int T, int H, int kl, int P, int K, float scale, int chunk, int nsplit, float *part, float *ob);
/* 1: the core shares each tile of latent rows between 16 heads (default);
 * 0: one block per (token, head) (also GLM53_GPU_MLA=head). Bench use. */
void gk_set_mla_kernel(int hs);
/* the smallest flash-decoding part (the chunk argument of gk_mla_attn) for
 * the core in use, and the part count for selections of up to maxN rows */
int gk_mla_split_tile(int kl);
int gk_mla_nsplit(int maxN, int chunk);
/* The same attention for long chunks through cuBLAS GEMMs (gk_mla_math below)
 * (gk_mla_gemm.cu): all heads of a token share its selected rows. pos0: the
 * chunk's first position (host copy of *dpos). One sequence: latent is its
 * cache, dpos its pos0 on the device (in a forward: &seg[0].pos0 of the
 * batch table). 0, -1 on error, or 1 when
 * not available in this build (no BLAS): use gk_mla_attn then. */
int gk_mla_attn_gemm(const float *qt, const float *latent, const int *dense, const int *npools, const int *tail,
                     const int *pools, int T, const int *dpos, int pos0, int H, int kl, int P, int K, float scale, float *ob);
/* gk_mla_attn_gemm's GEMM arithmetic (GLM53_GPU_MLA_MATH=bf16x3|bf16x4|
 * bf16x9|fp32|tf32): by default bf16x3, every fp32 input split into two
 * bf16 terms (hi + lo, 16 significant bits) and three of their four
 * products summed in fp32 by bf16 tensor-core GEMMs over 3x longer sums
 * (~1e-5 relative error); bf16x4 all four products; bf16x9 cuBLAS's
 * fp32-accurate emulation (fp32 where cuBLAS lacks it, and on HIP); plain
 * fp32; TF32 (opt-in: ~3e-4). gk_set_mla_math: the switch for tests and
 * bench (-1: the environment); gk_mla_math_tol: the relative error the
 * tests allow each against a float64 reference. */
/* The same attention in per-head form (gk_mla_gemm.cu, the default where
 * it applies): each head's keys and values up-projected from the latent
 * rows through kv_b (H x (nope + vd) rows of kl) once per call, the heads
 * attending over nope / vd-wide rows in batched bf16 GEMMs (~42% of the
 * absorbed bf16x3 form's products at the model's shape). q [T][H][nope]
 * (q_b's output, rounded to bf16 as the absorbed form's W_UK product
 * rounds it), out [T][H][vd] (o_proj's input): the absorbed form's W_UK
 * and W_UV products are not needed. 0, -1 on error, 1 when not applicable
 * (no BLAS, GLM53_GPU_MLA_MHA=0, an arithmetic other than bf16x3, a
 * context past the softmax's row bound, an f32 kv_b): the absorbed form then. */
int gk_mla_mha_gemm(const float *q, const float *latent, const gpu_mat *kvb, const int *dense, const int *npools,
                    const int *tail, const int *pools, int T, const int *dpos, int pos0, int H, int nope, int vd, int kl,
                    int P, int K, float scale, float *out);
/* the same; *out16 on entry: bf16 rows are welcome (the output product
 * reads them through gk_matmul_xb16, same bits); on return 1 when out
 * holds bf16 (the fused kernel ran), 0 fp32. q16 (instead of q, from
 * gk_mla_q16): the queries already in bf16 [T][H][nope] (the fused kernel
 * rounds q so); an error where the fused kernel does not take the call */
int gk_mla_mha_gemm_out(const float *q, const void *q16, const float *latent, const gpu_mat *kvb, const int *dense,
                        const int *npools, const int *tail, const int *pools, int T, const int *dpos, int pos0, int H,
                        int nope, int vd, int kl, int P, int K, float scale, void *out, int *out16);
/* a bf16 buffer for the T tokens' queries when gk_mla_mha_gemm_out would
 * take this call with its fused kernel (the query product then writes
 * bf16 there, gk_prod.y16, and the fused kernel skips its rounding pass),
 * else NULL; valid until the next call. On by default (same bits, 1-5 ms
 * per 4096-token prefill on an H100); GLM53_GPU_MLA_Q16=0 or
 * gk_set_mla_q16(0) turns it off (-1: the environment) */
void *gk_mla_q16(const gpu_mat *kvb, int T, int pos0, int H, int nope, int vd, int kl, int P, int K);
void gk_set_mla_q16(int on);
/* -1: the environment (GLM53_GPU_MLA_MHA, default on), 0/1: off/on */
void gk_set_mla_mha(int on);
int gk_mla_mha_on(void);
/* its fused (flash) kernel for the model's widths (CUDA): -1 the
 * environment (GLM53_GPU_MLA_FLASH, default on), 0 the batched GEMMs, 1 on */
void gk_set_mla_flash(int on);
int gk_mla_flash_on(void);
/* whether the fused kernel runs for these widths and pool size (on, CUDA,
 * nope/vd 256/256 or 64/32, P a power of two) */
int gk_mla_flash_fits(int nope, int vd, int P);
/* its keys per tile: -1 the environment (GLM53_GPU_MLA_FLASH_BN, 32 by
 * default), 32 or 64 */
void gk_set_mla_flash_bn(int bn);
int gk_mla_flash_bn(void);
/* its warpgroup (wgmma) kernel, which takes precedence over the mma.sync
 * one where it can run: gk_init records whether it can (a compute 9.0
 * device and sm_90a device code: gk_mla_flash_wg_detect); -1 the
 * environment (GLM53_GPU_MLA_FLASH_WG, default on), 0 off, 1 on. The
 * query says whether it runs. */
int gk_mla_flash_wg_detect(int cc_major, int cc_minor);
void gk_set_mla_flash_wg(int on);
int gk_mla_flash_wg(void);
/* its keys per tile: -1 the environment (GLM53_GPU_MLA_FLASH_WG_BN, 64 by
 * default: one stage of K and V tiles), 64, or 32 (two stages: the next
 * tile loads during all of this one's work) */
void gk_set_mla_flash_wg_bn(int bn);
int gk_mla_flash_wg_bn(void);
/* its two wgmma product forms alone (tests): D1 [64 x 64] = A . B, D2 [64
 * x 32] = A . B[:, :32] for bf16 A [64 x 16], B [16 x 64] row-major; mode
 * 0 the no-swizzle layout, 1 the same with the descriptors' LBO and SBO
 * exchanged (a diagnostic: wrong results expected), 2 the 128-byte swizzle
 * of the fused kernel; 1 when the device or build has no wgmma */
int gk_wgmma_check(const uint16_t *A, const uint16_t *B, float *D1, float *D2, int mode);
/* the fused kernel alone (gk_mla_mha_gemm calls it; bench/gpu/gpu_mla.c
 * times it): the words per token of its selection bitmap, and the launch
 * (Q16 [T][H][nope] bf16; KV3 rows [n][h][K hi, K lo, V hi, V lo] bf16,
 * lrows of them; map T x map_words scratch; out [T][H][vd]): 0, -1 on
 * error, 1 when it does not apply */
int gk_mla_flash_map_words(int lrows, int P);
int gk_mla_flash(const uint16_t *Q16, const uint16_t *KV3, const int *dense, const int *npools, const int *tail,
                 const int *pools, int K, const int *dpos, int T, int H, int nope, int vd, int P, int lrows, float scale,
                 uint32_t *map, float *out);
/* the same, out16: out as bf16 rows (raw bits, the rounding of the output
 * product's x on the cuBLAS path) */
int gk_mla_flash_out(const uint16_t *Q16, const uint16_t *KV3, const int *dense, const int *npools, const int *tail,
                     const int *pools, int K, const int *dpos, int T, int H, int nope, int vd, int P, int lrows, float scale,
                     uint32_t *map, void *out, int out16);
/* timing diagnostics of the warpgroup kernel (bench only; its results are
 * then wrong): MW_DG_* bits of stages to leave out (gk_mla_flash_wg.cuh),
 * 0 none; -1 for a combination not compiled in for the keys per tile set
 * now (gk_set_mla_flash_wg_bn first) */
int gk_set_mla_flash_wg_diag(int dg);
/* its block order: groups of hg heads (hg dividing H, else 1), each
 * group's token tiles for its heads in turn; -1 the environment
 * (GLM53_GPU_MLA_FLASH_HG, default 4) */
void gk_set_mla_flash_wg_hg(int hg);
int gk_mla_flash_wg_hg(void);
enum { GK_MLA_FP32 = 0, GK_MLA_TF32 = 1, GK_MLA_BF16X9 = 2, GK_MLA_BF16X3 = 3, GK_MLA_BF16X4 = 4, GK_MLA_NMATH = 5 };
int gk_mla_math(void);
void gk_set_mla_math(int mode);
const char *gk_mla_math_name(int mode);
double gk_mla_math_tol(int mode);

/* ---- MoE ---- */
#define GK_ROUTE_E_MAX 512 /* routed experts bound of the route (its shared memory) */
int gk_moe_route(const float *logits, const float *bias, int T, int E, int k, int G, int topk_group, int norm,
                 float scaling, int *idx, float *wt);
/* the same, and with wset (the layer's device [E][3] expert matrices, all
 * resident) the selected experts' gate and up weights prefetched into L2
 * (gk_set_expert_l2pf) for single-token launches; wset NULL: gk_moe_route */
int gk_moe_route_pf(const float *logits, const float *bias, int T, int E, int k, int G, int topk_group, int norm,
                    float scaling, int *idx, float *wt, const gpu_mat *wset);
/* gk_moe_route_pf for one token that also writes grp as gk_expert_group
 * would (same ints): one launch fewer per MoE layer at decode. 1: declined
 * (T != 1, or GLM53_GPU_ROUTE_GROUP=0 / gk_set_route_group(0)), 0, -1 */
int gk_moe_route_group(const float *logits, const float *bias, int T, int E, int k, int G, int topk_group, int norm,
                       float scaling, int *idx, float *wt, const gpu_mat *wset, int *grp);
void gk_set_route_group(int on); /* -1: GLM53_GPU_ROUTE_GROUP (default on) */
int gk_route_group_on(void);
/* The routing of a router product done inside its launch (decode): the
 * router's last block to finish routes the n tokens as gk_moe_route does
 * (the same code: the same ids and weights) and, for one token with grp
 * given and the grouping on (gk_route_group_on), writes grp as
 * gk_moe_route_group does; one launch fewer per MoE layer. */
typedef struct {
  const float *bias;
  int E, k, G, topk_group, norm;
  float scaling;
  int *idx, *grp; /* grp: NULL, or the one-token grouping */
  float *wt;
} gk_route_req;
/* gk_matmul_multi of p[0..np) (product rp: the router, logits [n][E] with
 * ldy E), routed as q says. 0: routed (and grouped, if asked for one
 * token); 2: routed, grp not written (n != 1 or the grouping off); 1:
 * nothing launched (the cuBLAS path, the kernel's bounds, the route's L2
 * prefetch on, x rows not 16-byte aligned, or off: opt-in until measured
 * on a device, GLM53_GPU_ROUTE_FUSE=1 / gk_set_route_fuse(1));
 * -1 error */
int gk_matmul_route(const gk_prod *p, int np, const float *x, int n, int ldx, int rp, const gk_route_req *q);
void gk_set_route_fuse(int on); /* -1: GLM53_GPU_ROUTE_FUSE (default off) */
int gk_moe_combine(float *out, const float *eo, const int *idx, const float *wt, int T, int k, int D);
int gk_gather_rows(float *dst, const float *src, const int *rows, int n, int D);
int gk_scatter_rows(float *dst, const float *src, const int *rows, int n, int D);

/* Routed experts of long chunks as bf16 GEMMs over expert-sorted pairs
 * (gk_moe_gemm.cu). gk_moe_sort: stable order of the np pairs of idx by
 * expert, perm[slot] = pair for the routed ones, off[E + 1] the first slot
 * per expert (device). gk_moe_experts_gemm (hoff: off copied to the host):
 * eo[erow[pair]] = down(swiglu(gate, up)) of the pair's token row of x
 * (T rows, ldx apart), for every expert matrix format (quantized ones dequantised to bf16 per
 * expert); rows may be padded per expert, so g, u and eo need
 * gk_moe_gemm_rows(np) rows (fp32, I, I and D wide). Activations rounded
 * to bf16 (as gk_matmul's cuBLAS path). Where gk_moe_bf16_out() (the
 * default) the GEMMs write bf16: gate and up, and eo as bf16 rows of D
 * (raw bits, at the start of the same buffers; gk_mhc_post_moe with
 * eo_bf16 reads them): half the bytes of the widest activations of a
 * prefill, where the next step rounds to bf16 anyway (h) or adds them once. */
int gk_moe_sort(const int *idx, int np, int E, int *perm, int *off);
size_t gk_moe_gemm_rows(int npairs);
int gk_moe_experts_gemm(const gpu_mat *h_exp, int E, const int *hoff, const int *off, const int *perm, const int *idx, int k,
                        const float *x, int ldx, int T, int D, int I, float limit, float *g, float *u, float *eo, int *erow);
/* its gather from a bf16 copy of x's T rows (1, default; x's gk_xb_alias
 * where registered), from the fp32 rows (0; GLM53_GPU_MOE_X16=0), or from
 * a copy made right before it even where x has an alias (2;
 * GLM53_GPU_MOE_X16=fresh): the same bits; -1 the environment */
void gk_set_moe_x16(int on);
/* bf16 gate / up / eo (1), or fp32 (0; GLM53_GPU_MOE_OUT=f32); -1 the environment */
void gk_set_moe_bf16_out(int on);
int gk_moe_bf16_out(void);

/* ---- CUDA graphs (decode replay) ---- */
int gk_graphs_supported(void);       /* 0 in the HIP build */
int gk_capture_begin(void);
int gk_capture_end(void **exec);     /* instantiates the captured launches */
int gk_graph_launch(void *exec);
void gk_graph_free(void *exec);
unsigned gk_scratch_gen(void);       /* changes whenever a shared scratch buffer moves */

/* ---- streaming (gk_stream.cu): a copy stream ordered against the compute
 * stream by events ---- */
void *gk_host_pinned(size_t n);       /* page-locked host memory, NULL on failure */
void gk_host_pinned_free(void *p);
void *gk_sync_event_new(void);        /* an event without timing; free with gk_event_free */
int gk_copy_h2d_async(void *d, const void *h, size_t n); /* on the copy stream */
int gk_event_on_copy(void *e);        /* record on the copy stream */
int gk_event_on_compute(void *e);     /* record on the compute stream */
int gk_copy_wait(void *e);            /* the copy stream waits for e */
int gk_compute_wait(void *e);         /* the compute stream waits for e */
int gk_event_sync(void *e);           /* the host waits for e */
int gk_d2h_async(void *h, const void *d, size_t n); /* on the compute stream (h pinned) */
int gk_h2d_compute(void *d, const void *h, size_t n); /* on the compute stream, ordered with the kernels */
double gk_time_h2d_gbs(size_t bytes, int reps);     /* pinned host -> device GB/s */
int gk_mem_info(size_t *free_b, size_t *total_b);

/* ---- timing (bench) ---- */
int gk_fill_random(void *p, size_t bytes, unsigned seed); /* bf16 pairs in [-2, 2] */
double gk_time_d2d_gbs(size_t bytes, int reps);       /* (read+write) GB/s */
double gk_time_bf16_gemm_tflops(int m, int n, int k, int reps);
void *gk_event_new(void);
void gk_event_record(void *e);
float gk_event_ms(void *a, void *b);                  /* synchronises on b */
void gk_event_free(void *e);

#ifdef __cplusplus
}
#endif
#endif

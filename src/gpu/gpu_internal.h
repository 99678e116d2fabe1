/* Shared between the gpu backend and its startup validation. */
#ifndef GLM53_GPU_INTERNAL_H
#define GLM53_GPU_INTERNAL_H
#include "gpu/kernels/gk.h"
#include "model/wmat.h"
#include <stdint.h>

struct glm53_model;

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
/* name of the startup check of gk_mla_attn_gemm (optional: a failure turns
 * the GEMM form off, the per-head kernel remains) */
#define GPU_CHECK_MLA_GEMM "mla attention, GEMM form (prefix+gather)"
/* ... and of gk_mla_mha_gemm, the per-head form with its fused kernel
 * (optional: a failure turns the per-head form off, the absorbed one remains) */
#define GPU_CHECK_MLA_MHA "mla attention, per-head form (fused kernel)"
/* flash-decoding split of the MLA attention for a launch whose longest
 * segment (one sequence's run of tokens) has T tokens, over sequences of at
 * most max_ctx tokens: the smallest part (0 = no split: T >= gk_gemm_min())
 * and the number of parts (a function of max_ctx, never of positions) */
int gpu_mla_split(int T, int max_ctx, int K, int P, int kl, int *chunk);

/* ---- paged MLA latent / indexer caches (gpu_pages.c) ----
 * A model-wide pool of fixed-size device pages per page size (class),
 * grown by slabs, and per (session, layer, state) page tables: host copy
 * and the device table the kernels read (gk.h gk_lstate.pg). */
#define GPU_PAGE_CLASSES 4
typedef struct {
  size_t bytes;  /* one page */
  void **free;   /* pages not held by any session */
  int nfree, cap;
  long used;     /* pages held by sessions */
} gpu_page_class;
typedef struct {
  gpu_page_class cls[GPU_PAGE_CLASSES];
  int nclass;
  double bytes;                        /* device memory in slabs */
  void *(*alloc)(void *ctx, size_t n); /* slab allocations (the model's, freed with it) */
  void *ctx;
} gpu_pages;
typedef struct {
  void **host;  /* page pointers [cap] (n held) */
  void *dev;    /* the same on the device [cap] */
  int n, cap;
  int pshift;   /* 2^pshift rows a page */
  size_t page_bytes;
} gpu_ptab;
/* log2 of the rows per page: $GLM53_GPU_PAGE_TOKENS rounded down to a
 * power of two (default 256) */
int gpu_page_shift(void);
/* a table for up to max_rows rows, nothing held (dev via alloc) */
int gpu_ptab_init(gpu_ptab *t, size_t page_bytes, int max_rows, int pshift, void *(*alloc)(void *ctx, size_t n), void *ctx);
/* pages for rows [0, rows) (at most the table's capacity); -1 when the
 * device memory for them is missing (the pages it got are kept) */
int gpu_ptab_grow(gpu_ptab *t, gpu_pages *pp, int rows);
/* bytes of the pages that growing to `rows` would add to the table */
size_t gpu_ptab_need(const gpu_ptab *t, int rows);
/* bytes of the pool's pages that no session holds */
size_t gpu_pages_spare(const gpu_pages *pp);
#define GPU_PAGE_SLAB 16 /* pages per device allocation */
/* the pages back to the pool; the host table freed */
void gpu_ptab_release(gpu_ptab *t, gpu_pages *pp);
void gpu_pages_free(gpu_pages *pp);
/* Tests and the startup validation: a page table over rows [0, rows) of
 * `stride` floats, 2^pshift rows a page, the pages in reverse order in
 * one buffer (*buf, from alloc), holding host's rows (NULL: zeros);
 * returns the device table, NULL on failure. _read copies the rows back. */
void *gpu_pages_make(const float *host, int rows, int stride, int pshift, void *(*alloc)(void *ctx, size_t n), void *ctx,
                     float **buf);
int gpu_pages_read(float *host, const float *buf, int rows, int stride, int pshift);

/* ---- routed-expert placement and streaming (gpu_experts.c) ----
 * Experts that do not fit the VRAM budget stay in (pinned) host memory as
 * one blob each (gate, up, down data + scales) and are copied on demand by
 * the copy stream into device cache slots (LRU); events order the copies
 * against the compute stream, so no host synchronisation is needed beyond
 * learning the routing. See docs/gpu.md. */
typedef struct {
  size_t blob, off[6]; /* blob bytes; offsets of gate/up/down data and scales */
  char **host;         /* [E] host blob of a streamed expert, NULL when resident */
  int *slot;           /* [E] cache slot holding it, or -1 */
  uint32_t *freq;      /* [E] layer calls that used it (halved periodically) */
  int nstreamed;
} gpu_xlayer;

typedef struct {
  int active;         /* some expert is streamed */
  int nlayers, E;
  gpu_xlayer *L;      /* per layer (MoE layers only have host/slot arrays) */
  int nslots;
  size_t slot_bytes;
  char *dslots;       /* device: nslots * slot_bytes */
  int *s_layer, *s_exp;
  uint64_t *s_tick, *s_call;
  uint8_t *s_pref;    /* per slot: filled by a look-ahead prefetch, not yet used */
  void **s_free, **s_ready; /* per slot: last compute use done / copy done */
  uint64_t tick, call;
  int lfu;            /* eviction: 1 least frequently used (ties: least recent), 0 least recently used */
  uint64_t uses;      /* streamed-expert uses, for the periodic halving of freq */
  char *host;         /* all streamed blobs */
  int host_pinned;
  int *h_idx;         /* routing read back per MoE layer (pinned when possible) */
  size_t h_idx_cap;
  int h_idx_pinned;
  void *route_ev;
  long resident, streamed;
  double resident_bytes, budget_bytes;
  uint64_t uses_resident, hits, misses, bytes_h2d;
  uint64_t prefetches, prefetch_hits; /* look-ahead copies; those a later layer call used */
} gpu_xcache;

/* Uploads the resident experts with up() and stages the others; h_exp[l]
 * (E*3 mats per MoE layer) gets the device matrices (data NULL for streamed
 * experts until fetched). budget_bytes: VRAM for routed experts including the
 * cache slots (< 0: everything resident); nslots > 0 forces the cache size. */
int gpu_xcache_init(gpu_xcache *x, const struct glm53_model *m, gpu_mat **h_exp, double budget_bytes, int nslots,
                    int (*up)(void *ctx, const wmat *w, gpu_mat *o), void *(*alloc)(void *ctx, size_t n), void *ctx);
void gpu_xcache_free(gpu_xcache *x);
/* the pinned buffer for np routing ids */
int *gpu_xcache_idx(gpu_xcache *x, size_t np);
/* Start of one MoE layer's use. */
void gpu_xcache_begin(gpu_xcache *x);
/* Puts expert e of layer l on the device (no-op when resident or cached):
 * picks a slot (LRU; with evict_current == 0 never one already used by this
 * layer's call, returning 1 when none is free), waits on the copy stream for
 * the slot's last use, copies, and points h_exp_l/d_exp_l[e*3..] at it. */
int gpu_xcache_fetch(gpu_xcache *x, int l, int e, gpu_mat *h_exp_l, gpu_mat *d_exp_l, int evict_current);
/* Cache bookkeeping, no device work (gpu_xcache_fetch is these plus the
 * copy; tests/gpu/test_gpu_expert_policy.c drives them directly):
 * lookup: the slot holding streamed expert e of layer l (a hit, counted
 * once per layer call), or -1; pick: the slot to overwrite, an empty one,
 * else by policy among the slots the current call does not hold (with
 * evict_current among those too when none is left), or -1; assign: slot s
 * now holds (l, e) (a miss); count: one use of (l, e) in freq, every count
 * halved after 64 uses per slot so that old popularity fades. */
int gpu_xcache_lookup(gpu_xcache *x, int l, int e);
int gpu_xcache_pick(const gpu_xcache *x, int evict_current);
void gpu_xcache_assign(gpu_xcache *x, int s, int l, int e);
void gpu_xcache_count(gpu_xcache *x, int l, int e);
/* Look-ahead (moe_stream): expert e of a later layer l, guessed from an
 * earlier layer's routing input, copied ahead of its use into a slot the
 * current call does not hold. prefetch_slot is the bookkeeping: the slot
 * now assigned to (l, e) and marked prefetched (no miss is counted; the
 * later call's lookup counts a hit and a prefetch hit), or GPU_XC_HELD when
 * e is resident or already cached (then protected like the current call's
 * experts), or GPU_XC_FULL when every slot is held by the current call.
 * prefetch: that plus the copy; returns GPU_XC_FULL, 0, or -1 on a device
 * error. */
#define GPU_XC_HELD (-1)
#define GPU_XC_FULL (-2)
int gpu_xcache_prefetch_slot(gpu_xcache *x, int l, int e);
/* How many guessed experts a layer call may copy ahead (look-ahead mode
 * GLM53_GPU_LA_*, own: the copies of its own experts it queued): every
 * guess (ALL), none (OFF), or in IDLE mode GPU_LA_IDLE_MAX, and only when
 * own is 0. Why: a streamed decode step is bound by the host link (a
 * 50 MB bf16 expert takes ~0.9 ms at 55 GB/s, a layer's compute ~0.3 ms),
 * so a guess queued behind the layer's own copies delays the next layer's
 * real misses and a wrong one only adds bytes (ALL measured 30-40% slower
 * than OFF in gpu_decode's stream bench, docs/gpu-measurements.md,
 * nineteenth session); only a layer that copies nothing leaves the link
 * idle. */
#define GPU_LA_IDLE_MAX 1
int gpu_xcache_lookahead_quota(int mode, uint64_t own);
int gpu_xcache_prefetch(gpu_xcache *x, int l, int e, gpu_mat *h_exp_l, gpu_mat *d_exp_l);
/* The compute stream waits for expert e's copy. */
int gpu_xcache_ready(gpu_xcache *x, int l, int e);
/* After the launches that read expert e: its slot may be reused after them. */
int gpu_xcache_done(gpu_xcache *x, int l, int e);

#endif

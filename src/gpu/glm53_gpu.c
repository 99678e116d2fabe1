/* The gpu backend: weight upload (model_init), device-resident session
 * caches (session_init) and the forward, which mirrors src/model/forward.c
 * step for step with the device kernels of src/gpu/kernels. One stream; the
 * only host round trips are the token upload, the logits download, the
 * per-expert pair counts of chunks of >= gk_gemm_min() tokens (cuBLAS takes
 * GEMM sizes from the host; the pairs are sorted on the device) and the
 * routed-expert ids of MoE layers with streamed experts (gpu_experts.c:
 * which experts to copy). Forwards are serialised by a mutex because
 * the GEMM scratch buffers are shared. */
#include "gpu/glm53_gpu.h"
#include "gpu/kernels/gk.h"
#include "gpu/gpu_internal.h"
#include "model/model.h"
#include "model/session.h"
#include "core/err.h"
#include "core/log.h"
#include "core/util.h"
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct { gpu_mat gate, up, down; } gmlp;
typedef struct {
  gpu_mat q, k, v, fa, fb, b, ga, gb, o;
  float *conv, *dt_bias, *A_log, *o_norm;
} gkda;
typedef struct {
  gpu_mat q_a, q_b, kv_a, kv_b, o;
  gpu_mla_heads heads; /* W_UK^T / W_UV per head */
  float *q_a_norm, *kv_a_norm;
  int has_idx;
  gpu_mat wq_b, wk, wproj, gate;
  float *knw, *knb, *ape;
} gmla;
typedef struct {
  gpu_mat fn;
  float *base, *scale;
} ghc;
typedef struct {
  float *in_norm, *post_norm;
  ghc hc[2];
  gkda kda;
  gmla mla;
  gmlp dense;
  gpu_mat router;
  float *bias;
  gpu_mat *h_exp;  /* host copy of the [E][3] expert matrices (device pointers) */
  gpu_mat *d_exp;  /* the same array on the device, for the decode expert GEMV */
  int efmt;
  gmlp shared;
} glayer;

/* one captured decode step of T tokens (T = index in grun.g) */
typedef struct {
  void *exec;
  unsigned gen;   /* gk_scratch_gen() at capture */
  int warm;       /* one uncaptured step ran with the current buffers and key */
  int chunk, ns;  /* key: the MLA split of the captured launches */
} ggraph;
#define GRAPH_T 32 /* graphs for decode steps of 1..31 tokens */

/* Activations arena, logits rows and decode graphs of one kind of forward:
 * each session has one for its own forwards, the model one for batched
 * decode steps (g_lock serialises both). */
typedef struct {
  void *arena;
  size_t arena_bytes, arena_part; /* arena_part: floats of MLA split partials */
  int arena_T, arena_mp;          /* tokens; score row stride (pools) */
  float *dlogits;
  int dlogits_rows;
  ggraph g[GRAPH_T];
  int graph_off; /* capture failed once: direct launches from then on */
} grun;

typedef struct {
  gpu_mat embed, lm_head;
  float *final_norm;
  glayer *layers;
  void **allocs;
  int nallocs, cap;
  size_t bytes;
  gpu_xcache xc; /* routed-expert placement / streaming */
  grun batch;    /* batched decode (glm53_forward_batch) */
  gpu_pages pages; /* the sessions' MLA latent and indexer cache pages */
} gmodel;

typedef struct {
  gk_lstate *ls;   /* per layer: KDA conv + recurrent state, MLA latent cache, indexer keys / gates / pooled keys */
  gk_lstate *d_ls; /* the same pointers on the device (the batch tables point here) */
  gpu_ptab *pt;    /* [layer * GK_ST_N + which]: the paged states' page tables */
  void **allocs;
  int nallocs, cap;
  grun run;
  int maxpool, pshift;
} gsession;

static void grun_drop_graphs(grun *R) {
  for (int i = 0; i < GRAPH_T; i++) {
    gk_graph_free(R->g[i].exec);
    memset(&R->g[i], 0, sizeof R->g[i]);
  }
}
static void grun_free(grun *R) {
  grun_drop_graphs(R);
  gk_free(R->arena);
  gk_free(R->dlogits);
  memset(R, 0, sizeof *R);
}

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
/* MLA attention and indexer scores of long single-sequence chunks through
 * cuBLAS (gk_mla_attn_gemm, gk_indexer_scores_gemm): on unless
 * GLM53_GPU_MLA_GEMM=0 or the attention's startup check failed */
static int g_mla_gemm = -1;
void glm53_gpu_set_mla_gemm(int on) { g_mla_gemm = on ? 1 : 0; }
static int mla_gemm_on(void) {
  if (g_mla_gemm < 0) g_mla_gemm = !(getenv("GLM53_GPU_MLA_GEMM") && !strcmp(getenv("GLM53_GPU_MLA_GEMM"), "0"));
  return g_mla_gemm;
}
static const glm53_backend gpu_backend;

/* GLM53_GPU_PROFILE=1: synchronise around each stage and accumulate wall
 * time per stage (bench/gpu prints it; adds a sync per stage, so totals
 * run slower than unprofiled) */
enum { PR_EMBED, PR_MHC, PR_KDA, PR_MLA, PR_IDX, PR_DENSE, PR_MOE, PR_HEAD, PR_N };
static const char *pr_names[PR_N] = {"embed", "mhc", "kda", "mla", "indexer", "dense mlp", "moe", "final+lm_head"};
static double pr_sec[PR_N];
static int pr_on = -1; /* set by the first pr_mark, which precedes any use */
static double pr_t;
static void pr_mark(int stage) {
  if (stage >= 0) gk_kprof_stage(pr_names[stage]); /* no-op unless a bench profiles kernels */
  if (pr_on < 0) pr_on = getenv("GLM53_GPU_PROFILE") && !strcmp(getenv("GLM53_GPU_PROFILE"), "1");
  if (!pr_on) return;
  gk_sync();
  double t = now_sec();
  if (stage >= 0) pr_sec[stage] += t - pr_t;
  pr_t = t;
}
void glm53_gpu_profile_dump(const char *label) {
  if (pr_on != 1) return;
  double tot = 0;
  for (int i = 0; i < PR_N; i++) tot += pr_sec[i];
  printf("profile %s:", label);
  for (int i = 0; i < PR_N; i++) printf(" %s %.2f ms (%.0f%%);", pr_names[i], pr_sec[i] * 1e3, 100 * pr_sec[i] / (tot > 0 ? tot : 1));
  printf("\n");
  memset(pr_sec, 0, sizeof pr_sec);
}
static gk_devinfo g_info;
static int g_info_state; /* 0 unknown, 1 ok, -1 none */
static char g_info_why[256];
static char g_desc[512];

/* ---------------- device discovery ---------------- */
int glm53_gpu_available(char *why, size_t whylen) {
  pthread_mutex_lock(&g_lock);
  if (!g_info_state) {
    if (gk_init(&g_info) == 0) g_info_state = 1;
    else {
      g_info_state = -1;
      snprintf(g_info_why, sizeof g_info_why, "%s", gk_error());
    }
  }
  int ok = g_info_state == 1;
  pthread_mutex_unlock(&g_lock);
  if (!ok && why) snprintf(why, whylen, "%s", g_info_why);
  return ok;
}

const char *glm53_gpu_device_desc(void) {
  char why[256];
  if (!glm53_gpu_available(why, sizeof why)) snprintf(g_desc, sizeof g_desc, "no GPU: %s", why);
  else
    snprintf(g_desc, sizeof g_desc, "%s (%s, %d SMs, %.1f GiB, %.1f GiB free, %d device%s)", g_info.name, g_info.arch,
             g_info.sm_count, g_info.mem_total / 1073741824.0, g_info.mem_free / 1073741824.0, g_info.count,
             g_info.count > 1 ? "s" : "");
  return g_desc;
}

/* ---------------- allocation bookkeeping ---------------- */
static void *track(void ***list, int *n, int *cap, void *p) {
  if (!p) return NULL;
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 256;
    *list = xrealloc(*list, (size_t)*cap * sizeof(void *));
  }
  (*list)[(*n)++] = p;
  return p;
}
static void *mdev(gmodel *g, size_t n) {
  void *p = track(&g->allocs, &g->nallocs, &g->cap, gk_malloc(n));
  if (p) g->bytes += n;
  return p;
}

static void *mdev_cb(void *ctx, size_t n) { return mdev(ctx, n); }

/* at: the device bytes to fill (up_adjacent's), NULL: a new allocation */
static int up_mat_at(gmodel *g, const wmat *w, gpu_mat *o, void *at) {
  memset(o, 0, sizeof *o);
  if (w->fmt == WMAT_NONE) return 0;
  if (w->fmt < WMAT_F32 || w->fmt > WMAT_Q4) return glm53_err("gpu: weight format %d not supported", w->fmt);
  o->fmt = w->fmt; o->rows = w->rows; o->cols = w->cols; o->group = w->group; o->scale_bf16 = w->scale_bf16;
  size_t nb = wmat_data_bytes(w);
  void *d = at ? at : mdev(g, nb);
  if (!d || gk_h2d(d, w->data, nb)) return glm53_err("gpu: %s", gk_error());
  o->d = d;
  if (w->fmt == WMAT_Q8 || w->fmt == WMAT_Q4) {
    if (w->group <= 0 || w->cols % w->group) return glm53_err("gpu: quantized matrix with group %d not dividing %d columns", w->group, w->cols);
    size_t sb = wmat_scale_bytes(w);
    void *s = mdev(g, sb);
    if (!s || gk_h2d(s, w->scales, sb)) return glm53_err("gpu: %s", gk_error());
    o->s = s;
  }
  return 0;
}
static int up_mat(gmodel *g, const wmat *w, gpu_mat *o) { return up_mat_at(g, w, o, NULL); }
/* n bf16 matrices of one width in one allocation, each right after the
 * previous (sizes multiples of 256 bytes, so each stays aligned alone):
 * gk_matmul_multi then runs their products of one x as one GEMM where
 * their outputs are adjacent too (the KDA q | k | v). Else one each. */
static int up_adjacent(gmodel *g, const wmat *const *w, gpu_mat *const *o, int n) {
  size_t total = 0;
  int ok = 1;
  for (int i = 0; i < n; i++) {
    ok &= w[i]->fmt == WMAT_BF16 && w[i]->cols == w[0]->cols && wmat_data_bytes(w[i]) % 256 == 0;
    total += wmat_data_bytes(w[i]);
  }
  char *d = ok ? mdev(g, total) : NULL;
  if (ok && !d) return glm53_err("gpu: %s", gk_error());
  for (int i = 0; i < n; i++) {
    if (up_mat_at(g, w[i], o[i], d)) return -1;
    if (d) d += wmat_data_bytes(w[i]);
  }
  return 0;
}
static float *up_vec(gmodel *g, const float *v, size_t n, int *rc) {
  if (!v) return NULL;
  float *d = mdev(g, n * sizeof(float));
  if (!d || gk_h2d(d, v, n * sizeof(float))) *rc = glm53_err("gpu: %s", gk_error());
  return d;
}
static int up_mlp(gmodel *g, const mlp_weights *w, gmlp *o) {
  return up_mat(g, &w->gate, &o->gate) || up_mat(g, &w->up, &o->up) || up_mat(g, &w->down, &o->down) ? -1 : 0;
}

int gpu_mla_split(int T, int max_ctx, int K, int P, int kl, int *chunk) {
  *chunk = T < gk_gemm_min() ? gk_mla_split_tile(kl) : 0;
  if (!*chunk) return 1;
  const int maxN = max_ctx < (K + 1) * P ? max_ctx : (K + 1) * P; /* bound of any query's selection */
  return gk_mla_nsplit(maxN, *chunk);
}

int gpu_build_mla_heads(const wmat *w, const gpu_mat *dkvb, int H, int nope, int vd, void *(*alloc)(void *ctx, size_t n),
                        void *ctx, gpu_mla_heads *out) {
  const int kl = w->cols, f32 = w->fmt == WMAT_F32;
  const size_t es = f32 ? 4 : 2, per = (size_t)kl * nope;
  memset(out, 0, sizeof *out);
  out->uk_h = xcalloc((size_t)H, sizeof(gpu_mat));
  out->uv_h = xcalloc((size_t)H, sizeof(gpu_mat));
  void *buf = alloc(ctx, (size_t)H * per * es);
  out->uk_d = alloc(ctx, (size_t)H * sizeof(gpu_mat));
  out->uv_d = alloc(ctx, (size_t)H * sizeof(gpu_mat));
  if (!buf || !out->uk_d || !out->uv_d) return glm53_err("gpu: %s", gk_error());
  char *host = xmalloc((size_t)H * per * es);
  float *row = xmalloc((size_t)kl * sizeof(float));
  for (int h = 0; h < H; h++)
    for (int i = 0; i < nope; i++) {
      wmat_get_row(w, h * (nope + vd) + i, row);
      for (int j = 0; j < kl; j++) {
        size_t at = (size_t)h * per + (size_t)j * nope + i;
        if (f32) ((float *)host)[at] = row[j];
        else ((uint16_t *)host)[at] = f32_to_bf16(row[j]);
      }
    }
  int rc = gk_h2d(buf, host, (size_t)H * per * es);
  free(host);
  free(row);
  if (rc) return glm53_err("gpu: %s", gk_error());
  const size_t ng = w->fmt >= WMAT_Q8 ? (size_t)kl / w->group : 0;
  for (int h = 0; h < H; h++) {
    gpu_mat *u = &out->uk_h[h], *v = &out->uv_h[h];
    u->fmt = f32 ? WMAT_F32 : WMAT_BF16; u->rows = kl; u->cols = nope;
    u->d = (const char *)buf + (size_t)h * per * es;
    size_t r0 = (size_t)h * (nope + vd) + nope; /* first W_UV row of head h */
    *v = *dkvb;
    v->rows = vd;
    size_t off = w->fmt == WMAT_F32 ? r0 * kl * 4 : w->fmt == WMAT_BF16 ? r0 * kl * 2 : w->fmt == WMAT_Q8 ? r0 * kl : r0 * kl / 2;
    v->d = (const char *)dkvb->d + off;
    if (ng) v->s = (const char *)dkvb->s + r0 * ng * 2;
  }
  if (gk_h2d(out->uk_d, out->uk_h, (size_t)H * sizeof(gpu_mat)) || gk_h2d(out->uv_d, out->uv_h, (size_t)H * sizeof(gpu_mat)))
    return glm53_err("gpu: %s", gk_error());
  return 0;
}

/* Limits of the device kernels; an unsupported config fails model_init so
 * that "auto" falls back to the cpu backend. */
static int check_dims(const glm53_config *c) {
  if (c->hc_mult > 16) return glm53_err("gpu: hc_mult %d above 16", c->hc_mult);
  if (c->kv_lora_rank > 512) return glm53_err("gpu: kv_lora_rank %d above 512", c->kv_lora_rank);
  if (c->linear_head_dim > 256) return glm53_err("gpu: linear_head_dim %d above 256", c->linear_head_dim);
  if (c->n_routed_experts > GK_ROUTE_E_MAX || c->n_group > 64 || c->num_experts_per_tok > 64)
    return glm53_err("gpu: MoE shape (%d experts, %d groups, top-%d) above the router kernel's bounds", c->n_routed_experts,
                     c->n_group, c->num_experts_per_tok);
  if (c->index_kpool > 64) return glm53_err("gpu: index_kpool %d above 64", c->index_kpool);
  if (c->qk_rope_head_dim != 0) return glm53_err("gpu: qk_rope_head_dim must be 0");
  return 0;
}

static void gpu_model_free(glm53_model *m) {
  gmodel *g = m->backend_model;
  if (!g) return;
  if (g->xc.active) {
    const gpu_xcache *x = &g->xc;
    uint64_t u = x->hits + x->misses;
    LOG_INFO("gpu experts at model free: %llu cache hits, %llu misses (hit rate %.1f%%), %llu look-ahead copies "
             "(%llu used), %.3f GB copied host->device, %llu uses of resident experts",
             (unsigned long long)x->hits, (unsigned long long)x->misses, u ? 100.0 * x->hits / u : 0.0,
             (unsigned long long)x->prefetches, (unsigned long long)x->prefetch_hits, x->bytes_h2d / 1e9,
             (unsigned long long)x->uses_resident);
  }
  gk_sync(); /* copies in flight read the host blobs freed below */
  if (g->pages.bytes > 0) {
    long used = 0;
    for (int i = 0; i < g->pages.nclass; i++) used += g->pages.cls[i].used;
    LOG_INFO("gpu cache pages at model free: %.1f MB in slabs, %ld pages still held by sessions", g->pages.bytes / 1e6, used);
  }
  gpu_pages_free(&g->pages);
  gpu_xcache_free(&g->xc);
  grun_free(&g->batch);
  for (int i = 0; i < g->nallocs; i++) gk_free(g->allocs[i]);
  if (g->layers)
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
      free(g->layers[l].h_exp);
      free(g->layers[l].mla.heads.uk_h);
      free(g->layers[l].mla.heads.uv_h);
    }
  free(g->allocs);
  free(g->layers);
  free(g);
  m->backend_model = NULL;
}

static int upload(glm53_model *m, gmodel *g) {
  const glm53_config *c = &m->cfg;
  const int D = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc;
  int rc = 0;
  if (up_mat(g, &m->embed, &g->embed) || up_mat(g, &m->lm_head, &g->lm_head)) return -1;
  g->final_norm = up_vec(g, m->final_norm, D, &rc);
  g->layers = xcalloc((size_t)c->num_hidden_layers, sizeof(glayer));
  for (int l = 0; l < c->num_hidden_layers && !rc; l++) {
    const layer_weights *L = &m->layers[l];
    glayer *G = &g->layers[l];
    G->in_norm = up_vec(g, L->input_norm, D, &rc);
    G->post_norm = up_vec(g, L->post_attn_norm, D, &rc);
    const mhc_weights *hs[2] = {&L->hc_attn, &L->hc_ffn};
    for (int i = 0; i < 2; i++) {
      wmat fn = {.fmt = WMAT_F32, .rows = mix, .cols = hc * D, .data = hs[i]->fn};
      if (up_mat(g, &fn, &G->hc[i].fn)) return -1;
      G->hc[i].base = up_vec(g, hs[i]->base, mix, &rc);
      G->hc[i].scale = up_vec(g, hs[i]->scale, 3, &rc);
    }
    if (L->attn_kind == ATTN_KDA) {
      const kda_weights *k = &L->kda;
      gkda *o = &G->kda;
      int inner = c->linear_num_heads * c->linear_head_dim;
      const wmat *qkv[3] = {&k->q_proj, &k->k_proj, &k->v_proj};
      gpu_mat *const oqkv[3] = {&o->q, &o->k, &o->v};
      if (up_adjacent(g, qkv, oqkv, 3) || up_mat(g, &k->f_a, &o->fa) || up_mat(g, &k->f_b, &o->fb) || up_mat(g, &k->b_proj, &o->b) ||
          up_mat(g, &k->g_a, &o->ga) || up_mat(g, &k->g_b, &o->gb) || up_mat(g, &k->o_proj, &o->o))
        return -1;
      o->conv = up_vec(g, k->conv, (size_t)3 * inner * c->linear_conv_kernel_dim, &rc);
      o->dt_bias = up_vec(g, k->dt_bias, inner, &rc);
      o->A_log = up_vec(g, k->A_log, c->linear_num_heads, &rc);
      o->o_norm = up_vec(g, k->o_norm, c->linear_head_dim, &rc);
    } else {
      const mla_weights *a = &L->mla;
      gmla *o = &G->mla;
      if (up_mat(g, &a->q_a, &o->q_a) || up_mat(g, &a->q_b, &o->q_b) || up_mat(g, &a->kv_a, &o->kv_a) ||
          up_mat(g, &a->kv_b, &o->kv_b) || up_mat(g, &a->o_proj, &o->o))
        return -1;
      if (a->kv_b.fmt >= WMAT_Q8 && a->kv_b.group % 8)
        return glm53_err("gpu: kv_b quantization group %d not a multiple of 8", a->kv_b.group);
      if (gpu_build_mla_heads(&a->kv_b, &o->kv_b, c->num_attention_heads, c->qk_nope_head_dim, c->v_head_dim, mdev_cb, g,
                              &o->heads))
        return -1;
      o->q_a_norm = up_vec(g, a->q_a_norm, c->q_lora_rank, &rc);
      o->kv_a_norm = up_vec(g, a->kv_a_norm, c->kv_lora_rank, &rc);
      o->has_idx = a->has_indexer;
      if (a->has_indexer) {
        const indexer_weights *x = &a->idx;
        int hd = c->index_head_dim;
        if (up_mat(g, &x->wq_b, &o->wq_b) || up_mat(g, &x->wk, &o->wk) || up_mat(g, &x->weights_proj, &o->wproj) ||
            up_mat(g, &x->gate, &o->gate))
          return -1;
        o->knw = up_vec(g, x->k_norm_w, hd, &rc);
        o->knb = up_vec(g, x->k_norm_b, hd, &rc);
        o->ape = up_vec(g, x->ape, (size_t)c->index_kpool * hd, &rc);
      }
    }
    if (L->mlp_kind == MLP_DENSE) {
      if (up_mlp(g, &L->dense, &G->dense)) return -1;
    } else {
      const moe_weights *e = &L->moe;
      const int E = c->n_routed_experts;
      if (up_mat(g, &e->router, &G->router) || up_mlp(g, &e->shared, &G->shared)) return -1;
      G->bias = up_vec(g, e->bias, E, &rc);
      G->h_exp = xcalloc((size_t)E * 3, sizeof(gpu_mat)); /* filled by place_experts */
    }
  }
  return rc;
}

static int up_cb(void *ctx, const wmat *w, gpu_mat *o) { return up_mat(ctx, w, o); }

/* VRAM for routed experts: load option, else $GLM53_GPU_EXPERT_GB, else
 * auto (free device memory after the dense weights minus a reserve for
 * sessions and activations). -1: everything resident. */
static double expert_budget(const glm53_model *m) {
  double gb = m->gpu_expert_gb;
  const char *e = getenv("GLM53_GPU_EXPERT_GB");
  if (!(gb > 0) && e && *e) gb = atof(e) > 0 ? atof(e) : 1e-12; /* "0": nothing resident */
  if (gb > 0) return gb * 1e9;
  size_t fr = 0, tot = 0;
  if (gk_mem_info(&fr, &tot)) return -1;
  double reserve = 3.0 * (1 << 30) + 0.05 * (double)tot;
  return (double)fr > reserve ? (double)fr - reserve : 0;
}

/* Expert streaming's look-ahead mode (GLM53_GPU_LA_*; $GLM53_GPU_EXPERT_LOOKAHEAD
 * 0 | all | idle, default idle): decode steps and small batches only (a
 * long chunk uses most experts of every layer). */
static int g_lookahead = -1;
void glm53_gpu_set_expert_lookahead(int mode) {
  g_lookahead = mode == GLM53_GPU_LA_OFF || mode == GLM53_GPU_LA_ALL || mode == GLM53_GPU_LA_IDLE ? mode : -1;
}
static int lookahead_mode(void) {
  if (g_lookahead < 0) {
    const char *e = getenv("GLM53_GPU_EXPERT_LOOKAHEAD");
    g_lookahead = GLM53_GPU_LA_IDLE;
    if (e && (!strcmp(e, "0") || !strcmp(e, "off"))) g_lookahead = GLM53_GPU_LA_OFF;
    else if (e && (!strcmp(e, "all") || !strcmp(e, "1"))) g_lookahead = GLM53_GPU_LA_ALL;
    else if (e && *e && strcmp(e, "idle"))
      LOG_WARN("GLM53_GPU_EXPERT_LOOKAHEAD=%s: expected 0, all or idle; using idle", e);
  }
  return g_lookahead;
}

static int place_experts(glm53_model *m, gmodel *g) {
  const glm53_config *c = &m->cfg;
  const int E = c->n_routed_experts;
  gpu_mat **hx = xcalloc((size_t)c->num_hidden_layers, sizeof(gpu_mat *));
  for (int l = 0; l < c->num_hidden_layers; l++) hx[l] = g->layers[l].h_exp;
  const char *se = getenv("GLM53_GPU_EXPERT_SLOTS");
  double budget = expert_budget(m);
  int rc = gpu_xcache_init(&g->xc, m, hx, budget, se ? atoi(se) : 0, up_cb, mdev_cb, g);
  free(hx);
  if (rc) return -1;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    glayer *G = &g->layers[l];
    if (!G->h_exp) continue;
    G->efmt = G->h_exp[0].fmt;
    for (int i = 0; i < E * 3; i++) {
      const gpu_mat *x = &G->h_exp[i];
      if (x->fmt != G->efmt) return glm53_err("gpu: layer %d mixes expert weight formats", l);
      if (x->fmt >= WMAT_Q8 && x->group % 8) return glm53_err("gpu: expert quantization group %d not a multiple of 8", x->group);
    }
    G->d_exp = mdev(g, (size_t)E * 3 * sizeof(gpu_mat));
    if (!G->d_exp || gk_h2d(G->d_exp, G->h_exp, (size_t)E * 3 * sizeof(gpu_mat))) return glm53_err("gpu: %s", gk_error());
  }
  if (g->xc.active) {
    static const char *la[] = {"off", "every guess", "idle"};
    LOG_INFO("gpu experts: %ld resident (%.2f GB), %ld streamed from %s host memory through %d cache slots of %.1f MB "
             "(budget %.2f GB); decode graph replay off while streaming; look-ahead %s",
             g->xc.resident, g->xc.resident_bytes / 1e9, g->xc.streamed, g->xc.host_pinned ? "pinned" : "pageable",
             g->xc.nslots, g->xc.slot_bytes / 1e6, budget / 1e9, la[lookahead_mode()]);
  }
  return 0;
}

static int gpu_model_init(glm53_model *m) {
  char why[256];
  if (!glm53_gpu_available(why, sizeof why)) return glm53_err("%s", why);
  if (check_dims(&m->cfg)) return -1;
  const char *skip = getenv("GLM53_GPU_SKIP_SELFTEST");
  if (!(skip && !strcmp(skip, "1"))) {
    gpu_check chk[64];
    int n = glm53_gpu_selftest(0x5eed, chk, 64);
    if (n < 0) return glm53_err("gpu startup validation: device error: %s", gk_error());
    for (int i = 0; i < n && i < 64; i++) {
      if (chk[i].ok) continue;
      if (chk[i].optional && !strcmp(chk[i].name, GPU_CHECK_MLA_GEMM)) {
        LOG_WARN("gpu: startup check '%s' failed (error %.3g above %.3g): long chunks use the per-head MLA kernel", chk[i].name,
                 chk[i].err, chk[i].tol);
        g_mla_gemm = 0;
        continue;
      }
      if (chk[i].optional && !strcmp(chk[i].name, GPU_CHECK_MLA_MHA)) {
        LOG_WARN("gpu: startup check '%s' failed (error %.3g above %.3g): long chunks use the absorbed MLA GEMM form",
                 chk[i].name, chk[i].err, chk[i].tol);
        gk_set_mla_mha(0);
        continue;
      }
      return glm53_err("gpu startup validation failed: %s error %.3g above tolerance %.3g", chk[i].name, chk[i].err, chk[i].tol);
    }
  }
  gmodel *g = xcalloc(1, sizeof *g);
  m->backend_model = g;
  g->pages.alloc = mdev_cb;
  g->pages.ctx = g;
  double t0 = now_sec();
  if (upload(m, g) || place_experts(m, g)) {
    glm53_err_ctx("gpu weight upload");
    gpu_model_free(m);
    return -1;
  }
  const glm53_config *c = &m->cfg;
  const char *mla = !mla_gemm_on() ? "head-sharing kernel"
                    : !gk_mla_mha_on() ? "absorbed GEMM form"
                    : !gk_mla_flash_fits(c->qk_nope_head_dim, c->v_head_dim, c->index_kpool) ? "per-head batched GEMMs"
                    : gk_mla_flash_wg() ? "per-head fused kernel (wgmma)"
                                        : "per-head fused kernel (mma.sync)";
  LOG_INFO("gpu: %s; %.2f GB of weights resident in %.2f s; MLA attention of long chunks: %s", glm53_gpu_device_desc(),
           g->bytes / 1e9, now_sec() - t0, mla);
  return 0;
}

/* ---------------- sessions ---------------- */
static void *sdev(gsession *s, size_t n) {
  void *p = track(&s->allocs, &s->nallocs, &s->cap, gk_malloc(n));
  if (p) gk_memset(p, 0, n);
  return p;
}

static void gpu_session_free(glm53_session *ss) {
  gsession *s = ss->backend_state;
  if (!s) return;
  if (s->pt) { /* the pages go back to the model's pool (shared with forwards of other sessions) */
    gmodel *g = ss->m->backend_model;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < ss->m->cfg.num_hidden_layers * GK_ST_N; i++)
      if (s->pt[i].host) gpu_ptab_release(&s->pt[i], &g->pages);
    pthread_mutex_unlock(&g_lock);
    free(s->pt);
  }
  for (int i = 0; i < s->nallocs; i++) gk_free(s->allocs[i]);
  grun_free(&s->run);
  free(s->allocs);
  free(s->ls);
  free(s);
  ss->backend_state = NULL;
}

static void *sdev_cb(void *ctx, size_t n) { return sdev(ctx, n); }
/* the page table of a paged state: rows of `width` floats, up to max_rows */
static int paged(gsession *s, int l, int which, int width, int max_rows) {
  gpu_ptab *t = &s->pt[l * GK_ST_N + which];
  if (gpu_ptab_init(t, ((size_t)width * sizeof(float)) << s->pshift, max_rows, s->pshift, sdev_cb, s)) return -1;
  s->ls[l].pg[which] = t->dev;
  s->ls[l].pshift = s->pshift;
  return 0;
}

static int session_pages(glm53_session *ss, int rows);
/* positions whose cache pages a new session takes at once:
 * GLM53_GPU_PAGE_RESERVE (tokens; 0: pages only as positions are
 * written), default the whole context */
static int page_reserve(int max_ctx) {
  const char *e = getenv("GLM53_GPU_PAGE_RESERVE");
  const long n = e && *e ? atol(e) : max_ctx;
  return n < 0 ? 0 : n > max_ctx ? max_ctx : (int)n;
}

static int gpu_session_init(glm53_session *ss) {
  const glm53_config *c = &ss->m->cfg;
  gsession *s = xcalloc(1, sizeof *s);
  ss->backend_state = s;
  s->ls = xcalloc((size_t)c->num_hidden_layers, sizeof(gk_lstate));
  s->pt = xcalloc((size_t)c->num_hidden_layers * GK_ST_N, sizeof(gpu_ptab));
  s->maxpool = ss->max_ctx / c->index_kpool + 1;
  s->pshift = gpu_page_shift();
  size_t inner = (size_t)c->linear_num_heads * c->linear_head_dim;
  const int hd = c->index_head_dim;
  int bad = 0;
  for (int l = 0; l < c->num_hidden_layers && !bad; l++) {
    float **st = s->ls[l].p;
    if (c->layer_types[l] == ATTN_KDA) {
      bad |= !(st[GK_ST_CONV] = sdev(s, (size_t)(c->linear_conv_kernel_dim - 1) * 3 * inner * sizeof(float) + 4));
      bad |= !(st[GK_ST_S] = sdev(s, inner * c->linear_head_dim * sizeof(float)));
    } else { /* paged: pages come with the rows (session_pages) */
      bad |= paged(s, l, GK_ST_LATENT, c->kv_lora_rank, ss->max_ctx) != 0;
      if (c->indexer_types[l] == INDEX_FULL)
        bad |= paged(s, l, GK_ST_IK, hd, ss->max_ctx) || paged(s, l, GK_ST_IS, hd, ss->max_ctx) ||
               paged(s, l, GK_ST_POOL, hd, s->maxpool);
    }
  }
  if (!bad) {
    size_t nb = (size_t)c->num_hidden_layers * sizeof(gk_lstate);
    bad |= !(s->d_ls = sdev(s, nb)) || gk_h2d(s->d_ls, s->ls, nb);
  }
  if (bad) {
    glm53_err("gpu session (context %d): %s", ss->max_ctx, gk_error());
    gpu_session_free(ss);
    return -1;
  }
  /* The context's pages now: a session that cannot hold its context is
   * refused here, with the reason, instead of failing mid-request once a
   * long prefill's scratch has taken the memory (H100 80 GB, experts
   * budgeted from free memory: a 4096-token session failed its first
   * decode step for 8 MB). Pages still go back to the pool with the
   * session and serve the next one. */
  const int reserve = page_reserve(ss->max_ctx);
  if (reserve > 0) {
    pthread_mutex_lock(&g_lock);
    const int rc = session_pages(ss, reserve);
    pthread_mutex_unlock(&g_lock);
    if (rc) {
      char why[512];
      snprintf(why, sizeof why, "%s", glm53_last_error());
      gpu_session_free(ss);
      return glm53_err("gpu session (context %d): %s (GLM53_GPU_PAGE_RESERVE=0 takes pages as positions are written)",
                       ss->max_ctx, why);
    }
  }
  return 0;
}

static void gpu_session_reset(glm53_session *ss) {
  gsession *s = ss->backend_state;
  const glm53_config *c = &ss->m->cfg;
  size_t inner = (size_t)c->linear_num_heads * c->linear_head_dim;
  for (int l = 0; l < c->num_hidden_layers; l++)
    if (s->ls[l].p[GK_ST_S]) {
      gk_memset(s->ls[l].p[GK_ST_CONV], 0, (size_t)(c->linear_conv_kernel_dim - 1) * 3 * inner * sizeof(float));
      gk_memset(s->ls[l].p[GK_ST_S], 0, inner * c->linear_head_dim * sizeof(float));
    }
}

/* rows of paged state `i` (layer * GK_ST_N + which) that positions [0, rows) fill */
static int state_rows(const glm53_config *c, int i, int rows) {
  return i % GK_ST_N == GK_ST_POOL ? rows / c->index_kpool + 1 : rows;
}
/* Pages for the first `rows` positions of every paged state of a session
 * (pooled keys: the pools they complete), before a forward writes them;
 * g_lock held (the pool is the model's). */
static int session_pages(glm53_session *ss, int rows) {
  gsession *s = ss->backend_state;
  gmodel *g = ss->m->backend_model;
  const glm53_config *c = &ss->m->cfg;
  /* refuse up front what the device cannot give: growing into the
   * failure would leave the pool holding the memory it did get */
  size_t need = 0, spare = gpu_pages_spare(&g->pages), fb = 0, tb = 0;
  for (int i = 0; i < c->num_hidden_layers * GK_ST_N; i++)
    if (s->pt[i].host)
      need += gpu_ptab_need(&s->pt[i], state_rows(c, i, rows));
  if (need > spare && !gk_mem_info(&fb, &tb)) {
    const size_t slack = (size_t)GPU_PAGE_SLAB * GPU_PAGE_CLASSES * ((size_t)c->kv_lora_rank * sizeof(float) << s->pshift);
    if (need - spare + slack > fb)
      return glm53_err("gpu: no device memory for the latent / indexer caches of %d positions: %.1f MB more needed, "
                       "%.1f MB free",
                       rows, (need - spare) / 1e6, fb / 1e6);
  }
  for (int i = 0; i < c->num_hidden_layers * GK_ST_N; i++) {
    gpu_ptab *t = &s->pt[i];
    if (!t->host) continue;
    if (gpu_ptab_grow(t, &g->pages, state_rows(c, i, rows))) {
      char why[256];
      snprintf(why, sizeof why, "%s", glm53_last_error());
      return glm53_err("gpu: no device memory for the latent / indexer caches of %d positions (%.1f MB of pages in use): %s",
                       rows, g->pages.bytes / 1e6, why);
    }
  }
  return 0;
}

/* ---------------- activations arena ---------------- */
typedef struct {
  float *X, *mixraw, *ssq, *post, *comb, *y, *a;
  float *raw, *qkv, *fa, *g, *beta, *z, *o;                  /* KDA */
  float *r, *q, *ckv, *iq, *iw, *kk, *kg, *mo, *score, *qt, *ob, *apart; /* MLA */
  int *dense, *npools, *tail, *pools;
  float *logits, *wt, *sg, *su, *pg, *pu, *eo, *xin, *xg, *xu, *xo; /* MoE */
  int *idx, *prow, *trow, *grp; /* grp: the pairs grouped per expert (gk_expert_group) */
  int *pidx;                     /* expert streaming's look-ahead: the next streamed layer's routing, guessed */
  float *pwt;
  int *eoff;                     /* gk_moe_sort's first slot per expert [E + 1] */
  const int *erow;               /* the MoE layer's eo row per pair (gk_mhc_post_moe), NULL: the pair */
  int eo16;                      /* eo holds bf16 rows (the sorted GEMM form's, gk_moe_bf16_out) */
  void *y16;                     /* y in bf16 for the cuBLAS products of long chunks (site, gk_xb_alias) */
  float *dg, *du, *h;
  int32_t *tok; /* the upload region (io_layout): tokens, token -> segment, segments */
  int *tseg;
  gk_seg *seg;
} acts;

/* The per-forward upload: tokens [T], their segments [T], the segment
 * table; offsets depend on T only (a graph of T tokens keeps its pointers). */
static size_t io_seg_off(int T) { return ((size_t)T * 8 + 15) & ~(size_t)15; }
static size_t io_bytes(int T) { return io_seg_off(T) + (size_t)T * sizeof(gk_seg); }
static void io_layout(acts *A, int T) {
  A->tseg = (int *)((char *)A->tok + (size_t)T * 4);
  A->seg = (gk_seg *)((char *)A->tok + io_seg_off(T));
}

static size_t carve(char *base, size_t *off, size_t n, void **p) {
  *off = (*off + 255) & ~(size_t)255;
  if (base) *p = base + *off;
  *off += n;
  return *off;
}

static size_t layout(const glm53_config *c, int T, int maxpool, size_t part, char *base, acts *A) {
  size_t off = 0;
  const size_t D = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc, Tz = T;
  const size_t inner = (size_t)c->linear_num_heads * c->linear_head_dim, lhd = c->linear_head_dim;
  const size_t H = c->num_attention_heads, K = c->index_topk / c->index_kpool > 0 ? c->index_topk / c->index_kpool : 1;
  const size_t E = c->n_routed_experts, k = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1;
  const size_t I = c->moe_intermediate_size, Is = I * (c->n_shared_experts > 0 ? c->n_shared_experts : 1);
  const size_t F = sizeof(float);
#define C_(f, n) carve(base, &off, (n), (void **)&A->f)
  C_(X, Tz * hc * D * F); C_(mixraw, Tz * mix * F); C_(ssq, Tz * F); C_(post, Tz * hc * F); C_(comb, Tz * hc * hc * F);
  C_(y, Tz * D * F); C_(a, Tz * D * F); C_(y16, Tz * D * 2);
  C_(raw, Tz * 3 * inner * F); C_(qkv, Tz * 3 * inner * F); C_(fa, Tz * 2 * lhd * F); /* fa | ga outputs */ C_(g, Tz * inner * F);
  C_(beta, Tz * c->linear_num_heads * F); C_(z, Tz * inner * F); C_(o, Tz * inner * F);
  C_(r, Tz * c->q_lora_rank * F); C_(q, Tz * H * c->qk_nope_head_dim * F); C_(ckv, Tz * c->kv_lora_rank * F);
  C_(iq, Tz * c->index_n_heads * c->index_head_dim * F); C_(iw, Tz * c->index_n_heads * F);
  C_(kk, Tz * c->index_head_dim * F); C_(kg, Tz * c->index_head_dim * F); C_(mo, Tz * H * c->v_head_dim * F); C_(score, Tz * maxpool * F);
  C_(qt, Tz * H * c->kv_lora_rank * F); C_(ob, Tz * H * c->kv_lora_rank * F);
  C_(apart, (part > 0 ? part : 1) * F); /* MLA split partials (flash-decoding launches only) */
  C_(dense, Tz * 4); C_(npools, Tz * 4); C_(tail, Tz * 4); C_(pools, Tz * K * 4);
  C_(logits, Tz * (E > 0 ? E : 1) * F); C_(idx, Tz * k * 4); C_(wt, Tz * k * F); C_(prow, Tz * k * 4); C_(trow, Tz * k * 4);
  C_(pidx, Tz * k * 4); C_(pwt, Tz * k * F);
  C_(grp, gk_expert_group_ints((int)(Tz * k), (int)(E > 0 ? E : 1)) * 4); C_(eoff, (E + 1) * 4);
  C_(sg, Tz * Is * F); C_(su, Tz * Is * F);
  const size_t PR = gk_moe_gemm_rows((int)(Tz * k)); /* pair rows, with the GEMM form's padding */
  C_(pg, PR * I * F); C_(pu, PR * I * F); C_(eo, PR * D * F);
  C_(xin, Tz * D * F); C_(xg, Tz * I * F); C_(xu, Tz * I * F); C_(xo, Tz * D * F);
  C_(dg, Tz * c->intermediate_size * F); C_(du, Tz * c->intermediate_size * F);
  C_(h, Tz * D * F); C_(tok, io_bytes(T));
#undef C_
  return off;
}

/* An arena for at least T tokens, score rows of mp pools and part floats
 * of split partials (each only grows; a new arena drops the graphs). */
static int ensure_arena(grun *R, const glm53_config *c, int T, int mp, size_t part, acts *A) {
  if (T > R->arena_T || mp > R->arena_mp || part > R->arena_part || !R->arena) {
    int wT = T > R->arena_T ? T : R->arena_T, wmp = mp > R->arena_mp ? mp : R->arena_mp;
    size_t wpart = part > R->arena_part ? part : R->arena_part;
    size_t need = layout(c, wT, wmp, wpart, NULL, A);
    grun_drop_graphs(R); /* they point into the old arena */
    gk_free(R->arena);
    R->arena_T = R->arena_mp = 0;
    R->arena_part = R->arena_bytes = 0;
    if (!(R->arena = gk_malloc(need))) return glm53_err("gpu: activations for %d tokens: %s", T, gk_error());
    R->arena_T = wT;
    R->arena_mp = wmp;
    R->arena_part = wpart;
    R->arena_bytes = need;
  }
  layout(c, R->arena_T, R->arena_mp, R->arena_part, R->arena, A);
  io_layout(A, T);
  return 0;
}

/* ---------------- forward ---------------- */
#define TRY(x) do { if (x) return -1; } while (0)

/* gate+up (one fused launch on the GEMV path), then down */
static int mlp_dev(const gmlp *w, float limit, const float *y, int T, int D, float *g, float *u, float *out) {
  return gk_mlp(&w->gate, &w->up, &w->down, y, T, D, g, u, limit, out, D);
}

/* The KDA projections in two multi-product launches: q, k, v, the two
 * low-rank first halves (fa | ga side by side) and beta from y, then the
 * second halves from them; the forget-gate transform runs inside the
 * recurrence. */
static int kda_body(const glm53_config *c, const gkda *w, const gk_batch *b, acts *A, int T) {
  const int D = c->hidden_size, H = c->linear_num_heads, hd = c->linear_head_dim, inner = H * hd, ch = 3 * inner;
  /* long chunks: the gated output straight to the bf16 rows of the output
   * product (same bits); opt-in, q / k / v in bf16 (the conv widens them;
   * measured no faster, gk_kda_raw16) */
  const int raw16 = gk_kda_raw16() && gk_xb16_ok(&w->q, T) && gk_xb16_ok(&w->k, T) && gk_xb16_ok(&w->v, T);
  const int ob16 = gk_xb16_ok(&w->o, T);
  uint16_t *r16 = (uint16_t *)A->raw;
  const gk_prod p1[] = {{.W = &w->q, .y = raw16 ? (float *)r16 : A->raw, .ldy = ch, .y16 = raw16},
                        {.W = &w->k, .y = raw16 ? (float *)(r16 + inner) : A->raw + inner, .ldy = ch, .y16 = raw16},
                        {.W = &w->v, .y = raw16 ? (float *)(r16 + 2 * inner) : A->raw + 2 * inner, .ldy = ch, .y16 = raw16},
                        {.W = &w->fa, .y = A->fa, .ldy = 2 * hd},
                        {.W = &w->ga, .y = A->fa + hd, .ldy = 2 * hd},
                        {.W = &w->b, .y = A->beta, .ldy = H}};
  const gk_prod p2[] = {{.W = &w->fb, .y = A->g, .ldy = inner, .x = A->fa, .ldx = 2 * hd},
                        {.W = &w->gb, .y = A->z, .ldy = inner, .x = A->fa + hd, .ldx = 2 * hd}};
  /* long chunks: the small gate products (low-rank, beta, the forget
   * gate's second half) on the side stream beside q / k / v and the conv,
   * then the output gate's second half beside the recurrence */
  const int side = T >= gk_gemm_min() ? gk_side_fork() : 0;
  TRY(side < 0);
  if (side) {
    TRY(gk_matmul_multi(p1 + 3, 3, A->y, T, D));
    TRY(gk_matmul_multi(p2, 1, NULL, T, 0));
    TRY(gk_side_back());
    TRY(gk_matmul_multi(p1, 3, A->y, T, D));
  } else {
    TRY(gk_matmul_multi(p1, 6, A->y, T, D));
    TRY(gk_matmul_multi(p2, 2, NULL, T, 0));
  }
  TRY(gk_kda_conv_prep(A->raw, raw16, b, w->conv, T, H, hd, c->linear_conv_kernel_dim, 1.0f / sqrtf((float)hd), A->qkv));
  TRY(gk_side_join());
  if (side) { /* (inline if this fork is refused) */
    const int s2 = gk_side_fork();
    TRY(s2 < 0);
    TRY(gk_matmul_multi(p2 + 1, 1, NULL, T, 0));
    TRY(gk_side_back());
  }
  /* the chunked form works in the projection buffer (dead after the conv,
   * as is that form's work: the gated norm may write its bf16 rows there) */
  int orc = 1; /* decode (z complete: no side stream): the recurrence's launch also applies the gated norm */
  if (gk_kda_chunk_use(b, hd) && gk_kda_chunk_work(T, H, hd) <= (size_t)T * ch)
    TRY(gk_kda_chunked(b, A->qkv, A->g, w->dt_bias, w->A_log, c->linear_lower_bound, A->beta, T, H, hd, A->raw, A->o));
  else {
    if (!side)
      TRY((orc = gk_kda_recur_out(b, A->qkv, A->g, w->dt_bias, w->A_log, c->linear_lower_bound, A->beta, T, H, hd, A->o,
                                  A->z, w->o_norm, c->rms_norm_eps, ob16 ? A->raw : NULL)) < 0);
    if (orc) TRY(gk_kda_recur_gated(b, A->qkv, A->g, w->dt_bias, w->A_log, c->linear_lower_bound, A->beta, T, H, hd, A->o));
  }
  TRY(gk_side_join()); /* z */
  if (orc) TRY(gk_kda_out(A->o, A->z, w->o_norm, T, H, hd, c->rms_norm_eps, ob16 ? A->raw : NULL));
  return ob16 ? gk_matmul_xb16(&w->o, A->raw, T, A->a, D) : gk_matmul(&w->o, A->o, T, inner, A->a, D);
}
static int kda_dev(const glm53_config *c, const gkda *w, const gk_batch *b, acts *A, int T) {
  const int rc = kda_body(c, w, b, A, T);
  return gk_side_join() || rc ? -1 : 0; /* a failure between the fork and the join */
}

/* maxpool: the score row stride; chunk / ns: the MLA split (run_forward) */
/* hl / pos0: the layer's state pointers (host copy) and first position of
 * a single-sequence forward (NULL / unused for batches), for the GEMM forms */
static int mla_body(const glm53_config *c, const gmla *w, const gk_batch *b, acts *A, int T, int maxpool, int chunk, int ns,
                    const gk_lstate *hl, int pos0) {
  const int gemm = hl && T >= gk_gemm_min();
  const int *dpos = (const int *)((const char *)b->seg + offsetof(gk_seg, pos0)); /* segment 0's pos0 on the device */
  const int D = c->hidden_size, H = c->num_attention_heads, nope = c->qk_nope_head_dim, vd = c->v_head_dim;
  const int ql = c->q_lora_rank, kl = c->kv_lora_rank, P = c->index_kpool, K = c->index_topk / c->index_kpool;
  /* every product of y in one multi-product call, then those of r */
  gk_prod p1[5] = {{.W = &w->q_a, .y = A->r, .ldy = ql}, {.W = &w->kv_a, .y = A->ckv, .ldy = kl}};
  int n1 = 2;
  if (w->has_idx) {
    const int nh = c->index_n_heads, hd = c->index_head_dim;
    p1[n1++] = (gk_prod){.W = &w->wproj, .y = A->iw, .ldy = nh};
    p1[n1++] = (gk_prod){.W = &w->wk, .y = A->kk, .ldy = hd};
    p1[n1++] = (gk_prod){.W = &w->gate, .y = A->kg, .ldy = hd};
  }
  TRY(gk_matmul_multi(p1, n1, A->y, T, D));
  /* (the latent cache rows at the tokens' positions stored by the same launch) */
  TRY(gk_rmsnorm2_at((gk_norm_rows){A->r, ql, A->r, ql, w->q_a_norm, ql}, (gk_norm_rows){A->ckv, kl, A->ckv, kl, w->kv_a_norm, kl},
                     T, c->rms_norm_eps, b, GK_ST_LATENT, kl));
  /* long chunks the fused MLA kernel takes (gk_mla_q16): the query
   * product writes the bf16 queries that kernel reads (no fp32 queries, no
   * rounding pass) */
  void *q16 = gemm && mla_gemm_on() && gk_xb16_ok(&w->q_b, T) ? gk_mla_q16(&w->kv_b, T, pos0, H, nope, vd, kl, P, K) : NULL;
  gk_prod p2[2] = {{.W = &w->q_b, .y = q16 ? (float *)q16 : A->q, .ldy = H * nope, .y16 = q16 != NULL}};
  if (w->has_idx) p2[1] = (gk_prod){.W = &w->wq_b, .y = A->iq, .ldy = c->index_n_heads * c->index_head_dim};
  /* long chunks: the query product on the side stream beside the indexer */
  const int side = w->has_idx && T >= gk_gemm_min() ? gk_side_fork() : 0;
  TRY(side < 0);
  if (side) {
    TRY(gk_matmul_multi(p2, 1, A->r, T, ql));
    TRY(gk_side_back());
    TRY(gk_matmul_multi(p2 + 1, 1, A->r, T, ql));
  } else {
    TRY(gk_matmul_multi(p2, w->has_idx ? 2 : 1, A->r, T, ql));
  }
  pr_mark(PR_MLA);
  if (w->has_idx) {
    const int nh = c->index_n_heads, hd = c->index_head_dim;
    int krc; /* decode: the key norm, both stores and the pooling in one launch */
    TRY((krc = gk_idx_keys(b, A->kk, A->kg, w->knw, w->knb, w->ape, T, P, hd, 1e-6f)) < 0);
    if (krc) {
      TRY(gk_layernorm(A->kk, hd, A->kk, hd, w->knw, w->knb, T, hd, 1e-6f));
      TRY(gk_store_at(b, GK_ST_IK, hd, A->kk, T, hd));
      TRY(gk_store_at(b, GK_ST_IS, hd, A->kg, T, hd));
      TRY(gk_pool_keys(b, w->ape, P, hd));
    }
    int irc = 1; /* long chunks of one sequence: every pool's scores in one GEMM over the pooled keys made contiguous */
    if (gemm && mla_gemm_on()) {
      const int npool = (pos0 + T) / P;
      const float *pool = npool > K ? gk_pages_linear(1, hl->pg[GK_ST_POOL], hl->pshift, npool, hd) : NULL;
      TRY(npool > K && !pool);
      TRY((irc = gk_indexer_scores_gemm(A->iq, A->iw, pool, T, dpos, pos0, P, nh, hd, K, maxpool, A->score)) < 0);
    }
    if (irc) TRY(gk_indexer_scores(A->iq, A->iw, b, T, P, nh, hd, K, maxpool, A->score));
    TRY(gk_select(A->score, b, T, P, K, maxpool, c->index_kpool_always_select_tail, A->dense, A->npools, A->tail, A->pools));
    pr_mark(PR_IDX);
  }
  TRY(gk_side_join()); /* the queries */
  const float scale = (float)(1.0 / sqrt((double)(nope + c->qk_rope_head_dim)));
  const float *lat = NULL;
  int rc = 1, mo16 = 0;
  if (gemm && mla_gemm_on()) { /* long chunks of one sequence: per-head keys and values through cuBLAS */
    TRY(!(lat = gk_pages_linear(0, hl->pg[GK_ST_LATENT], hl->pshift, pos0 + T, kl)));
    mo16 = gk_xb16_ok(&w->o, T); /* the fused kernel then writes the output product's bf16 rows */
    TRY((rc = gk_mla_mha_gemm_out(q16 ? NULL : A->q, q16, lat, &w->kv_b, A->dense, A->npools, A->tail, A->pools, T, dpos,
                                  pos0, H, nope, vd, kl, P, K, scale, A->mo, &mo16)) < 0);
  }
  if (rc) {
    /* absorbed attention: q~ = W_UK^T q per head, softmax over the selected
     * latents, then W_UV per head. The split count depends on the context
     * bound only, so every decode step launches the same grid. */
    TRY(gk_matmul_heads(w->heads.uk_h, w->heads.uk_d, H, A->q, T, nope, A->qt, kl));
    if (lat) /* the heads share the selected rows (made contiguous), through cuBLAS */
      TRY((rc = gk_mla_attn_gemm(A->qt, lat, A->dense, A->npools, A->tail, A->pools, T, dpos, pos0, H, kl, P, K, scale,
                                 A->ob)) < 0);
    if (rc)
      TRY(gk_mla_attn(A->qt, b, A->dense, A->npools, A->tail, A->pools, T, H, kl, P, K, scale, chunk, ns, A->apart, A->ob));
    TRY(gk_matmul_heads(w->heads.uv_h, w->heads.uv_d, H, A->ob, T, kl, A->mo, vd));
    mo16 = 0;
  }
  return mo16 ? gk_matmul_xb16(&w->o, A->mo, T, A->a, D) : gk_matmul(&w->o, A->mo, T, H * vd, A->a, D);
}
static int mla_dev(const glm53_config *c, const gmla *w, const gk_batch *b, acts *A, int T, int maxpool, int chunk, int ns,
                   const gk_lstate *hl, int pos0) {
  const int rc = mla_body(c, w, b, A, T, maxpool, chunk, ns, hl, pos0);
  return gk_side_join() || rc ? -1 : 0; /* a failure between the fork and the join */
}

/* Decode (T < gk_gemm_min()): which of the shared expert's products run
 * inside the routed experts' grouped launches (gk_shared_group(); its
 * matrices must have the routed ones' shapes and format). Returns 0: none;
 * 1: the down product (sd: A->sg into A->a); 2: also the gate and up
 * products (sg: A->y into A->sg), which mode 2 always asks for and mode 1
 * when the router's format differs from the shared expert's (converted
 * checkpoints: fp32 router, Int4 experts), since the router and the
 * shared gate / up cannot share a launch then. */
static int shared_rows(const glm53_config *c, const glayer *G, const acts *A, int T, gk_shared_rows *sg,
                       gk_shared_rows *sd) {
  const gmlp *S = &G->shared;
  const int D = c->hidden_size, I = c->moe_intermediate_size, mode = gk_shared_group();
  if (!mode || T >= gk_gemm_min() || S->down.fmt != G->efmt || S->down.rows != D || S->down.cols != I) return 0;
  *sd = (gk_shared_rows){.W = S->down, .W2 = S->down, .x = A->sg, .ldx = I, .y = A->a, .ldy = D, .n = T};
  if ((mode < 2 && G->router.fmt == S->gate.fmt) || S->gate.fmt != G->efmt || S->up.fmt != G->efmt ||
      S->gate.rows != I || S->gate.cols != D || S->up.rows != I || S->up.cols != D)
    return 1;
  *sg = (gk_shared_rows){.W = S->gate, .W2 = S->up, .x = A->y, .ldx = D, .y = A->sg, .ldy = I, .n = T};
  return 2;
}
/* the shared expert of a layer with streamed experts, with the bits
 * moe_body's decode gives it: each product shared_rows puts in a grouped
 * launch runs as a grouped launch of its own */
static int shared_dev(const glm53_config *c, const glayer *G, acts *A, int T) {
  const int D = c->hidden_size, I = c->moe_intermediate_size, E = c->n_routed_experts, k = c->num_experts_per_tok;
  gk_shared_rows sg, sd;
  const int m = shared_rows(c, G, A, T, &sg, &sd);
  if (!m) return mlp_dev(&G->shared, c->swiglu_limit, A->y, T, D, A->sg, A->su, A->a);
  if (m == 2) TRY(gk_experts_grouped(G->d_exp, 0, 1, c->swiglu_limit, G->efmt, I, D, NULL, NULL, 0, E, k, 1, NULL, D, NULL, I, A->su, &sg));
  else TRY(gk_gate_up(&G->shared.gate, &G->shared.up, A->y, T, D, A->sg, A->su, c->swiglu_limit));
  return gk_experts_grouped(G->d_exp, 2, 0, 0.f, G->efmt, D, I, NULL, NULL, 0, E, k, 0, NULL, I, NULL, D, NULL, &sd);
}

/* One expert's pairs: the decode GEMV restricted to the pairs routed to e
 * (bitwise what the all-pairs launch gives them), or for chunks of >=
 * gk_gemm_min() tokens the gathered rows through mlp_dev, as moe_dev does. */
static int expert_dev(const glm53_config *c, const glayer *G, acts *A, int T, int e, const int *cnt) {
  const int D = c->hidden_size, k = c->num_experts_per_tok, I = c->moe_intermediate_size, np = T * k;
  if (T < gk_gemm_min()) {
    TRY(gk_matmul_expert_only(G->d_exp, 0, G->efmt, I, D, A->idx, np, k, 1, A->y, D, A->pg, I, e));
    TRY(gk_matmul_expert_only(G->d_exp, 1, G->efmt, I, D, A->idx, np, k, 1, A->y, D, A->pu, I, e));
    TRY(gk_swiglu_only(A->pg, A->pu, A->idx, np, I, e, c->swiglu_limit));
    return gk_matmul_expert_only(G->d_exp, 2, G->efmt, D, I, A->idx, np, k, 0, A->pg, I, A->eo, D, e);
  }
  int n = cnt[e + 1] - cnt[e];
  gmlp x = {G->h_exp[e * 3], G->h_exp[e * 3 + 1], G->h_exp[e * 3 + 2]};
  TRY(gk_gather_rows(A->xin, A->y, A->trow + cnt[e], n, D));
  TRY(mlp_dev(&x, c->swiglu_limit, A->xin, n, D, A->xg, A->xu, A->xo));
  return gk_scatter_rows(A->eo, A->xo, A->prow + cnt[e], n, D);
}

/* the first layer after l with streamed experts, or -1 */
static int next_streamed(const gpu_xcache *x, int l) {
  for (int j = l + 1; j < x->nlayers; j++)
    if (x->L[j].nstreamed > 0) return j;
  return -1;
}
/* The guessed experts of layer la (pidx: np pairs, first use first), copied
 * after this layer's own copies, into slots this layer does not hold, until
 * none is left or quota copies are queued. */
static int prefetch_next(gmodel *g, int la, const int *pidx, int np, int quota) {
  gpu_xcache *x = &g->xc;
  glayer *N = &g->layers[la];
  const uint64_t pf0 = x->prefetches;
  for (int p = 0; p < np && x->prefetches - pf0 < (uint64_t)quota; p++) {
    if (pidx[p] < 0 || pidx[p] >= x->E) continue;
    const int r = gpu_xcache_prefetch(x, la, pidx[p], N->h_exp, N->d_exp);
    if (r == GPU_XC_FULL) return 0;
    if (r) return -1;
  }
  return 0;
}

/* Layer L's router and routing applied to this layer's input (A->y) into
 * idx / wt, the ids also copied to hp (host; valid once an event recorded
 * on the compute stream after it completes): a streamed layer's own
 * routing, and the look-ahead's guess for the next streamed layer (into
 * A->pidx / A->pwt; A->logits is free again once this layer is routed:
 * stream order). */
static int route_to_host(const glm53_config *c, const glayer *L, acts *A, int T, int *idx, float *wt, int *hp) {
  const int D = c->hidden_size, E = c->n_routed_experts, k = c->num_experts_per_tok;
  TRY(gk_matmul(&L->router, A->y, T, D, A->logits, E));
  TRY(gk_moe_route(A->logits, L->bias, T, E, k, c->n_group, c->topk_group, c->norm_topk_prob, c->routed_scaling_factor,
                   idx, wt));
  return gk_d2h_async(hp, idx, (size_t)T * k * sizeof(int));
}

/* MoE of a layer with streamed experts: the routing comes back to the host
 * (while the shared expert runs), the missing experts are copied into cache
 * slots by the copy stream (as many as free slots allow before any compute,
 * so the copy of one overlaps the products of the previous), then each used
 * expert's products run after its copy. Look-ahead: the next layer with
 * streamed experts routes this layer's input with its own router, and the
 * experts so guessed are copied after this layer's, overlapping this
 * layer's products and the next layer's attention (the residual stream
 * changes little from one layer to the next, so its routing is often the
 * same; a wrong guess costs copy time, never results: the next layer
 * fetches what it really routes to as usual). */
static int moe_stream(const glm53_config *c, gmodel *g, int l, acts *A, int T) {
  glayer *G = &g->layers[l];
  gpu_xcache *x = &g->xc;
  const int E = c->n_routed_experts, k = c->num_experts_per_tok, np = T * k;
  const int mode = lookahead_mode();
  const int la = T < gk_gemm_min() && mode != GLM53_GPU_LA_OFF ? next_streamed(x, l) : -1;
  /* every guess copied: the guess is routed up front, beside this layer's
   * routing; the idle mode routes it only once this call's copies are
   * known to be none (below), else never */
  const int upfront = la >= 0 && mode == GLM53_GPU_LA_ALL;
  int *hidx = gpu_xcache_idx(x, (size_t)np * (la >= 0 ? 2 : 1));
  TRY(route_to_host(c, G, A, T, A->idx, A->wt, hidx));
  if (upfront) TRY(route_to_host(c, &g->layers[la], A, T, A->pidx, A->pwt, hidx + np));
  TRY(gk_event_on_compute(x->route_ev));
  TRY(shared_dev(c, G, A, T));
  TRY(gk_event_sync(x->route_ev));
  int *cnt = xcalloc((size_t)E + 1, sizeof(int)), *u = xmalloc((size_t)E * sizeof(int)), nu = 0;
  char *placed = xcalloc((size_t)E, 1);
  int rc = 0;
  for (int p = 0; p < np; p++)
    if (hidx[p] >= 0 && hidx[p] < E) cnt[hidx[p] + 1]++;
  for (int e = 0; e < E; e++)
    if (cnt[e + 1]) u[nu++] = e; /* ascending id */
  if (T >= gk_gemm_min()) { /* group the pairs per expert for the GEMMs */
    for (int e = 0; e < E; e++) cnt[e + 1] += cnt[e];
    int *fill = xmalloc((size_t)E * sizeof(int)), *prow = xmalloc((size_t)np * sizeof(int)), *trow = xmalloc((size_t)np * sizeof(int));
    memcpy(fill, cnt, (size_t)E * sizeof(int));
    for (int p = 0; p < np; p++)
      if (hidx[p] >= 0 && hidx[p] < E) { prow[fill[hidx[p]]] = p; trow[fill[hidx[p]]++] = p / k; }
    rc = gk_h2d(A->prow, prow, (size_t)np * sizeof(int)) || gk_h2d(A->trow, trow, (size_t)np * sizeof(int));
    free(fill); free(prow); free(trow);
  }
  gpu_xcache_begin(x);
  const uint64_t miss0 = x->misses; /* this call's own copies: the misses it adds */
  int unplaced = 0; /* each a copy once a slot frees */
  for (int i = 0; i < nu && !rc; i++) {
    int r = gpu_xcache_fetch(x, l, u[i], G->h_exp, G->d_exp, 0);
    if (r < 0) rc = -1;
    placed[i] = r == 0;
    unplaced += r > 0;
  }
  const int quota = la >= 0 ? gpu_xcache_lookahead_quota(mode, x->misses - miss0 + (uint64_t)unplaced) : 0;
  /* the idle mode's guess: routed after the shared expert, ahead of the
   * products; the host reads it once they are queued */
  const int late = la >= 0 && !upfront && quota > 0;
  if (late && !rc) rc = route_to_host(c, &g->layers[la], A, T, A->pidx, A->pwt, hidx + np) || gk_event_on_compute(x->route_ev);
  for (int i = 0; i < nu && !rc; i++) {
    if (!placed[i] && gpu_xcache_fetch(x, l, u[i], G->h_exp, G->d_exp, 1)) rc = -1;
    else rc = gpu_xcache_ready(x, l, u[i]) || expert_dev(c, G, A, T, u[i], cnt) || gpu_xcache_done(x, l, u[i]);
  }
  if (late && !rc) rc = gk_event_sync(x->route_ev);
  if ((upfront || late) && !rc) rc = prefetch_next(g, la, hidx + np, np, quota);
  free(cnt); free(u); free(placed);
  return rc ? -1 : 0; /* the routed outputs are added by gk_mhc_post_moe */
}

/* A MoE layer: the shared expert into A->a, the routed outputs per pair
 * into A->eo (added to A->a by record()'s gk_mhc_post_moe). */
static int moe_body(const glm53_config *c, gmodel *g, int l, acts *A, int T) {
  const glayer *G = &g->layers[l];
  const int D = c->hidden_size, E = c->n_routed_experts, k = c->num_experts_per_tok, I = c->moe_intermediate_size;
  const int Is = G->shared.gate.rows, np = T * k;
  const float lim = c->swiglu_limit;
  const int sorted = T >= gk_gemm_min() && G->efmt != WMAT_F32 && gk_have_blas(); /* the sorted-pairs GEMM form below */
  /* which takes the shared expert on the side stream, beside the routing,
   * the sort's host round trip and the routed experts */
  const int side = sorted ? gk_side_fork() : 0;
  TRY(side < 0);
  gk_shared_rows sg, sd; /* decode: the shared products inside the grouped launches */
  const int shm = shared_rows(c, G, A, T, &sg, &sd);
  const int dec = T < gk_gemm_min();
  /* decode: the router launch's last block routes (and for one token
   * groups the pairs per expert), unless gk_matmul_route declines */
  const gk_route_req rq = {.bias = G->bias, .E = E, .k = k, .G = c->n_group, .topk_group = c->topk_group,
                           .norm = c->norm_topk_prob, .scaling = c->routed_scaling_factor, .idx = A->idx,
                           .grp = T == 1 ? A->grp : NULL, .wt = A->wt};
  int routed = 1; /* gk_matmul_route's answer: 1 not routed */
  if (!dec) { /* the shared expert (on the side stream when forked), then the router */
    TRY(gk_mlp(&G->shared.gate, &G->shared.up, &G->shared.down, A->y, T, D, A->sg, A->su, lim, A->a, D));
    TRY(gk_side_back()); /* (no-op unless forked) */
    TRY(gk_matmul(&G->router, A->y, T, D, A->logits, E));
  } else {
    const gk_prod p[] = {{.W = &G->router, .y = A->logits, .ldy = E},
                         {.W = &G->shared.gate, .y = A->sg, .ldy = Is, .W2 = &G->shared.up, .u = A->su, .limit = lim}};
    const int npr = shm == 2 ? 1 : 2; /* (shm 2: the shared gate and up ride in the grouped launch) */
    TRY((routed = gk_matmul_route(p, npr, A->y, T, D, 0, &rq)) < 0);
    if (routed == 1) TRY(gk_matmul_multi(p, npr, A->y, T, D));
  }
  /* else a route launch: at decode it can also prefetch the selected
   * experts into L2 (every expert of this layer is resident here), and for
   * one token it also groups the pairs per expert */
  int need_group = routed == 2 || (routed == 0 && !rq.grp);
  if (dec && routed == 1)
    TRY((need_group = gk_moe_route_group(A->logits, G->bias, T, E, k, c->n_group, c->topk_group, c->norm_topk_prob,
                                         c->routed_scaling_factor, A->idx, A->wt, G->d_exp, A->grp)) < 0);
  if (routed == 1 && need_group)
    TRY(gk_moe_route_pf(A->logits, G->bias, T, E, k, c->n_group, c->topk_group, c->norm_topk_prob,
                        c->routed_scaling_factor, A->idx, A->wt, dec ? G->d_exp : NULL));
  if (dec) { /* decode: pairs grouped per expert on the device, each expert's weights read once */
    if (!shm) TRY(gk_matmul(&G->shared.down, A->sg, T, Is, A->a, D));
    if (need_group) TRY(gk_expert_group(A->idx, np, E, A->grp));
    TRY(gk_experts_grouped(G->d_exp, 0, 1, lim, G->efmt, I, D, A->grp, A->idx, np, E, k, 1, A->y, D, A->pg, I, A->pu,
                           shm == 2 ? &sg : NULL));
    return gk_experts_grouped(G->d_exp, 2, 0, 0.f, G->efmt, D, I, A->grp, A->idx, np, E, k, 0, A->pg, I, A->eo, D, NULL,
                              shm ? &sd : NULL);
  }
  if (sorted) { /* prefill: pairs sorted by expert on the device, bf16 GEMMs */
    int hoff[513]; /* E <= 512 (check_dims) */
    int rc = gk_moe_sort(A->idx, np, E, A->prow, A->eoff) || gk_d2h(hoff, A->eoff, ((size_t)E + 1) * sizeof(int)) ||
             gk_moe_experts_gemm(G->h_exp, E, hoff, A->eoff, A->prow, A->idx, k, A->y, D, T, D, I, lim, A->pg, A->pu, A->eo,
                                 A->trow);
    A->erow = A->trow;
    A->eo16 = gk_moe_bf16_out();
    return rc ? -1 : 0;
  }
  /* f32 experts (fp32 SGEMMs): the pairs grouped by expert on the host, one
   * GEMM per used expert, rows gathered and scattered */
  int *idx = xmalloc((size_t)np * sizeof(int)), *cnt = xcalloc((size_t)E + 1, sizeof(int));
  int *prow = xmalloc((size_t)np * sizeof(int)), *trow = xmalloc((size_t)np * sizeof(int));
  if (gk_d2h(idx, A->idx, (size_t)np * sizeof(int))) { free(idx); free(cnt); free(prow); free(trow); return -1; }
  for (int q = 0; q < np; q++)
    if (idx[q] >= 0) cnt[idx[q] + 1]++;
  for (int e = 0; e < E; e++) cnt[e + 1] += cnt[e];
  int *fill = xmalloc((size_t)E * sizeof(int));
  memcpy(fill, cnt, (size_t)E * sizeof(int));
  for (int q = 0; q < np; q++)
    if (idx[q] >= 0) { prow[fill[idx[q]]] = q; trow[fill[idx[q]]++] = q / k; }
  int rc = gk_h2d(A->prow, prow, (size_t)np * sizeof(int)) || gk_h2d(A->trow, trow, (size_t)np * sizeof(int));
  for (int e = 0; e < E && !rc; e++) {
    int n = cnt[e + 1] - cnt[e];
    if (!n) continue;
    gmlp x = {G->h_exp[e * 3], G->h_exp[e * 3 + 1], G->h_exp[e * 3 + 2]};
    rc = gk_gather_rows(A->xin, A->y, A->trow + cnt[e], n, D) ||
         mlp_dev(&x, lim, A->xin, n, D, A->xg, A->xu, A->xo) ||
         gk_scatter_rows(A->eo, A->xo, A->prow + cnt[e], n, D);
  }
  free(idx); free(cnt); free(prow); free(trow); free(fill);
  return rc ? -1 : 0;
}
static int moe_dev(const glm53_config *c, gmodel *g, int l, acts *A, int T) {
  if (g->xc.active && g->xc.L[l].nstreamed > 0) return moe_stream(c, g, l, A, T);
  const int rc = moe_body(c, g, l, A, T);
  return gk_side_join() || rc ? -1 : 0; /* the shared expert's output is in A->a from here on */
}

/* gk_mhc_proj from this many tokens (GLM53_GPU_MHC_PROJ=0: never): its
 * blocks take 16 tokens each and no split of the columns, so it needs a
 * device's worth of blocks (H200, 4096-token prefill: 4 ms faster than the
 * SGEMM + two-pass pre; at 64 batched decode tokens it ran 16 ms slower) */
#define MHC_PROJ_MIN 2048
static int mhc_proj_on(void) {
  static int on = -1;
  if (on < 0) on = !(getenv("GLM53_GPU_MHC_PROJ") && !strcmp(getenv("GLM53_GPU_MHC_PROJ"), "0"));
  return on;
}
/* projected: mixraw and ssq already hold this site's projection (a fused
 * post, post_then_proj) */
static int site(const glm53_config *c, const ghc *hw, const float *norm_w, acts *A, int T, int projected) {
  const int D = c->hidden_size, hc = c->hc_mult, mix = (2 + hc) * hc;
  /* long chunks: the projection and the sum of squares in one pass over X */
  int rc = !projected;
  if (rc && T >= MHC_PROJ_MIN && mhc_proj_on()) TRY((rc = gk_mhc_proj(&hw->fn, A->X, T, hc, D, A->mixraw, A->ssq)) < 0);
  /* long chunks: y also in bf16, which every cuBLAS product of y (and the
   * MoE gather) then reads instead of converting y again */
  void *y16 = T >= gk_gemm_min() && gk_have_blas() && gk_xb_alias_on() ? A->y16 : NULL;
  if (rc) { /* one token: the projection's launch runs the pre in its last block */
    int f;
    TRY((f = gk_mhc_proj_pre(&hw->fn, A->X, T, hc, D, A->mixraw, hw->base, hw->scale, norm_w, c->hc_sinkhorn_iters, c->hc_eps,
                             c->rms_norm_eps, A->post, A->comb, A->y, y16)) < 0);
    if (!f) {
      gk_xb_alias(A->y, T, D, y16);
      return 0;
    }
    TRY(gk_matmul(&hw->fn, A->X, T, hc * D, A->mixraw, mix));
  }
  const float *ssq = rc ? NULL : A->ssq;
  /* opt-in (GLM53_GPU_BRANCH=1, measured 0.10 ms per token slower): in a
   * captured decode step comb (the Sinkhorn, the pre's longest chain) on a
   * graph branch beside the sublayer, joined before the post reads it */
  int br = 0;
  if (T < gk_gemm_min()) TRY((br = gk_branch_fork()) < 0);
  if (br) {
    TRY(gk_mhc_comb(A->X, A->mixraw, ssq, hw->base, hw->scale, norm_w, T, hc, D, c->hc_sinkhorn_iters, c->hc_eps,
                    c->rms_norm_eps, A->comb, A->y, y16));
    TRY(gk_branch_back());
  }
  TRY(gk_mhc_pre(A->X, A->mixraw, ssq, hw->base, hw->scale, norm_w, T, hc, D, c->hc_sinkhorn_iters, c->hc_eps,
                 c->rms_norm_eps, A->post, br ? NULL : A->comb, A->y, y16));
  gk_xb_alias(A->y, T, D, y16); /* replaces the previous site's (y16 NULL: clears it); record() clears on exit */
  return 0;
}
/* The post of a sublayer (eo: after a MoE), fused with the projection of
 * the next site (next: its weights, NULL for none) for long chunks: 1 when
 * mixraw / ssq now hold that projection, 0 when the post ran alone, -1. */
static int post_then_proj(const glm53_config *c, const ghc *next, acts *A, int T, int moe) {
  const int D = c->hidden_size, hc = c->hc_mult, k = c->num_experts_per_tok;
  TRY(gk_branch_join()); /* comb, when the site computed it on a branch */
  int rc = 1;
  if (next && T >= MHC_PROJ_MIN && mhc_proj_on() && !(moe && A->eo16)) /* (its combine reads fp32 rows) */
    TRY((rc = gk_mhc_post_proj(A->X, A->a, moe ? A->eo : NULL, A->erow, A->idx, A->wt, k, A->post, A->comb, T, hc, D,
                               &next->fn, A->mixraw, A->ssq)) < 0);
  if (!rc) return 1;
  if (moe) TRY(gk_mhc_post_moe(A->X, A->a, A->eo, A->eo16, A->erow, A->idx, A->wt, k, A->post, A->comb, T, hc, D));
  else TRY(gk_mhc_post(A->X, A->a, A->post, A->comb, T, hc, D));
  return 0;
}

/* One forward: T tokens in nseg segments (gk.h gk_batch), logits for the
 * last nlog tokens. */
typedef struct {
  const glm53_model *m;
  acts *A;
  gk_batch b; /* device tables; .layer set per layer */
  int T, nlog, maxpool, chunk, ns;
  float *dlogits;
  const gk_lstate *hls; /* one sequence: its per-layer state pointers (host copy), else NULL */
  int pos0;             /* one sequence: its first position */
} fwd;

static int record_body(const fwd *f);
/* The device work of one forward: every launch, no host synchronisation
 * (a decode step of T < gk_gemm_min() tokens is capturable as a graph).
 * y's bf16 alias (site) lives inside one forward only. */
static int record(const fwd *f) {
  gk_xb_alias(NULL, 0, 0, NULL);
  int rc = record_body(f);
  gk_xb_alias(NULL, 0, 0, NULL);
  if (gk_branch_join()) rc = -1; /* (after a failure inside a site's branch) */
  return rc;
}
static int record_body(const fwd *f) {
  const glm53_model *m = f->m;
  const glm53_config *c = &m->cfg;
  gmodel *g = m->backend_model;
  acts *A = f->A;
  const int D = c->hidden_size, hc = c->hc_mult, T = f->T;
  TRY(gk_embed(&g->embed, A->tok, T, hc, A->X));
  pr_mark(PR_EMBED);
  int projected = 0; /* the next site's projection done by the previous post */
  for (int l = 0; l < c->num_hidden_layers; l++) {
    const glayer *G = &g->layers[l];
    const int last = l + 1 == c->num_hidden_layers, moe = c->mlp_layer_types[l] != MLP_DENSE;
    gk_batch b = f->b;
    b.layer = l;
    TRY(site(c, &G->hc[0], G->in_norm, A, T, projected));
    pr_mark(PR_MHC);
    if (c->layer_types[l] == ATTN_KDA) TRY(kda_dev(c, &G->kda, &b, A, T));
    else TRY(mla_dev(c, &G->mla, &b, A, T, f->maxpool, f->chunk, f->ns, f->hls ? &f->hls[l] : NULL, f->pos0));
    pr_mark(c->layer_types[l] == ATTN_KDA ? PR_KDA : PR_MLA);
    TRY((projected = post_then_proj(c, &G->hc[1], A, T, 0)) < 0);
    TRY(site(c, &G->hc[1], G->post_norm, A, T, projected));
    pr_mark(PR_MHC);
    A->erow = NULL; /* moe_dev sets both for the expert-sorted GEMM form */
    A->eo16 = 0;
    if (!moe) TRY(mlp_dev(&G->dense, c->swiglu_limit, A->y, T, D, A->dg, A->du, A->a));
    else TRY(moe_dev(c, g, l, A, T));
    pr_mark(moe ? PR_MOE : PR_DENSE);
    TRY((projected = post_then_proj(c, last ? NULL : &g->layers[l + 1].hc[0], A, T, moe)) < 0);
    pr_mark(PR_MHC);
  }
  if (f->nlog > 0) {
    TRY(gk_final_norm(A->X, g->final_norm, T - f->nlog, T, hc, D, c->rms_norm_eps, A->h));
    TRY(gk_matmul(&g->lm_head, A->h, f->nlog, D, f->dlogits, c->vocab_size));
  }
  return 0;
}

/* decode graph replay: on unless GLM53_GPU_GRAPH=0 */
static int graphs_enabled(void) {
  static int on = -1;
  if (on < 0) on = gk_graphs_supported() && !(getenv("GLM53_GPU_GRAPH") && !strcmp(getenv("GLM53_GPU_GRAPH"), "0"));
  return on;
}

/* The forward of T tokens forming nseg segments (host table `seg`, whose
 * ls pointers are device arrays; maxlen = the longest), logits of the last
 * nlog tokens into `logits`. ctx / mp: the largest context / pool count of
 * the sequences involved (the MLA split count and the score rows follow
 * from them, never from positions). Runs in R's arena; decode steps (one
 * token per segment, every row's logits, fewer than gk_gemm_min() tokens)
 * replay a graph captured per token count. */
static int run_forward(const glm53_model *m, grun *R, const gk_seg *seg, int nseg, int maxlen, const int32_t *tokens,
                       int T, int nlog, float *logits, int ctx, int mp, const gk_lstate *hls) {
  const glm53_config *c = &m->cfg;
  const int K = c->index_topk / c->index_kpool, P = c->index_kpool;
  fwd f = {.m = m, .T = T, .nlog = nlog, .hls = nseg == 1 ? hls : NULL, .pos0 = seg[0].pos0};
  f.ns = gpu_mla_split(maxlen, ctx, K, P, c->kv_lora_rank, &f.chunk);
  const size_t part = f.chunk > 0 ? (size_t)T * c->num_attention_heads * f.ns * (c->kv_lora_rank + 2) : 0;
  acts A;
  TRY(ensure_arena(R, c, T, mp, part, &A));
  f.A = &A;
  f.maxpool = R->arena_mp;
  if (nlog > R->dlogits_rows) {
    grun_drop_graphs(R);
    gk_free(R->dlogits);
    R->dlogits_rows = 0;
    if (!(R->dlogits = gk_malloc((size_t)nlog * c->vocab_size * sizeof(float)))) return -1;
    R->dlogits_rows = nlog;
  }
  f.dlogits = R->dlogits;
  pr_mark(-1);
  /* one upload: tokens, token -> segment, segments (offsets as io_layout) */
  char *up = xcalloc(1, io_bytes(T));
  memcpy(up, tokens, (size_t)T * sizeof(int32_t));
  int *tseg = (int *)(up + (size_t)T * 4);
  for (int s = 0; s < nseg; s++)
    for (int t = seg[s].t0; t < seg[s].t0 + seg[s].len; t++) tseg[t] = s;
  memcpy(up + io_seg_off(T), seg, (size_t)nseg * sizeof(gk_seg));
  int rc = gk_h2d(A.tok, up, io_seg_off(T) + (size_t)nseg * sizeof(gk_seg));
  free(up);
  TRY(rc);
  f.b = (gk_batch){.seg = A.seg, .tseg = A.tseg, .nseg = nseg, .maxlen = maxlen, .layer = 0};
  /* decode steps replay one captured graph per token count (launch overhead
   * dominates small decode steps); capture after one uncaptured step with
   * the same key so no scratch grows inside. Streaming experts needs the
   * routing on the host: no graph then. */
  const gmodel *gm = m->backend_model;
  /* programmatic dependent launch between the kernels (gk_common.cuh),
   * except while experts stream: their kernels also wait on copy events */
  gk_set_pdl(!gm->xc.active);
  const int graph = graphs_enabled() && !gm->xc.active && !R->graph_off && maxlen == 1 && nlog == T && T < GRAPH_T &&
                    T < gk_gemm_min() && !pr_on;
  ggraph *G = graph ? &R->g[T] : NULL;
  const int keyed = G && G->chunk == f.chunk && G->ns == f.ns;
  if (G && keyed && G->exec && G->gen == gk_scratch_gen()) {
    TRY(gk_graph_launch(G->exec));
  } else if (G && keyed && G->warm) {
    gk_graph_free(G->exec);
    G->exec = NULL;
    void *ex = NULL;
    int crc = gk_capture_begin();
    if (!crc) {
      int rrc = record(&f);
      crc = gk_capture_end(&ex) || rrc;
    }
    if (crc) {
      LOG_WARN("gpu: decode graph capture failed (%s); launching kernels directly", gk_error());
      gk_graph_free(ex);
      R->graph_off = 1;
      gk_sync();
      TRY(record(&f));
    } else {
      G->exec = ex;
      G->gen = gk_scratch_gen();
      TRY(gk_graph_launch(G->exec));
    }
  } else {
    TRY(record(&f));
    if (G) {
      if (!keyed) {
        gk_graph_free(G->exec);
        G->exec = NULL;
      }
      G->warm = 1;
      G->chunk = f.chunk;
      G->ns = f.ns;
    }
  }
  if (nlog > 0) {
    TRY(gk_d2h(logits, R->dlogits, (size_t)nlog * c->vocab_size * sizeof(float)));
    pr_mark(PR_HEAD);
  }
  return gk_sync();
}

static int forward_locked(glm53_session *ss, const int32_t *tokens, int T, float *logits, int all_rows) {
  gsession *s = ss->backend_state;
  const gk_seg seg = {.ls = s->d_ls, .t0 = 0, .len = T, .pos0 = ss->pos};
  const int n = logits ? (all_rows ? T : 1) : 0;
  return run_forward(ss->m, &s->run, &seg, 1, T, tokens, T, n, logits, ss->max_ctx, s->maxpool, s->ls);
}

static int gpu_forward(glm53_session *ss, const int32_t *tokens, int T, float *logits, int all_rows) {
  pthread_mutex_lock(&g_lock);
  int rc = session_pages(ss, ss->pos + T);
  if (rc) {
    pthread_mutex_unlock(&g_lock);
    return -1;
  }
  rc = forward_locked(ss, tokens, T, logits, all_rows);
  pthread_mutex_unlock(&g_lock);
  if (rc) return glm53_err("gpu backend error: %s", gk_error());
  return 0;
}

/* n sessions of one model, one token each: one forward of n one-token
 * segments in the model's batch arena (weights read once per step) */
static int gpu_forward_batch(glm53_session **ss, const int32_t *tokens, int n, float *logits) {
  glm53_model *m = ss[0]->m;
  gmodel *g = m->backend_model;
  gk_seg *seg = xcalloc((size_t)n, sizeof *seg);
  int ctx = 0, mp = 0;
  for (int i = 0; i < n; i++) {
    const gsession *s = ss[i]->backend_state;
    seg[i] = (gk_seg){.ls = s->d_ls, .t0 = i, .len = 1, .pos0 = ss[i]->pos};
    if (ss[i]->max_ctx > ctx) ctx = ss[i]->max_ctx;
    if (s->maxpool > mp) mp = s->maxpool;
  }
  pthread_mutex_lock(&g_lock);
  for (int i = 0; i < n; i++)
    if (session_pages(ss[i], ss[i]->pos + 1)) {
      pthread_mutex_unlock(&g_lock);
      free(seg);
      return -1;
    }
  int rc = run_forward(m, &g->batch, seg, n, 1, tokens, n, n, logits, ctx, mp, NULL);
  pthread_mutex_unlock(&g_lock);
  free(seg);
  if (rc) return glm53_err("gpu backend error (batch of %d): %s", n, gk_error());
  return 0;
}

int glm53_gpu_expert_stats_get(const glm53_model *m, glm53_gpu_expert_stats *o) {
  memset(o, 0, sizeof *o);
  if (m->backend != &gpu_backend || !m->backend_model) return -1;
  const gpu_xcache *x = &((const gmodel *)m->backend_model)->xc;
  o->streaming = x->active;
  o->resident = x->resident;
  o->streamed = x->streamed;
  o->slots = x->nslots;
  o->resident_gb = x->resident_bytes / 1e9;
  o->slot_gb = (double)x->nslots * x->slot_bytes / 1e9;
  o->budget_gb = x->budget_bytes / 1e9;
  o->hits = x->hits;
  o->misses = x->misses;
  o->resident_uses = x->uses_resident;
  o->bytes_h2d = x->bytes_h2d;
  o->prefetches = x->prefetches;
  o->prefetch_hits = x->prefetch_hits;
  return 0;
}
void glm53_gpu_expert_stats_reset(glm53_model *m) {
  if (m->backend != &gpu_backend || !m->backend_model) return;
  gpu_xcache *x = &((gmodel *)m->backend_model)->xc;
  x->hits = x->misses = x->uses_resident = x->bytes_h2d = x->prefetches = x->prefetch_hits = 0;
}

static const glm53_backend gpu_backend = {
    .name = "gpu",
    .model_init = gpu_model_init,
    .model_free = gpu_model_free,
    .session_init = gpu_session_init,
    .session_free = gpu_session_free,
    .session_reset = gpu_session_reset,
    .forward = gpu_forward,
    .forward_batch = gpu_forward_batch,
};

const glm53_backend *glm53_gpu_backend(void) { return &gpu_backend; }

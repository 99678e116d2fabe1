/* Routed-expert placement under a VRAM budget and on-demand streaming of the
 * rest (gpu_internal.h). Resident experts are chosen in layer order (then
 * expert id): no usage statistics exist at load time. The streamed ones are
 * packed into one host buffer (page-locked when the driver allows, so the
 * copies run on the copy engine asynchronously), one blob per expert, and
 * cached in device slots replaced least-frequently-used with aging (ties
 * and GLM53_GPU_EXPERT_POLICY=lru: least recently used), and filled ahead
 * of use by the look-ahead of moe_stream (glm53_gpu.c). Which weights a
 * product reads never changes its arithmetic, so results do not depend on
 * the placement (tests/gpu/test_gpu_expert_cache.c). */
#include "gpu/gpu_internal.h"
#include "gpu/glm53_gpu.h"
#include "model/model.h"
#include "core/err.h"
#include "core/log.h"
#include "core/util.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static size_t al256(size_t n) { return (n + 255) & ~(size_t)255; }

/* blob layout of layer l's experts (they share one shape) */
static void layout(const mlp_weights *e, gpu_xlayer *L) {
  const wmat *w[3] = {&e->gate, &e->up, &e->down};
  size_t off = 0;
  for (int i = 0; i < 3; i++) {
    L->off[2 * i] = off;
    off += al256(wmat_data_bytes(w[i]));
    L->off[2 * i + 1] = off;
    off += al256(wmat_scale_bytes(w[i]));
  }
  L->blob = off;
}

static void shape_of(const wmat *w, gpu_mat *o) {
  memset(o, 0, sizeof *o);
  o->fmt = w->fmt; o->rows = w->rows; o->cols = w->cols; o->group = w->group; o->scale_bf16 = w->scale_bf16;
}

int gpu_xcache_init(gpu_xcache *x, const glm53_model *m, gpu_mat **h_exp, double budget_bytes, int nslots,
                    int (*up)(void *ctx, const wmat *w, gpu_mat *o), void *(*alloc)(void *ctx, size_t n), void *ctx) {
  const glm53_config *c = &m->cfg;
  const int NL = c->num_hidden_layers, E = c->n_routed_experts, k = c->num_experts_per_tok > 0 ? c->num_experts_per_tok : 1;
  memset(x, 0, sizeof *x);
  x->nlayers = NL;
  x->E = E;
  x->budget_bytes = budget_bytes;
  x->L = xcalloc((size_t)NL, sizeof(gpu_xlayer));
  double total = 0;
  size_t maxblob = 0;
  long nexp = 0;
  for (int l = 0; l < NL; l++)
    if (m->layers[l].mlp_kind == MLP_MOE && E > 0) {
      layout(&m->layers[l].moe.experts[0], &x->L[l]);
      total += (double)x->L[l].blob * E;
      nexp += E;
      if (x->L[l].blob > maxblob) maxblob = x->L[l].blob;
    }
  /* cache slots and the budget left for resident experts */
  double res_budget = 1e300;
  if (budget_bytes >= 0 && total > budget_bytes && nexp > 0) {
    x->active = 1;
    long want = nslots > 0 ? nslots : (long)(budget_bytes * 0.25 / (double)maxblob);
    if (want < 2 * k) want = nslots > 0 ? nslots : 2 * k; /* double-banked: one layer's experts + the next's */
    if (want > nexp) want = nexp;
    x->nslots = (int)want;
    x->slot_bytes = maxblob;
    res_budget = budget_bytes - (double)x->nslots * maxblob;
    if (res_budget < 0) res_budget = 0;
  }
  double used = 0;
  size_t host_bytes = 0;
  for (int l = 0; l < NL; l++) {
    if (m->layers[l].mlp_kind != MLP_MOE || E <= 0) continue;
    gpu_xlayer *L = &x->L[l];
    L->host = xcalloc((size_t)E, sizeof(char *));
    L->slot = xmalloc((size_t)E * sizeof(int));
    L->freq = xcalloc((size_t)E, sizeof(uint32_t));
    for (int e = 0; e < E; e++) {
      const mlp_weights *w = &m->layers[l].moe.experts[e];
      L->slot[e] = -1;
      if (used + (double)L->blob <= res_budget) { /* resident */
        gpu_mat g[3];
        if (up(ctx, &w->gate, &g[0]) || up(ctx, &w->up, &g[1]) || up(ctx, &w->down, &g[2])) return -1;
        memcpy(&h_exp[l][e * 3], g, sizeof g);
        used += (double)L->blob;
        x->resident++;
      } else {
        shape_of(&w->gate, &h_exp[l][e * 3]);
        shape_of(&w->up, &h_exp[l][e * 3 + 1]);
        shape_of(&w->down, &h_exp[l][e * 3 + 2]);
        L->host[e] = (char *)(uintptr_t)1; /* marked; pointer set below */
        L->nstreamed++;
        x->streamed++;
        host_bytes += L->blob;
      }
    }
  }
  x->resident_bytes = used;
  if (!x->streamed) { /* everything fit after all */
    x->active = 0;
    x->nslots = 0;
    return 0;
  }
  x->host = gk_host_pinned(host_bytes);
  x->host_pinned = x->host != NULL;
  if (!x->host) {
    LOG_WARN("gpu experts: %s; streaming from pageable memory (slower copies)", gk_error());
    x->host = xmalloc(host_bytes);
  }
  size_t off = 0;
  for (int l = 0; l < NL; l++) {
    gpu_xlayer *L = &x->L[l];
    if (!L->host) continue;
    for (int e = 0; e < E; e++) {
      if (!L->host[e]) continue;
      char *b = x->host + off;
      off += L->blob;
      L->host[e] = b;
      const mlp_weights *w = &m->layers[l].moe.experts[e];
      const wmat *ws[3] = {&w->gate, &w->up, &w->down};
      for (int i = 0; i < 3; i++) {
        memcpy(b + L->off[2 * i], ws[i]->data, wmat_data_bytes(ws[i]));
        if (wmat_scale_bytes(ws[i])) memcpy(b + L->off[2 * i + 1], ws[i]->scales, wmat_scale_bytes(ws[i]));
      }
    }
  }
  const char *pol = getenv("GLM53_GPU_EXPERT_POLICY");
  x->lfu = !(pol && !strcmp(pol, "lru"));
  x->dslots = alloc(ctx, (size_t)x->nslots * x->slot_bytes);
  if (!x->dslots) return glm53_err("gpu experts: %d cache slots of %zu bytes: %s", x->nslots, x->slot_bytes, gk_error());
  x->s_layer = xmalloc((size_t)x->nslots * sizeof(int));
  x->s_exp = xmalloc((size_t)x->nslots * sizeof(int));
  x->s_tick = xcalloc((size_t)x->nslots, sizeof(uint64_t));
  x->s_call = xcalloc((size_t)x->nslots, sizeof(uint64_t));
  x->s_pref = xcalloc((size_t)x->nslots, 1);
  x->s_free = xcalloc((size_t)x->nslots, sizeof(void *));
  x->s_ready = xcalloc((size_t)x->nslots, sizeof(void *));
  for (int s = 0; s < x->nslots; s++) {
    x->s_layer[s] = x->s_exp[s] = -1;
    if (!(x->s_free[s] = gk_sync_event_new()) || !(x->s_ready[s] = gk_sync_event_new())) return glm53_err("gpu experts: %s", gk_error());
  }
  if (!(x->route_ev = gk_sync_event_new())) return glm53_err("gpu experts: %s", gk_error());
  return 0;
}

void gpu_xcache_free(gpu_xcache *x) {
  if (x->L)
    for (int l = 0; l < x->nlayers; l++) {
      free(x->L[l].host);
      free(x->L[l].slot);
      free(x->L[l].freq);
    }
  free(x->L);
  for (int s = 0; s < x->nslots; s++) {
    if (x->s_free) gk_event_free(x->s_free[s]);
    if (x->s_ready) gk_event_free(x->s_ready[s]);
  }
  gk_event_free(x->route_ev);
  free(x->s_layer); free(x->s_exp); free(x->s_tick); free(x->s_call); free(x->s_pref); free(x->s_free); free(x->s_ready);
  if (x->host_pinned) gk_host_pinned_free(x->host);
  else free(x->host);
  if (x->h_idx_pinned) gk_host_pinned_free(x->h_idx);
  else free(x->h_idx);
  /* dslots belong to the model's tracked device allocations */
  memset(x, 0, sizeof *x);
}

int *gpu_xcache_idx(gpu_xcache *x, size_t np) {
  if (np > x->h_idx_cap) {
    if (x->h_idx_pinned) gk_host_pinned_free(x->h_idx);
    else free(x->h_idx);
    size_t cap = np < 256 ? 256 : np;
    x->h_idx = gk_host_pinned(cap * sizeof(int));
    x->h_idx_pinned = x->h_idx != NULL;
    if (!x->h_idx) x->h_idx = xmalloc(cap * sizeof(int));
    x->h_idx_cap = cap;
  }
  return x->h_idx;
}

void gpu_xcache_begin(gpu_xcache *x) { x->call++; }

/* pointers of expert e of layer l inside slot s */
static void point(const gpu_xlayer *L, char *base, gpu_mat *m3) {
  for (int i = 0; i < 3; i++) {
    m3[i].d = base + L->off[2 * i];
    m3[i].s = m3[i].fmt >= WMAT_Q8 ? base + L->off[2 * i + 1] : NULL;
  }
}

/* the copy of expert e of layer l into slot s (already assigned to it) */
static int load_slot(gpu_xcache *x, int s, int l, int e, gpu_mat *h_exp_l, gpu_mat *d_exp_l) {
  const gpu_xlayer *L = &x->L[l];
  char *dst = x->dslots + (size_t)s * x->slot_bytes;
  /* the copy engine overwrites the slot only after the kernels that read its
   * previous expert; the kernels of this one wait for the copy */
  if (gk_copy_wait(x->s_free[s]) || gk_copy_h2d_async(dst, L->host[e], L->blob) || gk_event_on_copy(x->s_ready[s]))
    return glm53_err("gpu expert copy: %s", gk_error());
  x->bytes_h2d += L->blob;
  point(L, dst, &h_exp_l[e * 3]);
  /* the device table entries, in order with the kernels that read them */
  if (gk_h2d_compute(&d_exp_l[e * 3], &h_exp_l[e * 3], 3 * sizeof(gpu_mat))) return glm53_err("gpu expert table: %s", gk_error());
  return 0;
}

int gpu_xcache_fetch(gpu_xcache *x, int l, int e, gpu_mat *h_exp_l, gpu_mat *d_exp_l, int evict_current) {
  gpu_xlayer *L = &x->L[l];
  if (!L->host || !L->host[e]) {
    x->uses_resident++;
    return 0;
  }
  if (gpu_xcache_lookup(x, l, e) >= 0) return 0;
  int s = gpu_xcache_pick(x, evict_current);
  if (s < 0) return 1;
  gpu_xcache_assign(x, s, l, e);
  return load_slot(x, s, l, e, h_exp_l, d_exp_l);
}

int gpu_xcache_prefetch(gpu_xcache *x, int l, int e, gpu_mat *h_exp_l, gpu_mat *d_exp_l) {
  const int s = gpu_xcache_prefetch_slot(x, l, e);
  if (s == GPU_XC_FULL) return GPU_XC_FULL;
  return s < 0 ? 0 : load_slot(x, s, l, e, h_exp_l, d_exp_l);
}

int gpu_xcache_lookup(gpu_xcache *x, int l, int e) {
  int s = x->L[l].slot[e];
  if (s < 0) return -1;
  if (x->s_call[s] != x->call) { /* a second pair of the same call is no new use */
    x->hits++;
    gpu_xcache_count(x, l, e);
  }
  if (x->s_pref[s]) { /* the first use of a look-ahead copy */
    x->s_pref[s] = 0;
    x->prefetch_hits++;
  }
  x->s_tick[s] = ++x->tick;
  x->s_call[s] = x->call;
  return s;
}

/* slot s now holds (l, e), used (or claimed) by the current call */
static void place(gpu_xcache *x, int s, int l, int e) {
  if (x->s_exp[s] >= 0) x->L[x->s_layer[s]].slot[x->s_exp[s]] = -1;
  x->s_layer[s] = l;
  x->s_exp[s] = e;
  x->s_tick[s] = ++x->tick;
  x->s_call[s] = x->call;
  x->s_pref[s] = 0;
  x->L[l].slot[e] = s;
}

void gpu_xcache_assign(gpu_xcache *x, int s, int l, int e) {
  place(x, s, l, e);
  x->misses++;
  gpu_xcache_count(x, l, e);
}

/* A guess is no use yet: it counts no miss and no frequency (an unused
 * guess is the first LFU victim) but, like the current call's experts, is
 * kept from the eviction of the guesses after it. */
int gpu_xcache_prefetch_slot(gpu_xcache *x, int l, int e) {
  const gpu_xlayer *L = &x->L[l];
  if (!L->host || !L->host[e]) return GPU_XC_HELD;
  int s = L->slot[e];
  if (s >= 0) {
    x->s_tick[s] = ++x->tick;
    x->s_call[s] = x->call;
    return GPU_XC_HELD;
  }
  if ((s = gpu_xcache_pick(x, 0)) < 0) return GPU_XC_FULL;
  place(x, s, l, e);
  x->s_pref[s] = 1;
  x->prefetches++;
  return s;
}

int gpu_xcache_lookahead_quota(int mode, uint64_t own) {
  if (mode == GLM53_GPU_LA_ALL) return INT_MAX;
  return mode == GLM53_GPU_LA_IDLE && own == 0 ? GPU_LA_IDLE_MAX : 0;
}

void gpu_xcache_count(gpu_xcache *x, int l, int e) {
  x->L[l].freq[e]++;
  if (++x->uses % ((uint64_t)x->nslots * 64) == 0)
    for (int i = 0; i < x->nlayers; i++)
      if (x->L[i].freq)
        for (int j = 0; j < x->E; j++) x->L[i].freq[j] >>= 1;
}

/* ordering of eviction candidates: empty first, then (lfu) fewer uses, then older */
static int worse(const gpu_xcache *x, int a, int b) {
  int ea = x->s_exp[a] >= 0, eb = x->s_exp[b] >= 0;
  if (ea != eb) return !ea;
  if (x->lfu && ea) {
    uint32_t fa = x->L[x->s_layer[a]].freq[x->s_exp[a]], fb = x->L[x->s_layer[b]].freq[x->s_exp[b]];
    if (fa != fb) return fa < fb;
  }
  return x->s_tick[a] < x->s_tick[b];
}

int gpu_xcache_pick(const gpu_xcache *x, int evict_current) {
  int best = -1, best_cur = -1;
  for (int i = 0; i < x->nslots; i++) {
    int *b = x->s_call[i] != x->call ? &best : &best_cur;
    if (*b < 0 || worse(x, i, *b)) *b = i;
  }
  return best >= 0 ? best : evict_current ? best_cur : -1;
}

int gpu_xcache_ready(gpu_xcache *x, int l, int e) {
  const gpu_xlayer *L = &x->L[l];
  if (!L->host || !L->host[e] || L->slot[e] < 0) return 0;
  return gk_compute_wait(x->s_ready[L->slot[e]]) ? glm53_err("gpu expert wait: %s", gk_error()) : 0;
}

int gpu_xcache_done(gpu_xcache *x, int l, int e) {
  const gpu_xlayer *L = &x->L[l];
  if (!L->host || !L->host[e] || L->slot[e] < 0) return 0;
  return gk_event_on_compute(x->s_free[L->slot[e]]) ? glm53_err("gpu expert release: %s", gk_error()) : 0;
}

/* Paged MLA latent and indexer caches (gpu_internal.h): fixed-size device
 * pages handed to sessions as their contexts grow, returned when a session
 * is freed and reused by the next one. Pages come from slabs of
 * GPU_PAGE_SLAB pages (one device allocation each, zeroed once), never
 * given back to the device before the model is freed. */
#include "gpu/gpu_internal.h"
#include "core/err.h"
#include "core/log.h"
#include "core/util.h"
#include <stdlib.h>
#include <string.h>


int gpu_page_shift(void) {
  const char *e = getenv("GLM53_GPU_PAGE_TOKENS");
  int n = e && *e ? atoi(e) : 256, s = 0;
  if (n < 1) n = 1;
  if (n > 65536) n = 65536;
  while ((1 << (s + 1)) <= n) s++; /* a power of two at most n */
  return s;
}

static gpu_page_class *page_class(gpu_pages *pp, size_t bytes) {
  for (int i = 0; i < pp->nclass; i++)
    if (pp->cls[i].bytes == bytes) return &pp->cls[i];
  if (pp->nclass == GPU_PAGE_CLASSES) return NULL;
  gpu_page_class *c = &pp->cls[pp->nclass++];
  memset(c, 0, sizeof *c);
  c->bytes = bytes;
  return c;
}

/* room in the free list for `more` pages */
static void free_reserve(gpu_page_class *c, int more) {
  if (c->cap - c->nfree >= more) return;
  c->cap = c->cap ? c->cap * 2 : 64;
  if (c->cap - c->nfree < more) c->cap = c->nfree + more;
  c->free = xrealloc(c->free, (size_t)c->cap * sizeof(void *));
}

static void *page_get(gpu_pages *pp, size_t bytes) {
  gpu_page_class *c = page_class(pp, bytes);
  if (!c) {
    glm53_err("gpu cache pages: more than %d page sizes", GPU_PAGE_CLASSES);
    return NULL;
  }
  if (!c->nfree) {
    char *slab = pp->alloc(pp->ctx, bytes * GPU_PAGE_SLAB);
    if (!slab || gk_memset(slab, 0, bytes * GPU_PAGE_SLAB)) {
      glm53_err("gpu cache pages: %.1f MB more device memory: %s", bytes * GPU_PAGE_SLAB / 1e6, gk_error());
      return NULL;
    }
    free_reserve(c, GPU_PAGE_SLAB);
    for (int i = GPU_PAGE_SLAB - 1; i >= 0; i--) c->free[c->nfree++] = slab + (size_t)i * bytes; /* lowest first out */
    pp->bytes += bytes * GPU_PAGE_SLAB;
  }
  c->used++;
  return c->free[--c->nfree];
}

static void page_put(gpu_pages *pp, size_t bytes, void *p) {
  gpu_page_class *c = page_class(pp, bytes);
  if (!c) return; /* cannot happen: the class gave the page */
  free_reserve(c, 1);
  c->free[c->nfree++] = p;
  c->used--;
}

void gpu_pages_free(gpu_pages *pp) {
  for (int i = 0; i < pp->nclass; i++) free(pp->cls[i].free);
  memset(pp, 0, sizeof *pp);
}

int gpu_ptab_init(gpu_ptab *t, size_t page_bytes, int max_rows, int pshift, void *(*alloc)(void *ctx, size_t n), void *ctx) {
  memset(t, 0, sizeof *t);
  t->page_bytes = page_bytes;
  t->pshift = pshift;
  t->cap = (max_rows + (1 << pshift) - 1) >> pshift;
  if (t->cap < 1) t->cap = 1;
  t->host = xcalloc((size_t)t->cap, sizeof(void *));
  t->dev = alloc(ctx, (size_t)t->cap * sizeof(void *));
  return t->dev ? 0 : -1;
}

int gpu_ptab_grow(gpu_ptab *t, gpu_pages *pp, int rows) {
  int need = (rows + (1 << t->pshift) - 1) >> t->pshift;
  if (need > t->cap) need = t->cap;
  if (need <= t->n) return 0;
  const int n0 = t->n;
  while (t->n < need) {
    void *p = page_get(pp, t->page_bytes);
    if (!p) break;
    t->host[t->n++] = p;
  }
  if (t->n > n0 && gk_h2d((void **)t->dev + n0, t->host + n0, (size_t)(t->n - n0) * sizeof(void *)))
    return glm53_err("gpu cache pages: table upload: %s", gk_error());
  return t->n < need ? -1 : 0;
}

size_t gpu_ptab_need(const gpu_ptab *t, int rows) {
  int need = (rows + (1 << t->pshift) - 1) >> t->pshift;
  if (need > t->cap) need = t->cap;
  return need > t->n ? (size_t)(need - t->n) * t->page_bytes : 0;
}

size_t gpu_pages_spare(const gpu_pages *pp) {
  size_t b = 0;
  for (int i = 0; i < pp->nclass; i++) b += (size_t)pp->cls[i].nfree * pp->cls[i].bytes;
  return b;
}

void gpu_ptab_release(gpu_ptab *t, gpu_pages *pp) {
  for (int i = 0; i < t->n; i++) page_put(pp, t->page_bytes, t->host[i]);
  free(t->host);
  memset(t, 0, sizeof *t);
}

/* ---- tests and the startup validation ---- */
void *gpu_pages_make(const float *host, int rows, int stride, int pshift, void *(*alloc)(void *ctx, size_t n), void *ctx,
                     float **buf) {
  const int pr = 1 << pshift, np = rows > 0 ? (rows + pr - 1) / pr : 1;
  const size_t pf = (size_t)pr * stride; /* floats per page */
  float *b = alloc(ctx, (size_t)np * pf * sizeof(float));
  void **tab = xmalloc((size_t)np * sizeof(void *));
  void *dtab = alloc(ctx, (size_t)np * sizeof(void *));
  int bad = !b || !dtab || gk_memset(b, 0, (size_t)np * pf * sizeof(float));
  for (int i = 0; i < np && !bad; i++) {
    tab[i] = b + (size_t)(np - 1 - i) * pf;
    const int n = rows - i * pr < pr ? rows - i * pr : pr;
    if (host && n > 0) bad |= gk_h2d(tab[i], host + (size_t)i * pf, (size_t)n * stride * sizeof(float)) != 0;
  }
  bad = bad || gk_h2d(dtab, tab, (size_t)np * sizeof(void *));
  free(tab);
  *buf = b;
  return bad ? NULL : dtab;
}

int gpu_pages_read(float *host, const float *buf, int rows, int stride, int pshift) {
  const int pr = 1 << pshift, np = rows > 0 ? (rows + pr - 1) / pr : 1;
  const size_t pf = (size_t)pr * stride;
  for (int i = 0; i * pr < rows; i++) {
    const int n = rows - i * pr < pr ? rows - i * pr : pr;
    if (gk_d2h(host + (size_t)i * pf, buf + (size_t)(np - 1 - i) * pf, (size_t)n * stride * sizeof(float))) return -1;
  }
  return 0;
}

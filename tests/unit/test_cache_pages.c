/* (Not test_gpu_*: that prefix is the device tests' in CI.) The paged-cache
 * bookkeeping of the GPU backend (src/gpu/gpu_pages.c) on
 * the host: the file is compiled into this test with host memory standing
 * in for device memory (its gk_* calls and its own functions renamed, so a
 * GPU build that links the real ones has no clash). Checks: page sizes
 * from GLM53_GPU_PAGE_TOKENS; tables growing page by page, pages distinct
 * and zeroed, the device copy of each table equal to the host one; a
 * freed session's pages reused by the next (no new slab); the capacity
 * bound; the bytes a growth needs and the pool's spare pages; an
 * allocation failure mid-growth (-1, the message, the pages got
 * so far kept and uploaded, a later growth completing); two page sizes in
 * two classes; the reversed-page test tables round-tripping. */
#define gk_memset t_memset
#define gk_h2d t_h2d
#define gk_d2h t_d2h
#define gk_error t_error
#define gpu_page_shift t_gpu_page_shift
#define gpu_ptab_init t_gpu_ptab_init
#define gpu_ptab_grow t_gpu_ptab_grow
#define gpu_ptab_release t_gpu_ptab_release
#define gpu_pages_free t_gpu_pages_free
#define gpu_pages_make t_gpu_pages_make
#define gpu_pages_read t_gpu_pages_read
#define gpu_ptab_need t_gpu_ptab_need
#define gpu_pages_spare t_gpu_pages_spare
#include "gpu/gpu_internal.h"
#include "glm53.h"
#include "test_util.h"
#include <stdlib.h>
#include <string.h>

int t_memset(void *d, int v, size_t n) { memset(d, v, n); return 0; }
int t_h2d(void *d, const void *h, size_t n) { memcpy(d, h, n); return 0; }
int t_d2h(void *h, const void *d, size_t n) { memcpy(h, d, n); return 0; }
const char *t_error(void) { return "host stand-in out of memory"; }

#include "../../src/gpu/gpu_pages.c"

/* "device" allocations: dirty memory (the pool must zero its slabs), kept
 * for freeing at the end, failing once `fail_at` reaches zero */
static void *blocks[256];
static int nblocks, fail_at = -1;
static void *halloc(void *ctx, size_t n) {
  (void)ctx;
  if (fail_at >= 0 && fail_at-- == 0) return NULL;
  void *p = malloc(n);
  memset(p, 0xa5, n);
  blocks[nblocks++] = p;
  return p;
}

static int table_ok(const gpu_ptab *t) { return t->n == 0 || !memcmp(t->host, t->dev, (size_t)t->n * sizeof(void *)); }
static int all_zero(const void *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (((const unsigned char *)p)[i]) return 0;
  return 1;
}

int main(void) {
  static const struct { const char *env; int shift; } ps[] = {{"256", 8}, {"300", 8}, {"1", 0}, {"0", 0}, {"100000", 16}, {NULL, 8}};
  for (size_t i = 0; i < sizeof ps / sizeof *ps; i++) {
    if (ps[i].env) setenv("GLM53_GPU_PAGE_TOKENS", ps[i].env, 1);
    else unsetenv("GLM53_GPU_PAGE_TOKENS");
    CHECK(gpu_page_shift() == ps[i].shift, "GLM53_GPU_PAGE_TOKENS=%s: shift %d, want %d", ps[i].env ? ps[i].env : "(unset)",
          gpu_page_shift(), ps[i].shift);
  }

  gpu_pages pp = {.alloc = halloc};
  const size_t pb = 4 * 64 * sizeof(float); /* 4 rows of 64 floats */
  gpu_ptab a, b;
  CHECK(gpu_ptab_init(&a, pb, 70, 2, halloc, NULL) == 0 && a.cap == 18, "table a: cap %d", a.cap);
  CHECK(gpu_ptab_init(&b, pb, 70, 2, halloc, NULL) == 0, "table b");
  CHECK(gpu_ptab_grow(&a, &pp, 5) == 0 && a.n == 2 && table_ok(&a), "a to 5 rows: %d pages", a.n);
  CHECK(gpu_ptab_grow(&a, &pp, 3) == 0 && a.n == 2, "a shrinking request keeps its pages");
  CHECK(gpu_ptab_need(&a, 12) == pb && gpu_ptab_need(&a, 8) == 0 && gpu_ptab_need(&a, 1000) == 16 * pb,
        "bytes to grow a: %zu / %zu / %zu", gpu_ptab_need(&a, 12), gpu_ptab_need(&a, 8), gpu_ptab_need(&a, 1000));
  CHECK(gpu_pages_spare(&pp) == 14 * pb, "spare pages of the first slab: %zu bytes", gpu_pages_spare(&pp));
  CHECK(gpu_ptab_grow(&a, &pp, 12) == 0 && a.n == 3 && table_ok(&a), "a to 12 rows: %d pages", a.n);
  CHECK(gpu_ptab_grow(&b, &pp, 60) == 0 && b.n == 15 && table_ok(&b), "b to 60 rows: %d pages", b.n);
  CHECK(pp.bytes == 2 * 16 * pb, "two slabs for 18 pages: %.0f bytes", pp.bytes);
  int distinct = 1, zero = 1;
  for (int i = 0; i < a.n + b.n; i++) {
    void *p = i < a.n ? a.host[i] : b.host[i - a.n];
    zero &= all_zero(p, pb);
    for (int j = 0; j < i; j++) distinct &= p != (j < a.n ? a.host[j] : b.host[j - a.n]);
  }
  CHECK(distinct && zero, "pages distinct (%d) and zeroed (%d)", distinct, zero);
  CHECK(gpu_ptab_grow(&a, &pp, 1000) == 0 && a.n == a.cap && table_ok(&a), "a past its capacity: %d of %d pages", a.n, a.cap);
  CHECK(pp.cls[0].used == a.n + b.n && pp.nclass == 1, "class use %ld", pp.cls[0].used);
  /* a freed session's pages go to the next one: no new slab */
  void *held = a.host[0];
  const double before = pp.bytes;
  gpu_ptab_release(&a, &pp);
  CHECK(a.host == NULL && a.n == 0 && pp.cls[0].used == b.n, "release: %ld pages in use", pp.cls[0].used);
  gpu_ptab c;
  CHECK(gpu_ptab_init(&c, pb, 70, 2, halloc, NULL) == 0, "table c");
  CHECK(gpu_ptab_grow(&c, &pp, 70) == 0 && c.n == 18 && pp.bytes == before && table_ok(&c), "c reuses a's pages: %.0f bytes",
        pp.bytes);
  int reused = 0;
  for (int i = 0; i < c.n; i++) reused |= c.host[i] == held;
  CHECK(reused, "a's first page is among c's");
  /* out of memory half way: the pages got so far are kept and in the table */
  gpu_ptab d;
  CHECK(gpu_ptab_init(&d, pb, 200, 2, halloc, NULL) == 0, "table d");
  const int free_now = pp.cls[0].nfree;
  fail_at = 0;
  glm53_err("(none)");
  CHECK(gpu_ptab_grow(&d, &pp, 200) == -1 && d.n == free_now && table_ok(&d), "d past memory: -1 with %d pages", d.n);
  CHECK(strstr(glm53_last_error(), "host stand-in out of memory") != NULL, "message: %s", glm53_last_error());
  fail_at = -1;
  CHECK(gpu_ptab_grow(&d, &pp, 200) == 0 && d.n == 50 && table_ok(&d), "d after memory returns: %d pages", d.n);
  /* another page size: its own class */
  gpu_ptab e;
  CHECK(gpu_ptab_init(&e, 2 * pb, 8, 2, halloc, NULL) == 0 && gpu_ptab_grow(&e, &pp, 8) == 0 && pp.nclass == 2 &&
            pp.cls[1].used == 2,
        "second page size: %d classes", pp.nclass);
  gpu_ptab_release(&b, &pp);
  gpu_ptab_release(&c, &pp);
  gpu_ptab_release(&d, &pp);
  gpu_ptab_release(&e, &pp);
  CHECK(pp.cls[0].used == 0 && pp.cls[1].used == 0, "all pages back");
  gpu_pages_free(&pp);

  /* the test tables: 11 rows of 5 floats in pages of 4 rows, reversed */
  float host[60], back[60];
  for (int i = 0; i < 60; i++) host[i] = (float)i + 0.5f;
  float *buf = NULL;
  void **tab = gpu_pages_make(host, 11, 5, 2, halloc, NULL, &buf);
  CHECK(tab && tab[0] == buf + 2 * 20 && tab[2] == buf, "page table reversed");
  memset(back, 0, sizeof back);
  CHECK(tab && gpu_pages_read(back, buf, 11, 5, 2) == 0 && !memcmp(back, host, 55 * sizeof(float)), "round trip");
  CHECK(tab && all_zero(buf + 3 * 5, 5 * sizeof(float)), "the last page's unused row zero");
  for (int i = 0; i < nblocks; i++) free(blocks[i]);
  TEST_DONE();
}

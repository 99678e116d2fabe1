/* Byte-pair encoding of one pre-token. Symbols start as the byte-level
 * tokens of the raw bytes; the lowest-ranked adjacent pair (leftmost on ties)
 * is merged until no known pair remains. A binary heap of candidate pairs plus
 * a doubly linked symbol list gives O(n log n) per word; stale heap entries
 * are skipped by re-checking the pair's ids. Results of words < 256 bytes are
 * cached for the duration of one tok_encode call. */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tokenizer/tok_internal.h"

typedef struct { int32_t id, prev, next, alive; } bpe_sym;
typedef struct { int32_t rank, pos, left, right, merged; } bpe_cand;

#define CACHE_MAX_WORD 256
#define CACHE_MAX_IDS (1u << 21)

void ids_push(tok_ids *o, int32_t id) {
  if (o->n == o->cap) {
    o->cap = o->cap ? o->cap * 2 : 256;
    o->v = xrealloc(o->v, o->cap * sizeof *o->v);
  }
  o->v[o->n++] = id;
}

void bpe_cache_init(tok_bpe_cache *c) {
  memset(c, 0, sizeof *c);
  strmap_init(&c->map, 64); /* grows; small so short calls stay cheap */
}

void bpe_cache_free(tok_bpe_cache *c) {
  strmap_free(&c->map);
  free(c->ids);
  free(c->w_off);
  free(c->w_len);
  free(c->sym);
  free(c->heap);
  memset(c, 0, sizeof *c);
}

static int cand_less(const bpe_cand *a, const bpe_cand *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(bpe_cand *h, size_t *n, bpe_cand c) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!cand_less(&c, &h[p])) break;
    h[i] = h[p];
    i = p;
  }
  h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, size_t *n) {
  bpe_cand top = h[0], last = h[--(*n)];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const bpe_cand *best = &last;
    if (l < *n && cand_less(&h[l], best)) { m = l; best = &h[l]; }
    if (r < *n && cand_less(&h[r], best)) m = r;
    if (m == i) break;
    h[i] = h[m];
    i = m;
  }
  if (*n) h[i] = last;
  return top;
}

static void try_pair(const glm53_tokenizer *t, bpe_sym *sy, int32_t pos, bpe_cand *h, size_t *nh) {
  if (pos < 0 || sy[pos].next < 0) return;
  const tok_mergeslot *m = mergemap_get(&t->merges, sy[pos].id, sy[sy[pos].next].id);
  if (!m) return;
  bpe_cand c = {m->rank, pos, sy[pos].id, sy[sy[pos].next].id, m->id};
  heap_push(h, nh, c);
}

/* Merge the whole word; appends the ids to out. */
static void bpe_merge(const glm53_tokenizer *t, tok_bpe_cache *c, const unsigned char *w, size_t n,
                      tok_ids *out) {
  if (c->sym_cap < n) {
    c->sym_cap = n * 2;
    c->sym = xrealloc(c->sym, c->sym_cap * sizeof(bpe_sym));
  }
  if (c->heap_cap < n) {
    c->heap_cap = n * 2;
    c->heap = xrealloc(c->heap, c->heap_cap * sizeof(bpe_cand));
  }
  bpe_sym *sy = c->sym;
  bpe_cand *h = c->heap;
  size_t nh = 0;
  for (size_t i = 0; i < n; i++) {
    sy[i].id = t->byte_id[w[i]];
    sy[i].prev = (int32_t)i - 1;
    sy[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    sy[i].alive = 1;
  }
  for (size_t i = 0; i + 1 < n; i++) try_pair(t, sy, (int32_t)i, h, &nh);
  while (nh) {
    bpe_cand top = heap_pop(h, &nh);
    bpe_sym *a = &sy[top.pos];
    if (!a->alive || a->id != top.left || a->next < 0) continue;
    bpe_sym *b = &sy[a->next];
    if (b->id != top.right) continue;
    /* The heap may hold more entries than symbols; room for 2 pushes. */
    if (nh + 2 > c->heap_cap) {
      c->heap_cap = c->heap_cap * 2 + 4;
      c->heap = xrealloc(c->heap, c->heap_cap * sizeof(bpe_cand));
      h = c->heap;
    }
    a->id = top.merged;
    b->alive = 0;
    a->next = b->next;
    if (b->next >= 0) sy[b->next].prev = top.pos;
    try_pair(t, sy, a->prev, h, &nh);
    try_pair(t, sy, top.pos, h, &nh);
  }
  for (int32_t i = 0; i >= 0; i = sy[i].next)
    if (sy[i].id >= 0) ids_push(out, sy[i].id); /* a byte missing from the vocab is dropped (no unk) */
}

void bpe_word(const glm53_tokenizer *t, tok_bpe_cache *c, const char *w, size_t n, tok_ids *out) {
  if (n == 0) return;
  if (n == 1) {
    if (t->byte_id[(unsigned char)w[0]] >= 0) ids_push(out, t->byte_id[(unsigned char)w[0]]);
    return;
  }
  if (t->ignore_merges) { /* a word that is itself a token skips the merges */
    int32_t id = strmap_get(&t->raw2id, w, n);
    if (id >= 0) { ids_push(out, id); return; }
  }
  int cacheable = n < CACHE_MAX_WORD;
  if (cacheable) {
    int32_t k = strmap_get(&c->map, w, n);
    if (k >= 0) {
      for (uint32_t i = 0; i < c->w_len[k]; i++) ids_push(out, c->ids[c->w_off[k] + i]);
      return;
    }
  }
  size_t before = out->n;
  bpe_merge(t, c, (const unsigned char *)w, n, out);
  if (!cacheable) return;
  size_t cnt = out->n - before;
  if (c->n_ids + cnt > CACHE_MAX_IDS) { /* full: start over */
    strmap_clear(&c->map);
    c->n_ids = c->n_words = 0;
  }
  if (c->n_ids + cnt > c->cap_ids) {
    c->cap_ids = (c->n_ids + cnt) * 2 + 256;
    c->ids = xrealloc(c->ids, c->cap_ids * sizeof *c->ids);
  }
  if (c->n_words == c->cap_words) {
    c->cap_words = c->cap_words ? c->cap_words * 2 : 256;
    c->w_off = xrealloc(c->w_off, c->cap_words * sizeof *c->w_off);
    c->w_len = xrealloc(c->w_len, c->cap_words * sizeof *c->w_len);
  }
  memcpy(c->ids + c->n_ids, out->v + before, cnt * sizeof *c->ids);
  c->w_off[c->n_words] = (uint32_t)c->n_ids;
  c->w_len[c->n_words] = (uint32_t)cnt;
  strmap_put(&c->map, w, n, (int32_t)c->n_words);
  c->n_words++;
  c->n_ids += cnt;
}

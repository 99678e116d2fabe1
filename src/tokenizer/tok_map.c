/* Open-addressing hash maps for the tokenizer: vocabulary strings and BPE
 * merge pairs. Linear probing, power-of-two tables kept at most half full. */
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tokenizer/tok_internal.h"

/* 64-bit FNV-1a over 8-byte chunks with a final mix: cheap and good enough for
 * short vocabulary strings. */
uint64_t tok_hash(const void *p, size_t n) {
  const unsigned char *s = p;
  uint64_t h = 0xcbf29ce484222325ull ^ (n * 0x9e3779b97f4a7c15ull);
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, s, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
    s += 8; n -= 8;
  }
  uint64_t w = 0;
  memcpy(&w, s, n);
  h = (h ^ w) * 0x100000001b3ull;
  h ^= h >> 32; h *= 0xd6e8feb86659fd93ull; h ^= h >> 32;
  return h;
}

static size_t pow2_for(size_t expect) {
  size_t c = 16;
  while (c < expect * 2) c <<= 1;
  return c;
}

void strmap_init(tok_strmap *m, size_t expect) {
  memset(m, 0, sizeof *m);
  size_t c = pow2_for(expect);
  m->slots = xcalloc(c, sizeof *m->slots);
  m->mask = c - 1;
}

void strmap_free(tok_strmap *m) {
  free(m->slots);
  free(m->arena);
  memset(m, 0, sizeof *m);
}

void strmap_clear(tok_strmap *m) {
  memset(m->slots, 0, (m->mask + 1) * sizeof *m->slots);
  m->count = 0;
  m->arena_len = 0;
}

static tok_strslot *find_slot(tok_strslot *slots, size_t mask, const char *arena, uint64_t h,
                              const char *k, size_t n) {
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    tok_strslot *s = &slots[i];
    if (!s->used) return s;
    if (s->h == h && s->len == n && memcmp(arena + s->off, k, n) == 0) return s;
  }
}

static void strmap_grow(tok_strmap *m) {
  size_t nc = (m->mask + 1) * 2;
  tok_strslot *ns = xcalloc(nc, sizeof *ns);
  for (size_t i = 0; i <= m->mask; i++) {
    if (!m->slots[i].used) continue;
    size_t j = m->slots[i].h & (nc - 1);
    while (ns[j].used) j = (j + 1) & (nc - 1);
    ns[j] = m->slots[i];
  }
  free(m->slots);
  m->slots = ns;
  m->mask = nc - 1;
}

void strmap_put(tok_strmap *m, const char *k, size_t n, int32_t v) {
  if ((m->count + 1) * 2 > m->mask + 1) strmap_grow(m);
  uint64_t h = tok_hash(k, n);
  tok_strslot *s = find_slot(m->slots, m->mask, m->arena, h, k, n);
  if (s->used) { s->val = v; return; }
  if (m->arena_len + n + 1 > m->arena_cap) {
    size_t nc = m->arena_cap ? m->arena_cap : 4096;
    while (nc < m->arena_len + n + 1) nc *= 2;
    m->arena = xrealloc(m->arena, nc);
    m->arena_cap = nc;
  }
  if (n) memcpy(m->arena + m->arena_len, k, n);
  s->h = h; s->off = (uint32_t)m->arena_len; s->len = (uint32_t)n; s->val = v; s->used = 1;
  m->arena_len += n;
  m->count++;
}

int32_t strmap_get(const tok_strmap *m, const char *k, size_t n) {
  if (!m->slots) return -1;
  const tok_strslot *s = find_slot(m->slots, m->mask, m->arena, tok_hash(k, n), k, n);
  return s->used ? s->val : -1;
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

void mergemap_init(tok_mergemap *m, size_t expect) {
  size_t c = pow2_for(expect);
  m->slots = xmalloc(c * sizeof *m->slots);
  for (size_t i = 0; i < c; i++) m->slots[i].key = UINT64_MAX; /* empty */
  m->mask = c - 1;
  m->count = 0;
}

void mergemap_free(tok_mergemap *m) {
  free(m->slots);
  memset(m, 0, sizeof *m);
}

void mergemap_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
  if ((m->count + 1) * 2 > m->mask + 1) {
    tok_mergemap g;
    mergemap_init(&g, m->count * 2 + 16);
    for (size_t i = 0; i <= m->mask; i++) {
      if (m->slots[i].key == UINT64_MAX) continue;
      size_t j = mix64(m->slots[i].key) & g.mask;
      while (g.slots[j].key != UINT64_MAX) j = (j + 1) & g.mask;
      g.slots[j] = m->slots[i];
    }
    g.count = m->count;
    free(m->slots);
    *m = g;
  }
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  size_t j = mix64(key) & m->mask;
  while (m->slots[j].key != UINT64_MAX && m->slots[j].key != key) j = (j + 1) & m->mask;
  if (m->slots[j].key == UINT64_MAX) m->count++;
  m->slots[j].key = key; m->slots[j].rank = rank; m->slots[j].id = id;
}

const tok_mergeslot *mergemap_get(const tok_mergemap *m, int32_t a, int32_t b) {
  if (a < 0 || b < 0) return NULL;
  uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
  for (size_t j = mix64(key) & m->mask;; j = (j + 1) & m->mask) {
    if (m->slots[j].key == key) return &m->slots[j];
    if (m->slots[j].key == UINT64_MAX) return NULL;
  }
}

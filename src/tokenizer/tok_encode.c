/* tok_encode: added tokens -> (invalid-byte split) -> normalizer -> added
 * tokens marked `normalized` -> pre-tokenizers -> BPE, in the order Hugging
 * Face tokenizers applies them. */
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

typedef struct {
  const glm53_tokenizer *t;
  int parse_special;
  tok_bpe_cache cache;
  tok_spans spans;
  tok_owned owned;
  pcre2_match_data *md;
  pcre2_match_context *mc;
  pcre2_jit_stack *js;
  tok_ids out;
} enc_ctx;

typedef struct { size_t off, len; int added; } seg; /* added: index or -1 */
typedef struct { seg *v; size_t n, cap; } segs;

static void seg_push(segs *s, size_t off, size_t len, int added) {
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 16;
    s->v = xrealloc(s->v, s->cap * sizeof *s->v);
  }
  s->v[s->n++] = (seg){off, len, added};
}

static int is_word_byte(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80;
}

/* Longest added token of this phase starting at s[i], or -1. */
static int match_added(const enc_ctx *c, int ph, const char *s, size_t n, size_t i) {
  const glm53_tokenizer *t = c->t;
  unsigned char fb = (unsigned char)s[i];
  for (int k = 0; k < t->first_n[ph][fb]; k++) {
    const tok_added *a = &t->added[t->first_idx[ph][fb][k]];
    if (a->special && !c->parse_special) continue;
    if (a->mlen > n - i || memcmp(s + i, a->mstr, a->mlen) != 0) continue;
    /* single_word (approximation: ASCII word chars and any non-ASCII byte) */
    if (a->single_word && ((i > 0 && is_word_byte((unsigned char)s[i - 1])) ||
                           (i + a->mlen < n && is_word_byte((unsigned char)s[i + a->mlen]))))
      continue;
    return t->first_idx[ph][fb][k];
  }
  return -1;
}

/* Unicode white space at the start / end of s (valid or not). */
static size_t lead_ws(const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    int l = utf8_valid_len((const unsigned char *)s + i, n - i);
    if (!l || !unicode_is_white_space(utf8_cp((const unsigned char *)s + i, l))) break;
    i += (size_t)l;
  }
  return i;
}
static size_t trail_ws(const char *s, size_t n) {
  size_t i = 0, last_non = 0; /* end of the last non-space code point */
  while (i < n) {
    int l = utf8_valid_len((const unsigned char *)s + i, n - i);
    if (!l) { i++; last_non = i; continue; }
    i += (size_t)l;
    if (!unicode_is_white_space(utf8_cp((const unsigned char *)s + i - l, l))) last_non = i;
  }
  return n - last_non;
}

/* Split s into text and added-token segments; lstrip/rstrip eat the white
 * space of the neighbouring text. */
static void split_added(const enc_ctx *c, int ph, const char *s, size_t n, segs *out) {
  out->n = 0;
  size_t start = 0, i = 0;
  while (i < n) {
    int k = c->t->first_n[ph][(unsigned char)s[i]] ? match_added(c, ph, s, n, i) : -1;
    if (k < 0) { i++; continue; }
    if (i > start) seg_push(out, start, i - start, -1);
    seg_push(out, i, c->t->added[k].mlen, k);
    i += c->t->added[k].mlen;
    start = i;
  }
  if (start < n) seg_push(out, start, n - start, -1);
  for (size_t j = 0; j < out->n; j++) {
    if (out->v[j].added < 0) continue;
    const tok_added *a = &c->t->added[out->v[j].added];
    if (a->lstrip && j > 0 && out->v[j - 1].added < 0)
      out->v[j - 1].len -= trail_ws(s + out->v[j - 1].off, out->v[j - 1].len);
    if (a->rstrip && j + 1 < out->n && out->v[j + 1].added < 0) {
      size_t w = lead_ws(s + out->v[j + 1].off, out->v[j + 1].len);
      out->v[j + 1].off += w;
      out->v[j + 1].len -= w;
    }
  }
}

/* Pre-tokenize and BPE one normalized piece without added tokens. */
static int encode_piece(enc_ctx *c, const char *s, size_t n) {
  if (n == 0) return 0;
  c->spans.n = 0;
  if (pretok_run(c->t->steps, c->t->n_steps, s, n, &c->spans, &c->owned, c->md, c->mc)) return -1;
  for (size_t i = 0; i < c->spans.n; i++) bpe_word(c->t, &c->cache, c->spans.v[i].p, c->spans.v[i].len, &c->out);
  for (size_t i = 0; i < c->owned.n; i++) free(c->owned.v[i]);
  c->owned.n = 0;
  return 0;
}

/* A valid UTF-8 run: normalize, then match normalized added tokens. */
static int encode_valid(enc_ctx *c, const char *s, size_t n) {
  const glm53_tokenizer *t = c->t;
  if (t->norm.n == 0) return encode_piece(c, s, n);
  size_t nl;
  char *ns = tok_normalize(&t->norm, s, n, &nl);
  if (!ns) return -1;
  int rc = 0;
  segs sg = {0};
  split_added(c, 1, ns, nl, &sg);
  for (size_t j = 0; j < sg.n && !rc; j++) {
    if (sg.v[j].added >= 0) ids_push(&c->out, t->added[sg.v[j].added].id);
    else rc = encode_piece(c, ns + sg.v[j].off, sg.v[j].len);
  }
  free(sg.v);
  free(ns);
  return rc;
}

/* Text between raw-matched added tokens: invalid UTF-8 bytes become their own
 * byte tokens; valid runs go through the normal pipeline. */
static int encode_text(enc_ctx *c, const char *s, size_t n) {
  size_t i = 0, start = 0;
  while (i < n) {
    int l = utf8_valid_len((const unsigned char *)s + i, n - i);
    if (l) { i += (size_t)l; continue; }
    if (i > start && encode_valid(c, s + start, i - start)) return -1;
    int32_t id = c->t->byte_id[(unsigned char)s[i]];
    if (id >= 0) ids_push(&c->out, id);
    start = ++i;
  }
  if (i > start) return encode_valid(c, s + start, i - start);
  return 0;
}

int tok_encode(const glm53_tokenizer *t, const char *text, size_t len, int parse_special, int32_t **ids,
               size_t *n) {
  *ids = NULL;
  *n = 0;
  if (!t || (!text && len)) return glm53_err("tok_encode: null argument");
  enc_ctx c;
  memset(&c, 0, sizeof c);
  c.t = t;
  c.parse_special = parse_special;
  bpe_cache_init(&c.cache);
  c.md = pcre2_match_data_create(1, NULL);
  c.mc = pcre2_match_context_create(NULL);
  int rc = 0;
  segs sg = {0};
  split_added(&c, 0, text, len, &sg);
  for (size_t j = 0; j < sg.n && !rc; j++) {
    if (sg.v[j].added >= 0) ids_push(&c.out, t->added[sg.v[j].added].id);
    else rc = encode_text(&c, text + sg.v[j].off, sg.v[j].len);
  }
  free(sg.v);
  bpe_cache_free(&c.cache);
  free(c.spans.v);
  for (size_t i = 0; i < c.owned.n; i++) free(c.owned.v[i]);
  free(c.owned.v);
  pcre2_match_data_free(c.md);
  pcre2_match_context_free(c.mc);
  if (c.js) pcre2_jit_stack_free(c.js);
  if (rc) { free(c.out.v); return -1; }
  *ids = c.out.v ? c.out.v : xmalloc(sizeof(int32_t));
  *n = c.out.n;
  return 0;
}

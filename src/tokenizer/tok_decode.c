/* Decoding ids to bytes (ByteLevel decoder; added tokens give their content)
 * and the streaming detokenizer that holds back incomplete UTF-8. */
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

const char *tok_token_bytes(const glm53_tokenizer *t, int id, size_t *len) {
  if (!t || id < 0 || id >= t->vocab_size || (!t->id_str[id])) return NULL;
  if (len) *len = t->dec_len[id];
  return t->dec_arena + t->dec_off[id];
}

char *tok_decode(const glm53_tokenizer *t, const int32_t *ids, size_t n, int skip_special, size_t *len) {
  size_t total = 0;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= t->vocab_size || !t->id_str[ids[i]]) {
      glm53_err("tok_decode: token id %d out of range (vocab %d)", (int)ids[i], t->vocab_size);
      return NULL;
    }
    total += t->dec_len[ids[i]];
  }
  char *o = xmalloc(total + 1);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (skip_special && t->is_special[ids[i]]) continue;
    memcpy(o + k, t->dec_arena + t->dec_off[ids[i]], t->dec_len[ids[i]]);
    k += t->dec_len[ids[i]];
  }
  o[k] = 0;
  if (len) *len = k;
  return o;
}

struct tok_stream {
  const glm53_tokenizer *t;
  int skip_special;
  char *buf; size_t n, cap; /* decoded bytes not yet returned */
};

tok_stream *tok_stream_new(const glm53_tokenizer *t, int skip_special) {
  tok_stream *s = xcalloc(1, sizeof *s);
  s->t = t;
  s->skip_special = skip_special;
  return s;
}

void tok_stream_free(tok_stream *s) {
  if (!s) return;
  free(s->buf);
  free(s);
}

/* How many leading bytes of b[0..n) may be released: all of them except an
 * unfinished but so-far valid multibyte sequence at the very end. */
static size_t complete_prefix(const unsigned char *b, size_t n) {
  size_t back = n > 3 ? 3 : n;
  for (size_t k = 1; k <= back; k++) {
    unsigned char c = b[n - k];
    if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
    int need = (c >= 0xC2 && c < 0xE0) ? 2 : (c >= 0xE0 && c < 0xF0) ? 3 : (c >= 0xF0 && c < 0xF5) ? 4 : 1;
    if (need > (int)k) {
      /* hold only if the bytes we have can still start a valid sequence */
      if (k == 1) return n - k;
      unsigned char b1 = b[n - k + 1];
      int ok = !((c == 0xE0 && b1 < 0xA0) || (c == 0xED && b1 >= 0xA0) || (c == 0xF0 && b1 < 0x90) ||
                 (c == 0xF4 && b1 >= 0x90));
      if (ok) return n - k;
    }
    return n;
  }
  return n; /* only continuation bytes at the end: invalid, release */
}

static int drain(tok_stream *s, size_t upto, char *out, size_t cap) {
  size_t w = upto < cap ? upto : cap;
  if (w == 0) return 0;
  memcpy(out, s->buf, w);
  memmove(s->buf, s->buf + w, s->n - w);
  s->n -= w;
  return (int)w;
}

int tok_stream_push(tok_stream *s, int32_t id, char *out, size_t cap) {
  const glm53_tokenizer *t = s->t;
  if (id < 0 || id >= t->vocab_size || !t->id_str[id])
    return glm53_err("tok_stream_push: token id %d out of range (vocab %d)", (int)id, t->vocab_size);
  if (!(s->skip_special && t->is_special[id])) {
    size_t l = t->dec_len[id];
    if (s->n + l > s->cap) {
      s->cap = (s->n + l) * 2 + 16;
      s->buf = xrealloc(s->buf, s->cap);
    }
    if (l) memcpy(s->buf + s->n, t->dec_arena + t->dec_off[id], l);
    s->n += l;
  }
  return drain(s, complete_prefix((const unsigned char *)s->buf, s->n), out, cap);
}

int tok_stream_flush(tok_stream *s, char *out, size_t cap) { return drain(s, s->n, out, cap); }

/* Stop-condition matcher. Keeps a small hold buffer: the longest suffix of the
 * text so far that is a proper prefix of some stop string (any future match
 * must start inside it), plus a trailing incomplete UTF-8 sequence. */
#include "runtime/stop.h"

#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"

struct stop_matcher {
  char **str;
  size_t *len;
  int n_str;
  int32_t *ids; /* sorted */
  int n_ids;
  int max_tokens, count;
  int stopped, which;
  char *buf; /* held text, then scratch for the text being fed */
  size_t buf_n, buf_cap;
  char *out;
  size_t out_cap;
};

static int cmp_i32(const void *a, const void *b) {
  int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

stop_matcher *stop_new(const stop_config *c) {
  if (!c) {
    glm53_err("stop: NULL config");
    return NULL;
  }
  if (c->n_strings < 0 || c->n_strings > STOP_MAX_STRINGS || (c->n_strings > 0 && !c->strings)) {
    glm53_err("stop: need 0..%d stop strings (got %d)", STOP_MAX_STRINGS, c->n_strings);
    return NULL;
  }
  if (c->n_token_ids < 0 || (c->n_token_ids > 0 && !c->token_ids)) {
    glm53_err("stop: bad stop token list (n = %d)", c->n_token_ids);
    return NULL;
  }
  for (int k = 0; k < c->n_strings; k++) {
    size_t l = c->strings[k] ? strlen(c->strings[k]) : 0;
    if (l == 0 || l > STOP_MAX_STRING_LEN) {
      glm53_err("stop: stop string %d must be 1..%d bytes (got %zu)", k, STOP_MAX_STRING_LEN, l);
      return NULL;
    }
  }
  for (int k = 0; k < c->n_token_ids; k++)
    if (c->token_ids[k] < 0) {
      glm53_err("stop: stop token id %d is negative (%d)", k, (int)c->token_ids[k]);
      return NULL;
    }
  stop_matcher *m = xcalloc(1, sizeof *m);
  m->n_str = c->n_strings;
  m->str = xcalloc((size_t)m->n_str + 1, sizeof *m->str);
  m->len = xcalloc((size_t)m->n_str + 1, sizeof *m->len);
  for (int k = 0; k < m->n_str; k++) {
    m->str[k] = xstrdup(c->strings[k]);
    m->len[k] = strlen(m->str[k]);
  }
  m->n_ids = c->n_token_ids;
  m->ids = xmalloc(((size_t)m->n_ids + 1) * sizeof *m->ids);
  if (m->n_ids) memcpy(m->ids, c->token_ids, (size_t)m->n_ids * sizeof *m->ids);
  qsort(m->ids, (size_t)m->n_ids, sizeof *m->ids, cmp_i32);
  m->max_tokens = c->max_tokens;
  m->which = -1;
  return m;
}

void stop_free(stop_matcher *m) {
  if (!m) return;
  for (int k = 0; k < m->n_str; k++) free(m->str[k]);
  free(m->str);
  free(m->len);
  free(m->ids);
  free(m->buf);
  free(m->out);
  free(m);
}

stop_reason stop_token(stop_matcher *m, int32_t token) {
  if (m->n_ids && bsearch(&token, m->ids, (size_t)m->n_ids, sizeof token, cmp_i32)) return STOP_TOKEN;
  m->count++;
  if (m->max_tokens > 0 && m->count >= m->max_tokens) return STOP_LENGTH;
  return STOP_NONE;
}

int stop_which(const stop_matcher *m) { return m->which; }
int stop_count(const stop_matcher *m) { return m->count; }

static char *emit_buf(stop_matcher *m, size_t n) {
  if (n > m->out_cap) {
    m->out_cap = n * 2;
    m->out = xrealloc(m->out, m->out_cap);
  }
  return m->out;
}

/* Length of the longest suffix of b[0..n) that is a proper prefix of a stop string. */
static size_t partial_suffix(const stop_matcher *m, const char *b, size_t n) {
  size_t best = 0;
  for (int k = 0; k < m->n_str; k++) {
    size_t h = m->len[k] - 1 < n ? m->len[k] - 1 : n;
    for (; h > best; h--)
      if (b[n - h] == m->str[k][0] && memcmp(b + n - h, m->str[k], h) == 0) break;
    if (h > best) best = h;
  }
  return best;
}

/* Moves end back over a trailing UTF-8 sequence that is not complete within
 * b[0..end) (lead byte seen, continuation bytes missing). */
static size_t utf8_safe_end(const char *b, size_t end) {
  size_t j = end;
  while (j > 0 && end - j < 3 && ((unsigned char)b[j - 1] & 0xC0) == 0x80) j--;
  if (j == 0) return end;
  unsigned char lead = (unsigned char)b[j - 1];
  size_t need = lead >= 0xF0 && lead < 0xF8 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  if (lead >= 0xF8) need = 1; /* invalid lead: nothing to wait for */
  return end - (j - 1) < need ? j - 1 : end;
}

int stop_feed(stop_matcher *m, const char *text, size_t len, const char **out, size_t *out_len) {
  *out = emit_buf(m, 1);
  *out_len = 0;
  if (m->stopped) return 1;
  if (m->buf_n + len + 1 > m->buf_cap) {
    m->buf_cap = (m->buf_n + len) * 2 + 16;
    m->buf = xrealloc(m->buf, m->buf_cap);
  }
  if (len) memcpy(m->buf + m->buf_n, text, len);
  size_t n = m->buf_n += len;
  if (n == 0) return 0;
  /* earliest complete match (the held text had none on its own) */
  size_t pos = n;
  for (int k = 0; k < m->n_str; k++) {
    const char *hit = memmem(m->buf, pos + m->len[k] - 1 < n ? pos + m->len[k] - 1 : n, m->str[k], m->len[k]);
    if (hit && (size_t)(hit - m->buf) < pos) {
      pos = (size_t)(hit - m->buf);
      m->which = k;
    }
  }
  if (pos < n) {
    m->stopped = 1;
    *out = memcpy(emit_buf(m, pos + 1), m->buf, pos);
    *out_len = pos;
    m->buf_n = 0;
    return 1;
  }
  size_t end = utf8_safe_end(m->buf, n - partial_suffix(m, m->buf, n));
  *out = memcpy(emit_buf(m, end + 1), m->buf, end);
  *out_len = end;
  memmove(m->buf, m->buf + end, n - end);
  m->buf_n = n - end;
  return 0;
}

void stop_flush(stop_matcher *m, const char **out, size_t *out_len) {
  size_t n = m->stopped ? 0 : m->buf_n;
  *out = emit_buf(m, n + 1);
  if (n) memcpy(m->out, m->buf, n);
  *out_len = n;
  m->buf_n = 0;
}

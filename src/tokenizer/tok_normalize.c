/* Tokenizer normalizers: Unicode NF(K)C/D via utf8proc, and Lowercase.
 * Input is always valid UTF-8 (invalid bytes are split off before). */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/err.h"
#include "core/util.h"
#include "tokenizer/tok_internal.h"

static int all_ascii(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] >= 0x80) return 0;
  return 1;
}

static char *lowercase(const char *s, size_t n, size_t *out_len) {
  char *o = xmalloc(n * 2 + 4); /* a lowered code point is at most 1 byte longer here */
  size_t k = 0, i = 0;
  while (i < n) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
    if (l <= 0) { o[k++] = s[i++]; continue; }
    k += (size_t)utf8proc_encode_char(utf8proc_tolower(cp), (utf8proc_uint8_t *)o + k);
    i += (size_t)l;
  }
  *out_len = k;
  return o;
}

char *tok_normalize(const tok_normalizer *nz, const char *s, size_t n, size_t *out_len) {
  char *cur = xmalloc(n + 1);
  memcpy(cur, s, n);
  size_t len = n;
  for (int i = 0; i < nz->n; i++) {
    int k = nz->kinds[i];
    char *next = NULL;
    size_t nlen = 0;
    if (k == NORM_LOWERCASE) {
      next = lowercase(cur, len, &nlen);
    } else {
      if (all_ascii(cur, len)) continue; /* ASCII is invariant under every NF */
      utf8proc_option_t opt = UTF8PROC_STABLE;
      opt |= (k == NORM_NFC || k == NORM_NFKC) ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
      if (k == NORM_NFKC || k == NORM_NFKD) opt |= UTF8PROC_COMPAT;
      utf8proc_uint8_t *dst = NULL;
      utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)cur, (utf8proc_ssize_t)len, &dst, opt);
      if (r < 0) {
        free(cur);
        glm53_err("normalizer: %s", utf8proc_errmsg(r));
        return NULL;
      }
      next = (char *)dst;
      nlen = (size_t)r;
    }
    free(cur);
    cur = next;
    len = nlen;
  }
  *out_len = len;
  return cur;
}

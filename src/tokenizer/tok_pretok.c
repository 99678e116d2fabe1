/* Pre-tokenizers: split a normalized piece of text into the words that BPE
 * sees. Split uses PCRE2 (UTF + UCP) with `\s`/`\S` rewritten to Unicode
 * White_Space, the meaning they have in the Oniguruma regexes of Hugging
 * Face tokenizers (PCRE2's own \s differs on U+0085 and U+180E). */
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "tokenizer/tok_internal.h"

void spans_push(tok_spans *s, const char *p, size_t len) {
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 64;
    s->v = xrealloc(s->v, s->cap * sizeof *s->v);
  }
  s->v[s->n].p = p;
  s->v[s->n].len = len;
  s->n++;
}

/* Copy the pattern, turning \s / \S into White_Space properties (also inside
 * classes, where \p{..} / \P{..} are allowed too). */
static char *rewrite_ws(const char *p, size_t n, size_t *out_n) {
  char *o = xmalloc(n * 8 + 1);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] == '\\' && i + 1 < n) {
      char c = p[i + 1];
      if (c == 's' || c == 'S') {
        const char *r = c == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
        memcpy(o + k, r, strlen(r));
        k += strlen(r);
      } else {
        o[k++] = p[i];
        o[k++] = c;
      }
      i++;
      continue;
    }
    o[k++] = p[i];
  }
  o[k] = 0;
  *out_n = k;
  return o;
}

pcre2_code *pretok_compile(const char *pattern, size_t len, int literal) {
  int errcode;
  PCRE2_SIZE erroff;
  size_t n = len;
  char *pat = literal ? NULL : rewrite_ws(pattern, len, &n);
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK | (literal ? PCRE2_LITERAL : 0);
  pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pattern : pat), n, opts, &errcode, &erroff, NULL);
  free(pat);
  if (!re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(errcode, msg, sizeof msg);
    glm53_err("tokenizer regex /%.*s/: %s at offset %zu", (int)(len > 200 ? 200 : len), pattern,
              (const char *)msg, (size_t)erroff);
    return NULL;
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: falls back to the interpreter */
  return re;
}

/* Offset just after the code point at s[i] (input is valid UTF-8). */
static size_t next_cp(const char *s, size_t n, size_t i) {
  i++;
  while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
  return i;
}

/* Split one span by the regex, following the split behaviour. Removed +
 * invert keeps only the matches; Isolated keeps matches and gaps. */
static int split_regex(const tok_pretok_step *st, const char *s, size_t n, tok_spans *out,
                       pcre2_match_data *md, pcre2_match_context *mc) {
  size_t pos = 0, start = 0; /* start: first byte not yet emitted */
  int merged = !st->invert && (st->behavior == SPLIT_MERGED_PREV || st->behavior == SPLIT_MERGED_NEXT);
  int keep_match = st->invert ? 1 : st->behavior != SPLIT_REMOVED;
  int keep_gap = st->invert ? st->behavior != SPLIT_REMOVED : 1;
  while (pos <= n) {
    int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, mc);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* rare (huge inputs): use the interpreter */
      rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, mc);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return glm53_err("tokenizer regex match: %s", (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    size_t ms = ov[0], me = ov[1];
    if (me == ms) { /* empty match: no split, move on one code point */
      if (ms >= n) break;
      pos = next_cp(s, n, ms);
      continue;
    }
    if (merged && st->behavior == SPLIT_MERGED_PREV) {
      spans_push(out, s + start, me - start); /* the delimiter joins the piece before it */
      start = me;
    } else if (merged) {
      if (start < ms) spans_push(out, s + start, ms - start); /* ... or the piece after it */
      start = ms;
    } else {
      if (start < ms && keep_gap) spans_push(out, s + start, ms - start);
      if (keep_match) spans_push(out, s + ms, me - ms);
      start = me;
    }
    pos = me;
  }
  if (start < n && (merged || keep_gap)) spans_push(out, s + start, n - start);
  return 0;
}

static void split_digits(int individual, const char *s, size_t n, tok_spans *out) {
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    int dig = s[i] >= '0' && s[i] <= '9';
    if (dig && individual) j = i + 1;
    else
      while (j < n && ((s[j] >= '0' && s[j] <= '9') == dig)) j++;
    spans_push(out, s + i, j - i);
    i = j;
  }
}

int pretok_run(const tok_pretok_step *steps, int n_steps, const char *text, size_t len,
               tok_spans *out, tok_owned *owned, pcre2_match_data *md, pcre2_match_context *mc) {
  tok_spans cur = {0}, nxt = {0};
  spans_push(&cur, text, len);
  int rc = 0;
  for (int k = 0; k < n_steps && rc == 0; k++) {
    const tok_pretok_step *st = &steps[k];
    nxt.n = 0;
    for (size_t i = 0; i < cur.n && rc == 0; i++) {
      const char *s = cur.v[i].p;
      size_t n = cur.v[i].len;
      switch (st->type) {
      case PT_SPLIT: rc = split_regex(st, s, n, &nxt, md, mc); break;
      case PT_DIGITS: split_digits(st->individual_digits, s, n, &nxt); break;
      case PT_BYTELEVEL:
        if (st->add_prefix_space && (n == 0 || s[0] != ' ')) {
          char *b = xmalloc(n + 1);
          b[0] = ' ';
          memcpy(b + 1, s, n);
          if (owned->n == owned->cap) {
            owned->cap = owned->cap ? owned->cap * 2 : 8;
            owned->v = xrealloc(owned->v, owned->cap * sizeof *owned->v);
          }
          owned->v[owned->n++] = b;
          s = b; n++;
        }
        if (st->re) {
          tok_pretok_step iso = *st;
          iso.behavior = SPLIT_ISOLATED; iso.invert = 0;
          rc = split_regex(&iso, s, n, &nxt, md, mc);
        } else {
          spans_push(&nxt, s, n);
        }
        break;
      }
    }
    tok_spans t = cur; cur = nxt; nxt = t;
  }
  for (size_t i = 0; i < cur.n && rc == 0; i++)
    if (cur.v[i].len) spans_push(out, cur.v[i].p, cur.v[i].len);
  free(cur.v);
  free(nxt.v);
  return rc;
}

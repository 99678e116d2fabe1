/* Stop matcher: strings split across feeds and mid-token, overlapping
 * prefixes, several strings, UTF-8, stop ids, max tokens, bad configs, and a
 * randomised check against a strstr reference. */
#include <string.h>

#include "core/err.h"
#include "runtime/stop.h"
#include "test_util.h"

static stop_matcher *mk(const char *const *s, int n) {
  stop_config c = {s, n, NULL, 0, 0};
  return stop_new(&c);
}

/* Feeds the pieces in order; collects emitted text in acc (flushes at end).
 * Returns 1 if a stop string matched. */
static int run(stop_matcher *m, const char *const *pieces, int np, char *acc, size_t cap) {
  size_t n = 0;
  int hit = 0;
  const char *o;
  size_t ol;
  for (int i = 0; i < np && !hit; i++) {
    hit = stop_feed(m, pieces[i], strlen(pieces[i]), &o, &ol);
    if (n + ol < cap) memcpy(acc + n, o, ol), n += ol;
  }
  stop_flush(m, &o, &ol);
  if (n + ol < cap) memcpy(acc + n, o, ol), n += ol;
  acc[n] = 0;
  return hit;
}

/* Feeds one string byte by byte. */
static int run_bytes(stop_matcher *m, const char *text, char *acc, size_t cap) {
  char b[64][2];
  const char *p[64];
  int n = (int)strlen(text);
  for (int i = 0; i < n; i++) b[i][0] = text[i], b[i][1] = 0, p[i] = b[i];
  return run(m, p, n, acc, cap);
}

static void test_overlap(void) {
  const char *s[] = {"abab"};
  char acc[128];
  stop_matcher *m = mk(s, 1);
  const char *one[] = {"abaabab"};
  CHECK(run(m, one, 1, acc, sizeof acc) == 1);
  CHECK(strcmp(acc, "aba") == 0, "got '%s'", acc);
  CHECK(stop_which(m) == 0);
  stop_free(m);
  m = mk(s, 1);
  CHECK(run_bytes(m, "abaabab", acc, sizeof acc) == 1);
  CHECK(strcmp(acc, "aba") == 0, "got '%s'", acc);
  stop_free(m);
  m = mk(s, 1);
  const char *pieces[] = {"ab", "aab", "ab tail"};
  CHECK(run(m, pieces, 3, acc, sizeof acc) == 1);
  CHECK(strcmp(acc, "aba") == 0, "got '%s'", acc);
  stop_free(m);
}

static void test_split_and_hold(void) {
  const char *s[] = {"</stop>"};
  char acc[128];
  stop_matcher *m = mk(s, 1);
  const char *o;
  size_t ol;
  /* the partial "</st" is held back, the rest shown at once */
  CHECK(stop_feed(m, "hello </st", 10, &o, &ol) == 0);
  CHECK(ol == 6 && memcmp(o, "hello ", 6) == 0, "emitted %zu", ol);
  CHECK(stop_feed(m, "op> world", 9, &o, &ol) == 1);
  CHECK(ol == 0);
  /* after a match: nothing more */
  CHECK(stop_feed(m, "more", 4, &o, &ol) == 1 && ol == 0);
  stop_flush(m, &o, &ol);
  CHECK(ol == 0);
  stop_free(m);
  /* a false start is released once it can no longer match */
  m = mk(s, 1);
  CHECK(stop_feed(m, "a </s", 5, &o, &ol) == 0 && ol == 2);
  CHECK(stop_feed(m, "x", 1, &o, &ol) == 0 && ol == 4 && memcmp(o, "</sx", 4) == 0);
  stop_free(m);
  /* mid-token: the stop string ends inside a token, the token's tail is dropped */
  const char *s2[] = {"STOP"};
  m = mk(s2, 1);
  const char *pieces[] = {"xx ST", "OPyy", "zz"};
  CHECK(run(m, pieces, 3, acc, sizeof acc) == 1);
  CHECK(strcmp(acc, "xx ") == 0, "got '%s'", acc);
  stop_free(m);
  /* no match: flush releases the held partial */
  m = mk(s2, 1);
  const char *p3[] = {"abc S", "TO"};
  CHECK(run(m, p3, 2, acc, sizeof acc) == 0);
  CHECK(strcmp(acc, "abc STO") == 0, "got '%s'", acc);
  stop_free(m);
  /* empty feeds are fine */
  m = mk(s2, 1);
  CHECK(stop_feed(m, NULL, 0, &o, &ol) == 0 && ol == 0);
  stop_flush(m, &o, &ol);
  CHECK(ol == 0);
  stop_free(m);
}

static void test_multiple(void) {
  const char *s[] = {"world", "lo w", "xyz"};
  char acc[128];
  stop_matcher *m = mk(s, 3);
  CHECK(run_bytes(m, "hello world", acc, sizeof acc) == 1);
  CHECK(strcmp(acc, "hel") == 0, "got '%s'", acc);
  CHECK(stop_which(m) == 1);
  stop_free(m);
  /* the one that starts first wins even if another completes first in the same feed */
  const char *s2[] = {"cd", "abcdef"};
  m = mk(s2, 2);
  const char *p[] = {"xxabcdefg"};
  CHECK(run(m, p, 1, acc, sizeof acc) == 1);
  CHECK(strcmp(acc, "xx") == 0 && stop_which(m) == 1, "got '%s' which %d", acc, stop_which(m));
  stop_free(m);
  /* no strings at all: pass-through */
  m = mk(NULL, 0);
  const char *p2[] = {"abc", "def"};
  CHECK(run(m, p2, 2, acc, sizeof acc) == 0 && strcmp(acc, "abcdef") == 0);
  stop_free(m);
}

static void test_utf8(void) {
  const char *s[] = {"\xe5\x81\x9c\xe6\xad\xa2"}; /* "停止" */
  char acc[128];
  stop_matcher *m = mk(s, 1);
  CHECK(run_bytes(m, "ok\xe5\xa5\xbd\xe5\x81\x9c\xe6\xad\xa2!", acc, sizeof acc) == 1);
  CHECK(strcmp(acc, "ok\xe5\xa5\xbd") == 0, "got '%s'", acc);
  stop_free(m);
  /* incomplete UTF-8 at the end of a feed is held back */
  m = mk(NULL, 0);
  const char *o;
  size_t ol;
  CHECK(stop_feed(m, "a\xe4\xbd", 3, &o, &ol) == 0 && ol == 1 && o[0] == 'a');
  CHECK(stop_feed(m, "\xa0" "b", 2, &o, &ol) == 0 && ol == 4 && memcmp(o, "\xe4\xbd\xa0" "b", 4) == 0);
  CHECK(stop_feed(m, "\xf0\x9f", 2, &o, &ol) == 0 && ol == 0);
  stop_flush(m, &o, &ol); /* released at the end even if incomplete */
  CHECK(ol == 2);
  stop_free(m);
}

static void test_tokens(void) {
  int32_t ids[] = {154827, 154820, 154829};
  stop_config c = {NULL, 0, ids, 3, 3};
  stop_matcher *m = stop_new(&c);
  CHECK(m != NULL);
  CHECK(stop_token(m, 5) == STOP_NONE);
  CHECK(stop_token(m, 154820) == STOP_TOKEN);
  CHECK(stop_token(m, 154829) == STOP_TOKEN);
  CHECK(stop_token(m, 6) == STOP_NONE);
  CHECK(stop_token(m, 7) == STOP_LENGTH);
  CHECK(stop_count(m) == 3);
  stop_free(m);
  stop_config c2 = {NULL, 0, NULL, 0, 0}; /* unlimited */
  m = stop_new(&c2);
  for (int i = 0; i < 1000; i++) CHECK(stop_token(m, i) == STOP_NONE);
  stop_free(m);
}

static void test_invalid(void) {
  const char *empty[] = {""};
  glm53_err_clear();
  CHECK(mk(empty, 1) == NULL);
  CHECK(strstr(glm53_last_error(), "stop string 0") != NULL, "%s", glm53_last_error());
  const char *many[STOP_MAX_STRINGS + 1];
  for (int i = 0; i <= STOP_MAX_STRINGS; i++) many[i] = "x";
  CHECK(mk(many, STOP_MAX_STRINGS + 1) == NULL);
  CHECK(strstr(glm53_last_error(), "stop strings") != NULL, "%s", glm53_last_error());
  int32_t bad[] = {1, -3};
  stop_config c = {NULL, 0, bad, 2, 0};
  CHECK(stop_new(&c) == NULL);
  CHECK(strstr(glm53_last_error(), "negative") != NULL, "%s", glm53_last_error());
  CHECK(stop_new(NULL) == NULL);
}

/* Random texts over {a,b,c} with random chunking vs "prefix before the
 * earliest occurrence" computed with strstr. */
static void test_random(void) {
  const char *s[] = {"abab", "bba", "cab"};
  trng r = {0x5eed};
  int bad = 0;
  for (int it = 0; it < 3000; it++) {
    char text[40];
    int n = 1 + (int)(trng_u64(&r) % 39);
    for (int i = 0; i < n; i++) text[i] = "abc"[trng_u64(&r) % 3];
    text[n] = 0;
    size_t want = (size_t)n;
    for (int k = 0; k < 3; k++) {
      const char *h = strstr(text, s[k]);
      if (h && (size_t)(h - text) < want) want = (size_t)(h - text);
    }
    stop_matcher *m = mk(s, 3);
    char acc[64];
    size_t got = 0;
    int hit = 0, pos = 0;
    const char *o;
    size_t ol;
    while (pos < n && !hit) {
      int len = 1 + (int)(trng_u64(&r) % 5);
      if (pos + len > n) len = n - pos;
      hit = stop_feed(m, text + pos, (size_t)len, &o, &ol);
      memcpy(acc + got, o, ol);
      got += ol;
      pos += len;
    }
    stop_flush(m, &o, &ol);
    memcpy(acc + got, o, ol);
    got += ol;
    if (hit != (want < (size_t)n) || got != want || memcmp(acc, text, got) != 0) bad++;
    stop_free(m);
  }
  CHECK(bad == 0, "%d of 3000 random cases wrong", bad);
}

int main(void) {
  test_overlap();
  test_split_and_hold();
  test_multiple();
  test_utf8();
  test_tokens();
  test_invalid();
  test_random();
  TEST_DONE();
}

/* Tokenizer unit tests on small hand-made tokenizer.json fixtures
 * (tests/data/tokenizer/fixtures): merge ranks, added tokens (special or not,
 * lstrip/rstrip, longest match), NFC + Digits + ignore_merges + array merges,
 * lossless round trip of random (also invalid UTF-8) bytes, the streaming
 * decoder holding back partial UTF-8, and error paths. */
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

#define FIX "tests/data/tokenizer/fixtures/"

static int enc_eq(const glm53_tokenizer *t, const char *s, int ps, const int32_t *want, size_t nw) {
  int32_t *ids;
  size_t n;
  if (tok_encode(t, s, strlen(s), ps, &ids, &n)) return 0;
  int ok = n == nw && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
  if (!ok) {
    fprintf(stderr, "  encode(\"%s\") =", s);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
  }
  free(ids);
  return ok;
}
#define ENC(t, s, ps, ...)                                                              \
  do {                                                                                  \
    const int32_t w_[] = {__VA_ARGS__};                                                 \
    CHECK(enc_eq(t, s, ps, w_, sizeof w_ / sizeof w_[0]), "encode \"%s\" ps=%d", s, ps); \
  } while (0)

static void basics(const glm53_tokenizer *t) {
  CHECK(tok_vocab_size(t) == 305, "%d", tok_vocab_size(t));
  CHECK(tok_token_id(t, "hello") == 259 && tok_token_id(t, "Ġworld") == 264 && tok_token_id(t, "nope") == -1);
  CHECK(tok_token_id(t, "<|special|>") == 300);
  CHECK(tok_token_str(t, 264) && !strcmp(tok_token_str(t, 264), "Ġworld"));
  CHECK(tok_token_str(t, 299) == NULL && tok_token_str(t, -1) == NULL && tok_token_str(t, 99999) == NULL);
  CHECK(tok_is_special(t, 300) && !tok_is_special(t, 301) && !tok_is_special(t, 259) && !tok_is_special(t, -5));
  ENC(t, "hello world", 1, 259, 264);
  ENC(t, "abc", 1, 'a', 265); /* "b c" (rank 9) beats "a b" (rank 10) */
  ENC(t, "ab", 1, 266);
  ENC(t, "hellohello", 1, 259, 259);
  ENC(t, "12345", 1, 270, '3', '4', '5'); /* \p{N}{1,3}: "123" "45" */
  /* added tokens */
  ENC(t, "a<|special|>b", 1, 'a', 300, 'b');
  ENC(t, "a<|special|>b", 0, 'a', 304, 'e', 'c', 'i', 'a', 'l', '|', '>', 'b'); /* special off: "<|sp" still matches */
  ENC(t, "x<|plain|>y", 0, 'x', 301, 'y');
  ENC(t, "x  <L> y", 1, 'x', 302, 32, 'y');  /* lstrip eats the spaces before */
  ENC(t, "x <R>  \ty", 1, 'x', 32, 303, 'y'); /* rstrip eats the white space after */
  int32_t *ids;
  size_t n;
  CHECK(tok_encode(t, "", 0, 1, &ids, &n) == 0 && n == 0);
  free(ids);
}

static void variant(void) {
  glm53_tokenizer *t = tok_load(FIX "bpe_nfc_ignore_merges.json");
  CHECK(t != NULL, "%s", glm53_last_error());
  if (!t) return;
  ENC(t, "xyz", 1, 271);                      /* ignore_merges: whole word is a token */
  ENC(t, "123", 1, '1', '2', '3');            /* individual digits beat the "1 2" merge */
  ENC(t, "e\xcc\x81", 1, 0xC3, 0xA9);         /* NFC: e + U+0301 -> U+00E9 */
  ENC(t, "hello world", 1, 259, 264);         /* array-form merges */
  tok_free(t);
  glm53_tokenizer *u = tok_load(FIX "bpe_small.json");
  ENC(u, "xyz", 1, 'x', 'y', 'z');
  tok_free(u);
}

static void roundtrip_random(const glm53_tokenizer *t) {
  trng r = {0x1234567};
  int bad = 0;
  char buf[200];
  for (int it = 0; it < 2000; it++) {
    size_t n = trng_u64(&r) % sizeof buf;
    for (size_t i = 0; i < n; i++) {
      uint64_t k = trng_u64(&r) % 10;
      /* mostly text-like bytes, some arbitrary (invalid UTF-8) bytes */
      buf[i] = k < 6 ? "ab c\n\t1<|'\xe4\xb8\xad"[trng_u64(&r) % 14] : (char)(trng_u64(&r) & 0xFF);
    }
    int32_t *ids;
    size_t m, dl;
    if (tok_encode(t, buf, n, 0, &ids, &m)) { bad++; continue; }
    char *d = tok_decode(t, ids, m, 0, &dl);
    if (!d || dl != n || memcmp(d, buf, n)) bad++;
    free(d);
    free(ids);
  }
  CHECK(bad == 0, "%d of 2000 random byte strings did not round-trip", bad);
}

static void streaming(const glm53_tokenizer *t) {
  /* 中 = E4 B8 | AD (token 267 holds the first two bytes); 😀 = F0 9F 98 | 80 */
  tok_stream *s = tok_stream_new(t, 1);
  char out[64];
  CHECK(tok_stream_push(s, 'a', out, sizeof out) == 1 && out[0] == 'a');
  CHECK(tok_stream_push(s, 267, out, sizeof out) == 0, "partial 中 must be held");
  CHECK(tok_stream_push(s, 300, out, sizeof out) == 0, "special skipped, still holding");
  int k = tok_stream_push(s, 0xAD, out, sizeof out);
  CHECK(k == 3 && !memcmp(out, "\xe4\xb8\xad", 3), "got %d", k);
  CHECK(tok_stream_push(s, 269, out, sizeof out) == 0);
  k = tok_stream_push(s, 0x80, out, sizeof out);
  CHECK(k == 4 && !memcmp(out, "\xf0\x9f\x98\x80", 4));
  CHECK(tok_stream_push(s, 267, out, sizeof out) == 0);
  k = tok_stream_push(s, 'z', out, sizeof out); /* broken sequence: released, not held forever */
  CHECK(k == 3 && !memcmp(out, "\xe4\xb8z", 3), "got %d", k);
  CHECK(tok_stream_push(s, 268, out, sizeof out) == 0);
  k = tok_stream_flush(s, out, sizeof out);
  CHECK(k == 2 && !memcmp(out, "\xf0\x9f", 2));
  CHECK(tok_stream_push(s, 259, out, 2) == 2 && !memcmp(out, "he", 2), "small buffer: rest stays pending");
  CHECK(tok_stream_flush(s, out, sizeof out) == 3 && !memcmp(out, "llo", 3));
  CHECK(tok_stream_push(s, 5000, out, sizeof out) == -1 && strstr(glm53_last_error(), "5000"));
  tok_stream_free(s);
  s = tok_stream_new(t, 0);
  k = tok_stream_push(s, 300, out, sizeof out);
  CHECK(k == 11 && !memcmp(out, "<|special|>", 11));
  tok_stream_free(s);
  /* decode */
  int32_t ids[] = {259, 300, 264};
  size_t dl;
  char *d = tok_decode(t, ids, 3, 0, &dl);
  CHECK(d && !strcmp(d, "hello<|special|> world") && dl == 22);
  free(d);
  d = tok_decode(t, ids, 3, 1, &dl);
  CHECK(d && !strcmp(d, "hello world"));
  free(d);
  int32_t bad[] = {1, -3};
  CHECK(tok_decode(t, bad, 2, 0, &dl) == NULL);
}

static void errors(void) {
  CHECK(tok_load("tests/data/tokenizer/fixtures/missing.json") == NULL && strstr(glm53_last_error(), "missing.json"));
  CHECK(tok_load_json("{", 1) == NULL);
  const char *bad_merge = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]},"
                          "\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}";
  CHECK(tok_load_json(bad_merge, strlen(bad_merge)) == NULL && strstr(glm53_last_error(), "merge"));
  const char *bad_re = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":"
                       "{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
                       "\"behavior\":\"Isolated\"},{\"type\":\"ByteLevel\"}]}}";
  CHECK(tok_load_json(bad_re, strlen(bad_re)) == NULL && strstr(glm53_last_error(), "regex"));
  const char *wp = "{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}";
  CHECK(tok_load_json(wp, strlen(wp)) == NULL);
}

int main(void) {
  glm53_tokenizer *t = tok_load(FIX "bpe_small.json");
  CHECK(t != NULL, "%s", glm53_last_error());
  if (!t) TEST_DONE();
  basics(t);
  variant();
  roundtrip_random(t);
  streaming(t);
  errors();
  tok_free(t);
  TEST_DONE();
}

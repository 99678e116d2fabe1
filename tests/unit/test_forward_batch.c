/* glm53_forward_batch on the cpu backend, both ways (the default loop over
 * glm53_forward, and with GLM53_CPU_BATCH=1 one forward over the n tokens,
 * src/model/forward.c cpu_forward_batch), on the random fixture model:
 *  - n sessions at different positions (and context sizes) stepped together
 *    for several tokens give bitwise the logits of stepping each one alone;
 *  - argument errors leave every session unchanged: empty batch, NULL
 *    arguments, a session given twice, a full context, a token id outside
 *    the vocabulary, models of different vocabulary sizes;
 *  - sessions of two different models (same vocabulary) in one call are
 *    each stepped on their own model;
 *  - an injected fault (GLM53_FAULT) fails the call with an error; aimed at
 *    row 1 of 3 (it counts one forward per row) it steps row 0, fails row 1
 *    (glm53_forward_batch_failed_row() == 1) and leaves row 2 untried; a
 *    failed single-session call reports row 0.
 * Runs in CPU CI (also under ASan). */
#include "glm53.h"
#include "model_fixture.h"
#include <stdlib.h>

/* prefill session i of the pair with its own prompt length */
static void prefill(glm53_session *a, glm53_session *b, const int32_t *tok, int len) {
  if (len <= 0) return;
  CHECK(glm53_forward(a, tok, len, NULL, 0) == 0, "%s", glm53_last_error());
  CHECK(glm53_forward(b, tok, len, NULL, 0) == 0, "%s", glm53_last_error());
}

static void check_equal_to_single(int topk, int kpool, int shared, uint64_t seed) {
  glm53_config c;
  fx_config(&c, topk, kpool, shared);
  glm53_model *m = fx_model(&c, seed);
  const int n = 5, steps = 4, V = c.vocab_size;
  glm53_session *bs[5], *ss[5];
  int32_t prompt[64];
  trng r = {seed + 3};
  for (int i = 0; i < 64; i++) prompt[i] = (int32_t)(trng_u64(&r) % V);
  for (int i = 0; i < n; i++) {
    int len = (i * 11) % 37, ctx = len + steps + 3 * i;
    bs[i] = glm53_session_new(m, ctx);
    ss[i] = glm53_session_new(m, ctx);
    prefill(bs[i], ss[i], prompt + i, len);
  }
  float *lb = xmalloc((size_t)n * V * 4), *ls = xmalloc((size_t)n * V * 4);
  int32_t tok[5];
  for (int st = 0; st < steps; st++) {
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(trng_u64(&r) % V);
    CHECK(glm53_forward_batch(bs, tok, n, lb) == 0, "%s", glm53_last_error());
    for (int i = 0; i < n; i++) CHECK(glm53_forward(ss[i], tok + i, 1, ls + (size_t)i * V, 0) == 0, "%s", glm53_last_error());
    CHECK(memcmp(lb, ls, (size_t)n * V * 4) == 0, "topk %d step %d: batch logits differ from single steps", topk, st);
    for (int i = 0; i < n; i++) CHECK(glm53_session_pos(bs[i]) == glm53_session_pos(ss[i]), "row %d position", i);
  }
  for (int i = 0; i < n; i++) { glm53_session_free(bs[i]); glm53_session_free(ss[i]); }
  free(lb); free(ls);
  glm53_model_free(m);
}

static void check_errors(void) {
  glm53_config c;
  fx_config(&c, 8, 4, 1);
  glm53_model *m = fx_model(&c, 21);
  const int V = c.vocab_size;
  glm53_session *a = glm53_session_new(m, 8), *b = glm53_session_new(m, 3);
  int32_t pre[3] = {1, 2, 3};
  CHECK(glm53_forward(a, pre, 2, NULL, 0) == 0, "%s", glm53_last_error());
  CHECK(glm53_forward(b, pre, 3, NULL, 0) == 0, "%s", glm53_last_error()); /* b is full */
  float *lg = xmalloc((size_t)2 * V * 4);
  glm53_session *dup[2] = {a, a}, *full[2] = {a, b}, *one[1] = {a}, *nul[2] = {a, NULL};
  int32_t tok[2] = {5, 6}, bad[2] = {5, V};
  CHECK(glm53_forward_batch(one, tok, 0, lg) == -1, "empty batch accepted");
  CHECK(glm53_forward_batch(NULL, tok, 1, lg) == -1, "NULL sessions accepted");
  CHECK(glm53_forward_batch(one, NULL, 1, lg) == -1, "NULL tokens accepted");
  CHECK(glm53_forward_batch(one, tok, 1, NULL) == -1, "NULL logits accepted");
  CHECK(glm53_forward_batch(nul, tok, 2, lg) == -1, "NULL session accepted");
  CHECK(glm53_forward_batch(dup, tok, 2, lg) == -1, "duplicate session accepted");
  CHECK(strstr(glm53_last_error(), "twice") != NULL, "%s", glm53_last_error());
  CHECK(glm53_forward_batch(full, tok, 2, lg) == -1, "full context accepted");
  CHECK(strstr(glm53_last_error(), "full") != NULL, "%s", glm53_last_error());
  glm53_session *c2 = glm53_session_new(m, 8);
  glm53_session *two[2] = {a, c2};
  CHECK(glm53_forward_batch(two, bad, 2, lg) == -1, "token id outside the vocabulary accepted");
  CHECK(strstr(glm53_last_error(), "vocabulary") != NULL, "%s", glm53_last_error());
  int32_t neg[2] = {-1, 3};
  CHECK(glm53_forward_batch(two, neg, 2, lg) == -1, "negative token id accepted");
  /* a model with another vocabulary size in the same call */
  glm53_config c3 = c;
  c3.vocab_size = V + 10;
  glm53_model *m3 = fx_model(&c3, 22);
  glm53_session *d = glm53_session_new(m3, 8);
  glm53_session *mixed[2] = {a, d};
  CHECK(glm53_forward_batch(mixed, tok, 2, lg) == -1, "models of different vocabulary sizes accepted");
  CHECK(strstr(glm53_last_error(), "vocabulary") != NULL, "%s", glm53_last_error());
  /* nothing moved */
  CHECK(glm53_session_pos(a) == 2 && glm53_session_pos(b) == 3 && glm53_session_pos(c2) == 0 && glm53_session_pos(d) == 0,
        "a refused batch moved a session");
  /* an injected fault fails the call (the single row's forward here) and
   * leaves the session where it was */
  setenv("GLM53_FAULT", "forward:1", 1);
  CHECK(glm53_forward_batch(one, tok, 1, lg) == -1, "injected fault not reported");
  unsetenv("GLM53_FAULT");
  CHECK(strstr(glm53_last_error(), "injected") != NULL, "%s", glm53_last_error());
  CHECK(glm53_forward_batch_failed_row() == 0, "failed row %d, expected 0", glm53_forward_batch_failed_row());
  CHECK(glm53_session_pos(a) == 2, "fault moved the session");
  CHECK(glm53_forward_batch(two, tok, 2, lg) == 0, "%s", glm53_last_error());
  CHECK(glm53_session_pos(a) == 3 && glm53_session_pos(c2) == 1, "positions after a batch step");
  { /* aimed at row 1 of a batch of 3 */
    glm53_session *e = glm53_session_new(m, 8);
    glm53_session *three[3] = {a, c2, e};
    int32_t t3[3] = {7, 8, 9};
    float *l3 = xmalloc((size_t)3 * V * 4);
    setenv("GLM53_FAULT", "forward:3", 1); /* the count goes on from the fault above: row 0 is call 2, row 1 call 3 */
    CHECK(glm53_forward_batch(three, t3, 3, l3) == -1, "injected fault at row 1 not reported");
    unsetenv("GLM53_FAULT");
    CHECK(glm53_forward_batch_failed_row() == 1, "failed row %d, expected 1", glm53_forward_batch_failed_row());
    CHECK(glm53_session_pos(a) == 4 && glm53_session_pos(c2) == 1 && glm53_session_pos(e) == 0,
          "rows after a fault at row 1: positions %d %d %d, expected 4 1 0", glm53_session_pos(a), glm53_session_pos(c2),
          glm53_session_pos(e));
    glm53_session_free(e);
    free(l3);
  }
  glm53_session_free(a); glm53_session_free(b); glm53_session_free(c2); glm53_session_free(d);
  glm53_model_free(m3);
  glm53_model_free(m);
  free(lg);
}

/* two models (same vocabulary, different weights and configs) in one call */
static void check_two_models(void) {
  glm53_config c1, c2;
  fx_config(&c1, 8, 4, 1);
  fx_config(&c2, 64, 2, 0);
  glm53_model *m1 = fx_model(&c1, 31), *m2 = fx_model(&c2, 32);
  const int V = c1.vocab_size, n = 4;
  glm53_session *bs[4], *ss[4];
  for (int i = 0; i < n; i++) {
    glm53_model *m = i % 2 ? m2 : m1;
    bs[i] = glm53_session_new(m, 32);
    ss[i] = glm53_session_new(m, 32);
    int32_t pre[6] = {3, 1, 4, 1, 5, (int32_t)i};
    prefill(bs[i], ss[i], pre, 2 + i);
  }
  float *lb = xmalloc((size_t)n * V * 4), *ls = xmalloc((size_t)n * V * 4);
  for (int st = 0; st < 3; st++) {
    int32_t tok[4] = {7, 8 + st, 9, 10};
    CHECK(glm53_forward_batch(bs, tok, n, lb) == 0, "%s", glm53_last_error());
    for (int i = 0; i < n; i++) CHECK(glm53_forward(ss[i], tok + i, 1, ls + (size_t)i * V, 0) == 0, "%s", glm53_last_error());
    CHECK(memcmp(lb, ls, (size_t)n * V * 4) == 0, "two models, step %d: batch differs from single steps", st);
  }
  for (int i = 0; i < n; i++) { glm53_session_free(bs[i]); glm53_session_free(ss[i]); }
  free(lb); free(ls);
  glm53_model_free(m1); glm53_model_free(m2);
}

int main(void) {
  for (int batched = 0; batched < 2; batched++) {
    if (batched) setenv("GLM53_CPU_BATCH", "1", 1);
    check_equal_to_single(64, 4, 0, 1); /* dense indexer regime */
    check_equal_to_single(8, 4, 1, 2);  /* sparse, shared indexer layer */
    check_equal_to_single(4, 1, 0, 3);  /* kpool 1 */
    check_two_models();
  }
  check_errors(); /* with the batched forward: a fault aimed at one row of a real batch */
  unsetenv("GLM53_CPU_BATCH");
  TEST_DONE();
}

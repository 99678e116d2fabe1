/* Tokenizer conformance: our ids must equal Hugging Face's (the JS
 * @huggingface/tokenizers run by tests/node/tok_reference.mjs) for every text
 * and tokenizer in the reference file $GLM53_TOK_REF, with zero mismatches,
 * and decoding must give the text back. Driven by
 * tests/integration/test_tokenizer_conformance.sh, which makes the file;
 * without it this prints SKIP and exits 0. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

/* JSON array of ints -> malloc'd int32 array (walks the list once). */
static int32_t *json_ids(const cJSON *arr, size_t *n) {
  int32_t *v = xmalloc(sizeof(int32_t) * ((size_t)cJSON_GetArraySize(arr) + 1));
  size_t k = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, arr) v[k++] = (int32_t)e->valueint;
  *n = k;
  return v;
}

static void show_diff(const char *name, int ti, const int32_t *a, size_t na, const int32_t *r, size_t nr) {
  size_t i = 0;
  while (i < na && i < nr && a[i] == r[i]) i++;
  fprintf(stderr, "  %s text #%d: first difference at token %zu (ours %zu ids, ref %zu):", name, ti, i, na, nr);
  for (size_t k = i; k < i + 6 && k < na; k++) fprintf(stderr, " %d", a[k]);
  fprintf(stderr, " | ref");
  for (size_t k = i; k < i + 6 && k < nr; k++) fprintf(stderr, " %d", r[k]);
  fputc('\n', stderr);
}

int main(void) {
  const char *path = getenv("GLM53_TOK_REF");
  if (!path || !*path) {
    printf("SKIP: GLM53_TOK_REF not set (tests/integration/test_tokenizer_conformance.sh runs this check)\n");
    return 0;
  }
  size_t len;
  char *buf = read_file(path, &len);
  CHECK(buf != NULL, "%s", glm53_last_error());
  if (!buf) TEST_DONE();
  cJSON *root = cJSON_ParseWithLength(buf, len);
  free(buf);
  CHECK(root != NULL, "bad reference JSON");
  if (!root) TEST_DONE();
  const cJSON *texts = cJSON_GetObjectItem(root, "texts"), *tk;
  int n_texts = cJSON_GetArraySize(texts);
  CHECK(n_texts > 10, "too few texts in %s", path);
  int n_tok = 0;
  cJSON_ArrayForEach(tk, cJSON_GetObjectItem(root, "tokenizers")) {
    const char *name = cJSON_GetObjectItem(tk, "name")->valuestring;
    const char *file = cJSON_GetObjectItem(tk, "path")->valuestring;
    const cJSON *refs = cJSON_GetObjectItem(tk, "ids");
    glm53_tokenizer *t = tok_load(file);
    CHECK(t != NULL, "%s", glm53_last_error());
    if (!t) continue;
    n_tok++;
    /* A tokenizer with a normalizer may change the text (NFC), so there we
     * compare decodes of our ids and the reference ids instead. */
    int mism = 0, rt_fail = 0;
    size_t bytes = 0, ntoks = 0;
    const cJSON *txt = texts ? texts->child : NULL, *ref = refs ? refs->child : NULL;
    for (int i = 0; i < n_texts && txt && ref; i++, txt = txt->next, ref = ref->next) {
      const char *text = txt->valuestring;
      size_t tl = strlen(text), nr;
      int32_t *rids = json_ids(ref, &nr);
      int32_t *ids;
      size_t n;
      int rc = tok_encode(t, text, tl, 1, &ids, &n);
      CHECK(rc == 0, "%s", glm53_last_error());
      if (rc) { free(rids); continue; }
      bytes += tl;
      ntoks += n;
      int same = nr == n && (n == 0 || memcmp(rids, ids, n * sizeof *ids) == 0);
      if (!same && mism++ < 5) show_diff(name, i, ids, n, rids, nr);
      size_t dl, rl;
      char *dec = tok_decode(t, ids, n, 0, &dl);
      char *rdec = tok_decode(t, rids, nr, 0, &rl);
      int ok = dec && rdec && dl == rl && memcmp(dec, rdec, dl) == 0;
      if (strcmp(name, "qwen3") != 0) ok = ok && dl == tl && memcmp(dec, text, tl) == 0; /* no normalizer */
      if (!ok && rt_fail++ < 3) fprintf(stderr, "  %s text #%d: decode does not give the text back\n", name, i);
      free(dec); free(rdec); free(rids); free(ids);
    }
    CHECK(mism == 0, "%s: %d of %d texts differ from the reference", name, mism, n_texts);
    CHECK(rt_fail == 0, "%s: %d round-trip failures", name, rt_fail);
    printf("%-12s %d texts, %zu bytes, %zu tokens, %d mismatches, %d round-trip failures\n", name, n_texts,
           bytes, ntoks, mism, rt_fail);
    tok_free(t);
  }
  CHECK(n_tok == 5, "expected 5 tokenizers, got %d", n_tok);
  cJSON_Delete(root);
  TEST_DONE();
}

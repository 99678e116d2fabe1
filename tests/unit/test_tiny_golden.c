/* models/tiny (a small, really trained glm5_next model, docs/tiny-model.md)
 * against transformers' fp32 logits in tests/data/tiny (written by
 * tools/train_tiny/train.py on the GPU machine):
 *  - our tokenizer encodes the held-out text to exactly the ids transformers'
 *    `tokenizers` produced, and decodes them back byte for byte;
 *  - our fp32 CPU forward (prefill + token-by-token decode) matches every
 *    golden row to max|diff| / max|ref| <= 1e-4, in the dense regime and in
 *    the sparse (DSA top-k active) regime. */
#include "test_util.h"
#include "golden_check.h"
#include "tokenizer/tokenizer.h"
#include <omp.h>

#define MODEL_DIR "models/tiny"
#define DATA_DIR "tests/data/tiny"

static void check_tokenizer(const cJSON *held_ids) {
  glm53_tokenizer *t = tok_load(MODEL_DIR "/tokenizer.json");
  CHECK(t != NULL, "%s", glm53_last_error());
  size_t tlen;
  char *text = read_file(DATA_DIR "/heldout.txt", &tlen);
  CHECK(text != NULL, "no %s/heldout.txt", DATA_DIR);
  if (!t || !text || !cJSON_IsArray(held_ids)) { tok_free(t); free(text); return; }
  int32_t *ids = NULL;
  size_t n = 0;
  CHECK(tok_encode(t, text, tlen, 1, &ids, &n) == 0, "%s", glm53_last_error());
  size_t want = (size_t)cJSON_GetArraySize(held_ids), first_bad = n < want ? n : want;
  for (size_t i = 0; i < n && i < want; i++)
    if (ids[i] != cJSON_GetArrayItem(held_ids, (int)i)->valueint) { first_bad = i; break; }
  CHECK(n == want && first_bad == want, "held-out encode: %zu ids (want %zu), first mismatch at %zu", n, want, first_bad);
  size_t dl = 0;
  char *back = tok_decode(t, ids, n, 0, &dl);
  CHECK(back && dl == tlen && !memcmp(back, text, tlen), "held-out decode does not round-trip");
  printf("  tokenizer: %zu held-out bytes -> %zu ids, identical to transformers\n", tlen, n);
  free(back); free(ids);
  /* a rendered chat prompt (special and non-special added tokens); ids from
   * transformers' AutoTokenizer on models/tiny (tools/train_tiny/last_run_report.json) */
  static const char chat[] = "[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>What is a class?<|assistant|><think>";
  static const int32_t chat_ids[] = {4034, 4036, 4038, 1659, 2555, 286, 654, 773, 395, 25, 603,
                                     919,  4039, 3422, 271, 310, 261, 498, 30, 4040, 4053};
  const size_t nc = sizeof chat_ids / sizeof *chat_ids;
  ids = NULL;
  CHECK(tok_encode(t, chat, strlen(chat), 1, &ids, &n) == 0, "%s", glm53_last_error());
  CHECK(n == nc && !memcmp(ids, chat_ids, nc * sizeof *ids), "chat prompt encodes to %zu ids (want %zu) or differs", n, nc);
  free(ids); free(text); tok_free(t);
}

int main(void) {
  /* One thread: the model is tiny, and OpenMP threads spin-wait badly when
   * ctest -j shares the cores (measured on the 2-core box: 8 s of CPU with
   * the default team vs 2 s with one thread); load_opts.n_threads is not
   * implemented yet. */
  omp_set_num_threads(1);
  char *txt = read_file(DATA_DIR "/goldens.json", NULL);
  CHECK(txt != NULL, "no %s/goldens.json (run tools/train_tiny/train.py on the GPU machine)", DATA_DIR);
  if (!txt) TEST_DONE();
  cJSON *j = cJSON_Parse(txt);
  free(txt);
  CHECK(j != NULL, "%s/goldens.json is not JSON", DATA_DIR);
  if (!j) TEST_DONE();
  const cJSON *held = cJSON_GetObjectItem(j, "heldout_tokens");
  check_tokenizer(held);

  glm53_load_opts o = {.backend = "cpu", .n_threads = 1};
  glm53_model *m = glm53_model_load(MODEL_DIR, &o);
  CHECK(m != NULL, "%s: %s", MODEL_DIR, glm53_last_error());
  int n_cases = 0, n_sparse = 0;
  if (m) {
    const cJSON *cs;
    cJSON_ArrayForEach(cs, cJSON_GetObjectItem(j, "cases")) {
      /* the case's tokens are a slice of the held-out ids */
      const cJSON *toks = cJSON_GetObjectItem(cs, "tokens"), *off = cJSON_GetObjectItem(cs, "offset");
      if (cJSON_IsArray(toks) && cJSON_IsNumber(off) && cJSON_IsArray(held)) {
        int ok = off->valueint + cJSON_GetArraySize(toks) <= cJSON_GetArraySize(held);
        for (int i = 0; ok && i < cJSON_GetArraySize(toks); i++)
          ok = cJSON_GetArrayItem(toks, i)->valueint == cJSON_GetArrayItem(held, off->valueint + i)->valueint;
        CHECK(ok, "case tokens are not the held-out ids at their offset");
      }
      if (golden_run_case(m, DATA_DIR, cs) >= 0) n_cases++;
      if (cJSON_IsTrue(cJSON_GetObjectItem(cs, "sparse"))) n_sparse++;
    }
  }
  CHECK(n_cases >= 2 && n_sparse >= 1, "expected >= 2 cases incl. a sparse one, ran %d (%d sparse)", n_cases, n_sparse);
  glm53_model_free(m);
  cJSON_Delete(j);
  TEST_DONE();
}

/* Tokenizer encode speed: tokenizer_bench TOKENIZER_JSON TEXT_FILE
 * Prints MB/s for one encode of the whole file (word cache warm within the
 * call) and for encoding it line by line (a fresh cache per call, closer to
 * chat prompts), plus decode speed. One thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s tokenizer.json text_file\n", argv[0]);
    return 2;
  }
  double t0 = now_sec();
  glm53_tokenizer *t = tok_load(argv[1]);
  if (!t) { fprintf(stderr, "error: %s\n", glm53_last_error()); return 1; }
  double t_load = now_sec() - t0;
  size_t len;
  char *text = read_file(argv[2], &len);
  if (!text) { fprintf(stderr, "error: %s\n", glm53_last_error()); return 1; }
  int32_t *ids = NULL;
  size_t n = 0;
  double best = 1e30;
  for (int rep = 0; rep < 5; rep++) {
    free(ids);
    t0 = now_sec();
    if (tok_encode(t, text, len, 1, &ids, &n)) { fprintf(stderr, "error: %s\n", glm53_last_error()); return 1; }
    double dt = now_sec() - t0;
    if (dt < best) best = dt;
  }
  /* line by line */
  double best_l = 1e30;
  size_t n_lines = 0;
  for (int rep = 0; rep < 3; rep++) {
    t0 = now_sec();
    n_lines = 0;
    for (size_t i = 0; i < len;) {
      const char *nl = memchr(text + i, '\n', len - i);
      size_t e = nl ? (size_t)(nl - text) + 1 : len;
      int32_t *li;
      size_t ln;
      if (tok_encode(t, text + i, e - i, 1, &li, &ln) == 0) free(li);
      n_lines++;
      i = e;
    }
    double dt = now_sec() - t0;
    if (dt < best_l) best_l = dt;
  }
  t0 = now_sec();
  size_t dl;
  char *dec = tok_decode(t, ids, n, 0, &dl);
  double t_dec = now_sec() - t0;
  printf("load %.2f s, vocab %d\n", t_load, tok_vocab_size(t));
  printf("text %zu bytes -> %zu tokens (%.2f bytes/token)\n", len, n, n ? (double)len / (double)n : 0.0);
  printf("encode whole file : %.1f MB/s\n", (double)len / best / 1e6);
  printf("encode %zu lines   : %.1f MB/s\n", n_lines, (double)len / best_l / 1e6);
  printf("decode            : %.1f MB/s (round trip %s)\n", (double)dl / (t_dec > 0 ? t_dec : 1e-9) / 1e6,
         dec && dl == len && !memcmp(dec, text, len) ? "exact" : "differs (normalizer?)");
  free(dec);
  free(ids);
  free(text);
  tok_free(t);
  return 0;
}

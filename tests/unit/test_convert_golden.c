/* Converted checkpoints against the transformers goldens: models/tiny and
 * every oracle model are converted to .g53 (BF16, Int8, Int4 group 32;
 * embeddings and LM head Int8 in the quantized ones) and run through their
 * golden cases. Reported: the worst row's max|diff| / max|ref|
 * and top-1 (greedy next-token) agreement with transformers. Bounds (main()):
 * models/tiny Int8 <= 0.2 with >= 97% top-1, Int4 <= 0.4 with >= 85%
 * (measured 0.13 / 98.8% and 0.27 / 90.0% over 240 rows; the worst row's
 * max-norm is a harsh measure: mean NLL moves by -0.0004 (Int8) and +0.011
 * (Int4), docs/quality.md); the oracle BF16 release copy exactly (1e-4). */
#include "test_util.h"
#include "golden_check.h"
#include "model/convert.h"
#include <dirent.h>
#include <unistd.h>

typedef struct { double worst; long rows, agree; } stats;

static int argmax(const float *r, int V) {
  int b = 0;
  for (int v = 1; v < V; v++) if (r[v] > r[b]) b = v;
  return b;
}

/* Every case as one prefill (the engine's prefill and decode agree bit for
 * bit, test_forward_consistency); unpatched-transformers rows are skipped. */
static void run_cases(glm53_model *m, const char *gdir, const cJSON *cases, stats *st) {
  const int V = glm53_model_vocab_size(m);
  const cJSON *cs;
  cJSON_ArrayForEach(cs, cases) {
    const cJSON *toks = cJSON_GetObjectItem(cs, "tokens");
    const char *ref = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "reference"));
    const char *file = cJSON_GetStringValue(cJSON_GetObjectItem(cs, "logits"));
    if (!ref || !strcmp(ref, "hf_raw") || !file || !cJSON_IsArray(toks)) continue;
    int T = cJSON_GetArraySize(toks);
    int32_t *ids = xmalloc((size_t)T * sizeof *ids);
    for (int i = 0; i < T; i++) ids[i] = cJSON_GetArrayItem(toks, i)->valueint;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", gdir, file);
    size_t len;
    float *gold = (float *)read_file(path, &len), *out = xmalloc((size_t)T * V * sizeof(float));
    glm53_session *s = glm53_session_new(m, T);
    CHECK(gold && len == (size_t)T * V * 4 && s && glm53_forward(s, ids, T, out, 1) == 0, "%s: %s", path, glm53_last_error());
    if (gold && len == (size_t)T * V * 4) {
      for (int t = 0; t < T; t++) {
        st->worst = fmax(st->worst, rows_rel_diff(gold + (size_t)t * V, out + (size_t)t * V, 1, V));
        st->agree += argmax(gold + (size_t)t * V, V) == argmax(out + (size_t)t * V, V);
        st->rows++;
      }
    }
    glm53_session_free(s);
    free(ids); free(gold); free(out);
  }
}

/* Converts src at `bits` into dir/name, runs the full-prefill golden cases
 * of gdir/goldens.json; prints and returns the stats. */
static stats convert_and_check(const char *src, const char *gdir, const char *root, const char *name, int bits) {
  stats one = {0, 0, 0};
  char out[700], gpath[700];
  snprintf(out, sizeof out, "%s/%s_q%d", root, name, bits);
  snprintf(gpath, sizeof gpath, "%s/goldens.json", gdir);
  char *txt = read_file(gpath, NULL);
  cJSON *j = txt ? cJSON_Parse(txt) : NULL;
  free(txt);
  CHECK(j != NULL, "%s: no goldens", gdir);
  g53_convert_opts o = {.in = src, .out = out, .bits = bits, .group = 32, .embed_bits = bits == 16 ? 16 : 8};
  CHECK(g53_convert(&o) == 0, "convert %s: %s", src, glm53_last_error());
  glm53_load_opts lo = {.backend = "cpu"};
  glm53_model *m = glm53_model_load(out, &lo);
  CHECK(m != NULL, "load %s: %s", out, glm53_last_error());
  if (m && j) run_cases(m, gdir, cJSON_GetObjectItem(j, "cases"), &one);
  glm53_model_free(m);
  cJSON_Delete(j);
  printf("  %-32s %s: worst rel diff %.4f, top-1 %.1f%% of %ld rows\n", name, bits == 16 ? "BF16" : bits == 8 ? "Int8" : "Int4",
         one.worst, 100.0 * one.agree / (one.rows ? one.rows : 1), one.rows);
  char cmd[800];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", out);
  return one;
}

int main(void) {
  char root[] = "/tmp/glm53_convgold_XXXXXX";
  if (!mkdtemp(root)) { perror("mkdtemp"); return 1; }
  /* 1. the trained tiny model: the meaningful quality bound */
  printf("models/tiny vs its transformers goldens:\n");
  stats t8 = convert_and_check("models/tiny", "tests/data/tiny", root, "tiny", 8);
  stats t4 = convert_and_check("models/tiny", "tests/data/tiny", root, "tiny", 4);
  CHECK(t8.rows > 0 && t8.worst <= 0.2 && t8.agree >= 0.97 * t8.rows, "Int8 tiny outside its bound");
  CHECK(t4.rows > 0 && t4.worst <= 0.4 && t4.agree >= 0.85 * t4.rows, "Int4 tiny outside its bound");
  /* 2. every oracle checkpoint converts and runs; the BF16 copy made by
   * transformers converts exactly. Int8/Int4 numbers on these random-weight
   * models are reported, not bounded: there even BF16 rounding of the fp32
   * weights moves logits by up to ~100% (measured), so they show the
   * models' sensitivity, not the quantizer's quality. */
  printf("oracle checkpoints vs their transformers goldens:\n");
  const char *odir = "tests/data/oracle";
  DIR *d = opendir(odir);
  CHECK(d != NULL, "no %s", odir);
  if (!d) TEST_DONE();
  struct dirent *e;
  int models = 0;
  while ((e = readdir(d))) {
    char src[512], gpath[600];
    snprintf(src, sizeof src, "%s/%s", odir, e->d_name);
    snprintf(gpath, sizeof gpath, "%s/goldens.json", src);
    if (e->d_name[0] == '.' || access(gpath, R_OK) != 0) continue;
    models++;
    int release_bf16 = strstr(e->d_name, "release_bf16") != NULL;
    stats b16 = convert_and_check(src, src, root, e->d_name, 16);
    if (release_bf16) CHECK(b16.rows > 0 && b16.worst <= GOLDEN_TOL, "BF16 release copy must convert exactly: %g", b16.worst);
    convert_and_check(src, src, root, e->d_name, 8);
    convert_and_check(src, src, root, e->d_name, 4);
  }
  closedir(d);
  rmdir(root);
  CHECK(models >= 5, "expected the oracle models, found %d", models);
  TEST_DONE();
}

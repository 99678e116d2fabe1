/* Golden logits from Hugging Face transformers (tests/data/oracle, made by
 * tools/oracle/make_goldens.py on the GPU machine): our fp32 forward must
 * match every row to max|diff| / max|ref| <= 1e-4, for full prefill and for
 * prefill + token-by-token decode. Cases marked "hf_raw" come from the
 * unmodified transformers indexer, which is not causal-consistent once the
 * context exceeds index_topk (docs/oracle.md): only their rows inside
 * index_topk are asserted; the rest are reported.
 * The embedded tiny model is checked the same way by test_tiny_golden. */
#include "test_util.h"
#include "golden_check.h"
#include <dirent.h>

static int n_cases;

/* Checks every case of DIR/goldens.json against the checkpoint in DIR. */
static int check_model_dir(const char *gdir, const char *model_dir) {
  char gpath[600];
  snprintf(gpath, sizeof gpath, "%s/goldens.json", gdir);
  char *txt = read_file(gpath, NULL);
  if (!txt) return 0;
  cJSON *j = cJSON_Parse(txt);
  free(txt);
  CHECK(j != NULL, "%s: goldens.json is not JSON", gdir);
  glm53_load_opts o = {.backend = "cpu"};
  glm53_model *m = glm53_model_load(model_dir, &o);
  CHECK(m != NULL, "%s: %s", model_dir, glm53_last_error());
  int ok = m && j;
  if (ok) {
    printf("%s\n", model_dir);
    const cJSON *cs;
    cJSON_ArrayForEach(cs, cJSON_GetObjectItem(j, "cases")) n_cases += golden_run_case(m, gdir, cs) >= 0;
  }
  glm53_model_free(m);
  cJSON_Delete(j);
  return ok;
}

int main(void) {
  const char *root = "tests/data/oracle";
  DIR *d = opendir(root);
  CHECK(d != NULL, "no golden data at %s (run tools/oracle/make_goldens.py on the GPU machine)", root);
  if (!d) TEST_DONE();
  struct dirent *e;
  char *names[64];
  int nn = 0;
  while ((e = readdir(d)) && nn < 64)
    if (e->d_name[0] != '.') names[nn++] = xstrdup(e->d_name);
  closedir(d);
  for (int i = 0; i < nn; i++)
    for (int j = i + 1; j < nn; j++) if (strcmp(names[i], names[j]) > 0) { char *t = names[i]; names[i] = names[j]; names[j] = t; }
  int models = 0;
  for (int i = 0; i < nn; i++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
    free(names[i]);
    models += check_model_dir(dir, dir);
  }
  CHECK(models >= 5, "expected at least 5 oracle models, found %d", models);
  printf("%d models, %d cases\n", models, n_cases);
  TEST_DONE();
}

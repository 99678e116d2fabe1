/* The GPU backend against the transformers goldens of every oracle model and
 * of models/tiny, with the same rule as the CPU (test_golden): every row
 * within max|diff| / max|ref| <= 1e-4, prefill and prefill + decode.
 * No device: SKIP. (Added after the last device run of its session: it has
 * compiled, not yet run on a GPU.) */
#include "test_util.h"
#include "golden_check.h"
#include "gpu_test.h"
#include <dirent.h>

static int check_dir(const char *gdir, const char *model_dir) {
  char gpath[700];
  snprintf(gpath, sizeof gpath, "%s/goldens.json", gdir);
  char *txt = read_file(gpath, NULL);
  if (!txt) return 0;
  cJSON *j = cJSON_Parse(txt);
  free(txt);
  glm53_load_opts o = {.backend = "gpu"};
  glm53_model *m = glm53_model_load(model_dir, &o);
  CHECK(m != NULL, "%s: %s", model_dir, glm53_last_error());
  if (m && j) {
    printf("%s\n", model_dir);
    const cJSON *cs;
    cJSON_ArrayForEach(cs, cJSON_GetObjectItem(j, "cases")) golden_run_case(m, gdir, cs);
  }
  glm53_model_free(m);
  cJSON_Delete(j);
  return m != NULL;
}

int main(void) {
  if (gpu_test_skip()) return 0;
  int models = 0;
  DIR *d = opendir("tests/data/oracle");
  CHECK(d != NULL, "no tests/data/oracle");
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char dir[600];
    snprintf(dir, sizeof dir, "tests/data/oracle/%s", e->d_name);
    models += check_dir(dir, dir);
  }
  if (d) closedir(d);
  models += check_dir("tests/data/tiny", "models/tiny");
  CHECK(models >= 6, "expected the oracle models and models/tiny, checked %d", models);
  TEST_DONE();
}

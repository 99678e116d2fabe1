#include "cli/cli.h"
#include "core/err.h"
#include "core/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *cli_opt(int argc, char **argv, const char *name) {
  size_t n = strlen(name);
  for (int i = 1; i < argc; i++) {
    if (strncmp(argv[i], name, n) != 0) continue;
    if (argv[i][n] == '=') return argv[i] + n + 1;
    if (argv[i][n] == 0 && i + 1 < argc) return argv[i + 1];
  }
  return NULL;
}

int cli_flag(int argc, char **argv, const char *name) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], name)) return 1;
  return 0;
}

int cli_check_opts(int argc, char **argv, const char *cmd, const char *const *known) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || a[1] != '-') {
      fprintf(stderr, "glm53 %s: unexpected argument '%s' (see glm53 %s --help)\n", cmd, a, cmd);
      return -1;
    }
    size_t n = strcspn(a, "=");
    int found = 0, takes_value = 0;
    for (const char *const *k = known; *k; k++) {
      size_t kn = strcspn(*k, "=");
      if (kn == n && !strncmp(*k, a, n)) { found = 1; takes_value = (*k)[kn] == '='; break; }
    }
    /* a model-load option every command that loads a model accepts */
    if (!found && n == 15 && !strncmp(a, "--gpu-expert-gb", n)) found = 1, takes_value = 1;
    if (!found) {
      fprintf(stderr, "glm53 %s: unknown option '%.*s' (see glm53 %s --help)\n", cmd, (int)n, a, cmd);
      return -1;
    }
    if (takes_value && a[n] != '=') {
      if (i + 1 >= argc) { fprintf(stderr, "glm53 %s: option %s needs a value\n", cmd, a); return -1; }
      i++;
    }
  }
  return 0;
}

const char *cli_default_model(void) {
  const char *e = getenv("GLM53_MODEL");
  if (e && *e) return e;
  static char path[4096];
  /* models/tiny next to the source tree the binary was built from, or the cwd */
#ifdef GLM53_SOURCE_DIR
  snprintf(path, sizeof path, "%s/models/tiny", GLM53_SOURCE_DIR);
  if (access(path, R_OK) == 0) return path;
#endif
  snprintf(path, sizeof path, "models/tiny");
  return path;
}

glm53_model *cli_load_model(int argc, char **argv) {
  const char *path = cli_opt(argc, argv, "--model");
  if (!path) path = cli_default_model();
  glm53_load_opts o = {.backend = cli_opt(argc, argv, "--backend"), .n_threads = 0};
  const char *th = cli_opt(argc, argv, "--threads");
  if (th) o.n_threads = atoi(th);
  const char *xg = cli_opt(argc, argv, "--gpu-expert-gb");
  if (xg) o.gpu_expert_gb = atof(xg) > 0 ? atof(xg) : 1e-12; /* 0: no expert resident (the field's 0 means auto) */
  glm53_model *m = glm53_model_load(path, &o);
  if (!m) fprintf(stderr, "glm53 error: %s\n", glm53_last_error());
  return m;
}

/* Shared option parsing of run / chat (cli_gen.h). */
#include "cli/cli_gen.h"
#include "cli/cli.h"
#include "core/err.h"
#include "core/util.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int num(const char *cmd, const char *name, const char *v, double lo, double hi, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (end == v || *end || errno || !isfinite(x) || x < lo || x > hi) {
    fprintf(stderr, "glm53 %s: %s needs a number in [%g, %g], got '%s'\n", cmd, name, lo, hi, v);
    return -1;
  }
  *out = x;
  return 0;
}

int cli_gen_params(int argc, char **argv, const char *cmd, const glm53_model *m, gen_params *p, const char ***stops,
                   int *ctx) {
  *stops = NULL;
  if (gen_params_from_generation_config(glm53_model_dir(m), p)) {
    fprintf(stderr, "glm53 %s: %s\n", cmd, glm53_last_error());
    return -1;
  }
  p->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
  *ctx = 4096;
  static const struct { const char *name; double lo, hi; int kind; } nums[] = {
      {"--max-tokens", 0, 1e9, 0}, {"--temperature", 0, 1e6, 1}, {"--top-p", 1e-9, 1, 2}, {"--top-k", 0, 1e9, 3},
      {"--min-p", 0, 1, 4},        {"--seed", 0, 1.8e19, 5},     {"--repeat-penalty", 1e-6, 1e6, 6},
      {"--ctx", 1, 1 << 30, 7}};
  for (size_t i = 0; i < sizeof nums / sizeof *nums; i++) {
    const char *v = cli_opt(argc, argv, nums[i].name);
    double x;
    if (!v) continue;
    if (num(cmd, nums[i].name, v, nums[i].lo, nums[i].hi, &x)) return -1;
    switch (nums[i].kind) {
      case 0: p->max_tokens = (int)x; break;
      case 1: p->sp.temperature = (float)x; break;
      case 2: p->sp.top_p = (float)x; break;
      case 3: p->sp.top_k = (int)x; break;
      case 4: p->sp.min_p = (float)x; break;
      case 5: p->sp.seed = strtoull(v, NULL, 10); break;
      case 6: p->sp.repetition_penalty = (float)x; break;
      case 7: *ctx = (int)x; break;
    }
  }
  p->ignore_eos = cli_flag(argc, argv, "--ignore-eos");
  /* --stop may repeat: collect every occurrence */
  const char **s = xcalloc((size_t)argc + 1, sizeof *s);
  int n = 0;
  for (int i = 1; i < argc; i++) {
    if (!strncmp(argv[i], "--stop=", 7)) s[n++] = argv[i] + 7;
    else if (!strcmp(argv[i], "--stop") && i + 1 < argc) s[n++] = argv[++i];
  }
  for (int i = 0; i < n; i++)
    if (!s[i][0]) {
      fprintf(stderr, "glm53 %s: --stop needs a non-empty string\n", cmd);
      free(s);
      return -1;
    }
  p->stop = s;
  p->n_stop = n;
  *stops = s;
  return 0;
}

glm53_tokenizer *cli_load_tokenizer(const glm53_model *m, const char *cmd) {
  const char *dir = glm53_model_dir(m);
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir ? dir : ".");
  if (access(path, R_OK) != 0) {
    fprintf(stderr, "glm53 %s: no tokenizer: %s is missing\n", cmd, path);
    return NULL;
  }
  glm53_tokenizer *t = tok_load(path);
  if (!t) fprintf(stderr, "glm53 %s: %s\n", cmd, glm53_last_error());
  return t;
}

int cli_precheck_tokenizer(int argc, char **argv, const char *cmd) {
  const char *dir = cli_opt(argc, argv, "--model");
  if (!dir) dir = cli_default_model();
  struct stat sb;
  if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0; /* the model load reports it */
  char path[4096];
  snprintf(path, sizeof path, "%s/tokenizer.json", dir);
  if (access(path, R_OK) == 0) return 0;
  fprintf(stderr, "glm53 %s: no tokenizer: %s is missing\n", cmd, path);
  return -1;
}

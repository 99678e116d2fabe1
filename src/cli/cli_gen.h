/* Options shared by the generating subcommands (run, chat): sampling, stop
 * rules, context size, and the tokenizer next to the model. */
#ifndef GLM53_CLI_GEN_H
#define GLM53_CLI_GEN_H
#include "glm53.h"
#include "runtime/generate.h"
#include "tokenizer/tokenizer.h"

/* For cli_check_opts lists. */
#define CLI_GEN_OPTS                                                                                              \
  "--model=", "--backend=", "--threads=", "--max-tokens=", "--temperature=", "--top-p=", "--top-k=", "--min-p=", \
      "--seed=", "--repeat-penalty=", "--stop=", "--ctx=", "--ignore-eos"

#define CLI_GEN_HELP                                                                                            \
  "  --model DIR           checkpoint directory (default: the embedded models/tiny)\n"                          \
  "  --max-tokens N        stop after N generated tokens (default: until eos or the context end)\n"            \
  "  --temperature T       0 = greedy (default from generation_config.json, else 1)\n"                         \
  "  --top-p P, --top-k K, --min-p P, --repeat-penalty R   sampling filters (default: generation_config.json)\n" \
  "  --seed S              random seed (default: from the clock)\n"                                             \
  "  --stop TEXT           stop string, repeatable; not printed\n"                                              \
  "  --ignore-eos          do not stop on the model's eos tokens\n"                                             \
  "  --ctx N               context length of the session (default 4096)\n"                                      \
  "  --backend cpu|gpu, --threads N\n"

/* Fills p from the model's generation_config.json and the options. stops is
 * a malloc'd array (free it) of the --stop values. Returns 0, or prints one
 * error line and returns -1. */
int cli_gen_params(int argc, char **argv, const char *cmd, const glm53_model *m, gen_params *p, const char ***stops,
                   int *ctx);

/* Before the (slow) model load: when --model (or the default) is a
 * directory without tokenizer.json, prints the error and returns -1. */
int cli_precheck_tokenizer(int argc, char **argv, const char *cmd);
/* Loads tokenizer.json from the model's directory; prints an error, NULL. */
glm53_tokenizer *cli_load_tokenizer(const glm53_model *m, const char *cmd);

#endif

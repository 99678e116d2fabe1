/* glm53 subcommands: each lives in its own cmd_*.c and is listed in main.c. */
#ifndef GLM53_CLI_H
#define GLM53_CLI_H
#include "glm53.h"

int cmd_eval(int argc, char **argv);
int cmd_serve(int argc, char **argv); /* cmd_serve.c */
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_quality(int argc, char **argv);

/* Shared option helpers: parse "--name value" / "--name=value". */
const char *cli_opt(int argc, char **argv, const char *name);
int cli_flag(int argc, char **argv, const char *name);
/* Rejects options not in the NULL-terminated list `known` (value options
 * end with '=', e.g. "--model="). Returns 0 or prints one error line, -1. */
int cli_check_opts(int argc, char **argv, const char *cmd, const char *const *known);
/* Loads --model (default: the embedded model) with --backend/--threads. */
glm53_model *cli_load_model(int argc, char **argv);
/* The embedded default model directory (models/tiny). */
const char *cli_default_model(void);

#endif

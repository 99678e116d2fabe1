/* glm53: command-line entry point. One subcommand per cmd_*.c file. */
#include "cli/cli.h"
#include <stdio.h>
#include <string.h>

typedef struct {
  const char *name;
  int (*fn)(int, char **);
  const char *help;
} command;

static const command commands[] = {
    {"eval", cmd_eval, "run tokens through the model and dump logits (golden comparisons)"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server (docs/server.md)"},
    {"run", cmd_run, "generate a completion of one prompt (streamed to stdout)"},
    {"chat", cmd_chat, "interactive multi-turn chat"},
    {"convert", cmd_convert, "convert a Hugging Face checkpoint to the quantized .g53 format"},
    {"info", cmd_info, "summarize a model: config, tensors, bytes per format, RAM for a context"},
    {"quality", cmd_quality, "perplexity of a text (and NLL delta / top-1 agreement vs a reference model)"},
};

static void usage(void) {
  printf("glm53 - inference engine for GLM-5.3-Flash (glm5_next)\n\nusage: glm53 COMMAND [options]   (glm53 COMMAND --help)\n\n");
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) printf("  %-10s %s\n", commands[i].name, commands[i].help);
  printf("\nEnvironment: GLM53_BACKEND=auto|gpu|cpu, GLM53_LOG=error|warn|info|debug, GLM53_MODEL=default model dir\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
    if (!strcmp(argv[1], commands[i].name)) return commands[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "glm53: unknown command '%s' (see glm53 --help)\n", argv[1]);
  return 2;
}

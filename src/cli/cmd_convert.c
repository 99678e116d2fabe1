/* glm53 convert: HF checkpoint -> .g53 (src/model/convert.c, docs/format.md). */
#include "cli/cli.h"
#include "core/err.h"
#include "model/convert.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const convert_opts[] = {"--in=", "--out=", "--bits=", "--group=", "--keep-bf16=", "--embed-bits=",
                                           "--scale=", "--verify", "--quiet", "--threads=", "--help", NULL};

int cmd_convert(int argc, char **argv) {
  if (cli_flag(argc, argv, "--help")) {
    printf("usage: glm53 convert --in HF_DIR --out OUT_DIR [--bits 4|8|16] [--group 32|64|128] [--keep-bf16 PATTERNS]\n"
           "                     [--embed-bits 8|16] [--scale f16|bf16] [--threads N] [--verify] [--quiet]\n"
           "  Converts a BF16/F32/block-FP8 safetensors checkpoint to the .g53 format (docs/format.md).\n"
           "  --bits      attention/MLP/expert matrices: 4 = Int4 fmt=4 (default), 8 = Int8, 16 = BF16\n"
           "  --keep-bf16 comma-separated globs on tensor names stored BF16 (e.g. 'layers.*.self_attn.*')\n"
           "  norms, mHC, router, A_log/dt_bias, conv, indexer ape/k_norm/weights_proj always stay fp32\n");
    return 0;
  }
  if (cli_check_opts(argc, argv, "convert", convert_opts)) return 2;
  g53_convert_opts o = {.in = cli_opt(argc, argv, "--in"), .out = cli_opt(argc, argv, "--out"), .bits = 4, .group = 32,
                        .embed_bits = 8, .keep_bf16 = cli_opt(argc, argv, "--keep-bf16"),
                        .verify = cli_flag(argc, argv, "--verify"), .progress = !cli_flag(argc, argv, "--quiet")};
  if (!o.in || !o.out) { fprintf(stderr, "glm53 convert: --in and --out are required\n"); return 2; }
  const char *v;
  if ((v = cli_opt(argc, argv, "--threads")) && atoi(v) > 0) omp_set_num_threads(atoi(v));
  if ((v = cli_opt(argc, argv, "--bits"))) o.bits = atoi(v);
  if ((v = cli_opt(argc, argv, "--group"))) o.group = atoi(v);
  if ((v = cli_opt(argc, argv, "--embed-bits"))) o.embed_bits = atoi(v);
  if ((v = cli_opt(argc, argv, "--scale"))) {
    if (strcmp(v, "f16") && strcmp(v, "bf16")) { fprintf(stderr, "glm53 convert: --scale must be f16 or bf16\n"); return 2; }
    o.scale_bf16 = !strcmp(v, "bf16");
  }
  if (g53_convert(&o)) {
    fprintf(stderr, "glm53 convert: %s\n", glm53_last_error());
    return 1;
  }
  return 0;
}

/* glm53 info MODEL: config summary, tensors and bytes per tier / storage
 * format, bytes read per decoded token, and RAM/VRAM estimates for a context
 * (cache formulas of glm53-architecture.md §12.3). Works on .g53 models and
 * HF checkpoints (for those, bytes are the fp32 the reference loader makes). */
#include "cli/cli.h"
#include "core/err.h"
#include "core/util.h"
#include "format/g53.h"
#include "model/bind.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const info_opts[] = {"--model=", "--ctx=", "--verify", "--help", NULL};
static const char *const tier_names[4] = {"fp32 (norms, mHC, router, gates)", "embed/lm_head", "attention + dense/shared MLP", "routed experts"};

typedef struct {
  g53_file *f;
  uint64_t params[4], bytes[4], fmt_bytes[5], active, expert_bytes_one;
  int count, missing;
} info_ctx;

static int visit(void *vctx, const bind_item *it) {
  info_ctx *c = vctx;
  uint64_t n = 1;
  for (int i = 0; i < it->ndim; i++) n *= (uint64_t)it->shape[i];
  uint64_t b = n * 4;
  int fmt = G53_F32;
  if (c->f) {
    const g53_tensor *t = g53_find(c->f, it->name);
    if (!t) { c->missing++; return 0; }
    b = t->nbytes;
    fmt = t->dtype;
  }
  c->count++;
  c->params[it->tier] += n;
  c->bytes[it->tier] += b;
  c->fmt_bytes[fmt] += b;
  if (it->tier == TIER_EXPERT) { if (it->expert == 0 && it->layer >= 0) c->expert_bytes_one += b; }
  else if (!(it->tier == TIER_EMBED && !strcmp(it->name, "embed_tokens.weight"))) c->active += b; /* embedding: one row */
  return 0;
}

int cmd_info(int argc, char **argv) {
  if (cli_flag(argc, argv, "--help")) {
    printf("usage: glm53 info MODEL [--ctx N] [--verify]\n"
           "  MODEL: a .g53 directory/file or a Hugging Face checkpoint directory.\n"
           "  --verify  recompute every tensor checksum of a .g53 file (reads all bytes)\n");
    return 0;
  }
  const char *path = NULL;
  if (argc > 1 && strncmp(argv[1], "--", 2)) { path = argv[1]; argv++; argc--; }
  if (cli_check_opts(argc, argv, "info", info_opts)) return 2;
  if (!path) path = cli_opt(argc, argv, "--model");
  if (!path) { fprintf(stderr, "glm53 info: give a MODEL path\n"); return 2; }
  const char *cs = cli_opt(argc, argv, "--ctx");
  long ctx = cs ? atol(cs) : 131072;
  if (ctx <= 0) { fprintf(stderr, "glm53 info: --ctx must be positive\n"); return 2; }
  glm53_model m;
  memset(&m, 0, sizeof m);
  info_ctx c = {0};
  int is_g53 = g53_is_g53(path);
  if (is_g53) {
    c.f = g53_open(path);
    if (!c.f) { fprintf(stderr, "glm53 info: %s\n", glm53_last_error()); return 1; }
    if (glm53_config_parse(g53_config_json(c.f), &m.cfg)) { fprintf(stderr, "glm53 info: %s\n", glm53_last_error()); g53_close(c.f); return 1; }
    if (cli_flag(argc, argv, "--verify") && g53_verify(c.f, 1)) {
      fprintf(stderr, "glm53 info: %s\n", glm53_last_error());
      g53_close(c.f);
      return 1;
    }
  } else if (glm53_config_load_dir(path, &m.cfg)) {
    fprintf(stderr, "glm53 info: %s\n", glm53_last_error());
    return 1;
  }
  const glm53_config *g = &m.cfg;
  model_walk(&m, visit, &c);
  model_free_weights(&m);
  int nkda = 0, nmla = 0, nidx = 0, nmoe = 0;
  for (int l = 0; l < g->num_hidden_layers; l++) {
    nkda += g->layer_types[l] == ATTN_KDA;
    nmla += g->layer_types[l] == ATTN_MLA;
    nidx += g->layer_types[l] == ATTN_MLA && g->indexer_types[l] == INDEX_FULL;
    nmoe += g->mlp_layer_types[l] == MLP_MOE;
  }
  printf("model: %s (%s)\n", path, is_g53 ? ".g53" : "Hugging Face checkpoint");
  if (is_g53) printf("convert: %s\n", g53_meta_json(c.f));
  printf("config: %d layers (%d KDA, %d MLA of which %d with an indexer), %d MoE layers, hidden %d, vocab %d\n", g->num_hidden_layers,
         nkda, nmla, nidx, nmoe, g->hidden_size, g->vocab_size);
  printf("experts: %d routed (top-%d) + %d shared, width %d; dense width %d; hc_mult %d\n", g->n_routed_experts,
         g->num_experts_per_tok, g->n_shared_experts, g->moe_intermediate_size, g->intermediate_size, g->hc_mult);
  printf("tensors: %d%s\n", c.count, c.missing ? " (some expected tensors missing!)" : "");
  uint64_t tot = 0;
  for (int t = 0; t < 4; t++) {
    printf("tier %-34s %12.3f M params %10.1f MB\n", tier_names[t], c.params[t] / 1e6, c.bytes[t] / 1e6);
    tot += c.bytes[t];
  }
  if (is_g53) {
    for (int f = G53_F32; f <= G53_Q4; f++) printf("format %-5s %10.1f MB\n", g53_dtype_name(f), c.fmt_bytes[f] / 1e6);
  }
  uint64_t row = (c.bytes[TIER_EMBED] ? c.bytes[TIER_EMBED] / (g->tie_word_embeddings ? 1 : 2) : 0) / (uint64_t)g->vocab_size;
  uint64_t per_tok = c.active + row + (uint64_t)nmoe * g->num_experts_per_tok * (nmoe ? c.expert_bytes_one / nmoe : 0);
  printf("weights: %.3f GB total; read per decoded token ~%.3f GB (non-expert weights + top-%d experts)\n", tot / 1e9, per_tok / 1e9,
         g->num_experts_per_tok);
  /* caches per sequence (arch §12.3); the CPU reference keeps them in fp32 */
  double inner = (double)g->linear_num_heads * g->linear_head_dim;
  double kda_state = (double)nkda * g->linear_num_heads * g->linear_head_dim * g->linear_head_dim * 4;
  double kda_conv = (double)nkda * (g->linear_conv_kernel_dim - 1) * 3 * inner * 4;
  double lat_bf16 = (double)nmla * g->kv_lora_rank * 2, pool_bf16 = (double)nidx * g->index_head_dim * 2 / g->index_kpool;
  double lat_cpu = (double)nmla * g->kv_lora_rank * 4, idx_cpu = (double)nidx * g->index_head_dim * 4 * (2 + 1.0 / g->index_kpool);
  double fixed = kda_state + kda_conv;
  double cache_gpu = fixed + ctx * (lat_bf16 + pool_bf16), cache_cpu = fixed + ctx * (lat_cpu + idx_cpu);
  printf("cache per sequence: fixed %.1f MiB (KDA state + conv, fp32); per token %.0f B bf16 (arch 12.3) / %.0f B CPU reference (fp32)\n",
         fixed / 1048576, lat_bf16 + pool_bf16, lat_cpu + idx_cpu);
  printf("estimate at ctx %ld: RAM (CPU backend) %.2f GB = weights %.2f + cache %.2f; VRAM (all resident, bf16 caches) %.2f GB\n", ctx,
         (tot + cache_cpu) / 1e9, tot / 1e9, cache_cpu / 1e9, (tot + cache_gpu) / 1e9);
  if (c.f) g53_close(c.f);
  return 0;
}

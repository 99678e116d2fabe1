/* Batched decode throughput on the synthetic full-dimension GLM-5.3-Flash
 * model (bench/gpu/synth_model.h: real dimensions, bf16 with the fp32 router
 * and indexer head weights of converted checkpoints, the release layer
 * schedule scaled to `layers`, `experts` routed experts per MoE layer):
 * 64 sessions are prefilled with `prefill` tokens each, then for batch
 * sizes 1, 2, 4, ..., 64 the first n sessions take timed
 * glm53_forward_batch decode steps (after 3 warm-up steps, which also
 * capture the batch graph): median ms/step, aggregate tok/s, speed-up over
 * batch 1, and the weight bytes one step reads (non-expert weights + LM
 * head + the routed experts the step is expected to touch: E * (1 - (1 -
 * k/E)^n) per MoE layer for uniform routing) as GB/s and % of the D2D copy
 * bandwidth measured in the same run (GB/s counts the weights plus each
 * token's fp32 KDA recurrent state, read and written once per KDA layer).
 * Also batch 1 through glm53_forward
 * for reference.
 * Usage: gpu_batch [experts=16] [layers=45] [steps=9] [prefill=128] */
#include "glm53.h"
#include "gpu/glm53_gpu.h"
#include "gpu/kernels/gk.h"
#include "model/model.h"
#include "model/backend.h"
#include "core/util.h"
#include "synth_model.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const int E = argc > 1 ? atoi(argv[1]) : 16, nl = argc > 2 ? atoi(argv[2]) : 45;
  const int steps = argc > 3 ? atoi(argv[3]) : 9, NP = argc > 4 ? atoi(argv[4]) : 128;
  if (nl != 6 && (nl < 4 || nl > 45)) { fprintf(stderr, "layers: 6, or 4..45 of the release schedule\n"); return 2; }
  if (E < 8 || steps < 1 || steps > 64 || NP < 1) { fprintf(stderr, "experts >= 8, 1 <= steps <= 64, prefill >= 1\n"); return 2; }
  setvbuf(stdout, NULL, _IOLBF, 0);
  unsetenv("GLM53_GPU_EXPERT_GB");
  char why[256];
  if (!glm53_gpu_available(why, sizeof why)) { printf("SKIP: no GPU device (%s)\n", why); return 0; }
  printf("device: %s\n", glm53_gpu_device_desc());
  double bw = gk_time_d2d_gbs((size_t)2 << 30, 20);
  printf("D2D copy %.0f GB/s (read+write)\n", bw);
  size_t dbytes;
  double active;
  double t0 = now_sec();
  glm53_model *m = synth(E, nl, &dbytes, &active);
  const glm53_config *c = &m->cfg;
  int moe = 0, kda = 0;
  for (int l = 0; l < nl; l++) moe += c->mlp_layer_types[l] == MLP_MOE, kda += c->layer_types[l] == ATTN_KDA;
  /* each token reads and writes its session's fp32 KDA recurrent state */
  const double kstate = 2.0 * kda * c->linear_num_heads * c->linear_head_dim * c->linear_head_dim * 4;
  const double blob = 3.0 * c->moe_intermediate_size * c->hidden_size * 2, k = c->num_experts_per_tok;
  const double base = (double)dbytes - moe * k * blob; /* without routed experts */
  const double embed = (double)c->vocab_size * c->hidden_size * 2;
  printf("synthetic model: %d layers (%d MoE), %d experts top-%d, bf16, %.1f GB of weights (%.1f GB besides routed experts), "
         "built in %.1f s\n",
         nl, moe, E, c->num_experts_per_tok, (base + embed + moe * E * blob) / 1e9, (base + embed) / 1e9, now_sec() - t0);
  t0 = now_sec();
  if (glm53_backend_select(m, "gpu")) { printf("gpu backend: %s\n", glm53_last_error()); return 1; }
  printf("gpu model_init (validation + upload) %.1f s\n", now_sec() - t0);
  glm53_gpu_expert_stats xs;
  if (!glm53_gpu_expert_stats_get(m, &xs) && xs.streaming) printf("note: %ld experts streamed (not all resident)\n", xs.streamed);

  enum { NMAX = 64 };
  static const int sizes[] = {1, 2, 4, 8, 16, 32, 64};
  const int nsz = sizeof sizes / sizeof *sizes, V = c->vocab_size, warm = 3;
  const int ctx = NP + (nsz + 1) * (warm + steps) + 8;
  glm53_session *ss[NMAX];
  int32_t *prompt = xmalloc((size_t)NP * sizeof(int32_t));
  t0 = now_sec();
  for (int i = 0; i < NMAX; i++) {
    ss[i] = glm53_session_new(m, ctx);
    if (!ss[i]) { printf("session %d: %s\n", i, glm53_last_error()); return 1; }
    for (int j = 0; j < NP; j++) prompt[j] = (int32_t)(mix64((uint64_t)i * 1000003 + j) % V);
    if (glm53_forward(ss[i], prompt, NP, NULL, 0)) { printf("prefill: %s\n", glm53_last_error()); return 1; }
  }
  printf("prefilled %d sessions x %d tokens in %.1f s (context %d each)\n", NMAX, NP, now_sec() - t0, ctx);
  float *logits = xmalloc((size_t)NMAX * V * sizeof(float));
  int32_t tok[NMAX];
  uint64_t seq = 1;
  double ms1 = 0;
  /* batch 1 through the single-session API, for reference */
  {
    double t[64];
    for (int s = 0; s < warm + steps; s++) {
      int32_t x = (int32_t)(mix64(seq++) % V);
      double a = now_sec();
      if (glm53_forward(ss[0], &x, 1, logits, 0)) { printf("forward: %s\n", glm53_last_error()); return 1; }
      if (s >= warm) t[s - warm] = (now_sec() - a) * 1e3;
    }
    qsort(t, steps, sizeof *t, cmpd);
    printf("glm53_forward, 1 session: median %.2f ms/token = %.1f tok/s\n", t[steps / 2], 1e3 / t[steps / 2]);
  }
  printf("\n| batch | ms/step (median of %d) | tok/s | speed-up vs batch 1 | experts/layer read | weights GB/step | KDA state GB/step | GB/s | %% of D2D |\n",
         steps);
  printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int zi = 0; zi < nsz; zi++) {
    const int n = sizes[zi];
    double t[64];
    for (int s = 0; s < warm + steps; s++) {
      for (int i = 0; i < n; i++) tok[i] = (int32_t)(mix64(seq++) % V);
      double a = now_sec();
      if (glm53_forward_batch(ss, tok, n, logits)) { printf("batch %d: %s\n", n, glm53_last_error()); return 1; }
      if (s >= warm) t[s - warm] = (now_sec() - a) * 1e3;
    }
    qsort(t, steps, sizeof *t, cmpd);
    const double ms = t[steps / 2];
    if (n == 1) ms1 = ms;
    const double used = E * (1.0 - pow(1.0 - k / E, n)); /* expected distinct experts per MoE layer */
    const double gw = (base + moe * used * blob) / 1e9, gs = n * kstate / 1e9, gb = gw + gs;
    printf("| %d | %.2f | %.0f | %.2fx | %.1f | %.2f | %.2f | %.0f | %.0f%% |\n", n, ms, n * 1e3 / ms, n * ms1 / ms, used, gw, gs,
           gb / (ms * 1e-3), 100.0 * gb / (ms * 1e-3) / bw);
  }
  for (int i = 0; i < NMAX; i++) glm53_session_free(ss[i]);
  free(prompt);
  free(logits);
  glm53_model_free(m);
  return 0;
}

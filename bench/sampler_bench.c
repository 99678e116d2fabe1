/* Time per sampler_sample call at V=154880 (median of many runs, single
 * thread). Two logit shapes: "peaked" (N(0,2.5) plus one clear favourite, like
 * a confident LM step) and "flat" (N(0,1), nucleus of thousands of tokens).
 * Usage: sampler_bench [runs]   (numbers recorded in docs/sampling.md) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "runtime/sampler.h"

#define V 154880

static uint64_t rs = 88172645463325252ull;
static double unif(void) {
  rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
  return (rs >> 11) * (1.0 / 9007199254740992.0);
}
static double normal(void) { return sqrt(-2 * log(unif() + 1e-300)) * cos(6.283185307179586 * unif()); }

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double bench(const char *name, const char *shape, sampler_params p, const float *base, int runs) {
  sampler *s = sampler_new(&p, V);
  if (!s) return -1;
  for (int i = 0; i < 64; i++) sampler_accept(s, (int32_t)(unif() * V));
  float *l = malloc(sizeof(float) * V);
  double *t = malloc(sizeof(double) * runs);
  token_logprob top[SAMPLER_MAX_LOGPROBS];
  float chosen;
  for (int r = 0; r < runs; r++) {
    memcpy(l, base, sizeof(float) * V);
    double t0 = now_sec();
    int tok = sampler_sample(s, l, top, p.n_logprobs ? &chosen : NULL);
    t[r] = now_sec() - t0;
    if (tok < 0) fprintf(stderr, "sample failed\n");
  }
  qsort(t, runs, sizeof *t, cmp_d);
  double med = t[runs / 2] * 1e6;
  printf("%-34s %-7s median %8.1f us   p10 %8.1f   p90 %8.1f\n", name, shape, med, t[runs / 10] * 1e6,
         t[runs * 9 / 10] * 1e6);
  free(l);
  free(t);
  sampler_free(s);
  return med;
}

int main(int argc, char **argv) {
  int runs = argc > 1 ? atoi(argv[1]) : 300;
  if (runs < 10) runs = 10;
  float *peaked = malloc(sizeof(float) * V), *flat = malloc(sizeof(float) * V);
  for (int i = 0; i < V; i++) peaked[i] = (float)(normal() * 2.5), flat[i] = (float)normal();
  peaked[12345] = 18;
  const char *shapes[2] = {"peaked", "flat"};
  const float *logits[2] = {peaked, flat};
  printf("V=%d, %d runs each\n", V, runs);
  { /* calibration: one plain pass over the row (memcpy of V floats) */
    float *dst = malloc(sizeof(float) * V);
    double *t = malloc(sizeof(double) * runs);
    for (int r = 0; r < runs; r++) {
      double t0 = now_sec();
      memcpy(dst, peaked, sizeof(float) * V);
      t[r] = now_sec() - t0;
    }
    qsort(t, runs, sizeof *t, cmp_d);
    printf("%-34s %-7s median %8.1f us\n", "(calibration: memcpy of the row)", "", t[runs / 2] * 1e6);
    free(dst);
    free(t);
  }
  for (int k = 0; k < 2; k++) {
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = 0;
    bench("greedy", shapes[k], p, logits[k], runs);
    sampler_params_default(&p);
    p.top_p = 0.95f;
    bench("top_p 0.95, T 1", shapes[k], p, logits[k], runs);
    sampler_params_default(&p);
    p.top_k = 40;
    bench("top_k 40, T 1", shapes[k], p, logits[k], runs);
    sampler_params_default(&p);
    bench("T 1, no truncation", shapes[k], p, logits[k], runs);
    sampler_params_default(&p);
    p.top_p = 0.95f, p.temperature = 0.7f, p.n_logprobs = 5;
    bench("top_p 0.95, T 0.7, 5 logprobs", shapes[k], p, logits[k], runs);
    sampler_params_default(&p);
    p.top_p = 0.95f, p.repetition_penalty = 1.1f, p.presence_penalty = 0.5f, p.frequency_penalty = 0.5f;
    bench("top_p 0.95 + penalties (64 hist)", shapes[k], p, logits[k], runs);
  }
  free(peaked);
  free(flat);
  return 0;
}

/* MoE router: sigmoid scores, correction bias for selection only, group
 * limiting, deterministic ties (lower expert id wins), NaN guarded,
 * normalisation and routed scaling — against a float64 brute-force reference. */
#include "model/layers.h"
#include "core/util.h"
#include "test_util.h"

/* brute force: sort all experts by (choice desc, id asc) after group masking */
static void ref_route(const glm53_config *c, const float *logits, const float *bias, int *idx, double *wt) {
  int E = c->n_routed_experts, k = c->num_experts_per_tok, G = c->n_group, per = E / G;
  double sig[256], ch[256];
  int allowed[256];
  for (int e = 0; e < E; e++) { sig[e] = 1 / (1 + exp(-(double)logits[e])); ch[e] = (float)((float)sig[e] + bias[e]); allowed[e] = 1; }
  if (G > 1) {
    double gs[32];
    int used[32] = {0};
    for (int g = 0; g < G; g++) {
      double b1 = -1e300, b2 = -1e300;
      for (int e = g * per; e < (g + 1) * per; e++) {
        if (ch[e] > b1) { b2 = b1; b1 = ch[e]; } else if (ch[e] > b2) b2 = ch[e];
      }
      gs[g] = b1 + (per > 1 ? b2 : 0);
    }
    for (int i = 0; i < c->topk_group; i++) {
      int best = -1;
      for (int g = 0; g < G; g++) if (!used[g] && (best < 0 || gs[g] > gs[best])) best = g;
      used[best] = 1;
    }
    for (int e = 0; e < E; e++) allowed[e] = used[e / per];
  }
  int taken[256] = {0};
  double sum = 0;
  for (int i = 0; i < k; i++) {
    int best = -1;
    for (int e = 0; e < E; e++) if (allowed[e] && !taken[e] && (best < 0 || ch[e] > ch[best])) best = e;
    taken[best] = 1;
    idx[i] = best;
    sum += sig[best];
  }
  for (int i = 0; i < k; i++) wt[i] = sig[idx[i]] / (sum + 1e-20) * c->routed_scaling_factor;
}

int main(void) {
  glm53_config c = {0};
  c.n_routed_experts = 64; c.num_experts_per_tok = 6; c.norm_topk_prob = 1; c.routed_scaling_factor = 2.5f;
  trng r = {42};
  for (int groups = 1; groups <= 8; groups *= 2)
    for (int trial = 0; trial < 200; trial++) {
      c.n_group = groups; c.topk_group = groups > 1 ? groups / 2 : 1;
      float logits[64], bias[64];
      for (int e = 0; e < 64; e++) { logits[e] = (float)(2 * trng_normal(&r)); bias[e] = (float)(0.1 * trng_normal(&r)); }
      int idx[8], ridx[8];
      float wt[8];
      double rwt[8];
      moe_route(&c, logits, bias, idx, wt);
      ref_route(&c, logits, bias, ridx, rwt);
      for (int i = 0; i < 6; i++) {
        CHECK(idx[i] == ridx[i], "groups %d trial %d slot %d: %d vs %d", groups, trial, i, idx[i], ridx[i]);
        CHECK_NEAR(wt[i], rwt[i], 1e-6, "weight");
      }
    }
  /* exact ties: equal logits and biases -> lowest ids win, in id order */
  c.n_group = 1; c.topk_group = 1;
  float logits[64], bias[64];
  for (int e = 0; e < 64; e++) { logits[e] = 0.5f; bias[e] = 0; }
  int idx[8];
  float wt[8];
  moe_route(&c, logits, bias, idx, wt);
  for (int i = 0; i < 6; i++) {
    CHECK(idx[i] == i, "tie slot %d chose %d", i, idx[i]);
    CHECK_NEAR(wt[i], 2.5 / 6, 1e-6, "tie weight");
  }
  /* the bias steers selection but not the weights */
  bias[63] = 1.0f;
  moe_route(&c, logits, bias, idx, wt);
  CHECK(idx[0] == 63, "bias selects expert 63 first, got %d", idx[0]);
  CHECK_NEAR(wt[0], 2.5 / 6, 1e-6, "bias must not change weights");
  /* NaN logits never win and never produce out-of-range ids */
  for (int e = 0; e < 64; e++) logits[e] = (e % 3) ? NAN : (float)e / 64;
  bias[63] = 0;
  moe_route(&c, logits, bias, idx, wt);
  for (int i = 0; i < 6; i++) {
    CHECK(idx[i] >= 0 && idx[i] < 64 && idx[i] % 3 == 0, "NaN expert %d selected", idx[i]);
  }
  /* group limiting: best expert sits in a group whose top-2 sum loses */
  c.n_group = 2; c.topk_group = 1;
  for (int e = 0; e < 64; e++) { logits[e] = e < 32 ? 1.0f : -3.0f; bias[e] = 0; }
  logits[40] = 6.0f; /* strongest single expert, in the weaker group */
  moe_route(&c, logits, bias, idx, wt);
  for (int i = 0; i < 6; i++) CHECK(idx[i] < 32, "group-limited routing chose %d from the losing group", idx[i]);
  /* top-k above the experts allowed (5 experts, top-8): the ids past
   * them are -1 with weight 0, and the real ones share the weight (read
   * out of bounds before the twenty-second session; the GPU route always
   * did this) */
  glm53_config c5 = {0};
  c5.n_routed_experts = 5; c5.num_experts_per_tok = 8; c5.n_group = 1; c5.topk_group = 1; c5.norm_topk_prob = 1;
  c5.routed_scaling_factor = 2.5f;
  for (int e = 0; e < 5; e++) logits[e] = (float)e - 2, bias[e] = 0;
  moe_route(&c5, logits, bias, idx, wt);
  double s5 = 0;
  for (int i = 0; i < 8; i++) {
    CHECK(i < 5 ? idx[i] == 4 - i : idx[i] == -1 && wt[i] == 0.0f, "top-8 of 5: slot %d id %d weight %g", i, idx[i], wt[i]);
    s5 += wt[i];
  }
  CHECK_NEAR(s5, 2.5, 1e-6, "top-8 of 5: the weights sum to the scaling");
  TEST_DONE();
}

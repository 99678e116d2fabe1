/* Sampler: greedy (ties, NaN), sampled frequencies with fixed seeds,
 * temperature, exact top_k/top_p/min_p sets (hand-made and vs a full-sort
 * reference at V=20000), penalties, seeding, logprobs vs double log-softmax,
 * and rejected parameters. */
#include <float.h>
#include <string.h>

#include "core/err.h"
#include "runtime/sampler.h"
#include "test_util.h"

static sampler *mk(float temp, int top_k, float top_p, float min_p, uint64_t seed, int V) {
  sampler_params p;
  sampler_params_default(&p);
  p.temperature = temp, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p, p.seed = seed;
  sampler *s = sampler_new(&p, V);
  if (!s) fprintf(stderr, "sampler_new: %s\n", glm53_last_error());
  return s;
}

static int32_t greedy(const float *l, int V) {
  float buf[16];
  memcpy(buf, l, sizeof(float) * (size_t)V);
  sampler *s = mk(0, 0, 1, 0, 1, V);
  int32_t t = sampler_sample(s, buf, NULL, NULL);
  sampler_free(s);
  return t;
}

static void test_greedy(void) {
  float a[] = {1, 3, 3, 2};
  CHECK(greedy(a, 4) == 1);
  float b[] = {NAN, 1, NAN, 0.5f};
  CHECK(greedy(b, 4) == 1);
  float c[] = {-INFINITY, NAN, -5, -INFINITY};
  CHECK(greedy(c, 4) == 2);
  float d[] = {1, INFINITY, INFINITY};
  CHECK(greedy(d, 3) == 1);
  float e[] = {-2, -1, -1, -3};
  CHECK(greedy(e, 4) == 1);
  float f[] = {NAN, NAN, -INFINITY};
  glm53_err_clear();
  CHECK(greedy(f, 3) == -1);
  CHECK(strstr(glm53_last_error(), "NaN") != NULL, "%s", glm53_last_error());
  /* top_k = 1 is greedy too, whatever the temperature */
  sampler *s = mk(5, 1, 1, 0, 9, 4);
  for (int i = 0; i < 50; i++) {
    float g[] = {1, 3, 3, 2};
    CHECK(sampler_sample(s, g, NULL, NULL) == 1);
  }
  sampler_free(s);
  /* all-NaN also fails when sampling */
  s = mk(1, 0, 0.9f, 0, 9, 3);
  float h[] = {NAN, NAN, NAN};
  CHECK(sampler_sample(s, h, NULL, NULL) == -1);
  sampler_free(s);
}

/* 200k draws from a known distribution: every frequency within 0.005 of its
 * probability (about 4.5 sigma for p = 0.4) and chi-square (5 dof) below 20.5
 * (p = 0.001). Deterministic: seeded. */
static void check_freq(float temp, double power, uint64_t seed) {
  const double p[6] = {0.4, 0.25, 0.15, 0.1, 0.07, 0.03};
  double q[6], qs = 0;
  for (int i = 0; i < 6; i++) qs += (q[i] = pow(p[i], power));
  sampler *s = mk(temp, 0, 1, 0, seed, 6);
  int cnt[6] = {0};
  const int N = 200000;
  for (int k = 0; k < N; k++) {
    float l[6];
    for (int i = 0; i < 6; i++) l[i] = (float)log(p[i]);
    int t = sampler_sample(s, l, NULL, NULL);
    if (t >= 0 && t < 6) cnt[t]++;
  }
  double chi = 0, maxerr = 0;
  for (int i = 0; i < 6; i++) {
    double e = N * q[i] / qs;
    chi += (cnt[i] - e) * (cnt[i] - e) / e;
    maxerr = fmax(maxerr, fabs(cnt[i] / (double)N - q[i] / qs));
  }
  CHECK(maxerr < 0.005, "T=%g max freq error %g", temp, maxerr);
  CHECK(chi < 20.5, "T=%g chi-square %g", temp, chi);
  sampler_free(s);
}

static void test_distribution(void) {
  check_freq(1.0f, 1.0, 42);
  check_freq(0.5f, 2.0, 43); /* p^(1/T), renormalised */
  check_freq(2.0f, 0.5, 44);
}

/* Candidate set of hand-made logits, as ids in draw order. */
static int cands(float temp, int k, float top_p, float min_p, const float *l0, int V, int32_t *ids, float *pr) {
  float l[16];
  memcpy(l, l0, sizeof(float) * (size_t)V);
  sampler *s = mk(temp, k, top_p, min_p, 1, V);
  int n = sampler_candidates(s, l, ids, pr, 16);
  sampler_free(s);
  return n;
}

static int same_ids(const int32_t *a, int n, const int32_t *want, int nw) {
  if (n != nw) return 0;
  for (int i = 0; i < n; i++)
    if (a[i] != want[i]) return 0;
  return 1;
}

static void test_filters_exact(void) {
  int32_t ids[16];
  float pr[16];
  /* probabilities 0.5 0.3 0.15 0.05 (shuffled positions) */
  float l[4];
  const double p[4] = {0.15, 0.5, 0.05, 0.3};
  for (int i = 0; i < 4; i++) l[i] = (float)log(p[i]);
  int n;
  n = cands(1, 0, 1, 0, l, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){0, 1, 2, 3}, 4));
  for (int i = 0; i < n; i++) CHECK_NEAR(pr[i], p[i], 1e-6);
  n = cands(1, 2, 1, 0, l, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){1, 3}, 2));
  CHECK_NEAR(pr[0], 0.5 / 0.8, 1e-6);
  n = cands(1, 0, 0.79f, 0, l, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){1, 3}, 2), "n=%d", n);
  n = cands(1, 0, 0.81f, 0, l, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){1, 3, 0}, 3), "n=%d", n);
  n = cands(1, 0, 0.1f, 0, l, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){1}, 1));
  n = cands(1, 0, 1, 0.25f, l, 4, ids, pr); /* p/pmax: 0.3 1 0.1 0.6 */
  CHECK(same_ids(ids, n, (int32_t[]){0, 1, 3}, 3), "n=%d", n);
  n = cands(1, 0, 1, 0.35f, l, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){1, 3}, 2));
  /* top_p after top_k renormalises over the top 3 (mass 0.95): 0.8/0.95 = 0.842 */
  n = cands(1, 3, 0.84f, 0, l, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){1, 3}, 2));
  n = cands(1, 3, 0.85f, 0, l, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){1, 3, 0}, 3));
  /* both top_p and min_p: the shorter prefix wins */
  n = cands(1, 0, 0.81f, 0.35f, l, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){1, 3}, 2));
  /* temperature 0.5 squares the probabilities before top_p: 0.25 .09 .0225 .0025 */
  n = cands(0.5f, 0, 0.9f, 0, l, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){1, 3}, 2), "n=%d", n);
  CHECK_NEAR(pr[0], 0.25 / 0.34, 1e-6);
  /* ties: top_k keeps the lower id */
  float t[] = {5, 1, 5, 3, 5, 2};
  n = cands(1, 2, 1, 0, t, 6, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){0, 2}, 2));
  n = cands(1, 0, 0.5f, 0, t, 6, ids, pr); /* each 5 has ~0.33: two needed */
  CHECK(same_ids(ids, n, (int32_t[]){0, 2}, 2), "n=%d", n);
  /* -inf tokens are never candidates, even under top_k */
  float u[] = {-INFINITY, 0, -INFINITY, NAN};
  n = cands(1, 3, 1, 0, u, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){1}, 1));
  CHECK_NEAR(pr[0], 1, 0);
  n = cands(1, 0, 1, 0, u, 4, ids, pr);
  CHECK(same_ids(ids, n, (int32_t[]){1}, 1));
}

/* Reference for the whole pipeline after penalties: full qsort and the same
 * float weights / double sums as the spec in docs/sampling.md. */
typedef struct {
  float l;
  int32_t i;
} rp;
static int rp_cmp(const void *x, const void *y) {
  const rp *a = x, *b = y;
  if (a->l != b->l) return a->l > b->l ? -1 : 1;
  return (a->i > b->i) - (a->i < b->i);
}

static void test_filters_vs_reference(void) {
  const int V = 20000;
  float *l = malloc(sizeof(float) * V), *lc = malloc(sizeof(float) * V), *pr = malloc(sizeof(float) * V);
  int32_t *ids = malloc(sizeof(int32_t) * V);
  rp *ref = malloc(sizeof(rp) * V);
  char *in_ref = malloc((size_t)V);
  trng r = {77};
  const struct {
    float t;
    int k;
    float p, minp, scale;
  } cfg[] = {{1, 0, 0.95f, 0, 3}, {0.7f, 0, 0.9f, 0, 3},   {1.3f, 0, 0.95f, 0.01f, 2},
             {1, 0, 0.5f, 0, 8},  {1, 40, 0.95f, 0, 3},    {0.8f, 500, 0.9f, 0.001f, 2},
             {1, 0, 1, 0.05f, 3}, {2, 0, 0.99f, 0, 0.5f},  {1, 19999, 0.97f, 0, 1},
             {1, 0, 0.95f, 0, 0},  {1, 0, 0.95f, 0, 1},     {1, 0, 0.9f, 0.05f, 1}};
  for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
    for (int i = 0; i < V; i++) l[i] = (float)(trng_normal(&r) * cfg[c].scale);
    memcpy(lc, l, sizeof(float) * V);
    sampler *s = mk(cfg[c].t, cfg[c].k, cfg[c].p, cfg[c].minp, 1, V);
    int n = sampler_candidates(s, lc, ids, pr, V);
    sampler_free(s);
    /* reference */
    for (int i = 0; i < V; i++) ref[i] = (rp){l[i], i};
    qsort(ref, V, sizeof *ref, rp_cmp);
    int nk = cfg[c].k ? cfg[c].k : V;
    float m = ref[0].l, inv_t = 1.0f / cfg[c].t;
    double z = 0;
    if (cfg[c].k) {
      for (int j = 0; j < nk; j++) z += expf(-((m - ref[j].l) * inv_t));
    } else {
      for (int i = 0; i < V; i++) z += expf(-((m - l[i]) * inv_t));
    }
    double cum = 0;
    int keep = 0;
    for (int j = 0; j < nk; j++) {
      float w = expf(-((m - ref[j].l) * inv_t));
      if (w <= 0 || w < cfg[c].minp) break;
      cum += w;
      keep = j + 1;
      if (cfg[c].p < 1 && cum >= (double)cfg[c].p * z) break;
    }
    memset(in_ref, 0, (size_t)V);
    for (int j = 0; j < keep; j++) in_ref[ref[j].i] = 1;
    int ok = n == keep;
    double psum = 0;
    for (int j = 0; ok && j < n; j++) ok = in_ref[ids[j]], psum += pr[j];
    CHECK(ok, "config %zu: %d candidates, reference %d", c, n, keep);
    CHECK_NEAR(psum, 1, 1e-4, "config %zu", c);
  }
  free(l), free(lc), free(pr), free(ids), free(ref), free(in_ref);
}

static void test_penalties(void) {
  sampler_params p;
  sampler_params_default(&p);
  p.temperature = 0;
  p.repetition_penalty = 1.5f, p.presence_penalty = 0.2f, p.frequency_penalty = 0.1f;
  p.penalty_last_n = -1;
  sampler *s = sampler_new(&p, 5);
  int32_t hist[] = {0, 1, 1, 3, 4, 4, 4};
  for (int i = 0; i < 7; i++) sampler_accept(s, hist[i]);
  sampler_accept(s, -1); /* ignored */
  sampler_accept(s, 99);
  float l[] = {2, -1, 0.5f, 3, 0};
  CHECK(sampler_sample(s, l, NULL, NULL) == 3);
  CHECK(l[0] == 2.0f / 1.5f - (1 * 0.1f + 0.2f), "%g", l[0]);
  CHECK(l[1] == -1.0f * 1.5f - (2 * 0.1f + 0.2f), "%g", l[1]);
  CHECK(l[2] == 0.5f);
  CHECK(l[3] == 3.0f / 1.5f - (1 * 0.1f + 0.2f), "%g", l[3]);
  CHECK(l[4] == 0.0f - (3 * 0.1f + 0.2f), "%g", l[4]);
  sampler_free(s);

  /* window of 2: only the last two accepted tokens count */
  p.penalty_last_n = 2;
  s = sampler_new(&p, 5);
  for (int i = 0; i < 7; i++) sampler_accept(s, hist[i]);
  float m[] = {2, -1, 0.5f, 3, 0};
  sampler_sample(s, m, NULL, NULL);
  CHECK(m[0] == 2 && m[1] == -1 && m[3] == 3, "%g %g %g", m[0], m[1], m[3]);
  CHECK(m[4] == 0.0f - (2 * 0.1f + 0.2f), "%g", m[4]);
  /* the window slides: 4 leaves, 2 enters twice */
  sampler_accept(s, 2);
  sampler_accept(s, 2);
  float q[] = {2, -1, 0.5f, 3, 0};
  sampler_sample(s, q, NULL, NULL);
  CHECK(q[4] == 0 && q[2] == 0.5f / 1.5f - (2 * 0.1f + 0.2f), "%g %g", q[4], q[2]);
  sampler_accept(s, 4); /* re-enters after being dropped from the list */
  float q2[] = {2, -1, 0.5f, 3, 0};
  sampler_sample(s, q2, NULL, NULL);
  CHECK(q2[4] == 0.0f - (1 * 0.1f + 0.2f) && q2[2] == 0.5f / 1.5f - (1 * 0.1f + 0.2f), "%g %g", q2[4], q2[2]);
  /* reset clears history */
  sampler_reset(s);
  float q3[] = {2, -1, 0.5f, 3, 0};
  sampler_sample(s, q3, NULL, NULL);
  CHECK(q3[0] == 2 && q3[1] == -1 && q3[2] == 0.5f && q3[3] == 3 && q3[4] == 0);
  sampler_free(s);

  /* a penalty can change the greedy choice */
  p.penalty_last_n = 64;
  p.presence_penalty = 0, p.frequency_penalty = 0, p.repetition_penalty = 2;
  s = sampler_new(&p, 3);
  sampler_accept(s, 0);
  float g[] = {3, 2, 1};
  CHECK(sampler_sample(s, g, NULL, NULL) == 1);
  sampler_free(s);
  /* penalty_last_n = 0 disables them */
  p.penalty_last_n = 0;
  s = sampler_new(&p, 3);
  sampler_accept(s, 0);
  float g2[] = {3, 2, 1};
  CHECK(sampler_sample(s, g2, NULL, NULL) == 0 && g2[0] == 3);
  sampler_free(s);
}

static void gen(uint64_t seed, int32_t *out, int n, float *base, int V) {
  sampler *s = mk(1, 0, 0.95f, 0, seed, V);
  float *l = malloc(sizeof(float) * V);
  for (int i = 0; i < n; i++) {
    memcpy(l, base, sizeof(float) * V);
    out[i] = sampler_sample(s, l, NULL, NULL);
  }
  sampler_reset(s); /* reset replays the stream */
  memcpy(l, base, sizeof(float) * V);
  CHECK(sampler_sample(s, l, NULL, NULL) == out[0]);
  free(l);
  sampler_free(s);
}

static void test_seeds(void) {
  const int V = 1000, N = 500;
  float base[1000];
  trng r = {5};
  for (int i = 0; i < V; i++) base[i] = (float)trng_normal(&r);
  int32_t a[500], b[500], c[500];
  gen(123, a, N, base, V);
  gen(123, b, N, base, V);
  gen(124, c, N, base, V);
  CHECK(memcmp(a, b, sizeof a) == 0);
  int diff = 0;
  for (int i = 0; i < N; i++) diff += a[i] != c[i];
  CHECK(diff > N / 2, "only %d of %d differ", diff, N);
}

static void test_logprobs(void) {
  const int V = 5000;
  float *l = malloc(sizeof(float) * V), *l0 = malloc(sizeof(float) * V);
  trng r = {11};
  for (int i = 0; i < V; i++) l0[i] = (float)(trng_normal(&r) * 3);
  l0[17] = l0[42] = 20; /* a tie at the top: lower id first */
  double mx = -1e300, z = 0;
  for (int i = 0; i < V; i++) mx = fmax(mx, l0[i]);
  for (int i = 0; i < V; i++) z += exp((double)l0[i] - mx);
  double lse = mx + log(z);
  const float temps[] = {0, 0.7f, 1.0f};
  for (int ti = 0; ti < 3; ti++) {
    sampler_params p;
    sampler_params_default(&p);
    p.temperature = temps[ti], p.top_p = 0.9f, p.n_logprobs = 5, p.seed = 3;
    sampler *s = sampler_new(&p, V);
    for (int rep = 0; rep < 20; rep++) {
      memcpy(l, l0, sizeof(float) * V);
      token_logprob top[5];
      float chosen = 0;
      int32_t t = sampler_sample(s, l, top, &chosen);
      CHECK(t >= 0 && t < V);
      if (t < 0) break;
      CHECK_NEAR(chosen, l0[t] - lse, 1e-5, "T=%g chosen", temps[ti]);
      CHECK(top[0].token == 17 && top[1].token == 42, "%d %d", top[0].token, top[1].token);
      double mass = 0;
      for (int j = 0; j < 5; j++) {
        CHECK_NEAR(top[j].logprob, l0[top[j].token] - lse, 1e-5);
        if (j) CHECK(top[j].logprob <= top[j - 1].logprob);
        mass += exp(top[j].logprob);
      }
      CHECK(mass <= 1 + 1e-6);
      /* nothing outside the top 5 is more likely than the 5th */
      int above = 0;
      for (int i = 0; i < V; i++) above += l0[i] > l0[top[4].token];
      CHECK(above <= 4);
    }
    sampler_free(s);
  }
  /* n_logprobs larger than the vocabulary: the tail is -1 / -inf */
  sampler_params p;
  sampler_params_default(&p);
  p.n_logprobs = 5;
  sampler *s = sampler_new(&p, 3);
  float small[] = {0, 1, -INFINITY};
  token_logprob top[5];
  float chosen;
  int32_t t = sampler_sample(s, small, top, &chosen);
  CHECK(t == 0 || t == 1);
  CHECK(top[0].token == 1 && top[1].token == 0 && top[2].token == 2 && top[3].token == -1);
  CHECK_NEAR(top[0].logprob, -log(1 + exp(-1.0)), 1e-6);
  CHECK(top[2].logprob == -INFINITY && top[4].logprob == -INFINITY);
  sampler_free(s);
  free(l), free(l0);
}

static void expect_reject(sampler_params p, int V, const char *word) {
  glm53_err_clear();
  sampler *s = sampler_new(&p, V);
  CHECK(s == NULL, "%s accepted", word);
  CHECK(strstr(glm53_last_error(), word) != NULL, "error '%s' lacks '%s'", glm53_last_error(), word);
  sampler_free(s);
}

static void test_invalid(void) {
  sampler_params d, p;
  sampler_params_default(&d);
  p = d, p.temperature = -0.1f, expect_reject(p, 10, "temperature");
  p = d, p.temperature = NAN, expect_reject(p, 10, "temperature");
  p = d, p.top_p = 0, expect_reject(p, 10, "top_p");
  p = d, p.top_p = 1.5f, expect_reject(p, 10, "top_p");
  p = d, p.top_k = -1, expect_reject(p, 10, "top_k");
  p = d, p.min_p = -0.5f, expect_reject(p, 10, "min_p");
  p = d, p.repetition_penalty = 0, expect_reject(p, 10, "repetition_penalty");
  p = d, p.presence_penalty = INFINITY, expect_reject(p, 10, "presence_penalty");
  p = d, p.frequency_penalty = NAN, expect_reject(p, 10, "frequency_penalty");
  p = d, p.penalty_last_n = -2, expect_reject(p, 10, "penalty_last_n");
  p = d, p.n_logprobs = 21, expect_reject(p, 10, "n_logprobs");
  expect_reject(d, 0, "vocab");
  /* a denormal temperature behaves as greedy instead of overflowing 1/T */
  p = d, p.temperature = 1e-40f;
  sampler *s = sampler_new(&p, 3);
  float l[] = {1, 2, 2};
  CHECK(s && sampler_sample(s, l, NULL, NULL) == 1);
  sampler_free(s);
}

int main(void) {
  test_greedy();
  test_distribution();
  test_filters_exact();
  test_filters_vs_reference();
  test_penalties();
  test_seeds();
  test_logprobs();
  test_invalid();
  TEST_DONE();
}

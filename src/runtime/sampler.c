/* Sampler: penalties -> temperature -> top_k -> top_p -> min_p -> draw.
 * See sampler.h for the contract and docs/sampling.md for the formulas.
 *
 * Speed at V=155k: no full sort. top_k uses a size-k heap (one pass). top_p
 * without top_k buckets every token by its distance to the max logit
 * (d = (max - l) / T, 0.25-wide buckets) and sums each bucket's mass; the
 * bucket where the cumulative mass crosses top_p is split again into 1024
 * sub-buckets, and only the tokens of the crossing sub-bucket are sorted.
 * The softmax uses a branch-free exp (exp_neg) so that loop vectorises. */
#include "runtime/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/err.h"
#include "core/util.h"

#define NBUCKET 417 /* d in [0, 104) at 4 buckets per unit (exp_neg is 0 past 87) */
#define BUCKET_SCALE 4.0f

typedef struct {
  float l;
  int32_t i;
} pair;

struct sampler {
  sampler_params p;
  int V;
  uint64_t rng[4];
  int pen_on;
  /* penalty window: counts over the last penalty_last_n accepted tokens */
  int32_t *counts;  /* V */
  uint8_t *listed;  /* V: token is in touched[] */
  int32_t *touched; /* distinct tokens that may have counts > 0 */
  int n_touched;
  int32_t *ring; /* last_n > 0 only */
  int ring_n, ring_pos;
  /* scratch */
  float *w;   /* V: softmax weights relative to the max (full path) */
  pair *pr;   /* V: candidates */
  pair *bd;   /* V: tokens of the top_p boundary bucket */
  uint16_t *bk; /* V: top_p bucket of each token */
  float *cw;  /* V: candidate weights */
};

void sampler_params_default(sampler_params *p) {
  memset(p, 0, sizeof *p);
  p->temperature = 1.0f;
  p->top_p = 1.0f;
  p->repetition_penalty = 1.0f;
  p->penalty_last_n = 64;
}

/* ---- RNG: xoshiro256** seeded through splitmix64 ---- */
static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t rng_next(uint64_t s[4]) {
  uint64_t r = rotl64(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl64(s[3], 45);
  return r;
}
static void rng_seed(sampler *s) {
  uint64_t x = s->p.seed;
  for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
}
static double rng_unif(sampler *s) { return (double)(rng_next(s->rng) >> 11) * (1.0 / 9007199254740992.0); }

/* e^-d for d >= 0 (d = +inf allowed): -d = n ln2 + r (Cody-Waite, |r| <=
 * ln2/2), degree-7 Taylor for e^r (relative error < 4e-7 incl. rounding),
 * exactly 1 at 0, and 0 beyond 87 (skips denormals). The clamp compares the
 * bit patterns as integers so that the loop has no float branches and
 * vectorises without -fno-trapping-math. */
static inline float exp_neg(float d) {
  int32_t db;
  memcpy(&db, &d, 4);
  const int32_t lim = 0x42AE0000; /* 87.0f; d >= 0, so int order = float order */
  int big = db > lim;
  db = big ? lim : db;
  float x;
  memcpy(&x, &db, 4);
  x = -x;
  float t = x * 1.44269504f + 12582912.0f; /* 1.5*2^23: rounds to an integer */
  float n = t - 12582912.0f;
  int32_t ni;
  memcpy(&ni, &t, 4);
  ni -= 0x4B400000;
  float r = x - n * 0.693145751953125f - n * 1.42860682030941723e-6f;
  float q = 1.0f / 5040;
  q = q * r + 1.0f / 720;
  q = q * r + 1.0f / 120;
  q = q * r + 1.0f / 24;
  q = q * r + 1.0f / 6;
  q = q * r + 0.5f;
  q = q * r + 1.0f;
  q = q * r + 1.0f;
  int32_t sb = (ni + 127) << 23;
  float sc;
  sb = big ? 0 : sb; /* scale 0 => result 0 */
  memcpy(&sc, &sb, 4);
  return q * sc;
}

/* ---- construction ---- */
static int check_params(const sampler_params *p, int V) {
  if (V <= 0) return glm53_err("sampler: vocab size must be > 0 (got %d)", V);
  if (!isfinite(p->temperature) || p->temperature < 0)
    return glm53_err("sampler: temperature must be finite and >= 0 (got %g)", (double)p->temperature);
  if (p->top_k < 0) return glm53_err("sampler: top_k must be >= 0 (got %d)", p->top_k);
  if (!(p->top_p > 0 && p->top_p <= 1))
    return glm53_err("sampler: top_p must be in (0, 1] (got %g)", (double)p->top_p);
  if (!(p->min_p >= 0 && p->min_p <= 1))
    return glm53_err("sampler: min_p must be in [0, 1] (got %g)", (double)p->min_p);
  if (!(isfinite(p->repetition_penalty) && p->repetition_penalty > 0))
    return glm53_err("sampler: repetition_penalty must be finite and > 0 (got %g)",
                     (double)p->repetition_penalty);
  if (!isfinite(p->presence_penalty))
    return glm53_err("sampler: presence_penalty must be finite (got %g)", (double)p->presence_penalty);
  if (!isfinite(p->frequency_penalty))
    return glm53_err("sampler: frequency_penalty must be finite (got %g)", (double)p->frequency_penalty);
  if (p->penalty_last_n < -1)
    return glm53_err("sampler: penalty_last_n must be >= -1 (got %d)", p->penalty_last_n);
  if (p->n_logprobs < 0 || p->n_logprobs > SAMPLER_MAX_LOGPROBS)
    return glm53_err("sampler: n_logprobs must be in [0, %d] (got %d)", SAMPLER_MAX_LOGPROBS, p->n_logprobs);
  return 0;
}

sampler *sampler_new(const sampler_params *p, int vocab_size) {
  if (!p) {
    glm53_err("sampler: NULL params");
    return NULL;
  }
  if (check_params(p, vocab_size) < 0) return NULL;
  sampler *s = xcalloc(1, sizeof *s);
  s->p = *p;
  s->V = vocab_size;
  if (!isfinite(1.0f / s->p.temperature)) s->p.temperature = 0; /* denormal T: 1/T overflows; it is greedy anyway */
  rng_seed(s);
  s->pen_on = p->penalty_last_n != 0 &&
              (p->repetition_penalty != 1.0f || p->presence_penalty != 0 || p->frequency_penalty != 0);
  if (s->pen_on) {
    s->counts = xcalloc((size_t)vocab_size, sizeof *s->counts);
    s->listed = xcalloc((size_t)vocab_size, 1);
    s->touched = xmalloc((size_t)vocab_size * sizeof *s->touched);
    if (p->penalty_last_n > 0) s->ring = xmalloc((size_t)p->penalty_last_n * sizeof *s->ring);
  }
  s->w = xmalloc((size_t)vocab_size * sizeof *s->w);
  s->pr = xmalloc((size_t)vocab_size * sizeof *s->pr);
  s->bd = xmalloc((size_t)vocab_size * sizeof *s->bd);
  s->bk = xmalloc((size_t)vocab_size * sizeof *s->bk);
  s->cw = xmalloc((size_t)vocab_size * sizeof *s->cw);
  return s;
}

void sampler_free(sampler *s) {
  if (!s) return;
  free(s->counts);
  free(s->listed);
  free(s->touched);
  free(s->ring);
  free(s->w);
  free(s->pr);
  free(s->bd);
  free(s->bk);
  free(s->cw);
  free(s);
}

void sampler_reset(sampler *s) {
  if (s->pen_on) {
    for (int k = 0; k < s->n_touched; k++) {
      s->counts[s->touched[k]] = 0;
      s->listed[s->touched[k]] = 0;
    }
    s->n_touched = 0;
    s->ring_n = s->ring_pos = 0;
  }
  rng_seed(s);
}

/* ---- penalties ---- */
void sampler_accept(sampler *s, int32_t token) {
  if (!s->pen_on || token < 0 || token >= s->V) return;
  int last_n = s->p.penalty_last_n;
  if (last_n > 0) {
    if (s->ring_n == last_n) s->counts[s->ring[s->ring_pos]]--; /* oldest leaves the window */
    else s->ring_n++;
    s->ring[s->ring_pos] = token;
    s->ring_pos = (s->ring_pos + 1) % last_n;
  }
  s->counts[token]++;
  if (!s->listed[token]) {
    s->listed[token] = 1;
    s->touched[s->n_touched++] = token; /* at most V distinct: fits */
  }
}

static void apply_penalties(sampler *s, float *l) {
  if (!s->pen_on) return;
  const float rep = s->p.repetition_penalty, pres = s->p.presence_penalty, freq = s->p.frequency_penalty;
  int j = 0;
  for (int k = 0; k < s->n_touched; k++) {
    int32_t t = s->touched[k];
    int32_t c = s->counts[t];
    if (c == 0) { /* left the window: drop from the list lazily */
      s->listed[t] = 0;
      continue;
    }
    s->touched[j++] = t;
    float x = l[t];
    if (rep != 1.0f) x = x > 0 ? x / rep : x * rep;
    x -= (float)c * freq + pres;
    l[t] = x;
  }
  s->n_touched = j;
}

/* NaN -> -inf, +inf -> FLT_MAX (so softmax stays finite); returns the argmax
 * (lowest id on ties) or -1 when every logit is -inf. */
static int sanitize_argmax_slow(float *l, int V) {
  int best = -1;
  float bv = -INFINITY;
  for (int i = 0; i < V; i++) {
    float x = l[i];
    if (x != x) x = l[i] = -INFINITY;
    else if (x == INFINITY) x = l[i] = FLT_MAX;
    if (x > bv) {
      bv = x;
      best = i;
    }
  }
  return best;
}

/* Integer key with the order of the float (for non-NaN; -0 sorts below +0):
 * compares on ints vectorise without -fno-trapping-math. */
static inline int32_t fkey(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  u ^= (0u - (u >> 31)) >> 1; /* negative: flip the magnitude bits */
  int32_t k;
  memcpy(&k, &u, 4);
  return k;
}
static inline float fkey_inv(int32_t k) {
  uint32_t u;
  memcpy(&u, &k, 4);
  u ^= (0u - (u >> 31)) >> 1;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

#define BLK 64
/* Max key over x[0..n), n <= BLK. */
static inline int32_t block_max_key(const float *x, int n) {
  int32_t mk = INT32_MIN;
  for (int j = 0; j < n; j++) {
    int32_t k = fkey(x[j]);
    mk = k > mk ? k : mk;
  }
  return mk;
}

/* Fast path: vectorised max over keys with NaN/+inf detection, then the first
 * index equal (as a float) to the max. Falls back to the slow pass if a NaN or
 * +inf needs fixing. */
static int sanitize_argmax(float *l, int V) {
  int32_t mk = INT32_MIN;
  uint32_t bad = 0;
  for (int i = 0; i < V; i++) {
    uint32_t u;
    memcpy(&u, &l[i], 4);
    bad |= ((u & 0x7FFFFFFFu) > 0x7F800000u) | (u == 0x7F800000u);
    int32_t k = fkey(l[i]);
    mk = k > mk ? k : mk;
  }
  if (bad) return sanitize_argmax_slow(l, V);
  float m = fkey_inv(mk);
  if (m == -INFINITY) return -1;
  /* -0 == +0: with a zero max look for either key */
  int32_t k1 = mk, k2 = m == 0 ? fkey(-m) : mk;
  for (int i0 = 0; i0 < V; i0 += BLK) {
    int n = V - i0 < BLK ? V - i0 : BLK, hit = 0;
    for (int j = 0; j < n; j++) {
      int32_t k = fkey(l[i0 + j]);
      hit |= (k == k1) | (k == k2);
    }
    if (hit)
      for (int j = 0; j < n; j++)
        if (l[i0 + j] == m) return i0 + j;
  }
  return -1; /* not reached */
}

/* ---- top-k heap: root is the worst kept element ---- */
static inline int pair_worse(pair a, pair b) { return a.l < b.l || (a.l == b.l && a.i > b.i); }

static int pair_cmp_desc(const void *x, const void *y) {
  const pair *a = x, *b = y;
  if (a->l != b->l) return a->l > b->l ? -1 : 1;
  return (a->i > b->i) - (a->i < b->i);
}

/* The k best (logit desc, id asc) of l[0..V), sorted; skips -inf if asked. */
static int select_topk(const float *l, int V, int k, pair *h, int skip_neginf) {
  int n = 0;
  for (int i = 0; i < V; i++) {
    /* heap full: skip whole blocks that cannot beat the root (NaN-free input) */
    if (n == k && i % BLK == 0) {
      int nb = V - i < BLK ? V - i : BLK;
      if (block_max_key(l + i, nb) <= fkey(h[0].l)) {
        i += nb - 1;
        continue;
      }
    }
    float x = l[i];
    if (skip_neginf && x == -INFINITY) continue;
    pair e = {x, i};
    if (n < k) {
      int j = n++;
      while (j > 0 && pair_worse(e, h[(j - 1) / 2])) {
        h[j] = h[(j - 1) / 2];
        j = (j - 1) / 2;
      }
      h[j] = e;
    } else if (x > h[0].l) { /* equal logit never wins: e has the higher id */
      int j = 0;
      for (;;) {
        int c = 2 * j + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_worse(h[c + 1], h[c])) c++;
        if (!pair_worse(h[c], e)) break;
        h[j] = h[c];
        j = c;
      }
      h[j] = e;
    }
  }
  qsort(h, (size_t)n, sizeof *h, pair_cmp_desc);
  return n;
}

/* Distance to the max in temperature units; the same expression everywhere so
 * bucketing is reproducible. */
static inline float dist(float m, float x, float inv_t) { return (m - x) * inv_t; }
/* floor(4d) capped at NBUCKET-1; d >= 0 (or +inf), so the cap can compare
 * bit patterns as integers (vectorises). */
static inline int bucket_of(float d) {
  float y = d * BUCKET_SCALE;
  int32_t yb, cap;
  const float capf = (float)(NBUCKET - 1);
  memcpy(&yb, &y, 4);
  memcpy(&cap, &capf, 4);
  yb = yb < cap ? yb : cap;
  memcpy(&y, &yb, 4);
  return (int)y;
}

#define NSUB 1024 /* sub-buckets of the top_p boundary bucket */
#define SORT_DIRECT 256 /* boundary sets this small are just sorted */

/* w[i] = exp(-(m - l[i]) / T) and, if bk, bk[i] = bucket; returns the sum
 * of w (float blocks of 8 lanes gathered in double). */
static double softmax_w(const float *l, int V, float m, float inv_t, float *w, uint16_t *bk) {
  if (bk)
    for (int i = 0; i < V; i++) {
      float d = dist(m, l[i], inv_t);
      w[i] = exp_neg(d);
      bk[i] = (uint16_t)bucket_of(d);
    }
  else
    for (int i = 0; i < V; i++) w[i] = exp_neg(dist(m, l[i], inv_t));
  /* 8 float lanes per 1024-token block (vectorises), blocks summed in double */
  double z = 0;
  int nblk = V / 1024, i = nblk * 1024;
  for (int b = 0; b < nblk; b++) {
    const float *p = w + (size_t)b * 1024;
    float acc[8] = {0};
    for (int k = 0; k < 1024; k += 8)
      for (int j = 0; j < 8; j++) acc[j] += p[k + j];
    for (int j = 0; j < 8; j++) z += acc[j];
  }
  for (; i < V; i++) z += w[i];
  return z;
}

/* Candidate set after temperature/top_k/top_p/min_p: ids (pr[j].i, or the
 * identity over V when pr == NULL) with weights w[j] summing to total. */
typedef struct {
  const pair *pr;
  const float *w;
  int n;
  double total;
  double z_full; /* sum over V of the weights at this temperature, or -1 */
} cands;

/* Sorted boundary set bd[0..nb): appends to pr[*n] the shortest prefix whose
 * mass reaches need (all of it if it never does), keeping min_p. */
static void take_prefix(sampler *s, pair *bd, int nb, double need, int *n) {
  qsort(bd, (size_t)nb, sizeof *bd, pair_cmp_desc);
  double cum = 0;
  for (int j = 0; j < nb; j++) {
    float w = s->w[bd[j].i];
    if (w >= s->p.min_p) s->pr[(*n)++] = bd[j];
    if ((cum += w) >= need) break;
  }
}

static void build_candidates(sampler *s, const float *l, int amax, cands *c) {
  const sampler_params *p = &s->p;
  const int V = s->V;
  const float m = l[amax], inv_t = 1.0f / p->temperature, min_p = p->min_p;
  c->z_full = -1;
  if (p->top_k > 0 && p->top_k < V) {
    int n = select_topk(l, V, p->top_k, s->pr, 1);
    double z = 0;
    for (int j = 0; j < n; j++) z += (s->cw[j] = exp_neg(dist(m, s->pr[j].l, inv_t)));
    double target = (double)p->top_p * z, cum = 0;
    int keep = 0;
    for (int j = 0; j < n; j++) {
      if (s->cw[j] <= 0 || s->cw[j] < min_p) break; /* sorted: the rest fail too */
      cum += s->cw[j];
      keep = j + 1;
      if (p->top_p < 1 && cum >= target) break;
    }
    c->pr = s->pr, c->w = s->cw, c->n = keep, c->total = cum;
    return;
  }
  double z = softmax_w(l, V, m, inv_t, s->w, p->top_p < 1 ? s->bk : NULL);
  c->z_full = z;
  if (p->top_p >= 1 && min_p <= 0) {
    c->pr = NULL, c->w = s->w, c->n = V, c->total = z;
    return;
  }
  int n = 0;
  if (p->top_p >= 1) { /* min_p only */
    for (int i = 0; i < V; i++)
      if (s->w[i] > 0 && s->w[i] >= min_p) s->pr[n++] = (pair){l[i], i};
  } else {
    /* mass per bucket; the crossing bucket bstar; mass before it */
    double bm[NBUCKET], target = (double)p->top_p * z, before = 0;
    memset(bm, 0, sizeof bm);
    for (int i = 0; i < V; i++)
      bm[s->bk[i]] += s->w[i];
    int bstar = NBUCKET - 1;
    for (int b = 0; b < NBUCKET; b++) {
      if (before + bm[b] >= target) {
        bstar = b;
        break;
      }
      if (b < NBUCKET - 1) before += bm[b];
    }
    /* buckets before bstar are in the nucleus; bstar's tokens go to bd */
    int nb = 0;
    for (int i = 0; i < V; i++) {
      if (i % BLK == 0) { /* skip blocks wholly past bstar (the usual case) */
        int n_in = V - i < BLK ? V - i : BLK, any = 0;
        for (int j = 0; j < n_in; j++) any |= s->bk[i + j] <= bstar;
        if (!any) {
          i += n_in - 1;
          continue;
        }
      }
      float w = s->w[i];
      int b = s->bk[i];
      if (w <= 0 || b > bstar) continue;
      if (b < bstar) {
        if (w >= min_p) s->pr[n++] = (pair){l[i], i};
      } else if (b == bstar) {
        s->bd[nb++] = (pair){l[i], i};
      }
    }
    double need = target - before;
    if (nb <= SORT_DIRECT) {
      take_prefix(s, s->bd, nb, need, &n);
    } else { /* split bstar again by d, sort only the crossing sub-bucket */
      const float lo = (float)bstar / BUCKET_SCALE, scale = BUCKET_SCALE * NSUB;
      double sm[NSUB], cum = 0;
      memset(sm, 0, sizeof sm);
#define SUB_OF(e) (sub = (int)((dist(m, (e).l, inv_t) - lo) * scale), sub < 0 ? 0 : sub >= NSUB ? NSUB - 1 : sub)
      int sub;
      for (int j = 0; j < nb; j++) sm[SUB_OF(s->bd[j])] += s->w[s->bd[j].i];
      int sstar = NSUB - 1;
      for (int k = 0; k < NSUB; k++) {
        if (cum + sm[k] >= need) {
          sstar = k;
          break;
        }
        if (k < NSUB - 1) cum += sm[k];
      }
      int ns = 0;
      for (int j = 0; j < nb; j++) {
        int k = SUB_OF(s->bd[j]);
        if (k < sstar) {
          if (s->w[s->bd[j].i] >= min_p) s->pr[n++] = s->bd[j];
        } else if (k == sstar) {
          s->bd[ns++] = s->bd[j]; /* compacts in place: ns <= j */
        }
      }
#undef SUB_OF
      take_prefix(s, s->bd, ns, need - cum, &n);
    }
  }
  double total = 0;
  for (int j = 0; j < n; j++) total += (s->cw[j] = s->w[s->pr[j].i]);
  c->pr = s->pr, c->w = s->cw, c->n = n, c->total = total;
}

static int draw(sampler *s, const cands *c) {
  double r = rng_unif(s) * c->total, cum = 0;
  int last = -1;
  for (int j = 0; j < c->n; j++) {
    if (c->w[j] <= 0) continue;
    last = j;
    if ((cum += c->w[j]) > r) break;
  }
  /* last > -1: the max-logit token always has weight 1 */
  return c->pr ? c->pr[last].i : last;
}

/* log(sum exp(l)) of the penalised logits at temperature 1 (uses s->w). */
static double log_sum_exp(sampler *s, const float *l, float m) {
  return (double)m + log(softmax_w(l, s->V, m, 1.0f, s->w, NULL));
}

static int prepare(sampler *s, float *logits) {
  apply_penalties(s, logits);
  int amax = sanitize_argmax(logits, s->V);
  if (amax < 0) glm53_err("sampler: every logit is NaN or -inf");
  return amax;
}

int32_t sampler_sample(sampler *s, float *logits, token_logprob *top, float *chosen_logprob) {
  int amax = prepare(s, logits);
  if (amax < 0) return -1;
  int32_t tok = amax;
  double z1 = -1; /* sum at T=1 if the sampling pass already computed it */
  if (s->p.temperature > 0) {
    cands c;
    build_candidates(s, logits, amax, &c);
    tok = draw(s, &c);
    if (s->p.temperature == 1.0f) z1 = c.z_full;
  }
  int nlp = top ? s->p.n_logprobs : 0;
  if (nlp > 0 || chosen_logprob) {
    float m = logits[amax];
    double lse = z1 > 0 ? (double)m + log(z1) : log_sum_exp(s, logits, m);
    if (chosen_logprob) *chosen_logprob = (float)((double)logits[tok] - lse);
    if (nlp > 0) {
      pair h[SAMPLER_MAX_LOGPROBS];
      int n = select_topk(logits, s->V, nlp, h, 0);
      for (int j = 0; j < nlp; j++) {
        top[j].token = j < n ? h[j].i : -1;
        top[j].logprob = j < n ? (float)((double)h[j].l - lse) : -INFINITY;
      }
    }
  }
  return tok;
}

int sampler_candidates(sampler *s, float *logits, int32_t *ids, float *probs, int cap) {
  int amax = prepare(s, logits);
  if (amax < 0) return -1;
  if (s->p.temperature == 0) {
    if (cap < 1) return glm53_err("sampler: candidate buffer too small (1 > %d)", cap);
    ids[0] = amax;
    probs[0] = 1;
    return 1;
  }
  cands c;
  build_candidates(s, logits, amax, &c);
  int n = 0;
  for (int j = 0; j < c.n; j++) {
    if (c.w[j] <= 0) continue;
    if (n >= cap) return glm53_err("sampler: candidate buffer too small (%d)", cap);
    ids[n] = c.pr ? c.pr[j].i : j;
    probs[n++] = (float)(c.w[j] / c.total);
  }
  return n;
}

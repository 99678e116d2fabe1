/* The routed-expert cache's replacement policy (gpu_experts.c lookup / pick /
 * assign, the bookkeeping of gpu_xcache_fetch without the copies) on
 * simulated routing; needs no device, so it runs in every GPU build.
 *  - invariants: the slot table and the per-layer slot map agree after every
 *    step, and a slot the current layer call holds is never picked unless
 *    evict_current allows it;
 *  - skewed routing (each layer has 2 experts used by every call plus 6
 *    drawn from the other 30): 4 layers x 2 hot experts + one call's 6 cold
 *    ones fit the 16 slots. LRU cycles the hot experts out before their
 *    next use (24 other experts come in between); LFU keeps them, so it must
 *    reach a hit rate above 20% (the ideal is 2 of 8 = 25%) and beat LRU by
 *    15 points;
 *  - uniform routing: LFU is no worse than LRU minus 5 points;
 *  - look-ahead (gpu_xcache_prefetch_slot after each layer call, guessing
 *    the next layer's experts with 6 of 8 right, as moe_stream does): the
 *    guesses never take a slot of the current call, only a used guess
 *    counts as a prefetch hit, and the hit rate rises by more than 40
 *    points over no look-ahead under uniform routing; with every other
 *    slot claimed the next guess gets GPU_XC_FULL;
 *  - the look-ahead quota (gpu_xcache_lookahead_quota, moe_stream's
 *    choice of how many guesses to copy): none when off, every guess in
 *    the "all" mode, and in the default "idle" mode GPU_LA_IDLE_MAX after
 *    a call that copied nothing of its own, none after one that copied;
 *    simulated, the idle mode copies guesses only after copy-free calls
 *    and at most GPU_LA_IDLE_MAX each. */
#include "gpu/gpu_internal.h"
#include "gpu/glm53_gpu.h"
#include "test_util.h"
#include <limits.h>
#include <stdlib.h>
#include <string.h>

enum { NL = 4, E = 32, SLOTS = 16, K = 8, HOT = 2 };

typedef struct {
  gpu_xcache x;
  gpu_xlayer L[NL];
  int slot[NL][E], s_layer[SLOTS], s_exp[SLOTS];
  uint32_t freq[NL][E];
  uint64_t s_tick[SLOTS], s_call[SLOTS];
  uint8_t s_pref[SLOTS];
  char *host[NL][E]; /* every expert streamed (non-NULL marks; never read) */
} sim;

static void sim_init(sim *s, int lfu) {
  memset(s, 0, sizeof *s);
  s->x.nlayers = NL;
  s->x.E = E;
  s->x.nslots = SLOTS;
  s->x.lfu = lfu;
  s->x.L = s->L;
  s->x.s_layer = s->s_layer;
  s->x.s_exp = s->s_exp;
  s->x.s_tick = s->s_tick;
  s->x.s_call = s->s_call;
  s->x.s_pref = s->s_pref;
  for (int l = 0; l < NL; l++) {
    s->L[l].slot = s->slot[l];
    s->L[l].freq = s->freq[l];
    s->L[l].host = s->host[l];
    for (int e = 0; e < E; e++) {
      s->slot[l][e] = -1;
      s->host[l][e] = (char *)s; /* any non-NULL pointer */
    }
  }
  for (int i = 0; i < SLOTS; i++) s->s_layer[i] = s->s_exp[i] = -1;
}

static int consistent(const sim *s) {
  for (int i = 0; i < SLOTS; i++)
    if (s->s_exp[i] >= 0 && s->slot[s->s_layer[i]][s->s_exp[i]] != i) return 0;
  for (int l = 0; l < NL; l++)
    for (int e = 0; e < E; e++) {
      int i = s->slot[l][e];
      if (i >= 0 && (s->s_layer[i] != l || s->s_exp[i] != e)) return 0;
    }
  return 1;
}

/* one layer call using experts ids[0..K): what gpu_xcache_fetch does, in the
 * same two passes moe_stream makes (free slots first, then evicting the
 * call's own) */
static int layer_call(sim *s, int l, const int *ids, int *violations) {
  gpu_xcache *x = &s->x;
  x->call++;
  int placed[K] = {0};
  for (int i = 0; i < K; i++) {
    if (gpu_xcache_lookup(x, l, ids[i]) >= 0) { placed[i] = 1; continue; }
    int p = gpu_xcache_pick(x, 0);
    if (p < 0) continue;
    *violations += s->s_call[p] == x->call;
    gpu_xcache_assign(x, p, l, ids[i]);
    placed[i] = 1;
  }
  for (int i = 0; i < K; i++) {
    if (placed[i]) continue;
    if (gpu_xcache_lookup(x, l, ids[i]) >= 0) continue;
    int p = gpu_xcache_pick(x, 1);
    if (p < 0) return -1;
    gpu_xcache_assign(x, p, l, ids[i]);
  }
  return consistent(s) ? 0 : -1;
}

/* K distinct experts of a layer, uniform */
static void draw(trng *r, int *ids) {
  for (int n = 0; n < K;) {
    int e = (int)(trng_u64(r) % E), dup = 0;
    for (int i = 0; i < n; i++) dup |= ids[i] == e;
    if (!dup) ids[n++] = e;
  }
}

/* Uniform routing over the layers in turn; with look-ahead mode la (not
 * off), after each call but the last layer's, the next layer's routing
 * (drawn ahead) is guessed with its first 6 experts right and 2 wrong ones,
 * and as many guesses copied as the mode's quota allows. Returns the hit
 * rate. */
static double run_lookahead(int lfu, int la, uint64_t seed, int *bad, unsigned long long *pf, unsigned long long *pfh) {
  sim s;
  sim_init(&s, lfu);
  trng r = {seed};
  int ids[K], next[K];
  draw(&r, next);
  for (int step = 0; step < 4000; step++) {
    const int l = step % NL;
    memcpy(ids, next, sizeof ids);
    draw(&r, next);
    int v = 0;
    const uint64_t miss0 = s.x.misses;
    if (layer_call(&s, l, ids, &v) || v) (*bad)++;
    if (la == GLM53_GPU_LA_OFF || l == NL - 1) continue;
    const int quota = gpu_xcache_lookahead_quota(la, s.x.misses - miss0);
    int guess[K];
    memcpy(guess, next, sizeof guess);
    for (int i = 6; i < K; i++) /* wrong guesses: experts the next layer does not use */
      for (int e = (int)(trng_u64(&r) % E);; e = (e + 1) % E) {
        int used = 0;
        for (int j = 0; j < K; j++) used |= next[j] == e || (j < i && guess[j] == e);
        if (!used) { guess[i] = e; break; }
      }
    const uint64_t pf0 = s.x.prefetches;
    for (int i = 0; i < K && s.x.prefetches - pf0 < (uint64_t)quota; i++) {
      const int p = gpu_xcache_prefetch_slot(&s.x, l + 1, guess[i]);
      if (p == GPU_XC_FULL) break;
      /* never a slot of this call: its experts stay where they are */
      for (int j = 0; j < K; j++) *bad += s.slot[l][ids[j]] < 0;
    }
    if (!consistent(&s)) (*bad)++;
  }
  *pf = s.x.prefetches;
  *pfh = s.x.prefetch_hits;
  unsigned long long u = s.x.hits + s.x.misses;
  return u ? (double)s.x.hits / u : 0;
}

/* a call holding K slots, then more guesses than the other slots: the
 * last ones find none */
static int full_case(void) {
  sim s;
  sim_init(&s, 1);
  int ids[K], v = 0, placed = 0, full = 0;
  for (int i = 0; i < K; i++) ids[i] = i;
  if (layer_call(&s, 0, ids, &v) || v) return 0;
  for (int e = 0; e < SLOTS; e++) {
    int p = gpu_xcache_prefetch_slot(&s.x, 1, e);
    placed += p >= 0;
    full += p == GPU_XC_FULL;
  }
  /* an expert already cached: held, not copied again, no prefetch counted */
  const unsigned long long before = s.x.prefetches;
  const int held = gpu_xcache_prefetch_slot(&s.x, 1, 0) == GPU_XC_HELD && s.x.prefetches == before;
  return placed == SLOTS - K && full == K && held && consistent(&s);
}

static double run(int lfu, int skewed, uint64_t seed, int *bad) {
  sim s;
  sim_init(&s, lfu);
  trng r = {seed};
  for (int step = 0; step < 4000; step++) {
    int l = step % NL, ids[K], n = 0;
    if (skewed)
      for (int h = 0; h < HOT; h++) ids[n++] = h;
    while (n < K) {
      int e = skewed ? HOT + (int)(trng_u64(&r) % (E - HOT)) : (int)(trng_u64(&r) % E), dup = 0;
      for (int i = 0; i < n; i++) dup |= ids[i] == e;
      if (!dup) ids[n++] = e;
    }
    int v = 0;
    if (layer_call(&s, l, ids, &v) || v) (*bad)++;
  }
  unsigned long long u = s.x.hits + s.x.misses;
  return u ? (double)s.x.hits / u : 0;
}

int main(void) {
  int bad = 0;
  double lru_sk = run(0, 1, 7, &bad), lfu_sk = run(1, 1, 7, &bad);
  double lru_un = run(0, 0, 9, &bad), lfu_un = run(1, 0, 9, &bad);
  printf("hit rate, skewed routing: lru %.1f%%, lfu %.1f%%; uniform: lru %.1f%%, lfu %.1f%%\n", 100 * lru_sk, 100 * lfu_sk,
         100 * lru_un, 100 * lfu_un);
  CHECK(bad == 0, "%d layer calls broke the cache invariants or evicted a slot of the current call", bad);
  CHECK(lfu_sk > 0.20, "lfu hit rate %.3f on skewed routing", lfu_sk);
  CHECK(lfu_sk > lru_sk + 0.15, "lfu %.3f vs lru %.3f on skewed routing", lfu_sk, lru_sk);
  CHECK(lfu_un >= lru_un - 0.05, "lfu %.3f vs lru %.3f on uniform routing", lfu_un, lru_un);
  for (int lfu = 0; lfu < 2; lfu++) {
    unsigned long long pf0, pfh0, pf, pfh;
    int bad_la = 0;
    double base = run_lookahead(lfu, GLM53_GPU_LA_OFF, 11, &bad_la, &pf0, &pfh0),
           la = run_lookahead(lfu, GLM53_GPU_LA_ALL, 11, &bad_la, &pf, &pfh);
    printf("%s, uniform routing: hit rate %.1f%% without look-ahead, %.1f%% with (6 of 8 guessed right): %llu "
           "look-ahead copies, %llu used\n", lfu ? "lfu" : "lru", 100 * base, 100 * la, pf, pfh);
    CHECK(bad_la == 0, "%s look-ahead: %d steps broke the invariants or took a slot of the current call", lfu ? "lfu" : "lru", bad_la);
    CHECK(pf0 == 0 && pfh0 == 0, "prefetches counted without look-ahead");
    CHECK(pf > 0 && pfh <= pf && pfh > pf / 2, "%s look-ahead: %llu copies, %llu used", lfu ? "lfu" : "lru", pf, pfh);
    CHECK(la > base + 0.40, "%s look-ahead hit rate %.3f vs %.3f without", lfu ? "lfu" : "lru", la, base);
  }
  CHECK(full_case(), "look-ahead with no free slot: expected %d copies, then GPU_XC_FULL", SLOTS - K);
  CHECK(gpu_xcache_lookahead_quota(GLM53_GPU_LA_OFF, 0) == 0 && gpu_xcache_lookahead_quota(GLM53_GPU_LA_OFF, 3) == 0,
        "look-ahead off: a quota");
  CHECK(gpu_xcache_lookahead_quota(GLM53_GPU_LA_ALL, 0) == INT_MAX && gpu_xcache_lookahead_quota(GLM53_GPU_LA_ALL, 5) == INT_MAX,
        "look-ahead all: not every guess");
  CHECK(gpu_xcache_lookahead_quota(GLM53_GPU_LA_IDLE, 0) == GPU_LA_IDLE_MAX && GPU_LA_IDLE_MAX > 0 &&
            gpu_xcache_lookahead_quota(GLM53_GPU_LA_IDLE, 1) == 0 && gpu_xcache_lookahead_quota(GLM53_GPU_LA_IDLE, 8) == 0,
        "look-ahead idle: quota %d after a copy-free call, %d after one copy", gpu_xcache_lookahead_quota(GLM53_GPU_LA_IDLE, 0),
        gpu_xcache_lookahead_quota(GLM53_GPU_LA_IDLE, 1));
  /* the idle mode on a working set that fits: layers 0 and 1 always route
   * to the same 8 experts each (16 slots); after each layer-0 call 8
   * wrong guesses for layer 1 are offered. Copy-free calls get one guess
   * copied, calls that copied get none. */
  for (int lfu = 0; lfu < 2; lfu++) {
    sim s;
    sim_init(&s, lfu);
    int ids[2][K], guess[K], v = 0, bad_idle = 0;
    unsigned long long idle = 0, over = 0;
    for (int i = 0; i < K; i++) ids[0][i] = i, ids[1][i] = K + i, guess[i] = 2 * K + i;
    for (int step = 0; step < 200; step++) {
      const int l = step % 2;
      const uint64_t miss0 = s.x.misses;
      if (layer_call(&s, l, ids[l], &v) || v) bad_idle++;
      if (l) continue;
      const int quota = gpu_xcache_lookahead_quota(GLM53_GPU_LA_IDLE, s.x.misses - miss0);
      idle += s.x.misses == miss0;
      const uint64_t pf0 = s.x.prefetches;
      for (int i = 0; i < K && s.x.prefetches - pf0 < (uint64_t)quota; i++)
        if (gpu_xcache_prefetch_slot(&s.x, 1, guess[i]) == GPU_XC_FULL) break;
      over += s.x.prefetches - pf0 > (s.x.misses == miss0 ? (uint64_t)GPU_LA_IDLE_MAX : 0);
      if (!consistent(&s)) bad_idle++;
    }
    printf("%s, idle look-ahead on a working set that fits: %llu of 100 layer-0 calls copy-free, %llu look-ahead copies\n",
           lfu ? "lfu" : "lru", idle, (unsigned long long)s.x.prefetches);
    CHECK(bad_idle == 0, "%s idle look-ahead: %d steps broke the invariants", lfu ? "lfu" : "lru", bad_idle);
    CHECK(idle > 0 && s.x.prefetches > 0 && over == 0, "%s idle look-ahead: %llu copy-free calls, %llu copies, %llu calls over quota",
          lfu ? "lfu" : "lru", idle, (unsigned long long)s.x.prefetches, over);
  }
  TEST_DONE();
}

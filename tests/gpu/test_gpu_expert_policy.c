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
 *  - uniform routing: LFU is no worse than LRU minus 5 points. */
#include "gpu/gpu_internal.h"
#include "test_util.h"
#include <stdlib.h>
#include <string.h>

enum { NL = 4, E = 32, SLOTS = 16, K = 8, HOT = 2 };

typedef struct {
  gpu_xcache x;
  gpu_xlayer L[NL];
  int slot[NL][E], s_layer[SLOTS], s_exp[SLOTS];
  uint32_t freq[NL][E];
  uint64_t s_tick[SLOTS], s_call[SLOTS];
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
  for (int l = 0; l < NL; l++) {
    s->L[l].slot = s->slot[l];
    s->L[l].freq = s->freq[l];
    for (int e = 0; e < E; e++) s->slot[l][e] = -1;
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
  TEST_DONE();
}

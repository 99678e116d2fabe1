/* Per-operation GPU time of a stretch of work (benchmarks only; docs/gpu.md
 * "Kernel profile"). While on, every gk_check (the GK_LAUNCHED after each
 * launch site's kernels or cuBLAS call) records an event on the compute
 * stream; the time between consecutive events belongs to the operation
 * that ends at the second. gk_kprof_stage() files the records since its
 * previous call under a stage name (the backend's stage marks), so a
 * "gemv" reads as "kda/gemv" or "moe/gemv". Graph capture must be off. An
 * event between two kernels ends programmatic overlap, so per-operation
 * times include the launch gap, and the total runs a little above the
 * unprofiled step. */
#include "gk_common.cuh"
#include <stdlib.h>
#include <string.h>

#define KP_MAX 65536
#if GK_HIP
#define KP_STREAM 0 /* HIP launches go to the default stream */
#else
#define KP_STREAM cudaStreamPerThread
#endif
static cudaEvent_t *kp_ev;
static const char **kp_op, **kp_stage;
static int kp_n, kp_staged, kp_on, kp_cap;

extern "C" int gk_kprof_active(void) { return kp_on; }
extern "C" void gk_kprof_mark(const char *what) {
  if (!kp_on || kp_n >= kp_cap) return;
  if (cudaEventRecord(kp_ev[kp_n], KP_STREAM) != cudaSuccess) return;
  kp_op[kp_n] = what;
  kp_stage[kp_n++] = NULL;
}
extern "C" void gk_kprof_stage(const char *stage) {
  if (!kp_on) return;
  for (int i = kp_staged; i < kp_n; i++) kp_stage[i] = stage;
  kp_staged = kp_n;
}
extern "C" int gk_kprof_begin(void) {
  if (!kp_ev) {
    kp_ev = (cudaEvent_t *)calloc(KP_MAX, sizeof *kp_ev);
    kp_op = (const char **)calloc(KP_MAX, sizeof *kp_op);
    kp_stage = (const char **)calloc(KP_MAX, sizeof *kp_stage);
    if (!kp_ev || !kp_op || !kp_stage) return gk_fail("kprof: out of memory");
    for (kp_cap = 0; kp_cap < KP_MAX; kp_cap++)
      if (cudaEventCreate(&kp_ev[kp_cap]) != cudaSuccess) break;
    if (kp_cap < 2) return gk_fail("kprof: no events");
  }
  kp_n = kp_staged = 0;
  kp_on = 1;
  gk_kprof_mark("(start)");
  return 0;
}

typedef struct {
  const char *stage, *op;
  double ms;
  int calls;
} kp_row;
static int kp_cmp(const void *a, const void *b) {
  const double x = ((const kp_row *)a)->ms, y = ((const kp_row *)b)->ms;
  return x < y ? 1 : x > y ? -1 : 0;
}
static int same(const char *a, const char *b) { return a == b || (a && b && !strcmp(a, b)); }

/* prints the operations by total time, per repetition (reps: the steps
 * recorded), and stops recording */
extern "C" void gk_kprof_end(const char *label, int reps) {
  if (!kp_on) return;
  kp_on = 0;
  if (cudaDeviceSynchronize() != cudaSuccess) { printf("kernel profile %s: device error\n", label); return; }
  kp_row *rows = (kp_row *)calloc(kp_n > 0 ? kp_n : 1, sizeof *rows);
  int nr = 0;
  double tot = 0;
  for (int i = 1; i < kp_n; i++) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, kp_ev[i - 1], kp_ev[i]) != cudaSuccess) continue;
    const char *st = kp_stage[i] ? kp_stage[i] : "-";
    int r = 0;
    while (r < nr && !(same(rows[r].stage, st) && same(rows[r].op, kp_op[i]))) r++;
    if (r == nr) rows[nr++] = (kp_row){st, kp_op[i], 0, 0};
    rows[r].ms += ms;
    rows[r].calls++;
    tot += ms;
  }
  qsort(rows, nr, sizeof *rows, kp_cmp);
  if (reps < 1) reps = 1;
  printf("kernel profile %s: %.3f ms per step over %d step(s), %d records%s\n", label, tot / reps, reps, kp_n - 1,
         kp_n >= kp_cap ? " (event pool full: truncated)" : "");
  printf("| stage/op | calls per step | ms per step | %% |\n| --- | --- | --- | --- |\n");
  for (int r = 0; r < nr; r++)
    if (100 * rows[r].ms / (tot > 0 ? tot : 1) >= 0.3 || r < 12)
      printf("| %s/%s | %.1f | %.3f | %.1f |\n", rows[r].stage, rows[r].op, (double)rows[r].calls / reps, rows[r].ms / reps,
             100 * rows[r].ms / (tot > 0 ? tot : 1));
  free(rows);
}

/* Kernel-only benchmark of the CPU GEMV (src/cpu/qmatmul.c) at model shapes:
 * GB/s of weights streamed by Q4 g32 (expert 2048x4096, KDA proj 8192x4096,
 * MLA o_proj 4096x16384), Q8 g32 (LM head 154880x4096) and BF16, per ISA,
 * over a working set far larger than the caches (different matrices each
 * call). Median of 5 passes. usage: cpu_gemv [n_matrices=48] */
#include "cpu/qmatmul.h"
#include "core/util.h"
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

static void make(wmat *w, int fmt, int rows, int cols, unsigned seed) {
  size_t n = (size_t)rows * cols, vb = fmt == WMAT_Q4 ? n / 2 : fmt == WMAT_Q8 ? n : 2 * n, ng = n / 32;
  uint8_t *d = NULL;
  if (posix_memalign((void **)&d, 64, vb + 64 + ng * 2)) abort();
#pragma omp parallel for schedule(static)
  for (size_t j = 0; j < vb; j++) d[j] = (uint8_t)(((j + seed) * 2654435761u) >> 13) & (fmt == WMAT_Q8 ? 0x7f : 0xff);
  uint16_t *s = (uint16_t *)(d + ((vb + 63) & ~(size_t)63));
  for (size_t j = 0; j < ng; j++) s[j] = 0x2000;
  *w = (wmat){.fmt = fmt, .rows = rows, .cols = cols, .group = 32, .data = d, .scales = fmt == WMAT_BF16 ? NULL : s, .owned = d};
}

static void run(const char *what, int fmt, int rows, int cols, int nm) {
  wmat *w = xcalloc((size_t)nm, sizeof *w);
  for (int i = 0; i < nm; i++) make(&w[i], fmt, rows, cols, (unsigned)i * 977);
  float *x = aligned_alloc64((size_t)cols * 4), *y = aligned_alloc64((size_t)rows * 4);
  for (int j = 0; j < cols; j++) x[j] = 0.001f * (float)(j % 101);
  printf("%-30s %5.0f MB set:", what, nm * wmat_bytes(&w[0]) / 1e6);
  for (int isa = CPU_ISA_SCALAR; isa <= cpu_isa(); isa++) {
    cpu_isa_force(isa);
    double t[5];
    for (int rep = 0; rep < 5; rep++) {
      double t0 = now_sec();
      for (int i = 0; i < nm; i++) wmat_matvec(&w[i], x, y);
      t[rep] = nm * wmat_bytes(&w[0]) / (now_sec() - t0) / 1e9;
    }
    qsort(t, 5, sizeof *t, cmpd);
    printf("  %s %.2f GB/s", cpu_isa_name(isa), t[2]);
    cpu_isa_force(CPU_ISA_AUTO);
  }
  printf("\n");
  for (int i = 0; i < nm; i++) wmat_free(&w[i]);
  free(w); free(x); free(y);
}

int main(int argc, char **argv) {
  int nm = argc > 1 ? atoi(argv[1]) : 48;
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("threads %d\n", omp_get_max_threads());
  run("Q4 g32 expert 2048x4096", WMAT_Q4, 2048, 4096, nm);
  run("Q4 g32 KDA proj 8192x4096", WMAT_Q4, 8192, 4096, nm / 4 + 1);
  run("Q4 g32 MLA o_proj 4096x16384", WMAT_Q4, 4096, 16384, nm / 8 + 1);
  run("Q8 g32 expert 2048x4096", WMAT_Q8, 2048, 4096, nm / 2 + 1);
  run("Q8 g32 lm_head 154880x4096", WMAT_Q8, 154880, 4096, 2);
  run("BF16 expert 2048x4096", WMAT_BF16, 2048, 4096, nm / 4 + 1);
  return 0;
}
